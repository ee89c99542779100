//! One test per rule of PyTorch's allocator that the model claims to follow.

use super::conf::consts::*;
use super::model::{Driver, Model};
use super::*;
use adaptalloc::size::MIB;

/// A device of `cap` bytes whose cudaMalloc addresses decrease, as real ones mostly do.
struct TestDriver {
    cap: u64,
    used: u64,
    next_top: u64,
    mallocs: Vec<u64>,
    frees: Vec<u64>,
    live: std::collections::HashMap<u64, u64>,
    next_reserve: u64,
    /// Mapped handles (page counts in the tests): start -> bytes.
    mapped: u64,
    handles: std::collections::BTreeMap<u64, u64>,
}

impl TestDriver {
    fn new(cap: u64) -> Self {
        TestDriver {
            cap,
            used: 0,
            next_top: 1 << 40,
            mallocs: vec![],
            frees: vec![],
            live: Default::default(),
            next_reserve: 1 << 44,
            mapped: 0,
            handles: Default::default(),
        }
    }
}

impl Driver for TestDriver {
    fn malloc(&mut self, bytes: u64) -> Option<u64> {
        if self.used + bytes > self.cap {
            return None;
        }
        self.used += bytes;
        self.next_top -= bytes.next_multiple_of(2 * MIB);
        self.mallocs.push(bytes);
        self.live.insert(self.next_top, bytes);
        Some(self.next_top)
    }
    fn free(&mut self, ptr: u64, bytes: u64) {
        assert_eq!(self.live.remove(&ptr), Some(bytes), "frees a segment it made, whole");
        self.used -= bytes;
        self.frees.push(ptr);
    }
    fn total_memory(&self) -> u64 {
        self.cap
    }
    fn reserve(&mut self, bytes: u64) -> Option<u64> {
        let p = self.next_reserve;
        self.next_reserve += bytes;
        Some(p)
    }
    fn map(&mut self, ptr: u64, bytes: u64, handle: u64) -> bool {
        assert_eq!(bytes % handle, 0, "whole handles");
        if self.used + bytes > self.cap {
            return false;
        }
        self.used += bytes;
        for h in (ptr..ptr + bytes).step_by(handle as usize) {
            self.handles.insert(h, handle);
        }
        self.mapped = self.handles.len() as u64;
        true
    }
    fn unmap(&mut self, ptr: u64, bytes: u64) {
        let inside: Vec<(u64, u64)> = self.handles.range(ptr..ptr + bytes).map(|(&h, &l)| (h, l)).collect();
        assert_eq!(inside.iter().map(|h| h.1).sum::<u64>(), bytes, "unmaps whole handles");
        for (h, _) in inside {
            self.handles.remove(&h);
        }
        self.used -= bytes;
        self.mapped = self.handles.len() as u64;
    }
}

fn model() -> (Model, TestDriver) {
    (Model::new(PytorchConf::default()), TestDriver::new(80 << 30))
}

#[test]
fn requests_under_10_mib_share_a_20_mib_segment_and_small_ones_a_2_mib_one() {
    let (mut m, mut d) = model();
    let a = m.malloc(&mut d, 3 * MIB, 0).unwrap();
    let b = m.malloc(&mut d, 3 * MIB, 0).unwrap();
    assert_eq!(b, a + 3 * MIB, "the second takes the front of the first's free rest");
    let _c = m.malloc(&mut d, 1000, 0).unwrap();
    // 11 MiB fits the segment's free 14 MiB; 15 MiB does not and gets a segment of its own.
    m.malloc(&mut d, 11 * MIB, 0).unwrap();
    let _e = m.malloc(&mut d, 15 * MIB + 1, 0).unwrap();
    assert_eq!(
        d.mallocs,
        vec![LARGE_BUFFER, SMALL_BUFFER, 16 * MIB],
        "from 10 MiB: rounded to 2 MiB"
    );
    // Exactly 1 MiB is small; 1 MiB + 1 is large.
    let (mut m, mut d) = model();
    m.malloc(&mut d, MIB, 0).unwrap();
    m.malloc(&mut d, MIB + 1, 0).unwrap();
    assert_eq!(d.mallocs, vec![SMALL_BUFFER, LARGE_BUFFER]);
}

#[test]
fn a_small_block_splits_at_512_bytes_left_a_large_one_only_above_1_mib() {
    // Small pool: 2 MiB - 512 leaves 512, which is split off.
    let (mut m, mut d) = model();
    let a = m.malloc(&mut d, 2 * MIB - 512, 0);
    assert!(a.is_none() || m.allocated_size(a.unwrap()).is_some());
    let (mut m, mut d) = model();
    let a = m.malloc(&mut d, MIB, 0).unwrap();
    assert_eq!(m.allocated_size(a), Some(MIB));
    // Large pool: a 19 MiB request leaves exactly 1 MiB of its 20 MiB segment: not split.
    let b = m.malloc(&mut d, 19 * MIB, 0).unwrap();
    assert_eq!(m.allocated_size(b), Some(20 * MIB));
    // 18.5 MiB leaves 1.5 MiB: split.
    let c = m.malloc(&mut d, 18 * MIB + MIB / 2, 0).unwrap();
    assert_eq!(m.allocated_size(c), Some(18 * MIB + MIB / 2));
    assert!(m.malloc(&mut d, MIB + MIB / 2, 0).unwrap() == c + 18 * MIB + MIB / 2);
}

#[test]
fn best_fit_takes_the_smallest_block_then_the_lowest_address_and_frees_merge() {
    let (mut m, mut d) = model();
    // Two 12 MiB segments (the second at a lower address) and a 14 MiB one.
    let a = m.malloc(&mut d, 12 * MIB, 0).unwrap();
    let b = m.malloc(&mut d, 12 * MIB, 0).unwrap();
    let c = m.malloc(&mut d, 14 * MIB, 0).unwrap();
    assert!(b < a);
    for p in [a, b, c] {
        m.free(p);
    }
    assert_eq!(
        m.malloc(&mut d, 11 * MIB, 0),
        Some(b),
        "smallest size, then lowest address"
    );
    // Merging: three blocks of a 20 MiB segment freed in any order make it whole again.
    let (mut m, mut d) = model();
    let x = m.malloc(&mut d, 4 * MIB, 0).unwrap();
    let y = m.malloc(&mut d, 4 * MIB, 0).unwrap();
    let z = m.malloc(&mut d, 4 * MIB, 0).unwrap();
    for p in [x, z, y] {
        m.free(p);
    }
    assert_eq!(
        m.malloc(&mut d, 19 * MIB, 0),
        Some(x),
        "merged back into the whole segment"
    );
    assert_eq!(d.mallocs.len(), 1);
}

#[test]
fn blocks_are_reused_only_on_their_own_stream() {
    let (mut m, mut d) = model();
    let a = m.malloc(&mut d, 4 * MIB, 1).unwrap();
    m.free(a);
    let b = m.malloc(&mut d, 4 * MIB, 2).unwrap();
    assert_ne!(a, b);
    assert_eq!(d.mallocs.len(), 2);
    assert_eq!(m.malloc(&mut d, 4 * MIB, 1), Some(a));
}

#[test]
fn out_of_memory_frees_whole_free_segments_large_pool_first_then_retries_once() {
    // A 12 MiB and a 2 MiB segment wholly free; a 20 MiB one split around a live 10 MiB
    // block (never released).
    let mut d = TestDriver::new(56 * MIB);
    let mut m = Model::new(PytorchConf::default());
    let big = m.malloc(&mut d, 12 * MIB, 0).unwrap();
    let twenty = m.malloc(&mut d, 5 * MIB, 0).unwrap();
    let small = m.malloc(&mut d, 4096, 0).unwrap();
    let _kept = m.malloc(&mut d, 10 * MIB, 0).unwrap();
    let split = m.malloc(&mut d, 2 * MIB, 0).unwrap();
    for p in [big, twenty, small, split] {
        m.free(p);
    }
    assert_eq!(
        d.mallocs,
        vec![12 * MIB, LARGE_BUFFER, SMALL_BUFFER],
        "kept and split share the 20 MiB"
    );
    // 30 MiB fits no cached block, and 56 - 34 = 22 MiB are free on the device.
    let before = d.mallocs.len();
    let got = m.malloc(&mut d, 30 * MIB, 0);
    assert!(got.is_some(), "served after releasing");
    // The large pool first, then the small; the split 20 MiB segment stays.
    assert_eq!(d.frees, vec![big, small]);
    assert_eq!(d.mallocs.len(), before + 1, "one retry");
    assert_eq!(m.stats().recoveries, 1);
    // With nothing left to release, out-of-memory.
    assert!(m.malloc(&mut d, 40 * MIB, 0).is_none());
    assert_eq!(m.stats().ooms, 1);
}

#[test]
fn max_split_size_keeps_oversize_blocks_whole_and_releases_them_first() {
    let conf: PytorchConf = "max_split_size_mb:64".parse().unwrap();
    let mut d = TestDriver::new(200 * MIB);
    let mut m = Model::new(conf);
    let a = m.malloc(&mut d, 100 * MIB, 0).unwrap();
    m.free(a);
    // A 30 MiB request may not take the 100 MiB oversize block.
    let b = m.malloc(&mut d, 30 * MIB, 0).unwrap();
    assert_ne!(a, b);
    // 90 MiB may (100 < 90 + 20), and takes it whole.
    m.free(b);
    let c = m.malloc(&mut d, 90 * MIB, 0).unwrap();
    assert_eq!((c, m.allocated_size(c)), (a, Some(100 * MIB)));
    m.free(c);
    // 150 MiB does not fit the 70 MiB left: the oversize block goes back first.
    // It alone is not enough, so every free segment follows (the 30 MiB one).
    let freed_before = d.frees.len();
    assert!(m.malloc(&mut d, 150 * MIB, 0).is_some());
    assert_eq!(&d.frees[freed_before..], &[a, b]);
}

#[test]
fn empty_cache_frees_every_fully_free_segment_and_no_split_one() {
    let (mut m, mut d) = model();
    let a = m.malloc(&mut d, 3 * MIB, 0).unwrap();
    let b = m.malloc(&mut d, 3 * MIB, 0).unwrap();
    let c = m.malloc(&mut d, 15 * MIB, 0).unwrap();
    m.free(a);
    m.free(c);
    m.empty_cache(&mut d);
    assert_eq!(d.frees, vec![c], "the 20 MiB segment still holds b");
    m.free(b);
    m.empty_cache(&mut d);
    assert_eq!(d.frees, vec![c, a]);
    assert_eq!(m.stats().reserved.current, 0);
}

#[test]
fn roundup_power2_divisions_changes_block_sizes() {
    let conf: PytorchConf = "roundup_power2_divisions:4".parse().unwrap();
    let mut d = TestDriver::new(1 << 30);
    let mut m = Model::new(conf);
    let a = m.malloc(&mut d, 5 * MIB + 1, 0).unwrap();
    assert_eq!(m.allocated_size(a), Some(6 * MIB), "4 steps between 4 and 8 MiB");
}

#[test]
fn garbage_collection_frees_old_whole_segments_only_with_a_memory_fraction() {
    // Two 30 MiB segments cached on a 100 MiB device, then a 40 MiB request (which fits):
    // the segments freed before allocating.
    let frees_for = |conf: &str| {
        let mut d = TestDriver::new(100 * MIB);
        let mut m = Model::new(conf.parse().unwrap());
        let a = m.malloc(&mut d, 30 * MIB, 0).unwrap();
        let b = m.malloc(&mut d, 30 * MIB, 0).unwrap();
        m.free(a);
        m.free(b);
        m.malloc(&mut d, 40 * MIB, 0).unwrap();
        d.frees.len()
    };
    // 60 MiB held > 50% of 100 MiB: the next cudaMalloc first collects.
    assert!(frees_for("garbage_collection_threshold:0.5,per_process_memory_fraction:1.0") > 0);
    // Without a fraction the threshold does nothing (PyTorch's rule).
    assert_eq!(frees_for("garbage_collection_threshold:0.5"), 0);
}

#[test]
fn expandable_segments_map_pages_grow_in_place_and_unmap_free_pages() {
    let conf: PytorchConf = "expandable_segments:True".parse().unwrap();
    let mut d = TestDriver::new(200 * MIB);
    let mut m = Model::new(conf);
    let a = m.malloc(&mut d, 30 * MIB, 0).unwrap();
    assert_eq!(d.mapped, 2, "two 20 MiB pages");
    let b = m.malloc(&mut d, 30 * MIB, 0).unwrap();
    assert_eq!(b, a + 30 * MIB, "the same segment grows: contiguous");
    assert_eq!(d.mapped, 3);
    assert!(d.mallocs.is_empty(), "no cudaMalloc with expandable segments");
    let s = m.malloc(&mut d, 4096, 0).unwrap();
    assert_ne!(s & !(SMALL_BUFFER - 1), a & !(SMALL_BUFFER - 1));
    m.free(b);
    m.free(a);
    m.empty_cache(&mut d);
    assert_eq!(
        d.mapped, 1,
        "the large pages go back; the small page holds a live block"
    );
    assert_eq!(m.stats().reserved.current, SMALL_BUFFER);
    // Out of memory: stream 1's free pages are unmapped and stream 0's request retried.
    let x = m.malloc(&mut d, 150 * MIB, 1).unwrap();
    m.free(x);
    assert_eq!(d.mapped, 9);
    let y = m.malloc(&mut d, 30 * MIB, 0);
    assert!(y.is_some(), "served after unmapping stream 1's pages");
    assert_eq!(d.mapped, 3, "the small page and two 20 MiB pages");
}

#[test]
fn the_peer_runs_on_a_sim_device_and_gives_everything_back() {
    use crate::trace::ReplayTarget;
    use adaptalloc::device::SimDevice;
    let dev = std::sync::Arc::new(SimDevice::new(1 << 30));
    for conf in ["", "expandable_segments:True"] {
        let peer = peer(dev.clone(), conf.parse().unwrap());
        let a = peer.allocate(3 * MIB, 0).unwrap();
        let b = peer.allocate(700, 0).unwrap();
        peer.deallocate(a, 0);
        let c = peer.allocate(3 * MIB, 0).unwrap();
        assert_eq!(a, c, "cached");
        assert!(peer.counters().driver_allocs >= 2);
        peer.deallocate(b, 0);
        drop(peer);
        assert_eq!(dev.stats().allocated_bytes, 0, "{conf:?}: all back");
    }
}
