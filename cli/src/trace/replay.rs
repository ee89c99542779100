//! Replay: drives an allocator through a trace and measures what it did.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;

use super::{Op, Trace};
use adaptalloc::allocator::Allocator;
use adaptalloc::device::{Device, DevicePtr, DriverOps};
use adaptalloc::strategy::StreamId;

/// An allocator that a replay can drive: adaptalloc's [`Allocator`], or a peer allocator over
/// the same device (the `peers` feature), so that both are measured the same way.
pub trait ReplayTarget {
    /// Allocates `bytes` on `stream`; `None` when the allocation failed.
    fn allocate(&self, bytes: u64, stream: StreamId) -> Option<DevicePtr>;
    /// Frees a pointer that [`allocate`](ReplayTarget::allocate) returned.
    fn deallocate(&self, ptr: DevicePtr, stream: StreamId);
    /// The counters now.
    fn counters(&self) -> TargetCounters;
    /// Restarts the peaks from the current values.
    fn reset_peaks(&self);
    /// The device it allocates from.
    fn device(&self) -> &Arc<dyn Device>;
    /// A synchronization point (the end of a pass, or every `sync_every` events): a
    /// stream-ordered pool gives back what it holds beyond its release threshold.
    fn synchronize(&self) {}
}

/// What every replay target reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TargetCounters {
    /// Physical allocations and frees so far (adaptalloc's: each cuMemAlloc and handle
    /// created, each cuMemFree and handle given back).
    pub driver_allocs: u64,
    pub driver_frees: u64,
    pub oom_recoveries: u64,
    pub live_bytes: u64,
    pub peak_live_bytes: u64,
    pub reserved_bytes: u64,
    pub peak_reserved_bytes: u64,
    pub idle_bytes: u64,
}

impl ReplayTarget for Allocator {
    fn allocate(&self, bytes: u64, stream: StreamId) -> Option<DevicePtr> {
        self.allocate_raw(bytes, stream).ok()
    }

    fn deallocate(&self, ptr: DevicePtr, stream: StreamId) {
        if let Err(e) = Allocator::deallocate(self, ptr, stream) {
            // A replay frees only what it allocated, on the stream it allocated on.
            tracing::error!(ptr, stream, error = %e, "replay free refused");
        }
    }

    fn counters(&self) -> TargetCounters {
        let s = self.stats();
        TargetCounters {
            driver_allocs: s.driver_allocs,
            driver_frees: s.driver_frees,
            oom_recoveries: s.oom_recoveries,
            live_bytes: s.live_bytes.current,
            peak_live_bytes: s.live_bytes.peak,
            reserved_bytes: s.reserved_bytes.current,
            peak_reserved_bytes: s.reserved_bytes.peak,
            idle_bytes: s.idle_bytes.current,
        }
    }

    fn reset_peaks(&self) {
        Allocator::reset_peaks(self)
    }

    fn device(&self) -> &Arc<dyn Device> {
        Allocator::device(self)
    }
}

/// What a replay measured.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ReplayMetrics {
    /// Events replayed (all passes).
    pub events: u64,
    /// Allocations the allocator refused (their frees are skipped).
    pub failed_allocs: u64,
    /// Physical allocations during the replay (cuMemAlloc and cuMemCreate, one per handle)
    /// and physical frees (cuMemFree and cuMemRelease), from the device's count by kind.
    pub driver_allocs: u64,
    pub driver_frees: u64,
    /// Every driver call charged, of every kind (the sum of `driver_ops`).
    pub driver_calls: u64,
    /// Time in the driver: modelled on SimDevice, measured on a GPU.
    pub modeled_driver_ns: u64,
    /// The same by kind of driver operation.
    pub driver_ops: DriverOps,
    pub peak_live_bytes: u64,
    pub peak_reserved_bytes: u64,
    /// Out-of-memory errors recovered by releasing idle memory.
    pub oom_recoveries: u64,
    /// Wall-clock time of the replay on this machine (allocator overhead, not the GPU's).
    pub wall_ns: u64,
    /// Modelled driver time split by pass (with `repeat` of 2 or more).
    pub passes: PassTimes,
}

/// Modelled driver time by pass: the first pass, the steady state (the mean over the later
/// half of the passes: passes 6-10 of 10), and the warm-up (the passes before that half, less
/// the steady state of all but the first: the first pass plus the one-off costs of the next
/// ones). Zero with one pass, where there is no steady state to tell apart.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct PassTimes {
    pub first_pass_ns: u64,
    pub steady_pass_ns: u64,
    pub warmup_ns: u64,
}

impl PassTimes {
    /// From the modelled time of each pass, in order.
    pub fn of(pass_ns: &[u64]) -> Self {
        let n = pass_ns.len();
        if n < 2 {
            return PassTimes::default();
        }
        let later = n / 2;
        let steady = pass_ns[n - later..].iter().sum::<u64>() / later as u64;
        let early = &pass_ns[..n - later];
        let warmup = early
            .iter()
            .sum::<u64>()
            .saturating_sub(steady * (early.len() as u64 - 1));
        PassTimes {
            first_pass_ns: pass_ns[0],
            steady_pass_ns: steady,
            warmup_ns: warmup,
        }
    }
}

impl ReplayMetrics {
    /// True when every allocation succeeded.
    pub fn completed(&self) -> bool {
        self.failed_allocs == 0
    }
}

/// How to replay.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplayOptions {
    /// Replays the trace this many times back to back (blocks still live at the end of a pass
    /// are freed between passes), to model several training steps.
    pub repeat: u32,
    /// Synchronizes every this many events (besides the end of each pass); None: never.
    pub sync_every: Option<u64>,
}

impl Default for ReplayOptions {
    fn default() -> Self {
        ReplayOptions {
            repeat: 1,
            sync_every: None,
        }
    }
}

/// Replays `trace` once through `alloc`.
pub fn replay<T: ReplayTarget + ?Sized>(trace: &Trace, alloc: &T) -> ReplayMetrics {
    replay_with(trace, alloc, ReplayOptions::default(), |_| {})
}

/// Replays `trace` through `alloc`; `before_event(i)` runs before global event `i` (counting
/// across passes), for co-tenants that act at scripted points. Blocks still live at the end of
/// each pass are freed by the replay.
pub fn replay_with<T: ReplayTarget + ?Sized>(
    trace: &Trace,
    alloc: &T,
    opts: ReplayOptions,
    mut before_event: impl FnMut(u64),
) -> ReplayMetrics {
    let before = alloc.counters();
    let device_before = alloc.device().stats();
    alloc.reset_peaks();
    let start = Instant::now();
    // id -> (pointer, stream, allocation sequence number).
    let mut live: HashMap<u64, (DevicePtr, u64, u64)> = HashMap::with_capacity(1024);
    let mut m = ReplayMetrics::default();
    let mut pass_ns = Vec::with_capacity(opts.repeat.max(1) as usize);
    let mut pass_start = device_before.driver_ns;
    for _ in 0..opts.repeat.max(1) {
        for e in &trace.events {
            before_event(m.events);
            m.events += 1;
            if opts.sync_every.is_some_and(|n| n > 0 && m.events % n == 0) {
                alloc.synchronize();
            }
            match e.op {
                Op::Alloc => match alloc.allocate(e.size, e.stream) {
                    Some(ptr) => {
                        live.insert(e.id, (ptr, e.stream, m.events));
                    }
                    None => m.failed_allocs += 1,
                },
                Op::Free => {
                    // Absent when the alloc failed: nothing to free.
                    if let Some((ptr, stream, _)) = live.remove(&e.id) {
                        alloc.deallocate(ptr, stream);
                    }
                }
            }
        }
        // Newest first, like a program unwinding; a fixed order keeps replays deterministic
        // (the map's own order varies from run to run and changes how slabs empty).
        let mut rest: Vec<(DevicePtr, u64, u64)> = live.drain().map(|(_, v)| v).collect();
        rest.sort_unstable_by_key(|&(_, _, seq)| std::cmp::Reverse(seq));
        for (ptr, stream, _) in rest {
            alloc.deallocate(ptr, stream);
        }
        alloc.synchronize();
        let now = alloc.device().stats().driver_ns;
        pass_ns.push(now - pass_start);
        pass_start = now;
    }
    m.passes = PassTimes::of(&pass_ns);
    m.wall_ns = start.elapsed().as_nanos() as u64;
    let after = alloc.counters();
    m.oom_recoveries = after.oom_recoveries - before.oom_recoveries;
    let device_after = alloc.device().stats();
    m.modeled_driver_ns = device_after.driver_ns - device_before.driver_ns;
    m.driver_ops = device_after.ops.since(&device_before.ops);
    m.driver_allocs = m.driver_ops.physical_allocs();
    m.driver_frees = m.driver_ops.physical_frees();
    m.driver_calls = m.driver_ops.calls();
    m.peak_live_bytes = after.peak_live_bytes;
    m.peak_reserved_bytes = after.peak_reserved_bytes;
    m
}
