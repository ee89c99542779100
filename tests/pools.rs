//! Private pools (CUDA graph capture) on the simulated device: a block of a pool is never
//! handed out outside it, nothing is given back and no stream waited on while a pool is being
//! allocated to, and a released pool's memory goes back once its last block is freed. Also the
//! memory cap (PyTorch's `set_per_process_memory_fraction`).

use std::sync::Arc;

use adaptalloc::device::SimDevice;
use adaptalloc::rng::SplitMix64;
use adaptalloc::{AllocError, Allocator, Device, DeviceError, DevicePtr, StrategyKind};

const MIB: u64 = 1 << 20;

/// Every range ever handed out from a pool, and every range handed out outside one while the
/// pool held memory: the two must never meet.
#[derive(Default)]
struct Boundary {
    pool: Vec<(DevicePtr, u64)>,
    outside: Vec<(DevicePtr, u64)>,
}

impl Boundary {
    fn meets(a: (DevicePtr, u64), b: (DevicePtr, u64)) -> bool {
        a.0 < b.0 + b.1 && b.0 < a.0 + a.1
    }
    fn in_pool(&mut self, r: (DevicePtr, u64)) {
        if let Some(o) = self.outside.iter().find(|&&o| Self::meets(o, r)) {
            panic!("pool block {r:x?} meets {o:x?}, handed out outside the pool");
        }
        self.pool.push(r);
    }
    fn outside(&mut self, r: (DevicePtr, u64)) {
        if let Some(p) = self.pool.iter().find(|&&p| Self::meets(p, r)) {
            panic!("block {r:x?} handed out outside the pool meets pool block {p:x?}");
        }
        self.outside.push(r);
    }
}

const CAPTURED: u64 = 7;
const MAIN: u64 = 1;
const SIDE: u64 = 9;

fn window(alloc: &Allocator, dev: &SimDevice, id: (u64, u64)) {
    dev.begin_capture(CAPTURED);
    alloc.begin_pool(id, Box::new(|s| s == CAPTURED));
}

/// As PyTorch's `CUDAGraph::capture_end`: the capture ends, then the pool's window.
fn close(alloc: &Allocator, dev: &SimDevice, id: (u64, u64)) {
    dev.end_capture(CAPTURED);
    alloc.end_pool(id).expect("a window is open");
}

#[test]
fn a_capture_gets_its_own_pool_and_gives_nothing_back_until_it_ends() {
    for kind in [
        None,
        Some(StrategyKind::Caching),
        Some(StrategyKind::Suballoc),
        Some(StrategyKind::Passthrough),
    ] {
        let dev = Arc::new(SimDevice::builder().capacity(512 * MIB).stream_lag(3).build());
        let alloc = match kind {
            None => Allocator::adaptive(dev.clone()),
            Some(k) => Allocator::with_strategy(dev.clone(), k),
        };
        let mut seen = Boundary::default();
        // Before the capture: memory on the main stream, some freed (idle), some kept to free
        // during the capture.
        let before: Vec<DevicePtr> = (1..=8).map(|i| alloc.allocate_raw(i * MIB, MAIN).unwrap()).collect();
        for (i, &p) in before.iter().enumerate().take(4) {
            seen.outside((p, (i as u64 + 1) * MIB));
            alloc.deallocate(p, MAIN).unwrap();
        }
        let id = (1, 0);
        window(&alloc, &dev, id);
        let frees_before = dev.stats().driver_frees;
        // The captured stream's requests come from the pool; freed there, they serve it again.
        let a = alloc.allocate_raw(3 * MIB, CAPTURED).unwrap();
        seen.in_pool((a, 3 * MIB));
        alloc.deallocate(a, CAPTURED).unwrap();
        let b = alloc.allocate_raw(3 * MIB, CAPTURED).unwrap();
        assert_eq!(a, b, "{kind:?}: a block freed in the pool serves its stream again");
        seen.in_pool((b, 3 * MIB));
        let c = alloc.allocate_raw(5 * MIB, CAPTURED).unwrap();
        seen.in_pool((c, 5 * MIB));
        alloc.record_stream(c, SIDE).unwrap();
        // Another stream meanwhile: memory from outside the pool; frees of outside blocks held.
        let d = alloc.allocate_raw(2 * MIB, MAIN).unwrap();
        seen.outside((d, 2 * MIB));
        for &p in &before[4..] {
            alloc.deallocate(p, MAIN).unwrap();
        }
        alloc.deallocate(d, MAIN).unwrap();
        assert_eq!(
            alloc.release_idle(),
            0,
            "{kind:?}: empty_cache gives nothing back in a capture"
        );
        // A request past what the device has fails at once, saying why, without a release.
        let err = alloc.allocate_raw(500 * MIB, CAPTURED).unwrap_err();
        assert!(
            matches!(err, AllocError::OutOfMemoryInPoolWindow { .. }),
            "{kind:?}: {err}"
        );
        assert!(
            err.to_string().contains("(1, 0)") && err.to_string().contains("capture"),
            "{err}"
        );
        let err = alloc.allocate_raw(500 * MIB, MAIN).unwrap_err();
        assert!(
            matches!(err, AllocError::OutOfMemoryInPoolWindow { .. }),
            "{kind:?}: {err}"
        );
        for _ in 0..20 {
            let p = alloc.allocate_raw(MIB, CAPTURED).unwrap();
            seen.in_pool((p, MIB));
            alloc.deallocate(p, CAPTURED).unwrap();
        }
        assert_eq!(
            dev.stats().driver_frees,
            frees_before,
            "{kind:?}: no driver free during the capture"
        );
        alloc.deallocate(c, CAPTURED).unwrap();
        alloc.deallocate(b, CAPTURED).unwrap();
        close(&alloc, &dev, id);
        assert_eq!(dev.capture_violations(), 0, "{kind:?}");

        // "Replays": the pool's memory stays the graph's. Outside requests, even after
        // empty_cache, never land on it.
        let reserved_with_pool = alloc.stats().reserved_bytes.current;
        alloc.release_idle();
        for i in 1..=16 {
            let p = alloc.allocate_raw(i * MIB / 2, CAPTURED).unwrap();
            seen.outside((p, i * MIB / 2));
            alloc.deallocate(p, CAPTURED).unwrap();
        }
        assert!(alloc.stats().reserved_bytes.current > 0 && reserved_with_pool > 0);
        // A pool block still live (a graph output) keeps the pool's memory past its release.
        let out = {
            window(&alloc, &dev, id);
            let p = alloc.allocate_raw(4 * MIB, CAPTURED).unwrap();
            seen.in_pool((p, 4 * MIB));
            close(&alloc, &dev, id);
            p
        };
        alloc.release_pool(id).unwrap();
        alloc.release_idle();
        assert!(
            alloc.stats().reserved_bytes.current >= 4 * MIB,
            "{kind:?}: the live output keeps its memory"
        );
        alloc.deallocate(out, CAPTURED).unwrap();
        alloc.release_idle();
        let s = alloc.stats();
        assert_eq!(s.reserved_bytes.current, 0, "{kind:?}: every byte back: {s:#?}");
        assert_eq!(alloc.stats().live_bytes.current, 0);
        assert!(matches!(alloc.release_pool(id), Err(AllocError::UnknownPool { .. })));
        assert!(matches!(alloc.end_pool(id), Err(AllocError::UnknownPool { .. })));
        assert_eq!(dev.capture_violations(), 0, "{kind:?}");
    }
}

#[test]
fn the_simulated_device_counts_what_breaks_a_capture() {
    // The check above can fail: without a pool window, the same empty_cache during a capture
    // is a driver free the device counts.
    let dev = Arc::new(SimDevice::new(256 * MIB));
    let alloc = Allocator::with_strategy(dev.clone(), StrategyKind::Caching);
    let p = alloc.allocate_raw(MIB, MAIN).unwrap();
    alloc.deallocate(p, MAIN).unwrap();
    dev.begin_capture(CAPTURED);
    assert!(alloc.release_idle() > 0);
    assert_eq!(dev.capture_violations(), 1);
}

/// An allocator dropped while a window is still open gives every byte back: slabs stop
/// unmapping while a window is open (a capture may be under way) and start again when the
/// allocator goes away.
#[test]
fn an_allocator_dropped_in_a_window_gives_everything_back() {
    let dev = Arc::new(SimDevice::builder().capacity(512 * MIB).build());
    let alloc = Allocator::adaptive(dev.clone());
    let outside: Vec<DevicePtr> = (1..=6).map(|i| alloc.allocate_raw(i * MIB, MAIN).unwrap()).collect();
    window(&alloc, &dev, (1, 0));
    let inside = alloc.allocate_raw(3 * MIB, CAPTURED).unwrap();
    for p in outside {
        alloc.deallocate(p, MAIN).unwrap();
    }
    alloc.deallocate(inside, CAPTURED).unwrap();
    dev.end_capture(CAPTURED);
    drop(alloc);
    assert_eq!((dev.leak_report().blocks, dev.used_bytes()), (0, 0));
}

#[test]
fn random_windows_keep_every_pool_to_itself() {
    let mut rng = SplitMix64(0x9001);
    for round in 0..6 {
        let dev = Arc::new(SimDevice::builder().capacity(256 * MIB).stream_lag(2).build());
        let alloc = if round % 2 == 0 {
            Allocator::adaptive(dev.clone())
        } else {
            Allocator::with_strategy(dev.clone(), StrategyKind::Suballoc)
        };
        // Live blocks: (ptr, bytes, stream, pool or 0), and each pool's ranges ever handed out.
        let mut live: Vec<(DevicePtr, u64, u64, u64)> = Vec::new();
        let mut ranges: std::collections::HashMap<u64, Vec<(DevicePtr, u64)>> = Default::default();
        let mut open: Option<u64> = None;
        let mut released: Vec<u64> = Vec::new();
        let mut next_pool = 1;
        for _ in 0..4000 {
            match rng.next_u64() % 10 {
                0 if open.is_none() => {
                    let id = next_pool;
                    next_pool += 1;
                    window(&alloc, &dev, (id, 0));
                    open = Some(id);
                }
                1 if open.is_some() => {
                    close(&alloc, &dev, (open.take().unwrap(), 0));
                }
                2 if open.is_none() && next_pool > 1 => {
                    let id = 1 + rng.next_u64() % (next_pool - 1);
                    if !released.contains(&id) {
                        alloc.release_pool((id, 0)).unwrap();
                        released.push(id);
                    }
                }
                3..=6 => {
                    let bytes = (1 + rng.next_u64() % 64) * 64 * 1024;
                    let stream = if rng.next_u64() % 2 == 0 { CAPTURED } else { MAIN };
                    let pool = if stream == CAPTURED { open.unwrap_or(0) } else { 0 };
                    let Ok(p) = alloc.allocate_raw(bytes, stream) else {
                        continue;
                    };
                    let r = (p, bytes);
                    for (&other, rs) in &ranges {
                        if other != pool && !released_and_empty(other, &released, &live) {
                            assert!(
                                !rs.iter().any(|&q| Boundary::meets(q, r)),
                                "round {round}: {r:x?} (pool {pool}) meets a block of pool {other}"
                            );
                        }
                    }
                    ranges.entry(pool).or_default().push(r);
                    live.push((p, bytes, stream, pool));
                }
                _ if !live.is_empty() => {
                    let (p, _, s, _) = live.swap_remove((rng.next_u64() % live.len() as u64) as usize);
                    alloc.deallocate(p, s).unwrap();
                }
                _ => {}
            }
            // Outside memory may be reused outside: only the pools' ranges are kept apart.
            ranges
                .entry(0)
                .or_default()
                .retain(|&(p, _)| live.iter().any(|l| l.0 == p));
        }
        if let Some(id) = open {
            close(&alloc, &dev, (id, 0));
        }
        for (p, _, s, _) in live.drain(..) {
            alloc.deallocate(p, s).unwrap();
        }
        for id in 1..next_pool {
            if !released.contains(&id) {
                alloc.release_pool((id, 0)).unwrap();
            }
        }
        alloc.release_idle();
        assert_eq!(alloc.stats().reserved_bytes.current, 0, "round {round}");
        assert_eq!(dev.capture_violations(), 0, "round {round}");
    }
}

/// A released pool with nothing live has given its memory back: its ranges are free to reuse.
fn released_and_empty(pool: u64, released: &[u64], live: &[(DevicePtr, u64, u64, u64)]) -> bool {
    pool != 0 && released.contains(&pool) && !live.iter().any(|l| l.3 == pool)
}

#[test]
fn a_memory_cap_fails_requests_past_it_after_releasing_idle_memory() {
    let dev = Arc::new(SimDevice::new(GIB));
    let alloc = Allocator::with_strategy(dev.clone(), StrategyKind::Caching);
    alloc.set_memory_cap(Some(100 * MIB));
    let a = alloc.allocate_raw(60 * MIB, MAIN).unwrap();
    let err = alloc.allocate_raw(60 * MIB, MAIN).unwrap_err();
    match &err {
        AllocError::OutOfMemory { cause, .. } => assert!(matches!(cause, DeviceError::OverCap { .. }), "{err}"),
        other => panic!("expected out-of-memory past the cap, got {other}"),
    }
    assert!(err.to_string().contains("set_per_process_memory_fraction"), "{err}");
    assert_eq!(alloc.stats().failed_allocs, 1);
    // Idle memory under the cap is given back before a request past it fails.
    alloc.deallocate(a, MAIN).unwrap();
    let b = alloc.allocate_raw(80 * MIB, MAIN).unwrap();
    assert_eq!(alloc.stats().oom_recoveries, 1);
    assert!(alloc.stats().reserved_bytes.current <= 100 * MIB);
    // Lifted, the device is the limit again.
    alloc.set_memory_cap(None);
    let c = alloc.allocate_raw(200 * MIB, MAIN).unwrap();
    alloc.deallocate(b, MAIN).unwrap();
    alloc.deallocate(c, MAIN).unwrap();
}

const GIB: u64 = 1 << 30;
