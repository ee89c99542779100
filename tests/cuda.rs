//! CudaDevice on a real GPU. Skips with a printed reason where no CUDA driver is present.

use std::sync::Arc;

use adaptalloc::device::Device;
use adaptalloc::{Allocator, CudaDevice, DeviceError, StrategyKind};

/// Prints past the harness's capture so a plain `cargo test` shows why a test did nothing.
fn skip(reason: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "SKIPPED: {reason}");
}

fn device() -> Option<CudaDevice> {
    match CudaDevice::new(0) {
        Ok(d) => Some(d),
        Err(e) => {
            skip(&format!("CUDA test needs a GPU: {e}"));
            None
        }
    }
}

/// The GPU, where it has virtual memory management (skips, saying so, where not).
fn vmm_device() -> Option<CudaDevice> {
    let dev = device()?;
    if dev.vmm().is_none() {
        skip("this GPU or driver has no virtual memory management");
        return None;
    }
    Some(dev)
}

#[test]
fn no_driver_is_a_clear_error_not_a_panic() {
    if CudaDevice::driver_present() {
        skip("a CUDA driver is present; this test checks the no-driver path");
        return;
    }
    match CudaDevice::new(0) {
        Err(DeviceError::NoDriver { .. }) => {}
        other => panic!("expected NoDriver, got {other:?}"),
    }
    let msg = CudaDevice::new(0).unwrap_err().to_string();
    assert!(msg.contains("no CUDA driver found"), "{msg}");
}

#[test]
fn allocates_frees_and_reports_memory_on_a_gpu() {
    let Some(dev) = device() else { return };
    let info = dev.mem_info().unwrap();
    assert!(info.total > 0 && info.free <= info.total);
    let p = dev.allocate(1 << 20).unwrap();
    assert_eq!(p % 256, 0);
    dev.free(p).unwrap();
    assert_eq!(dev.stats().driver_allocs, 1);
}

#[test]
fn every_strategy_runs_on_a_gpu() {
    let Some(dev) = device() else { return };
    let dev: Arc<dyn Device> = Arc::new(dev);
    for kind in StrategyKind::ALL {
        let alloc = Allocator::with_strategy(dev.clone(), kind);
        let blocks: Vec<_> = (0..64).map(|i| alloc.allocate((i + 1) * 4096, 0).unwrap()).collect();
        drop(blocks);
        let again = alloc.allocate(4096, 0).unwrap();
        assert_eq!(again.ptr() % 256, 0);
    }
}

#[test]
fn out_of_memory_on_a_gpu_is_a_typed_error() {
    let Some(dev) = device() else { return };
    let total = dev.mem_info().unwrap().total;
    match dev.allocate(total) {
        Err(e) => assert!(e.is_out_of_memory(), "{e:?}"),
        Ok(p) => {
            dev.free(p).unwrap();
            panic!("allocating the whole device should fail");
        }
    }
}

/// Spliced blocks map a held page a second time (cuMemRetainAllocationHandle, cuMemMap): the
/// driver must count that memory once and keep it until its last mapping goes.
#[test]
fn a_page_mapped_twice_on_a_gpu_is_memory_once() {
    let Some(dev) = vmm_device() else { return };
    let vmm = dev.vmm().expect("vmm_device checked");
    let page = vmm.page_size();
    let (a, b) = (vmm.reserve(page).unwrap(), vmm.reserve(page).unwrap());
    vmm.map(a, page).unwrap();
    let mapped_once = dev.mem_info().unwrap().free;
    vmm.map_alias(b, a, page).unwrap();
    // Other processes may move free memory a little meanwhile; a second page would be a page.
    let after_alias = dev.mem_info().unwrap().free;
    assert!(
        mapped_once.abs_diff(after_alias) < page,
        "{mapped_once} -> {after_alias}"
    );
    vmm.unmap(a, page).unwrap();
    vmm.unmap_alias(b, page).unwrap();
    let again = vmm.map_alias(b, a, page);
    if again.is_ok() {
        vmm.unmap_alias(b, page).unwrap();
    }
    vmm.unreserve(a).unwrap();
    vmm.unreserve(b).unwrap();
    assert!(again.is_err(), "nothing is mapped at a any more");
}

/// AdaptSlice refuses an allocator whose device is not the stream's (a simulated one here),
/// and serves one on the stream's device.
#[test]
fn adapt_slice_checks_the_allocator_device() {
    use adaptalloc::cudarc_ext::AdaptSlice;
    use adaptalloc::{AllocError, SimDevice};
    let Some(dev) = device() else { return };
    let ctx = cudarc::driver::CudaContext::new(0).expect("a context on device 0");
    let stream = ctx.default_stream();
    let sim = Allocator::adaptive(Arc::new(SimDevice::new(1 << 30)));
    match AdaptSlice::<f32>::new(&sim, &stream, 1024) {
        Err(AllocError::WrongDevice { stream_device: 0, .. }) => {}
        other => panic!("expected WrongDevice, got {other:?}"),
    }
    let alloc = Allocator::adaptive(Arc::new(dev));
    let slice = AdaptSlice::<f32>::new(&alloc, &stream, 1024).expect("the stream's device");
    assert_eq!(slice.len(), 1024);
}

/// Checkpoints on a GPU: memsets queued on a stream, a checkpoint, then far more memsets. The
/// checkpoint's work is not done at once; a wait until it returns while the later work still
/// runs (the wait is on the event, not the whole stream). Prints the times.
#[test]
fn a_wait_until_a_checkpoint_leaves_later_work_running_on_a_gpu() {
    use cudarc::driver::sys;
    let Some(dev) = device() else { return };
    let ctx = cudarc::driver::CudaContext::new(0).expect("a context on device 0");
    let stream = ctx.new_stream().expect("a stream");
    let id = adaptalloc::cudarc_ext::stream_id(&stream);
    let bytes = 1usize << 30;
    let buf = dev.allocate(bytes as u64).expect("1 GiB");
    // SAFETY: `buf` is a live 1 GiB allocation of this context until the end of the test.
    let memsets = |n: usize| unsafe { queue_memsets(&stream, buf, bytes, n) };
    let start = std::time::Instant::now();
    memsets(20);
    dev.stream_checkpoint(id, 1);
    assert!(!dev.stream_done(id, 1, 2), "20 GiB of memsets are not done at once");
    memsets(200);
    dev.stream_wait(id, 1).expect("the wait");
    let at_checkpoint = start.elapsed();
    // SAFETY: a live stream of the current context (cudarc made it current).
    let later = unsafe { sys::cuStreamQuery(stream.cu_stream()) };
    stream.synchronize().expect("the whole stream");
    let whole = start.elapsed();
    println!(
        "checkpoint reached after {at_checkpoint:?}; the whole stream after {whole:?}; later work pending at the checkpoint: {later:?}"
    );
    assert_eq!(
        later,
        sys::CUresult::CUDA_ERROR_NOT_READY,
        "200 GiB of memsets queued after the checkpoint were still running"
    );
    dev.free(buf).expect("free");
}

/// cuMemUnmap is not stream-ordered: memory freed while a stream's queued work still writes it
/// must not be unmapped before that work is done, or the work faults (an illegal address, which
/// poisons the context). Frees a 1 GiB block with 100 GiB of memsets queued into it, releases
/// every idle byte at once, then checks that pages were unmapped and the stream ended cleanly.
/// scripts/gpu-run.sh runs it in a process of its own (a fault would end every later test).
#[test]
fn release_after_a_free_with_queued_work_does_not_fault_on_a_gpu() {
    use cudarc::driver::sys;
    let Some(dev) = vmm_device() else { return };
    let ctx = cudarc::driver::CudaContext::new(0).expect("a context on device 0");
    let stream = ctx.new_stream().expect("a stream");
    let id = adaptalloc::cudarc_ext::stream_id(&stream);
    let dev: Arc<dyn Device> = Arc::new(dev);
    let alloc = Allocator::adaptive(dev.clone());
    let bytes = 1usize << 30;
    let buf = alloc.allocate_raw(bytes as u64, id).expect("1 GiB");
    let start = std::time::Instant::now();
    // SAFETY: `buf` is a live 1 GiB block of this device, freed only after the memsets are queued.
    unsafe { queue_memsets(&stream, buf, bytes, 100) };
    let before = dev.stats().ops;
    alloc.deallocate(buf, id).expect("free");
    let released = alloc.release_idle();
    let released_after = start.elapsed();
    let ops = dev.stats().ops.since(&before);
    // SAFETY: a live stream of the current context (cudarc made it current).
    let queued = unsafe { sys::cuStreamQuery(stream.cu_stream()) };
    let done = stream.synchronize();
    println!(
        "released {released} bytes after {released_after:?} ({} unmaps, {} synchronizations); stream at release: {queued:?}, then {done:?}",
        ops.unmap.calls, ops.unmap_sync.calls
    );
    assert!(
        released >= bytes as u64,
        "the freed block's memory went back: {released}"
    );
    assert!(ops.unmap.calls > 0, "the block's pages were unmapped");
    done.expect("the queued memsets ended without a fault");
    assert!(
        ops.unmap_sync.calls + ops.stream_sync.calls > 0,
        "the release waited before unmapping"
    );
    assert_eq!(
        queued,
        sys::CUresult::CUDA_SUCCESS,
        "the release waited for the queued work"
    );
}

/// Whether the driver maps part of a physical handle (cuMemMap at a non-zero offset): the free
/// pages inside a large handle that a live block keeps could then back a request elsewhere, as a
/// second mapping of memory already held (what spliced blocks do with whole pages). Maps the
/// third 2 MiB of an 8 MiB handle a second time and checks that both addresses see the same
/// bytes and that free memory did not fall by a page; skips, saying so, where the driver refuses
/// the offset (older CUDA documented it as "must be zero"). An H200 with driver 580 refused it
/// (CUDA_ERROR_NOT_SUPPORTED; tuning/reports/gpu-nvidia-h200.md): there a large handle's free
/// pages cannot serve a request elsewhere, and it strands until it is wholly idle.
#[test]
fn a_large_handle_maps_in_part_at_an_offset_on_a_gpu() {
    use cudarc::driver::sys;
    use sys::CUresult::CUDA_SUCCESS as OK;
    let Some(dev) = vmm_device() else { return };
    let vmm = dev.vmm().expect("vmm_device checked");
    let _ctx = cudarc::driver::CudaContext::new(0).expect("a context on device 0");
    let page = vmm.page_size();
    let a = filled_handle(vmm, 4);
    let b = vmm.reserve(page).unwrap();
    let free_before = dev.mem_info().unwrap().free;
    let mut handle: sys::CUmemGenericAllocationHandle = 0;
    // SAFETY: `a + 2 pages` is mapped (above); the handle reference taken is released below.
    let r = unsafe { sys::cuMemRetainAllocationHandle(&mut handle, (a + 2 * page) as *mut std::ffi::c_void) };
    assert_eq!(r, OK);
    // SAFETY: `b` is a fresh reservation of one page; `handle` is live (the reference above) and
    // holds four pages, so the page at offset 2 pages is inside it.
    let mapped = unsafe { sys::cuMemMap(b, page as usize, (2 * page) as usize, handle, 0) };
    // SAFETY: our reference; a mapping made above keeps its own.
    assert_eq!(unsafe { sys::cuMemRelease(handle) }, OK);
    if mapped != OK {
        vmm.unmap(a, 4 * page).unwrap();
        vmm.unreserve(a).unwrap();
        vmm.unreserve(b).unwrap();
        skip(&format!(
            "cuMemMap of part of a handle (offset 2 pages) refused: {mapped:?}"
        ));
        return;
    }
    let desc = sys::CUmemAccessDesc {
        location: sys::CUmemLocation {
            type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            id: 0,
        },
        flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    };
    // SAFETY: `b` was just mapped; `desc` is one live descriptor.
    assert_eq!(unsafe { sys::cuMemSetAccess(b, page as usize, &desc, 1) }, OK);
    let free_after = dev.mem_info().unwrap().free;
    let seen = (read_byte(b), read_byte(b + page - 1));
    // SAFETY: `b` is mapped with access granted above.
    assert_eq!(unsafe { sys::cuMemsetD8_v2(b, 0x77, page as usize) }, OK);
    let through_a = read_byte(a + 2 * page);
    // The first mapping goes; the second keeps its page readable, and free memory says whether
    // the driver keeps the whole handle for it (a large handle is given back only whole).
    vmm.unmap(a, 4 * page).unwrap();
    let free_without_a = dev.mem_info().unwrap().free;
    let still = read_byte(b);
    // SAFETY: unmaps the one mapping made here.
    assert_eq!(unsafe { sys::cuMemUnmap(b, page as usize) }, OK);
    let free_at_end = dev.mem_info().unwrap().free;
    println!(
        "part of a handle mapped at an offset: the second mapping reads {seen:?}, a write through it reads \
         {through_a:#x} at the first; free memory {free_before} -> {free_after} with both mapped, \
         {free_without_a} with the second alone (it reads {still:#x}), {free_at_end} with neither"
    );
    vmm.unreserve(a).unwrap();
    vmm.unreserve(b).unwrap();
    assert_eq!(still, 0x77, "the second mapping keeps its memory after the first goes");
    assert_eq!(seen, (3, 3), "the second mapping shows the handle's third page");
    assert_eq!(through_a, 0x77, "a write through the second mapping shows at the first");
    assert!(
        free_before.abs_diff(free_after) < page,
        "the second mapping took no new memory: {free_before} -> {free_after}"
    );
}

/// A handle of eight pages split keeping three (the device's way: a scratch range, copies,
/// the pages moved into place): each page kept reads what was written to it before, and the
/// other five pages' memory goes back.
#[test]
fn a_split_handle_keeps_its_live_pages_on_a_gpu() {
    let Some(dev) = vmm_device() else { return };
    let vmm = dev.vmm().expect("vmm_device checked");
    let _ctx = cudarc::driver::CudaContext::new(0).expect("a context on device 0");
    let page = vmm.page_size();
    let a = filled_handle(vmm, 8);
    let free_before = dev.mem_info().unwrap().free;
    vmm.quiesce().unwrap();
    let keep = [page, 4 * page, 6 * page];
    vmm.split_handle(a, 8 * page, &keep).expect("split on the device");
    let free_after = dev.mem_info().unwrap().free;
    let seen: Vec<(u8, u8)> = keep
        .iter()
        .map(|&o| (read_byte(a + o), read_byte(a + o + page - 1)))
        .collect();
    println!(
        "split: free memory {free_before} -> {free_after}; pages kept read {seen:?}; copies {:?}",
        dev.stats().ops.copy
    );
    for &o in &keep {
        vmm.unmap(a + o, page).unwrap();
    }
    vmm.unreserve(a).unwrap();
    assert_eq!(seen, vec![(2, 2), (5, 5), (7, 7)], "each page kept holds what it held");
    assert!(
        free_after >= free_before + 4 * page,
        "five pages went back: {free_before} -> {free_after}"
    );
}

/// One handle of `pages` pages, reserved and mapped, page `i` filled with the byte `i + 1`.
/// A context of device 0 must be current.
fn filled_handle(vmm: &dyn adaptalloc::device::VirtualMemory, pages: u8) -> u64 {
    use cudarc::driver::sys;
    let page = vmm.page_size();
    let bytes = u64::from(pages) * page;
    let a = vmm.reserve(bytes).unwrap();
    vmm.map_handles(a, bytes, bytes).expect("one handle of several pages");
    for i in 0..pages {
        // SAFETY: `a..a + bytes` is mapped with access granted just above.
        let r = unsafe { sys::cuMemsetD8_v2(a + u64::from(i) * page, i + 1, page as usize) };
        assert_eq!(r, sys::CUresult::CUDA_SUCCESS);
    }
    a
}

/// The byte at device address `at` (mapped and readable; a context current).
fn read_byte(at: u64) -> u8 {
    use cudarc::driver::sys;
    let mut byte = 0u8;
    // SAFETY: `at` is mapped and readable (the caller's contract); one byte into a live local.
    let r = unsafe { sys::cuMemcpyDtoH_v2((&mut byte as *mut u8).cast(), at, 1) };
    assert_eq!(r, sys::CUresult::CUDA_SUCCESS);
    byte
}

/// Queues `n` memsets of `bytes` at `buf` on `stream`, each checked.
///
/// # Safety
/// `buf..buf + bytes` must be device memory of the stream's context, live while the memsets are
/// queued (a free afterwards is what the tests check the allocator orders).
unsafe fn queue_memsets(stream: &cudarc::driver::CudaStream, buf: u64, bytes: usize, n: usize) {
    use cudarc::driver::sys;
    for _ in 0..n {
        // SAFETY: the caller's contract; the stream is live (borrowed).
        let r = unsafe { sys::cuMemsetD8Async(buf, 1, bytes, stream.cu_stream()) };
        assert_eq!(r, sys::CUresult::CUDA_SUCCESS);
    }
}
