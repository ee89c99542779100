//! The suballocator's counts under random churn, with the accounting invariants checked on every
//! event (they are active in the library's unit tests): whole and paged slabs, several streams,
//! a tight device where out-of-memory leads to page release and splicing.

use super::*;
use crate::device::SimDevice;
use crate::rng::SplitMix64;
use crate::size::{GIB, KIB};

/// Runs `ops` random allocations and frees on `dev`; returns how many blocks were spliced.
fn churn(dev: &SimDevice, config: SuballocConfig, seed: u64, ops: usize) -> u64 {
    let mut sub = Suballoc::new(config);
    let mut rng = SplitMix64(seed);
    let mut live: Vec<(Grant, StreamId)> = Vec::new();
    let mut spliced = 0;
    let free = |sub: &mut Suballoc, (g, stream): (Grant, StreamId), now: u64| match g.meta {
        BlockMeta::Spliced { .. } => sub.free_spliced(dev, g.meta, stream, now),
        _ => sub.deallocate(dev, g.meta, stream, now),
    };
    for op in 0..ops as u64 {
        if live.is_empty() || rng.below(100) < 55 {
            // Small blocks, page-sized ones and a few of several pages.
            let bytes = match rng.below(10) {
                0..=5 => (1 + rng.below(64)) * 4 * KIB,
                6..=8 => (1 + rng.below(8)) * 512 * KIB,
                _ => (1 + rng.below(6)) * MIB,
            };
            let stream = rng.below(3);
            let got = match sub.allocate(dev, bytes, stream) {
                Ok(g) => Some(g),
                Err(e) if e.is_out_of_memory() => {
                    sub.release_empty_slabs(dev, 0);
                    sub.unmap_unused(dev, u64::MAX);
                    sub.allocate(dev, bytes, stream)
                        .ok()
                        .or_else(|| sub.allocate_spliced(dev, bytes, stream))
                }
                Err(e) => panic!("{e}"),
            };
            if let Some(g) = got {
                spliced += u64::from(matches!(g.meta, BlockMeta::Spliced { .. }));
                live.push((g, stream));
            }
        } else {
            let i = rng.below(live.len() as u64) as usize;
            free(&mut sub, live.swap_remove(i), op);
        }
        if rng.below(50) == 0 {
            sub.synchronize_stream(rng.below(3));
        }
        assert!(sub.acct.reserved() <= dev.capacity() + sub.acct.empty());
    }
    for entry in live.drain(..) {
        free(&mut sub, entry, ops as u64);
    }
    assert_eq!((sub.acct.used(), sub.acct.pinned(), sub.acct.consumed()), (0, 0, 0));
    sub.release_empty_slabs(dev, 0);
    assert_eq!(sub.acct.reserved(), 0, "every byte back once all is free");
    assert_eq!(dev.used_bytes(), 0);
    spliced
}

#[test]
fn counts_hold_under_random_churn() {
    let mut spliced = 0;
    for seed in 0..6 {
        for (paged, segregate) in [(false, false), (true, false), (true, true)] {
            let config = SuballocConfig {
                page_release: paged,
                segregate,
                ..SuballocConfig::default()
            };
            let dev = SimDevice::new(48 * MIB);
            spliced += churn(&dev, config, seed, 3000);
        }
    }
    assert!(spliced > 0, "the tight runs spliced some blocks");
}

/// Pages are unmapped only after the device quiesced, once per release: one synchronization
/// serves every unmap until the next free.
#[test]
fn one_synchronization_serves_a_release() {
    let dev = SimDevice::new(256 * MIB);
    // Emptied slabs are kept (released below, not on each free).
    let config = SuballocConfig {
        page_release: true,
        max_empty_bytes: u64::MAX,
        ..SuballocConfig::default()
    };
    let mut sub = Suballoc::new(config);
    let blocks: Vec<Grant> = (0..32).map(|_| sub.allocate(&dev, MIB, 0).unwrap()).collect();
    for (i, g) in blocks.iter().enumerate() {
        if i % 4 != 0 {
            sub.deallocate(&dev, g.meta, 0, 1 + i as u64);
        }
    }
    assert_eq!(dev.quiesces(), 0, "nothing unmapped yet");
    let released = sub.unmap_unused(&dev, u64::MAX);
    assert!(released >= 8 * MIB, "several runs of pages went back ({released} B)");
    assert_eq!(dev.quiesces(), 1, "one synchronization for all of them");
    assert_eq!(sub.unmap_unused(&dev, u64::MAX), 0);
    assert_eq!(dev.quiesces(), 1, "nothing to unmap: no synchronization");
    for (i, g) in blocks.iter().enumerate() {
        if i % 4 == 0 {
            sub.deallocate(&dev, g.meta, 0, 100 + i as u64);
        }
    }
    sub.release_empty_slabs(&dev, 0);
    assert_eq!(dev.quiesces(), 2, "a free since: the next release waits again");
    assert_eq!(dev.used_bytes(), 0);
}

/// Each backing maps a slab as it says: device pages (a create each), large handles (an eighth
/// of the slab each, released whole) or one whole driver allocation; and the random churn's
/// counts hold under large handles too (a tight device: out-of-memory, release, no splicing of
/// a handle's pages).
#[test]
fn slabs_are_backed_as_the_engine_says() {
    let config = SuballocConfig {
        page_release: true,
        min_slab: 64 * MIB,
        max_empty_bytes: u64::MAX,
        ..SuballocConfig::default()
    };
    for (backing, creates, driver_allocs) in [
        (SlabBacking::Pages, 32, 0),
        (SlabBacking::LargeHandles, 8, 0),
        (SlabBacking::Whole, 0, 1),
    ] {
        let dev = SimDevice::new(GIB);
        let mut sub = Suballoc::new(SuballocConfig { backing, ..config });
        let g = sub.allocate(&dev, MIB, 0).unwrap();
        let ops = dev.stats().ops;
        assert_eq!(
            (ops.create.calls, ops.alloc.calls),
            (creates, driver_allocs),
            "{backing:?}"
        );
        sub.deallocate(&dev, g.meta, 0, 1);
        sub.release_empty_slabs(&dev, 0);
        assert_eq!(dev.leak_report().blocks, 0, "{backing:?}");
    }
    // A free 8 MiB handle in a slab in use goes back whole; a used one stays.
    let dev = SimDevice::new(GIB);
    let mut sub = Suballoc::new(SuballocConfig {
        backing: SlabBacking::LargeHandles,
        ..config
    });
    let blocks: Vec<Grant> = (0..16).map(|_| sub.allocate(&dev, 4 * MIB, 0).unwrap()).collect();
    for (i, g) in blocks.iter().enumerate().skip(2) {
        sub.deallocate(&dev, g.meta, 0, 1 + i as u64);
    }
    assert_eq!(sub.unmap_unused(&dev, u64::MAX), 56 * MIB, "seven of the eight handles");
    assert_eq!(dev.used_bytes(), 8 * MIB);
    for g in &blocks[..2] {
        sub.deallocate(&dev, g.meta, 0, 100);
    }
    sub.release_empty_slabs(&dev, 0);
    assert_eq!(dev.leak_report().blocks, 0);
    for seed in 0..4 {
        let dev = SimDevice::new(48 * MIB);
        let config = SuballocConfig {
            page_release: true,
            backing: SlabBacking::LargeHandles,
            ..SuballocConfig::default()
        };
        churn(&dev, config, seed, 3000);
    }
}

/// Handles shaped to blocks, on slabs of 64 MiB kept when empty.
fn blocks_config() -> SuballocConfig {
    SuballocConfig {
        page_release: true,
        backing: SlabBacking::Blocks,
        min_slab: 64 * MIB,
        max_empty_bytes: u64::MAX,
        ..SuballocConfig::default()
    }
}

/// Under `SlabBacking::Blocks` a block gets one handle for the pages it covers whole and a page
/// for each one it may share. An idle handle that a later, smaller block covers in part is
/// pinned by the block's pages only, guard or none: out of memory, the handle is split and its
/// other pages go back (`split_held_handles`).
#[test]
fn blocks_get_handles_shaped_to_them() {
    let config = blocks_config();
    for guard in [None, Some(0)] {
        let dev = SimDevice::new(GIB);
        let mut sub = Suballoc::new(config);
        sub.set_strand_budget(guard);
        let a = sub.allocate(&dev, 9 * MIB, 0).unwrap();
        let ops = dev.stats().ops;
        assert_eq!(ops.create.calls, 2, "an 8 MiB handle and the page it may share");
        assert_eq!(
            dev.used_bytes(),
            10 * MIB,
            "nothing of the slab's 64 MiB beyond the block"
        );
        sub.deallocate(&dev, a.meta, 0, 1);
        let b = sub.allocate_guarded(&dev, 3 * MIB, 0).unwrap().expect("placed");
        let ops = dev.stats().ops;
        assert_eq!((ops.create.calls, ops.unmap.calls), (2, 0), "placed in the handle");
        assert_eq!(sub.stranded_bytes(), 0, "its two pages, as the driver would consume");
        let split = sub.split_held_handles(&dev, 8 * MIB);
        assert_eq!((split.released, split.into_pages), (4 * MIB, 0), "{guard:?}");
        sub.deallocate(&dev, b.meta, 0, 2);
        sub.release_empty_slabs(&dev, 0);
        assert_eq!((dev.used_bytes(), dev.leak_report().blocks), (0, 0), "{guard:?}");
    }
    // Random churn on a tight device (out-of-memory, release, splicing of single pages).
    for seed in 0..4 {
        let dev = SimDevice::new(48 * MIB);
        churn(&dev, config, seed, 3000);
    }
}

/// A splice starts only in the free end of a page: a larger handle mapped again could not be
/// split while the splice lived. Out of memory, a handle live blocks touch on every page but
/// with free bytes inside is split into pages first (nothing goes back), and a splice then
/// finds those bytes at page ends; the blocks keep their contents.
#[test]
fn splices_start_in_page_ends_after_a_split_into_pages() {
    let config = one_handle_slabs();
    let dev = SimDevice::new(12 * MIB);
    let mut sub = Suballoc::new(config);
    // Eight blocks of 960 KiB, one after another: every page touched.
    let blocks: Vec<Grant> = (0..8).map(|_| sub.allocate(&dev, 960 * KIB, 0).unwrap()).collect();
    assert_eq!(dev.stats().ops.create.calls, 1, "one handle for the slab");
    for (i, g) in blocks.iter().enumerate() {
        assert!(dev.write_stamp(g.ptr, i as u64 + 1));
    }
    // Blocks 3 and 4 go: 1.9 MiB free across the second page's end, every page still touched.
    let gone = [3, 4];
    for (now, &i) in gone.iter().enumerate() {
        sub.deallocate(&dev, blocks[i].meta, 0, now as u64 + 1);
    }
    // Stamps are kept by page: what each live block's page holds before the split.
    let live = || blocks.iter().enumerate().filter(|(i, _)| !gone.contains(i));
    let before: Vec<Option<u64>> = live().map(|(_, g)| dev.stamp(g.ptr)).collect();
    assert!(before.iter().all(Option::is_some));
    assert!(sub.allocate(&dev, 5 * MIB, 0).unwrap_err().is_out_of_memory());
    assert!(
        sub.allocate_spliced(&dev, 5 * MIB, 0).is_none(),
        "no page ends in one handle"
    );
    let split = sub.split_held_handles(&dev, 6 * MIB);
    assert_eq!((split.released, split.into_pages), (0, 1), "every page is touched");
    assert_eq!(
        dev.stats().ops.copy.calls,
        8,
        "each page out to host memory and back (no room)"
    );
    let c = sub.allocate_spliced(&dev, 5 * MIB, 0).expect("spliced from page ends");
    assert!(dev.is_backed(c.ptr, 5 * MIB));
    let after: Vec<Option<u64>> = live().map(|(_, g)| dev.stamp(g.ptr)).collect();
    assert_eq!(after, before, "the live blocks kept their contents");
    sub.free_spliced(&dev, c.meta, 0, 3);
    for (i, g) in live() {
        sub.deallocate(&dev, g.meta, 0, 4 + i as u64);
    }
    sub.release_empty_slabs(&dev, 0);
    assert_eq!((dev.used_bytes(), dev.leak_report().blocks), (0, 0));
}

/// A release for other processes goes on past idle handles and pages by splitting handles live
/// blocks hold in part; a release for anything else does not.
#[test]
fn a_release_for_others_splits_held_handles() {
    let config = one_handle_slabs();
    let dev = SimDevice::new(GIB);
    let mut sub = Suballoc::new(config);
    let a = sub.allocate(&dev, 512 * KIB, 0).unwrap();
    assert_eq!((dev.used_bytes(), sub.idle_bytes()), (8 * MIB, 8 * MIB - 512 * KIB));
    assert_eq!(sub.release_down_to(&dev, 0, true), 0, "one handle, held");
    sub.set_split_for_others(true);
    assert_eq!(sub.release_down_to(&dev, 0, true), 6 * MIB, "its three untouched pages");
    assert_eq!(dev.used_bytes(), 2 * MIB);
    sub.deallocate(&dev, a.meta, 0, 1);
    sub.release_empty_slabs(&dev, 0);
    assert_eq!((dev.used_bytes(), dev.leak_report().blocks), (0, 0));
}

/// Backed by pages from now on (`back_by_pages`): an empty slab in one handle goes back at once,
/// a handle live blocks hold in part gives back its untouched pages by a split, new slabs are
/// pages (a create each), and a slab in a larger handle goes back as soon as it empties, while
/// slabs of pages stay for the next request. Emptied slabs are otherwise kept.
#[test]
fn backed_by_pages_from_now_on() {
    let config = SuballocConfig {
        max_empty_bytes: u64::MAX,
        ..one_handle_slabs()
    };
    let dev = SimDevice::new(GIB);
    let mut sub = Suballoc::new(config);
    let (a, b) = (
        sub.allocate(&dev, 8 * MIB, 0).unwrap(),
        sub.allocate(&dev, 512 * KIB, 0).unwrap(),
    );
    let c = sub.allocate(&dev, 8 * MIB, 0).unwrap();
    sub.deallocate(&dev, c.meta, 0, 1);
    assert_eq!(
        (dev.used_bytes(), dev.stats().ops.create.calls),
        (24 * MIB, 3),
        "three slabs, one handle each"
    );
    sub.back_by_pages(&dev);
    // The empty slab went back; the one `b` holds kept one page of four.
    assert_eq!(dev.used_bytes(), 10 * MIB);
    let creates = dev.stats().ops.create.calls;
    let d = sub.allocate(&dev, 8 * MIB, 0).unwrap();
    assert_eq!(dev.stats().ops.create.calls, creates + 4, "a new slab is four pages");
    sub.deallocate(&dev, a.meta, 0, 2);
    assert_eq!(
        dev.used_bytes(),
        10 * MIB,
        "the slab in one handle went back as it emptied"
    );
    sub.deallocate(&dev, d.meta, 0, 3);
    assert_eq!(dev.used_bytes(), 10 * MIB, "the slab of pages is kept, empty");
    sub.back_by_pages(&dev);
    assert_eq!(dev.used_bytes(), 10 * MIB, "once is enough");
    sub.deallocate(&dev, b.meta, 0, 4);
    sub.release_empty_slabs(&dev, 0);
    assert_eq!((dev.used_bytes(), dev.leak_report().blocks), (0, 0));
    // Under pages there is nothing to change.
    let mut pages = Suballoc::new(eight_mib_slabs());
    let g = pages.allocate(&dev, 512 * KIB, 0).unwrap();
    pages.back_by_pages(&dev);
    assert!(!pages.by_pages);
    pages.deallocate(&dev, g.meta, 0, 1);
    pages.release_empty_slabs(&dev, 0);
    assert_eq!(dev.leak_report().blocks, 0);
}

/// Frees `blocks` (at operations 10, 11, ...), gives back every idle page and empty slab, and
/// checks that nothing is left on the device.
fn free_all_and_check<const N: usize>(sub: &mut Suballoc, dev: &SimDevice, blocks: [Grant; N]) {
    for (i, g) in blocks.into_iter().enumerate() {
        sub.deallocate(dev, g.meta, 0, 10 + i as u64);
    }
    sub.unmap_unused(dev, u64::MAX);
    sub.release_empty_slabs(dev, 0);
    assert_eq!(dev.leak_report().blocks, 0);
}

/// Slabs of 8 MiB, each one handle (`SlabBacking::Auto`).
fn one_handle_slabs() -> SuballocConfig {
    SuballocConfig {
        page_release: true,
        min_slab: 8 * MIB,
        max_slab: 8 * MIB,
        backing: SlabBacking::Auto,
        ..SuballocConfig::default()
    }
}

/// Slabs of 8 MiB each, a handle per page, emptied ones kept.
fn eight_mib_slabs() -> SuballocConfig {
    SuballocConfig {
        page_release: true,
        min_slab: 8 * MIB,
        max_slab: 8 * MIB,
        max_empty_bytes: u64::MAX,
        backing: SlabBacking::Pages,
        ..SuballocConfig::default()
    }
}

/// Idle pages moved into a slab come from the slabs in id order, whose reservations may
/// adjoin: a move never spans two of them (the driver maps within one reservation), so every
/// page arrives and none is created, released or left behind.
#[test]
fn pages_moved_from_adjoining_slabs_all_arrive() {
    let dev = SimDevice::new(GIB);
    let mut sub = Suballoc::new(eight_mib_slabs());
    let mut take = |bytes: u64| sub.allocate(&dev, bytes, 0).unwrap();
    // Slab 0: a page in use, three idle; slab 1: two pages in use, two idle at its end; slab
    // 2, right after it: four idle.
    let (t1, t2, a1, a2, b) = (
        take(2 * MIB),
        take(6 * MIB),
        take(4 * MIB),
        take(4 * MIB),
        take(8 * MIB),
    );
    assert_eq!((a1.ptr, a2.ptr), (t1.ptr + 8 * MIB, t1.ptr + 12 * MIB));
    assert_eq!(b.ptr, a1.ptr + 8 * MIB, "slabs 1 and 2 adjoin");
    for (i, g) in [t2, a2, b].into_iter().enumerate() {
        sub.deallocate(&dev, g.meta, 0, i as u64);
    }
    assert_eq!(sub.unmap_unused(&dev, 6 * MIB), 6 * MIB, "slab 0's three idle pages");
    sub.set_slab_limit(0, 0);
    let before = dev.stats().ops;
    let c = sub.allocate(&dev, 6 * MIB, 0).unwrap();
    let ops = dev.stats().ops.since(&before);
    assert_eq!(c.ptr, t1.ptr + 2 * MIB, "into slab 0's hole");
    assert_eq!(
        (ops.create.calls, ops.release.calls, ops.map.calls, ops.unmap.calls),
        (0, 0, 3, 3),
        "slab 1's last two pages and slab 2's first moved, none created"
    );
    assert!(dev.is_backed(c.ptr, 6 * MIB));
    assert_eq!(
        dev.used_bytes(),
        9 * 2 * MIB,
        "slab 0 whole, two pages of slab 1, three of slab 2"
    );
    free_all_and_check(&mut sub, &dev, [t1, c, a1]);
}

/// Best fit's node needs pages mapped, and the headroom has no room for them (slab limit 0): a
/// hole of the same size whose pages are mapped serves instead, with no driver call. With room,
/// best fit's pages are created as before. (A larger mapped hole is not taken:
/// `pages_moved_from_adjoining_slabs_all_arrive` moves pages rather than split slab 2.)
#[test]
fn a_mapped_hole_serves_where_the_headroom_has_no_room_for_pages() {
    for limit in [u64::MAX, 0] {
        let dev = SimDevice::new(GIB);
        let mut sub = Suballoc::new(eight_mib_slabs());
        let mut take = |bytes: u64| sub.allocate(&dev, bytes, 0).unwrap();
        // Two slabs, each a 2 MiB block and a 6 MiB one; the 6 MiB blocks are freed, slab 1's
        // first, and slab 0's hole gives its three pages back.
        let (t0, x0, t1, x1) = (take(2 * MIB), take(6 * MIB), take(2 * MIB), take(6 * MIB));
        sub.deallocate(&dev, x1.meta, 0, 1);
        sub.deallocate(&dev, x0.meta, 0, 2);
        assert_eq!(sub.unmap_unused(&dev, 6 * MIB), 6 * MIB);
        assert!(!dev.is_backed(x0.ptr, 6 * MIB) && dev.is_backed(x1.ptr, 6 * MIB));
        sub.set_slab_limit(limit, limit);
        let before = dev.stats().ops;
        let c = sub.allocate(&dev, 6 * MIB, 0).unwrap();
        let ops = dev.stats().ops.since(&before);
        if limit == 0 {
            assert_eq!(c.ptr, x1.ptr, "slab 1's mapped hole");
            assert_eq!((ops.create.calls, ops.map.calls, ops.unmap.calls), (0, 0, 0));
            assert!(c.hit, "no driver call: a hit");
        } else {
            assert_eq!(c.ptr, x0.ptr, "best fit: slab 0's hole, its pages created");
            assert_eq!(ops.create.calls, 3);
        }
        free_all_and_check(&mut sub, &dev, [t0, t1, c]);
    }
}

/// Past the slab limit, idle pages are moved where the prices say a move costs less than a
/// create here and a release there, and created where they say not (vmm-fast.toml: a move 33
/// us, a create and a release 18); once the engine knows the workload's peak they are moved
/// whatever the prices, since a page given back is created again at the next peak.
#[test]
fn a_known_peak_moves_pages_whatever_the_prices() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tuning/cost-models/vmm-fast.toml");
    for known in [false, true] {
        let cost = crate::device::CostModel::from_file(&path).unwrap();
        let dev = SimDevice::builder().capacity(GIB).cost_model(cost).build();
        let mut sub = Suballoc::new(eight_mib_slabs());
        let mut take = |bytes: u64| sub.allocate(&dev, bytes, 0).unwrap();
        // Slab 0: a page in use, three unmapped; slab 1: two pages in use, two idle.
        let (t1, t2, a1, a2) = (take(2 * MIB), take(6 * MIB), take(4 * MIB), take(4 * MIB));
        sub.deallocate(&dev, t2.meta, 0, 1);
        sub.deallocate(&dev, a2.meta, 0, 2);
        assert_eq!(sub.unmap_unused(&dev, 6 * MIB), 6 * MIB, "slab 0's three idle pages");
        assert!(!dev.stats().ops.recycling_pays(), "vmm-fast: a create is cheaper");
        sub.set_slab_limit(0, 0);
        sub.set_peak_known(known);
        let before = dev.stats().ops;
        let g = sub.allocate(&dev, 6 * MIB, 0).unwrap();
        let ops = dev.stats().ops.since(&before);
        assert_eq!(g.ptr, t1.ptr + 2 * MIB, "into slab 0's hole");
        assert!(dev.is_backed(g.ptr, 6 * MIB));
        let (moved, created) = (ops.map.calls - ops.create.calls, ops.create.calls);
        let expect = if known { (2, 1) } else { (0, 3) };
        assert_eq!(
            (moved, created),
            expect,
            "peak known {known}: slab 1's two idle pages moved"
        );
        for (i, m) in [g.meta, t1.meta, a1.meta].into_iter().enumerate() {
            sub.deallocate(&dev, m, 0, 3 + i as u64);
        }
        sub.release_empty_slabs(&dev, 0);
        sub.unmap_unused(&dev, u64::MAX);
        assert_eq!(dev.leak_report().blocks, 0);
    }
}

/// The strand guard counts as stranded only what live blocks pin beyond both their footprint
/// and the given peak's (`set_strand_floor`): an empty whole slab held below the peak takes a
/// block that, counted against the live blocks alone, would pin it over the budget and be
/// refused (a driver allocation each, where the engine falls back to exact-size blocks).
#[test]
fn the_strand_floor_lets_held_slabs_take_blocks_below_the_peak() {
    let config = SuballocConfig {
        page_release: false,
        min_slab: 64 * MIB,
        max_empty_bytes: u64::MAX,
        ..SuballocConfig::default()
    };
    for floor in [0, 128 * MIB] {
        let dev = SimDevice::new(GIB);
        let mut sub = Suballoc::new(config);
        let x = sub.allocate(&dev, 64 * MIB, 0).unwrap();
        let y = sub.allocate(&dev, 64 * MIB, 0).unwrap();
        assert_eq!(dev.used_bytes(), 128 * MIB, "two whole slabs of 64 MiB");
        sub.deallocate(&dev, y.meta, 0, 1);
        sub.set_strand_budget(Some(2 * MIB));
        sub.set_strand_floor(floor);
        let z = sub.allocate_guarded(&dev, 8 * MIB, 0).unwrap();
        match floor {
            0 => assert!(z.is_none(), "8 MiB would pin 64: 56 stranded against a budget of 2"),
            _ => {
                let z = z.expect("below the peak's footprint nothing is stranded");
                assert_eq!(dev.used_bytes(), 128 * MIB, "placed in the empty slab held");
                sub.deallocate(&dev, z.meta, 0, 2);
            }
        }
        sub.deallocate(&dev, x.meta, 0, 3);
        sub.release_empty_slabs(&dev, 0);
        assert_eq!((dev.used_bytes(), dev.leak_report().blocks), (0, 0), "floor {floor}");
    }
}

/// Over the empty-slab bound, the slab with the fewest mapped pages goes first where a page
/// moved costs less than one created (the default model's prices): its release gives the most
/// address space for the fewest unmaps, and the pages of the slab kept can be moved where the
/// next request needs them. Where a move does not pay (`vmm-fast.toml`), newest first: the
/// slab just emptied, all its pages mapped, goes.
#[test]
fn the_empty_slab_to_release_follows_the_prices() {
    let vmm_fast = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tuning/cost-models/vmm-fast.toml");
    for (cost, kept) in [
        (crate::device::CostModel::default(), 64 * MIB),
        (crate::device::CostModel::from_file(&vmm_fast).unwrap(), 32 * MIB),
    ] {
        let dev = SimDevice::builder().capacity(GIB).cost_model(cost).build();
        let mut sub = Suballoc::new(SuballocConfig {
            page_release: true,
            min_slab: 64 * MIB,
            max_slab: 64 * MIB,
            max_empty_bytes: u64::MAX,
            backing: SlabBacking::Pages,
            ..SuballocConfig::default()
        });
        // Every price seen once (a slab created and released, pages unmapped below).
        let g = sub.allocate(&dev, 64 * MIB, 0).unwrap();
        sub.deallocate(&dev, g.meta, 0, 1);
        sub.release_empty_slabs(&dev, 0);
        // Slab A, emptied first, keeps half its pages mapped; slab B, emptied last, all.
        let a = sub.allocate(&dev, 64 * MIB, 0).unwrap();
        let b = sub.allocate(&dev, 64 * MIB, 0).unwrap();
        sub.deallocate(&dev, a.meta, 0, 2);
        assert_eq!(sub.unmap_unused(&dev, 32 * MIB), 32 * MIB);
        sub.deallocate(&dev, b.meta, 0, 3);
        assert_eq!(dev.used_bytes(), 96 * MIB);
        sub.release_empty_slabs(&dev, 64 * MIB);
        assert_eq!(dev.used_bytes(), kept, "{}", dev.stats().ops.recycling_pays());
    }
}

/// An empty slab made for one large block is left to that block's kind where free memory less
/// the headroom could not give it a new one: a smaller request takes a slab of its own while
/// the slab limit has room for it twice over, and the large block, back, finds its slab whole.
/// With room on the device, or none under the slab limit, best fit splits the slab as before.
#[test]
fn an_empty_slab_made_for_a_large_block_is_kept_for_it_near_the_capacity() {
    for (device_room, limit, kept) in [
        (u64::MAX, u64::MAX, false),
        (16 * MIB, 16 * MIB, true),
        (16 * MIB, 4 * MIB, false),
    ] {
        let dev = SimDevice::new(GIB);
        let mut sub = Suballoc::new(eight_mib_slabs());
        let big = sub.allocate(&dev, 32 * MIB, 0).unwrap();
        sub.deallocate(&dev, big.meta, 0, 1);
        sub.set_slab_limit(limit, device_room);
        let small = sub.allocate(&dev, 4 * MIB, 0).unwrap();
        let inside = (big.ptr..big.ptr + 32 * MIB).contains(&small.ptr);
        assert_eq!(inside, !kept, "room {device_room}, limit {limit}");
        let again = sub.allocate(&dev, 32 * MIB, 0).unwrap();
        assert_eq!(
            again.ptr == big.ptr,
            kept,
            "the large block finds its slab whole only where it was kept"
        );
        free_all_and_check(&mut sub, &dev, [small, again]);
    }
}

/// One block larger than the growth rule's slab, once backed by pages, on a device with no
/// room past its headroom (slab limit 0) whose peak is known (idle pages are moved, not
/// created past the limit): its slab reserves twice the block (a smaller request lands in
/// the rest, no new slab) but counts as the block's size while empty; pages are moved from
/// that slab too, never from under the block being mapped; and a block whose best-fit place
/// would need many pages goes where the fewest are missing.
#[test]
fn slabs_backed_by_pages_keep_room_for_a_grown_block() {
    let dev = SimDevice::new(GIB);
    let mut sub = Suballoc::new(SuballocConfig {
        max_empty_bytes: u64::MAX,
        ..one_handle_slabs()
    });
    sub.back_by_pages(&dev);
    assert!(sub.by_pages);
    let a = sub.allocate(&dev, 32 * MIB, 0).unwrap();
    let reserves = dev.stats().ops.reserve.calls;
    let b = sub.allocate(&dev, 24 * MIB, 0).unwrap();
    assert_eq!(dev.stats().ops.reserve.calls, reserves, "the rest of the range held it");
    assert!(b.ptr >= a.ptr + 32 * MIB && b.ptr + 24 * MIB <= a.ptr + 64 * MIB);
    sub.deallocate(&dev, b.meta, 0, 1);
    sub.deallocate(&dev, a.meta, 0, 2);
    assert_eq!(sub.empty_bytes(), 32 * MIB, "empty, it counts what it was made for");
    assert_eq!(dev.used_bytes(), 56 * MIB);

    // Now near the capacity: nothing is created past the limit while idle pages can move.
    sub.set_slab_limit(0, 0);
    sub.set_peak_known(true);
    let (creates, unmaps) = (dev.stats().ops.create.calls, dev.stats().ops.unmap.calls);
    // 60 MiB at the slab's start: its first 56 MiB are mapped (idle), 2 pages are missing and
    // no idle page lies outside the block: created, none taken from under the block.
    let c = sub.allocate(&dev, 60 * MIB, 0).unwrap();
    assert_eq!(c.ptr, a.ptr);
    assert_eq!(dev.stats().ops.create.calls, creates + 2);
    assert_eq!(
        dev.stats().ops.unmap.calls,
        unmaps,
        "nothing moved from under the block"
    );
    sub.deallocate(&dev, c.meta, 0, 3);
    // Free now: the whole range, its first 60 MiB mapped. Give back its first 20 MiB.
    let head = sub.allocate(&dev, 20 * MIB, 0).unwrap();
    let tail = sub.allocate(&dev, 40 * MIB, 0).unwrap();
    assert_eq!((head.ptr, tail.ptr), (a.ptr, a.ptr + 20 * MIB));
    sub.deallocate(&dev, head.meta, 0, 4);
    assert_eq!(sub.unmap_unused(&dev, 20 * MIB), 20 * MIB);
    sub.deallocate(&dev, tail.meta, 0, 5);
    // Free: 20 MiB unmapped, 40 MiB mapped and idle, 4 MiB unmapped. A 40 MiB request: best
    // fit places it at the start (10 pages missing, as many as no idle page outside it could
    // fill); at 20 MiB, none is missing.
    let (creates, unmaps) = (dev.stats().ops.create.calls, dev.stats().ops.unmap.calls);
    let e = sub.allocate(&dev, 40 * MIB, 0).unwrap();
    assert_eq!(e.ptr, a.ptr + 20 * MIB, "where every page is mapped");
    assert_eq!(
        (dev.stats().ops.create.calls, dev.stats().ops.unmap.calls),
        (creates, unmaps),
        "no page created or moved for it"
    );
    sub.deallocate(&dev, e.meta, 0, 6);
    // An 8 MiB block at the start lacks 4 pages: moved from the same slab's idle pages (the
    // only slab), not created.
    let h = sub.allocate(&dev, 8 * MIB, 0).unwrap();
    assert_eq!(h.ptr, a.ptr);
    assert_eq!(
        (dev.stats().ops.create.calls, dev.stats().ops.unmap.calls),
        (creates, unmaps + 4),
        "four pages moved within the slab"
    );
    sub.deallocate(&dev, h.meta, 0, 7);
    sub.release_empty_slabs(&dev, 0);
    assert_eq!((dev.used_bytes(), dev.leak_report().blocks), (0, 0));
}
