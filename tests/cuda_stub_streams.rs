//! CudaDevice's stream ordering on the stub libcuda (tests/stub/libcuda.c, host memory with a
//! set capacity; see tests/cuda_stub.rs for how a test re-runs itself on it): freed memory waits
//! for the work queued at its free, a reclaim never answers a stream with an older checkpoint,
//! and nothing breaks a graph capture under way. Skips, saying why, where no C compiler exists
//! or a real CUDA driver is present.

mod common;

use std::sync::Arc;

use adaptalloc::{AllocError, Allocator, CudaDevice, Device, DeviceError};
use common::stub::{CAPACITY, StubHooks, in_child_on_stub, stub_hooks};

/// Stream-ordered reuse follows the work queued at the free, not the whole stream. Stream A
/// frees the memory a queued kernel used, then the allocator frees on B (a checkpoint event is
/// recorded on A), then A queues more work and never goes idle. When B runs out of memory:
/// with A's first kernel done, A's memory serves B with no wait at all; with it still running,
/// B waits on the event (that kernel), not on A's whole queue.
#[test]
fn freed_memory_waits_for_the_work_queued_at_the_free_not_the_whole_stream() {
    in_child_on_stub(
        "freed_memory_waits_for_the_work_queued_at_the_free_not_the_whole_stream",
        &[],
        "checkpoint checks passed",
        checkpoint_child,
    );
}

fn checkpoint_child() {
    use adaptalloc::StrategyKind;
    const A: u64 = 0xA000;
    const B: u64 = 0xB000;
    let hooks = stub_hooks();
    for first_kernel_done in [true, false] {
        let dev = Arc::new(CudaDevice::new(0).unwrap());
        let alloc = Allocator::with_strategy(dev.clone() as Arc<dyn Device>, StrategyKind::Caching);
        let (stream_syncs, event_syncs) = ((hooks.stream_syncs)(), (hooks.event_syncs)());
        free_while_busy(&alloc, &hooks, A, 40, 2 << 20);
        let p = alloc.allocate_raw(1 << 20, B).unwrap();
        alloc.deallocate(p, B).unwrap();
        (hooks.stream_work)(A as usize, 5);
        if first_kernel_done {
            (hooks.stream_finish)(A as usize, 1);
        }
        let on_b: Vec<u64> = (0..40)
            .map(|i| {
                alloc
                    .allocate_raw(2 << 20, B)
                    .unwrap_or_else(|e| panic!("block {i} on B: {e}"))
            })
            .collect();
        let s = alloc.stats();
        let what = if first_kernel_done { "done" } else { "running" };
        assert!(
            s.stream_reclaims + s.stream_waits >= 1,
            "{what}: A's memory was reclaimed"
        );
        assert_eq!(s.stream_waits, u64::from(!first_kernel_done), "{what}: waits");
        assert_eq!(
            (hooks.event_syncs)() - event_syncs,
            i32::from(!first_kernel_done),
            "{what}: a wait is on the checkpoint event"
        );
        assert_eq!((hooks.stream_syncs)(), stream_syncs, "{what}: never on A's whole queue");
        assert_eq!(
            (hooks.stream_pending)(A as usize),
            5,
            "{what}: A's later work still runs"
        );
        (hooks.stream_finish)(A as usize, 5);
        for p in on_b {
            alloc.deallocate(p, B).unwrap();
        }
        drop(alloc);
        assert_eq!(dev.mem_info().unwrap().free, CAPACITY, "every byte back");
    }
    // A checkpoint re-recorded for an older free still answers for the later one it covered
    // (the event, re-recorded, covers both): never replaced by an older one. A stream at
    // 0xD000: k0, a checkpoint for the free at op 10, k1, the stream left again with its free
    // at op 5, then k2; once k0 and k1 are done the free at op 10 is done, while k2 runs.
    let dev = CudaDevice::new(0).unwrap();
    const D: u64 = 0xD000;
    (hooks.stream_work)(D as usize, 1);
    dev.stream_checkpoint(D, 10);
    (hooks.stream_work)(D as usize, 1);
    dev.stream_checkpoint(D, 5);
    (hooks.stream_work)(D as usize, 1);
    assert!(!dev.stream_done(D, 10, 11), "k0 and k1 run");
    (hooks.stream_finish)(D as usize, 2);
    assert!(
        dev.stream_done(D, 10, 11),
        "the free at op 10 is covered by the event, k2 aside"
    );
    (hooks.stream_finish)(D as usize, 1);
    drop(dev);
    // Checkpoint events stay bounded and none outlives its device: 3,000 streams, each freeing
    // once while its work is queued (the stub tracks 64 streams; the rest read as idle).
    let dev = Arc::new(CudaDevice::new(0).unwrap());
    let alloc = Allocator::with_strategy(dev.clone() as Arc<dyn Device>, StrategyKind::Caching);
    let mut most = 0;
    for s in 1..=3000u64 {
        let stream = 0x10_0000 + s * 16;
        free_while_busy(&alloc, &hooks, stream, 1, 64 << 10);
        most = most.max((hooks.live_events)());
    }
    assert!(most <= 1100, "{most} checkpoint events at once");
    drop(alloc);
    drop(dev);
    assert_eq!(
        (hooks.live_events)(),
        0,
        "every checkpoint event destroyed with its device"
    );
    println!("checkpoint checks passed");
}

/// The cross-stream reclaim race (issue 26): block p is freed on stream A while a kernel k1
/// that uses it is queued there, and p is recorded on side stream B; A was checkpointed earlier
/// by an event that covers only an older kernel k0. When another stream C asks, reclaiming B
/// first releases p into A's free lists; A must then be asked for the work up to p's free, not
/// answered by the older checkpoint, or C gets p while k1 runs. Both ways a reclaim starts (an
/// out-of-memory wait; a free that finds 64 other streams remembered) and both orders of the
/// stream handles (B below A and above it).
#[test]
fn a_reclaim_never_answers_a_stream_with_a_checkpoint_older_than_its_last_free() {
    in_child_on_stub(
        "a_reclaim_never_answers_a_stream_with_a_checkpoint_older_than_its_last_free",
        &[],
        "reclaim race checks passed",
        reclaim_race_child,
    );
}

fn reclaim_race_child() {
    use adaptalloc::StrategyKind;
    const MIB: u64 = 1 << 20;
    const A: u64 = 0xA000;
    const X: u64 = 0x5_0000;
    const C: u64 = 0xC_0000;
    let hooks = stub_hooks();
    for b in [0x1000u64, 0xF000] {
        for crowded in [false, true] {
            let what = format!(
                "B {} A, {}",
                if b < A { "below" } else { "above" },
                if crowded {
                    "crowded reclaim"
                } else {
                    "out-of-memory wait"
                }
            );
            let dev = Arc::new(CudaDevice::new(0).unwrap());
            let alloc = Allocator::with_strategy(dev.clone() as Arc<dyn Device>, StrategyKind::Caching);
            let cycle = |size: u64, s: u64| {
                let p = alloc.allocate_raw(size, s).unwrap();
                alloc.deallocate(p, s).unwrap();
            };
            cycle(MIB, b); // B is remembered with a free of its own
            let q = alloc.allocate_raw(MIB, A).unwrap();
            (hooks.stream_work)(A as usize, 1); // k0
            alloc.deallocate(q, A).unwrap();
            cycle(MIB, X); // A is left: its checkpoint covers k0
            let p = alloc.allocate_raw(32 * MIB, A).unwrap();
            (hooks.stream_kernel)(A as usize, p, 32 << 20); // k1
            alloc.record_stream(p, b).unwrap();
            (hooks.stream_work)(b as usize, 1);
            // Blocks that 64 streams will free later (allocated now: an allocation would
            // release p at once once B is done, outside any reclaim).
            let others: Vec<(u64, u64)> = (1..=66u64)
                .map(|i| {
                    (
                        0x100_0000 + i * 16,
                        alloc.allocate_raw(64 << 10, 0x100_0000 + i * 16).unwrap(),
                    )
                })
                .collect();
            alloc.deallocate(p, A).unwrap(); // waits for B: deferred
            (hooks.stream_finish)(A as usize, 1); // k0 done, k1 still queued
            // C's requests; each hand-out of p is checked against k1 at that moment.
            let mut got = Vec::new();
            let mut take = || {
                let r = alloc.allocate_raw(32 * MIB, C);
                if let Ok(ptr) = r {
                    assert!(
                        ptr != p || (hooks.stream_pending)(A as usize) == 0,
                        "{what}: stream C got p while k1, queued on A before p's free, runs"
                    );
                    got.push(ptr);
                }
                r.is_ok()
            };
            if crowded {
                (hooks.stream_finish)(b as usize, 1);
                for &(s, ptr) in &others {
                    alloc.deallocate(ptr, s).unwrap();
                }
                assert!(take(), "{what}: C is served");
            } else {
                while take() {}
            }
            let s = alloc.stats();
            assert!(s.stream_reclaims + s.stream_waits > 0, "{what}: a reclaim ran ({s:?})");
            if !crowded {
                for &(s, ptr) in &others {
                    alloc.deallocate(ptr, s).unwrap();
                }
            }
            (hooks.stream_finish)(A as usize, 1);
            for ptr in got {
                alloc.deallocate(ptr, C).unwrap();
            }
            drop(alloc);
            assert_eq!(dev.mem_info().unwrap().free, CAPACITY, "{what}: every byte back");
        }
    }
    println!("reclaim race checks passed");
}

/// CUDA graph capture (issue 25): CudaDevice asks `cuStreamIsCapturing` before it queries,
/// waits on or records an event on a stream, and the allocator, with a pool window open, gives
/// nothing back. The stub refuses (and counts) every call that would break a capture.
#[test]
fn nothing_breaks_a_capture_under_way() {
    in_child_on_stub(
        "nothing_breaks_a_capture_under_way",
        &[],
        "capture checks passed",
        capture_child,
    );
}

fn capture_child() {
    use adaptalloc::StrategyKind;
    const S: u64 = 0x5000; // captured
    const A: u64 = 0xA000;
    let hooks = stub_hooks();
    // The device alone: a capturing stream reads as not done, gets no event, and a wait on it
    // is refused, while the stub counts no violation.
    let dev = Arc::new(CudaDevice::new(0).unwrap());
    (hooks.begin_capture)(S as usize);
    let events = (hooks.live_events)();
    dev.stream_checkpoint(S, 5);
    assert_eq!(
        (hooks.live_events)(),
        events,
        "no checkpoint event on a capturing stream"
    );
    assert!(!dev.stream_done(S, 0, 10));
    assert!(matches!(
        dev.stream_wait(S, 0),
        Err(DeviceError::StreamCapturing { stream: S })
    ));
    assert_eq!((hooks.capture_violations)(), 0);
    (hooks.end_capture)(S as usize);
    assert!(dev.stream_done(S, 0, 10), "the stream is idle once the capture ended");

    for kind in [StrategyKind::Caching, StrategyKind::Suballoc, StrategyKind::Passthrough] {
        let alloc = Allocator::with_strategy(dev.clone() as Arc<dyn Device>, kind);
        // Before: memory freed on S and on A with work queued; a block of A's recorded on S.
        free_while_busy(&alloc, &hooks, S, 4, 4 << 20);
        let shared = alloc.allocate_raw(1 << 20, A).unwrap();
        alloc.record_stream(shared, S).unwrap();
        let keep = alloc.allocate_raw(8 << 20, A).unwrap();
        // The capture, as PyTorch's CUDAGraph runs it: capture begins, then the pool's window.
        (hooks.begin_capture)(S as usize);
        alloc.begin_pool((1, 0), Box::new(|s| s == S));
        let in_pool: Vec<u64> = (0..6).map(|i| alloc.allocate_raw((i + 1) << 20, S).unwrap()).collect();
        for &p in &in_pool[..3] {
            alloc.deallocate(p, S).unwrap();
        }
        alloc.deallocate(shared, A).unwrap(); // waits for S: deferred, S not asked
        alloc.deallocate(keep, A).unwrap(); // held until the window closes
        let other = alloc.allocate_raw(2 << 20, A).unwrap();
        alloc.deallocate(other, A).unwrap();
        assert_eq!(
            alloc.release_idle(),
            0,
            "{kind:?}: empty_cache gives nothing back in a capture"
        );
        let err = alloc.allocate_raw(CAPACITY - (1 << 20), A).unwrap_err();
        assert!(
            matches!(err, AllocError::OutOfMemoryInPoolWindow { .. }),
            "{kind:?}: {err}"
        );
        assert_eq!(
            (hooks.capture_violations)(),
            0,
            "{kind:?}: nothing refused during the capture"
        );
        (hooks.end_capture)(S as usize);
        alloc.end_pool((1, 0)).unwrap();
        (hooks.stream_finish)(S as usize, 1);
        for &p in &in_pool[3..] {
            alloc.deallocate(p, S).unwrap();
        }
        alloc.release_pool((1, 0)).unwrap();
        alloc.synchronize_stream(S);
        alloc.release_idle();
        let s = alloc.stats();
        assert_eq!(
            (s.live_bytes.current, s.reserved_bytes.current),
            (0, 0),
            "{kind:?}: {s:#?}"
        );
        drop(alloc);
        assert_eq!(dev.mem_info().unwrap().free, CAPACITY, "{kind:?}: every byte back");
    }
    assert_eq!((hooks.capture_violations)(), 0);
    println!("capture checks passed");
}

/// Frees `n` blocks of `bytes` allocated on `stream` after queuing a kernel there: memory freed
/// while work that may use it is still in flight.
fn free_while_busy(alloc: &Allocator, hooks: &StubHooks, stream: u64, n: usize, bytes: u64) {
    let blocks: Vec<u64> = (0..n).map(|_| alloc.allocate_raw(bytes, stream).unwrap()).collect();
    (hooks.stream_work)(stream as usize, 1);
    for p in blocks {
        alloc.deallocate(p, stream).unwrap();
    }
}
