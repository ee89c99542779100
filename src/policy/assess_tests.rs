//! Unit tests of `assess.rs`: each rule of the engine by name, on one sample and its limits.

use super::*;
use crate::size::{GIB, MIB};

fn limits() -> Limits {
    Limits {
        headroom: 2 * GIB,
        low_watermark: GIB,
        tight_below: 8 * GIB,
        interval_ops: 1000,
        peak_growth: 1.25,
        expected_peak: None,
        strand_share: 0.1,
        spare_share: 0.5,
        guard: true,
        tiny_device: false,
        backing: SlabBacking::Pages,
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

/// A sample at a cycle's peak that came back, where what was held at the highest (11 GiB of
/// the 3 + 11 the allocator could hold) leaves 3 GiB free, over the 2 GiB headroom, with the
/// slabs stranding 1 GiB: the cycle ran with its layout.
fn ran_with_its_layout(s: &mut Sample) {
    (s.free, s.reserved, s.reserved_peak, s.stranded, s.peak_recurred) = (3 * GIB, 11 * GIB, 11 * GIB, GIB, true);
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
    // What a new slab could take without a release is free memory less the headroom, whatever
    // the cap (`Suballoc::kept_for_its_block` reads it), once the cycle is seen; before, none
    // is read.
    assert_eq!(p.device_room, 2 * GIB);
    let mut early = s;
    (early.op, early.footprint_low, early.footprint) = (0, s.footprint_peak, s.footprint_peak);
    let e = assess(&early, &l, Prior::default());
    assert!(!e.cycle_seen);
    assert_eq!(e.device_room, u64::MAX);
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
    let rows: [Row; 39] = [
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
            |p| !p.tight && p.peak_known && p.spare >= 10 * GIB / 4,
        ),
        (
            "tight is left once the peak has recurred with a quarter of it free at the peak",
            |s, _, pr| (s.free, s.stranded, s.peak_recurred, pr.tight) = (7 * GIB, 2 * GIB, true, true),
            |p| !p.tight,
        ),
        (
            "tight where the peak has recurred with less than a quarter of it free at the peak",
            |s, _, _| {
                (s.free, s.reserved, s.reserved_peak, s.stranded, s.peak_recurred) =
                    (GIB, 11 * GIB, 11 * GIB, GIB, true)
            },
            |p| p.tight && p.spare < 10 * GIB / 4,
        ),
        (
            "not tight once the cycle ran at its peak with what was held leaving the floor free",
            |s, _, _| ran_with_its_layout(s),
            |p| !p.tight && !p.peak_known,
        ),
        (
            "not tight once the cycle ran with its layout, with one handle a slab too",
            |s, l, _| {
                ran_with_its_layout(s);
                l.backing = SlabBacking::Auto;
            },
            |p| !p.tight && !p.peak_known,
        ),
        (
            "tight however the cycle ran with handles shaped to blocks",
            |s, l, _| {
                ran_with_its_layout(s);
                l.backing = SlabBacking::Blocks;
            },
            |p| p.tight,
        ),
        (
            "tight where what was held at the cycle's peak left less than the floor free",
            |s, _, _| {
                (s.free, s.reserved, s.reserved_peak, s.stranded, s.peak_recurred) =
                    (3 * GIB, 11 * GIB, 12 * GIB + 512 * MIB, GIB, true)
            },
            |p| p.tight && !p.peak_known,
        ),
        (
            "a peak given near the capacity is not a cycle that ran: tight as without it",
            |s, l, _| {
                (s.free, s.reserved, s.reserved_peak, s.stranded) = (3 * GIB, 11 * GIB, 11 * GIB, GIB);
                l.expected_peak = Some(12 * GIB);
            },
            |p| p.tight && p.peak_given && !p.peak_known,
        ),
        (
            "a tiny device is tight however the peak recurs",
            |s, l, _| (s.free, s.peak_recurred, l.tiny_device) = (7 * GIB, true, true),
            |p| p.tight,
        ),
        (
            "once the peak is known, the strand budget is all the memory expected free at it",
            |s, _, _| (s.free, s.peak_recurred) = (7 * GIB, true),
            |p| p.strand_budget == Some(p.spare),
        ),
        (
            "once the peak is known, the budget is all of it with one handle a slab too",
            |s, l, _| (s.free, s.peak_recurred, l.backing) = (7 * GIB, true, SlabBacking::Auto),
            |p| !p.tight && p.strand_budget == Some(p.spare),
        ),
        (
            "once the peak is known, handles shaped to blocks may strand all of the memory free at it",
            |s, l, _| (s.free, s.peak_recurred, l.backing) = (7 * GIB, true, SlabBacking::Blocks),
            |p| p.peak_known && p.strand_budget == Some(p.spare),
        ),
        (
            "once the peak is known, slabs in eighths may strand all of the memory free at it",
            |s, l, _| (s.free, s.peak_recurred, l.backing) = (7 * GIB, true, SlabBacking::LargeHandles),
            |p| p.peak_known && p.strand_budget == Some(p.spare),
        ),
        (
            "a strand share of 0 stays 0 once the peak is known",
            |s, l, _| (s.free, s.peak_recurred, l.strand_share) = (7 * GIB, true, 0.0),
            |p| p.strand_budget == Some(0),
        ),
        (
            "with slabs backed whole, tight however the peak recurs",
            |s, l, _| (s.free, s.stranded, s.peak_recurred, l.backing) = (7 * GIB, 2 * GIB, true, SlabBacking::Whole),
            |p| p.tight,
        ),
        (
            "tight is entered on free memory alone: the cache's idle blocks do not count",
            |s, _, _| (s.free, s.cached_idle, s.stranded) = (7 * GIB, 8 * GIB, 2 * GIB),
            |p| p.tight,
        ),
        (
            "a peak given with room: what blocks pin up to its footprint is not stranding",
            |_, l, _| l.expected_peak = Some(12 * GIB),
            |p| p.peak_given && p.peak_known && p.strand_floor == 12 * GIB,
        ),
        (
            "a peak given near the capacity: everything pinned past the live blocks' footprint counts",
            |s, l, _| (s.free, s.reserved, l.expected_peak) = (GIB, 11 * GIB, Some(11 * GIB)),
            |p| p.peak_given && !p.peak_known && p.strand_floor == 0,
        ),
        (
            "a peak learned, known with room: everything pinned past the live blocks' footprint counts",
            |s, _, _| (s.free, s.peak_recurred) = (7 * GIB, true),
            |p| !p.peak_given && p.peak_known && p.strand_floor == 0,
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

/// A peak the policy gives (`bounds.expected_peak`) is the peak from the first sample while the
/// footprint stays within it: no growth margin, the peak counted as known (not tight, the whole
/// spare as the strand budget, under `auto` too), the headroom no more than what the bounds
/// leave others; once the footprint passes it, the plan is the one without it. The plan's
/// `cycle_seen` stays what the workload showed, so the learning goes on underneath.
#[test]
fn a_given_peak_holds_until_the_footprint_passes_it() {
    let (mut s, mut l) = (sample(), limits());
    // Early in a run: 2 GiB so far, tight-looking free memory and some stranding.
    (s.footprint, s.footprint_peak, s.footprint_low, s.reserved, s.idle) = (2 * GIB, 2 * GIB, 2 * GIB, 3 * GIB, 0);
    (s.free, s.stranded, s.reserved_peak) = (7 * GIB, 2 * GIB, 3 * GIB);
    l.backing = SlabBacking::Auto;
    let learned = assess(&s, &l, Prior::default());
    assert!(!learned.peak_known && learned.tight, "{learned:?}");
    l.expected_peak = Some(8 * GIB);
    let given = assess(&s, &l, Prior::default());
    // Free at the given peak: 7 + 3 - 8 = 2 GiB, all of it the budget (a quarter of the
    // peak's free memory is what `peak_known` asks: 2 GiB of 8).
    assert_eq!(given.spare, 2 * GIB);
    assert!(given.peak_known && !given.tight, "{given:?}");
    assert_eq!(given.strand_budget, Some(2 * GIB));
    assert_eq!(given.headroom, l.headroom.min(GIB), "half the spare is left to others");
    assert!(!given.cycle_seen, "the workload has shown no cycle yet");
    // Past the given peak the engine learns as without it.
    (s.footprint, s.footprint_peak) = (9 * GIB, 9 * GIB);
    let past = assess(&s, &l, Prior::default());
    l.expected_peak = None;
    assert_eq!(past, assess(&s, &l, Prior::default()));
}
