//! Policies and the engine that carries them out.
//!
//! - [`config`]: the schema (public keys only) and its validation; presets.
//! - `constants`: every internal ratio in one table, each with its reason.
//! - `assess`: pure: a sample of the device and the limits to a plan (pressure, tight mode,
//!   the idle bound, the strand budget, the slab limit, growth, segregation).
//! - `classify`: size-class statistics and the route each class wants, with hysteresis (pure).
//! - `controller`: the [`Engine`]: timing, samples, and applying plans; the only code that
//!   pushes settings into the strategies.
//! - `journal`: route changes, decisions and the timeline, for the tuning report.
//! - `recurrence`: whether the workload's footprint has come back to its peak (its cycle
//!   repeats).

mod assess;
mod classify;
pub mod config;
mod constants;
mod controller;
mod journal;
mod recurrence;

pub use classify::{BUCKETS, bucket_of, bucket_range, class_name};
pub use config::{
    BoundsPolicy, CachingPolicy, OomPolicy, PRESETS, Policy, RoutingMode, RoutingPolicy, Segregate, SizeOrFraction,
    SuballocPolicy,
};
pub(crate) use constants::FIND_EXACT_STEPS;
pub use constants::MEM_INFO_BACKOFF;
pub use controller::Engine;
pub use journal::{ClassSummary, Decision, RouteChange, TimelinePoint};
