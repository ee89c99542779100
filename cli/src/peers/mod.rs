//! The allocators users run today, modelled over adaptalloc's [`Device`](adaptalloc::Device) so
//! that `compare`, `sweep`, `replay` and the benches measure them beside ours on the same
//! traces, capacities and cost model. Each is a [`PeerModel`] (its rules and its driver counts)
//! that one [`PeerTarget`] drives as a [`ReplayTarget`](crate::trace::ReplayTarget); gpu-alloc
//! keeps a wrapper of its own, since its blocks are objects rather than addresses.
//! They live with the comparison harness, never on the allocator's path.
//!
//! | name | what | module |
//! |---|---|---|
//! | `pytorch` | PyTorch's native `CUDACachingAllocator`, with a `PYTORCH_CUDA_ALLOC_CONF` | [`pytorch`] |
//! | `pytorch-expandable` | the same with `expandable_segments:True` | [`pytorch`] |
//! | `cuda-async` | CUDA's stream-ordered pool (`cudaMallocAsync`), release threshold 0 | [`pools`] |
//! | `cuda-async-retain` | the same, release threshold at its maximum | [`pools`] |
//! | `rmm-pool` | RAPIDS RMM's `pool_memory_resource` | [`pools`] |
//! | `iree-caching` | IREE's caching allocator (`--device_allocator=caching`) | [`pools`] |
//! | `gpu-alloc` | gpu-alloc 0.6 (wgpu's Vulkan allocator), `peers` feature | `gpu_alloc` |
//!
//! Each module says what it models exactly and what it approximates.

mod cuda_pool;
#[cfg(feature = "peers")]
#[allow(unsafe_code)]
mod gpu_alloc;
pub mod pools;
pub mod pytorch;

pub use cuda_pool::CudaPoolTarget;
#[cfg(feature = "peers")]
pub use gpu_alloc::{DriverBlock, GpuAllocPeer};
pub use pytorch::{PytorchConf, PytorchPeer};

use std::sync::Arc;

use parking_lot::Mutex;

use crate::trace::{ReplayTarget, TargetCounters};
use adaptalloc::device::{Device, DevicePtr};
use adaptalloc::hash::FastMap;
use adaptalloc::stats::Counter;
use adaptalloc::strategy::StreamId;

/// What a peer model counts of its own: driver traffic and the memory it holds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PeerCounts {
    pub driver_allocs: u64,
    pub driver_frees: u64,
    /// Requests served after a refused driver allocation, by releasing cached memory.
    pub recoveries: u64,
    pub reserved: Counter,
}

/// The rules of one peer allocator; [`PeerTarget`] drives it.
pub trait PeerModel: Send {
    /// A block of `bytes` on `stream`, or None (out of memory).
    fn alloc(&mut self, bytes: u64, stream: StreamId) -> Option<DevicePtr>;
    /// Frees a block `alloc` returned for `bytes`.
    fn free(&mut self, ptr: DevicePtr, bytes: u64);
    /// A synchronization point (stream or device synchronize).
    fn synchronize(&mut self) {}
    /// Gives back everything it holds; nothing is live.
    fn release_all(&mut self);
    fn counts(&self) -> PeerCounts;
    /// Restarts the reserved peak from the current value.
    fn reset_peak(&mut self);
}

struct Inner<M> {
    model: M,
    /// Live pointer -> requested bytes.
    live: FastMap<DevicePtr, u64>,
    live_bytes: Counter,
}

/// A [`PeerModel`] as a [`ReplayTarget`]: keeps the live table and the live bytes, and gives
/// everything back to the device when dropped.
pub struct PeerTarget<M: PeerModel> {
    inner: Mutex<Inner<M>>,
    dev: Arc<dyn Device>,
}

impl<M: PeerModel> PeerTarget<M> {
    /// `model` allocating from `dev`.
    pub fn new(dev: Arc<dyn Device>, model: M) -> Self {
        PeerTarget {
            inner: Mutex::new(Inner {
                model,
                live: FastMap::default(),
                live_bytes: Counter::default(),
            }),
            dev,
        }
    }
}

impl<M: PeerModel> ReplayTarget for PeerTarget<M> {
    fn allocate(&self, bytes: u64, stream: StreamId) -> Option<DevicePtr> {
        let mut g = self.inner.lock();
        let ptr = g.model.alloc(bytes, stream)?;
        g.live.insert(ptr, bytes);
        g.live_bytes.add(bytes);
        Some(ptr)
    }

    fn deallocate(&self, ptr: DevicePtr, _stream: StreamId) {
        let mut g = self.inner.lock();
        let Some(bytes) = g.live.remove(&ptr) else {
            tracing::error!(ptr, "peer: free of an unknown pointer");
            return;
        };
        g.live_bytes.sub(bytes);
        g.model.free(ptr, bytes);
    }

    fn synchronize(&self) {
        self.inner.lock().model.synchronize();
    }

    fn counters(&self) -> TargetCounters {
        let g = self.inner.lock();
        let c = g.model.counts();
        TargetCounters {
            driver_allocs: c.driver_allocs,
            driver_frees: c.driver_frees,
            oom_recoveries: c.recoveries,
            live_bytes: g.live_bytes.current,
            peak_live_bytes: g.live_bytes.peak,
            reserved_bytes: c.reserved.current,
            peak_reserved_bytes: c.reserved.peak,
            idle_bytes: c.reserved.current.saturating_sub(g.live_bytes.current),
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

impl<M: PeerModel> Drop for PeerTarget<M> {
    /// Frees what is still live, then everything the model holds, so the device ends empty.
    fn drop(&mut self) {
        let Inner { model, live, .. } = self.inner.get_mut();
        for (ptr, bytes) in live.drain() {
            model.free(ptr, bytes);
        }
        model.release_all();
    }
}
