//! Every internal ratio and limit of the policy engine and the suballocator in one table, each
//! with its reason. None is a policy key: each was chosen on the capacity grids of the traces
//! and bundled workloads, and the comment says what the alternatives did. The rules that use
//! them are unit-tested by name (`assess.rs`, `classify.rs`).

/// Recent lifetimes and reuse distances kept per size class, for the report's percentiles.
pub const RING: usize = 128;

/// Size classes under 1 MiB (2^20): what the driver packs at 512 B instead of whole pages. Tight
/// mode sends these classes to exact-size caching (`routing.small_exact_when_tight`).
pub const SMALL_BUCKETS: usize = 20;

/// Distinct sizes tracked per class and window; more counts as "varied" (no exact-size cache).
pub const SIZES: usize = 4;

/// A device of fewer pages than this (16 MiB with 2 MiB pages) enters tight mode on free memory
/// alone: there one page stranded by frees is over 12% of the device. Waiting for the slabs to
/// strand failed small-churn (7 pages) at 7 of 301 capacities on a 0.05% grid up to 1.15x.
/// At 16 pages the same workload at 1.5x peak live repeated 10 times made 227,634 driver calls,
/// not 143,034; forecasting the spare at the peak instead left a failure at 1.0205x.
pub const TINY_DEVICE_PAGES: u64 = 8;

/// Tight mode is entered when the slabs strand more than the strand budget divided by this
/// (half of it): the other half is for what frees strand before the next sample, which the
/// guard cannot refuse. Entering at the whole budget made 7x fewer driver calls on
/// cpu-mobilenetv2-train repeated 10 times at 1.5x peak live (1,087 against 7,985, both under 1%
/// of passthrough's), but let small-churn fail at 14 capacities from 1.0x to 1.115x.
pub const TIGHT_ENTER_STRAND_DIVISOR: u64 = 2;

/// Tight mode is left once stranding is down to the budget divided by this (a quarter), and
/// `bounds.spare_share` keeps idle memory only under the same test. Leaving at half of it made
/// small-churn fail at 1.005x; keeping idle memory beyond it let kept slabs take more small
/// blocks and strand more (random churns on 15-31 MiB devices failed at more capacities).
pub const STRAND_CLEAR_DIVISOR: u64 = 4;

/// The workload's peak is known, with room (`assess::peak_known`), once its footprint has come
/// back to the peak (its cycle repeats, `recurrence.rs`) and the memory expected free at the
/// peak is at least the peak divided by this (a quarter): the device is then not tight, and
/// the strand guard may strand all of that memory. Without exact-size blocks for small
/// requests the robustness grid's churns failed up to 1.15x passthrough's minimum (memory free
/// at the peak under 15% of it) and at none of its capacities from 1.2x; a quarter keeps a
/// margin over both.
///
/// The peak must have come back exactly: trusted sooner, the random churns of
/// `robustness_sweep`, whose running peak keeps rising, failed more (at the minimum /
/// 1.01-1.02x / from 1.03x: 57 / 65 / 94 with the exact return): 57 / 66 / 158 once the peak
/// had held as long as the run took to reach it, 57 / 81 / 243 once the footprint had fallen
/// under half of it, 57 / 79 / 188 once it had also come back within an eighth of it. Also
/// measured on `small-churn` at 1.5x peak live instead (612 ms a pass before, 2.1 with tight
/// mode aside): staying tight until stranding drained, 795 ms; log-linear rounding of the
/// exact-size blocks, 453 (robustness grid 13 / 14 / 27 against 9 / 4 / 11);
/// `bounds.tight_below` at 30%, 25% or 20% of the device, 613, 480 or 399 (grid 10 / 7 / 14,
/// 11 / 7 / 21, 12 / 8 / 29).
pub const KNOWN_PEAK_SPARE_DIVISOR: u64 = 4;

/// Tight mode is also left when free memory (counting the cache's idle blocks, see
/// `assess::tight`) is over `bounds.tight_below` times this: a margin so that a device hovering
/// at the threshold does not flip routes at every sample.
pub const TIGHT_EXIT_FREE_FACTOR: f64 = 1.5;

/// The most the gap between periodic free-memory samples (cuMemGetInfo, 5-12 us) grows while
/// samples find nothing changed by others: 32 times `bounds.mem_info_interval_ops` (32,768
/// operations by default). At the base gap cpu-mobilenetv2-train (114,000 operations a step)
/// paid 111 samples a step, 0.89 ms at 2x and 4x peak live (1.5 ms at 1.5x, where periodic
/// samples also released idle memory the step asked for again), where PyTorch's allocator pays
/// nothing; at 32x it pays about 3. A co-tenant's change is still seen at the next sample, and
/// any driver allocation of ours samples at once. Robustness and co-tenant tables unchanged.
pub const MEM_INFO_BACKOFF: u64 = 32;

/// The workload has shown a cycle (a training step, a serving batch) once passthrough's
/// footprint falls under its peak divided by this after the first routing interval; its peak so
/// far is then taken as its peak, not grown by `bounds.peak_growth`.
pub const CYCLE_FALL_DIVISOR: u64 = 2;

/// Route changes and decisions kept for the report (older ones are counted, not stored).
pub const MAX_LOG: usize = 10_000;

/// Timeline points kept for the report; past it every other point is dropped and the interval
/// doubles.
pub const MAX_TIMELINE: usize = 4096;

/// Free-list nodes the suballocator scans for a fit in a list whose smallest entry may be too
/// small (TLSF's search rounds up a class; this last resort looks inside the exact class): a
/// bound on a cold path's cost, O(1) rather than O(free blocks).
pub const FIND_EXACT_STEPS: usize = 64;
