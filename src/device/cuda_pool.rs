//! CUDA's stream-ordered pool (cuMemAllocAsync / cuMemFreeAsync on the device's default memory
//! pool) as a peer allocator, for `scripts/gpu-bench.sh`: the pool's release threshold is set
//! to its maximum, so freed memory stays in the pool (the driver's own caching allocator).
//! Allocations and frees are ordered on the legacy default stream; a replay pass ends with a
//! stream synchronization (in [`ReplayTarget::counters`]).

use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::sys;
use parking_lot::Mutex;

use super::cuda::check;
use super::{CudaDevice, Device, DevicePtr};
use crate::error::DeviceError;
use crate::stats::Counter;
use crate::strategy::StreamId;
use crate::trace::{ReplayTarget, TargetCounters};

#[derive(Debug, Default)]
struct PoolState {
    calls: u64,
    frees: u64,
    live: std::collections::HashMap<DevicePtr, u64>,
    live_bytes: Counter,
    /// Time spent in cuMemAllocAsync / cuMemFreeAsync, ns.
    call_ns: u64,
}

/// The device's default memory pool with its release threshold at the maximum.
pub struct CudaPool {
    cuda: Arc<CudaDevice>,
    dev: Arc<dyn Device>,
    pool: sys::CUmemoryPool,
    state: Mutex<PoolState>,
}

// SAFETY: the pool handle is an opaque driver handle valid for the device's lifetime (the
// default pool is never destroyed); every call makes the primary context current first, and
// the host-side state sits behind a Mutex.
unsafe impl Send for CudaPool {}
// SAFETY: as above.
unsafe impl Sync for CudaPool {}

impl CudaPool {
    pub fn new(cuda: Arc<CudaDevice>) -> Result<Self, DeviceError> {
        cuda.make_current()?;
        let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
        // SAFETY: `pool` is a valid out-pointer; the device handle comes from a live CudaDevice.
        check("cuDeviceGetDefaultMemPool", unsafe {
            sys::cuDeviceGetDefaultMemPool(&mut pool, cuda.handle())
        })?;
        let mut threshold = u64::MAX;
        // SAFETY: the release threshold attribute takes a pointer to a cuuint64_t.
        check("cuMemPoolSetAttribute", unsafe {
            sys::cuMemPoolSetAttribute(
                pool,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                (&mut threshold as *mut u64).cast(),
            )
        })?;
        let dev: Arc<dyn Device> = cuda.clone();
        Ok(CudaPool {
            cuda,
            dev,
            pool,
            state: Mutex::new(PoolState::default()),
        })
    }

    /// One timed cuMemAllocAsync (ns) and its pointer.
    pub fn alloc_async(&self, bytes: u64) -> Result<(DevicePtr, u64), DeviceError> {
        self.cuda.make_current()?;
        let mut ptr: sys::CUdeviceptr = 0;
        let t = Instant::now();
        // SAFETY: `ptr` is a valid out-pointer; the null stream is the legacy default stream.
        let r = unsafe { sys::cuMemAllocAsync(&mut ptr, bytes as usize, std::ptr::null_mut()) };
        let ns = t.elapsed().as_nanos() as u64;
        check("cuMemAllocAsync", r)?;
        Ok((ptr, ns))
    }

    /// One timed cuMemFreeAsync (ns).
    pub fn free_async(&self, ptr: DevicePtr) -> Result<u64, DeviceError> {
        self.cuda.make_current()?;
        let t = Instant::now();
        // SAFETY: `ptr` came from cuMemAllocAsync on this pool and is freed once.
        let r = unsafe { sys::cuMemFreeAsync(ptr, std::ptr::null_mut()) };
        let ns = t.elapsed().as_nanos() as u64;
        check("cuMemFreeAsync", r)?;
        Ok(ns)
    }

    /// Waits for the stream-ordered frees to complete.
    pub fn synchronize(&self) -> Result<(), DeviceError> {
        self.cuda.make_current()?;
        // SAFETY: the null stream is always valid.
        check("cuStreamSynchronize", unsafe {
            sys::cuStreamSynchronize(std::ptr::null_mut())
        })
    }

    /// The most memory the pool has held (CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH).
    pub fn reserved_high(&self) -> Result<u64, DeviceError> {
        let mut v = 0u64;
        // SAFETY: this attribute writes a cuuint64_t.
        check("cuMemPoolGetAttribute", unsafe {
            sys::cuMemPoolGetAttribute(
                self.pool,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH,
                (&mut v as *mut u64).cast(),
            )
        })?;
        Ok(v)
    }

    /// Time spent in the async calls so far, ns.
    pub fn call_ns(&self) -> u64 {
        self.state.lock().call_ns
    }

    /// Gives the pool's idle memory back to the driver.
    pub fn trim(&self) -> Result<(), DeviceError> {
        self.synchronize()?;
        // SAFETY: the pool is the device's default pool, valid while the device lives.
        check("cuMemPoolTrimTo", unsafe { sys::cuMemPoolTrimTo(self.pool, 0) })
    }
}

impl ReplayTarget for CudaPool {
    fn allocate(&self, bytes: u64, _stream: StreamId) -> Option<DevicePtr> {
        let (ptr, ns) = self.alloc_async(bytes).ok()?;
        let mut s = self.state.lock();
        s.calls += 1;
        s.call_ns += ns;
        s.live.insert(ptr, bytes);
        s.live_bytes.add(bytes);
        Some(ptr)
    }

    fn deallocate(&self, ptr: DevicePtr, _stream: StreamId) {
        let Some(bytes) = self.state.lock().live.remove(&ptr) else {
            tracing::error!(ptr, "cuda pool: free of an unknown pointer");
            return;
        };
        match self.free_async(ptr) {
            Ok(ns) => {
                let mut s = self.state.lock();
                s.frees += 1;
                s.call_ns += ns;
                s.live_bytes.sub(bytes);
            }
            Err(e) => tracing::error!(ptr, error = %e, "cuMemFreeAsync failed"),
        }
    }

    fn counters(&self) -> TargetCounters {
        if let Err(e) = self.synchronize() {
            tracing::error!(error = %e, "cuStreamSynchronize failed");
        }
        let reserved = self.reserved_high().unwrap_or(0);
        let s = self.state.lock();
        TargetCounters {
            driver_allocs: s.calls,
            driver_frees: s.frees,
            oom_recoveries: 0,
            live_bytes: s.live_bytes.current,
            peak_live_bytes: s.live_bytes.peak,
            reserved_bytes: reserved,
            peak_reserved_bytes: reserved,
            idle_bytes: reserved.saturating_sub(s.live_bytes.current),
        }
    }

    fn reset_peaks(&self) {
        let mut zero = 0u64;
        // SAFETY: resetting the high watermark takes a pointer to a zero cuuint64_t.
        let r = unsafe {
            sys::cuMemPoolSetAttribute(
                self.pool,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH,
                (&mut zero as *mut u64).cast(),
            )
        };
        if let Err(e) = check("cuMemPoolSetAttribute", r) {
            tracing::error!(error = %e, "cannot reset the pool's high watermark");
        }
        let mut s = self.state.lock();
        s.live_bytes.reset_peak();
    }

    fn device(&self) -> &Arc<dyn Device> {
        &self.dev
    }
}

impl Drop for CudaPool {
    fn drop(&mut self) {
        let live: Vec<DevicePtr> = self.state.lock().live.keys().copied().collect();
        for ptr in live {
            ReplayTarget::deallocate(self, ptr, 0);
        }
        if let Err(e) = self.trim() {
            tracing::error!(error = %e, "cannot trim the CUDA pool");
        }
    }
}
