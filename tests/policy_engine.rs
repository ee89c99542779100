//! The policy engine's behaviour: headroom kept free, co-tenants not starved by idle memory,
//! routes that follow a phase change, idle memory that ages out, and a tuning report.

mod common;

use common::all_traces;

use std::sync::Arc;

use adaptalloc::device::{CostModel, Device, Granularity, SimDevice, TenantAction};
use adaptalloc::policy::Policy;
use adaptalloc::size::ByteSize;
use adaptalloc::strategy::{SlabBacking, StrategyKind};
use adaptalloc::{Allocator, DevicePtr};
use adaptalloc_cli::compare::passthrough_min_capacity;
use adaptalloc_cli::synth::WorkloadSpec;
use adaptalloc_cli::trace::{Op, ReplayOptions, replay_with};

/// After every operation, free device memory is at least the headroom, unless the allocator
/// holds nothing it could give back (live blocks, and free space inside their slabs, leave no
/// room for it).
#[test]
fn idle_memory_respects_the_headroom() {
    for t in all_traces() {
        let cap = passthrough_min_capacity(&t, Granularity::default()) * 12 / 10;
        let dev = Arc::new(SimDevice::new(cap));
        let alloc = Allocator::adaptive(dev.clone() as Arc<dyn Device>);
        let headroom = alloc.report().unwrap().memory.headroom_bytes;
        let mut live: std::collections::HashMap<u64, DevicePtr> = Default::default();
        for e in &t.events {
            match e.op {
                Op::Alloc => {
                    if let Ok(p) = alloc.allocate_raw(e.size, e.stream) {
                        live.insert(e.id, p);
                    }
                }
                Op::Free => {
                    if let Some(p) = live.remove(&e.id) {
                        alloc.deallocate(p, e.stream).unwrap();
                    }
                }
            }
            let free = dev.capacity() - dev.used_bytes();
            let releasable = alloc.stats().releasable_idle_bytes;
            assert!(
                free >= headroom || releasable == 0,
                "{}: {free} B free < headroom {headroom} B while {releasable} B idle could be released",
                t.name
            );
        }
    }
}

/// A co-tenant takes the policy's headroom in the middle of the run (30% to 70% of the events):
/// it never fails, because the allocator never sits on idle memory the tenant needs. Unbounded
/// caching, run the same way, does starve it on some workload (so the test can fail).
#[test]
fn a_co_tenant_within_the_headroom_never_fails() {
    let mut unbounded_failures = 0;
    for t in all_traces() {
        // Room for the live blocks, the headroom and some slack.
        let cap = passthrough_min_capacity(&t, Granularity::default()) * 3 / 2;
        for policy in [Policy::default(), Policy::preset("benchmark-unbounded").unwrap()] {
            let headroom = Policy::default().bounds.headroom.resolve(cap);
            let n = t.events.len() as u64;
            let dev = Arc::new(
                SimDevice::builder()
                    .capacity(cap)
                    .tenants(vec![
                        TenantAction::Take {
                            at: n * 3 / 10,
                            tag: 1,
                            bytes: headroom,
                        },
                        TenantAction::Release { at: n * 7 / 10, tag: 1 },
                    ])
                    .build(),
            );
            let unbounded = policy.routing.mode != adaptalloc::policy::RoutingMode::Adaptive;
            let alloc = Allocator::with_policy(dev.clone() as Arc<dyn Device>, policy);
            let m = replay_with(&t, &alloc, ReplayOptions::default(), |i| dev.advance_clock(i));
            if unbounded {
                unbounded_failures += dev.tenant_failures();
            } else {
                assert_eq!(dev.tenant_failures(), 0, "{}: the co-tenant was starved", t.name);
                assert_eq!(m.failed_allocs, 0, "{}", t.name);
            }
        }
    }
    assert!(
        unbounded_failures > 0,
        "unbounded caching should starve the co-tenant somewhere"
    );
}

/// Training-like repeated sizes, then serving with varying lengths: the workspace class is
/// cached during training and re-routed when serving brings varied sizes into it, and the idle
/// memory training left behind is given back.
#[test]
fn a_phase_change_reroutes_and_gives_idle_memory_back() {
    let spec = WorkloadSpec::bundled("phase-change").unwrap();
    let trace = spec.generate(spec.seed);
    let dev = Arc::new(SimDevice::new(16 << 30));
    let mut policy = Policy::default();
    // The phases are short (3,192 events): decide every 256 operations, age idle memory after 2,000.
    policy.routing.interval_ops = 256;
    policy.bounds.idle_age_ops = 2000;
    let alloc = Allocator::with_policy(dev.clone() as Arc<dyn Device>, policy);
    let m = replay_with(&trace, &alloc, ReplayOptions::default(), |_| {});
    assert_eq!(m.failed_allocs, 0);
    let report = alloc.report().unwrap();
    let to_cache = report.route_changes.iter().find(|r| r.to == StrategyKind::Caching);
    let away = to_cache.and_then(|c| {
        report
            .route_changes
            .iter()
            .find(|r| r.class == c.class && r.op > c.op && r.from == StrategyKind::Caching)
    });
    assert!(
        to_cache.is_some() && away.is_some(),
        "route changes: {:#?}",
        report.route_changes
    );
    assert!(
        report.bytes_released_by_bounds > 0,
        "idle memory aged out: {:#?}",
        report.decisions
    );
    // The text report explains both.
    let text = report.to_string();
    assert!(
        text.contains("## Route changes") && text.contains("-> caching") && text.contains("aged out"),
        "{text}"
    );
}

#[test]
fn the_report_compares_with_passthrough_and_recommends_a_loadable_policy() {
    let spec = WorkloadSpec::bundled("training").unwrap();
    let trace = spec.generate(spec.seed);
    let dev = Arc::new(SimDevice::new(80 << 30));
    let alloc = Allocator::adaptive(dev.clone() as Arc<dyn Device>);
    // The allocator's first sample (a memory query) comes before the replay.
    let before = dev.stats().ops.calls();
    let m = replay_with(
        &trace,
        &alloc,
        ReplayOptions {
            repeat: 2,
            ..Default::default()
        },
        |_| {},
    );
    let r = alloc.report().unwrap();
    assert_eq!(r.requests, 2 * trace.allocs() as u64);
    assert_eq!(
        (r.driver.driver_calls, r.driver.driver_allocs, r.driver.driver_frees),
        (before + m.driver_calls, m.driver_allocs, m.driver_frees),
        "the report counts what the replay counts"
    );
    assert_eq!(
        r.driver.driver_calls,
        r.driver.by_kind.iter().map(|k| k.calls).sum::<u64>()
    );
    assert!(r.driver.saved_ns > 0);
    assert!(r.classes.iter().map(|c| c.requests).sum::<u64>() == r.requests);
    let toml = r.to_toml().unwrap();
    assert!(toml.contains("[recommended_policy.routing]"), "{toml}");
    let again = Policy::from_toml_str(&r.recommended_policy.to_toml(), "recommended.toml").unwrap();
    assert_eq!(again, r.recommended_policy);
    let json: serde_json::Value = serde_json::from_str(&r.to_json()).unwrap();
    assert!(json["classes"].as_array().unwrap().len() > 2);
}

/// Idle memory over the idle bound that is free space inside slabs holding live blocks cannot
/// go back; the bound must not strip the cache of a block that is reused all the time instead
/// (each strip costs a driver free and a driver allocation, and idle stays over the bound).
#[test]
fn the_idle_bound_does_not_strip_a_hot_cache_for_stranded_slab_space() {
    let dev = Arc::new(SimDevice::new(1 << 30));
    let alloc = Allocator::adaptive(dev.clone() as Arc<dyn Device>);
    // About 300 MiB of holes between live 3 MiB blocks, none of it releasable while the device
    // has room.
    let blocks: Vec<DevicePtr> = (0..200).map(|_| alloc.allocate_raw(3 << 20, 0).unwrap()).collect();
    for p in blocks.iter().step_by(2) {
        alloc.deallocate(*p, 0).unwrap();
    }
    let s = alloc.stats();
    assert!(
        s.idle_bytes.current > (1 << 30) / 4,
        "idle {} over the bound",
        s.idle_bytes.current
    );
    // Two hot classes (4 and 8 KiB, used in turn, so one block is always cached when the
    // bounds are checked): warm them, then count driver allocations over many bound checks.
    let hot = |n: usize| {
        for _ in 0..n {
            for size in [4096, 8192] {
                let p = alloc.allocate_raw(size, 0).unwrap();
                alloc.deallocate(p, 0).unwrap();
            }
        }
    };
    hot(2048);
    let before = alloc.stats().driver_allocs;
    hot(8192);
    let made = alloc.stats().driver_allocs - before;
    assert!(
        made <= 2,
        "{made} driver allocations for two hot blocks over 32k operations"
    );
    for p in blocks.iter().skip(1).step_by(2) {
        alloc.deallocate(*p, 0).unwrap();
    }
}

/// At passthrough's exact minimum the allocator runs out of memory and falls back on held
/// memory (no driver call): a block it hands out must lie on mapped pages, and its accounting
/// must stay whole (releasable idle never over idle).
#[test]
fn out_of_memory_fallback_hands_out_only_mapped_memory() {
    let t = WorkloadSpec::bundled("training").expect("bundled").generate(1);
    let dev = Arc::new(SimDevice::new(passthrough_min_capacity(&t, Granularity::default())));
    let alloc = Allocator::adaptive(dev.clone() as Arc<dyn Device>);
    let mut live: std::collections::HashMap<u64, (DevicePtr, u64)> = Default::default();
    let mut failed = 0;
    for e in &t.events {
        match e.op {
            Op::Alloc => match alloc.allocate_raw(e.size, e.stream) {
                Ok(p) => {
                    assert!(dev.is_backed(p, e.size), "block {p:#x}+{} over unmapped pages", e.size);
                    live.insert(e.id, (p, e.size));
                }
                Err(_) => failed += 1,
            },
            Op::Free => {
                if let Some((p, _)) = live.remove(&e.id) {
                    alloc.deallocate(p, e.stream).unwrap();
                }
            }
        }
        let s = alloc.stats();
        assert!(s.releasable_idle_bytes <= s.idle_bytes.current, "accounting: {s:?}");
    }
    assert!(live.values().all(|&(p, n)| dev.is_backed(p, n)));
    println!("FIGURE: training at passthrough's exact minimum: {failed} failed allocations");
}

/// A serving loop: a 6 MiB KV-cache block per request lives for three requests (so slabs keep
/// live blocks), and four 24 MiB activations per request are freed at its end. Once warm, the
/// slabs serve both classes without a driver call. Both qualify for caching (one size, every
/// request finds a freed block), but cached blocks beside the slab holes they leave would take
/// what is held past the cache bound, and the idle bound would strip them again: with the move, 48
/// driver calls over the 600 warm requests. The classes stay in slabs and the warm loop makes
/// none.
#[test]
fn a_class_the_slabs_serve_without_driver_calls_is_not_moved_into_a_stripped_cache() {
    let dev = Arc::new(SimDevice::new(512 << 20));
    // No share of the memory beyond the peak (idle memory bounded by what is held at the
    // workload's peak): in this small loop the default's allowance (bounds.spare_share)
    // keeps the moved blocks too. On the inference traces it does not: repeated 5 times at 2x
    // peak live, the 17 workloads make 8,381 driver calls with the move and 901 without.
    let mut policy = Policy::default();
    policy.bounds.spare_share = 0.0;
    let alloc = Allocator::with_policy(dev.clone() as Arc<dyn Device>, policy);
    let mut kv: std::collections::VecDeque<DevicePtr> = Default::default();
    let mut request = || {
        kv.push_back(alloc.allocate_raw(6 << 20, 0).unwrap());
        let acts: Vec<DevicePtr> = (0..4).map(|_| alloc.allocate_raw(24 << 20, 0).unwrap()).collect();
        for p in acts {
            alloc.deallocate(p, 0).unwrap();
        }
        if kv.len() > 3 {
            alloc.deallocate(kv.pop_front().unwrap(), 0).unwrap();
        }
    };
    // Warm up over several routing intervals (1,024 operations each).
    for _ in 0..600 {
        request();
    }
    let before = alloc.stats();
    for _ in 0..600 {
        request();
    }
    let after = alloc.stats();
    let calls = |s: &adaptalloc::Stats| s.driver_allocs + s.driver_frees + s.vmm_calls;
    let calls = calls(&after) - calls(&before);
    let report = alloc.report().unwrap();
    assert!(
        calls == 0,
        "{calls} driver calls over 600 warm requests; route changes: {:#?}",
        report.route_changes
    );
    assert_eq!(after.failed_allocs, 0);
}

/// Serves `requests` requests of four 96 MiB activations on a 1 GiB device under `policy`: at
/// each request's end 384 MiB is idle, over a quarter of the device. Returns the report, the
/// physical allocations and frees and mapping calls after the first request, and the most
/// memory held.
fn serve_large_activations(policy: Policy, requests: usize) -> (adaptalloc::report::TuningReport, u64, u64) {
    let dev = Arc::new(SimDevice::new(1 << 30));
    let alloc = Allocator::with_policy(dev.clone() as Arc<dyn Device>, policy);
    let calls = |s: &adaptalloc::Stats| s.driver_allocs + s.driver_frees + s.vmm_calls;
    let mut first = 0;
    for i in 0..requests {
        let acts: Vec<DevicePtr> = (0..4).map(|_| alloc.allocate_raw(96 << 20, 0).unwrap()).collect();
        for p in acts {
            alloc.deallocate(p, 0).unwrap();
        }
        if i == 0 {
            first = calls(&alloc.stats());
        }
    }
    let s = alloc.stats();
    (alloc.report().unwrap(), calls(&s) - first, s.reserved_bytes.peak)
}

/// Idle memory bounded by what is held at the workload's peak (no share of the memory beyond
/// it).
fn no_share_beyond_the_peak() -> Policy {
    let mut p = Policy::default();
    p.bounds.spare_share = 0.0;
    p
}

/// Idle memory aged out after 1,000 operations (the default waits 200,000), with slabs a
/// handle per page: each release a bound makes costs a create a page when the memory comes
/// back (with one handle a slab, one create: 21 over 20 steps here, and no advice).
fn aged_out_early() -> Policy {
    let mut p = no_share_beyond_the_peak();
    p.bounds.idle_age_ops = 1000;
    p.suballoc.backing = SlabBacking::Pages;
    p
}

/// A step that holds a 384 MiB buffer, then 3,000 operations of small work: the buffer's
/// memory sits idle past an early age-out every step. Returns the report and the driver calls.
fn buffer_then_small_work(policy: Policy, steps: usize) -> (adaptalloc::report::TuningReport, u64) {
    let dev = Arc::new(SimDevice::new(1 << 30));
    let alloc = Allocator::with_policy(dev.clone() as Arc<dyn Device>, policy);
    for _ in 0..steps {
        let big = alloc.allocate_raw(384 << 20, 0).unwrap();
        alloc.deallocate(big, 0).unwrap();
        for _ in 0..1500 {
            let p = alloc.allocate_raw(4096, 0).unwrap();
            alloc.deallocate(p, 0).unwrap();
        }
    }
    let calls = dev.stats().ops.calls();
    (alloc.report().unwrap(), calls)
}

/// What one request frees is kept for the next: idle memory up to what the allocator held at
/// its peak (384 MiB) stays, whatever the spare share says. Before that rule, the retired
/// `bounds.max_idle` (then 256 MiB here) gave back 128 MiB after every request and asked for it
/// again (hundreds of driver calls).
#[test]
fn what_a_cycle_frees_is_kept_for_the_next() {
    let (report, calls, held) = serve_large_activations(Policy::default(), 300);
    let (_, alone, _) = serve_large_activations(no_share_beyond_the_peak(), 300);
    common::figure(&format!(
        "four 96 MiB activations per request, 300 requests on 1 GiB: {calls} driver calls after \
         the first request (no share beyond the peak: {alone}), most held {} MiB",
        held >> 20
    ));
    assert_eq!(report.failed_allocs, 0);
    for (what, c) in [("default", calls), ("no share beyond the peak", alone)] {
        assert!(
            c == 0,
            "{what}: {c} driver calls: the activations should be kept: {report}"
        );
    }
    let peak = 384u64 << 20;
    assert!(held <= peak + ((1u64 << 30) - peak) / 2, "held {held} B");
}

/// Idle memory released by a bound and asked for again (here aged out after 1,000
/// operations, every step): the report recommends a larger `bounds.spare_share` and a later
/// age-out, and the recommended policy, fed back, makes a tenth of the driver calls.
#[test]
fn the_report_recommends_a_larger_idle_bound_when_the_bound_costs_driver_calls() {
    let (report, calls) = buffer_then_small_work(aged_out_early(), 20);
    assert!(
        report.bytes_released_by_bounds > 0 && report.driver.calls_ratio > 0.1,
        "{report}"
    );
    let used = aged_out_early().bounds.spare_share;
    let recommended = report.recommended_policy.clone();
    let share = recommended.bounds.spare_share;
    assert!(
        share > used && recommended.bounds.idle_age_ops >= 100_000,
        "recommended spare_share {share} vs {used}: {:?}",
        report.recommendations
    );
    let (again, fewer) = buffer_then_small_work(recommended, 20);
    common::figure(&format!(
        "a 384 MiB buffer a step aged out after 1,000 operations, 20 steps: {calls} driver calls; with the recommended policy {fewer}"
    ));
    assert_eq!(again.failed_allocs, 0);
    assert!(
        fewer * 10 < calls,
        "the recommended policy: {fewer} driver calls vs {calls}"
    );
}

/// Slabs mapped page by page (`backing = "pages"`) on a device the run never came near filling:
/// the report recommends whole slabs, and the recommendation fed back maps no page and takes less modelled
/// driver time, failing nothing. On a device the run comes near filling without running short,
/// it recommends the peak the run showed, given from the first request, with slabs in handles
/// the memory free beyond it covers, which also fail nothing and cost less; on one it fills to
/// the last tenth, neither.
#[test]
fn the_report_recommends_whole_slabs_where_pages_bought_nothing() {
    let run = |policy: Policy, capacity: u64| {
        let spec = WorkloadSpec::bundled("training").unwrap();
        let t = spec.generate(spec.seed);
        let dev = Arc::new(SimDevice::new(capacity));
        let alloc = Allocator::with_policy(dev.clone() as Arc<dyn Device>, policy);
        let m = adaptalloc_cli::trace::replay(&t, &alloc);
        (alloc.report().unwrap(), m, dev.stats().ops.create.calls)
    };
    let paged = common::pages_policy();
    // The run with slabs a handle per page, its report's backing, and the recommendation fed
    // back: (creates, modelled ms) of both runs, the second failing nothing.
    let advised = |capacity: u64, want: SlabBacking| {
        let (report, m, creates) = run(paged.clone(), capacity);
        let p = &report.recommended_policy;
        assert!(creates > 0 && m.failed_allocs == 0);
        assert_eq!(p.suballoc.backing, want, "{:?}", report.recommendations);
        let (_, again, creates_again) = run(p.clone(), capacity);
        assert_eq!(again.failed_allocs, 0);
        common::figure(&format!(
            "training on {}: {creates} pages created, {:.1} ms modelled; with the recommended {want:?} {creates_again}, {:.1} ms",
            ByteSize(capacity),
            m.modeled_driver_ns as f64 / 1e6,
            again.modeled_driver_ns as f64 / 1e6
        ));
        (
            (creates, creates_again),
            (m.modeled_driver_ns, again.modeled_driver_ns),
            report,
        )
    };
    let ((_, creates), (first_ns, again_ns), report) = advised(32 << 30, SlabBacking::Whole);
    assert!(report.recommendations.iter().any(|r| r.contains("back slabs whole")));
    assert_eq!(creates, 0);
    assert!(again_ns * 2 < first_ns);
    // One it comes near filling without running short (1.5x its peak): no whole slabs, but
    // the peak it showed, given, and handles sized for the memory free beyond it: fewer creates
    // and a tenth of the time.
    let ((pages, handles), (first_ns, again_ns), report) = advised(9_340_000_000, SlabBacking::Auto);
    assert!(
        handles * 10 < pages && again_ns * 10 < first_ns,
        "{handles} vs {pages}, {again_ns} vs {first_ns}"
    );
    let peak = report.memory.peak_footprint_bytes;
    assert_eq!(report.recommended_policy.bounds.expected_peak, Some(ByteSize(peak)));
    // The default backs each slab by one handle already: the advice gives the peak alone.
    let (auto, _, _) = run(Policy::default(), 9_340_000_000);
    let p = &auto.recommended_policy;
    assert_eq!(p.suballoc.backing, SlabBacking::Auto, "{:?}", auto.recommendations);
    assert_eq!(p.bounds.expected_peak, Some(ByteSize(auto.memory.peak_footprint_bytes)));
    // A device the run fills to its last tenth (1.1x its peak): pages stay.
    let (full, _, _) = run(paged, 6_850_000_000);
    assert_eq!(full.recommended_policy.suballoc.backing, SlabBacking::Pages);
    // A live run's report (written at exit, with no trace to replay) says its advice was not
    // replayed, after the changes it recommends; one that recommends none adds nothing.
    let (mut live, _, _) = run(Policy::default(), 32 << 30);
    let changes = live.recommendations.len();
    live.note_not_replayed();
    assert_eq!(live.recommendations.len(), changes + 1);
    assert!(live.recommendations[changes].starts_with("not replayed: a live run"));
    let mut fits = run(live.recommended_policy.clone(), 32 << 30).0;
    assert!(!fits.recommends_change, "{:?}", fits.recommendations);
    let before = fits.recommendations.clone();
    fits.note_not_replayed();
    assert_eq!(fits.recommendations, before);
}

/// Peaks reset between steps (`reset_peak_stats`) leave the tuning report's whole-run peaks: a
/// run that reset its peaks after freeing everything once read "peak live / reserved 0B /
/// 100MiB (104857600.00x)" and was advised to halve slab growth.
#[test]
fn the_report_keeps_whole_run_peaks_across_peak_resets() {
    let dev = Arc::new(SimDevice::new(1 << 30));
    let alloc = Allocator::adaptive(dev as Arc<dyn Device>);
    let p = alloc.allocate_raw(100 << 20, 0).unwrap();
    alloc.deallocate(p, 0).unwrap();
    alloc.reset_peaks();
    assert_eq!(alloc.stats().live_bytes.peak, 0, "the user's peak restarts");
    let r = alloc.report().unwrap();
    assert_eq!(r.memory.peak_live_bytes, 100 << 20);
    assert!(r.memory.reserved_over_live < 1.5, "{}", r.memory.reserved_over_live);
    assert!(!r.to_string().contains("slab growth"), "{r}");
}

/// A run whose driver time passed passthrough's modelled time says so: "lost", never "saved
/// 0.0 ms". One 1 GiB request, mapped in 2 MiB pages (512 creates), against one cudaMalloc.
#[test]
fn a_loss_against_passthrough_is_printed_as_a_loss() {
    let dev = Arc::new(SimDevice::new(16 << 30));
    let alloc = Allocator::adaptive(dev as Arc<dyn Device>);
    let p = alloc.allocate_raw(1 << 30, 0).unwrap();
    alloc.deallocate(p, 0).unwrap();
    let r = alloc.report().unwrap();
    assert!(r.driver.saved_ns < 0, "{}", r.driver.saved_ns);
    let text = r.to_string();
    assert!(text.contains("; lost ") && !text.contains("saved 0.0 ms"), "{text}");
}

/// Free memory is sampled less often while nothing but the allocator changes it, and at the
/// base rate again once something else does. A steady cycle on a roomy device (four 256 MiB
/// blocks a step on 8 GiB) makes a few cuMemGetInfo calls in 100,000 operations, not one per
/// `bounds.mem_info_interval_ops` (97); a co-tenant that then takes all but 1.5 times the
/// headroom is seen at the next sample, and with free memory under twice the headroom every
/// later gap is the base one while it stays there (the first may come up to 32,768
/// operations late, and releases of idle memory may lift free memory over it again).
#[test]
fn free_memory_is_sampled_less_while_nothing_else_changes_it() {
    let dev = Arc::new(SimDevice::new(8 << 30));
    let alloc = Allocator::adaptive(dev.clone() as Arc<dyn Device>);
    let samples = || dev.stats().mem_info_calls;
    let run = |ops: u64| {
        for _ in 0..ops / 8 {
            let blocks: Vec<_> = (0..4).map(|_| alloc.allocate_raw(256 << 20, 0).unwrap()).collect();
            for p in blocks {
                alloc.deallocate(p, 0).unwrap();
            }
        }
    };
    run(20_000);
    let before = samples();
    run(100_000);
    let calm = samples() - before;
    let headroom = alloc.report().unwrap().memory.headroom_bytes;
    let taken = dev.capacity() - dev.used_bytes() - headroom * 3 / 2;
    dev.tenant_take(1, taken).unwrap();
    let before = samples();
    run(100_000);
    let after = samples() - before;
    common::figure(&format!(
        "cuMemGetInfo calls in 100,000 operations: {calm} while calm, {after} after a co-tenant took {} MiB",
        taken >> 20
    ));
    assert!(calm <= 10, "{calm} samples while nothing else changed free memory");
    assert!(
        after >= 40,
        "{after} samples once a co-tenant left free memory under twice the headroom"
    );
    assert_eq!(dev.tenant_failures(), 0);
}

/// Slabs a handle per page (`backing = "pages"`): pages are moved where the prices say a move
/// is cheaper than a create (and a release elsewhere), and created where they say it is not: the engine reads the prices the device
/// has shown (`DriverOps::recycling_pays`). The bundled training workload at 1.1x passthrough's
/// minimum, 10 passes: under the default model (a move about 63 us, a create and a release 203)
/// thousands of idle pages are moved where new ones would have taken the headroom, and fewer
/// are created and released; under vmm-fast.toml (33 against 18) none is moved.
#[test]
fn pages_are_moved_or_created_as_the_prices_say() {
    let spec = WorkloadSpec::bundled("training").unwrap();
    let t = spec.generate(spec.seed);
    let cap = passthrough_min_capacity(&t, Granularity::default()) * 11 / 10;
    let vmm_fast = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tuning/cost-models/vmm-fast.toml");
    let run = |cost: CostModel| {
        let dev = Arc::new(SimDevice::builder().capacity(cap).cost_model(cost).build());
        let alloc = Allocator::with_policy(dev.clone() as Arc<dyn Device>, common::pages_policy());
        let m = replay_with(
            &t,
            &alloc,
            ReplayOptions {
                repeat: 10,
                ..Default::default()
            },
            |_| (),
        );
        assert_eq!(m.failed_allocs, 0);
        let ops = dev.stats().ops;
        // Every page created is mapped once; a move maps without a create.
        (ops.map.calls - ops.create.calls, ops.create.calls, ops.release.calls)
    };
    let (moved, created, released) = run(CostModel::default());
    let (fast_moved, fast_created, fast_released) = run(CostModel::from_file(&vmm_fast).unwrap());
    common::figure(&format!(
        "training at 1.1x passthrough's minimum, 10 passes: default model {moved} pages moved, {created} \
         created, {released} released; vmm-fast {fast_moved} moved, {fast_created} created, {fast_released} released"
    ));
    assert!(moved * 4 > created, "default model: {moved} moved, {created} created");
    assert_eq!(fast_moved, 0, "vmm-fast: a create is cheaper than a move");
    assert!(created * 4 < fast_created * 3 && released * 4 < fast_released * 3);
}

/// A co-tenant that takes half the slack passthrough leaves (the device less passthrough's peak
/// footprint) just after the first training step ends finds it free: the footprint's first fall
/// under half its peak is sampled at once, so the bound that leaves others half the memory
/// beyond the peak holds from the end of the first step. Sampled only every
/// `bounds.mem_info_interval_ops`, bundled `training` at 1.2x and 1.3x peak live still held its
/// first step's 6.61 and 7.03 GiB when the co-tenant came (40% of three passes' events, 490
/// operations into the second), and refused it.
#[test]
fn a_co_tenant_after_the_first_step_finds_half_the_slack() {
    use adaptalloc_cli::compare::{Capacity, CompareOptions, Contender, TenantSpec, run_one};
    let spec = WorkloadSpec::bundled("training").unwrap();
    let t = spec.generate(spec.seed);
    let g = Granularity::default();
    for factor in [1.2, 1.3] {
        let capacity = Capacity::Factor(factor).bytes_for(t.peak_live_bytes(), g.large_granule);
        let slack = capacity - passthrough_min_capacity(&t, g);
        let bytes = slack / 2 / g.large_granule * g.large_granule;
        let opts = CompareOptions {
            repeat: 3,
            tenant: Some(TenantSpec {
                bytes,
                start: 0.4,
                end: 0.6,
            }),
            ..CompareOptions::default()
        };
        let r = run_one(&t, Contender::Adaptive, capacity, &opts);
        common::figure(&format!(
            "training at {factor}x peak live, a co-tenant of {} MiB after the first step: {} refused",
            bytes >> 20,
            r.tenant_failures
        ));
        assert_eq!((r.tenant_failures, r.failed_allocs), (0, 0), "training at {factor}x");
    }
}
