//! Workload profiles (`ADAPTALLOC_PROFILE`, `adaptalloc::profile`) through the allocator: a
//! run writes the peak it showed when it is dropped; the next run of the same workload is
//! given that peak from its first request.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use adaptalloc::Allocator;
use adaptalloc::device::{CostModel, Device, SimDevice};
use adaptalloc::policy::Policy;
use adaptalloc::profile::{Applied, Profile, apply_file};
use adaptalloc::size::GIB;
use adaptalloc_cli::synth::WorkloadSpec;
use adaptalloc_cli::trace::{ReplayMetrics, ReplayOptions, Trace, parse_csv, replay_with};

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("adaptalloc-profile-test-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join("job.toml")
}

/// One run of `trace` (three passes) on a fresh device of `capacity` bytes priced by `cost`,
/// with the profile at `path` read first and updated when the allocator is dropped, as
/// `from_env` does.
fn run_priced(trace: &Trace, capacity: u64, path: &Path, cost: CostModel) -> (Option<Applied>, ReplayMetrics) {
    run_under(trace, capacity, path, cost, Policy::default())
}

/// [`run_priced`] with `policy` before the profile is applied.
fn run_under(
    trace: &Trace,
    capacity: u64,
    path: &Path,
    cost: CostModel,
    mut policy: Policy,
) -> (Option<Applied>, ReplayMetrics) {
    let dev = Arc::new(SimDevice::builder().capacity(capacity).cost_model(cost).build());
    let applied = apply_file(path, &mut policy, capacity).unwrap();
    let alloc = Allocator::with_policy(dev.clone() as Arc<dyn Device>, policy);
    alloc.set_profile_path(Some(path.to_path_buf()), applied.is_some_and(Applied::gave_peak));
    let m = replay_with(
        trace,
        &alloc,
        ReplayOptions {
            repeat: 3,
            ..Default::default()
        },
        |i| dev.advance_clock(i),
    );
    drop(alloc);
    (applied, m)
}

/// [`run_priced`] under the default cost model.
fn run(trace: &Trace, capacity: u64, path: &Path) -> (Option<Applied>, ReplayMetrics) {
    run_priced(trace, capacity, path, CostModel::default())
}

/// The second run made at most 1/`parts` of the first's physical driver allocations.
fn assert_allocs_cut(first: &ReplayMetrics, second: &ReplayMetrics, parts: u64) {
    let (a, b) = (first.driver_ops.physical_allocs(), second.driver_ops.physical_allocs());
    assert!(
        b * parts <= a,
        "physical allocations: {b} in the second run against {a} in the first"
    );
}

/// The bundled training workload at twice its peak live, with slabs a handle per page
/// (`backing = "pages"`): the first run backs its slabs with 2 MiB pages while it learns its
/// peak; the second, given that peak by the profile the first wrote, backs each slab by one
/// handle, creates a tenth of the handles or fewer, fails nothing, and counts itself. Under the
/// default (one handle a slab already) the second run is given the peak and costs no more.
#[test]
fn a_second_run_given_the_profile_creates_far_fewer_handles() {
    let spec = WorkloadSpec::bundled("training").unwrap();
    let trace = spec.generate(spec.seed);
    let capacity = 2 * trace.peak_live_bytes().div_ceil(2 << 20) * (2 << 20);
    let path = scratch("second");
    let _ = std::fs::remove_file(&path);
    let (_, first) = run(&trace, capacity, &path);
    let (applied, second) = run(&trace, capacity, &path);
    assert!(applied.is_some_and(Applied::gave_peak), "{applied:?}");
    assert_eq!((first.failed_allocs, second.failed_allocs), (0, 0));
    assert!(second.modeled_driver_ns <= first.modeled_driver_ns);
    std::fs::remove_file(&path).unwrap();

    let mut pages = Policy::default();
    pages.suballoc.backing = adaptalloc::strategy::SlabBacking::Pages;
    let run = |trace: &Trace, capacity: u64, path: &Path| {
        run_under(trace, capacity, path, CostModel::default(), pages.clone())
    };
    let (applied, first) = run(&trace, capacity, &path);
    assert_eq!(applied, None, "no file yet: nothing applied");
    let p = Profile::read(&path).unwrap().expect("the first run wrote a profile");
    assert_eq!((p.device_total_bytes, p.runs, p.give_peak), (capacity, 1, true));
    assert!(p.peak_footprint_bytes >= trace.peak_live_bytes() && p.peak_footprint_bytes < capacity);

    let (applied, second) = run(&trace, capacity, &path);
    assert_eq!(applied, Some(Applied::Peak(p.peak_footprint_bytes)));
    assert_eq!((first.failed_allocs, second.failed_allocs), (0, 0));
    assert_allocs_cut(&first, &second, 10);
    assert!(second.modeled_driver_ns * 5 < first.modeled_driver_ns);
    let p2 = Profile::read(&path).unwrap().unwrap();
    assert_eq!(
        (p2.runs, p2.peak_footprint_bytes, p2.give_peak),
        (2, p.peak_footprint_bytes, true)
    );
    std::fs::remove_dir_all(path.parent().unwrap()).unwrap();
}

/// A profile made on another device is not used there; the run's end replaces it with one for
/// the device it ran on.
#[test]
fn a_profile_from_another_device_is_replaced() {
    let spec = WorkloadSpec::bundled("training").unwrap();
    let trace = spec.generate(spec.seed);
    let path = scratch("other");
    let _ = std::fs::remove_file(&path);
    run(&trace, 80 * GIB, &path);
    let (applied, m) = run(&trace, 40 * GIB, &path);
    assert_eq!(applied, Some(Applied::OtherDevice { profiled: 80 * GIB }));
    assert_eq!(m.failed_allocs, 0);
    let p = Profile::read(&path).unwrap().unwrap();
    assert_eq!((p.device_total_bytes, p.runs), (40 * GIB, 1));
    std::fs::remove_dir_all(path.parent().unwrap()).unwrap();
}

/// Given the peak, a slab that one handle would back whole is that handle under every price
/// list, never one driver allocation, though under the default model (A100 handle prices, a GiB
/// handle 1 ms) an allocation would cost less: out of memory, a handle can be split and give
/// back what its live blocks do not touch; an allocation cannot. No request fails.
#[test]
fn whole_slabs_are_handles_whatever_the_prices() {
    let spec = WorkloadSpec::bundled("training").unwrap();
    let trace = spec.generate(spec.seed);
    let capacity = 2 * trace.peak_live_bytes().div_ceil(2 << 20) * (2 << 20);
    let path = scratch("prices");
    let _ = std::fs::remove_file(&path);
    run(&trace, capacity, &path);
    let vmm_fast = Path::new(env!("CARGO_MANIFEST_DIR")).join("tuning/cost-models/vmm-fast.toml");
    for (name, cost) in [
        ("default", CostModel::default()),
        ("vmm-fast", CostModel::from_file(&vmm_fast).unwrap()),
    ] {
        let (applied, m) = run_priced(&trace, capacity, &path, cost);
        assert!(applied.is_some_and(Applied::gave_peak), "{name}: {applied:?}");
        let ops = m.driver_ops;
        assert_eq!(m.failed_allocs, 0, "{name}");
        let (allocs, creates) = (ops.alloc.calls, ops.create.calls);
        assert!(
            creates >= 5 && allocs == 0,
            "{name}: {allocs} allocations, {creates} handles"
        );
    }
    std::fs::remove_dir_all(path.parent().unwrap()).unwrap();
}

/// Free memory under the low watermark alone does not withhold the peak: the bundled
/// `small-churn` at 1.5x its peak live (a 20 MiB device its footprint fills to two thirds)
/// dips under it with the idle memory the policy keeps, and recovers no out-of-memory. Given the
/// peak, its second run makes a small fraction of the first's driver allocations, and fails
/// nothing.
#[test]
fn pressure_alone_does_not_withhold_the_peak() {
    let spec = WorkloadSpec::bundled("small-churn").unwrap();
    let trace = spec.generate(spec.seed);
    let capacity = (3 * trace.peak_live_bytes() / 2).div_ceil(2 << 20) * (2 << 20);
    let path = scratch("pressure");
    let _ = std::fs::remove_file(&path);
    let (_, first) = run(&trace, capacity, &path);
    let p = Profile::read(&path).unwrap().unwrap();
    assert!(!p.ran_short, "no request failed, no out-of-memory was recovered");
    let (applied, second) = run(&trace, capacity, &path);
    assert_eq!(applied, Some(Applied::Peak(p.peak_footprint_bytes)));
    assert_eq!((first.failed_allocs, second.failed_allocs), (0, 0));
    assert_allocs_cut(&first, &second, 20);
    std::fs::remove_dir_all(path.parent().unwrap()).unwrap();
}

/// A run that recovered an out-of-memory withholds the peak: two 24 MiB blocks freed and kept
/// idle, then a 40 MiB one on a 64 MiB device (a footprint of three quarters of it), served after
/// idle memory went back. Given the peak, such a run's whole slabs and cached blocks have been
/// seen to trade memory every pass (`gpu-medium-ctx128-infer` at 2x peak live, 11.3 ms a pass),
/// so later runs keep pages.
#[test]
fn a_recovered_out_of_memory_withholds_the_peak() {
    let mut csv = String::from("op,timestamp_ns,ptr,size,stream\n");
    let mib = 1u64 << 20;
    for step in 0..3u64 {
        let t = |i: u64| (step * 6 + i) * 1000;
        for (i, (op, ptr, size)) in [
            ("alloc", 0x1000_0000u64, 24 * mib),
            ("alloc", 0x2000_0000, 24 * mib),
            ("free", 0x1000_0000, 24 * mib),
            ("free", 0x2000_0000, 24 * mib),
            ("alloc", 0x3000_0000, 40 * mib),
            ("free", 0x3000_0000, 40 * mib),
        ]
        .into_iter()
        .enumerate()
        {
            csv.push_str(&format!("{op},{},{ptr:#x},{size},0\n", t(i as u64)));
        }
    }
    let trace = parse_csv(csv.as_bytes(), "oom.csv", false).unwrap();
    let path = scratch("oom");
    let _ = std::fs::remove_file(&path);
    let (_, first) = run(&trace, 64 * mib, &path);
    assert_eq!(first.failed_allocs, 0);
    let p = Profile::read(&path).unwrap().unwrap();
    assert!(
        p.peak_footprint_bytes * 10 <= 64 * mib * 9,
        "within nine tenths of the device"
    );
    assert!(p.ran_short, "an out-of-memory was recovered");
    let (applied, second) = run(&trace, 64 * mib, &path);
    assert_eq!(applied, Some(Applied::NearCapacity));
    assert_eq!(second.failed_allocs, 0);
    std::fs::remove_dir_all(path.parent().unwrap()).unwrap();
}
