//! The allocators users run today, modelled over adaptalloc's [`Device`](crate::Device) so
//! that `compare`, `sweep`, `replay` and the benches measure them beside ours on the same
//! traces, capacities and cost model. Each is a [`ReplayTarget`](crate::trace::ReplayTarget).
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

#[cfg(feature = "peers")]
#[allow(unsafe_code)]
mod gpu_alloc;
pub mod pools;
pub mod pytorch;

#[cfg(feature = "peers")]
pub use gpu_alloc::{DriverBlock, GpuAllocPeer};
pub use pytorch::{PytorchConf, PytorchPeer};
