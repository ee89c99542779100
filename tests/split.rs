//! Handles split on out-of-memory: a slab handle of more than a page that a few live blocks
//! keep mapped is replaced by pages of its own for the pages those blocks touch (their contents
//! copied, their addresses unchanged), and the rest of it goes back to the device.

use std::sync::Arc;

use adaptalloc::device::{CostModel, Device, SimDevice, VirtualMemory};
use adaptalloc::size::MIB;
use adaptalloc::strategy::{SlabBacking, SuballocConfig};
use adaptalloc::{Allocator, AllocatorConfig, DeviceError, StrategyConfig};

const PAGE: u64 = 2 * MIB;

/// The device's part: the pages kept hold what they held and stay where they were, the rest
/// goes back, and each call is charged as CudaDevice makes it. Refused, changing nothing: part
/// of a handle, a page handle, pages out of order or off a page, a handle mapped a second time.
#[test]
fn a_split_handle_keeps_its_live_pages_in_place_and_gives_back_the_rest() {
    let m = CostModel::default();
    let dev = SimDevice::builder().capacity(64 * PAGE).cost_model(m.clone()).build();
    let vmm: &dyn VirtualMemory = dev.vmm().expect("SimDevice has vmm");
    let (a, b, c) = (
        vmm.reserve(8 * PAGE).unwrap(),
        vmm.reserve(PAGE).unwrap(),
        vmm.reserve(4 * PAGE).unwrap(),
    );
    vmm.map_handles(a, 8 * PAGE, 8 * PAGE).unwrap();
    vmm.map(b, PAGE).unwrap();
    vmm.map_handles(c, 4 * PAGE, 4 * PAGE).unwrap();
    let alias = vmm.reserve(4 * PAGE).unwrap();
    vmm.map_alias(alias, c, 4 * PAGE).unwrap();
    assert!(dev.write_stamp(a + PAGE + 17, 11) && dev.write_stamp(a + 6 * PAGE, 66));
    let used = dev.used_bytes();
    for r in [
        vmm.split_handle(a, 4 * PAGE, &[PAGE]),
        vmm.split_handle(b, PAGE, &[]),
        vmm.split_handle(a, 8 * PAGE, &[6 * PAGE, PAGE]),
        vmm.split_handle(a, 8 * PAGE, &[PAGE + 4096]),
        vmm.split_handle(a, 8 * PAGE, &[8 * PAGE]),
        vmm.split_handle(c, 4 * PAGE, &[0]),
    ] {
        assert!(matches!(r, Err(DeviceError::UnknownPointer { .. })), "{r:?}");
    }
    assert_eq!(dev.used_bytes(), used, "a refusal changes nothing");
    let before = dev.stats().ops;
    vmm.split_handle(a, 8 * PAGE, &[PAGE, 6 * PAGE]).unwrap();
    let ops = dev.stats().ops.since(&before);
    assert_eq!(dev.used_bytes(), used - 6 * PAGE, "six pages back");
    assert_eq!((dev.stamp(a + PAGE), dev.stamp(a + 6 * PAGE)), (Some(11), Some(66)));
    assert!(dev.is_backed(a + PAGE, PAGE) && dev.is_backed(a + 6 * PAGE, PAGE));
    assert!(!dev.is_backed(a, PAGE) && !dev.is_backed(a + 2 * PAGE, 4 * PAGE));
    assert_eq!(vmm.handles_in(a, 8 * PAGE), 2, "a page handle each");
    // Two pages created and copied (a scratch range mapped, then moved into place), one
    // handle of 16 MiB unmapped and released.
    assert_eq!((ops.create.calls, ops.copy.calls, ops.release.calls), (2, 2, 1));
    assert_eq!(ops.copy.ns, 2 * m.vmm.copy_ns.ns(PAGE));
    assert_eq!(ops.release.ns, m.vmm.release_ns.ns(8 * PAGE));
    assert_eq!(ops.unmap.calls, 3, "the handle, and each scratch page moved");
    // The pages kept are pages like any other: unmapped one at a time.
    vmm.quiesce().unwrap();
    vmm.unmap(a + PAGE, PAGE).unwrap();
    vmm.unmap(a + 6 * PAGE, PAGE).unwrap();
    vmm.unmap_alias(alias, 4 * PAGE).unwrap();
    vmm.unmap(c, 4 * PAGE).unwrap();
    vmm.unmap(b, PAGE).unwrap();
    for r in [a, b, c, alias] {
        vmm.unreserve(r).unwrap();
    }
    assert_eq!(dev.used_bytes(), 0);
    assert_eq!(dev.leak_report().blocks, 0);
}

/// An allocator on one 32 MiB slab in 4 MiB handles (`large-handles`), on a 64 MiB device.
fn large_handle_slabs(dev: &Arc<SimDevice>) -> Allocator {
    let config = SuballocConfig {
        min_slab: 16 * PAGE,
        max_slab: 16 * PAGE,
        page_release: true,
        backing: SlabBacking::LargeHandles,
        ..SuballocConfig::default()
    };
    Allocator::new(
        dev.clone() as Arc<dyn Device>,
        AllocatorConfig::new(StrategyConfig::Suballoc(config)),
    )
}

/// One live 1 MiB block in each 4 MiB handle of a 32 MiB slab strands 24 MiB that no release
/// reaches, so a 40 MiB request finds 32 MiB free. Out of memory, each handle is split: its
/// live page copied to a page of its own at the same address (the block's contents with it),
/// its idle page given back; the request is then served. Without the split it fails.
#[test]
fn out_of_memory_splits_handles_a_few_live_blocks_hold() {
    let dev = Arc::new(
        SimDevice::builder()
            .capacity(32 * PAGE)
            .cost_model(CostModel::default())
            .build(),
    );
    let alloc = large_handle_slabs(&dev);
    let blocks: Vec<u64> = (0..32).map(|_| alloc.allocate_raw(MIB, 0).unwrap()).collect();
    assert_eq!(dev.used_bytes(), 16 * PAGE, "one slab");
    let live: Vec<u64> = blocks.iter().copied().step_by(4).collect();
    for &p in blocks.iter().filter(|p| !live.contains(p)) {
        alloc.deallocate(p, 0).unwrap();
    }
    for (i, &p) in live.iter().enumerate() {
        assert!(dev.write_stamp(p, 100 + i as u64));
    }
    alloc.release_idle();
    assert_eq!(dev.used_bytes(), 16 * PAGE, "every handle is held by a live block");
    let before = dev.stats().ops;
    let big = alloc
        .allocate_raw(20 * PAGE, 0)
        .expect("served once the handles are split");
    let ops = dev.stats().ops.since(&before);
    assert_eq!(ops.copy.calls, 8, "one live page copied in each of the eight handles");
    assert_eq!(alloc.stats().oom_recoveries, 1);
    for (i, &p) in live.iter().enumerate() {
        assert!(dev.is_backed(p, MIB));
        assert_eq!(dev.stamp(p), Some(100 + i as u64), "block {i} kept its contents");
    }
    assert_eq!(dev.used_bytes(), 8 * PAGE + 20 * PAGE);
    for p in live.into_iter().chain([big]) {
        alloc.deallocate(p, 0).unwrap();
    }
    alloc.release_idle();
    assert_eq!(dev.used_bytes(), 0, "the split pages go back as pages");
}
