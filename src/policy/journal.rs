//! What the engine did, for the tuning report: route changes, releases and the memory timeline
//! (each bounded), and the counts the report prints. Every entry is also a `tracing` event.

use serde::Serialize;

use super::constants::{MAX_LOG, MAX_TIMELINE};
use crate::strategy::StrategyKind;

/// A size class changing route, and why.
#[non_exhaustive]
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct RouteChange {
    /// The operation count at the change.
    pub op: u64,
    /// The size class, e.g. "1MiB..2MiB".
    pub class: String,
    /// The route before.
    pub from: StrategyKind,
    /// The route after.
    pub to: StrategyKind,
    /// Why, in words.
    pub reason: String,
}

/// A controller decision other than routing: memory released and why.
#[non_exhaustive]
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Decision {
    /// The operation count at the decision.
    pub op: u64,
    /// What was done, e.g. "release".
    pub action: String,
    /// The bytes it concerned.
    pub bytes: u64,
    /// Why, in words.
    pub reason: String,
}

/// What the engine knows of one size class, for the tuning report.
#[non_exhaustive]
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct ClassSummary {
    /// The class, e.g. "1MiB..2MiB".
    pub class: String,
    /// Its smallest request size.
    pub min_bytes: u64,
    /// Its largest request size.
    pub max_bytes: u64,
    /// Where its requests go at the end of the run.
    pub route: StrategyKind,
    /// Requests of the class.
    pub requests: u64,
    /// Bytes requested in all.
    pub bytes: u64,
    /// Frees of the class.
    pub frees: u64,
    /// The most bytes of the class live at once.
    pub peak_live_bytes: u64,
    /// Fraction of requests that found a freed block of the class waiting.
    pub reuse_ratio: f64,
    /// Distinct sizes seen (a value over 4 means "more than 4").
    pub distinct_sizes: u8,
    /// Median, 90th and 99th percentile lifetime, in operations, over recent frees.
    pub lifetime_ops_p50_p90_p99: Option<[f64; 3]>,
    /// The same for the distance, in operations, from a free to the request that reused it.
    pub reuse_distance_ops_p50_p90_p99: Option<[f64; 3]>,
}

/// One point of the memory timeline, taken at controller ticks.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, Serialize, PartialEq, Eq)]
pub struct TimelinePoint {
    /// The operation count.
    pub op: u64,
    /// Bytes live.
    pub live_bytes: u64,
    /// Bytes held from the device.
    pub reserved_bytes: u64,
    /// Bytes held and not live.
    pub idle_bytes: u64,
    /// The device's free memory at the last sample.
    pub device_free_bytes: u64,
}

/// The engine's record of one allocator's run.
#[derive(Debug)]
pub(crate) struct Journal {
    pub route_changes: Vec<RouteChange>,
    pub decisions: Vec<Decision>,
    pub timeline: Vec<TimelinePoint>,
    /// Operations between timeline points (doubles each time the timeline is thinned).
    timeline_every: u64,
    /// Times free memory fell under the low watermark.
    pub pressure_events: u64,
    /// The most memory the slabs stranded at a sample.
    pub peak_stranded: u64,
    /// Bytes the bounds gave back.
    pub released_by_bounds: u64,
    pub mem_info_samples: u64,
}

impl Journal {
    pub fn new(timeline_every: u64) -> Self {
        Journal {
            route_changes: Vec::new(),
            decisions: Vec::new(),
            timeline: Vec::new(),
            timeline_every,
            pressure_events: 0,
            peak_stranded: 0,
            released_by_bounds: 0,
            mem_info_samples: 0,
        }
    }

    pub fn route_change(&mut self, change: RouteChange) {
        tracing::info!(
            op = change.op,
            class = %change.class,
            from = %change.from,
            to = %change.to,
            reason = %change.reason,
            "route changed"
        );
        if self.route_changes.len() < MAX_LOG {
            self.route_changes.push(change);
        }
    }

    /// Counts and logs memory the bounds gave back (nothing when `released` is 0).
    pub fn release(&mut self, op: u64, released: u64, reason: impl FnOnce() -> String) {
        if released > 0 {
            self.released_by_bounds += released;
            self.decision(op, "release", released, reason());
        }
    }

    /// Slabs are backed by pages from now on (`Suballoc::back_by_pages`), and why. Logged past
    /// the cap on decisions: it happens at most once a run.
    pub fn backing_to_pages(&mut self, op: u64, reason: String) {
        self.log(op, "back slabs by pages", 0, reason, true);
    }

    fn decision(&mut self, op: u64, action: &str, bytes: u64, reason: String) {
        self.log(op, action, bytes, reason, false);
    }

    /// Traces a decision and keeps it for the report: within the cap on decisions, or past it
    /// where `past_cap`.
    fn log(&mut self, op: u64, action: &str, bytes: u64, reason: String, past_cap: bool) {
        tracing::info!(op, action, bytes, reason = %reason, "policy decision");
        if past_cap || self.decisions.len() < MAX_LOG {
            self.decisions.push(Decision {
                op,
                action: action.into(),
                bytes,
                reason,
            });
        }
    }

    /// Whether a timeline point is due at `op`.
    pub fn point_due(&self, op: u64) -> bool {
        op >= self.timeline.last().map(|p| p.op + self.timeline_every).unwrap_or(0)
    }

    /// Adds a point; past [`MAX_TIMELINE`] points, keeps every other one and doubles the interval.
    pub fn point(&mut self, p: TimelinePoint) {
        self.timeline.push(p);
        if self.timeline.len() >= MAX_TIMELINE {
            let kept: Vec<_> = self.timeline.iter().copied().step_by(2).collect();
            self.timeline = kept;
            self.timeline_every *= 2;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(op: u64) -> TimelinePoint {
        TimelinePoint {
            op,
            live_bytes: 0,
            reserved_bytes: 0,
            idle_bytes: 0,
            device_free_bytes: 0,
        }
    }

    #[test]
    fn timeline_thins_and_widens_when_full() {
        let mut j = Journal::new(10);
        let mut op = 0;
        while j.timeline.len() < MAX_TIMELINE - 1 {
            assert!(j.point_due(op));
            j.point(at(op));
            assert!(!j.point_due(op + 9));
            op += 10;
        }
        j.point(at(op));
        assert_eq!(j.timeline.len(), MAX_TIMELINE / 2);
        assert_eq!(j.timeline[1].op, 20, "every other point kept");
        let last = j.timeline.last().unwrap().op;
        assert!(
            !j.point_due(last + 19) && j.point_due(last + 20),
            "the interval doubled"
        );
    }

    #[test]
    fn releases_of_nothing_are_not_logged_and_logs_are_bounded() {
        let mut j = Journal::new(10);
        j.release(1, 0, || unreachable!("no reason is formatted for nothing released"));
        assert!(j.decisions.is_empty());
        for op in 0..MAX_LOG as u64 + 5 {
            j.release(op, 1, || "bound".into());
        }
        assert_eq!(j.decisions.len(), MAX_LOG);
        assert_eq!(j.released_by_bounds, MAX_LOG as u64 + 5, "counted even when not stored");
    }
}
