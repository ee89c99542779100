//! Peer allocators (the `peers` feature) as replay targets and `compare` contenders:
//! `cargo test --release --features peers --test peers`.
#![cfg(feature = "peers")]

#[path = "../../tests/common/mod.rs"]
mod common;

use std::sync::Arc;

use adaptalloc::device::Device;
use adaptalloc::size::{GIB, TIB};
use adaptalloc_cli::compare::{CompareOptions, Contender, run_one};
use adaptalloc_cli::peers::GpuAllocPeer;
use adaptalloc_cli::synth::{BUNDLED, WorkloadSpec};
use adaptalloc_cli::trace::{ReplayTarget, replay};
use common::sim;

#[test]
fn gpu_alloc_replays_every_bundled_workload_and_returns_every_byte() {
    for (name, _) in BUNDLED {
        let trace = WorkloadSpec::bundled(name).expect("bundled").generate(1);
        let dev = sim(TIB);
        let peer = GpuAllocPeer::new(dev.clone() as Arc<dyn Device>);
        let m = replay(&trace, &peer);
        assert_eq!(m.failed_allocs, 0, "{name}");
        assert_eq!(m.peak_live_bytes, trace.peak_live_bytes(), "{name}");
        assert!(m.peak_reserved_bytes >= m.peak_live_bytes, "{name}");
        let c = peer.counters();
        assert_eq!(c.live_bytes, 0, "{name}: the replay frees everything");
        assert_eq!(
            c.driver_allocs,
            dev.stats().driver_allocs,
            "{name}: every driver call counted"
        );
        drop(peer);
        assert_eq!(
            dev.leak_report().blocks,
            0,
            "{name}: dropping the peer frees its chunks"
        );
    }
}

#[test]
fn gpu_alloc_blocks_never_overlap() {
    let dev = sim(TIB);
    let peer = GpuAllocPeer::new(dev as Arc<dyn Device>);
    let sizes = [256u64, 1000, 64 << 10, 3 << 20, 40 << 20, 256, 512 << 10];
    let mut blocks: Vec<(u64, u64)> = (0..200)
        .map(|i| {
            let bytes = sizes[i % sizes.len()];
            (peer.allocate(bytes, 0).expect("room"), bytes)
        })
        .collect();
    blocks.sort();
    for w in blocks.windows(2) {
        assert!(w[0].0 + w[0].1 <= w[1].0, "{:?} overlaps {:?}", w[0], w[1]);
        assert_eq!(w[0].0 % 256, 0);
    }
    for (p, _) in blocks {
        peer.deallocate(p, 0);
    }
}

#[test]
fn gpu_alloc_reports_failure_when_the_device_is_full() {
    let dev = sim(GIB);
    let peer = GpuAllocPeer::new(dev as Arc<dyn Device>);
    let a = peer.allocate(GIB / 2, 0).expect("half fits");
    assert_eq!(
        peer.allocate(GIB, 0),
        None,
        "more than the device is refused, not a panic"
    );
    peer.deallocate(a, 0);
    assert!(peer.allocate(GIB / 2, 0).is_some(), "usable after a refusal");
}

#[test]
fn compare_runs_gpu_alloc_beside_ours() {
    assert!(Contender::all().contains(&Contender::GpuAlloc));
    assert_eq!(Contender::parse("gpu-alloc"), Some(Contender::GpuAlloc));
    let trace = WorkloadSpec::bundled("training").expect("bundled").generate(1);
    let r = run_one(
        &trace,
        Contender::GpuAlloc,
        4 * trace.peak_live_bytes(),
        &CompareOptions::default(),
    );
    assert_eq!(r.strategy, "gpu-alloc");
    assert!(r.completed);
    assert!(r.driver_allocs > 0);
}
