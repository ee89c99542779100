//! Spliced blocks: on out-of-memory, the suballocator maps the free end of a held page a second
//! time at the start (or end) of a new block's own address range, so the block needs fewer fresh
//! pages than a driver allocation of its size would consume.

use std::sync::Arc;

use adaptalloc::device::{Device, SimDevice, VirtualMemory};
use adaptalloc::size::{KIB, MIB};
use adaptalloc::strategy::SuballocConfig;
use adaptalloc::{Allocator, AllocatorConfig, DeviceError, DevicePtr, StrategyConfig};

const PAGE: u64 = 2 * MIB;

#[test]
fn a_page_mapped_twice_is_memory_once_and_goes_back_with_its_last_mapping() {
    let dev = SimDevice::new(4 * PAGE);
    let vmm: &dyn VirtualMemory = dev.vmm().expect("SimDevice has vmm");
    let (a, b) = (vmm.reserve(PAGE).unwrap(), vmm.reserve(2 * PAGE).unwrap());
    vmm.map(a, PAGE).unwrap();
    vmm.map_alias(b + PAGE, a, PAGE).unwrap();
    assert_eq!(dev.used_bytes(), PAGE, "the second mapping consumes nothing");
    assert!(dev.is_backed(b + PAGE, PAGE));
    // Refused: over a mapping, from an unmapped page, unaligned, and undoing a first mapping.
    for r in [
        vmm.map_alias(b + PAGE, a, PAGE),
        vmm.map_alias(b, b, PAGE),
        vmm.map_alias(b + 256, a, PAGE),
        vmm.unmap_alias(a, PAGE),
        vmm.unmap(b + PAGE, PAGE),
    ] {
        assert!(matches!(r, Err(DeviceError::UnknownPointer { .. })), "{r:?}");
    }
    vmm.unmap(a, PAGE).unwrap();
    assert_eq!(dev.used_bytes(), PAGE, "still mapped at b");
    vmm.unmap_alias(b + PAGE, PAGE).unwrap();
    assert_eq!(dev.used_bytes(), 0, "its last mapping gave it back");
    vmm.unreserve(a).unwrap();
    vmm.unreserve(b).unwrap();
    assert_eq!(dev.leak_report().blocks, 0);
}

/// A page moved is the same memory, mapped somewhere else: nothing created or given back, one
/// map, one access grant and one unmap charged; it goes back with its new mapping. Refused
/// (nothing changes): onto a mapped page, from an unmapped one, and a page with a second
/// mapping (the move would leave that mapping naming memory the page no longer has).
#[test]
fn a_page_moved_is_the_same_memory_somewhere_else() {
    let dev = SimDevice::new(4 * PAGE);
    let vmm: &dyn VirtualMemory = dev.vmm().expect("SimDevice has vmm");
    let (a, b, c) = (
        vmm.reserve(2 * PAGE).unwrap(),
        vmm.reserve(2 * PAGE).unwrap(),
        vmm.reserve(PAGE).unwrap(),
    );
    vmm.map(a, 2 * PAGE).unwrap();
    let before = dev.stats().ops;
    vmm.move_handles(b, a, 2 * PAGE).unwrap();
    let ops = dev.stats().ops.since(&before);
    assert_eq!(
        (
            ops.create.calls,
            ops.release.calls,
            ops.map.calls,
            ops.set_access.calls,
            ops.unmap.calls
        ),
        (0, 0, 2, 1, 2)
    );
    assert_eq!(dev.used_bytes(), 2 * PAGE);
    assert!(dev.is_backed(b, 2 * PAGE) && !dev.is_backed(a, PAGE));
    assert_eq!(dev.physical_page(b + PAGE), Some(b + PAGE), "first mapped here now");
    vmm.map(a, PAGE).unwrap();
    vmm.map_alias(c, a, PAGE).unwrap();
    for r in [
        vmm.move_handles(b, a, PAGE),
        vmm.move_handles(a + PAGE, a + PAGE, PAGE),
        vmm.move_handles(a + PAGE, a, PAGE),
    ] {
        assert!(matches!(r, Err(DeviceError::UnknownPointer { .. })), "{r:?}");
    }
    assert_eq!(dev.used_bytes(), 3 * PAGE);
    vmm.unmap_alias(c, PAGE).unwrap();
    vmm.unmap(a, PAGE).unwrap();
    vmm.unmap(b, 2 * PAGE).unwrap();
    assert_eq!(dev.used_bytes(), 0);
    for r in [a, b, c] {
        vmm.unreserve(r).unwrap();
    }
    assert_eq!(dev.leak_report().blocks, 0);
}

/// A handle larger than a page is mapped again whole, never in part (cuMemMap maps a handle from
/// offset 0).
#[test]
fn a_larger_handle_is_mapped_again_whole() {
    let dev = SimDevice::new(8 * PAGE);
    let vmm: &dyn VirtualMemory = dev.vmm().expect("SimDevice has vmm");
    let (a, b) = (vmm.reserve(3 * PAGE).unwrap(), vmm.reserve(3 * PAGE).unwrap());
    vmm.map_handles(a, 3 * PAGE, 3 * PAGE).unwrap();
    for r in [
        vmm.map_alias(b, a, PAGE),
        vmm.map_alias(b, a + PAGE, PAGE),
        vmm.map_alias(b, a, 2 * PAGE),
    ] {
        assert!(matches!(r, Err(DeviceError::UnknownPointer { .. })), "{r:?}");
    }
    let maps = dev.stats().ops.map.calls;
    vmm.map_alias(b, a, 3 * PAGE).unwrap();
    assert_eq!(dev.stats().ops.map.calls, maps + 1, "one handle, one map");
    assert_eq!(dev.used_bytes(), 3 * PAGE);
    vmm.unmap(a, 3 * PAGE).unwrap();
    vmm.unmap_alias(b, 3 * PAGE).unwrap();
    assert_eq!(dev.used_bytes(), 0);
    vmm.unreserve(a).unwrap();
    vmm.unreserve(b).unwrap();
    assert_eq!(dev.leak_report().blocks, 0);
}

/// An allocator on slabs of `min_slab..max_slab` bytes backed page by page.
fn paged_slabs(dev: &Arc<SimDevice>, min_slab: u64, max_slab: u64) -> Allocator {
    let config = SuballocConfig {
        min_slab,
        max_slab,
        page_release: true,
        backing: adaptalloc::strategy::SlabBacking::Pages,
        ..SuballocConfig::default()
    };
    Allocator::new(
        dev.clone() as Arc<dyn Device>,
        AllocatorConfig::new(StrategyConfig::Suballoc(config)),
    )
}

/// An allocator on one-page slabs backed page by page.
fn one_page_slabs(dev: &Arc<SimDevice>) -> Allocator {
    paged_slabs(dev, PAGE, PAGE)
}

/// Frees `blocks`, drops the allocator and tenant 1's memory: the 8-page device is then whole
/// again, with nothing left allocated.
fn free_all_leaves_nothing(alloc: Allocator, dev: &SimDevice, blocks: impl IntoIterator<Item = DevicePtr>) {
    for p in blocks {
        alloc.deallocate(p, 0).unwrap();
    }
    // The allocator's own counts are the device's: a second mapping creates no handle, and
    // each of its handles' references goes back with it (tests/counts.rs for whole runs).
    let (s, d) = (alloc.stats(), dev.stats());
    assert_eq!(
        s.driver_allocs + d.failed_allocs,
        d.ops.physical_allocs(),
        "{:?}",
        d.ops
    );
    assert_eq!(s.driver_frees, d.ops.physical_frees(), "{:?}", d.ops);
    drop(alloc);
    dev.tenant_release(1);
    assert_eq!((dev.leak_report().blocks, free_bytes(dev)), (0, 8 * PAGE));
}

fn free_bytes(dev: &SimDevice) -> u64 {
    dev.mem_info().unwrap().free
}

/// The driver lets a handle's first mapping go while a second one keeps its memory; a handle
/// mapped at the freed address afterwards is other memory. (SimDevice named physical pages by
/// their first address, and the new page took the old one's count: a panic, found by the
/// metered counts' property test.)
#[test]
fn a_page_kept_by_its_second_mapping_is_not_the_next_page_mapped_where_it_was_first() {
    let dev = SimDevice::new(4 * PAGE);
    let vmm: &dyn VirtualMemory = dev.vmm().expect("SimDevice has vmm");
    let (a, b) = (vmm.reserve(PAGE).unwrap(), vmm.reserve(PAGE).unwrap());
    vmm.map(a, PAGE).unwrap();
    vmm.map_alias(b, a, PAGE).unwrap();
    vmm.unmap(a, PAGE).unwrap();
    assert_eq!(dev.used_bytes(), PAGE, "the second mapping keeps it");
    vmm.map(a, PAGE).unwrap();
    assert_eq!(dev.used_bytes(), 2 * PAGE, "a new page at the old address");
    assert_ne!(dev.physical_page(a), dev.physical_page(b));
    vmm.unmap_alias(b, PAGE).unwrap();
    assert_eq!(dev.used_bytes(), PAGE, "the kept page went with its last mapping");
    assert!(dev.is_backed(a, PAGE));
    vmm.unmap(a, PAGE).unwrap();
    assert_eq!(dev.used_bytes(), 0);
    vmm.unreserve(a).unwrap();
    vmm.unreserve(b).unwrap();
    assert_eq!(dev.leak_report().blocks, 0);
}

#[test]
fn a_request_that_fits_only_with_a_held_pages_free_end_is_spliced() {
    let dev = Arc::new(SimDevice::new(8 * PAGE));
    let alloc = one_page_slabs(&dev);
    // A small block holds page 0; its last 1.94 MiB are free.
    let small = alloc.allocate_raw(64 * KIB, 0).unwrap();
    // Another tenant leaves three pages: 7 MiB as a driver allocation needs four.
    dev.tenant_take(1, 4 * PAGE).unwrap();
    assert_eq!(free_bytes(&dev), 3 * PAGE);
    let big = alloc
        .allocate_raw(7 * MIB, 0)
        .expect("spliced: 1 MiB on page 0's end, 3 fresh pages");
    assert!(dev.is_backed(big, 7 * MIB));
    assert_eq!(free_bytes(&dev), 0);
    let s = alloc.stats();
    assert_eq!(
        (s.oom_recoveries, s.failed_allocs, s.reserved_bytes.current),
        (1, 0, 4 * PAGE)
    );
    // Page 0 still serves small requests between the small block and the spliced part.
    let mid = alloc.allocate_raw(512 * KIB, 0).unwrap();
    assert!((small..small + PAGE).contains(&mid));
    // Freeing the spliced block gives its fresh pages back; page 0 stays with its blocks.
    alloc.deallocate(big, 0).unwrap();
    assert_eq!(free_bytes(&dev), 3 * PAGE);
    assert_eq!(alloc.stats().reserved_bytes.current, PAGE);
    // Its part of page 0 is free again: 1 MiB there, with no driver call.
    let calls = dev.stats().driver_allocs;
    let again = alloc.allocate_raw(MIB, 0).unwrap();
    assert_eq!(dev.stats().driver_allocs, calls);
    free_all_leaves_nothing(alloc, &dev, [small, mid, again]);
}

#[test]
fn two_free_page_ends_hold_a_block_with_no_new_memory() {
    let dev = Arc::new(SimDevice::new(8 * PAGE));
    let alloc = one_page_slabs(&dev);
    // Pages A and B, each four 512 KiB blocks; A's last block and B's first are freed.
    let quarters = |alloc: &Allocator| -> Vec<DevicePtr> {
        let q: Vec<DevicePtr> = (0..4).map(|_| alloc.allocate_raw(512 * KIB, 0).unwrap()).collect();
        assert!(q.windows(2).all(|w| w[1] == w[0] + 512 * KIB), "one page, in order");
        q
    };
    let (a, b) = (quarters(&alloc), quarters(&alloc));
    alloc.deallocate(a[3], 0).unwrap();
    alloc.deallocate(b[0], 0).unwrap();
    let held = alloc.stats().reserved_bytes.current;
    assert_eq!(held, 2 * PAGE);
    dev.tenant_take(1, free_bytes(&dev)).unwrap();
    // 768 KiB fits no hole, and the device has no byte left: page A's end then page B's start.
    let spliced = alloc.allocate_raw(768 * KIB, 0).expect("spliced from two page ends");
    assert!(dev.is_backed(spliced, 768 * KIB));
    assert_eq!(alloc.stats().reserved_bytes.current, held, "no new memory");
    // What the two ends still hold is not handed out twice: a 256 KiB block fits in what is
    // left of them (256 KiB of page B's start), and then nothing does.
    let rest = alloc.allocate_raw(256 * KIB, 0).unwrap();
    let mut ranges: Vec<(DevicePtr, u64)> = a[..3].iter().chain(&b[1..]).map(|&p| (p, 512 * KIB)).collect();
    ranges.extend([(spliced, 768 * KIB), (rest, 256 * KIB)]);
    assert_disjoint(&ranges);
    assert!(alloc.allocate_raw(256 * KIB, 0).is_err());
    free_all_leaves_nothing(alloc, &dev, ranges.into_iter().map(|(p, _)| p));
}

/// Address ranges that must not overlap (distinct ranges of one address space; the spliced
/// block's own range shows the same memory as two slab ranges, which the allocator keeps used).
fn assert_disjoint(ranges: &[(DevicePtr, u64)]) {
    for (i, &(p, n)) in ranges.iter().enumerate() {
        for &(q, m) in &ranges[i + 1..] {
            assert!(p + n <= q || q + m <= p, "{p:#x}+{n} overlaps {q:#x}+{m}");
        }
    }
}

#[test]
fn blocks_in_slabs_of_their_own_alternate_ends_so_splices_find_both() {
    let dev = Arc::new(SimDevice::new(8 * PAGE));
    let alloc = one_page_slabs(&dev);
    // Each 3 MiB block gets a two-page slab of its own: one leaves its slab's last 1 MiB free,
    // the other its first 1 MiB.
    let x = alloc.allocate_raw(3 * MIB, 0).unwrap();
    let y = alloc.allocate_raw(3 * MIB, 0).unwrap();
    let (start, end) = (|p: DevicePtr| p % PAGE == 0, |p: DevicePtr| (p + 3 * MIB) % PAGE == 0);
    assert!(
        (start(x) && end(y)) || (end(x) && start(y)),
        "one at its slab's start, the other at its end: {x:#x}, {y:#x}"
    );
    dev.tenant_take(1, free_bytes(&dev)).unwrap();
    // A page's worth with no memory left: one slab's free end, then the other's free start.
    let z = alloc
        .allocate_raw(PAGE, 0)
        .expect("spliced from the two slabs' free ends");
    assert!(dev.is_backed(z, PAGE));
    assert_eq!(alloc.stats().reserved_bytes.current, 4 * PAGE, "no new memory");
    free_all_leaves_nothing(alloc, &dev, [x, y, z]);
}

#[test]
fn blocks_that_would_straddle_a_page_alternate_ends() {
    let dev = Arc::new(SimDevice::new(32 * PAGE));
    let alloc = paged_slabs(&dev, 8 * PAGE, SuballocConfig::default().max_slab);
    // 1.5 MiB blocks one after another. The 2nd, 4th and 5th would straddle a page boundary
    // where they come (the 3rd comes on one), so they move to start on the next boundary or to
    // end on it, every other time: the 2nd ends on one, the 4th starts, the 5th ends.
    let blocks: Vec<DevicePtr> = (0..5).map(|_| alloc.allocate_raw(1536 * KIB, 0).unwrap()).collect();
    let (starts, ends): (Vec<bool>, Vec<bool>) = blocks
        .iter()
        .map(|&b| (b % PAGE == 0, (b + 1536 * KIB) % PAGE == 0))
        .unzip();
    assert!(
        blocks.iter().all(|&b| b / PAGE == (b + 1536 * KIB - 1) / PAGE),
        "none straddles"
    );
    assert_eq!(starts, [true, false, true, true, false], "{blocks:#x?}");
    assert_eq!(ends, [false, true, false, false, true], "{blocks:#x?}");
    for p in blocks {
        alloc.deallocate(p, 0).unwrap();
    }
}

/// A spliced block counts as what a driver allocation of it would consume, not as its parts
/// rounded up one by one: a 1.75 MiB block on 1.5 MiB of one page's free end and 0.25 MiB of
/// another's start is 2 MiB to the driver, where the parts alone would count 2.25 MiB (the
/// first rounds up to a page). Stranded bytes (pages live blocks touch, less what the driver
/// would consume for the blocks) then match the simple reference, and the strand guard sees
/// them all.
#[test]
fn a_spliced_block_counts_its_own_footprint_not_its_parts() {
    let dev = Arc::new(SimDevice::new(8 * PAGE));
    let alloc = one_page_slabs(&dev);
    let quarter = 512 * KIB;
    let a: Vec<DevicePtr> = (0..4).map(|_| alloc.allocate_raw(quarter, 0).unwrap()).collect();
    let b: Vec<DevicePtr> = (0..4).map(|_| alloc.allocate_raw(quarter, 0).unwrap()).collect();
    // A third page with a hole in its middle that no end shows: it pins a page for 768 KiB.
    let c = [64 * KIB, 1280 * KIB, 704 * KIB].map(|n| alloc.allocate_raw(n, 0).unwrap());
    for p in [a[1], a[2], a[3], b[0], c[1]] {
        alloc.deallocate(p, 0).unwrap();
    }
    dev.tenant_take(1, free_bytes(&dev)).unwrap();
    let spliced = alloc.allocate_raw(1792 * KIB, 0).expect("spliced from two page ends");
    assert!(dev.is_backed(spliced, 1792 * KIB));
    let live = [
        (a[0], quarter),
        (b[1], quarter),
        (b[2], quarter),
        (b[3], quarter),
        (c[0], 64 * KIB),
        (c[2], 704 * KIB),
    ];
    let pages: std::collections::BTreeSet<u64> = live.iter().map(|&(p, _)| p / PAGE).collect();
    assert_eq!(pages.len(), 3, "three pages hold the live blocks");
    let consumed: u64 = live.iter().map(|&(_, n)| n).sum::<u64>() + PAGE;
    assert_eq!(alloc.stats().stranded_bytes, 3 * PAGE - consumed);
    let rest = live.iter().map(|&(p, _)| p).chain([spliced]);
    free_all_leaves_nothing(alloc, &dev, rest.collect::<Vec<_>>());
}

/// The largest free page end and the largest free page start can be the two ends of one free
/// node, which one block cannot take both of: the splice then pairs each with the runner-up of
/// the other kind from another node, where that holds more than the larger end alone.
#[test]
fn a_splice_pairs_ends_of_different_nodes_when_the_largest_share_one() {
    let dev = Arc::new(SimDevice::new(8 * PAGE));
    let alloc = paged_slabs(&dev, 4 * PAGE, 4 * PAGE);
    // Two four-page slabs filled with 128 KiB blocks, in address order.
    let fill = |alloc: &Allocator| -> Vec<DevicePtr> {
        let b: Vec<DevicePtr> = (0..64).map(|_| alloc.allocate_raw(128 * KIB, 0).unwrap()).collect();
        assert!(b.windows(2).all(|w| w[1] == w[0] + 128 * KIB), "one slab, in order");
        b
    };
    let (s, t) = (fill(&alloc), fill(&alloc));
    // Slab S keeps its first 1.5 MiB and its last 1.75 MiB: the free node between starts with
    // a 0.5 MiB free end of page 0 and ends with a 0.25 MiB free start of page 3. Slab T keeps
    // its first 1.625 MiB: a 0.375 MiB free end of its page 0.
    let kept: Vec<DevicePtr> = s[..12].iter().chain(&s[50..]).chain(&t[..13]).copied().collect();
    for &p in s[12..50].iter().chain(&t[13..]) {
        alloc.deallocate(p, 0).unwrap();
    }
    alloc.release_idle();
    let held = alloc.stats().reserved_bytes.current;
    assert_eq!(held, 3 * PAGE, "pages no live block touches went back");
    dev.tenant_take(1, free_bytes(&dev)).unwrap();
    // 576 KiB fits no hole, and the device has no byte left. S's free end alone (0.5 MiB) would
    // need a fresh page; T's free end and S's free start (0.625 MiB) need none.
    let z = alloc
        .allocate_raw(576 * KIB, 0)
        .expect("spliced from T's free end and S's free start");
    assert!(dev.is_backed(z, 576 * KIB));
    assert_eq!(alloc.stats().reserved_bytes.current, held, "no new memory");
    let mut ranges: Vec<(DevicePtr, u64)> = kept.iter().map(|&p| (p, 128 * KIB)).collect();
    ranges.push((z, 576 * KIB));
    assert_disjoint(&ranges);
    free_all_leaves_nothing(alloc, &dev, ranges.into_iter().map(|(p, _)| p));
}
