//! The policy engine: cheap per-class statistics on the hot path, and a controller that runs
//! every `routing.interval_ops` operations (and after each driver allocation) to re-route size
//! classes, bound idle memory by the device's free memory, and age out unused idle memory.

use std::time::Instant;

use serde::Serialize;

use super::{Policy, RoutingMode};
use crate::device::{Device, Granularity};
use crate::size::{ALIGNMENT, align_up};
use crate::stats::Counter;
use crate::strategy::{Strategy, StrategyKind};

/// Size classes for routing: one per power of two (class `b` holds sizes 2^b .. 2^(b+1)-1).
pub const BUCKETS: usize = 64;

/// The routing class of a request. Cost: one instruction.
#[inline]
pub fn bucket_of(bytes: u64) -> usize {
    (63 - bytes.max(1).leading_zeros()) as usize
}

/// The smallest and largest size of class `b`.
pub fn bucket_range(b: usize) -> (u64, u64) {
    let lo = 1u64 << b;
    (lo, if b >= 63 { u64::MAX } else { (lo << 1) - 1 })
}

const RING: usize = 128;
/// Classes under 1 MiB (2^20): what the driver packs at 512 B instead of whole pages.
const SMALL_BUCKETS: usize = 20;
/// Distinct sizes tracked per window; more counts as "varied".
const SIZES: usize = 4;
/// A device of fewer pages than this (16 MiB with 2 MiB pages) enters tight mode on free memory
/// alone: there one page stranded by frees is over 12% of the device. Waiting for the slabs to
/// strand failed small-churn (7 pages) at 7 of 301 capacities on a 0.05% grid up to 1.15x.
/// At 16 pages the same workload at 1.5x peak live repeated 10 times made 227,634 driver calls,
/// not 143,034; forecasting the spare at the peak instead left a failure at 1.0205x.
const TINY_DEVICE_PAGES: u64 = 8;

/// The last [`RING`] values of a quantity, for quantiles.
#[derive(Clone, Debug)]
struct Ring {
    values: Vec<u64>,
    pos: usize,
}

impl Ring {
    fn new() -> Self {
        Ring {
            values: Vec::new(),
            pos: 0,
        }
    }
    #[inline]
    fn push(&mut self, v: u64) {
        if self.values.len() < RING {
            self.values.push(v);
        } else {
            self.values[self.pos] = v;
            self.pos = (self.pos + 1) % RING;
        }
    }
    /// The 50th, 90th and 99th percentiles (slow path: a sort of at most [`RING`] values).
    fn quantiles(&self) -> Option<[f64; 3]> {
        if self.values.is_empty() {
            return None;
        }
        let mut sorted = self.values.clone();
        sorted.sort_unstable();
        Some([quantile(&sorted, 0.5), quantile(&sorted, 0.9), quantile(&sorted, 0.99)])
    }
}

/// The `tau` quantile of non-empty `sorted` values by the median-unbiased estimator (Hyndman and
/// Fan's type 8, R's `quantile(type = 8)`): position h = (n + 1/3) tau + 1/3 (1-based), linear
/// between the values on either side, clamped to the smallest and largest.
fn quantile(sorted: &[u64], tau: f64) -> f64 {
    let n = sorted.len();
    let h = (n as f64 + 1.0 / 3.0) * tau + 1.0 / 3.0;
    let hf = h as usize;
    if hf == 0 {
        return sorted[0] as f64;
    }
    if hf >= n {
        return sorted[n - 1] as f64;
    }
    let (a, b) = (sorted[hf - 1] as f64, sorted[hf] as f64);
    a + (h - hf as f64) * (b - a)
}

#[derive(Clone, Debug)]
struct ClassStats {
    requests: u64,
    bytes: u64,
    frees: u64,
    live: Counter,
    live_blocks: u64,
    /// Most blocks of the class live at once in the window.
    w_peak_blocks: u64,
    reuse_hits: u64,
    /// Freed blocks of this class not yet followed by a request of the class.
    waiting: u64,
    last_free_op: u64,
    lifetimes: Ring,
    reuse_distances: Ring,
    w_requests: u64,
    w_reuse_hits: u64,
    /// Requests of the class in the window that made driver calls.
    w_misses: u64,
    w_sizes: [u64; SIZES],
    /// Distinct sizes in the window, SIZES + 1 meaning "more than SIZES".
    w_distinct: u8,
    all_distinct: u8,
    all_sizes: [u64; SIZES],
    pending: Option<(usize, u32)>,
}

impl ClassStats {
    fn new() -> Self {
        ClassStats {
            requests: 0,
            bytes: 0,
            frees: 0,
            live: Counter::default(),
            live_blocks: 0,
            w_peak_blocks: 0,
            reuse_hits: 0,
            waiting: 0,
            last_free_op: 0,
            lifetimes: Ring::new(),
            reuse_distances: Ring::new(),
            w_requests: 0,
            w_reuse_hits: 0,
            w_misses: 0,
            w_sizes: [0; SIZES],
            w_distinct: 0,
            all_distinct: 0,
            all_sizes: [0; SIZES],
            pending: None,
        }
    }
}

#[inline]
fn note_size(sizes: &mut [u64; SIZES], distinct: &mut u8, size: u64) {
    if *distinct as usize > SIZES {
        return; // saturated: "more than SIZES" already, no need to scan
    }
    let n = *distinct as usize;
    if sizes[..n].contains(&size) {
        return;
    }
    if n < SIZES {
        sizes[n] = size;
        *distinct += 1;
    } else {
        *distinct = SIZES as u8 + 1;
    }
}

/// A size class changing route, and why.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct RouteChange {
    pub op: u64,
    pub class: String,
    pub from: StrategyKind,
    pub to: StrategyKind,
    pub reason: String,
}

/// A controller decision other than routing: memory released and why.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Decision {
    pub op: u64,
    pub action: String,
    pub bytes: u64,
    pub reason: String,
}

/// What the engine knows of one size class, for the tuning report.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct ClassSummary {
    pub class: String,
    pub min_bytes: u64,
    pub max_bytes: u64,
    pub route: StrategyKind,
    pub requests: u64,
    pub bytes: u64,
    pub frees: u64,
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
#[derive(Clone, Copy, Debug, Serialize, PartialEq, Eq)]
pub struct TimelinePoint {
    pub op: u64,
    pub live_bytes: u64,
    pub reserved_bytes: u64,
    pub idle_bytes: u64,
    pub device_free_bytes: u64,
}

/// The policy engine of one allocator.
#[derive(Debug)]
pub struct Engine {
    policy: Policy,
    kinds: Vec<StrategyKind>,
    classes: Vec<ClassStats>,
    headroom: u64,
    low_watermark: u64,
    tight_below: u64,
    pressure_max_idle: u64,
    max_idle: u64,
    /// The bound on idle memory the cache and the slabs apply on frees between samples.
    on_free_idle: u64,
    /// The device has fewer than [`TINY_DEVICE_PAGES`] pages.
    tiny_device: bool,
    next_tick: u64,
    next_sample: u64,
    last_free: u64,
    in_pressure: bool,
    /// Free memory was under `bounds.tight_below` at the last sample.
    tight: bool,
    /// How the driver consumes memory, for `footprint`.
    model: Granularity,
    /// What the driver would consume for the live blocks as separate allocations, and its
    /// peak: passthrough's footprint of this workload so far.
    footprint: Counter,
    /// The footprint fell under half its peak after the first routing interval: the workload
    /// has shown a cycle (a step, a batch), and its peak so far is taken as its peak.
    cycle_seen: bool,
    pub(crate) pressure_events: u64,
    /// The most memory the slabs stranded at a sample (what live blocks held beyond their
    /// driver footprint).
    pub(crate) peak_stranded: u64,
    pub(crate) released_by_bounds: u64,
    pub(crate) mem_info_samples: u64,
    pub(crate) route_changes: Vec<RouteChange>,
    pub(crate) decisions: Vec<Decision>,
    pub(crate) timeline: Vec<TimelinePoint>,
    timeline_every: u64,
    started: Instant,
}

/// Decisions kept for the report (older ones are counted, not stored).
const MAX_LOG: usize = 10_000;
const MAX_TIMELINE: usize = 4096;

impl Engine {
    /// An engine for `policy` on a device of `total` bytes whose driver consumes memory as
    /// `model` says, over the strategies `kinds` (in the allocator's order).
    pub fn new(policy: Policy, kinds: Vec<StrategyKind>, total: u64, model: Granularity) -> Self {
        let b = &policy.bounds;
        let max_idle = b.max_idle.resolve(total);
        Engine {
            headroom: b.headroom.resolve(total),
            low_watermark: b.low_watermark.resolve(total),
            tight_below: b.tight_below.resolve(total),
            pressure_max_idle: b.pressure_max_idle.resolve(total),
            max_idle,
            on_free_idle: max_idle,
            tiny_device: total < TINY_DEVICE_PAGES * model.large_granule,
            next_tick: policy.routing.interval_ops,
            next_sample: 0,
            last_free: total,
            in_pressure: false,
            tight: false,
            model,
            footprint: Counter::default(),
            cycle_seen: false,
            pressure_events: 0,
            peak_stranded: 0,
            released_by_bounds: 0,
            mem_info_samples: 0,
            route_changes: Vec::new(),
            decisions: Vec::new(),
            timeline: Vec::new(),
            timeline_every: policy.routing.interval_ops,
            started: Instant::now(),
            classes: (0..BUCKETS).map(|_| ClassStats::new()).collect(),
            kinds,
            policy,
        }
    }

    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    /// Free device memory was under the low watermark at the last sample.
    pub fn in_pressure(&self) -> bool {
        self.in_pressure
    }

    pub fn headroom_bytes(&self) -> u64 {
        self.headroom
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

    /// Records a request (hot path: a few adds and a short scan of 4 sizes).
    #[inline]
    pub fn on_alloc(&mut self, bucket: usize, bytes: u64, op: u64) {
        self.footprint.add(self.model.consumed(align_up(bytes, ALIGNMENT)));
        let c = &mut self.classes[bucket];
        c.requests += 1;
        c.w_requests += 1;
        c.bytes += bytes;
        c.live.add(bytes);
        c.live_blocks += 1;
        c.w_peak_blocks = c.w_peak_blocks.max(c.live_blocks);
        if c.waiting > 0 {
            c.waiting -= 1;
            c.reuse_hits += 1;
            c.w_reuse_hits += 1;
            c.reuse_distances.push(op - c.last_free_op);
        }
        note_size(&mut c.w_sizes, &mut c.w_distinct, bytes);
        note_size(&mut c.all_sizes, &mut c.all_distinct, bytes);
    }

    /// A request of class `bucket` made driver calls (slow path only).
    #[inline]
    pub fn on_miss(&mut self, bucket: usize) {
        self.classes[bucket].w_misses += 1;
    }

    /// Records a free (hot path: a few adds).
    #[inline]
    pub fn on_free(&mut self, bucket: usize, bytes: u64, lifetime_ops: u64, op: u64) {
        self.footprint.sub(self.model.consumed(align_up(bytes, ALIGNMENT)));
        let c = &mut self.classes[bucket];
        c.frees += 1;
        c.live.sub(bytes);
        c.live_blocks -= 1;
        c.waiting += 1;
        c.last_free_op = op;
        c.lifetimes.push(lifetime_ops);
    }

    /// True when the controller is due. Cost: one compare.
    #[inline]
    pub fn due(&self, op: u64) -> bool {
        op >= self.next_tick.min(self.next_sample)
    }

    /// The controller: re-routes classes, samples free memory at a bounded rate, enforces the
    /// bounds and ages out idle memory.
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
            self.enforce_bounds(strategies, dev, routes, op);
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
            self.log_release(op, released, || {
                format!("idle memory not reused for {age} operations aged out")
            });
        }
        if op >= self.timeline.last().map(|p| p.op + self.timeline_every).unwrap_or(0) {
            let reserved = strategies.iter().map(Strategy::reserved_bytes).sum();
            let idle = strategies.iter().map(Strategy::idle_bytes).sum();
            self.timeline.push(TimelinePoint {
                op,
                live_bytes: live,
                reserved_bytes: reserved,
                idle_bytes: idle,
                device_free_bytes: self.last_free,
            });
            if self.timeline.len() >= MAX_TIMELINE {
                let kept: Vec<_> = self.timeline.iter().copied().step_by(2).collect();
                self.timeline = kept;
                self.timeline_every *= 2;
            }
        }
    }

    /// Free device memory was under the headroom at the last sample: idle memory that appears
    /// (a cached block, an emptied slab) should go back at once.
    pub fn below_headroom(&self) -> bool {
        self.last_free < self.headroom
    }

    /// Samples free memory now and enforces the bounds: after a driver allocation (free memory
    /// fell), or when idle memory appears while free memory is under the headroom.
    #[cold]
    pub fn resample(&mut self, strategies: &mut [Strategy], dev: &dyn Device, routes: &mut [u8; BUCKETS], op: u64) {
        self.enforce_bounds(strategies, dev, routes, op);
    }

    /// Samples free memory and releases idle memory above the bound it implies: never more idle
    /// than [`idle_bound`](Self::idle_bound) allows (`max_idle`, or up to the peak plus
    /// `spare_share`); never so much that free memory sits under the headroom; at most
    /// `pressure_max_idle` under the low watermark. Also caps the next slab by free - headroom.
    fn enforce_bounds(&mut self, strategies: &mut [Strategy], dev: &dyn Device, routes: &mut [u8; BUCKETS], op: u64) {
        self.next_sample = op + self.policy.bounds.mem_info_interval_ops;
        let Ok(info) = dev.mem_info() else { return };
        self.mem_info_samples += 1;
        self.last_free = info.free;
        let idle: u64 = strategies.iter().map(Strategy::idle_bytes).sum();
        let spare = self.spare_at_peak(strategies, info.free, op);
        let budget = self.strand_budget(spare);
        let stranded: u64 = strategies.iter().map(Strategy::stranded_bytes).sum();
        self.peak_stranded = self.peak_stranded.max(stranded);
        let (mut target, mut reason) = self.idle_bound(strategies, dev, spare, budget, stranded);
        // Unmapping pages inside slabs in use pays off only when others need the memory now.
        let mut unmap_pages = false;
        if info.free < self.headroom {
            let short = self.headroom - info.free;
            if idle.saturating_sub(short) < target {
                target = idle.saturating_sub(short);
                reason = "free device memory under the headroom";
                unmap_pages = true;
            }
        }
        let pressure = info.free < self.low_watermark;
        if pressure && !self.in_pressure {
            self.pressure_events += 1;
            tracing::info!(
                op,
                free = info.free,
                watermark = self.low_watermark,
                "memory pressure: free device memory under the low watermark"
            );
        }
        self.in_pressure = pressure;
        if pressure && self.pressure_max_idle < target {
            target = self.pressure_max_idle;
            reason = "free device memory under the low watermark";
            unmap_pages = true;
        }
        let limit = info.free.saturating_sub(self.headroom);
        // Tight: free memory under tight_below while the slabs strand more than half the
        // guard's budget (small blocks then leave the slabs, so stranded pages drain; the other
        // half is for what frees strand before the next sample, which the guard cannot refuse).
        // With the guard off, free memory alone decides. Roomy again above 1.5x tight_below, or
        // once stranding is down to a quarter of the budget. Entering at the budget instead of
        // half of it made 7x fewer driver calls on cpu-mobilenetv2-train repeated 10 times at
        // 1.5x peak live (1,087 against 7,985, both under 1% of passthrough's), but let
        // small-churn fail at 14 capacities from 1.0x to 1.115x; leaving at half of it, not a
        // quarter, made it fail at 1.005x.
        // On a device of few pages, tight mode does not wait for the slabs to strand: what frees
        // strand comes a page at a time, and one page is then a large share of what the device
        // can spare (see TINY_DEVICE_PAGES).
        let tiny = self.tiny_device;
        let tight = if self.tight {
            (info.free as f64) < self.tight_below as f64 * 1.5 && (tiny || budget.is_none_or(|b| stranded > b / 4))
        } else {
            info.free < self.tight_below && (tiny || budget.is_none_or(|b| stranded > b / 2))
        };
        if tight != self.tight {
            self.tight = tight;
            self.route_small_for_tightness(routes, op, info.free);
        }
        let segregate = match self.policy.suballoc.segregate {
            super::Segregate::Always => true,
            super::Segregate::Never => false,
            super::Segregate::WhenTight => tight,
        };
        let growth = if tight {
            self.policy.suballoc.growth
        } else {
            self.policy.suballoc.loose_growth
        };
        for s in strategies.iter_mut() {
            if let Strategy::Suballoc(sub) = s {
                sub.set_strand_budget(budget);
                sub.set_slab_limit(limit);
                sub.set_segregate(segregate);
                sub.set_growth(growth);
            }
        }
        if idle <= target {
            return;
        }
        let mut need = idle - target;
        let can_release: u64 = strategies.iter().map(|s| s.releasable(unmap_pages)).sum();
        // Over max_idle mostly because of free space inside slabs with live blocks, which cannot
        // go back: releasing cached blocks would not meet the bound and would strip the cache of
        // blocks soon asked for again (driver calls for nothing); empty slabs still go.
        let keep_cache = info.free >= self.headroom && !pressure && can_release < need;
        // Cached blocks first (cheap to re-create), then empty slabs.
        let mut released = 0;
        for kind in [StrategyKind::Caching, StrategyKind::Suballoc] {
            if keep_cache && kind == StrategyKind::Caching {
                continue;
            }
            for s in strategies.iter_mut().filter(|s| s.kind() == kind) {
                let own = s.idle_bytes();
                let r = s.release_down_to(dev, own - need.min(own), unmap_pages);
                released += r;
                need = need.saturating_sub(r);
            }
        }
        let headroom = self.headroom;
        self.log_release(op, released, || {
            format!("{reason} (free {} of headroom {headroom})", info.free)
        });
    }

    /// The memory the device is expected to have free at the workload's peak, counting what
    /// this allocator holds as its own: free plus reserved, less the peak. The peak is
    /// passthrough's footprint at its highest so far, times `bounds.peak_growth` until the
    /// workload has shown a cycle (its footprint fell under half its peak after the first
    /// routing interval).
    fn spare_at_peak(&mut self, strategies: &[Strategy], free: u64, op: u64) -> u64 {
        let (now, peak) = (self.footprint.current, self.footprint.peak);
        if !self.cycle_seen && op >= self.policy.routing.interval_ops && now < peak / 2 {
            self.cycle_seen = true;
            tracing::debug!(op, peak, "workload cycle seen: its peak so far is taken as its peak");
        }
        let expected_peak = if self.cycle_seen {
            peak as f64
        } else {
            peak as f64 * self.policy.bounds.peak_growth
        };
        let available = free + strategies.iter().map(Strategy::reserved_bytes).sum::<u64>();
        (available as f64 - expected_peak).max(0.0) as u64
    }

    /// How much the slabs may strand (hold beyond what the driver would consume for their live
    /// blocks, where no release reaches): `bounds.strand_share` of the memory expected free at
    /// the workload's peak. None when the guard is off.
    fn strand_budget(&self, spare: u64) -> Option<u64> {
        if self.policy.routing.mode != RoutingMode::Adaptive || !self.policy.suballoc.strand_guard {
            return None;
        }
        Some((spare as f64 * self.policy.bounds.strand_share) as u64)
    }

    /// The idle memory kept at this sample, and why; also sets the bound the cache and the
    /// slabs apply on frees until the next sample. `bounds.max_idle`, or, while the slabs
    /// strand (`stranded`) at most a quarter of the guard's `budget`, as much as keeps what the
    /// allocator holds within the workload's peak so far plus `bounds.spare_share` of the
    /// memory expected free at the peak (`spare`): what one cycle frees is then kept for the
    /// next (a serving loop frees nearly all it holds between requests). Between samples frees
    /// do not change what is held, and every driver allocation is followed by a sample, so the
    /// cap on what is held holds between samples too.
    fn idle_bound(
        &mut self,
        strategies: &mut [Strategy],
        dev: &dyn Device,
        spare: u64,
        budget: Option<u64>,
        stranded: u64,
    ) -> (u64, &'static str) {
        let share = self.policy.bounds.spare_share;
        // Only while the slabs strand at most a quarter of the guard's budget (where tight mode
        // is left; with the guard off, outside tight mode): beyond it, kept slabs would take
        // more small blocks and strand more (random churns on 15-31 MiB devices failed at more
        // capacities). Tight mode itself, entered at half the budget, needs no test of its own:
        // without one, gpu-medium-ctx256-infer at 1.1x passthrough's minimum makes 265 driver
        // calls instead of 477, with the same failures everywhere.
        let clear = budget.map_or(!self.tight, |b| stranded <= b / 4);
        let hold = if !clear || share <= 0.0 {
            0
        } else {
            self.footprint.peak + (spare as f64 * share) as u64
        };
        let on_free = self.max_idle.max(hold);
        if on_free != self.on_free_idle {
            self.on_free_idle = on_free;
            for s in strategies.iter_mut() {
                match s {
                    Strategy::Caching(c) => c.set_max_idle_bytes(dev, Some(on_free)),
                    Strategy::Suballoc(sub) => sub.set_max_empty_bytes(dev, on_free),
                    Strategy::Passthrough(_) => {}
                }
            }
        }
        let to_peak = hold.saturating_sub(self.footprint.current);
        if to_peak > self.max_idle {
            (
                to_peak,
                "idle memory over the workload's peak plus bounds.spare_share of the memory free at it",
            )
        } else {
            (self.max_idle, "idle memory over policy bounds.max_idle")
        }
    }

    /// While the device is tight, requests under 1 MiB get exact-size cached blocks (a slab page
    /// that holds one small live block pins a whole 2 MiB page; the driver packs small blocks at
    /// 512 B); when it has room again, they go back to slabs.
    fn route_small_for_tightness(&mut self, routes: &mut [u8; BUCKETS], op: u64, free: u64) {
        if self.policy.routing.mode != RoutingMode::Adaptive || !self.policy.routing.small_exact_when_tight {
            return;
        }
        let (from, to) = if self.tight {
            (StrategyKind::Suballoc, StrategyKind::Caching)
        } else {
            (StrategyKind::Caching, StrategyKind::Suballoc)
        };
        let to_idx = self.index_of(to) as u8;
        for r in routes.iter_mut().take(SMALL_BUCKETS) {
            *r = to_idx;
        }
        let reason = if self.tight {
            format!(
                "device tight ({} free): small requests get exact-size blocks",
                crate::size::ByteSize(free)
            )
        } else {
            format!(
                "device has room again ({} free): small requests back to slabs",
                crate::size::ByteSize(free)
            )
        };
        tracing::info!(op, %from, %to, reason = %reason, "route changed for all classes under 1MiB");
        if self.route_changes.len() < MAX_LOG {
            self.route_changes.push(RouteChange {
                op,
                class: "all under 1MiB".into(),
                from,
                to,
                reason,
            });
        }
    }

    fn reroute(&mut self, routes: &mut [u8; BUCKETS], op: u64, reserved: u64) {
        let r = self.policy.routing.clone();
        for (b, route) in routes.iter_mut().enumerate() {
            let c = &mut self.classes[b];
            if c.w_requests < r.min_samples || (self.tight && r.small_exact_when_tight && b < SMALL_BUCKETS) {
                // Too few requests to judge; keep the window growing.
                continue;
            }
            let (lo, _) = bucket_range(b);
            let reuse = c.w_reuse_hits as f64 / c.w_requests as f64;
            let (distinct, peak_blocks) = (c.w_distinct, c.w_peak_blocks);
            // A class the slabs serve without a driver call stays there, however cacheable, when
            // what the allocator holds plus the class's blocks cached would pass
            // `bounds.max_idle`: at the workload's low point (live near 0) nearly all of it is
            // idle, and the bound would strip the cache again on every cycle while the class's
            // slab holes stay (the 17 workloads repeated 5 times at 2x peak live: 8,381 driver
            // calls with the move, 901 without; gpu-small-fwd-fp32 and the gpu-medium
            // inference traces make 5-21% of passthrough's calls with it, 0.2-1.2% without).
            let stays_in_slabs = self.kinds[*route as usize] == StrategyKind::Suballoc
                && c.w_misses == 0
                && reserved + c.live.peak > self.max_idle;
            let want = if lo >= r.passthrough_min.0 {
                StrategyKind::Passthrough
            } else if (distinct as u32) <= r.cache_max_distinct_sizes
                && reuse >= r.cache_min_reuse
                && peak_blocks <= r.cache_max_live_blocks
                && !stays_in_slabs
            {
                StrategyKind::Caching
            } else {
                StrategyKind::Suballoc
            };
            // Formatted only when the route changes (formatting every class at every tick cost
            // more than the allocations in between).
            let why = || match want {
                StrategyKind::Passthrough => format!(
                    "sizes at least {} go to the driver",
                    crate::size::ByteSize(r.passthrough_min.0)
                ),
                StrategyKind::Caching => format!(
                    "{distinct} distinct size(s), {:.0}% of requests find a freed block, at most {peak_blocks} live: \
                     exact-size caching",
                    reuse * 100.0
                ),
                StrategyKind::Suballoc => format!(
                    "{} distinct sizes, {:.0}% reuse: suballocation packs varied sizes",
                    distinct_text(distinct),
                    reuse * 100.0
                ),
            };
            c.w_requests = 0;
            c.w_reuse_hits = 0;
            c.w_misses = 0;
            c.w_distinct = 0;
            c.w_peak_blocks = c.live_blocks;
            let want_idx = self.kinds.iter().position(|&k| k == want).unwrap_or(0);
            if want_idx == *route as usize {
                c.pending = None;
                continue;
            }
            let count = match c.pending {
                Some((idx, n)) if idx == want_idx => n + 1,
                _ => 1,
            };
            if count < r.hysteresis.max(1) {
                c.pending = Some((want_idx, count));
                continue;
            }
            c.pending = None;
            let from = self.kinds[*route as usize];
            *route = want_idx as u8;
            let class = class_name(b);
            let why = why();
            tracing::info!(op, class = %class, %from, to = %want, reason = %why, "route changed");
            if self.route_changes.len() < MAX_LOG {
                self.route_changes.push(RouteChange {
                    op,
                    class,
                    from,
                    to: want,
                    reason: why,
                });
            }
        }
    }

    /// Counts and logs memory the bounds gave back (nothing when `released` is 0).
    fn log_release(&mut self, op: u64, released: u64, reason: impl FnOnce() -> String) {
        if released > 0 {
            self.released_by_bounds += released;
            self.log(op, "release", released, reason());
        }
    }

    fn log(&mut self, op: u64, action: &str, bytes: u64, reason: String) {
        tracing::info!(op, action, bytes, reason = %reason, "policy decision");
        if self.decisions.len() < MAX_LOG {
            self.decisions.push(Decision {
                op,
                action: action.into(),
                bytes,
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

fn distinct_text(n: u8) -> String {
    if n as usize > SIZES {
        format!("more than {SIZES}")
    } else {
        n.to_string()
    }
}

/// A class's name: its size range, "1MiB..2MiB".
pub fn class_name(b: usize) -> String {
    let (lo, hi) = bucket_range(b);
    format!(
        "{}..{}",
        crate::size::ByteSize(lo),
        crate::size::ByteSize(hi.saturating_add(1))
    )
}
