//! The policy engine's controller: cheap per-class statistics on the hot path, and a tick every
//! `routing.interval_ops` operations (and a sample after each driver allocation) that measures,
//! asks [`assess`] and [`classify`](super::classify) what to do, and applies it. It is the only
//! code that pushes settings into the strategies.

use std::time::Instant;

use super::assess::{self, Limits, Plan, Prior, Sample, assess};
use super::classify::{self, BUCKETS, ClassStats, Window, bucket_range, class_name, distinct_text};
use super::constants::{CYCLE_FALL_DIVISOR, MEM_INFO_BACKOFF, SMALL_BUCKETS, STRAND_CLEAR_DIVISOR, TINY_DEVICE_PAGES};
use super::journal::{ClassSummary, Journal, RouteChange, TimelinePoint};
use super::recurrence::PeakRecurrence;
use super::{Policy, RoutingMode};
use crate::device::{Device, Granularity};
use crate::size::{ALIGNMENT, ByteSize, align_up};
use crate::stats::Counter;
use crate::strategy::{SlabBacking, Strategy, StrategyKind};

/// The policy engine of one allocator.
#[derive(Debug)]
pub struct Engine {
    policy: Policy,
    limits: Limits,
    kinds: Vec<StrategyKind>,
    classes: Vec<ClassStats>,
    /// The bound on idle memory the cache and the slabs apply on frees between samples.
    on_free_idle: u64,
    /// The plan's [`cache_bound`](assess::Plan::cache_bound) at the last sample (0 before the
    /// first: no class leaves the slabs for the cache before the engine has seen the device).
    cache_bound: u64,
    next_tick: u64,
    next_sample: u64,
    /// Operations from one periodic sample to the next: `bounds.mem_info_interval_ops`, doubled
    /// at each calm sample up to [`MEM_INFO_BACKOFF`] times it (see `next_gap`).
    sample_gap: u64,
    /// What the device held for others (total less free less ours) at the last sample.
    last_others: Option<u64>,
    last_free: u64,
    /// The free memory the last plan kept for others (`Plan::headroom`).
    headroom: u64,
    /// What the last sample decided and the next may change.
    prior: Prior,
    /// Whether the footprint has passed the peak the policy gives (`bounds.expected_peak`): a
    /// warning said so, once.
    peak_outgrown: bool,
    in_pressure: bool,
    /// Bytes given back under the headroom or the low watermark before a cycle was seen.
    headroom_released: u64,
    /// Until a sample past the first routing interval has seen a cycle: half the footprint's
    /// peak at the last sample (0 otherwise, and once used). A free that takes the footprint
    /// to a new low since that sample, under the mark, brings the next sample forward to the
    /// next operation: that sample would see a cycle (`assess` judges it on that low), so it
    /// is taken now. The cycle, and with it the bound that leaves others their share of the
    /// memory beyond the peak, then counts from the end of the first step, not from the next
    /// periodic sample up to a gap later (the gap doubles while calm): bundled `training` at
    /// 1.2x and 1.3x peak live kept its first step's 6.61 and 7.03 GiB 490 operations into
    /// the second, and a co-tenant of half the slack passthrough leaves was refused
    /// (`tuning/reports/tenants.md`: now none at any capacity). Taken at any fall under half
    /// the peak instead, not only at a new low since the last sample (a low reached before the
    /// first interval was then enough), `gpu-small-fwd-fp32` at 1.5x peak live (a 54 MB
    /// device) saw its cycle at a dip 126 operations earlier, gave back 6 MiB more there,
    /// missed in the slabs, moved its 2-4 MiB class to the cache and paid 13.5 ms a pass from
    /// then on against 0.
    fall_mark: u64,
    /// How the driver consumes memory, for `footprint`.
    model: Granularity,
    /// What the driver would consume for the live blocks as separate allocations, and its
    /// peak: passthrough's footprint of this workload so far.
    footprint: Counter,
    /// The lowest `footprint` since the last sample (`u64::MAX` before the first): a cycle's
    /// low point between two samples counts, wherever the samples fall in the cycle. A loop
    /// whose period divides the sampling gap was sampled at the same phase every time; at its
    /// peak, the cycle was never seen (a steady four-block loop kept the base sampling rate, 98
    /// cuMemGetInfo calls in 100,000 operations instead of 3).
    footprint_low: u64,
    /// The most the strategies held at a sample so far (the cycle's peak). Sampled on purpose,
    /// not the statistics' whole-run peak of reserved bytes: that one also sees what is held for
    /// a moment between samples (the out-of-memory ladder's transient growth), and keeping idle
    /// memory up to it changed the results at 1.1x passthrough's minimum (training: 798 to 802
    /// ms modelled, policy-eval).
    reserved_peak: u64,
    /// Whether `footprint` has come back to its peak (`Sample::peak_recurred`).
    recurrence: PeakRecurrence,
    pub(crate) journal: Journal,
    started: Instant,
}

impl Engine {
    /// An engine for `policy` on a device of `total` bytes whose driver consumes memory as
    /// `model` says, over the strategies `kinds` (in the allocator's order).
    pub fn new(policy: Policy, kinds: Vec<StrategyKind>, total: u64, model: Granularity) -> Self {
        let limits = Limits::new(&policy, total, total < TINY_DEVICE_PAGES * model.large_granule);
        Engine {
            on_free_idle: u64::MAX,
            cache_bound: 0,
            next_tick: policy.routing.interval_ops,
            next_sample: 0,
            sample_gap: policy.bounds.mem_info_interval_ops,
            last_others: None,
            last_free: total,
            headroom: limits.headroom,
            prior: Prior::default(),
            peak_outgrown: false,
            in_pressure: false,
            headroom_released: 0,
            fall_mark: 0,
            model,
            footprint: Counter::default(),
            footprint_low: u64::MAX,
            recurrence: PeakRecurrence::default(),
            reserved_peak: 0,
            journal: Journal::new(policy.routing.interval_ops),
            started: Instant::now(),
            classes: (0..BUCKETS).map(|_| ClassStats::new()).collect(),
            kinds,
            limits,
            policy,
        }
    }

    /// The policy it runs.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// Free device memory was under the low watermark at the last sample.
    pub fn in_pressure(&self) -> bool {
        self.in_pressure
    }

    /// Free device memory was under the headroom at the last sample: idle memory that appears
    /// (a cached block, an emptied slab) should go back at once.
    pub fn below_headroom(&self) -> bool {
        self.last_free < self.headroom
    }

    /// Tight mode (see `assess::tight`): small classes are cached so that the slabs strand no
    /// more pages.
    pub fn in_tight(&self) -> bool {
        self.prior.tight
    }

    /// Passthrough's footprint of the live blocks at its highest so far: the workload's peak as
    /// plain cudaMalloc would hold it (what `bounds.expected_peak` names).
    pub fn footprint_peak(&self) -> u64 {
        self.footprint.peak
    }

    /// The free memory the policy keeps for others, on this device.
    pub fn headroom_bytes(&self) -> u64 {
        self.limits.headroom
    }

    fn index_of(&self, kind: StrategyKind) -> usize {
        self.kinds.iter().position(|&k| k == kind).unwrap_or(0)
    }

    /// The starting route of every class.
    pub fn initial_routes(&self) -> [u8; BUCKETS] {
        let mut routes = [0u8; BUCKETS];
        if self.policy.routing.mode != RoutingMode::Adaptive {
            return routes;
        }
        for (b, r) in routes.iter_mut().enumerate() {
            let kind = if bucket_range(b).0 >= self.policy.routing.passthrough_min.0 {
                StrategyKind::Passthrough
            } else {
                StrategyKind::Suballoc
            };
            *r = self.index_of(kind) as u8;
        }
        routes
    }

    /// Records a request (hot path: a few adds, a compare and a short scan of 4 sizes).
    #[inline]
    pub fn on_alloc(&mut self, bucket: usize, bytes: u64, op: u64) {
        self.footprint.add(self.model.consumed(align_up(bytes, ALIGNMENT)));
        self.recurrence.on_alloc(self.footprint.current);
        self.classes[bucket].on_alloc(bytes, op);
    }

    /// A request of class `bucket` made driver calls (slow path only).
    #[inline]
    pub fn on_miss(&mut self, bucket: usize) {
        self.classes[bucket].w_misses += 1;
    }

    /// Records a free (hot path: a few adds; at a new low of the footprint since the last
    /// sample, a compare more).
    #[inline]
    pub fn on_free(&mut self, bucket: usize, bytes: u64, lifetime_ops: u64, op: u64) {
        self.footprint.sub(self.model.consumed(align_up(bytes, ALIGNMENT)));
        if self.footprint.current < self.footprint_low {
            self.footprint_low = self.footprint.current;
            if self.footprint.current < self.fall_mark {
                // The next sample would see the cycle: take it at the next operation.
                (self.next_sample, self.fall_mark) = (0, 0);
            }
        }
        self.classes[bucket].on_free(bytes, lifetime_ops, op);
    }

    /// True when the controller is due. Cost: one compare.
    #[inline]
    pub fn due(&self, op: u64) -> bool {
        op >= self.next_tick.min(self.next_sample)
    }

    /// The controller: samples free memory at a bounded rate and enforces the bounds, re-routes
    /// classes, ages out idle memory and records the timeline.
    #[cold]
    pub fn tick(
        &mut self,
        strategies: &mut [Strategy],
        dev: &dyn Device,
        routes: &mut [u8; BUCKETS],
        op: u64,
        live: u64,
    ) {
        if op >= self.next_sample {
            self.sample(strategies, dev, routes, op);
        }
        if op < self.next_tick {
            return;
        }
        self.next_tick = op + self.policy.routing.interval_ops;
        if self.policy.routing.mode == RoutingMode::Adaptive {
            let reserved = strategies.iter().map(Strategy::reserved_bytes).sum();
            self.reroute(routes, op, reserved);
        }
        let age = self.policy.bounds.idle_age_ops;
        if age > 0 && op > age {
            let released: u64 = strategies.iter_mut().map(|s| s.release_older_than(dev, op - age)).sum();
            self.journal.release(op, released, || {
                format!("idle memory not reused for {age} operations aged out")
            });
        }
        if self.journal.point_due(op) {
            self.journal.point(TimelinePoint {
                op,
                live_bytes: live,
                reserved_bytes: strategies.iter().map(Strategy::reserved_bytes).sum(),
                idle_bytes: strategies.iter().map(Strategy::idle_bytes).sum(),
                device_free_bytes: self.last_free,
            });
        }
    }

    /// Samples free memory now and enforces the bounds: after a driver allocation (free memory
    /// fell), or when idle memory appears while free memory is under the headroom.
    #[cold]
    pub fn resample(&mut self, strategies: &mut [Strategy], dev: &dyn Device, routes: &mut [u8; BUCKETS], op: u64) {
        self.sample(strategies, dev, routes, op);
    }

    /// One sample: measure, [`assess`], apply the plan.
    fn sample(&mut self, strategies: &mut [Strategy], dev: &dyn Device, routes: &mut [u8; BUCKETS], op: u64) {
        if self.next_sample == 0 && op > 0 {
            tracing::debug!(op, "sampling at the footprint's first fall under half its peak");
        }
        self.next_sample = op + self.policy.bounds.mem_info_interval_ops;
        let Ok(info) = dev.mem_info() else { return };
        self.journal.mem_info_samples += 1;
        self.last_free = info.free;
        let reserved: u64 = strategies.iter().map(Strategy::reserved_bytes).sum();
        self.reserved_peak = self.reserved_peak.max(reserved);
        let sample = Sample {
            op,
            free: info.free,
            reserved,
            reserved_peak: self.reserved_peak,
            idle: strategies.iter().map(Strategy::idle_bytes).sum(),
            stranded: strategies.iter().map(Strategy::stranded_bytes).sum(),
            cached_idle: strategies
                .iter()
                .filter(|s| matches!(s, Strategy::Caching(_)))
                .map(Strategy::idle_bytes)
                .sum(),
            footprint: self.footprint.current,
            footprint_low: self.footprint_low,
            footprint_peak: self.footprint.peak,
            peak_recurred: self
                .recurrence
                .at_sample(self.footprint.peak, self.footprint_low.min(self.footprint.current)),
        };
        self.footprint_low = self.footprint.current;
        self.journal.peak_stranded = self.journal.peak_stranded.max(sample.stranded);
        let plan = assess(&sample, &self.limits, self.prior);
        self.next_sample = op + self.next_gap(&sample, info.total, &plan);
        self.apply(&plan, &sample, strategies, dev, routes);
        self.set_fall_mark(op);
    }

    /// `fall_mark` after a sample at `op`: half the peak, until a cycle is seen, from the
    /// first routing interval on.
    fn set_fall_mark(&mut self, op: u64) {
        self.fall_mark = if self.prior.cycle_seen || op < self.limits.interval_ops {
            0
        } else {
            self.footprint.peak / CYCLE_FALL_DIVISOR
        };
    }

    /// Operations until the next periodic sample. Samples after our own driver allocations come
    /// anyway; the periodic one is there to see what others do to free memory. So the gap
    /// doubles (up to [`MEM_INFO_BACKOFF`] times `bounds.mem_info_interval_ops`) at each sample
    /// that is calm, and any other sample brings it back to the base gap. Calm: what others hold
    /// moved by less than a page since the last sample; the workload has shown its cycle; no
    /// tight mode or pressure; free memory is at least twice the headroom and the low
    /// watermark (only a driver allocation of ours, which samples at once, or another process
    /// can bring it under them); and free memory is over `tight_below`, or the slabs strand at
    /// most a quarter of the guard's budget (tight mode's exit test), or the peak is the one the
    /// policy gives and known (no tight mode then). Stranding can grow between samples, so tight
    /// mode may start a gap late; the guard still refuses every placement over its budget as it
    /// comes (robustness grid: 9 / 6 / 14 failing runs with and without). With a given peak,
    /// slabs backed `auto` strand most of the memory free beyond it by design: without the
    /// third test, `gpu-medium-ctx1024-train` at 1.5x peak live sampled 11 times a pass (0.09
    /// ms) where it learned its peak sampled once.
    fn next_gap(&mut self, s: &Sample, total: u64, plan: &Plan) -> u64 {
        let base = self.policy.bounds.mem_info_interval_ops;
        let others = total.saturating_sub(s.free).saturating_sub(s.reserved);
        let steady = self
            .last_others
            .is_some_and(|o| o.abs_diff(others) < self.model.large_granule);
        self.last_others = Some(others);
        let lim = &self.limits;
        let unstranded = plan
            .strand_budget
            .is_some_and(|b| s.stranded <= b / STRAND_CLEAR_DIVISOR);
        let untight = s.free >= lim.tight_below || unstranded || (plan.peak_given && plan.peak_known);
        let clear = s.free >= 2 * lim.headroom.max(lim.low_watermark) && untight;
        let calm = steady && clear && plan.cycle_seen && !plan.tight && !plan.pressure;
        self.sample_gap = if calm {
            self.sample_gap
                .saturating_mul(2)
                .min(base.saturating_mul(MEM_INFO_BACKOFF))
        } else {
            base
        };
        self.sample_gap
    }

    /// Carries out a plan: the idle bound on frees, the slabs' settings, tight mode's routes,
    /// and the release down to the plan's idle target (cached blocks first, cheap to re-create,
    /// then empty slabs).
    fn apply(
        &mut self,
        plan: &Plan,
        s: &Sample,
        strategies: &mut [Strategy],
        dev: &dyn Device,
        routes: &mut [u8; BUCKETS],
    ) {
        // Slabs go to pages from now on
        // ([`Suballoc::back_by_pages`](crate::strategy::Suballoc::back_by_pages), which keeps
        // it): under `suballoc.backing = "auto"`, decided once, when the first cycle is seen,
        // where it gave back more than the headroom's worth under the headroom (one handle a
        // slab strands more near the capacity than the headroom leaves, so each step gives back
        // what the next takes again) and the prices the device has shown say a page moved costs
        // less than one created (`DriverOps::recycling_pays`: pages then keep the steady state
        // by moving idle pages). Bundled `training` at 1.1x passthrough's minimum: 170 -> 0.02 ms
        // a pass in steady state (ten passes 1696 -> 1076 ms). Summed over steady_eval's 17
        // workloads at 1.1x, where PyTorch's allocator completes, 229 -> 59 ms a pass (pages
        // 21); worse where it is taken and does not pay: `gpu-medium-ctx1024-infer` 169 -> 220,
        // `gpu-medium-ctx128-infer` 53 -> 81, `serving` 213 -> 221 (these pay about as much with
        // pages). Under vmm-fast.toml, where a move costs more than a create, it is never taken
        // (training would go 34 -> 55). Taken at every cycle on the layout not leaving the
        // headroom free at the peak instead, it paid on `phase-change` (5 -> 76 ms a pass). The
        // robustness grid, the short given peaks (`scripts/short-peak.sh`) and co-tenants of
        // half the slack the same.
        let first_cycle = plan.cycle_seen && !self.prior.cycle_seen;
        let to_pages = first_cycle
            && self.limits.backing == SlabBacking::Auto
            && self.headroom_released > plan.headroom
            && dev.stats().ops.recycling_pays();
        if to_pages {
            self.journal.backing_to_pages(
                s.op,
                format!(
                    "the first cycle gave back {} under the headroom ({}), and a page moved costs less than one created",
                    ByteSize(self.headroom_released),
                    ByteSize(plan.headroom)
                ),
            );
        }
        if first_cycle {
            tracing::debug!(
                op = s.op,
                peak = s.footprint_peak,
                "workload cycle seen: its peak so far is taken as its peak"
            );
        }
        self.prior.cycle_seen = plan.cycle_seen;
        if !self.peak_outgrown && self.limits.expected_peak.is_some() && !plan.peak_given {
            self.peak_outgrown = true;
            tracing::warn!(
                op = s.op,
                footprint = s.footprint_peak,
                expected_peak = self.limits.expected_peak,
                "the workload outgrew bounds.expected_peak: its peak is learned from here; slabs backed \"auto\" \
                 may hold large handles taken for memory it now needs, which near the device's capacity can \
                 fail requests; give the peak this run's tuning report shows"
            );
        }
        self.cache_bound = plan.cache_bound;
        if plan.on_free_idle != self.on_free_idle {
            self.on_free_idle = plan.on_free_idle;
            for st in strategies.iter_mut() {
                match st {
                    Strategy::Caching(c) => c.set_max_idle_bytes(dev, Some(plan.on_free_idle)),
                    Strategy::Suballoc(sub) => sub.set_max_empty_bytes(dev, plan.on_free_idle),
                    Strategy::Passthrough(_) => {}
                }
            }
        }
        if plan.pressure && !self.in_pressure {
            self.journal.pressure_events += 1;
            tracing::info!(
                op = s.op,
                free = s.free,
                watermark = self.limits.low_watermark,
                "memory pressure: free device memory under the low watermark"
            );
        }
        self.in_pressure = plan.pressure;
        self.headroom = plan.headroom;
        if plan.tight != self.prior.tight {
            self.prior.tight = plan.tight;
            self.route_small_for_tightness(routes, s.op, s.free, plan.peak_known);
        }
        for st in strategies.iter_mut() {
            if let Strategy::Suballoc(sub) = st {
                sub.set_strand_budget(plan.strand_budget);
                sub.set_strand_floor(plan.strand_floor);
                sub.set_slab_limit(plan.slab_limit, plan.device_room);
                sub.set_segregate(plan.segregate);
                sub.set_growth(plan.growth);
                sub.set_peak_known(plan.peak_known);
                sub.set_split_for_others(plan.reason == assess::OVER_SHARE);
                if to_pages {
                    sub.back_by_pages(dev);
                }
            }
        }
        if s.idle <= plan.idle_target {
            return;
        }
        let mut need = s.idle - plan.idle_target;
        let can_release: u64 = strategies.iter().map(|st| st.releasable(plan.unmap_pages)).sum();
        let keep_cache = assess::keep_cache(s.free, &self.limits, plan.pressure, can_release, need);
        let mut released = 0;
        for kind in [StrategyKind::Caching, StrategyKind::Suballoc] {
            if keep_cache && kind == StrategyKind::Caching {
                continue;
            }
            for st in strategies.iter_mut().filter(|st| st.kind() == kind) {
                let own = st.idle_bytes();
                let r = st.release_down_to(dev, own - need.min(own), plan.unmap_pages);
                released += r;
                need = need.saturating_sub(r);
            }
        }
        if !self.prior.cycle_seen && (plan.reason == assess::UNDER_HEADROOM || plan.reason == assess::UNDER_WATERMARK) {
            self.headroom_released += released;
        }
        let (headroom, reason, free) = (plan.headroom, plan.reason, s.free);
        self.journal.release(s.op, released, || {
            format!("{reason} (free {free} of headroom {headroom})")
        });
    }

    /// While the device is tight, requests under 1 MiB get exact-size cached blocks (a slab page
    /// that holds one small live block pins a whole 2 MiB page; the driver packs small blocks at
    /// 512 B); when it has room again, or the workload's peak is known (`assess::peak_known`),
    /// they go back to slabs, and the route change says which.
    fn route_small_for_tightness(&mut self, routes: &mut [u8; BUCKETS], op: u64, free: u64, peak_known: bool) {
        if self.policy.routing.mode != RoutingMode::Adaptive || !self.policy.routing.small_exact_when_tight {
            return;
        }
        let tight = self.prior.tight;
        let (from, to) = if tight {
            (StrategyKind::Suballoc, StrategyKind::Caching)
        } else {
            (StrategyKind::Caching, StrategyKind::Suballoc)
        };
        let to_idx = self.index_of(to) as u8;
        for r in routes.iter_mut().take(SMALL_BUCKETS) {
            *r = to_idx;
        }
        let reason = if tight {
            format!(
                "device tight ({} free): small requests get exact-size blocks",
                ByteSize(free)
            )
        } else if peak_known {
            format!(
                "the workload's peak came back with room at it ({} free): small requests back to slabs",
                ByteSize(free)
            )
        } else {
            format!(
                "device has room again ({} free): small requests back to slabs",
                ByteSize(free)
            )
        };
        self.journal.route_change(RouteChange {
            op,
            class: "all under 1MiB".into(),
            from,
            to,
            reason,
        });
    }

    /// Re-routes every class with enough requests in its window ([`classify::want`], with
    /// hysteresis), and starts its next window.
    fn reroute(&mut self, routes: &mut [u8; BUCKETS], op: u64, reserved: u64) {
        let r = &self.policy.routing;
        let tight_small = self.prior.tight && r.small_exact_when_tight;
        for (b, route) in routes.iter_mut().enumerate() {
            let c = &mut self.classes[b];
            if c.w_requests < r.min_samples || (tight_small && b < SMALL_BUCKETS) {
                // Too few requests to judge (or tight mode holds the class); the window grows.
                continue;
            }
            let in_slabs = self.kinds[*route as usize] == StrategyKind::Suballoc;
            let w = Window::of(c, bucket_range(b).0, in_slabs, reserved, self.cache_bound);
            let want = classify::want(&w, r);
            c.new_window();
            let want_idx = self.kinds.iter().position(|&k| k == want).unwrap_or(0);
            let (pending, moves) = classify::settle(c.pending, want_idx, *route as usize, r.hysteresis);
            c.pending = pending;
            if !moves {
                continue;
            }
            let from = self.kinds[*route as usize];
            *route = want_idx as u8;
            // Formatted only when the route changes (formatting every class at every tick cost
            // more than the allocations in between).
            let reason = match want {
                StrategyKind::Passthrough => {
                    format!("sizes at least {} go to the driver", ByteSize(r.passthrough_min.0))
                }
                StrategyKind::Caching => format!(
                    "{} distinct size(s), {:.0}% of requests find a freed block, at most {} live: exact-size caching",
                    w.distinct,
                    w.reuse * 100.0,
                    w.peak_blocks
                ),
                StrategyKind::Suballoc => format!(
                    "{} distinct sizes, {:.0}% reuse: suballocation packs varied sizes",
                    distinct_text(w.distinct),
                    w.reuse * 100.0
                ),
            };
            self.journal.route_change(RouteChange {
                op,
                class: class_name(b),
                from,
                to: want,
                reason,
            });
        }
    }

    /// Per-class summaries (classes that saw requests), with their current routes.
    pub fn summaries(&self, routes: &[u8; BUCKETS]) -> Vec<ClassSummary> {
        self.classes
            .iter()
            .enumerate()
            .filter(|(_, c)| c.requests > 0)
            .map(|(b, c)| {
                let (lo, hi) = bucket_range(b);
                ClassSummary {
                    class: class_name(b),
                    min_bytes: lo,
                    max_bytes: hi,
                    route: self.kinds[routes[b] as usize],
                    requests: c.requests,
                    bytes: c.bytes,
                    frees: c.frees,
                    peak_live_bytes: c.live.peak,
                    reuse_ratio: c.reuse_hits as f64 / c.requests as f64,
                    distinct_sizes: c.all_distinct,
                    lifetime_ops_p50_p90_p99: c.lifetimes.quantiles(),
                    reuse_distance_ops_p50_p90_p99: c.reuse_distances.quantiles(),
                }
            })
            .collect()
    }

    /// Seconds since the engine started (for allocation rates).
    pub fn elapsed_secs(&self) -> f64 {
        self.started.elapsed().as_secs_f64()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::bucket_of;

    /// A step of `n` blocks of 32 MiB, allocated from operation `op` on; returns the next op.
    fn grow(e: &mut Engine, n: u64, op: u64) -> u64 {
        for i in 0..n {
            e.on_alloc(bucket_of(32 << 20), 32 << 20, op + i);
        }
        op + n
    }

    /// Frees `n` of them; returns the next op.
    fn shrink(e: &mut Engine, n: u64, op: u64) -> u64 {
        for i in 0..n {
            e.on_free(bucket_of(32 << 20), 32 << 20, 1, op + i);
        }
        op + n
    }

    /// A free that takes the footprint to a new low since the last sample, under half the peak
    /// that sample saw, makes the controller due at once, where that sample came after the
    /// first routing interval and saw no cycle; a fall to half the peak or more, a second fall
    /// before the next sample, and any fall once a sample has seen the cycle, or before the
    /// first interval, do not (the periodic sample stays where it was).
    #[test]
    fn the_first_fall_under_half_the_peak_samples_at_once() {
        let engine = || {
            let policy = Policy::default();
            let mut e = Engine::new(policy, vec![StrategyKind::Suballoc], 8 << 30, Granularity::default());
            (e.next_tick, e.next_sample) = (u64::MAX, u64::MAX);
            e
        };
        // What a sample at `op` leaves: the low reset, the mark set from the peak.
        let sampled = |e: &mut Engine, op: u64| {
            e.footprint_low = e.footprint.current;
            e.set_fall_mark(op);
        };
        let interval = Policy::default().routing.interval_ops;
        // A sample before the first interval: no mark.
        let mut e = engine();
        let op = grow(&mut e, 16, 0);
        sampled(&mut e, op);
        let op = shrink(&mut e, 16, op);
        assert!(!e.due(op), "a fall before the first routing interval");
        // Past it: down to half the peak (16 blocks), then under it.
        let mut e = engine();
        let op = grow(&mut e, 16, interval);
        sampled(&mut e, op);
        let op = shrink(&mut e, 8, op);
        assert!(!e.due(op), "a fall to half the peak");
        let op = shrink(&mut e, 1, op);
        assert!(e.due(op), "the first fall under half the peak");
        // Once: a further fall before the sample it brought forward changes nothing.
        e.next_sample = u64::MAX;
        let op = shrink(&mut e, 7, op);
        assert!(!e.due(op), "a second fall");
        // A cycle a sample saw already: no mark.
        let mut e = engine();
        e.prior.cycle_seen = true;
        let op = grow(&mut e, 16, interval);
        sampled(&mut e, op);
        let op = shrink(&mut e, 16, op);
        assert!(!e.due(op), "a fall after the cycle was seen");
    }
}
