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

pub use conf::{ConfError, PytorchConf};
pub use model::{Driver, Model};

use super::{PeerCounts, PeerModel, PeerTarget};
use adaptalloc::device::{Device, DevicePtr};
use adaptalloc::strategy::StreamId;

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

    fn map(&mut self, ptr: u64, bytes: u64, handle: u64) -> bool {
        self.dev
            .vmm()
            .is_some_and(|v| v.map_handles(ptr, bytes, handle).is_ok())
    }

    fn unmap(&mut self, ptr: u64, bytes: u64) {
        if let Some(Err(e)) = self.dev.vmm().map(|v| v.quiesce().and_then(|()| v.unmap(ptr, bytes))) {
            tracing::error!(ptr, error = %e, "pytorch peer: unmap failed");
        }
    }

    fn unreserve(&mut self, ptr: u64) {
        if let Some(Err(e)) = self.dev.vmm().map(|v| v.unreserve(ptr)) {
            tracing::error!(ptr, error = %e, "pytorch peer: address range release failed");
        }
    }
}

/// PyTorch's allocator over a [`Device`] (`pytorch` and `pytorch-expandable` in `compare`).
pub struct Pytorch {
    model: Model,
    driver: DeviceDriver,
}

/// The `pytorch` peer as a [`ReplayTarget`](crate::trace::ReplayTarget).
pub type PytorchPeer = PeerTarget<Pytorch>;

/// PyTorch's allocator configured by `conf`, over `dev`.
pub fn peer(dev: Arc<dyn Device>, conf: PytorchConf) -> PytorchPeer {
    let driver = DeviceDriver::new(dev.clone());
    PeerTarget::new(
        dev,
        Pytorch {
            model: Model::new(conf),
            driver,
        },
    )
}

impl PeerModel for Pytorch {
    fn alloc(&mut self, bytes: u64, stream: StreamId) -> Option<DevicePtr> {
        self.model.malloc(&mut self.driver, bytes, stream)
    }

    fn free(&mut self, ptr: DevicePtr, _bytes: u64) {
        self.model.free(ptr);
    }

    fn release_all(&mut self) {
        self.model.empty_cache(&mut self.driver);
    }

    fn counts(&self) -> PeerCounts {
        let s = self.model.stats();
        PeerCounts {
            driver_allocs: s.segment_allocs + s.page_maps,
            driver_frees: s.segment_frees + s.page_unmaps,
            recoveries: s.recoveries,
            reserved: s.reserved,
        }
    }

    fn reset_peak(&mut self) {
        self.model.reset_peak();
    }
}

#[cfg(test)]
mod tests;
