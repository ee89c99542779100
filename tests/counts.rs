//! The allocator's own counts (`Stats::driver_allocs`, `driver_frees`, `vmm_calls`: what the C
//! ABI and the Python package report) are the driver's physical allocations and frees, handle
//! by handle, whatever maps them: pages, larger handles, moves of idle handles and second
//! mappings. Checked against SimDevice's own counts by kind (`DriverOps::physical_allocs`:
//! cuMemAlloc + cuMemCreate; `physical_frees`: cuMemFree + cuMemRelease), with one allocator
//! alone on the device. The allocator counts what succeeded; the device counts calls, those it
//! refused included.

use std::sync::Arc;

use adaptalloc::device::{CostModel, Device, DeviceStats, Granularity, SimDevice};
use adaptalloc::policy::Policy;
use adaptalloc::strategy::SlabBacking;
use adaptalloc::{Allocator, Stats};
use adaptalloc_cli::compare::passthrough_min_capacity;
use adaptalloc_cli::synth::WorkloadSpec;
use adaptalloc_cli::trace::{ReplayOptions, Trace, replay_with};

/// Replays `trace` three times on a device of `capacity` under `backing`; returns the
/// allocator's counts and the device's driver operations after the replay, and again after
/// `release_idle` gave every idle byte back.
fn run(trace: &Trace, capacity: u64, backing: SlabBacking) -> [(Stats, DeviceStats); 2] {
    let dev = Arc::new(
        SimDevice::builder()
            .capacity(capacity)
            .cost_model(CostModel::default())
            .build(),
    );
    let mut policy = Policy::default();
    policy.suballoc.backing = backing;
    let alloc = Allocator::with_policy(dev.clone() as Arc<dyn Device>, policy);
    replay_with(
        trace,
        &alloc,
        ReplayOptions {
            repeat: 3,
            ..Default::default()
        },
        |_| (),
    );
    let after_replay = (alloc.stats(), dev.stats());
    alloc.release_idle();
    [after_replay, (alloc.stats(), dev.stats())]
}

#[test]
fn the_allocators_counts_are_the_drivers_physical_allocations_and_frees() {
    let backings = [
        SlabBacking::Pages,
        SlabBacking::Blocks,
        SlabBacking::LargeHandles,
        SlabBacking::Auto,
        SlabBacking::Whole,
    ];
    let mut moved = 0;
    for name in ["training", "small-churn"] {
        let spec = WorkloadSpec::bundled(name).unwrap();
        let trace = spec.generate(spec.seed);
        let min = passthrough_min_capacity(&trace, Granularity::default());
        // The exact minimum (out-of-memory: releases, splices), 1.1x it (idle pages moved
        // where new ones would take the headroom) and twice the peak (room).
        for capacity in [min, min * 11 / 10, trace.peak_live_bytes() * 2] {
            for backing in backings {
                for (when, (s, d)) in ["after the replay", "after release_idle"]
                    .iter()
                    .zip(run(&trace, capacity, backing))
                {
                    let (at, ops) = (format!("{name}, {capacity} bytes, {backing:?}, {when}"), d.ops);
                    // The device counts the calls, those refused for want of memory included.
                    assert_eq!(
                        s.driver_allocs + d.failed_allocs,
                        ops.physical_allocs(),
                        "{at}: {ops:?}"
                    );
                    assert_eq!(s.driver_frees, ops.physical_frees(), "{at}: {ops:?}");
                    // Every mapping call maps (or unmaps) at least one handle.
                    let mapping = ops.map.calls + ops.unmap.calls;
                    assert!(s.vmm_calls <= mapping, "{at}: {} mapping calls, {ops:?}", s.vmm_calls);
                    assert_eq!(s.vmm_calls == 0, mapping == 0, "{at}");
                    moved += ops.map.calls.saturating_sub(ops.create.calls);
                }
            }
        }
    }
    // The runs went where the counts differ from the calls: handles mapped again elsewhere
    // (moves and second mappings map without a create).
    assert!(moved > 0, "no handle was moved or mapped twice");
}
