//! Reliability: driver faults at seeded random points on every trace and set-up, many threads
//! on one allocator, and parsers fed garbage. Figures are printed for RELIABILITY.md.

mod common;
mod stream_harness;

use common::all_traces;

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use adaptalloc::device::{CostModel, FaultPlan, SimDevice};
use adaptalloc::policy::Policy;
use adaptalloc::{AllocError, Allocator, Device, DeviceError, DevicePtr};
use adaptalloc_cli::synth::WorkloadSpec;
use adaptalloc_cli::trace::{Op, parse_csv, parse_rmm, parse_snapshot};
use common::{Setup, all_configs, check_invariants};
use proptest::prelude::*;

fn build(dev: &Arc<SimDevice>, setup: Setup) -> Allocator {
    common::allocator(dev, setup)
}

/// Fails driver allocations at seeded random points (several rates) on every trace and every
/// set-up: invariants hold (checked every 64 events and at the end), every failure reaches the
/// caller as a typed out-of-memory error naming the injected fault, and nothing leaks.
#[test]
fn injected_faults_never_corrupt_or_leak() {
    let (mut events, mut faults, mut failures) = (0u64, 0u64, 0u64);
    // Every trace, and a multi-stream variant of it (30% of its blocks on a second stream,
    // never synchronized).
    for t in all_traces().into_iter().flat_map(|t| [t.split_streams(0.3), t]) {
        let cap = t.peak_live_bytes() * 2 + (64 << 20);
        for (rate_i, rate) in [0.002, 0.02, 0.1].into_iter().enumerate() {
            for (name, setup) in all_configs() {
                let dev = Arc::new(
                    SimDevice::builder()
                        .capacity(cap)
                        .cost_model(CostModel::zero())
                        .faults(FaultPlan {
                            rate,
                            seed: 17 + rate_i as u64,
                            ..Default::default()
                        })
                        .build(),
                );
                let alloc = build(&dev, setup);
                let mut live: HashMap<u64, (DevicePtr, u64, u64)> = HashMap::new();
                for (i, e) in t.events.iter().enumerate() {
                    match e.op {
                        Op::Alloc => match alloc.allocate_raw(e.size, e.stream) {
                            Ok(p) => {
                                live.insert(e.id, (p, e.size, e.stream));
                            }
                            Err(AllocError::OutOfMemory {
                                cause: DeviceError::InjectedFault { .. },
                                ..
                            }) => failures += 1,
                            Err(other) => panic!("{} {name} rate {rate}: untyped failure {other:?}", t.name),
                        },
                        Op::Free => {
                            if let Some((p, _, s)) = live.remove(&e.id) {
                                alloc.deallocate(p, s).unwrap();
                            }
                        }
                    }
                    if i % 64 == 0 {
                        let l: Vec<_> = live.values().copied().collect();
                        check_invariants(name, &alloc, &dev, &l);
                    }
                }
                let l: Vec<_> = live.values().copied().collect();
                check_invariants(name, &alloc, &dev, &l);
                events += t.events.len() as u64;
                faults += dev.stats().failed_allocs;
                drop(alloc);
                assert_eq!(dev.leak_report().blocks, 0, "{} {name} rate {rate}: leak", t.name);
            }
        }
    }
    common::figure(&format!(
        "{events} events replayed under faults, {faults} driver failures injected, {failures} reached callers"
    ));
    assert!(faults > 0 && failures > 0);
}

/// A single injected driver failure, wherever it lands, never reaches a caller of the default
/// allocator: releasing idle memory and retrying succeeds.
#[test]
fn the_default_absorbs_any_single_driver_failure() {
    let spec = WorkloadSpec::bundled("phase-change").unwrap();
    let trace = spec.generate(spec.seed);
    let calls = {
        let dev = Arc::new(
            SimDevice::builder()
                .capacity(16 << 30)
                .cost_model(CostModel::zero())
                .build(),
        );
        let alloc = Allocator::adaptive(dev.clone() as Arc<dyn Device>);
        adaptalloc_cli::trace::replay(&trace, &alloc);
        dev.stats().driver_allocs
    };
    for nth in 1..=calls {
        let dev = Arc::new(
            SimDevice::builder()
                .capacity(16 << 30)
                .cost_model(CostModel::zero())
                .faults(FaultPlan {
                    fail_nth: vec![nth],
                    ..Default::default()
                })
                .build(),
        );
        let alloc = Allocator::with_policy(dev.clone() as Arc<dyn Device>, Policy::default());
        let m = adaptalloc_cli::trace::replay(&trace, &alloc);
        assert_eq!(
            m.failed_allocs, 0,
            "fault on driver allocation #{nth} reached the caller"
        );
    }
}

/// Threads on one allocator, each on its own stream, allocating and freeing at random: no two
/// live blocks overlap (checked against a shared map at every allocation), no bytes are lost,
/// no deadlock. `cargo test` runs 8 threads x 20,000 operations; the full 8 x 1,000,000 runs
/// with `cargo test --release --test reliability -- --ignored`.
fn hammer(threads: u64, ops: u64) {
    let dev = Arc::new(
        SimDevice::builder()
            .capacity(1 << 40)
            .cost_model(CostModel::zero())
            .build(),
    );
    let alloc = Allocator::adaptive(dev.clone() as Arc<dyn Device>);
    let map: Arc<Mutex<BTreeMap<DevicePtr, u64>>> = Arc::default();
    let start = std::time::Instant::now();
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (alloc, map) = (alloc.clone(), map.clone());
            std::thread::spawn(move || {
                let mut rng = common::Rng(t + 1);
                let mut mine: Vec<(DevicePtr, u64)> = Vec::new();
                for _ in 0..ops {
                    if mine.len() < 64 && (mine.is_empty() || rng.below(2) == 0) {
                        let size = rng.size(8 << 20);
                        let p = alloc.allocate_raw(size, t).expect("room for all");
                        let mut m = map.lock().unwrap();
                        if let Some((&q, &len)) = m.range(..=p).next_back() {
                            assert!(q + len <= p, "overlap: {q:#x}+{len} and {p:#x}");
                        }
                        if let Some((&q, _)) = m.range(p..).next() {
                            assert!(p + size <= q, "overlap: {p:#x}+{size} and {q:#x}");
                        }
                        m.insert(p, size);
                        drop(m);
                        mine.push((p, size));
                    } else {
                        let (p, _) = mine.swap_remove(rng.below(mine.len() as u64) as usize);
                        map.lock().unwrap().remove(&p);
                        alloc.deallocate(p, t).unwrap();
                    }
                }
                for (p, _) in mine {
                    map.lock().unwrap().remove(&p);
                    alloc.deallocate(p, t).unwrap();
                }
            })
        })
        .collect();
    for h in handles {
        h.join().expect("no thread panicked");
    }
    let secs = start.elapsed().as_secs_f64();
    common::figure(&format!(
        "{threads} threads x {ops} operations on one allocator: {:.0} ops/s in all (with the test's own shared overlap map)",
        (threads * ops) as f64 / secs
    ));
    let st = alloc.stats();
    assert_eq!((st.live_blocks.current, st.live_bytes.current), (0, 0));
    drop(alloc);
    assert_eq!(dev.leak_report().blocks, 0, "no bytes lost");
}

#[test]
fn threads_share_one_allocator_safely() {
    hammer(8, 20_000);
}

#[test]
#[ignore = "the full run: 8 threads x 1,000,000 operations (about 4 s in release on 2 cores)"]
fn threads_share_one_allocator_safely_full() {
    hammer(8, 1_000_000);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// The trace and policy parsers turn any bytes into a value or a typed error, never a panic.
    #[test]
    fn parsers_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512), lines in proptest::collection::vec("[a-z0-9x,._:@ -]{0,40}", 0..8)) {
        let _ = parse_csv(&bytes, "fuzz.csv", false);
        let _ = parse_rmm(&bytes, "fuzz.log", true);
        let _ = parse_snapshot(&bytes, "fuzz.pickle");
        let mut pickle = vec![0x80, 0x04];
        pickle.extend_from_slice(&bytes);
        let _ = parse_snapshot(&pickle, "fuzz.pickle");
        let text = lines.join("\n");
        let _ = parse_csv(format!("op,timestamp_ns,ptr,size,stream\n{text}").as_bytes(), "fuzz.csv", true);
        let _ = parse_rmm(format!("Thread,Time,Action,Pointer,Size,Stream\n{text}").as_bytes(), "fuzz.log", false);
        let _ = Policy::from_toml_str(&text, "fuzz.toml");
        let _ = Policy::from_toml_str(&String::from_utf8_lossy(&bytes), "fuzz.toml");
        let _ = adaptalloc::profile::Profile::from_toml_str(&text, "fuzz.toml");
        let _ = adaptalloc::profile::Profile::from_toml_str(&String::from_utf8_lossy(&bytes), "fuzz.toml");
    }
}

/// A co-tenant grabs memory mid-run so free memory falls under the headroom: the default gives
/// its idle memory back within the longest sampling gap (bounds.mem_info_interval_ops times
/// `MEM_INFO_BACKOFF`, the most the gap grows while nothing else changes free memory), on every
/// trace.
#[test]
fn idle_memory_goes_back_within_a_bounded_number_of_operations() {
    let interval = Policy::default().bounds.mem_info_interval_ops * adaptalloc::policy::MEM_INFO_BACKOFF;
    let mut worst = 0u64;
    for t in all_traces() {
        let cap = t.peak_live_bytes() * 2 + (64 << 20);
        let dev = Arc::new(SimDevice::builder().capacity(cap).cost_model(CostModel::zero()).build());
        let alloc = Allocator::adaptive(dev.clone() as Arc<dyn Device>);
        let headroom = alloc.report().unwrap().memory.headroom_bytes;
        let mut live: HashMap<u64, (DevicePtr, u64)> = HashMap::new();
        let grab_at = t.events.len() / 2;
        let mut since: Option<u64> = None;
        for (i, e) in t.events.iter().enumerate() {
            if i == grab_at {
                // Take all but a sliver of what is free: free memory falls under the headroom.
                // (Whole driver pages: the co-tenant's allocation is rounded up to them.)
                let free = dev.capacity() - dev.used_bytes();
                let page = dev.granularity_model().large_granule;
                dev.tenant_take(1, free.saturating_sub(headroom / 4) / page * page)
                    .unwrap();
                since = Some(0);
            }
            match e.op {
                Op::Alloc => {
                    if let Ok(p) = alloc.allocate_raw(e.size, e.stream) {
                        live.insert(e.id, (p, e.stream));
                    }
                }
                Op::Free => {
                    if let Some((p, s)) = live.remove(&e.id) {
                        alloc.deallocate(p, s).unwrap();
                    }
                }
            }
            if let Some(n) = since.as_mut() {
                *n += 1;
                let free = dev.capacity() - dev.used_bytes();
                if free >= headroom || alloc.stats().releasable_idle_bytes == 0 {
                    worst = worst.max(*n);
                    since = None;
                } else {
                    assert!(
                        *n <= interval + 1,
                        "{}: idle memory still held {n} operations after the grab",
                        t.name
                    );
                }
            }
        }
    }
    common::figure(&format!(
        "idle memory given back at most {worst} operations after a co-tenant's grab (bound {interval})"
    ));
}

const HARNESS_CHILD: &str = "ADAPTALLOC_STREAM_HARNESS_VMM";
/// Steps per configuration (12 of them: VMM on and off x default, suballoc and caching x stream
/// handles ascending and descending); ADAPTALLOC_STREAM_HARNESS_STEPS overrides it.
const HARNESS_STEPS: u64 = 250_000;

/// The stream harness (tests/stream_harness): random interleavings on the stub libcuda across
/// 96 streams, every hand-out checked against a shadow of the kernels still using freed memory.
/// No block may go to another stream before the work queued on it before its free is done, and
/// no page may be unmapped while a kernel uses it. Runs in two child processes on the stub (VMM
/// on and off), at the same time.
#[test]
fn no_block_is_handed_out_before_its_work_is_done() {
    const NAME: &str = "no_block_is_handed_out_before_its_work_is_done";
    if let Ok(vmm) = std::env::var(HARNESS_CHILD) {
        return harness_child(&vmm);
    }
    let Some(dir) = common::stub::stub_or_skip("harness") else {
        return;
    };
    let children: Vec<_> = ["1", "0"]
        .into_iter()
        .map(|vmm| {
            let dir = dir.clone();
            std::thread::spawn(move || {
                let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
                cmd.args(["--exact", NAME, "--nocapture", "--test-threads", "1"])
                    .env(HARNESS_CHILD, vmm)
                    .env("STUB_CUDA_VMM", vmm);
                common::stub::run_on_stub(&mut cmd, &dir, 32 << 20)
            })
        })
        .collect();
    let results: Vec<_> = children.into_iter().map(|c| c.join().unwrap()).collect();
    for (_, text) in &results {
        for line in text.lines().filter_map(|l| l.strip_prefix("FIGURE: ")) {
            common::figure(line);
        }
    }
    for (ok, text) in &results {
        assert!(ok, "the harness found unsafe reuse:\n{text}");
    }
    std::fs::remove_dir_all(&dir).ok();
}

/// The harness in a child on the stub, VMM as `vmm` says: every set-up, stream handles both ways.
fn harness_child(vmm: &str) {
    use stream_harness::{Setup, run};
    let steps = std::env::var("ADAPTALLOC_STREAM_HARNESS_STEPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(HARNESS_STEPS);
    let hooks = common::stub::stub_hooks();
    let mut bad = Vec::new();
    let start = std::time::Instant::now();
    for (i, setup) in Setup::ALL.into_iter().enumerate() {
        for descending in [false, true] {
            let seed = 0x5eed + 2 * i as u64 + descending as u64 + if vmm == "1" { 100 } else { 0 };
            let o = run(&hooks, setup, descending, steps, seed);
            let order = if descending { "descending" } else { "ascending" };
            common::figure(&format!(
                "stream harness, VMM {vmm}, {setup:?}, handles {order}: {} steps, {} hand-outs, {} kernels, {} out of memory, {} stream reclaims, {} stream waits, {} unsafe hand-outs, {} unsafe unmaps",
                o.steps,
                o.handouts,
                o.kernels,
                o.out_of_memory,
                o.stream_reclaims,
                o.stream_waits,
                o.unsafe_handouts,
                o.unsafe_unmaps
            ));
            if o.unsafe_handouts > 0 || o.unsafe_unmaps > 0 {
                bad.push(format!("VMM {vmm}, {setup:?}, {order}: {:?}", o.first));
            }
        }
    }
    common::figure(&format!(
        "stream harness, VMM {vmm}: {:.1} s",
        start.elapsed().as_secs_f64()
    ));
    assert!(bad.is_empty(), "unsafe reuse:\n{}", bad.join("\n"));
}

/// Idle pages moved where new ones would take the headroom (the default policy under the
/// default cost model, where a move is cheaper than a create and a release) keep every
/// invariant: no two live blocks share device memory, every live block is backed, the device
/// holds exactly what the allocator reserves, and nothing fails where passthrough completes.
/// Every trace and bundled workload at 1.05x passthrough's minimum, two passes, checked every
/// 16 events. Moves are counted as calls to cuMemMap beyond cuMemCreate (the few second
/// mappings of spliced blocks count there too), so the test cannot pass without thousands.
#[test]
fn moved_pages_keep_every_invariant() {
    let mut moved = 0;
    for t in all_traces() {
        let cap = adaptalloc_cli::compare::passthrough_min_capacity(&t, adaptalloc::device::Granularity::default())
            * 105
            / 100;
        let dev = Arc::new(SimDevice::builder().capacity(cap).build());
        let alloc = Allocator::adaptive(dev.clone() as Arc<dyn Device>);
        for pass in 0..2 {
            let mut live: HashMap<u64, (DevicePtr, u64, u64)> = HashMap::new();
            for (i, e) in t.events.iter().enumerate() {
                match e.op {
                    Op::Alloc => {
                        let p = alloc
                            .allocate_raw(e.size, e.stream)
                            .unwrap_or_else(|err| panic!("{} pass {pass} event {i}: {err}", t.name));
                        live.insert(e.id, (p, e.size, e.stream));
                    }
                    Op::Free => {
                        if let Some((p, _, s)) = live.remove(&e.id) {
                            alloc.deallocate(p, s).unwrap();
                        }
                    }
                }
                if i % 16 == 0 {
                    let l: Vec<_> = live.values().copied().collect();
                    check_invariants("adaptive-moves", &alloc, &dev, &l);
                }
            }
            for (p, _, s) in live.into_values() {
                alloc.deallocate(p, s).unwrap();
            }
        }
        let ops = dev.stats().ops;
        moved += ops.map.calls - ops.create.calls;
        drop(alloc);
        assert_eq!(dev.leak_report().blocks, 0, "{}: leak", t.name);
    }
    common::figure(&format!(
        "pages moved at 1.05x passthrough's minimum, all workloads: {moved}"
    ));
    assert!(moved >= 1000, "{moved} pages moved: the test checks little");
}
