//! CUDA virtual memory management for [`CudaDevice`] (cuMemAddressReserve, cuMemCreate,
//! cuMemMap, cuMemSetAccess, cuMemUnmap): the page-backed slabs of the suballocator on a real
//! GPU, so free pages inside slabs that hold live blocks can go back to the device.
//!
//! Each page is its own physical allocation (cuMemCreate of one granule), because cuMemUnmap
//! only unmaps whole mappings and the suballocator maps and unmaps page runs independently;
//! `map_handles` maps larger handles where the caller unmaps only whole ones (their sizes are
//! kept for the unmap). Access is granted once per mapped run. The handle is released right
//! after mapping: the mapping keeps the memory until it is unmapped.
//! A handle can be mapped a second time (`map_alias`: cuMemRetainAllocationHandle on its first
//! address, then cuMemMap of the whole handle); its memory goes back with its last mapping.
//! Enabled when the device reports VMM support; `ADAPTALLOC_CUDA_VMM=0` turns it off.

use std::collections::HashMap;

use cudarc::driver::sys;

use super::cuda::check;
use super::{CudaDevice, DevicePtr, VirtualMemory};
use crate::error::DeviceError;

/// Whether `device` supports VMM, and its mapping granule; None when not (or turned off).
pub(super) fn probe(device: sys::CUdevice, ordinal: i32) -> Option<u64> {
    if std::env::var("ADAPTALLOC_CUDA_VMM").is_ok_and(|v| v == "0") {
        return None;
    }
    let mut supported = 0;
    // SAFETY: `supported` is a live c_int; the device handle is valid (from cuDeviceGet).
    let r = unsafe {
        sys::cuDeviceGetAttribute(
            &mut supported,
            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
            device,
        )
    };
    if r != sys::CUresult::CUDA_SUCCESS || supported == 0 {
        return None;
    }
    let prop = allocation_prop(ordinal);
    let mut granule = 0usize;
    // SAFETY: `prop` and `granule` are live locals of the types the call expects.
    let r = unsafe {
        sys::cuMemGetAllocationGranularity(
            &mut granule,
            &prop,
            sys::CUmemAllocationGranularity_flags::CU_MEM_ALLOC_GRANULARITY_MINIMUM,
        )
    };
    // Page bookkeeping shifts by the page size: a granule that is not a power of two (none
    // known) means whole allocations instead.
    (r == sys::CUresult::CUDA_SUCCESS && granule.is_power_of_two()).then_some(granule as u64)
}

/// Pinned device memory on device `ordinal`.
pub(super) fn allocation_prop(ordinal: i32) -> sys::CUmemAllocationProp {
    // SAFETY: the struct is plain C data for which all-zero bytes are a valid value (zero
    // enums, a null pointer, zero flags); the fields that matter are set below.
    let mut prop: sys::CUmemAllocationProp = unsafe { std::mem::zeroed() };
    prop.type_ = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = ordinal;
    prop
}

/// The reservations of one device (pointer -> size), for cuMemAddressFree.
pub(super) type Reservations = HashMap<DevicePtr, u64>;

impl CudaDevice {
    pub(super) fn page(&self) -> u64 {
        self.vmm_page.unwrap_or(2 << 20)
    }

    /// Maps one handle of `size` bytes at `va`, backed by `source`: a new handle, or (Some) the
    /// page mapped at that address, mapped a second time (`size` is then one page). Grants no
    /// access (the caller grants it for the whole run). On failure nothing new stays mapped or
    /// allocated.
    fn map_one(&self, va: DevicePtr, size: u64, source: Option<DevicePtr>) -> Result<(), DeviceError> {
        let prop = allocation_prop(self.ordinal());
        let mut handle: sys::CUmemGenericAllocationHandle = 0;
        match source {
            None => {
                // SAFETY: `handle` and `prop` are live locals; the context is current (checked
                // by the callers).
                let r = self.timed(
                    |o| &mut o.create,
                    || unsafe { sys::cuMemCreate(&mut handle, size as usize, &prop, 0) },
                );
                if r == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
                    return Err(self.out_of_memory(size));
                }
                check("cuMemCreate", r)?;
            }
            Some(src) => {
                // SAFETY: `handle` is a live local; `src` is a page this device mapped and that
                // is still mapped (the caller's contract).
                check("cuMemRetainAllocationHandle", unsafe {
                    sys::cuMemRetainAllocationHandle(&mut handle, src as *mut std::ffi::c_void)
                })?;
            }
        }
        // SAFETY: `va` is a granule-aligned, unmapped address inside one of our reservations
        // (the caller's contract) and `handle` an allocation of `size` bytes that we hold a
        // reference to, mapped whole from offset 0.
        let mapped = check(
            "cuMemMap",
            self.timed(
                |o| &mut o.map,
                || unsafe { sys::cuMemMap(va, size as usize, 0, handle, 0) },
            ),
        );
        // SAFETY: the reference is ours; once mapped, the mappings keep the memory alive, and
        // when mapping a new handle failed this frees it.
        let released = check(
            "cuMemRelease",
            self.timed(|o| &mut o.release, || unsafe { sys::cuMemRelease(handle) }),
        );
        mapped?;
        if let Err(e) = released {
            // SAFETY: removes the mapping made just above.
            let _ = unsafe { sys::cuMemUnmap(va, size as usize) };
            return Err(e);
        }
        Ok(())
    }

    /// Maps `ptr..ptr+bytes` with handles of `handle` bytes each (from `src` on, a page at a
    /// time, when Some), then grants access to the whole run in one cuMemSetAccess (as
    /// PyTorch's expandable segments do: the grant costs tens of microseconds per call);
    /// failure changes nothing. One driver allocation in the stats, and `bytes` more allocated
    /// when the handles are new.
    pub(super) fn map_range(
        &self,
        ptr: DevicePtr,
        src: Option<DevicePtr>,
        bytes: u64,
        handle: u64,
    ) -> Result<(), DeviceError> {
        let _current = self.make_current()?;
        let _relaxed = super::cuda_streams::RelaxedCapture::new();
        let mut done = 0;
        let mut result = Ok(());
        while done < bytes {
            if let Err(e) = self.map_one(ptr + done, handle, src.map(|s| s + done)) {
                result = Err(e);
                break;
            }
            if handle != self.page() {
                self.mappings.lock().insert(ptr + done, handle);
            }
            done += handle;
        }
        if result.is_ok() {
            let desc = sys::CUmemAccessDesc {
                location: allocation_prop(self.ordinal()).location,
                flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
            };
            // SAFETY: every handle of `ptr..ptr+bytes` was just mapped; `desc` is one live
            // descriptor.
            result = check(
                "cuMemSetAccess",
                self.timed(
                    |o| &mut o.set_access,
                    || unsafe { sys::cuMemSetAccess(ptr, bytes as usize, &desc, 1) },
                ),
            );
        }
        if result.is_err() {
            // Failure changes nothing: unmap what this call mapped.
            let _ = self.unmap_pages(ptr, done);
        }
        let mut stats = self.stats.lock();
        match result {
            Ok(()) => {
                stats.driver_allocs += 1;
                if src.is_none() {
                    stats.allocated_bytes += bytes;
                }
            }
            Err(_) => stats.failed_allocs += 1,
        }
        result
    }

    /// Unmaps `ptr..ptr+bytes`: one driver free in the stats, `bytes` fewer allocated when the
    /// range held the first mappings of its pages.
    pub(super) fn unmap_range(&self, ptr: DevicePtr, bytes: u64, first: bool) -> Result<(), DeviceError> {
        let _current = self.make_current()?;
        let result = self.unmap_pages(ptr, bytes);
        let mut stats = self.stats.lock();
        stats.driver_frees += 1;
        if first {
            stats.allocated_bytes = stats.allocated_bytes.saturating_sub(bytes);
        }
        result
    }
}

impl CudaDevice {
    /// The size of the handle mapped at `va`: a page, unless `map_handles` mapped a larger one.
    pub(super) fn handle_at(&self, va: DevicePtr) -> u64 {
        self.mappings.lock().get(&va).copied().unwrap_or(self.page())
    }

    /// Unmaps the mappings of `ptr..ptr+bytes`, each whole (cuMemUnmap only unmaps whole
    /// mappings): a page each, or a larger handle where `map_handles` mapped one. All are
    /// tried, the first error is returned.
    fn unmap_pages(&self, ptr: DevicePtr, bytes: u64) -> Result<(), DeviceError> {
        let mut result = Ok(());
        let mut va = ptr;
        while va < ptr + bytes {
            let size = self.mappings.lock().remove(&va).unwrap_or(self.page());
            // SAFETY: every mapping of the range was made by `map_one` (the callers' contract),
            // `size` bytes at `va`.
            let r = check(
                "cuMemUnmap",
                self.timed(|o| &mut o.unmap, || unsafe { sys::cuMemUnmap(va, size as usize) }),
            );
            result = result.and(r);
            va += size;
        }
        result
    }
}

impl VirtualMemory for CudaDevice {
    fn page_size(&self) -> u64 {
        self.page()
    }

    fn reserve(&self, bytes: u64) -> Result<DevicePtr, DeviceError> {
        let _current = self.make_current()?;
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: `ptr` is a live local; address space only, no memory is consumed.
        check(
            "cuMemAddressReserve",
            self.timed(
                |o| &mut o.reserve,
                || unsafe { sys::cuMemAddressReserve(&mut ptr, bytes as usize, self.page() as usize, 0, 0) },
            ),
        )?;
        self.reservations.lock().insert(ptr, bytes);
        Ok(ptr)
    }

    fn unreserve(&self, ptr: DevicePtr) -> Result<(), DeviceError> {
        let _current = self.make_current()?;
        let Some(bytes) = self.reservations.lock().remove(&ptr) else {
            return Err(DeviceError::UnknownPointer { ptr });
        };
        // SAFETY: `ptr..ptr+bytes` is a reservation of ours with every page unmapped (the
        // trait's contract).
        check(
            "cuMemAddressFree",
            self.timed(
                |o| &mut o.unreserve,
                || unsafe { sys::cuMemAddressFree(ptr, bytes as usize) },
            ),
        )
    }

    fn map(&self, ptr: DevicePtr, bytes: u64) -> Result<(), DeviceError> {
        self.map_range(ptr, None, bytes, self.page())
    }

    fn map_handles(&self, ptr: DevicePtr, bytes: u64, handle: u64) -> Result<(), DeviceError> {
        let page = self.page();
        if handle == 0 || handle % page != 0 || bytes % handle != 0 {
            return Err(DeviceError::UnknownPointer { ptr });
        }
        self.map_range(ptr, None, bytes, handle)
    }

    fn unmap(&self, ptr: DevicePtr, bytes: u64) -> Result<(), DeviceError> {
        self.unmap_range(ptr, bytes, true)
    }

    /// Walked as `unmap_pages` walks the range: a page each, or a larger handle where one was
    /// mapped.
    fn handles_in(&self, ptr: DevicePtr, bytes: u64) -> u64 {
        let (mut va, mut n) = (ptr, 0);
        while va < ptr + bytes {
            va += self.handle_at(va);
            n += 1;
        }
        n
    }

    fn map_alias(&self, ptr: DevicePtr, src: DevicePtr, bytes: u64) -> Result<(), DeviceError> {
        // Pages one by one, or the one larger handle mapped at `src`, whole (cuMemMap maps a
        // handle from offset 0).
        let handle = self.handle_at(src);
        if handle != self.page() && handle != bytes {
            return Err(DeviceError::UnknownPointer { ptr });
        }
        self.map_range(ptr, Some(src), bytes, handle)
    }

    fn unmap_alias(&self, ptr: DevicePtr, bytes: u64) -> Result<(), DeviceError> {
        self.unmap_range(ptr, bytes, false)
    }

    fn move_handles(&self, ptr: DevicePtr, src: DevicePtr, bytes: u64) -> Result<(), DeviceError> {
        // The handles are released right after mapping (module doc): the new mapping keeps the
        // memory once the old one is gone, and `allocated_bytes` does not change.
        let handle = self.handle_at(src);
        if bytes == 0 || bytes % handle != 0 {
            return Err(DeviceError::UnknownPointer { ptr });
        }
        self.map_range(ptr, Some(src), bytes, handle)?;
        if let Err(e) = self.unmap_range(src, bytes, false) {
            // Failure changes nothing: the memory stays where it was.
            let _ = self.unmap_range(ptr, bytes, false);
            return Err(e);
        }
        Ok(())
    }

    /// See `cuda_split`: through a scratch range on the device where it has room for the pages
    /// kept, else through host memory.
    fn split_handle(&self, ptr: DevicePtr, bytes: u64, keep: &[u64]) -> Result<(), DeviceError> {
        self.split(ptr, bytes, keep)
    }

    fn quiesce(&self) -> Result<(), DeviceError> {
        let _current = self.make_current()?;
        // SAFETY: the device's context is current on this thread; the call takes no pointers.
        check(
            "cuCtxSynchronize",
            self.timed(|o| &mut o.unmap_sync, || unsafe { sys::cuCtxSynchronize() }),
        )
    }
}
