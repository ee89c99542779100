//! # adaptalloc
//!
//! A GPU memory allocator with a policy engine: caching speed with zero configuration, and no
//! failure where plain `cudaMalloc` would have succeeded.
//!
//! - [`Allocator`]: the public, thread-safe entry point with RAII [`Allocation`]s.
//!   [`Allocator::adaptive`] is the zero-configuration default; [`Allocator::with_policy`] and
//!   [`Allocator::from_env`] take a [`policy::Policy`]; [`Allocator::report`] gives the
//!   [`report::TuningReport`] with a recommended policy.
//! - [`policy`]: the policy schema, presets, and the engine that routes size classes and bounds
//!   idle memory by the device's free memory.
//! - [`profile`]: a workload's peak kept from one run for the next (`ADAPTALLOC_PROFILE`), so
//!   that later runs start as fast as a tuned policy.
//! - [`device`]: where memory comes from: [`SimDevice`] (a simulated GPU with a cost model,
//!   virtual memory, co-tenants and faults) or [`CudaDevice`] (the CUDA driver via cudarc).
//! - [`strategy`]: passthrough, caching and block suballocation (TLSF, page-backed slabs).
//! - [`cudarc_ext`]: cudarc `CudaSlice`s on adaptalloc memory.
//!
//! The rest of the project lives in crates of its own, so that a crate that only allocates
//! compiles none of it: `adaptalloc-cli` (the `adaptalloc` command line, traces, replay,
//! synthetic workloads, models of PyTorch's, CUDA's, RMM's and IREE's allocators, the compare
//! and tune harnesses) and `adaptalloc-capi` (the C ABI as `libadaptalloc.so`, for PyTorch's
//! pluggable allocator and C/C++).
//!
//! ```
//! use std::sync::Arc;
//! use adaptalloc::{Allocator, SimDevice, StrategyKind, size::GIB};
//!
//! let device = Arc::new(SimDevice::new(16 * GIB));
//! let alloc = Allocator::with_strategy(device.clone(), StrategyKind::Caching);
//! let a = alloc.allocate(1 << 20, 0)?; // 1 MiB on stream 0
//! assert_eq!(a.ptr() % 256, 0);
//! drop(a); // cached, not freed
//! let b = alloc.allocate(1 << 20, 0)?; // a cache hit: no driver call
//! assert_eq!(alloc.stats().driver_allocs, 1);
//! # drop(b);
//! # Ok::<(), adaptalloc::AllocError>(())
//! ```
#![forbid(unsafe_op_in_unsafe_fn)]
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod allocator;
pub mod config;
// cudarc's CudaSlice over adaptalloc memory: upgrade_device_ptr is an unsafe FFI-level call.
#[allow(unsafe_code)]
pub mod cudarc_ext;
pub mod device;
pub mod error;
pub mod hash;
pub mod policy;
pub mod profile;
pub(crate) mod ptrtable;
pub mod report;
pub mod rng;
pub mod size;
pub mod stats;
pub mod strategy;

pub use allocator::{Allocation, Allocator, AllocatorConfig, PoolId, StrategyConfig, StreamFilter};
pub use device::{CudaDevice, Device, DevicePtr, SimDevice};
pub use error::{AllocError, ConfigError, DeviceError};
pub use stats::{Counter, Stats};
pub use strategy::{StrategyKind, StreamId};

/// The README's Rust examples, compiled and run as doc tests.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
