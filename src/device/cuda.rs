//! `CudaDevice`: device memory from the CUDA driver (cuMemAlloc / cuMemFree / cuMemGetInfo)
//! through cudarc's dynamically loaded bindings. Builds and links with no CUDA installed;
//! [`CudaDevice::new`] returns [`DeviceError::NoDriver`] where no driver library is present.

use std::time::Instant;

use cudarc::driver::sys;
use parking_lot::Mutex;

use super::{Device, DevicePtr, DeviceStats, MemInfo};
use crate::error::DeviceError;
use crate::size::{ByteSize, MIB};

/// One CUDA device, used through its primary context (the one the runtime API and PyTorch use).
#[derive(Debug)]
pub struct CudaDevice {
    ordinal: i32,
    device: sys::CUdevice,
    context: sys::CUcontext,
    name: String,
    pub(super) stats: Mutex<DeviceStats>,
    /// Sizes of live driver allocations, so frees keep `allocated_bytes` exact.
    sizes: Mutex<std::collections::HashMap<DevicePtr, u64>>,
    /// The VMM mapping granule when the device supports virtual memory management.
    pub(super) vmm_page: Option<u64>,
    pub(super) reservations: Mutex<super::cuda_vmm::Reservations>,
    /// Mappings of handles larger than a page (address -> size), made by `map_handles`.
    pub(super) mappings: Mutex<std::collections::BTreeMap<DevicePtr, u64>>,
    /// Each stream's last checkpoint event (cuda_streams.rs).
    pub(super) checkpoints:
        Mutex<std::collections::HashMap<crate::strategy::StreamId, super::cuda_streams::Checkpoint>>,
}

// SAFETY: a CUcontext handle may be used from any thread once made current there; every call
// below makes the primary context current first. The handle itself is an opaque pointer that
// the driver keeps valid until cuDevicePrimaryCtxRelease in Drop.
unsafe impl Send for CudaDevice {}
// SAFETY: as above; the only mutable state, the statistics, sits behind a Mutex.
unsafe impl Sync for CudaDevice {}

/// Names a failed driver call without formatting cudarc's error type, whose Display calls into
/// libcuda (unsafe to do when the library is absent).
pub(super) fn check(call: &'static str, result: sys::CUresult) -> Result<(), DeviceError> {
    if result == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(DeviceError::Driver {
            call,
            code: format!("{result:?}"),
        })
    }
}

impl CudaDevice {
    /// True when a CUDA driver library can be loaded on this machine. Cheap after the first call.
    pub fn driver_present() -> bool {
        // SAFETY: is_culib_present only tries to dlopen the library names; it calls no driver
        // function and is safe to call with no driver installed.
        unsafe { sys::is_culib_present() }
    }

    /// Opens device `ordinal` (0-based) and retains its primary context.
    ///
    /// Errors: [`DeviceError::NoDriver`] when no driver library is present (no panic: cudarc's
    /// loader panics when called without one, so this is checked first); [`DeviceError::Driver`]
    /// when the ordinal does not exist or the driver fails to initialize.
    pub fn new(ordinal: i32) -> Result<Self, DeviceError> {
        if !Self::driver_present() {
            return Err(DeviceError::NoDriver {
                reason: "libcuda could not be loaded".into(),
            });
        }
        let mut device: sys::CUdevice = 0;
        let mut context: sys::CUcontext = std::ptr::null_mut();
        let mut name_buf = [0 as std::ffi::c_char; 128];
        // SAFETY: the driver library is present (checked above), so cudarc's loader will not
        // panic; every out-pointer points at a live local of the right type and size.
        unsafe {
            check("cuInit", sys::cuInit(0))?;
            check("cuDeviceGet", sys::cuDeviceGet(&mut device, ordinal))?;
            check(
                "cuDevicePrimaryCtxRetain",
                sys::cuDevicePrimaryCtxRetain(&mut context, device),
            )?;
            check(
                "cuDeviceGetName",
                sys::cuDeviceGetName(name_buf.as_mut_ptr(), name_buf.len() as i32, device),
            )?;
        }
        // SAFETY: cuDeviceGetName wrote a NUL-terminated string into the buffer; the last byte
        // is forced to NUL in case the name filled it.
        let name = unsafe {
            name_buf[name_buf.len() - 1] = 0;
            std::ffi::CStr::from_ptr(name_buf.as_ptr())
                .to_string_lossy()
                .into_owned()
        };
        Ok(CudaDevice {
            ordinal,
            device,
            context,
            name,
            stats: Mutex::new(DeviceStats::default()),
            sizes: Mutex::new(std::collections::HashMap::new()),
            vmm_page: super::cuda_vmm::probe(device, ordinal),
            reservations: Mutex::new(Default::default()),
            mappings: Mutex::new(Default::default()),
            checkpoints: Mutex::new(Default::default()),
        })
    }

    /// The CUDA device ordinal.
    pub fn ordinal(&self) -> i32 {
        self.ordinal
    }

    /// The driver's handle of this device.
    pub(super) fn handle(&self) -> sys::CUdevice {
        self.device
    }

    /// The VMM mapping granule, when the device supports virtual memory management (and
    /// `ADAPTALLOC_CUDA_VMM=0` does not turn it off).
    pub fn vmm_page_size(&self) -> Option<u64> {
        self.vmm_page
    }

    /// The driver refused `bytes`: the error with the device's free and total memory now.
    pub(super) fn out_of_memory(&self, bytes: u64) -> DeviceError {
        let info = self.mem_info().unwrap_or(MemInfo { free: 0, total: 0 });
        DeviceError::OutOfMemory {
            requested: ByteSize(bytes),
            free: ByteSize(info.free),
            total: ByteSize(info.total),
        }
    }

    /// Makes this device's primary context current on this thread until the guard drops, then
    /// restores the caller's (every entry point leaves the thread's current context as it found
    /// it). Cost when ours is current already: one cuCtxGetCurrent.
    pub(super) fn make_current(&self) -> Result<CurrentContext, DeviceError> {
        let mut previous: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: `previous` is a live local out-pointer.
        check("cuCtxGetCurrent", unsafe { sys::cuCtxGetCurrent(&mut previous) })?;
        if previous == self.context {
            return Ok(CurrentContext { restore: None });
        }
        // SAFETY: the context was retained in `new` and is released only in Drop.
        check("cuCtxSetCurrent", unsafe { sys::cuCtxSetCurrent(self.context) })?;
        Ok(CurrentContext {
            restore: Some(previous),
        })
    }
}

/// The caller's current context, restored when dropped ([`CudaDevice::make_current`]).
#[must_use = "the caller's context is restored when the guard drops"]
pub(super) struct CurrentContext {
    restore: Option<sys::CUcontext>,
}

impl Drop for CurrentContext {
    fn drop(&mut self) {
        if let Some(previous) = self.restore {
            // SAFETY: `previous` was current on this thread when the guard was made (null, or a
            // context the caller holds); setting it back is what the caller had.
            let r = unsafe { sys::cuCtxSetCurrent(previous) };
            if let Err(e) = check("cuCtxSetCurrent", r) {
                tracing::error!(error = %e, "cannot restore the caller's CUDA context");
            }
        }
    }
}

impl CudaDevice {
    /// Runs one driver call, `f`, timing it into the statistics under `kind` (the total,
    /// `driver_ns`, is their sum: [`Device::stats`]).
    pub(super) fn timed<T>(&self, kind: fn(&mut super::DriverOps) -> &mut super::OpTally, f: impl FnOnce() -> T) -> T {
        let start = Instant::now();
        let r = f();
        let ns = start.elapsed().as_nanos() as u64;
        kind(&mut self.stats.lock().ops).charge(1, ns);
        r
    }
}

impl Device for CudaDevice {
    fn allocate(&self, bytes: u64) -> Result<DevicePtr, DeviceError> {
        let _current = self.make_current()?;
        let _relaxed = super::cuda_streams::RelaxedCapture::new();
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: `ptr` is a live local; the context is current on this thread.
        let result = self.timed(
            |o| &mut o.alloc,
            || unsafe { sys::cuMemAlloc_v2(&mut ptr, bytes as usize) },
        );
        let mut stats = self.stats.lock();
        if result == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
            stats.failed_allocs += 1;
            drop(stats);
            return Err(self.out_of_memory(bytes));
        }
        if let Err(e) = check("cuMemAlloc_v2", result) {
            stats.failed_allocs += 1;
            return Err(e);
        }
        stats.driver_allocs += 1;
        stats.allocated_bytes += bytes;
        self.sizes.lock().insert(ptr, bytes);
        Ok(ptr)
    }

    fn free(&self, ptr: DevicePtr) -> Result<(), DeviceError> {
        let _current = self.make_current()?;
        // SAFETY: callers pass pointers from `allocate` (the allocator's map guarantees it).
        // Timed with the synchronization it implies (not told apart on a real device).
        let result = self.timed(|o| &mut o.free, || unsafe { sys::cuMemFree_v2(ptr) });
        check("cuMemFree_v2", result)?;
        let mut stats = self.stats.lock();
        stats.driver_frees += 1;
        stats.allocated_bytes -= self.sizes.lock().remove(&ptr).unwrap_or(0);
        Ok(())
    }

    fn mem_info(&self) -> Result<MemInfo, DeviceError> {
        let _current = self.make_current()?;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: both out-pointers are live locals; the context is current.
        let r = self.timed(
            |o| &mut o.mem_info,
            || unsafe { sys::cuMemGetInfo_v2(&mut free, &mut total) },
        );
        check("cuMemGetInfo_v2", r)?;
        self.stats.lock().mem_info_calls += 1;
        Ok(MemInfo {
            free: free as u64,
            total: total as u64,
        })
    }

    fn granularity(&self) -> u64 {
        2 * MIB
    }

    fn vmm(&self) -> Option<&dyn super::VirtualMemory> {
        self.vmm_page.map(|_| self as &dyn super::VirtualMemory)
    }

    /// The stream's checkpoint event when it covers the free at `freed_at`, else
    /// `cuStreamQuery` on the whole stream (cuda_streams.rs). Never waits.
    fn stream_done(&self, stream: crate::strategy::StreamId, freed_at: u64, _now: u64) -> bool {
        self.done_since(stream, freed_at)
    }

    fn stream_wait(&self, stream: crate::strategy::StreamId, freed_at: u64) -> Result<(), DeviceError> {
        self.wait_until(stream, freed_at)
    }

    fn stream_checkpoint(&self, stream: crate::strategy::StreamId, op: u64) {
        self.checkpoint(stream, op)
    }

    fn cuda_ordinal(&self) -> Option<i32> {
        Some(self.ordinal)
    }

    fn stats(&self) -> DeviceStats {
        let mut stats = *self.stats.lock();
        stats.driver_ns = stats.ops.total_ns();
        stats
    }

    fn name(&self) -> String {
        self.name.clone()
    }
}

impl Drop for CudaDevice {
    fn drop(&mut self) {
        if let Ok(_current) = self.make_current() {
            self.drop_checkpoints();
        }
        // SAFETY: releases the retain taken in `new`; the driver is present since `new` succeeded.
        let _ = unsafe { sys::cuDevicePrimaryCtxRelease_v2(self.device) };
    }
}
