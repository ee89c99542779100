//! CudaDevice's own code on the CPU: a stub libcuda (tests/stub/libcuda.c, host memory with a
//! set capacity) built with the system C compiler and loaded through cudarc's dynamic loading.
//! The test re-runs itself in a child process with LD_LIBRARY_PATH pointing at the stub, since
//! the loader reads it at process start. Skips, saying why, where no C compiler exists or a
//! real CUDA driver is present.

mod common;

use std::process::Command;
use std::sync::Arc;

use adaptalloc::{AllocError, Allocator, CudaDevice, Device, DeviceError};
use adaptalloc_cli::compare::Contender;
use adaptalloc_cli::synth::WorkloadSpec;
use adaptalloc_cli::trace::replay;

use common::stub::{StubHooks, run_on_stub, stub_hooks, stub_or_skip};

const CHILD: &str = "ADAPTALLOC_STUB_CUDA_CHILD";
const CAPACITY: u64 = 96 << 20;

/// In the child process (test `name` run again with `CHILD` set to it): runs `child`. Otherwise
/// runs test `name` again in a child process whose libcuda is the stub (the loader reads
/// LD_LIBRARY_PATH at process start), with `CHILD` set to `name` and the `env` given; the child
/// must succeed and print `marker`. Skips, saying why, where the stub cannot be used.
fn in_child_on_stub(name: &str, env: &[(&str, &str)], marker: &str, child: fn()) {
    if is_child(name) {
        return child();
    }
    let Some(dir) = stub_or_skip(name) else {
        return;
    };
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", name, "--nocapture", "--test-threads", "1"])
        .env(CHILD, name)
        .envs(env.iter().copied());
    let (ok, text) = run_on_stub(&mut cmd, &dir, CAPACITY);
    assert!(ok, "child failed:\n{text}");
    assert!(text.contains(marker), "{text}");
    std::fs::remove_dir_all(&dir).ok();
}

/// True in the child of [`in_child_on_stub`] for test `name`.
fn is_child(name: &str) -> bool {
    std::env::var(CHILD).is_ok_and(|v| v == name)
}

#[test]
fn cuda_device_runs_on_a_stub_libcuda() {
    in_child_on_stub("cuda_device_runs_on_a_stub_libcuda", &[], "stub checks passed", child);
}

/// Runs inside the child, with the stub as libcuda.
fn child() {
    assert!(CudaDevice::driver_present(), "the stub should load");
    assert!(matches!(
        CudaDevice::new(1),
        Err(DeviceError::Driver {
            call: "cuDeviceGet",
            ..
        })
    ));
    let dev = CudaDevice::new(0).expect("device 0 on the stub");
    assert_eq!(dev.name(), "adaptalloc stub GPU");
    let info = dev.mem_info().unwrap();
    assert_eq!((info.free, info.total), (CAPACITY, CAPACITY));
    let p = dev.allocate(1 << 20).unwrap();
    assert_eq!(p % 256, 0);
    assert_eq!(dev.mem_info().unwrap().free, CAPACITY - (1 << 20));
    assert_eq!(dev.stats().allocated_bytes, 1 << 20);
    // Out of memory from the driver is a typed, transient error with the device's numbers.
    match dev.allocate(CAPACITY) {
        Err(e @ DeviceError::OutOfMemory { .. }) => assert!(e.to_string().contains("out of memory"), "{e}"),
        other => panic!("expected OutOfMemory, got {other:?}"),
    }
    dev.free(p).unwrap();
    assert!(
        matches!(
            dev.free(p),
            Err(DeviceError::Driver {
                call: "cuMemFree_v2",
                ..
            })
        ),
        "double free is a driver error"
    );
    assert_eq!(dev.stats().allocated_bytes, 0);

    // Virtual memory management: pages map and unmap one by one inside a reservation.
    const PAGE: u64 = 2 << 20;
    assert_eq!(dev.vmm_page_size(), Some(PAGE), "the stub reports VMM support");
    let vmm = dev.vmm().expect("vmm");
    let va = vmm.reserve(4 * PAGE).unwrap();
    vmm.map(va, 2 * PAGE).unwrap();
    assert_eq!(dev.mem_info().unwrap().free, CAPACITY - 2 * PAGE);
    vmm.unmap(va, PAGE).unwrap();
    assert_eq!(
        dev.mem_info().unwrap().free,
        CAPACITY - PAGE,
        "one page of a two-page map goes back"
    );
    vmm.map(va + 2 * PAGE, 2 * PAGE).unwrap();
    vmm.unmap(va + PAGE, 3 * PAGE).unwrap();
    assert_eq!(dev.mem_info().unwrap().free, CAPACITY);
    vmm.unreserve(va).unwrap();
    assert!(matches!(vmm.unreserve(va), Err(DeviceError::UnknownPointer { .. })));
    // A map the device cannot back fails as out of memory and leaves nothing mapped.
    let big = vmm.reserve(CAPACITY + 2 * PAGE).unwrap();
    assert!(matches!(
        vmm.map(big, CAPACITY + PAGE * 2),
        Err(DeviceError::OutOfMemory { .. })
    ));
    assert_eq!(dev.mem_info().unwrap().free, CAPACITY);
    vmm.unreserve(big).unwrap();
    // A page mapped a second time (retained handle) is memory once, and goes back with its
    // last mapping, whichever goes first.
    let (a, b) = (vmm.reserve(PAGE).unwrap(), vmm.reserve(PAGE).unwrap());
    vmm.map(a, PAGE).unwrap();
    vmm.map_alias(b, a, PAGE).unwrap();
    assert_eq!(dev.mem_info().unwrap().free, CAPACITY - PAGE);
    vmm.unmap(a, PAGE).unwrap();
    assert_eq!(dev.mem_info().unwrap().free, CAPACITY - PAGE, "still mapped at b");
    assert!(vmm.map_alias(a, a, PAGE).is_err(), "nothing is mapped at a any more");
    vmm.unmap_alias(b, PAGE).unwrap();
    assert_eq!(dev.mem_info().unwrap().free, CAPACITY);
    vmm.unreserve(a).unwrap();
    vmm.unreserve(b).unwrap();
    // Handles moved (retained, mapped at their new place, unmapped at the old one) are the
    // same memory: nothing is created or given back, and they go back with their new mapping.
    let (a, b) = (vmm.reserve(2 * PAGE).unwrap(), vmm.reserve(2 * PAGE).unwrap());
    vmm.map(a, 2 * PAGE).unwrap();
    assert_eq!(vmm.handles_in(a, 2 * PAGE), 2, "a page each");
    vmm.move_handles(b, a, 2 * PAGE).unwrap();
    assert_eq!(dev.mem_info().unwrap().free, CAPACITY - 2 * PAGE);
    assert!(vmm.move_handles(b, a, PAGE).is_err(), "nothing is mapped at a any more");
    vmm.map(a, PAGE).unwrap();
    assert!(
        vmm.move_handles(b, a, PAGE).is_err(),
        "b is mapped: refused, nothing changes"
    );
    assert_eq!(dev.mem_info().unwrap().free, CAPACITY - 3 * PAGE);
    vmm.unmap(a, PAGE).unwrap();
    vmm.unmap(b, 2 * PAGE).unwrap();
    assert_eq!(dev.mem_info().unwrap().free, CAPACITY);
    vmm.unreserve(a).unwrap();
    vmm.unreserve(b).unwrap();
    // Larger handles (8 MiB here): mapped with one access grant for the run (the stub, as the
    // driver, accepts a grant over whole mappings only), unmapped whole, several at once.
    let h = vmm.reserve(16 * PAGE).unwrap();
    vmm.map_handles(h, 16 * PAGE, 4 * PAGE).unwrap();
    assert_eq!(dev.mem_info().unwrap().free, CAPACITY - 16 * PAGE);
    assert!(vmm.map_handles(h, 4 * PAGE, 3 * PAGE).is_err(), "off the granule");
    // A larger handle is mapped a second time whole (cuMemMap takes a whole handle), never in
    // part; the memory counts once.
    let alias = vmm.reserve(4 * PAGE).unwrap();
    assert!(vmm.map_alias(alias, h, PAGE).is_err(), "part of a handle");
    vmm.map_alias(alias, h, 4 * PAGE).unwrap();
    assert_eq!(dev.mem_info().unwrap().free, CAPACITY - 16 * PAGE);
    // What an unmap would give back, handle by handle (the allocator's physical counts).
    assert_eq!(
        (
            vmm.handles_in(h, 16 * PAGE),
            vmm.handles_in(h + 4 * PAGE, 8 * PAGE),
            vmm.handles_in(alias, 4 * PAGE)
        ),
        (4, 2, 1)
    );
    vmm.unmap_alias(alias, 4 * PAGE).unwrap();
    vmm.unreserve(alias).unwrap();
    vmm.unmap(h + 4 * PAGE, 8 * PAGE).unwrap();
    assert_eq!(
        dev.mem_info().unwrap().free,
        CAPACITY - 8 * PAGE,
        "two handles went back"
    );
    vmm.unmap(h, 4 * PAGE).unwrap();
    vmm.unmap(h + 12 * PAGE, 4 * PAGE).unwrap();
    assert_eq!(dev.mem_info().unwrap().free, CAPACITY);
    vmm.unreserve(h).unwrap();
    // Every driver call above was timed by kind, and the kinds add up to the total.
    let st = dev.stats();
    let o = st.ops;
    assert!(o.create.calls >= 2 + 4 && o.map.calls >= o.create.calls && o.unmap.calls > 0 && o.release.calls > 0);
    assert!(o.reserve.calls >= 5 && o.unreserve.calls >= 5 && o.set_access.calls > 0 && o.alloc.calls > 0);
    assert_eq!(st.driver_ns, o.total_ns(), "{o:?}");
    // The default policy uses page-backed slabs there: pages freed inside a slab that still
    // holds live blocks go back to the driver.
    let dev: Arc<dyn Device> = Arc::new(dev);
    {
        let a = Contender::Adaptive.build(dev.clone()).expect("ours");
        let blocks: Vec<u64> = (0..64).map(|_| a.allocate_raw(PAGE / 2, 0).unwrap()).collect();
        // Keep one block in eight: every slab of more than four pages keeps a live block.
        for (i, p) in blocks.iter().enumerate() {
            if i % 8 != 0 {
                a.deallocate(*p, 0).unwrap();
            }
        }
        let before = dev.mem_info().unwrap().free;
        a.release_idle();
        let after = dev.mem_info().unwrap().free;
        // Measured on the stub: 48 MiB back with pages, 20 MiB (empty slabs only) without.
        assert!(
            after >= before + 18 * PAGE,
            "free pages inside slabs in use went back: {before} -> {after}"
        );
        for (i, p) in blocks.iter().enumerate() {
            if i % 8 == 0 {
                a.deallocate(*p, 0).unwrap();
            }
        }
    }
    assert_eq!(dev.mem_info().unwrap().free, CAPACITY);

    // Every allocator set-up replays a workload on the stub and gives every byte back.
    let spec = WorkloadSpec::bundled("small-churn").unwrap();
    let trace = spec.generate(spec.seed);
    for c in adaptalloc_cli::compare::Contender::ALL {
        let alloc = c.build(dev.clone()).expect("ours, not a peer");
        let m = replay(&trace, &alloc);
        assert_eq!(m.failed_allocs, 0, "{}", c.name());
        drop(alloc);
        assert_eq!(dev.mem_info().unwrap().free, CAPACITY, "{}: every byte back", c.name());
    }
    // The allocator's out-of-memory path on a real driver error: it releases, retries, and
    // then reports the request with live and reserved bytes; and stays usable.
    let alloc = Contender::Adaptive.build(dev.clone()).expect("ours, not a peer");
    let hold = alloc.allocate(CAPACITY / 2, 0).unwrap();
    match alloc.allocate(CAPACITY * 3 / 4, 0) {
        Err(AllocError::OutOfMemory { .. }) => {}
        other => panic!("expected OutOfMemory, got {other:?}"),
    }
    drop(hold);
    drop(
        alloc
            .allocate(CAPACITY * 3 / 4, 0)
            .expect("fits once the first block is gone"),
    );
    drop(alloc);
    assert_eq!(dev.mem_info().unwrap().free, CAPACITY);
    println!("stub checks passed");
}

/// With two devices on the stub (which tracks the current context per thread, allocates on the
/// current context's device and frees only there): every CudaDevice entry point leaves the
/// caller's current context as it found it, and each device's allocator uses its own context.
#[test]
fn every_entry_point_restores_the_callers_context() {
    in_child_on_stub(
        "every_entry_point_restores_the_callers_context",
        &[("STUB_CUDA_DEVICES", "2")],
        "context checks passed",
        context_child,
    );
}

fn current() -> cudarc::driver::sys::CUcontext {
    let mut ctx = std::ptr::null_mut();
    // SAFETY: a live out-pointer; the stub is loaded (checked by the caller).
    let r = unsafe { cudarc::driver::sys::cuCtxGetCurrent(&mut ctx) };
    assert_eq!(r, cudarc::driver::sys::CUresult::CUDA_SUCCESS);
    ctx
}

fn context_child() {
    use cudarc::driver::sys;
    let (d0, d1) = (
        Arc::new(CudaDevice::new(0).unwrap()),
        Arc::new(CudaDevice::new(1).unwrap()),
    );
    let mut ctx0 = std::ptr::null_mut();
    // SAFETY: a live out-pointer; device 0 exists on the stub.
    unsafe {
        assert_eq!(sys::cuDevicePrimaryCtxRetain(&mut ctx0, 0), sys::CUresult::CUDA_SUCCESS);
    }
    // The caller has no context, then device 0's: calls on device 1 change neither.
    for caller in [std::ptr::null_mut(), ctx0] {
        // SAFETY: null or a context retained above.
        unsafe { assert_eq!(sys::cuCtxSetCurrent(caller), sys::CUresult::CUDA_SUCCESS) };
        let check = |what: &str| assert_eq!(current(), caller, "{what} changed the caller's context");
        let p = d1.allocate(1 << 20).unwrap();
        check("allocate");
        d1.free(p).unwrap();
        check("free");
        d1.mem_info().unwrap();
        check("mem_info");
        assert!(d1.stream_done(0, 0, 0));
        check("stream_done");
        d1.stream_wait(0, u64::MAX).unwrap();
        check("stream_wait");
        let vmm = d1.vmm().unwrap();
        let va = vmm.reserve(2 << 20).unwrap();
        vmm.map(va, 2 << 20).unwrap();
        vmm.unmap(va, 2 << 20).unwrap();
        vmm.unreserve(va).unwrap();
        check("vmm");
        // Two allocators, one per device, interleaved: each frees on its own device's context
        // (the stub refuses a free from another device's). The stub's devices share one capacity.
        let (a0, a1) = (
            Allocator::adaptive(d0.clone() as Arc<dyn Device>),
            Allocator::adaptive(d1.clone() as Arc<dyn Device>),
        );
        let blocks: Vec<_> = (0..16)
            .map(|i| {
                let a = if i % 2 == 0 { &a0 } else { &a1 };
                (i % 2, a.allocate_raw(3 << 20, 0).unwrap())
            })
            .collect();
        for (i, p) in blocks {
            let a = if i == 0 { &a0 } else { &a1 };
            a.deallocate(p, 0).unwrap();
        }
        drop((a0, a1));
        check("two allocators");
    }
    assert_eq!(d0.mem_info().unwrap().free, CAPACITY, "every byte back");
    println!("context checks passed");
}

/// cuMemUnmap is not stream-ordered: the stub fails (and counts) an unmap of memory that queued
/// work still uses. Blocks used by queued work and freed without any synchronization by the
/// caller (as PyTorch frees) go back to the driver page by page, and splice teardown unmaps, only
/// after the allocator waited for that work; one synchronization serves a whole release.
#[test]
fn pages_are_unmapped_only_after_queued_work_is_done() {
    in_child_on_stub(
        "pages_are_unmapped_only_after_queued_work_is_done",
        &[],
        "unmap checks passed",
        unmap_child,
    );
}

fn unmap_child() {
    use adaptalloc::strategy::SuballocConfig;
    use adaptalloc::{AllocatorConfig, StrategyConfig};
    let hooks = stub_hooks();
    let dev = Arc::new(CudaDevice::new(0).unwrap());
    assert!(dev.vmm_page_size().is_some(), "the stub has VMM: slabs are paged");
    let paged = SuballocConfig {
        page_release: true,
        ..SuballocConfig::default()
    };
    let alloc = Allocator::new(
        dev.clone() as Arc<dyn Device>,
        AllocatorConfig::new(StrategyConfig::Suballoc(paged)),
    );
    // Blocks over 24 pages; a kernel using each is queued; every other block is freed, the
    // caller never synchronizing. Pages under freed blocks only are then unused.
    let blocks: Vec<u64> = (0..48).map(|_| alloc.allocate_raw(1 << 20, 0).unwrap()).collect();
    for &p in &blocks {
        (hooks.queue_work)(p, 1 << 20);
    }
    for (i, &p) in blocks.iter().enumerate() {
        if (i / 4) % 2 == 0 {
            alloc.deallocate(p, 0).unwrap();
        }
    }
    let held = dev.mem_info().unwrap().free;
    let released = alloc.release_idle();
    assert!(released > 0, "unused pages went back");
    assert_eq!(dev.mem_info().unwrap().free, held + released, "every unmap succeeded");
    assert_eq!((hooks.unsafe_unmaps)(), 0, "no unmap while queued work used the pages");
    for (i, &p) in blocks.iter().enumerate() {
        if (i / 4) % 2 == 1 {
            alloc.deallocate(p, 0).unwrap();
        }
    }
    drop(alloc);
    assert_eq!(dev.mem_info().unwrap().free, CAPACITY, "every byte back");
    assert_eq!((hooks.unsafe_unmaps)(), 0);
    println!("unmap checks passed");
}

/// AdaptSlice on the stub, through cudarc's own context and stream: it refuses an allocator
/// whose device is not the stream's (a simulated device, and CUDA device 1 beside a stream on
/// device 0) and a length whose bytes overflow, serves one on the stream's device, and gives the
/// memory back to the allocator (never to cuMemFree) when dropped.
#[test]
fn adapt_slice_checks_the_device_and_returns_its_memory() {
    in_child_on_stub(
        "adapt_slice_checks_the_device_and_returns_its_memory",
        &[("STUB_CUDA_DEVICES", "2")],
        "adapt slice checks passed",
        adapt_slice_child,
    );
}

fn adapt_slice_child() {
    use adaptalloc::SimDevice;
    use adaptalloc::cudarc_ext::AdaptSlice;
    let ctx = cudarc::driver::CudaContext::new(0).expect("a cudarc context on stub device 0");
    let stream = ctx.default_stream();
    let wrong = |alloc: &Allocator, what: &str| match AdaptSlice::<f32>::new(alloc, &stream, 1024) {
        Err(AllocError::WrongDevice { stream_device: 0, .. }) => {}
        other => panic!("{what}: expected WrongDevice, got {other:?}"),
    };
    wrong(
        &Allocator::adaptive(Arc::new(SimDevice::new(1 << 30))),
        "a simulated device",
    );
    wrong(
        &Allocator::adaptive(Arc::new(CudaDevice::new(1).unwrap())),
        "CUDA device 1",
    );
    let dev = Arc::new(CudaDevice::new(0).unwrap());
    let alloc = Allocator::adaptive(dev.clone() as Arc<dyn Device>);
    assert!(matches!(
        AdaptSlice::<u64>::new(&alloc, &stream, usize::MAX),
        Err(AllocError::SizeOverflow { elem_bytes: 8, .. })
    ));
    let slices: Vec<_> = (1..=4)
        .map(|i| AdaptSlice::<f32>::new(&alloc, &stream, i << 18).expect("the stream's device"))
        .collect();
    assert_eq!(slices.iter().map(|s| s.len()).sum::<usize>(), 10 << 18);
    assert_eq!(alloc.stats().live_bytes.current, 10 << 20);
    drop(slices);
    assert_eq!(
        alloc.stats().live_bytes.current,
        0,
        "dropped slices go back to the allocator"
    );
    drop(alloc);
    assert_eq!(
        dev.mem_info().unwrap().free,
        CAPACITY,
        "every byte back once the allocator is gone"
    );
    println!("adapt slice checks passed");
}

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
