//! CudaDevice's own code on the CPU: a stub libcuda (tests/stub/libcuda.c, host memory with a
//! set capacity) built with the system C compiler and loaded through cudarc's dynamic loading.
//! The test re-runs itself in a child process with LD_LIBRARY_PATH pointing at the stub, since
//! the loader reads it at process start. Skips, saying why, where no C compiler exists or a
//! real CUDA driver is present.

mod common;

use std::sync::Arc;

use adaptalloc::{AllocError, Allocator, CudaDevice, Device, DeviceError};
use adaptalloc_cli::compare::Contender;
use adaptalloc_cli::synth::WorkloadSpec;
use adaptalloc_cli::trace::replay;

use common::stub::{CAPACITY, in_child_on_stub, stub_hooks};

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
    // A larger handle split into pages (out-of-memory's last resort): the pages kept hold what
    // they held, copied on the device after queued work is done; the rest goes back.
    let hooks = stub_hooks();
    let h = vmm.reserve(8 * PAGE).unwrap();
    vmm.map_handles(h, 8 * PAGE, 8 * PAGE).unwrap();
    assert_eq!((hooks.write_tag)(h + PAGE + 5, 11), 1);
    assert_eq!((hooks.write_tag)(h + 6 * PAGE, 66), 1);
    let free = dev.mem_info().unwrap().free;
    assert!(
        vmm.split_handle(h, 8 * PAGE, &[6 * PAGE, PAGE]).is_err(),
        "pages out of order"
    );
    assert!(vmm.split_handle(h, 4 * PAGE, &[PAGE]).is_err(), "part of a handle");
    assert!(vmm.split_handle(h, 8 * PAGE, &[3 * PAGE / 2]).is_err(), "off a page");
    assert_eq!(dev.mem_info().unwrap().free, free, "a refusal changes nothing");
    (hooks.queue_work)(h + PAGE, 100);
    vmm.quiesce().unwrap();
    vmm.split_handle(h, 8 * PAGE, &[PAGE, 6 * PAGE]).unwrap();
    assert_eq!((hooks.unsafe_unmaps)(), 0);
    assert_eq!(dev.mem_info().unwrap().free, free + 6 * PAGE, "six pages back");
    assert_eq!(
        ((hooks.read_tag)(h + PAGE), (hooks.read_tag)(h + 6 * PAGE)),
        (11, 66),
        "the pages kept hold what they held"
    );
    assert_eq!((hooks.read_tag)(h + 2 * PAGE), 0, "not mapped any more");
    assert_eq!(vmm.handles_in(h + PAGE, PAGE), 1, "a page of its own");
    vmm.unmap(h + PAGE, PAGE).unwrap();
    vmm.unmap(h + 6 * PAGE, PAGE).unwrap();
    vmm.unreserve(h).unwrap();
    assert_eq!(dev.mem_info().unwrap().free, CAPACITY);
    // With no room beside the handle (it takes the whole device), the pages kept go through
    // host memory: copied out, the handle unmapped, new pages mapped in place, copied back.
    let n = CAPACITY / PAGE;
    let h = vmm.reserve(n * PAGE).unwrap();
    vmm.map_handles(h, n * PAGE, n * PAGE).unwrap();
    assert_eq!(dev.mem_info().unwrap().free, 0);
    (hooks.write_tag)(h, 7);
    (hooks.write_tag)(h + 3 * PAGE, 33);
    (hooks.write_tag)(h + 4 * PAGE, 44);
    vmm.split_handle(h, n * PAGE, &[0, 3 * PAGE, 4 * PAGE]).unwrap();
    assert_eq!(dev.mem_info().unwrap().free, CAPACITY - 3 * PAGE);
    assert_eq!(
        [0, 3, 4].map(|p| (hooks.read_tag)(h + p * PAGE)),
        [7, 33, 44],
        "the pages kept hold what they held"
    );
    assert_eq!(vmm.handles_in(h + 3 * PAGE, 2 * PAGE), 2, "a page each");
    vmm.unmap(h, PAGE).unwrap();
    vmm.unmap(h + 3 * PAGE, 2 * PAGE).unwrap();
    vmm.unreserve(h).unwrap();
    assert_eq!(dev.mem_info().unwrap().free, CAPACITY);
    // Every driver call above was timed by kind, and the kinds add up to the total.
    let st = dev.stats();
    let o = st.ops;
    assert!(o.create.calls >= 2 + 4 && o.map.calls >= o.create.calls && o.unmap.calls > 0 && o.release.calls > 0);
    assert!(o.reserve.calls >= 5 && o.unreserve.calls >= 5 && o.set_access.calls > 0 && o.alloc.calls > 0);
    assert_eq!(
        o.copy.calls,
        2 + 2 * 3,
        "a copy for each page kept, two through the host"
    );
    assert_eq!(st.driver_ns, o.total_ns(), "{o:?}");
    // With slabs a handle per page, pages freed inside a slab that still holds live blocks go
    // back to the driver.
    let dev: Arc<dyn Device> = Arc::new(dev);
    {
        let a = Allocator::with_policy(dev.clone(), common::pages_policy());
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
        backing: adaptalloc::strategy::SlabBacking::Pages,
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
