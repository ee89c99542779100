//! What a sample of the device means, as a pure function: [`assess`] takes what the controller
//! measured and the policy's limits, and returns a [`Plan`] (modes, the idle bound, the strand
//! budget, the slab limit, growth and segregation). It touches no strategy and no device; the
//! controller applies the plan. Every rule has a table-driven unit test below, named after it.

use super::constants::{
    CYCLE_FALL_DIVISOR, KNOWN_PEAK_SPARE_DIVISOR, STRAND_CLEAR_DIVISOR, TIGHT_ENTER_STRAND_DIVISOR,
    TIGHT_EXIT_FREE_FACTOR,
};
use super::{Policy, RoutingMode, Segregate};
use crate::strategy::SlabBacking;

/// The policy's bounds resolved on one device, and the settings `assess` reads.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Limits {
    pub headroom: u64,
    pub low_watermark: u64,
    pub tight_below: u64,
    /// Operations before the first routing decision: no cycle is judged before it.
    pub interval_ops: u64,
    pub peak_growth: f64,
    /// `bounds.expected_peak`: the workload's peak footprint as an earlier run showed it.
    pub expected_peak: Option<u64>,
    pub strand_share: f64,
    pub spare_share: f64,
    /// Adaptive routing with the strand guard on.
    pub guard: bool,
    /// The device has fewer than [`TINY_DEVICE_PAGES`](super::constants::TINY_DEVICE_PAGES) pages.
    pub tiny_device: bool,
    /// How slabs are backed (`suballoc.backing`): with `whole`, a live block holds its whole
    /// slab, and no page of it goes back before the slab is empty; under `auto`, the strand
    /// budget also decides how large a slab's handles are.
    pub backing: SlabBacking,
    pub segregate: Segregate,
    pub growth: f64,
    pub loose_growth: f64,
}

impl Limits {
    pub fn new(policy: &Policy, total: u64, tiny_device: bool) -> Self {
        let b = &policy.bounds;
        Limits {
            headroom: b.headroom.resolve(total),
            low_watermark: b.low_watermark.resolve(total),
            tight_below: b.tight_below.resolve(total),
            interval_ops: policy.routing.interval_ops,
            peak_growth: b.peak_growth,
            expected_peak: b.expected_peak.map(|p| p.0),
            strand_share: b.strand_share,
            spare_share: b.spare_share,
            guard: policy.routing.mode == RoutingMode::Adaptive && policy.suballoc.strand_guard,
            tiny_device,
            backing: policy.suballoc.backing,
            segregate: policy.suballoc.segregate,
            growth: policy.suballoc.growth,
            loose_growth: policy.suballoc.loose_growth,
        }
    }
}

/// What the controller measured at one sample.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Sample {
    pub op: u64,
    /// Free device memory.
    pub free: u64,
    /// What the strategies hold, and the idle part of it.
    pub reserved: u64,
    pub idle: u64,
    /// What the slabs hold beyond the driver's footprint of their live blocks.
    pub stranded: u64,
    /// The cache's idle blocks (driver allocations no live block uses): part of `idle`.
    pub cached_idle: u64,
    /// Passthrough's footprint of the live blocks now, and its peak so far.
    pub footprint: u64,
    pub footprint_peak: u64,
    /// The lowest footprint since the previous sample.
    pub footprint_low: u64,
    /// The footprint has fallen from its peak and come back to it exactly: the workload's
    /// cycle repeats, and its peak so far is its peak (`PeakRecurrence`).
    pub peak_recurred: bool,
    /// The most the strategies held at any sample so far: what the workload's cycle has shown
    /// it needs (every driver allocation is followed by a sample, so no growth goes unseen).
    pub reserved_peak: u64,
}

/// What the previous samples decided and this one may change.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Prior {
    pub tight: bool,
    pub cycle_seen: bool,
}

/// Why idle memory is bounded where it is (the decision log's words).
pub(crate) const OVER_PEAK: &str =
    "idle memory over the workload's peak plus bounds.spare_share of the memory free at it";
pub(crate) const OVER_CYCLE: &str = "idle memory over what the workload's cycle has held at its peak";
pub(crate) const OVER_SHARE: &str =
    "held memory over the workload's peak plus bounds.spare_share of the memory beyond it (left to other processes)";
pub(crate) const UNDER_HEADROOM: &str = "free device memory under the headroom";
pub(crate) const UNDER_WATERMARK: &str = "free device memory under the low watermark";

/// The controller's orders for the next interval.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Plan {
    /// The workload has shown a cycle (now or before).
    pub cycle_seen: bool,
    /// Memory expected free at the workload's peak, counting what the allocator holds.
    pub spare: u64,
    /// How much the slabs may strand; None when the guard is off.
    pub strand_budget: Option<u64>,
    /// The bound the cache and the slabs apply to idle memory on frees until the next sample.
    pub on_free_idle: u64,
    /// The most the allocator may hold with a class's blocks moved from the slabs into the
    /// cache: the workload's peak plus `bounds.spare_share` of the memory expected free at it,
    /// the peak taken as `bounds.peak_growth` times the peak so far even after a cycle (a margin
    /// for later steps that outgrow the first).
    pub cache_bound: u64,
    /// Idle memory to keep now, and why.
    pub idle_target: u64,
    pub reason: &'static str,
    /// Release pages inside slabs in use (only when others need the memory now).
    pub unmap_pages: bool,
    /// Free memory is under the low watermark: place compactly, take exact-size driver
    /// allocations.
    pub pressure: bool,
    /// Tight mode: small requests get exact-size blocks, slabs grow by `growth` and segregate
    /// when the policy says `when-tight`.
    pub tight: bool,
    /// The most the slabs may take from the driver before idle pages are moved instead of new
    /// ones created: free memory less the headroom, and no more than the share cap leaves
    /// ([`share_cap`]: what is held stays within the workload's peak plus
    /// `bounds.spare_share` of the memory beyond it). Without the second bound, a layout
    /// that needed more than the cap at its peak created pages that the next sample gave back
    /// as idle over the cap, and the next request created again: bundled `training` at 1.3x
    /// peak live made 6,400 creates a pass (1864 ms), at 1.2x 1820 ms; now 0 and 18 ms. Summed
    /// over the 17 workloads: 1.2x 2913 -> 1460 ms a pass, 1.3x 2816 -> 837 (vmm-fast.toml:
    /// 1514 -> 1131, 1164 -> 806); `serving` at 1.2x, whose layout fit without thrashing, now
    /// moves pages every pass (0.04 -> 376 ms; 40 -> 45 under vmm-fast.toml).
    pub slab_limit: u64,
    /// Free device memory less the headroom: what a new slab could take without a release
    /// (the slab limit is at most this; an empty slab made for one large block is kept for
    /// blocks of its size where this is under its size, `Suballoc::kept_for_its_block`).
    /// `u64::MAX` until the workload's cycle is seen: before its large blocks have come back,
    /// nothing says keeping a slab for them pays, and the memory a smaller request then takes
    /// beside the idle slab left a co-tenant arriving mid-run short of the headroom
    /// (`gpu-medium-ctx1024-infer` at 1.5x passthrough's minimum, `tests/policy_engine.rs`).
    pub device_room: u64,
    /// The free memory kept for others now: `bounds.headroom`, and once a cycle is seen no more
    /// than the share of the memory expected free at the peak that the bounds leave to others.
    pub headroom: u64,
    pub segregate: bool,
    pub growth: f64,
    /// The workload's peak is known, with room ([`peak_known`]).
    pub peak_known: bool,
    /// The peak is the one the policy gives (`bounds.expected_peak`), the footprint within it.
    pub peak_given: bool,
    /// The given peak's footprint where it is known with room ([`peak_known`]); 0 where the
    /// peak is learned, or leaves less than a quarter of it free beyond it: pinned memory up to
    /// it is not stranding to the guard ([`Suballoc::set_strand_floor`](crate::strategy::Suballoc::set_strand_floor)).
    pub strand_floor: u64,
}

/// The plan for one sample. Pure: the same inputs always give the same plan.
pub(crate) fn assess(s: &Sample, lim: &Limits, prior: Prior) -> Plan {
    let cycle_seen = cycle_seen(s, lim, prior.cycle_seen);
    let measured = s;
    let view = given_peak(s, lim);
    let given = view.is_some();
    let s = view.as_ref().unwrap_or(s);
    let seen = cycle_seen || given;
    let spare = spare_at_peak(s, lim, seen);
    let known = peak_known(s, lim, spare);
    let strand_budget = strand_budget(lim, spare, known);
    let IdleBound {
        on_free: on_free_idle,
        target: mut idle_target,
        mut reason,
        cap,
    } = idle_bound(s, lim, prior.tight, spare, strand_budget);
    // Under the headroom, or under pressure, idle memory goes back until free memory is at the
    // headroom again (or at the watermark, where that is higher), and no further: what the
    // workload's cycle holds beyond that it asks for again. Stripping all idle memory under
    // pressure (the retired `bounds.pressure_max_idle = 0`) cost every pass near the
    // capacity: at 1.1x passthrough's minimum, 211 ms a pass summed over 17 workloads against
    // 177, with the same robustness grid and co-tenant tables.
    //
    // The headroom is kept free before anyone asks, not given back once others are seen to
    // grow: releasing under it only as far as others had taken memory since their least (the
    // device's used memory less ours) cut 1.1x's steady state from 200.7 to 28.7 ms a pass (43.9
    // to 9.8 under vmm-fast.toml, 72.1 to 12.9 at the H200's prices), but a process or library
    // that allocates unannounced (NCCL's buffers, a co-tenant) must find the memory free at that
    // instant: under `--policy multi-tenant` the co-tenant table's refused takes went from 0 / 0
    // / 0 / 0 to 2 / 7 / 1 / 1 (1.5x and 2x, half and all of the slack).
    //
    // Once a cycle is seen, the headroom asks no more than what the bounds promise others: the
    // part of the memory expected free at the peak that is left to them (`1 -
    // bounds.spare_share` of it, see [`share_cap`]). Near passthrough's minimum that is less
    // than 5% of the device, and keeping 5% free there gave back, every step, pages the step
    // took again (bundled `training` at 1.1x passthrough's minimum: 153 -> 20 ms a pass; 1.1x
    // summed over the 17 workloads 153 -> 21 ms, 35.8 -> 45.1 under vmm-fast.toml; robustness
    // grid 8 / 6 / 12 -> 9 / 5 / 13 failing runs; co-tenant tables unchanged).
    let pressure = s.free < lim.low_watermark;
    let headroom = if seen {
        lim.headroom.min(left_of(spare, lim))
    } else {
        lim.headroom
    };
    let floor = headroom.max(lim.low_watermark);
    // Memory left to other processes is memory they can take: pages inside slabs in use count
    // (without them, gpu-medium-ctx128-infer and ctx256-infer at 1.5x peak live kept a co-tenant
    // of half the slack out).
    let mut unmap_pages = reason == OVER_SHARE;
    if s.free < floor {
        let short = floor - s.free;
        if s.idle.saturating_sub(short) < idle_target {
            idle_target = s.idle.saturating_sub(short);
            reason = if pressure { UNDER_WATERMARK } else { UNDER_HEADROOM };
            unmap_pages = true;
        }
    }
    let tight = !known && !layout_fits(measured, lim, floor) && tight(s, lim, prior.tight, strand_budget);
    let room = s.free.saturating_sub(headroom);
    Plan {
        cycle_seen,
        spare,
        strand_budget,
        on_free_idle,
        cache_bound: s.footprint_peak + kept_of(spare_at_peak(s, lim, given), lim),
        idle_target,
        reason,
        unmap_pages,
        pressure,
        tight,
        slab_limit: room.min(cap.saturating_sub(s.reserved)),
        device_room: if cycle_seen { room } else { u64::MAX },
        headroom,
        segregate: match lim.segregate {
            Segregate::Always => true,
            Segregate::Never => false,
            Segregate::WhenTight => tight,
        },
        growth: if tight { lim.growth } else { lim.loose_growth },
        peak_known: known,
        peak_given: given,
        // A given peak with room: what live blocks pin below its footprint the peak fills, so
        // the guard does not count it as stranded. Counted, slabs backed whole under `auto`
        // stranded more than all the memory free beyond the peak at every step's low point, and
        // the guard refused the empty slabs held for the next step: `gpu-medium-ctx512-train`
        // at 1.5x peak live paid 22.1 ms a pass where learning the peak paid none (1035 driver
        // allocations over ten passes; now 33); the 17 workloads given their peaks, ten passes
        // at 1.5x, 447 -> 216 ms (2x the same). Not near the capacity (no [`peak_known`]):
        // there the floor failed requests with the exact peak given at passthrough's minimum
        // (3 of 17, `scripts/short-peak.sh` 1.0), which pages complete; without it, none.
        strand_floor: if given && known { s.footprint_peak } else { 0 },
    }
}

/// The sample as the engine reads it where the policy gives the workload's peak
/// (`bounds.expected_peak`) and the footprint has stayed within it: that peak, as if the cycle
/// had come back to it. None where no peak is given, or the footprint passed it (the engine
/// then learns the peak as without one). With the peak each workload showed given, the 17 of
/// `steady_eval` cost 183 ms over ten passes at 2x peak live, summed, with slabs backed `auto`
/// (216 at 1.5x; 312 and 622 before a slab one handle would back whole could be one driver
/// allocation where the prices say so, 447 at 1.5x before the strand floor below), against
/// 6532 (8103) learning the peak and 222 (286) for PyTorch's allocator;
/// with pages, 6527 (6787: `small-churn`'s exact-size blocks while its peak was unknown, 1518
/// ms, gone). Given 10% under the real peak, no run failed, and the first five passes cost
/// 6462 ms summed at 1.5x with `auto`, against 8084 for the default.
fn given_peak(s: &Sample, lim: &Limits) -> Option<Sample> {
    let peak = lim.expected_peak.filter(|&p| s.footprint_peak <= p)?;
    Some(Sample {
        footprint_peak: peak,
        peak_recurred: true,
        ..*s
    })
}

/// A cycle is seen once the footprint falls under half its peak after the first routing
/// interval: at its lowest since the previous sample, not only at the sample itself.
fn cycle_seen(s: &Sample, lim: &Limits, seen: bool) -> bool {
    seen || (s.op >= lim.interval_ops && s.footprint_low.min(s.footprint) < s.footprint_peak / CYCLE_FALL_DIVISOR)
}

/// The memory expected free at the workload's peak, counting what the allocator holds as its
/// own: free plus reserved, less the peak. The peak is passthrough's footprint at its highest
/// so far, times `bounds.peak_growth` until a cycle is seen.
fn spare_at_peak(s: &Sample, lim: &Limits, cycle_seen: bool) -> u64 {
    let peak = s.footprint_peak as f64;
    let expected_peak = if cycle_seen { peak } else { peak * lim.peak_growth };
    ((s.free + s.reserved) as f64 - expected_peak).max(0.0) as u64
}

/// The bound on idle memory on frees, and the idle memory kept now with its reason: while the
/// slabs strand at most a quarter of the guard's budget (with the guard off: outside tight
/// mode), as much as keeps what the allocator holds within the workload's peak so far plus
/// `bounds.spare_share` of the memory expected free at the peak:
/// what one cycle frees is then kept for the next (a serving loop frees nearly all it holds
/// between requests). Tight mode itself needs no test of its own here: without one,
/// gpu-medium-ctx256-infer at 1.1x passthrough's minimum makes 265 driver calls instead of 477,
/// with the same failures everywhere.
///
/// Idle memory up to what the allocator held at its peak so far is kept (on frees and at
/// samples): the next cycle asks for it again, and giving it back at the low point of a step
/// only makes the driver create it anew (a serving loop that frees a 2 GiB buffer after every
/// request re-created it every request). What the headroom, the low watermark, an
/// out-of-memory retry and age (`bounds.idle_age_ops`) give back is unaffected.
///
/// Over all of these, the share cap ([`share_cap`]): idle memory is kept only while what the
/// allocator holds stays within the workload's peak footprint plus `bounds.spare_share` of the
/// memory beyond it. The rest is left for other processes: a co-tenant that takes memory
/// unannounced gets it only if it is free at that instant.
fn idle_bound(s: &Sample, lim: &Limits, tight: bool, spare: u64, budget: Option<u64>) -> IdleBound {
    let clear = budget.map_or(!tight, |b| s.stranded <= b / STRAND_CLEAR_DIVISOR);
    // Of the memory expected free at the peak: what idle memory may take, and what is left.
    let kept = kept_of(spare, lim);
    let hold = if !clear || lim.spare_share <= 0.0 {
        0
    } else {
        s.footprint_peak + kept
    };
    // The idle memory that brings what is held back to the cycle's peak.
    let in_use = s.reserved - s.idle;
    let cycle = s.reserved_peak.saturating_sub(in_use);
    let to_peak = hold.saturating_sub(s.footprint);
    let (target, reason) = if cycle >= to_peak {
        (cycle, OVER_CYCLE)
    } else {
        (to_peak, OVER_PEAK)
    };
    let cap = share_cap(s, lim, left_of(spare, lim)).unwrap_or(u64::MAX);
    let on_free = hold.max(s.reserved_peak.min(cap));
    let room = cap.saturating_sub(in_use);
    let capped = target > room;
    IdleBound {
        on_free,
        target: if capped { room } else { target },
        reason: if capped { OVER_SHARE } else { reason },
        cap,
    }
}

/// The part of `spare` (memory expected free at the workload's peak) that idle memory may take:
/// `bounds.spare_share` of it.
fn kept_of(spare: u64, lim: &Limits) -> u64 {
    (spare as f64 * lim.spare_share) as u64
}

/// The rest of `spare`, left to other processes: what the share cap ([`share_cap`]) keeps free
/// for them, and the most the headroom asks once a cycle is seen.
fn left_of(spare: u64, lim: &Limits) -> u64 {
    spare - kept_of(spare, lim)
}

/// What [`idle_bound`] decides.
struct IdleBound {
    /// The bound the cache and the slabs apply to idle memory on frees.
    on_free: u64,
    /// Idle memory to keep now, and why.
    target: u64,
    /// Why: [`OVER_SHARE`] where the share cap ([`share_cap`]) set the target.
    reason: &'static str,
    /// The share cap on what is held (u64::MAX where none).
    cap: u64,
}

/// The most the allocator holds with idle memory in it, where that bounds anything: all it
/// could hold (free memory and its own) less `left`, the part of the memory expected free at
/// the workload's peak that is left to other processes, `1 - bounds.spare_share` of it. Once a
/// cycle is seen that is the workload's peak footprint plus `spare_share` of the memory beyond
/// it; before, the peak is taken as `bounds.peak_growth` times the peak so far, so a first
/// step's memory is not given back before the workload has shown its peak. With the default
/// half, a co-tenant that takes up to half of what passthrough would leave free finds it free
/// (tuning/reports/tenants.md).
///
/// No bound where it would leave others no more than the headroom, or under the headroom:
/// there the headroom rule decides, and a bound of its own only made the workload take back
/// what it gave (near passthrough's minimum: summed over 25 traces at 1.1x peak live, 3232 ms
/// a pass in steady state instead of 2840; gpu-small-fwd-fp32 at 1.5x peak live, 6.2 ms a pass
/// instead of 0.01).
fn share_cap(s: &Sample, lim: &Limits, left: u64) -> Option<u64> {
    (s.free >= lim.headroom && left > lim.headroom).then(|| (s.free + s.reserved).saturating_sub(left))
}

/// The workload's peak is known, with room: its footprint has come back to the peak exactly
/// (`Sample::peak_recurred`) and the memory expected free at the peak is at least
/// 1/[`KNOWN_PEAK_SPARE_DIVISOR`] of it; not on a tiny device, nor with slabs backed whole
/// (there the robustness grid failed 3 more runs at 1.3x). The device is then not tight, the
/// suballocator moves idle pages past the slab limit whatever the prices (a page given back
/// is created again at the next peak: `gpu-medium-ctx256-infer` at 1.5x peak live under
/// vmm-fast.toml, 7.9 -> 0 ms a pass; at 1.3x the 17 workloads' sum 68.3 -> 58.5, with
/// `gpu-medium-ctx1024-infer` 49 -> 0 and `gpu-medium-ctx512-infer` 0 -> 42; nothing else
/// changed from 1.05x to 2x, and the default prices already move), and
/// the strand guard may strand all the memory expected free at the peak ([`strand_budget`]):
/// the slabs' stranding has room at a peak that repeats, where tight mode's exact-size blocks
/// and the guard's cost a driver allocation and free each. `small-churn` at 1.5x peak live (its
/// slabs strand 3-7 MiB of 20, tight mode's entry threshold was 1.7): 612 -> 2.1 ms a pass in
/// steady state under either cost model with tight mode alone, 0.45 with the budget too (18
/// exact-size blocks from the guard a pass gone, and the samples after them); at 1.3x 753 ->
/// 60 -> 1.7 (0.8 under vmm-fast.toml). Its warm-up 535 -> 1107 ms: the second pass stays tight
/// until the footprint is back at the peak. Every other workload of steady_eval and of
/// `compare` from 1.05x to 2x peak live, the robustness grid and `robustness_sweep` the same.
/// What else was measured is at [`KNOWN_PEAK_SPARE_DIVISOR`].
fn peak_known(s: &Sample, lim: &Limits, spare: u64) -> bool {
    !lim.tiny_device
        && lim.backing != SlabBacking::Whole
        && s.peak_recurred
        && spare >= s.footprint_peak / KNOWN_PEAK_SPARE_DIVISOR
}

/// The strand guard's budget (None with the guard off): `bounds.strand_share` of the memory
/// expected free at the peak, and all of it once the peak is known (a share of 0 stays 0).
/// (Under `whole` the peak is never known.) Under `auto`, where live blocks pin pages, not
/// handles, and the handles are split out of memory: `small-churn` at 1.5x peak live 968 ->
/// 0.5 ms a pass in steady state (its exact-size blocks from the guard gone), the robustness
/// grid the same (7 / 3 / 4); when the budget also sized `auto`'s handles, all of it failed 2
/// more runs from 1.03x, and only a given peak (`bounds.expected_peak`) had it. Under
/// `large-handles` all of it took 1.5x and 2x peak live from 15.7 to 13.9 and 0.16 to 0.07 ms a
/// pass, its grid the same (52 / 35 / 19). Under `blocks` it decides whether an idle
/// handle a smaller block would cover in part is pinned whole or given back and made again in
/// the block's shape: with all of it, 17 workloads at 1.5x peak live, summed where PyTorch's
/// allocator completes, 31.9 -> 17.6 ms a pass (`gpu-medium-ctx1024-train` 1.58 -> 0.02; worse:
/// `gpu-medium-ctx128-infer` 9.2 -> 27.2), 2x 8.7 -> 6.9, under `vmm-fast.toml` 22.3 -> 14.0 and
/// 6.0 -> 5.7; `blocks`' robustness grid the same (25 / 11 / 16 failing runs). As the tuning
/// report's advice, replayed over ten passes (`tuning/reports/peers.md`), it now holds on 11 and
/// 16 of the 17 workloads at 1.5x and 2x peak live (9 and 14), for 3314 and 1984 ms in all
/// (5482 and 4015).
///
/// The default share is a quarter. Until the peak is known, the memory expected free at it is
/// a guess (`bounds.peak_growth` times the peak so far), and what live blocks strand cannot be
/// given back when the guess proves short; half of it, the share before, failed 9 / 4 / 11
/// runs of the robustness grid (exact minimum / 1.01-1.02x / from 1.03x) and 57 / 65 / 94 of
/// `examples/robustness_sweep`'s 3,000 random churns, which the grid does not hold; a quarter
/// 7 / 3 / 4 and 41 / 43 / 39, the sweep's windows the same. Measured at 0.4, 0.3, 0.25, 0.2 and
/// 0.1: 9 / 5 / 12, 8 / 5 / 9, 7 / 3 / 4, 8 / 4 / 2 and 7 / 2 / 1 on the grid; below a
/// quarter, warm-ups at 2x peak live grow (summed over `steady_eval`'s 17 workloads, 6531 ms
/// at a quarter and above, 7111 at 0.2, 8045 at 0.1). A quarter's cost: more exact-size
/// blocks while the peak is unknown (`small-churn`'s warm-up at 1.5x peak live 1107 -> 1514
/// ms) and `cpu-mobilenetv2-train` at 1.1x passthrough's minimum 0.06 -> 1.22 ms a pass.
///
/// A budget under one page refuses every block that would open a page while the slabs hold
/// few live blocks: the page is stranded until blocks fill it. Once the slabs have emptied
/// (between passes), every small request then goes to the driver. `small-churn` at 1.5x peak
/// live: its second pass costs 1122 ms against the first's 389 (`compare --repeat 2`), with
/// 29,210 of its 30,110 requests refused while the slabs held no live block (budget 1.8 MiB, a
/// quarter of the 6.5 MiB expected free at the peak). Three page floors were measured and not
/// kept:
/// - one page wherever the memory expected free at the peak holds one: `steady_eval`'s 1.5x
///   warm-up sums 1737.8 -> 1315.4 ms (vmm-fast.toml 1544.7 -> 1121.0, `small-churn`; other
///   rows moved up to 18 ms either way, `gpu-small-fwd-fp32` at 1.1x passthrough's minimum
///   under vmm-fast.toml 5.8 -> 22.4 ms a pass), but the robustness grid went from 7 / 3 / 4
///   to 8 / 4 / 4 and `robustness_sweep`'s churns from 41 / 43 / 39 to 60 / 60 / 62;
/// - the same once a cycle is seen with room (spare at least the peak over
///   [`KNOWN_PEAK_SPARE_DIVISOR`]): `small-churn` over five passes 1515.5 -> 1093.7 ms, grid the
///   same, churns 46 / 42 / 39 (a random churn "sees" a cycle early, at a small peak so far);
/// - one page while the slabs hold no live block, in the guard: `small-churn`'s warm-up 1513.7
///   -> 853.2 ms, but 33 failed requests at passthrough's exact minimum, grid 10 / 7 / 8.
///
/// All of the memory expected free at the peak once a cycle is seen with room (not only once
/// the peak recurs): `small-churn` 1515.5 -> 882.3 ms over five passes, churns 53 / 86 / 230.
/// Even without the lock-out, `small-churn`'s first pass at 1.5x costs 389 ms, 65 with
/// `routing.small_exact_when_tight = false` (tight mode's exact-size blocks):
/// `bounds.peak_growth` takes the peak as three times the peak so far, which leaves nothing
/// free at it, and a first pass cannot tell that device from one its peak fills.
fn strand_budget(lim: &Limits, spare: u64, known: bool) -> Option<u64> {
    let share = (spare as f64 * lim.strand_share) as u64;
    let all = known && share > 0;
    lim.guard.then_some(if all { share.max(spare) } else { share })
}

/// Tight mode: entered when free memory is under `bounds.tight_below` while the slabs strand
/// more than half the guard's budget (small blocks then leave the slabs, so stranded pages
/// drain); left above 1.5x `tight_below` or once stranding is down to a quarter of the budget.
/// With the guard off, free memory alone decides; so it does on a tiny device, where one
/// stranded page is a large share of what the device can spare.
///
/// Leaving counts the cache's idle blocks as free: in tight mode they are mostly the
/// exact-size blocks tight mode itself made, each given back by one driver free and stranding
/// nothing, and counted as held they kept tight mode going on the memory it held. Small random
/// sizes on a 20 MiB device (`small-churn`) at 1.5x peak live: 796 -> 612 ms a pass in steady
/// state (793 -> 609 under vmm-fast.toml); every other workload of steady_eval and every run of
/// the robustness grid the same. Counting them on entering too (454 ms a pass) failed
/// `churn 512..1MiB` at two more capacities from 1.03x and `small-churn` (seed 4) at 1.05x.
///
/// Never tight once the peak is known ([`peak_known`]), nor once the cycle has run with its
/// layout ([`layout_fits`]): `assess` asks those first.
fn tight(s: &Sample, lim: &Limits, was: bool, budget: Option<u64>) -> bool {
    let strands = |div: u64| lim.tiny_device || budget.is_none_or(|b| s.stranded > b / div);
    if was {
        let free = s.free + s.cached_idle;
        (free as f64) < lim.tight_below as f64 * TIGHT_EXIT_FREE_FACTOR && strands(STRAND_CLEAR_DIVISOR)
    } else {
        s.free < lim.tight_below && strands(TIGHT_ENTER_STRAND_DIVISOR)
    }
}

/// The workload's layout has shown that it fits: its footprint came back to its peak (a cycle
/// that repeats, as measured: not a peak the policy gives), and what the allocator held at its
/// highest, stranded memory and all, leaves `floor` (the headroom, or the low watermark where
/// that is higher) of the memory it could hold now free. Tight mode, which guards against
/// stranding that could cost a request, then has nothing to guard: the cycle already ran with
/// it. Entered anyway, it made exact-size blocks for a few hundred operations that aged out
/// later: `cpu-mobilenetv2-train` at 1.1x passthrough's minimum (slabs stranding 27 MiB, 40 MiB
/// free at the peak) entered it every fifth pass, 1.22 ms a pass in steady state (25 exact-size
/// blocks a pass made and freed), now 0.05; nothing else of the 17 workloads changed by more
/// than 2.4 ms a pass at 1.1x (`gpu-small-fwd-fp32` 15.9 -> 13.6; under vmm-fast.toml
/// `gpu-medium-ctx256-infer` 21.1 -> 22.8, where PyTorch's allocator fails), none at 1.5x, 2x
/// or 4x peak live; the robustness grid, `examples/robustness_sweep` and the co-tenant table the
/// same. A co-tenant that takes memory lowers what the allocator could hold, and the test
/// fails again.
///
/// With slabs backed by pages, and under `auto` (one handle a slab, split into pages out of
/// memory, or pages once the run gives back under the headroom). When `auto` became the
/// default the rule had been kept to pages, since a peak given at half the real one at 1.05x
/// passthrough's minimum had failed `cpu-gpt2-train` with it under an earlier `auto`
/// (`scripts/short-peak.sh`); with `auto` as it is now, short-peak.sh fails nothing with the
/// rule (0 of 17 at every factor and capacity), and `cpu-mobilenetv2-train` at 1.1x
/// passthrough's minimum, which entered tight mode every fifth pass again, costs 0.05 ms a
/// pass instead of 1.22 under the default prices and vmm-fast.toml (0.04 instead of 0.88 at
/// the H200's), 0.05 instead of 3.54 at 1.05x; `gpu-medium-ctx256-infer` at 1.1x 48.8 -> 31.5
/// (vmm-fast.toml 22.1 -> 8.9, the H200's 16.9 -> 8.0), its warm-up 87 -> 129 ms, and
/// `gpu-medium-ctx128-infer`'s warm-up at 1.05x 43.9 -> 129.5 ms (its steady state 92.3 ->
/// 77.6); nothing else of `steady_eval` moved by more than 1 ms, and the robustness grid,
/// `examples/robustness_sweep` and the co-tenant table are the same.
///
/// Not with handles shaped to blocks, slabs in eighths or slabs backed whole, nor on a tiny
/// device: there a stranded page is a large share of what the device can spare, and handles
/// larger than a page that are never split strand more than the cycle showed once the layout
/// shifts.
fn layout_fits(s: &Sample, lim: &Limits, floor: u64) -> bool {
    !lim.tiny_device
        && matches!(lim.backing, SlabBacking::Pages | SlabBacking::Auto)
        && s.peak_recurred
        && (s.free + s.reserved).saturating_sub(s.reserved_peak) >= floor
}

/// Whether a release over the idle bound spares the cache: when the bound is passed mostly
/// because of free space inside slabs with live blocks (what can be released falls short of
/// the need), releasing cached blocks would not meet it and would strip the cache of blocks
/// soon asked for again; empty slabs still go. Never under the headroom or under pressure.
pub(crate) fn keep_cache(free: u64, lim: &Limits, pressure: bool, can_release: u64, need: u64) -> bool {
    free >= lim.headroom && !pressure && can_release < need
}

#[cfg(test)]
#[path = "assess_tests.rs"]
mod tests;
