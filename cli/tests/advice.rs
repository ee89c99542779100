//! Advice that follows the prices: the tuning report's recommendation is kept only where
//! replaying it under the device's own cost model makes it cheaper, so the same run advised
//! under two price lists can get two answers.

use std::path::Path;
use std::sync::Arc;

use adaptalloc::device::{CostCurve, CostModel, SimDevice};
use adaptalloc::policy::Policy;
use adaptalloc::report::TuningReport;
use adaptalloc::size::{ByteSize, GIB, MIB};
use adaptalloc::strategy::SlabBacking;
use adaptalloc_cli::advice::{check_advice, run_with_advice};
use adaptalloc_cli::synth::WorkloadSpec;
use adaptalloc_cli::trace::{PassTimes, ReplayMetrics};

/// The bundled training workload at 1.5x its peak, slabs a handle per page: page handles cost
/// 193 us each under the default model, and of the larger handles replayed (shaped to blocks, or sized to the memory
/// free beyond the peak the run showed, given from the first request) the advice keeps the
/// cheaper, the peak given. Under vmm-fast (7.6 us a create, but 20.8 us of access grant for
/// each page a run maps) it is kept too. On a driver where a handle and an allocation cost in
/// proportion to their bytes (7.6 us for 2 MiB, 3.9 ms a GiB) and the grant nothing, larger
/// handles and whole slabs save nothing,
/// blocks given back and created anew cost more than pages moved, and the advice is dropped.
#[test]
fn the_backing_advice_follows_the_prices() {
    let spec = WorkloadSpec::bundled("training").unwrap();
    let t = spec.generate(spec.seed);
    let capacity = t.peak_live_bytes() * 3 / 2;
    let vmm_fast = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tuning/cost-models/vmm-fast.toml");
    let advise = |cost: CostModel| {
        run_with_advice(&t, &pages(), Default::default(), || {
            Arc::new(SimDevice::builder().capacity(capacity).cost_model(cost.clone()).build())
        })
    };
    for (name, cost) in [
        ("default", CostModel::default()),
        ("vmm-fast", CostModel::from_file(&vmm_fast).unwrap()),
    ] {
        let dear = advise(cost);
        let kept = &dear.report.recommended_policy;
        assert_eq!(
            (kept.suballoc.backing, kept.bounds.expected_peak),
            (
                SlabBacking::Auto,
                Some(ByteSize(dear.report.memory.peak_footprint_bytes))
            ),
            "{name}: {:?}",
            dear.report.recommendations
        );
        let again = dear.advised.expect("kept");
        // The kept advice's reasons, as the report lists them first; blocks were replayed too.
        assert!(
            dear.changes.iter().any(|c| c.contains("bounds.expected_peak = ")),
            "{:?}",
            dear.changes
        );
        assert!(
            replayed_not_kept(&dear.report, "\"blocks\""),
            "{:?}",
            dear.report.recommendations
        );
        assert_eq!(dear.report.recommendations[..dear.changes.len()], dear.changes[..]);
        assert_eq!((dear.metrics.failed_allocs, again.failed_allocs), (0, 0));
        assert!(
            again.modeled_driver_ns * 2 < dear.metrics.modeled_driver_ns,
            "{name}: {} against {}",
            again.modeled_driver_ns,
            dear.metrics.modeled_driver_ns
        );
    }
    let mut linear = CostModel::from_file(&vmm_fast).unwrap();
    linear.vmm.set_access_ns = CostCurve::flat(0);
    linear.vmm.create_ns = CostCurve {
        points: vec![(ByteSize(2 * MIB), 7_600), (ByteSize(GIB), 7_600 * 512)],
    };
    // And a slab taken whole by one allocation no cheaper than its pages as handles.
    linear.alloc = CostCurve {
        points: vec![(ByteSize(2 * MIB), 7_600), (ByteSize(GIB), 7_600 * 512)],
    };
    let cheap = advise(linear);
    assert!(
        cheap.advised.is_none() && cheap.changes.is_empty(),
        "{:?}",
        cheap.report.recommendations
    );
    assert_eq!(cheap.report.recommended_policy.suballoc.backing, SlabBacking::Pages);
    assert!(
        cheap.report.recommendations[0].starts_with("no change: replayed"),
        "{:?}",
        cheap.report.recommendations
    );
}

/// The default policy with slabs a handle per page (`backing = "pages"`), the default before
/// one handle a slab: the run whose page creates the backing advice answers.
fn pages() -> Policy {
    let mut p = Policy::default();
    p.suballoc.backing = SlabBacking::Pages;
    p
}

/// The report names a change that its replay weighed and did not keep.
fn replayed_not_kept(report: &TuningReport, change: &str) -> bool {
    report
        .recommendations
        .iter()
        .any(|r| r.starts_with("also replayed, not kept") && r.contains(change))
}

/// A real tuning report of the bundled training workload at 1.5x its peak, slabs a handle per
/// page (its recommendation changes the backing), the run it came from, and the device's
/// capacity.
fn advice_case() -> (TuningReport, ReplayMetrics, u64) {
    use adaptalloc::Allocator;
    use adaptalloc::device::Device;
    use adaptalloc_cli::trace::replay;

    let spec = WorkloadSpec::bundled("training").unwrap();
    let t = spec.generate(spec.seed);
    let capacity = t.peak_live_bytes() * 3 / 2;
    let dev = Arc::new(SimDevice::new(capacity));
    let alloc = Allocator::with_policy(dev as Arc<dyn Device>, pages());
    let ran = replay(&t, &alloc);
    let report = alloc.report().unwrap();
    assert_ne!(
        report.recommended_policy.suballoc,
        pages().suballoc,
        "a change to judge"
    );
    (report, ran, capacity)
}

/// Fixed figures standing in for a replay: `total_ms` in all (and on the first pass), a warm-up
/// of `warmup_ms` and `steady_us` a pass after.
fn figures(total_ms: u64, warmup_ms: u64, steady_us: u64) -> ReplayMetrics {
    ReplayMetrics {
        modeled_driver_ns: total_ms * 1_000_000,
        passes: PassTimes {
            first_pass_ns: total_ms * 1_000_000,
            warmup_ns: warmup_ms * 1_000_000,
            steady_pass_ns: steady_us * 1_000,
        },
        ..ReplayMetrics::default()
    }
}

/// `report`'s advice judged by `check_advice` with the used policy's ([`pages`]) replays
/// standing as `used` and every other policy's as `advised`: the report after, and whether
/// advice was kept.
fn judged(
    report: &TuningReport,
    ran: &ReplayMetrics,
    capacity: u64,
    used: ReplayMetrics,
    advised: ReplayMetrics,
) -> (TuningReport, bool) {
    let policy = pages();
    let mut r = report.clone();
    let kept = check_advice(&mut r, &policy, ran, 0, capacity, Default::default(), |p, _| {
        if *p == policy { used } else { advised }
    });
    (r, kept.is_some())
}

/// Advice that saves the first passes but costs every later one is dropped: a training loop
/// would pay the difference on each of its steps. The same advice with no dearer a pass after
/// is kept. (Replays stood in for by fixed figures; the report is a real one.)
#[test]
fn advice_that_costs_every_later_pass_is_dropped() {
    let (report, ran, capacity) = advice_case();
    let ran = ReplayMetrics {
        modeled_driver_ns: 700_000_000,
        ..ran
    };
    for (advised_steady_us, kept) in [(1_000, false), (20, true)] {
        let (r, got) = judged(
            &report,
            &ran,
            capacity,
            figures(700, 700, 20),
            figures(260, 260, advised_steady_us),
        );
        assert_eq!(got, kept, "{:?}", r.recommendations);
        assert_eq!(r.recommends_change, kept);
        if !kept {
            assert!(
                r.recommendations[0].contains("1.00 ms a pass after"),
                "{:?}",
                r.recommendations
            );
        }
    }
}

/// Advice whose warm-up costs more is kept where its cheaper passes repay the difference within
/// the ten passes replayed (700 ms more to warm up, 80 ms less on each of nine passes: 1,180
/// against 1,600 ms in all), and dropped where they do not (1,680 against 1,600).
#[test]
fn advice_whose_dearer_warm_up_the_later_passes_repay_is_kept() {
    let (report, ran, capacity) = advice_case();
    for (advised_warmup_ms, kept) in [(1_000, true), (1_500, false)] {
        let advised = figures(advised_warmup_ms, advised_warmup_ms, 20_000);
        let (r, got) = judged(&report, &ran, capacity, figures(700, 700, 100_000), advised);
        assert_eq!(got, kept, "{:?}", r.recommendations);
        assert_eq!(r.recommends_change, kept);
        let said = r.recommendations.last().unwrap();
        let total = if kept { "1180.0 ms in all" } else { "1680.0 ms in all" };
        assert!(said.contains(total) && said.contains("against 1600.0 ms"), "{said}");
    }
}

/// Where memory ran short, the report's alternative (larger slabs) is replayed beside its
/// recommendation (segregated slabs) and the better one kept: the bundled `phase-change` at
/// 1.1x passthrough's minimum, slabs a handle per page, moved pages between slabs every step (7 ms a pass), which larger
/// slabs end, while segregated slabs cost more on every pass; the report names the one not
/// kept. A run with room and no pressure offers no alternative.
#[test]
fn where_memory_ran_short_larger_slabs_are_replayed_beside_segregated_ones() {
    use adaptalloc::device::Granularity;
    use adaptalloc_cli::compare::passthrough_min_capacity;
    use adaptalloc_cli::trace::ReplayOptions;

    let spec = WorkloadSpec::bundled("phase-change").unwrap();
    let t = spec.generate(spec.seed);
    let tight = passthrough_min_capacity(&t, Granularity::default()) * 11 / 10;
    let options = ReplayOptions {
        repeat: 10,
        ..ReplayOptions::default()
    };
    let run = run_with_advice(&t, &pages(), options, || Arc::new(SimDevice::new(tight)));
    // Beside it, the peak the run showed, given (the backing as it was: memory ran short).
    let alternatives = run.report.alternatives(&pages());
    assert_eq!(alternatives.len(), 2, "{alternatives:?}");
    let given = &alternatives[0].0;
    assert!(given.bounds.expected_peak.is_some() && given.suballoc.backing == SlabBacking::Pages);
    assert_eq!(alternatives[1].0.suballoc.growth, 1.0);
    let kept = run.advised.expect("advice kept");
    let p = &run.report.recommended_policy;
    assert_eq!(
        (p.suballoc.growth, p.suballoc.loose_growth),
        (1.0, 1.0),
        "{:?}",
        run.report.recommendations
    );
    assert!(
        replayed_not_kept(&run.report, "segregate slabs"),
        "{:?}",
        run.report.recommendations
    );
    assert_eq!(kept.failed_allocs, 0);
    assert!(
        kept.passes.steady_pass_ns * 10 < run.metrics.passes.steady_pass_ns,
        "{} against {} ns a pass",
        kept.passes.steady_pass_ns,
        run.metrics.passes.steady_pass_ns
    );
    // With room, nothing ran short: not larger slabs, but the peak the run showed, given.
    let roomy = run_with_advice(&t, &Policy::default(), options, || {
        Arc::new(SimDevice::new(t.peak_live_bytes() * 4))
    });
    let alternatives = roomy.report.alternatives(&Policy::default());
    assert_eq!(alternatives.len(), 1, "{alternatives:?}");
    assert!(alternatives[0].0.bounds.expected_peak.is_some() && alternatives[0].1.contains("never ran short"));
    assert_eq!(alternatives[0].0.suballoc.backing, SlabBacking::Auto);
    // Where the run's peak came to the device's last tenth, the peak is given with the backing
    // as it was: no handle larger than a page.
    let near = run.report.memory.peak_footprint_bytes * 21 / 20;
    let close = run_with_advice(&t, &pages(), options, || Arc::new(SimDevice::new(near)));
    // (Replayed, the peak given may be the advice kept, or an alternative beside it.)
    let mut offered = close.report.alternatives(&pages());
    offered.push((close.report.recommended_policy.clone(), "recommended".into()));
    assert!(
        offered.iter().any(|(p, _)| p.bounds.expected_peak.is_some())
            && offered.iter().all(|(p, _)| p.suballoc.backing == SlabBacking::Pages),
        "{offered:?}"
    );
}
