//! What a sample of the device means, as a pure function: [`assess`] takes what the controller
//! measured and the policy's limits, and returns a [`Plan`] (modes, the idle bound, the strand
//! budget, the slab limit, growth and segregation). It touches no strategy and no device; the
//! controller applies the plan. Every rule has a table-driven unit test below, named after it.

use super::constants::{
    CYCLE_FALL_DIVISOR, STRAND_CLEAR_DIVISOR, TIGHT_ENTER_STRAND_DIVISOR, TIGHT_EXIT_FREE_FACTOR, TIGHT_SPARE_DIVISOR,
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
    pub strand_share: f64,
    pub spare_share: f64,
    /// Adaptive routing with the strand guard on.
    pub guard: bool,
    /// The device has fewer than [`TINY_DEVICE_PAGES`](super::constants::TINY_DEVICE_PAGES) pages.
    pub tiny_device: bool,
    /// Slabs are backed by one `cuMemAlloc` each (`suballoc.backing = "whole"`): a live block
    /// holds its whole slab, and no page of it goes back before the slab is empty.
    pub whole_slabs: bool,
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
            strand_share: b.strand_share,
            spare_share: b.spare_share,
            guard: policy.routing.mode == RoutingMode::Adaptive && policy.suballoc.strand_guard,
            tiny_device,
            whole_slabs: policy.suballoc.backing == SlabBacking::Whole,
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
    /// The free memory kept for others now: `bounds.headroom`, and once a cycle is seen no more
    /// than the share of the memory expected free at the peak that the bounds leave to others.
    pub headroom: u64,
    /// Free memory above `bounds.tight_below`: how large a slab may be and still be backed by
    /// handles of tens of MiB under `suballoc.backing = "auto"`.
    pub roomy_above: u64,
    pub segregate: bool,
    pub growth: f64,
}

/// The plan for one sample. Pure: the same inputs always give the same plan.
pub(crate) fn assess(s: &Sample, lim: &Limits, prior: Prior) -> Plan {
    let cycle_seen = cycle_seen(s, lim, prior.cycle_seen);
    let spare = spare_at_peak(s, lim, cycle_seen);
    let strand_budget = lim.guard.then_some((spare as f64 * lim.strand_share) as u64);
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
    let headroom = if cycle_seen {
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
    let tight = tight(s, lim, prior.tight, strand_budget, spare);
    Plan {
        cycle_seen,
        spare,
        strand_budget,
        on_free_idle,
        cache_bound: s.footprint_peak + kept_of(spare_at_peak(s, lim, false), lim),
        idle_target,
        reason,
        unmap_pages,
        pressure,
        tight,
        slab_limit: s.free.saturating_sub(headroom).min(cap.saturating_sub(s.reserved)),
        headroom,
        roomy_above: s.free.saturating_sub(lim.tight_below),
        segregate: match lim.segregate {
            Segregate::Always => true,
            Segregate::Never => false,
            Segregate::WhenTight => tight,
        },
        growth: if tight { lim.growth } else { lim.loose_growth },
    }
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
/// Never tight once the workload has come back to its peak and the memory expected free at
/// it is at least 1/[`TIGHT_SPARE_DIVISOR`] of it (not on a tiny device, nor with slabs backed
/// whole, where the robustness grid failed 3 more runs at 1.3x): the slabs' stranding,
/// however far over the budget, then has room at the peak, where tight mode's exact-size blocks
/// cost a driver allocation and free for most small requests. `small-churn` at 1.5x peak live
/// (its slabs strand 3-7 MiB of 20, the entry threshold is 1.7): 612 -> 2.1 ms a pass in steady
/// state under either cost model, its warm-up 535 -> 1106 ms (the second pass is tight until
/// the footprint is back at the peak); every other workload of steady_eval, the robustness
/// grid and `robustness_sweep` the same. What else was measured is at [`TIGHT_SPARE_DIVISOR`].
fn tight(s: &Sample, lim: &Limits, was: bool, budget: Option<u64>, spare: u64) -> bool {
    if !lim.tiny_device && !lim.whole_slabs && s.peak_recurred && spare >= s.footprint_peak / TIGHT_SPARE_DIVISOR {
        return false;
    }
    let strands = |div: u64| lim.tiny_device || budget.is_none_or(|b| s.stranded > b / div);
    if was {
        let free = s.free + s.cached_idle;
        (free as f64) < lim.tight_below as f64 * TIGHT_EXIT_FREE_FACTOR && strands(STRAND_CLEAR_DIVISOR)
    } else {
        s.free < lim.tight_below && strands(TIGHT_ENTER_STRAND_DIVISOR)
    }
}

/// Whether a release over the idle bound spares the cache: when the bound is passed mostly
/// because of free space inside slabs with live blocks (what can be released falls short of
/// the need), releasing cached blocks would not meet it and would strip the cache of blocks
/// soon asked for again; empty slabs still go. Never under the headroom or under pressure.
pub(crate) fn keep_cache(free: u64, lim: &Limits, pressure: bool, can_release: u64, need: u64) -> bool {
    free >= lim.headroom && !pressure && can_release < need
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::size::{GIB, MIB};

    fn limits() -> Limits {
        Limits {
            headroom: 2 * GIB,
            low_watermark: GIB,
            tight_below: 8 * GIB,
            interval_ops: 1000,
            peak_growth: 1.25,
            strand_share: 0.1,
            spare_share: 0.5,
            guard: true,
            tiny_device: false,
            whole_slabs: false,
            segregate: Segregate::WhenTight,
            growth: 0.25,
            loose_growth: 1.0,
        }
    }

    fn sample() -> Sample {
        Sample {
            op: 5000,
            free: 40 * GIB,
            reserved: 10 * GIB,
            idle: GIB,
            stranded: 0,
            cached_idle: 0,
            footprint: 9 * GIB,
            footprint_peak: 10 * GIB,
            footprint_low: 9 * GIB,
            peak_recurred: false,
            reserved_peak: 10 * GIB,
        }
    }

    #[test]
    fn roomy_device_keeps_idle_to_the_peak_plus_a_share_of_the_spare() {
        let p = assess(&sample(), &limits(), Prior::default());
        // No cycle yet (9 of a 10 GiB peak): spare = 40 + 10 - 12.5 = 37.5 GiB.
        assert!(!p.cycle_seen);
        assert_eq!(p.spare, 37 * GIB + 512 * MIB);
        assert_eq!(p.strand_budget, Some((p.spare as f64 * 0.1) as u64));
        let hold = 10 * GIB + (p.spare as f64 * 0.5) as u64;
        assert_eq!(
            (p.on_free_idle, p.idle_target, p.reason),
            (hold, hold - 9 * GIB, OVER_PEAK)
        );
        assert!(!p.tight && !p.pressure && !p.unmap_pages && !p.segregate);
        // The share cap: 50 GiB less the 18.75 GiB left to others, 10 GiB of it held.
        assert_eq!((p.slab_limit, p.growth), (21 * GIB + 256 * MIB, 1.0));
    }

    /// Idle memory up to the cycle's peak is kept with no spare share at all: a sample at the low
    /// point of a step (2 GiB in use of a 10 GiB peak, 8 GiB idle) keeps all 8 GiB, and frees
    /// until the next sample may leave up to the peak idle; idle memory beyond the peak (held
    /// by no cycle, as after a co-tenant) is bounded as before.
    #[test]
    fn idle_memory_up_to_the_cycles_peak_is_kept_for_the_next_cycle() {
        let mut l = limits();
        l.spare_share = 0.0; // no spare share: only the cycle keeps memory idle
        let mut s = sample();
        (s.idle, s.footprint) = (8 * GIB, 2 * GIB);
        let p = assess(&s, &l, Prior::default());
        assert_eq!(
            (p.idle_target, p.on_free_idle, p.reason),
            (8 * GIB, 10 * GIB, OVER_CYCLE)
        );
        // Stranding over the budget drops the spare share; the cycle still holds.
        s.stranded = GIB;
        assert_eq!(assess(&s, &l, Prior::default()).idle_target, 8 * GIB);
        // Under the headroom, the headroom rule still gives back what others need: 12 GiB held
        // at a 10 GiB peak leaves others 3.5 GiB at it, over the 2 GiB headroom.
        (s.free, s.reserved, s.reserved_peak, s.idle) = (GIB + 512 * MIB, 12 * GIB, 12 * GIB, 10 * GIB);
        let p = assess(&s, &l, Prior::default());
        assert_eq!(
            (p.headroom, p.idle_target, p.reason),
            (2 * GIB, 9 * GIB + 512 * MIB, UNDER_HEADROOM)
        );
        // Held beyond the peak (the peak so far was 6 GiB): bounded by the cycle.
        let mut s = sample();
        (s.idle, s.reserved_peak) = (8 * GIB, 6 * GIB);
        let p = assess(&s, &l, Prior::default());
        assert_eq!((p.idle_target, p.reason), (4 * GIB, OVER_CYCLE));
    }

    /// Once a cycle is seen, the headroom asks no more than the bounds leave others: with 1 GiB
    /// expected free at a 10.5 GiB peak and half of it left to others, 512 MiB, not the policy's
    /// 2 GiB. So 1.5 GiB free (over the 1 GiB watermark) keeps its idle memory; before the cycle
    /// the same sample gives back what brings free memory to the 2 GiB headroom.
    #[test]
    fn headroom_asks_no_more_than_the_bounds_leave_others_once_a_cycle_is_seen() {
        let l = limits();
        let mut s = sample();
        (s.free, s.idle, s.footprint_peak) = (GIB + 512 * MIB, GIB, 10 * GIB + 512 * MIB);
        let seen = Prior {
            tight: false,
            cycle_seen: true,
        };
        let p = assess(&s, &l, seen);
        assert_eq!(p.headroom, 512 * MIB);
        assert_eq!((p.idle_target, p.reason), (2 * GIB, OVER_PEAK));
        assert!(!p.unmap_pages && !p.pressure);
        let p = assess(&s, &l, Prior::default());
        assert!(!p.cycle_seen);
        assert_eq!(p.headroom, 2 * GIB);
        assert_eq!((p.idle_target, p.reason), (512 * MIB, UNDER_HEADROOM));
        // Where what is left to others is over the headroom, the headroom stands.
        s.free = 8 * GIB;
        assert_eq!(assess(&s, &l, seen).headroom, 2 * GIB);
    }

    /// The slabs take new pages only within the share cap: with 10 GiB held where the cap
    /// allows 8, none (idle pages are moved instead), though free memory less the headroom
    /// would allow 2 GiB; on a roomy device free memory less the headroom decides.
    #[test]
    fn slab_limit_stays_within_the_share_cap() {
        let mut l = limits();
        l.spare_share = 0.25;
        let mut s = sample();
        (s.free, s.idle, s.footprint, s.footprint_peak) = (4 * GIB, 8 * GIB, 2 * GIB, 6 * GIB);
        let p = assess(&s, &l, Prior::default());
        assert!(p.cycle_seen && p.reason == OVER_SHARE);
        assert_eq!((p.headroom, p.slab_limit), (2 * GIB, 0));
        // 7 GiB held (3 GiB given back): 1 GiB under the cap.
        (s.free, s.reserved, s.idle) = (7 * GIB, 7 * GIB, 5 * GIB);
        assert_eq!(assess(&s, &l, Prior::default()).slab_limit, GIB);
        // With no spare share nothing is left to others beyond the headroom's: free memory
        // less the headroom decides.
        l.spare_share = 1.0;
        assert_eq!(assess(&sample(), &l, Prior::default()).slab_limit, 38 * GIB);
    }

    /// The rules one at a time: each row changes the sample or the limits and names what the
    /// plan must then say.
    #[test]
    fn rules() {
        type Row = (
            &'static str,
            fn(&mut Sample, &mut Limits, &mut Prior),
            fn(&Plan) -> bool,
        );
        let rows: [Row; 26] = [
            (
                "cycle: footprint under half its peak after the first interval",
                |s, _, _| s.footprint = 4 * GIB,
                |p| p.cycle_seen && p.spare == 40 * GIB,
            ),
            (
                "cycle: its low point between two samples counts",
                |s, _, _| s.footprint_low = 4 * GIB,
                |p| p.cycle_seen,
            ),
            (
                "no cycle judged before the first interval",
                |s, _, _| (s.footprint, s.op) = (4 * GIB, 999),
                |p| !p.cycle_seen,
            ),
            (
                "a cycle once seen stays seen",
                |_, _, pr| pr.cycle_seen = true,
                |p| p.cycle_seen,
            ),
            (
                "guard off: no strand budget",
                |_, l, _| l.guard = false,
                |p| p.strand_budget.is_none(),
            ),
            (
                "stranding over a quarter of the budget: no spare share, idle bounded by the cycle's peak",
                // 9 GiB in use of a 9 GiB peak held: nothing idle kept at the sample, and frees
                // may leave idle what brings the held memory back to that peak.
                |s, _, _| (s.stranded, s.reserved_peak) = (GIB, 9 * GIB),
                |p| p.idle_target == 0 && p.on_free_idle == 9 * GIB && p.reason == OVER_CYCLE,
            ),
            (
                "cache bound: the peak taken as peak_growth times the peak so far, even after a cycle",
                // 50 GiB in all less 1.25 x 10 GiB, half of it over the 10 GiB peak.
                |_, _, pr| pr.cycle_seen = true,
                |p| p.cycle_seen && p.cache_bound == 28 * GIB + 768 * MIB,
            ),
            (
                "share cap: what is held stays within the peak plus spare_share of the memory beyond it",
                // Peak 6 GiB, 8 GiB beyond it (4 free, 10 held): a quarter of it allows 8 GiB
                // held, 2 in use, so 6 GiB idle of the cycle's 8; pages inside slabs go too.
                |s, l, _| {
                    ((s.free, s.idle, s.footprint, s.footprint_peak), l.spare_share) =
                        ((4 * GIB, 8 * GIB, 2 * GIB, 6 * GIB), 0.25)
                },
                |p| p.idle_target == 6 * GIB && p.reason == OVER_SHARE && p.unmap_pages && !p.pressure,
            ),
            (
                "share cap: under the headroom the headroom rule decides instead",
                // The cap would keep 5.5 GiB idle; the headroom gives back its 512 MiB short.
                |s, l, _| {
                    ((s.free, s.idle, s.footprint, s.footprint_peak), l.spare_share) =
                        ((GIB + 512 * MIB, 8 * GIB, 2 * GIB, 6 * GIB), 0.25)
                },
                |p| p.idle_target == 7 * GIB + 512 * MIB && p.reason == UNDER_HEADROOM,
            ),
            (
                "share cap: none where it would leave others no more than the headroom",
                // A quarter of the 8 GiB beyond the peak left to others: the 2 GiB headroom. The
                // cycle (a 14 GiB peak held) keeps 12 GiB idle, where a cap would keep 10.
                |s, l, _| {
                    ((s.free, s.idle, s.footprint, s.footprint_peak), l.spare_share) =
                        ((4 * GIB, 8 * GIB, 2 * GIB, 6 * GIB), 0.75);
                    s.reserved_peak = 14 * GIB;
                },
                |p| p.idle_target == 12 * GIB && p.reason == OVER_CYCLE && !p.unmap_pages,
            ),
            (
                "share cap: half of the memory beyond the peak keeps the whole cycle here",
                |s, _, _| (s.free, s.idle, s.footprint, s.footprint_peak) = (4 * GIB, 8 * GIB, 2 * GIB, 6 * GIB),
                |p| p.idle_target == 8 * GIB && p.reason == OVER_CYCLE && !p.unmap_pages,
            ),
            (
                "under the headroom: keep only what leaves free at the headroom, unmap pages",
                |s, _, _| (s.free, s.idle) = (GIB + 512 * MIB, GIB),
                |p| p.idle_target == 512 * MIB && p.reason == UNDER_HEADROOM && p.unmap_pages,
            ),
            (
                "under the low watermark: pressure, keep what leaves free at the headroom",
                |s, _, _| (s.free, s.idle) = (512 * MIB, 4 * GIB),
                |p| p.pressure && p.idle_target == 2 * GIB + 512 * MIB && p.reason == UNDER_WATERMARK && p.unmap_pages,
            ),
            (
                "a watermark over the headroom: keep what leaves free at the watermark",
                |s, l, _| ((s.free, s.idle), l.low_watermark) = ((512 * MIB, 4 * GIB), 3 * GIB),
                |p| p.pressure && p.idle_target == GIB + 512 * MIB && p.reason == UNDER_WATERMARK,
            ),
            (
                "tight needs stranding over half the budget",
                |s, _, _| (s.free, s.stranded) = (7 * GIB, 0),
                |p| !p.tight,
            ),
            (
                "tight: free under tight_below and stranding over half the budget",
                |s, _, _| (s.free, s.stranded) = (7 * GIB, 2 * GIB),
                |p| p.tight && p.segregate && p.growth == 0.25,
            ),
            (
                "a tiny device is tight on free memory alone",
                |s, l, _| (s.free, l.tiny_device) = (7 * GIB, true),
                |p| p.tight,
            ),
            (
                "tight stays below 1.5x tight_below while stranding is over a quarter",
                |s, _, pr| (s.free, s.stranded, pr.tight) = (11 * GIB + 512 * MIB, 2 * GIB, true),
                |p| p.tight,
            ),
            (
                "tight is left at 1.5x tight_below",
                |s, _, pr| (s.free, s.stranded, pr.tight) = (12 * GIB, 2 * GIB, true),
                |p| !p.tight,
            ),
            (
                "tight is left at 1.5x tight_below counting the cache's idle blocks as free",
                |s, _, pr| (s.free, s.cached_idle, s.stranded, pr.tight) = (11 * GIB, GIB, 2 * GIB, true),
                |p| !p.tight,
            ),
            (
                "not tight once the peak has recurred with a quarter of it free at the peak",
                |s, _, _| (s.free, s.stranded, s.peak_recurred) = (7 * GIB, 2 * GIB, true),
                |p| !p.tight && p.spare >= 10 * GIB / 4,
            ),
            (
                "tight is left once the peak has recurred with a quarter of it free at the peak",
                |s, _, pr| (s.free, s.stranded, s.peak_recurred, pr.tight) = (7 * GIB, 2 * GIB, true, true),
                |p| !p.tight,
            ),
            (
                "tight where the peak has recurred with less than a quarter of it free at the peak",
                |s, _, _| (s.free, s.reserved, s.stranded, s.peak_recurred) = (GIB, 11 * GIB, GIB, true),
                |p| p.tight && p.spare < 10 * GIB / 4,
            ),
            (
                "a tiny device is tight however the peak recurs",
                |s, l, _| (s.free, s.peak_recurred, l.tiny_device) = (7 * GIB, true, true),
                |p| p.tight,
            ),
            (
                "with slabs backed whole, tight however the peak recurs",
                |s, l, _| (s.free, s.stranded, s.peak_recurred, l.whole_slabs) = (7 * GIB, 2 * GIB, true, true),
                |p| p.tight,
            ),
            (
                "tight is entered on free memory alone: the cache's idle blocks do not count",
                |s, _, _| (s.free, s.cached_idle, s.stranded) = (7 * GIB, 8 * GIB, 2 * GIB),
                |p| p.tight,
            ),
        ];
        for (name, change, expect) in rows {
            let (mut s, mut l, mut prior) = (sample(), limits(), Prior::default());
            change(&mut s, &mut l, &mut prior);
            let plan = assess(&s, &l, prior);
            assert!(expect(&plan), "{name}: {plan:?}");
        }
    }

    #[test]
    fn tight_is_left_once_stranding_drains_to_a_quarter() {
        let (mut s, l) = (sample(), limits());
        s.free = 7 * GIB;
        let budget = assess(&s, &l, Prior::default()).strand_budget.unwrap();
        s.stranded = budget / 4;
        let prior = Prior {
            tight: true,
            cycle_seen: false,
        };
        assert!(!assess(&s, &l, prior).tight);
        s.stranded += 1;
        assert!(assess(&s, &l, prior).tight);
    }

    #[test]
    fn keep_cache_only_with_room_and_too_little_to_release() {
        let l = limits();
        assert!(keep_cache(4 * GIB, &l, false, MIB, GIB));
        assert!(!keep_cache(4 * GIB, &l, false, GIB, GIB), "enough to release");
        assert!(!keep_cache(GIB, &l, false, MIB, GIB), "under the headroom");
        assert!(!keep_cache(4 * GIB, &l, true, MIB, GIB), "under pressure");
    }
}
