//! The engine's modes and where they send a request: what pressure gives back, when a cycle
//! counts as seen, and whether a cache miss may take a hole the slabs already hold.

mod common;

use std::sync::Arc;

use adaptalloc::device::{Device, SimDevice};
use adaptalloc::policy::{Policy, RoutingMode};
use adaptalloc::strategy::StrategyKind;
use adaptalloc::{Allocator, DevicePtr};

/// One step of a loop: `n` blocks of `bytes`, all live at once, then all freed.
fn step(alloc: &Allocator, n: usize, bytes: u64) {
    let blocks: Vec<DevicePtr> = (0..n).map(|_| alloc.allocate_raw(bytes, 0).unwrap()).collect();
    for p in blocks {
        alloc.deallocate(p, 0).unwrap();
    }
}

/// Small work (4 KiB blocks, each freed at once) until the engine samples free memory.
fn until_sampled(alloc: &Allocator) {
    for _ in 0..4096 {
        let p = alloc.allocate_raw(4096, 0).unwrap();
        alloc.deallocate(p, 0).unwrap();
    }
}

/// Under pressure (free memory under the low watermark, here after a co-tenant took memory),
/// idle memory goes back only until free memory is at the headroom again: the rest is what the
/// workload's cycle asks for next (here 64 MiB of 268 MiB goes back: an empty slab, whole).
/// Before this rule, pressure gave back every idle byte.
#[test]
fn pressure_gives_back_idle_memory_down_to_the_headroom_only() {
    let dev = Arc::new(SimDevice::new(1 << 30));
    let alloc = Allocator::adaptive(dev.clone() as Arc<dyn Device>);
    let headroom = alloc.report().unwrap().memory.headroom_bytes;
    // A step holding fifteen 64 MiB blocks, four of them freed at its end: 256 MiB idle.
    let blocks: Vec<DevicePtr> = (0..15).map(|_| alloc.allocate_raw(64 << 20, 0).unwrap()).collect();
    for &p in &blocks[..4] {
        alloc.deallocate(p, 0).unwrap();
    }
    let idle = alloc.stats().idle_bytes.current;
    assert!(idle >= 256 << 20, "{idle} B idle");
    // A co-tenant leaves 16 MiB free: under the 3% watermark (about 31 MiB) and the headroom.
    let free = dev.capacity() - dev.used_bytes();
    dev.tenant_take(1, free - (16 << 20)).unwrap();
    until_sampled(&alloc);
    let report = alloc.report().unwrap();
    let (idle_after, free_after) = (alloc.stats().idle_bytes.current, dev.capacity() - dev.used_bytes());
    common::figure(&format!(
        "pressure with {} MiB idle: {} MiB free after (headroom {} MiB), {} MiB still idle",
        idle >> 20,
        free_after >> 20,
        headroom >> 20,
        idle_after >> 20
    ));
    assert!(report.pressure_events >= 1, "{report}");
    assert!(free_after >= headroom, "{free_after} B free, headroom {headroom} B");
    // Empty slabs go back whole: one 64 MiB slab may pass what the headroom needed.
    assert!(
        idle_after >= idle - (headroom - (16 << 20)) - (64 << 20),
        "{idle_after} B idle of {idle}, {free_after} B free: more went back than the headroom needed"
    );
    assert_eq!(dev.tenant_failures(), 0);
    for &p in &blocks[4..] {
        alloc.deallocate(p, 0).unwrap();
    }
}

/// A cycle is seen at its low point wherever the samples fall: a loop of four 256 MiB blocks
/// (8 operations a step) in slabs alone, with no driver call once warm, is sampled every 1,024
/// operations at the same phase, its peak. Judged only at samples, the cycle was never seen
/// and free memory stayed sampled at the base rate (98 cuMemGetInfo calls in 100,000
/// operations); judged at its lowest between samples, the gap grows as for any calm loop.
#[test]
fn a_cycle_is_seen_whatever_the_phase_of_the_samples() {
    let dev = Arc::new(SimDevice::new(8 << 30));
    let mut policy = Policy::default();
    policy.routing.mode = RoutingMode::Suballoc;
    let alloc = Allocator::with_policy(dev.clone() as Arc<dyn Device>, policy);
    let run = |steps: u64| {
        for _ in 0..steps {
            step(&alloc, 4, 256 << 20);
        }
    };
    run(2_500);
    let calls = || {
        let s = alloc.stats();
        (s.driver_allocs, s.driver_frees, s.vmm_calls)
    };
    let (before, allocs) = (dev.stats().mem_info_calls, calls());
    run(12_500);
    let samples = dev.stats().mem_info_calls - before;
    common::figure(&format!(
        "a phase-locked loop, 100,000 operations: {samples} cuMemGetInfo calls"
    ));
    assert_eq!(calls(), allocs, "no driver call once warm: nothing shifts the phase");
    assert!(samples <= 10, "{samples} samples: the cycle was not seen");
}

/// A cache miss is served from a hole in the slabs before the driver is asked (outside tight
/// mode): 24 MiB blocks, cached once the engine has seen their class (one size, always reused,
/// at most four live), and 36-48 MiB blocks of varied sizes that stay in slabs. A fifth 24 MiB
/// block while four are live misses the cache; the 48 MiB hole a freed slab block left, its
/// pages still mapped, takes it with no driver call. Before, the miss was a cuMemAlloc.
#[test]
fn a_cache_miss_takes_a_slab_hole_before_the_driver() {
    let dev = Arc::new(SimDevice::new(1 << 30));
    let alloc = Allocator::with_policy(dev.clone() as Arc<dyn Device>, Policy::default());
    let four = || -> Vec<DevicePtr> { (0..4).map(|_| alloc.allocate_raw(24 << 20, 0).unwrap()).collect() };
    for i in 0..800u64 {
        let a = four();
        let b = alloc.allocate_raw((36 + 4 * (i % 4)) << 20, 0).unwrap();
        alloc.deallocate(b, 0).unwrap();
        for p in a {
            alloc.deallocate(p, 0).unwrap();
        }
    }
    let report = alloc.report().unwrap();
    let route = |class: &str| report.classes.iter().find(|c| c.class == class).map(|c| c.route);
    assert_eq!(route("16MiB..32MiB"), Some(StrategyKind::Caching), "{report}");
    assert_eq!(route("32MiB..64MiB"), Some(StrategyKind::Suballoc), "{report}");
    // A 48 MiB slab block freed: its hole stays mapped (the cycle's memory).
    let b = alloc.allocate_raw(48 << 20, 0).unwrap();
    alloc.deallocate(b, 0).unwrap();
    let a = four();
    let before = dev.stats().ops;
    let fifth = alloc.allocate_raw(24 << 20, 0).unwrap();
    let ops = dev.stats().ops.since(&before);
    assert_eq!(
        (ops.alloc.calls, ops.create.calls, ops.map.calls),
        (0, 0, 0),
        "the fifth 24 MiB block took a driver call"
    );
    for p in a.into_iter().chain([fifth]) {
        alloc.deallocate(p, 0).unwrap();
    }
    assert_eq!(alloc.stats().failed_allocs, 0);
}

/// In tight mode a cache miss goes to the driver, not into a slab hole: small classes are
/// cached there so that the pages their slab blocks pin can drain. On a device of 7 pages
/// (tight on free memory alone) filled to under `bounds.tight_below` with 64 KiB slab blocks,
/// every other one freed (holes in pinned pages), new 64 KiB requests take cached blocks or new
/// cuMemAlloc ones, never the holes.
#[test]
fn in_tight_mode_a_cache_miss_goes_to_the_driver() {
    let dev = Arc::new(SimDevice::new(14 << 20));
    let alloc = Allocator::adaptive(dev.clone() as Arc<dyn Device>);
    let blocks: Vec<DevicePtr> = (0..150).map(|_| alloc.allocate_raw(64 << 10, 0).unwrap()).collect();
    for &p in blocks.iter().step_by(2) {
        alloc.deallocate(p, 0).unwrap();
    }
    let report = alloc.report().unwrap();
    assert!(
        report.route_changes.iter().any(|c| c.to == StrategyKind::Caching),
        "not tight: {report}"
    );
    let slab_hits = || {
        let s = alloc.stats();
        s.per_strategy
            .iter()
            .find(|(k, _)| *k == StrategyKind::Suballoc)
            .unwrap()
            .1
            .hits
    };
    let (hits, before) = (slab_hits(), dev.stats().ops);
    // Past whatever the cache holds: every request a hit or a new exact-size block.
    let more: Vec<DevicePtr> = (0..40).map(|_| alloc.allocate_raw(64 << 10, 0).unwrap()).collect();
    let ops = dev.stats().ops.since(&before);
    assert_eq!(slab_hits(), hits, "a miss took a slab hole in tight mode");
    assert!(ops.alloc.calls > 0, "no miss at all: {ops:?}");
    for p in more {
        alloc.deallocate(p, 0).unwrap();
    }
    for &p in blocks.iter().skip(1).step_by(2) {
        alloc.deallocate(p, 0).unwrap();
    }
    assert_eq!(alloc.stats().failed_allocs, 0);
}

/// What the allocator holds stays within the workload's peak footprint plus `bounds.spare_share`
/// (half) of the memory beyond it: three phases of four blocks each (60, 120, then 30 MiB, the
/// peak 480 MiB) leave each phase's memory idle, and on an 896 MiB device a co-tenant then
/// takes 200 MiB, under half of the 416 MiB passthrough would leave free. Keeping every phase's
/// memory for its return once left the co-tenant 168 MiB.
#[test]
fn a_co_tenant_finds_half_of_what_passthrough_leaves_free() {
    let dev = Arc::new(SimDevice::new(896 << 20));
    let alloc = Allocator::adaptive(dev.clone() as Arc<dyn Device>);
    for mib in [60u64, 120, 30] {
        for _ in 0..300 {
            step(&alloc, 4, mib << 20);
        }
    }
    until_sampled(&alloc);
    let free = dev.capacity() - dev.used_bytes();
    common::figure(&format!(
        "three phases, peak 480 MiB, on 896 MiB: {} MiB held, {} MiB free",
        alloc.stats().reserved_bytes.current >> 20,
        free >> 20
    ));
    assert!(
        dev.tenant_take(1, 200 << 20).is_ok(),
        "{free} B free: the co-tenant was starved"
    );
    // The workload goes on beside it.
    for mib in [60u64, 120, 30] {
        step(&alloc, 4, mib << 20);
    }
    assert_eq!(dev.tenant_failures(), 0);
}
