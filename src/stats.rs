//! Statistics: counters with current, peak and total values, kept under the allocator's lock.
//! Updating one is two adds and a compare, so stats cost nothing measurable on the hot path.

use serde::Serialize;

use crate::strategy::StrategyKind;

/// A quantity that rises and falls: its value now, the highest it reached, and the sum of all
/// increases (for blocks: how many were ever allocated; for bytes: how many were ever asked).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Counter {
    /// The value now.
    pub current: u64,
    /// The highest it has been (since the last peak reset).
    pub peak: u64,
    /// The sum of all increases.
    pub total: u64,
    /// The highest `peak` reached before the last peak reset (see [`Counter::whole_run_peak`]).
    pub run_peak: u64,
}

impl Counter {
    /// Adds `n`, raising the peak when passed.
    #[inline]
    pub fn add(&mut self, n: u64) {
        self.current += n;
        self.total += n;
        if self.current > self.peak {
            self.peak = self.current;
        }
    }

    /// Takes away `n` (never more than the value now).
    #[inline]
    pub fn sub(&mut self, n: u64) {
        debug_assert!(self.current >= n, "counter underflow: {} - {n}", self.current);
        self.current -= n;
    }

    /// Sets the value (for derived quantities such as idle bytes), updating the peak.
    #[inline]
    pub fn set(&mut self, v: u64) {
        if v > self.current {
            self.total += v - self.current;
        }
        self.current = v;
        if v > self.peak {
            self.peak = v;
        }
    }

    /// Restarts the peak from the current value; the whole run's peak is kept apart.
    pub fn reset_peak(&mut self) {
        self.run_peak = self.run_peak.max(self.peak);
        self.peak = self.current;
    }

    /// The highest it has been over the whole run, whatever peak resets came between (the
    /// tuning report's peaks: a user's `reset_peak_stats` between steps must not make the run
    /// look empty).
    pub fn whole_run_peak(&self) -> u64 {
        self.run_peak.max(self.peak)
    }
}

/// Per-strategy request outcomes: a hit is served without a driver call.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct StrategyStats {
    /// Requests served without a driver call.
    pub hits: u64,
    /// Requests that made driver calls.
    pub misses: u64,
}

/// A snapshot of the allocator's statistics.
#[non_exhaustive]
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Stats {
    /// Bytes the callers asked for and still hold.
    pub live_bytes: Counter,
    /// Allocations the callers hold.
    pub live_blocks: Counter,
    /// Bytes held from the device (driver allocations).
    pub reserved_bytes: Counter,
    /// Reserved bytes in no live block (cached blocks, free slab space): could be released.
    pub idle_bytes: Counter,
    /// Idle bytes that could be given back now (cached blocks, empty slabs); the rest of the
    /// idle bytes is free space inside slabs that hold live blocks.
    pub releasable_idle_bytes: u64,
    /// Reserved bytes inside live blocks beyond what was asked for: size-class rounding (at most
    /// 12.5% of a cached block) and 256-byte alignment. reserved = live + idle + rounding.
    pub rounding_bytes: u64,
    /// Physical allocations made by this allocator: cuMemAlloc calls, and every handle created
    /// for a mapping (cuMemCreate; a slab backed page by page creates one per 2 MiB page).
    pub driver_allocs: u64,
    /// Physical frees made by this allocator: cuMemFree calls, and every handle given back
    /// (cuMemRelease).
    pub driver_frees: u64,
    /// Mapping calls made by this allocator: maps of new handles (a run mapped at once is one),
    /// moves of idle handles to where they are needed, second mappings, and their unmaps. A
    /// move or a second mapping creates no handle, so it is counted here and not above.
    pub vmm_calls: u64,
    /// Out-of-memory errors on which idle memory was released and the request retried.
    pub oom_recoveries: u64,
    /// Requests that failed (typed errors returned to the caller): out of memory, driver errors,
    /// and requests refused outright (size 0, or more than the device holds).
    pub failed_allocs: u64,
    /// Requests routed to slabs that the strand guard gave exact-size blocks instead (a slab
    /// placement would have pinned memory the driver would not consume for them).
    pub strand_refusals: u64,
    /// Times memory freed on a stream became usable by every stream because the stream's work
    /// had completed (queried, never waited on), and waits on a stream's work before failing a
    /// request for want of memory held for it.
    pub stream_reclaims: u64,
    /// Waits on a stream's work before failing a request (see `stream_reclaims`).
    pub stream_waits: u64,
    /// Streams with memory freed on them that only they may use until their work is known done.
    pub streams_remembered: u64,
    /// Bytes that live blocks in slabs pin beyond what the driver would consume for them as
    /// separate allocations (memory no release can reach while they live).
    pub stranded_bytes: u64,
    /// Hits and misses of each strategy in use.
    pub per_strategy: Vec<(StrategyKind, StrategyStats)>,
}

impl Stats {
    /// Hits and misses of one strategy (zero when it is not in use).
    pub fn strategy(&self, kind: StrategyKind) -> StrategyStats {
        self.per_strategy
            .iter()
            .find(|(k, _)| *k == kind)
            .map(|(_, s)| *s)
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counter_tracks_peak_and_total() {
        let mut c = Counter::default();
        c.add(10);
        c.sub(4);
        c.add(2);
        assert_eq!(
            c,
            Counter {
                current: 8,
                peak: 10,
                total: 12,
                run_peak: 0
            }
        );
        c.reset_peak();
        assert_eq!((c.peak, c.whole_run_peak()), (8, 10));
        c.set(3);
        c.set(9);
        assert_eq!(
            c,
            Counter {
                current: 9,
                peak: 9,
                total: 18,
                run_peak: 10
            }
        );
        c.add(5);
        assert_eq!(c.whole_run_peak(), 14);
    }
}
