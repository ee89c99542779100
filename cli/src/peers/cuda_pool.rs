//! CUDA's stream-ordered pool on a real GPU as a replay target (`gpu-bench`): every allocation a
//! timed cuMemAllocAsync and every free a cuMemFreeAsync on the device's default pool, whose
//! release threshold is at its maximum (the driver's own caching allocator). A pass ends with a
//! stream synchronization (in [`ReplayTarget::counters`]); dropping it frees what is live and
//! trims the pool.

use std::collections::HashMap;
use std::sync::Arc;

use adaptalloc::device::{CudaDevice, CudaPool, Device, DevicePtr};
use adaptalloc::error::DeviceError;
use adaptalloc::stats::Counter;
use adaptalloc::strategy::StreamId;
use parking_lot::Mutex;

use crate::trace::{ReplayTarget, TargetCounters};

#[derive(Debug, Default)]
struct PoolState {
    calls: u64,
    frees: u64,
    live: HashMap<DevicePtr, u64>,
    live_bytes: Counter,
    /// Time spent in cuMemAllocAsync / cuMemFreeAsync, ns.
    call_ns: u64,
}

/// [`CudaPool`] with the bookkeeping of a replay target.
pub struct CudaPoolTarget {
    pool: CudaPool,
    dev: Arc<dyn Device>,
    state: Mutex<PoolState>,
}

impl CudaPoolTarget {
    pub fn new(cuda: Arc<CudaDevice>) -> Result<Self, DeviceError> {
        let dev: Arc<dyn Device> = cuda.clone();
        Ok(CudaPoolTarget {
            pool: CudaPool::new(cuda)?,
            dev,
            state: Mutex::new(PoolState::default()),
        })
    }

    /// Time spent in the async calls so far, ns.
    pub fn call_ns(&self) -> u64 {
        self.state.lock().call_ns
    }
}

impl ReplayTarget for CudaPoolTarget {
    fn allocate(&self, bytes: u64, _stream: StreamId) -> Option<DevicePtr> {
        let (ptr, ns) = self.pool.alloc_async(bytes).ok()?;
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
        match self.pool.free_async(ptr) {
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
        if let Err(e) = self.pool.synchronize() {
            tracing::error!(error = %e, "cuStreamSynchronize failed");
        }
        let reserved = self.pool.reserved_high().unwrap_or(0);
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
        if let Err(e) = self.pool.reset_reserved_high() {
            tracing::error!(error = %e, "cannot reset the pool's high watermark");
        }
        self.state.lock().live_bytes.reset_peak();
    }

    fn device(&self) -> &Arc<dyn Device> {
        &self.dev
    }
}

impl Drop for CudaPoolTarget {
    fn drop(&mut self) {
        let live: Vec<DevicePtr> = self.state.lock().live.keys().copied().collect();
        for ptr in live {
            ReplayTarget::deallocate(self, ptr, 0);
        }
        if let Err(e) = self.pool.trim() {
            tracing::error!(error = %e, "cannot trim the CUDA pool");
        }
    }
}
