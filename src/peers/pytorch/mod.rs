//! PyTorch's native CUDA caching allocator as a peer: [`model`] holds its rules, [`conf`] its
//! configuration string, [`snapshot`] the check against what it really did on a GPU.
//!
//! Over a [`Device`], a segment is one driver allocation (cudaMalloc) and an expandable
//! segment's page one map (cuMemCreate + cuMemMap + cuMemSetAccess of one handle), as PyTorch
//! makes them; releasing either is one driver free.

pub mod conf;
pub mod model;
pub mod snapshot;

use std::sync::Arc;

use parking_lot::Mutex;

pub use conf::{ConfError, PytorchConf};
pub use model::{Driver, Model};

use crate::device::{Device, DevicePtr};
use crate::hash::FastMap;
use crate::stats::Counter;
use crate::strategy::StreamId;
use crate::trace::{ReplayTarget, TargetCounters};

/// A [`Device`] as the model's [`Driver`].
pub(crate) struct DeviceDriver {
    dev: Arc<dyn Device>,
    total: u64,
}

impl DeviceDriver {
    pub(crate) fn new(dev: Arc<dyn Device>) -> Self {
        let total = dev.mem_info().map(|m| m.total).unwrap_or(u64::MAX / 2);
        DeviceDriver { dev, total }
    }
}

impl Driver for DeviceDriver {
    fn malloc(&mut self, bytes: u64) -> Option<u64> {
        self.dev.allocate(bytes).ok()
    }

    fn free(&mut self, ptr: u64, _bytes: u64) {
        if let Err(e) = self.dev.free(ptr) {
            tracing::error!(ptr, error = %e, "pytorch peer: driver free failed");
        }
    }

    fn total_memory(&self) -> u64 {
        self.total
    }

    fn reserve(&mut self, bytes: u64) -> Option<u64> {
        self.dev.vmm()?.reserve(bytes).ok()
    }

    fn map(&mut self, ptr: u64, bytes: u64) -> bool {
        self.dev.vmm().is_some_and(|v| v.map(ptr, bytes).is_ok())
    }

    fn unmap(&mut self, ptr: u64, bytes: u64) {
        if let Some(Err(e)) = self.dev.vmm().map(|v| v.unmap(ptr, bytes)) {
            tracing::error!(ptr, error = %e, "pytorch peer: unmap failed");
        }
    }

    fn unreserve(&mut self, ptr: u64) {
        if let Some(Err(e)) = self.dev.vmm().map(|v| v.unreserve(ptr)) {
            tracing::error!(ptr, error = %e, "pytorch peer: address range release failed");
        }
    }
}

struct Inner {
    model: Model,
    driver: DeviceDriver,
    /// Live pointer -> requested bytes.
    live: FastMap<DevicePtr, u64>,
    live_bytes: Counter,
}

/// PyTorch's caching allocator over a [`Device`], as a [`ReplayTarget`] (`pytorch` and
/// `pytorch-expandable` in `compare`).
pub struct PytorchPeer {
    inner: Mutex<Inner>,
    dev: Arc<dyn Device>,
}

impl PytorchPeer {
    pub fn new(dev: Arc<dyn Device>, conf: PytorchConf) -> Self {
        PytorchPeer {
            inner: Mutex::new(Inner {
                model: Model::new(conf),
                driver: DeviceDriver::new(dev.clone()),
                live: FastMap::default(),
                live_bytes: Counter::default(),
            }),
            dev,
        }
    }

    /// `torch.cuda.empty_cache()`.
    pub fn empty_cache(&self) {
        let mut g = self.inner.lock();
        let Inner { model, driver, .. } = &mut *g;
        model.empty_cache(driver);
    }

    /// The model's own counts.
    pub fn model_stats(&self) -> model::ModelStats {
        self.inner.lock().model.stats()
    }
}

impl ReplayTarget for PytorchPeer {
    fn allocate(&self, bytes: u64, stream: StreamId) -> Option<DevicePtr> {
        let mut g = self.inner.lock();
        let Inner {
            model,
            driver,
            live,
            live_bytes,
        } = &mut *g;
        let ptr = model.malloc(driver, bytes, stream)?;
        live.insert(ptr, bytes);
        live_bytes.add(bytes);
        Some(ptr)
    }

    fn deallocate(&self, ptr: DevicePtr, _stream: StreamId) {
        let mut g = self.inner.lock();
        let Some(bytes) = g.live.remove(&ptr) else {
            tracing::error!(ptr, "pytorch peer: free of an unknown pointer");
            return;
        };
        g.live_bytes.sub(bytes);
        g.model.free(ptr);
    }

    fn counters(&self) -> TargetCounters {
        let g = self.inner.lock();
        let s = g.model.stats();
        TargetCounters {
            driver_allocs: s.segment_allocs + s.page_maps,
            driver_frees: s.segment_frees + s.page_unmaps,
            oom_recoveries: s.recoveries,
            live_bytes: g.live_bytes.current,
            peak_live_bytes: g.live_bytes.peak,
            reserved_bytes: s.reserved,
            peak_reserved_bytes: s.peak_reserved,
            idle_bytes: s.reserved.saturating_sub(g.live_bytes.current),
        }
    }

    fn reset_peaks(&self) {
        let mut g = self.inner.lock();
        g.live_bytes.reset_peak();
        g.model.reset_peak();
    }

    fn device(&self) -> &Arc<dyn Device> {
        &self.dev
    }
}

impl Drop for PytorchPeer {
    /// Frees what is still live, then every segment, so the device ends empty.
    fn drop(&mut self) {
        let Inner {
            model, driver, live, ..
        } = self.inner.get_mut();
        for (ptr, _) in live.drain() {
            model.free(ptr);
        }
        model.empty_cache(driver);
    }
}

#[cfg(test)]
mod tests;
