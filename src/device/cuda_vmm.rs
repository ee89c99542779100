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
use std::time::Instant;

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
fn allocation_prop(ordinal: i32) -> sys::CUmemAllocationProp {
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
    fn page(&self) -> u64 {
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
    fn map_range(&self, ptr: DevicePtr, src: Option<DevicePtr>, bytes: u64, handle: u64) -> Result<(), DeviceError> {
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
    fn unmap_range(&self, ptr: DevicePtr, bytes: u64, first: bool) -> Result<(), DeviceError> {
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
    fn handle_at(&self, va: DevicePtr) -> u64 {
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

    fn quiesce(&self) -> Result<(), DeviceError> {
        let _current = self.make_current()?;
        // SAFETY: the device's context is current on this thread; the call takes no pointers.
        check(
            "cuCtxSynchronize",
            self.timed(|o| &mut o.unmap_sync, || unsafe { sys::cuCtxSynchronize() }),
        )
    }
}

/// Median latency of each virtual-memory call on one device, ns (what `adaptalloc gpu-bench`
/// writes into a cost model's `[vmm]` table), with every call's time for its statistics.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct VmmTimings {
    /// cuMemAddressReserve.
    pub reserve_ns: u64,
    /// cuMemAddressFree.
    pub unreserve_ns: u64,
    /// cuMemCreate of one handle.
    pub create_ns: u64,
    /// cuMemMap of one handle.
    pub map_ns: u64,
    /// cuMemSetAccess of one mapping.
    pub set_access_ns: u64,
    /// cuMemSetAccess over a run of the `n` handles, mapped one after another without grants,
    /// divided by `n`: what a handle costs in the one grant a mapped run gets (CudaDevice's
    /// way, and PyTorch's expandable segments').
    pub run_access_ns: u64,
    /// cuMemUnmap of one mapping.
    pub unmap_ns: u64,
    /// cuMemRelease of one handle.
    pub release_ns: u64,
    /// cuCtxSynchronize on an idle device: the floor of the wait before unmapping.
    pub sync_ns: u64,
    /// Each call's time, ns, by kind (`create`, `map`, `set_access`, `unmap`, `release`), sorted.
    pub samples: [(&'static str, Vec<u64>); 5],
}

/// The median of `v` (the upper one of an even count), sorting it in place; 0 when empty.
fn median(v: &mut [u64]) -> u64 {
    v.sort_unstable();
    v.get(v.len() / 2).copied().unwrap_or(0)
}

impl CudaDevice {
    /// Times every virtual-memory call on `n` physical handles of `handle` bytes (a multiple
    /// of the granule): one reservation for them all, then per handle cuMemCreate, cuMemMap and
    /// cuMemSetAccess, then per handle cuMemUnmap and cuMemRelease, and cuMemAddressFree; the
    /// median of each. Everything it made is given back, on failure too. Errors when the device
    /// has no virtual memory management or `handle` is off the granule.
    pub fn time_vmm_calls(&self, handle: u64, n: usize) -> Result<VmmTimings, DeviceError> {
        let page = self.timing_page(handle, n)?;
        let _current = self.make_current()?;
        let (prop, desc) = props_and_access(self.ordinal());
        let total = handle as usize * n;
        let mut base: sys::CUdeviceptr = 0;
        let t = Instant::now();
        // SAFETY: `base` is a live local; address space only.
        check("cuMemAddressReserve", unsafe {
            sys::cuMemAddressReserve(&mut base, total, page as usize, 0, 0)
        })?;
        let mut out = VmmTimings {
            reserve_ns: t.elapsed().as_nanos() as u64,
            ..Default::default()
        };
        // Phase 1: every handle created, mapped and granted on its own, then given back.
        let mut t1 = CallTimes::default();
        let (handles, mapped, mut result) = map_timed(base, handle, n, &prop, Some(&desc), &mut t1);
        let t = Instant::now();
        // SAFETY: the context is current; the call takes no pointers.
        let synced = check("cuCtxSynchronize", unsafe { sys::cuCtxSynchronize() });
        out.sync_ns = t.elapsed().as_nanos() as u64;
        result = result
            .and(synced)
            .and(give_back_timed(base, handle, &handles, mapped, &mut t1));
        // Phase 2: the same again mapped without grants, then one grant for the run (what a
        // workload's mapping pays: CudaDevice's way, and PyTorch's expandable segments'), per
        // handle.
        if result.is_ok() {
            let mut t2 = CallTimes::default();
            let (handles, mapped, mut run) = map_timed(base, handle, n, &prop, None, &mut t2);
            if run.is_ok() {
                let t = Instant::now();
                // SAFETY: every handle of `base..base + n * handle` was just mapped; `desc` is live.
                run = check("cuMemSetAccess", unsafe { sys::cuMemSetAccess(base, total, &desc, 1) });
                out.run_access_ns = t.elapsed().as_nanos() as u64 / n as u64;
            }
            result = run.and(give_back_timed(base, handle, &handles, mapped, &mut t2));
        }
        let t = Instant::now();
        // SAFETY: our reservation, with every handle in it unmapped above.
        let freed = check("cuMemAddressFree", unsafe { sys::cuMemAddressFree(base, total) });
        out.unreserve_ns = t.elapsed().as_nanos() as u64;
        result.and(freed)?;
        let CallTimes {
            mut create,
            mut map,
            mut access,
            mut unmap,
            mut release,
        } = t1;
        out.create_ns = median(&mut create);
        out.map_ns = median(&mut map);
        out.set_access_ns = median(&mut access);
        out.unmap_ns = median(&mut unmap);
        out.release_ns = median(&mut release);
        out.samples = [
            ("create", create),
            ("map", map),
            ("set_access", access),
            ("unmap", unmap),
            ("release", release),
        ];
        Ok(out)
    }
}

impl CudaDevice {
    /// What one cuMemSetAccess over a run of freshly mapped handles of `handle` bytes costs a
    /// handle, by the run's length and by how many other handles the process has mapped and
    /// granted: for each of `backgrounds` (others mapped first, granted one by one, in a
    /// reservation of their own) and each of `runs`, the median over `reps` runs of the time of
    /// the one grant divided by the run's length. Returns (others mapped, run length, ns a
    /// handle). Runs or backgrounds over a quarter of the free memory are left out. Everything
    /// it made is given back, on failure too.
    pub fn time_run_grants(
        &self,
        handle: u64,
        runs: &[usize],
        backgrounds: &[usize],
        reps: usize,
    ) -> Result<Vec<(usize, usize, u64)>, DeviceError> {
        let page = self.timing_page(handle, reps)?;
        let _current = self.make_current()?;
        let (prop, desc) = props_and_access(self.ordinal());
        let room = crate::device::Device::mem_info(self).map(|m| m.free / 4).unwrap_or(0);
        let mut out = Vec::new();
        for &others in backgrounds.iter().filter(|&&b| b as u64 * handle <= room) {
            // The others: mapped and granted one by one, held while the runs are timed.
            let (bg, bg_handles, bg_mapped, mut result) = if others == 0 {
                (0, Vec::new(), 0, Ok(()))
            } else {
                let base = reserve_range(others as u64 * handle, page)?;
                let (h, m, r) = map_timed(base, handle, others, &prop, Some(&desc), &mut CallTimes::default());
                (base, h, m, r)
            };
            for &n in runs.iter().filter(|&&n| n as u64 * handle <= room) {
                if result.is_err() {
                    break;
                }
                let mut per = Vec::with_capacity(reps);
                for _ in 0..reps {
                    let base = match reserve_range(n as u64 * handle, page) {
                        Ok(b) => b,
                        Err(e) => {
                            result = Err(e);
                            break;
                        }
                    };
                    let mut t = CallTimes::default();
                    let (handles, mapped, mut run) = map_timed(base, handle, n, &prop, None, &mut t);
                    if run.is_ok() {
                        let t0 = Instant::now();
                        // SAFETY: every handle of `base..base + n * handle` was just mapped;
                        // `desc` is one live descriptor.
                        run = check("cuMemSetAccess", unsafe {
                            sys::cuMemSetAccess(base, n * handle as usize, &desc, 1)
                        });
                        per.push(t0.elapsed().as_nanos() as u64 / n as u64);
                    }
                    run = run.and(give_back_timed(base, handle, &handles, mapped, &mut t));
                    // SAFETY: our reservation, every handle in it unmapped above.
                    run = run.and(check("cuMemAddressFree", unsafe {
                        sys::cuMemAddressFree(base, n * handle as usize)
                    }));
                    if let Err(e) = run {
                        result = Err(e);
                        break;
                    }
                }
                if !per.is_empty() {
                    out.push((others, n, median(&mut per)));
                }
            }
            if others > 0 {
                result = result.and(give_back_timed(
                    bg,
                    handle,
                    &bg_handles,
                    bg_mapped,
                    &mut CallTimes::default(),
                ));
                // SAFETY: our reservation, every handle in it unmapped above.
                result = result.and(check("cuMemAddressFree", unsafe {
                    sys::cuMemAddressFree(bg, others * handle as usize)
                }));
            }
            result?;
        }
        Ok(out)
    }
}

impl CudaDevice {
    /// The device's page, for timing handles of `handle` bytes `n` times: an error where the
    /// device has no virtual memory management, `handle` is off the granule or `n` is 0.
    fn timing_page(&self, handle: u64, n: usize) -> Result<u64, DeviceError> {
        let Some(page) = self.vmm_page else {
            return Err(DeviceError::Driver {
                call: "cuDeviceGetAttribute",
                code: "no virtual memory management on this device (or ADAPTALLOC_CUDA_VMM=0)".into(),
            });
        };
        if handle == 0 || handle % page != 0 || n == 0 {
            return Err(DeviceError::Driver {
                call: "cuMemCreate",
                code: format!("a handle of {handle} bytes is not a multiple of the {page}-byte granule"),
            });
        }
        Ok(page)
    }
}

/// The allocation properties of a pinned handle on device `ordinal`, and read-write access to it.
fn props_and_access(ordinal: i32) -> (sys::CUmemAllocationProp, sys::CUmemAccessDesc) {
    let prop = allocation_prop(ordinal);
    let desc = sys::CUmemAccessDesc {
        location: prop.location,
        flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    };
    (prop, desc)
}

/// Reserves `bytes` of address space aligned to `page` (the context current).
fn reserve_range(bytes: u64, page: u64) -> Result<sys::CUdeviceptr, DeviceError> {
    let mut base: sys::CUdeviceptr = 0;
    // SAFETY: `base` is a live local; address space only.
    check("cuMemAddressReserve", unsafe {
        sys::cuMemAddressReserve(&mut base, bytes as usize, page as usize, 0, 0)
    })?;
    Ok(base)
}

/// The time of each call of one phase of [`CudaDevice::time_vmm_calls`], ns.
#[derive(Default)]
struct CallTimes {
    create: Vec<u64>,
    map: Vec<u64>,
    access: Vec<u64>,
    unmap: Vec<u64>,
    release: Vec<u64>,
}

/// Runs `call`, pushing its time onto `times`.
fn timed(times: &mut Vec<u64>, call: impl FnOnce() -> sys::CUresult) -> sys::CUresult {
    let t = Instant::now();
    let r = call();
    times.push(t.elapsed().as_nanos() as u64);
    r
}

/// Creates and maps `n` handles of `handle` bytes one after another from `base` (unmapped, in
/// the caller's reservation, its context current), granting each its own access when `desc` is
/// Some; every call timed into `t`. Returns the handles made, how many of them are mapped, and
/// the first failure (where it stopped).
fn map_timed(
    base: sys::CUdeviceptr,
    handle: u64,
    n: usize,
    prop: &sys::CUmemAllocationProp,
    desc: Option<&sys::CUmemAccessDesc>,
    t: &mut CallTimes,
) -> (Vec<sys::CUmemGenericAllocationHandle>, usize, Result<(), DeviceError>) {
    let mut handles = Vec::with_capacity(n);
    for i in 0..n {
        let va = base + (i as u64) * handle;
        let mut h: sys::CUmemGenericAllocationHandle = 0;
        // SAFETY: `h` and `prop` are live; the context is current (the caller's contract).
        let r = timed(&mut t.create, || unsafe {
            sys::cuMemCreate(&mut h, handle as usize, prop, 0)
        });
        if let Err(e) = check("cuMemCreate", r) {
            return (handles, i, Err(e));
        }
        handles.push(h);
        // SAFETY: `va..va+handle` lies in the caller's reservation, unmapped; `h` is a handle
        // of exactly `handle` bytes that we hold.
        let r = timed(&mut t.map, || unsafe { sys::cuMemMap(va, handle as usize, 0, h, 0) });
        if let Err(e) = check("cuMemMap", r) {
            return (handles, i, Err(e));
        }
        if let Some(desc) = desc {
            // SAFETY: `va..va+handle` was just mapped; `desc` is one live descriptor.
            let r = timed(&mut t.access, || unsafe {
                sys::cuMemSetAccess(va, handle as usize, desc, 1)
            });
            if let Err(e) = check("cuMemSetAccess", r) {
                return (handles, i + 1, Err(e));
            }
        }
    }
    (handles, n, Ok(()))
}

/// Unmaps the first `mapped` of `handles` (mapped one after another from `base`, nothing queued
/// on them) and releases every one, timed into `t`; the first failure, after trying them all.
fn give_back_timed(
    base: sys::CUdeviceptr,
    handle: u64,
    handles: &[sys::CUmemGenericAllocationHandle],
    mapped: usize,
    t: &mut CallTimes,
) -> Result<(), DeviceError> {
    let mut result = Ok(());
    for (i, &h) in handles.iter().enumerate() {
        if i < mapped {
            let va = base + (i as u64) * handle;
            // SAFETY: mapped at this address by `map_timed`, nothing queued on it.
            let r = timed(&mut t.unmap, || unsafe { sys::cuMemUnmap(va, handle as usize) });
            result = result.and(check("cuMemUnmap", r));
        }
        // SAFETY: our reference from cuMemCreate, unmapped now: its memory goes back.
        let r = timed(&mut t.release, || unsafe { sys::cuMemRelease(h) });
        result = result.and(check("cuMemRelease", r));
    }
    result
}
