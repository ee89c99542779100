//! # adaptalloc-cli
//!
//! The `adaptalloc` command line and the lab behind it, apart from the core library so that a
//! crate that only allocates compiles none of this:
//!
//! - [`trace`]: allocation traces (CSV, RMM logs, PyTorch snapshots) and [`trace::replay`];
//! - [`synth`]: deterministic synthetic workloads (`tuning/workloads/`);
//! - [`peers`]: models of the allocators people run (PyTorch's native and expandable segments,
//!   CUDA's stream-ordered pool, RMM's pool, IREE's caching allocator), validated against what
//!   PyTorch's allocator did on a GPU;
//! - [`compare`] and [`tune`]: the harnesses behind `adaptalloc compare`, `sweep` and `tune`.
//!
//! ```
//! use adaptalloc_cli::compare::{self, CompareOptions};
//! use adaptalloc_cli::synth::WorkloadSpec;
//!
//! let spec = WorkloadSpec::bundled("small-churn").unwrap();
//! let trace = spec.generate(spec.seed);
//! let comparison = compare::compare(&[trace], &CompareOptions::default());
//! let adaptive = comparison.traces[0].results.iter().find(|r| r.strategy == "adaptive").unwrap();
//! assert_eq!(adaptive.failed_allocs, 0);
//! ```
#![forbid(unsafe_op_in_unsafe_fn)]
#![deny(unsafe_code)]

pub mod advice;
pub mod compare;
pub mod error;
pub mod estimate;
pub mod peers;
pub mod synth;
pub mod trace;
pub mod tune;

pub use error::TraceError;
