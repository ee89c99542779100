//! The rules of PyTorch's `DeviceCachingAllocator` (c10/cuda/CUDACachingAllocator.cpp), over
//! a [`Driver`] that stands for cudaMalloc/cudaFree and the virtual-memory calls of
//! expandable segments. Function names follow PyTorch's, so each can be read beside its original.
//!
//! Modelled exactly: request rounding, the two pools and their segment sizes, best fit in
//! (stream, size, address) order, both split rules, merging with free neighbours, per-stream
//! reuse, `max_split_size` (oversize blocks and `release_available_cached_blocks`), the
//! out-of-memory ladder (release fully-free segments, large pool then small, retry once),
//! `empty_cache`, garbage collection (with a memory fraction), and expandable segments (address
//! space of 1.125x the device, pages of 2 MiB / 20 MiB, unmapping free pages on release).
//! Not modelled: CUDA events and `record_stream` (a free is reusable at once, as it is when
//! no other stream used the block), CUDA graphs' private pools, and memory callbacks.

use std::collections::{BTreeMap, BTreeSet};

use super::conf::{PytorchConf, consts::*};
use adaptalloc::stats::Counter;
use adaptalloc::strategy::StreamId;

/// What the model asks of the GPU.
pub trait Driver {
    /// cudaMalloc: a segment of `bytes`, or None when the device refuses.
    fn malloc(&mut self, bytes: u64) -> Option<u64>;
    /// cudaFree of a segment.
    fn free(&mut self, ptr: u64, bytes: u64);
    /// The device's memory (`cudaGetDeviceProperties().totalGlobalMem`).
    fn total_memory(&self) -> u64;
    /// cuMemAddressReserve (expandable segments).
    fn reserve(&mut self, _bytes: u64) -> Option<u64> {
        None
    }
    /// `mapAndSetAccess`: a cuMemCreate and a cuMemMap per handle of `handle` bytes in
    /// `ptr..ptr+bytes`, then one cuMemSetAccess for the range; false when refused (nothing
    /// stays mapped).
    fn map(&mut self, _ptr: u64, _bytes: u64, _handle: u64) -> bool {
        false
    }
    /// `unmapHandles`: cudaStreamSynchronize, then cuMemUnmap + cuMemRelease per handle.
    fn unmap(&mut self, _ptr: u64, _bytes: u64) {}
    /// cuMemAddressFree of a reservation.
    fn unreserve(&mut self, _ptr: u64) {}
}

const SMALL: usize = 0;
const LARGE: usize = 1;

#[derive(Clone, Debug)]
struct Block {
    size: u64,
    stream: StreamId,
    pool: usize,
    allocated: bool,
    mapped: bool,
    /// The segment's base address.
    seg: u64,
    /// The pool's get-free-block count when it last became free (garbage collection's age).
    gc_base: u64,
}

#[derive(Clone, Debug)]
struct Segment {
    size: u64,
    /// Expandable: the page size; the segment is reserved address space.
    page: Option<u64>,
}

/// A block that was live when a recording started ([`Model::restore`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LiveBlock {
    pub addr: u64,
    pub size: u64,
}

/// What the model has done.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ModelStats {
    pub segment_allocs: u64,
    pub segment_frees: u64,
    pub page_maps: u64,
    pub page_unmaps: u64,
    /// Requests refused with out-of-memory.
    pub ooms: u64,
    /// Requests served after a refused cudaMalloc, by releasing cached blocks.
    pub recoveries: u64,
    /// Bytes held from the device (`total_allocated_memory`).
    pub reserved: Counter,
}

/// The state of one PyTorch device allocator.
#[derive(Debug)]
pub struct Model {
    conf: PytorchConf,
    blocks: BTreeMap<u64, Block>,
    segments: BTreeMap<u64, Segment>,
    /// Free, mapped blocks per pool, in PyTorch's order: (stream, size, address).
    free: [BTreeSet<(StreamId, u64, u64)>; 2],
    /// Unmapped blocks of expandable segments per pool: (stream, address).
    unmapped: [BTreeSet<(StreamId, u64)>; 2],
    get_free_calls: [u64; 2],
    stats: ModelStats,
}

/// One request, as `AllocParams` holds it.
struct Params {
    size: u64,
    alloc_size: u64,
    stream: StreamId,
    pool: usize,
}

impl Model {
    pub fn new(conf: PytorchConf) -> Self {
        Model {
            conf,
            blocks: BTreeMap::new(),
            segments: BTreeMap::new(),
            free: Default::default(),
            unmapped: Default::default(),
            get_free_calls: [0; 2],
            stats: ModelStats::default(),
        }
    }

    pub fn stats(&self) -> ModelStats {
        self.stats
    }

    /// Restarts the reserved peak from the current value.
    pub fn reset_peak(&mut self) {
        self.stats.reserved.reset_peak();
    }

    /// Adds a (non-expandable) segment as a recording found it: `live` blocks allocated (sorted
    /// by address, inside it), every gap between them one free block, as merging leaves it.
    pub fn restore(&mut self, base: u64, size: u64, stream: StreamId, small: bool, live: &[LiveBlock]) {
        let pool = if small { SMALL } else { LARGE };
        self.segments.insert(base, Segment { size, page: None });
        self.stats.reserved.add(size);
        let mut at = base;
        let put = |m: &mut Self, addr: u64, size: u64, allocated: bool| {
            m.blocks.insert(
                addr,
                Block {
                    size,
                    stream,
                    pool,
                    allocated,
                    mapped: true,
                    seg: base,
                    gc_base: 0,
                },
            );
            if !allocated {
                m.free[pool].insert((stream, size, addr));
            }
        };
        for b in live {
            if b.addr > at {
                put(self, at, b.addr - at, false);
            }
            put(self, b.addr, b.size, true);
            at = b.addr + b.size;
        }
        if at < base + size {
            put(self, at, base + size - at, false);
        }
    }

    /// The block allocated at `addr`: its size, or None.
    pub fn allocated_size(&self, addr: u64) -> Option<u64> {
        self.blocks.get(&addr).filter(|b| b.allocated).map(|b| b.size)
    }

    fn gc_enabled(&self) -> bool {
        self.conf.memory_fraction.is_some() && self.conf.garbage_collection_threshold > 0.0
    }

    fn allowed_max<D: Driver>(&self, d: &D) -> Option<u64> {
        self.conf.memory_fraction.map(|f| (d.total_memory() as f64 * f) as u64)
    }

    fn prev(&self, addr: u64) -> Option<u64> {
        let b = &self.blocks[&addr];
        (b.seg < addr).then(|| *self.blocks.range(..addr).next_back().expect("blocks tile a segment").0)
    }

    fn next(&self, addr: u64) -> Option<u64> {
        let b = &self.blocks[&addr];
        let end = addr + b.size;
        (end < b.seg + self.segments[&b.seg].size).then_some(end)
    }

    fn is_split(&self, addr: u64) -> bool {
        self.prev(addr).is_some() || self.next(addr).is_some()
    }

    fn expandable(&self, addr: u64) -> bool {
        self.segments[&self.blocks[&addr].seg].page.is_some()
    }

    /// `insert_into_blocks`: a free mapped block joins its pool.
    fn insert_free(&mut self, addr: u64) {
        let calls = self.get_free_calls;
        let b = self.blocks.get_mut(&addr).expect("block");
        b.gc_base = calls[b.pool];
        self.free[b.pool].insert((b.stream, b.size, addr));
    }

    fn remove_free(&mut self, addr: u64) {
        let b = &self.blocks[&addr];
        if b.mapped {
            self.free[b.pool].remove(&(b.stream, b.size, addr));
        } else {
            self.unmapped[b.pool].remove(&(b.stream, addr));
        }
    }

    /// `malloc`: the address of a block for `orig_size` bytes on `stream`, or None (PyTorch
    /// raises OutOfMemoryError).
    pub fn malloc<D: Driver>(&mut self, d: &mut D, orig_size: u64, stream: StreamId) -> Option<u64> {
        // `get_pool` and `get_allocation_size`. A size whose rounding passes 64 bits fails as
        // cudaMalloc's would on any GPU (never a wrapped, small size).
        let rounded = self.conf.round_size(orig_size).and_then(|size| {
            let alloc_size = if size <= SMALL_SIZE {
                SMALL_BUFFER
            } else if size < MIN_LARGE_ALLOC {
                LARGE_BUFFER
            } else {
                size.checked_next_multiple_of(ROUND_LARGE)?
            };
            Some((size, alloc_size))
        });
        let Some((size, alloc_size)) = rounded else {
            self.stats.ooms += 1;
            return None;
        };
        let pool = if size <= SMALL_SIZE { SMALL } else { LARGE };
        let p = Params {
            size,
            alloc_size,
            stream,
            pool,
        };
        let Some(addr) = self.get_free_block(&p).or_else(|| self.alloc_new(d, &p)) else {
            self.stats.ooms += 1;
            return None;
        };
        let split = self.should_split(addr, size);
        Some(self.alloc_found_block(addr, size, split))
    }

    /// The cold path: cudaMalloc, then release and retry.
    #[cold]
    fn alloc_new<D: Driver>(&mut self, d: &mut D, p: &Params) -> Option<u64> {
        if self.gc_enabled() {
            self.garbage_collect_cached_blocks(d);
        }
        if let Some(b) = self.alloc_block(d, p) {
            return Some(b);
        }
        let retried = if self.release_available_cached_blocks(d, p)
            && let Some(b) = self.alloc_block(d, p)
        {
            Some(b)
        } else {
            self.release_cached_blocks(d);
            self.alloc_block(d, p)
        };
        self.stats.recoveries += u64::from(retried.is_some());
        retried
    }

    fn get_free_block(&mut self, p: &Params) -> Option<u64> {
        if self.gc_enabled() {
            self.get_free_calls[p.pool] += 1;
        }
        let set = &self.free[p.pool];
        let mut it = set.range((p.stream, p.size, 0)..).peekable();
        let mut cur = *it.next().filter(|k| k.0 == p.stream)?;
        if self.expandable(cur.2) && self.conf.expandable_segments {
            // Best fit counts what an expandable block can grow to.
            let grow = |m: &Self, k: (StreamId, u64, u64)| {
                k.1 + m
                    .next(k.2)
                    .filter(|n| !m.blocks[n].mapped)
                    .map_or(0, |n| m.blocks[&n].size)
            };
            while let Some(&&next) = it.peek() {
                if !(self.expandable(cur.2) && next.0 == p.stream && grow(self, next) < grow(self, cur)) {
                    break;
                }
                cur = next;
                it.next();
            }
        }
        let max_split = self.conf.max_split_size;
        if p.size < max_split && cur.1 >= max_split {
            return None;
        }
        if p.size >= max_split && cur.1 >= p.size.saturating_add(self.conf.max_non_split_rounding) {
            return None;
        }
        self.free[p.pool].remove(&cur);
        Some(cur.2)
    }

    fn should_split(&self, addr: u64, size: u64) -> bool {
        let b = &self.blocks[&addr];
        let remaining = b.size - size;
        if b.pool == SMALL || self.conf.expandable_segments {
            remaining >= MIN_BLOCK
        } else {
            size < self.conf.max_split_size && remaining > SMALL_SIZE
        }
    }

    /// `alloc_found_block`: the block takes the front of `addr`, the rest stays free.
    fn alloc_found_block(&mut self, addr: u64, size: u64, split: bool) -> u64 {
        if split {
            let b = self.blocks.get_mut(&addr).expect("block");
            let rest = Block {
                size: b.size - size,
                ..b.clone()
            };
            b.size = size;
            self.blocks.insert(addr + size, rest);
            self.insert_free(addr + size);
        }
        self.blocks.get_mut(&addr).expect("block").allocated = true;
        addr
    }

    /// `alloc_block`: a new segment (or mapped pages of an expandable one).
    fn alloc_block<D: Driver>(&mut self, d: &mut D, p: &Params) -> Option<u64> {
        if let Some(max) = self.allowed_max(d)
            && self.stats.reserved.current + p.alloc_size > max
        {
            return None;
        }
        if self.conf.expandable_segments {
            return self.try_allocate_expandable_block(d, p);
        }
        let ptr = d.malloc(p.alloc_size)?;
        self.stats.segment_allocs += 1;
        self.stats.reserved.add(p.alloc_size);
        self.segments.insert(
            ptr,
            Segment {
                size: p.alloc_size,
                page: None,
            },
        );
        self.blocks.insert(
            ptr,
            Block {
                size: p.alloc_size,
                stream: p.stream,
                pool: p.pool,
                allocated: false,
                mapped: true,
                seg: ptr,
                gc_base: 0,
            },
        );
        Some(ptr)
    }

    /// `free`: the block at `addr` goes back to its pool, merged with free neighbours.
    /// False when `addr` is not an allocated block.
    pub fn free(&mut self, addr: u64) -> bool {
        match self.blocks.get_mut(&addr) {
            Some(b) if b.allocated => b.allocated = false,
            _ => return false,
        }
        let at = self.merge_neighbours(addr);
        self.insert_free(at);
        true
    }

    /// Merges the block at `addr` (in no set) with whichever neighbours `try_merge` accepts;
    /// returns where the merged block starts.
    pub(super) fn merge_neighbours(&mut self, addr: u64) -> u64 {
        let mut at = addr;
        if let Some(prev) = self.prev(at) {
            at = self.try_merge(at, prev);
        }
        if let Some(next) = self.next(at) {
            at = self.try_merge(at, next);
        }
        at
    }

    /// `try_merge_blocks`: absorbs the free neighbour `src` into `dst` (not in any set);
    /// returns where the merged block starts.
    fn try_merge(&mut self, dst: u64, src: u64) -> u64 {
        let (s, d) = (&self.blocks[&src], &self.blocks[&dst]);
        if s.allocated || s.mapped != d.mapped {
            return dst;
        }
        self.remove_free(src);
        let s = self.blocks.remove(&src).expect("block");
        if src < dst {
            let d = self.blocks.remove(&dst).expect("block");
            self.blocks.insert(
                src,
                Block {
                    size: d.size + s.size,
                    ..d
                },
            );
            src
        } else {
            self.blocks.get_mut(&dst).expect("block").size += s.size;
            dst
        }
    }

    /// `release_block`: cudaFree of a whole free segment.
    fn release_block<D: Driver>(&mut self, d: &mut D, addr: u64) {
        self.remove_free(addr);
        let b = self.blocks.remove(&addr).expect("block");
        let seg = self.segments.remove(&b.seg).expect("segment");
        debug_assert_eq!(seg.size, b.size, "only whole segments are released");
        d.free(addr, seg.size);
        self.stats.segment_frees += 1;
        self.stats.reserved.sub(seg.size);
    }

    /// With a `max_split_size`, frees oversize cached blocks until one request fits.
    fn release_available_cached_blocks<D: Driver>(&mut self, d: &mut D, p: &Params) -> bool {
        let max_split = self.conf.max_split_size;
        if max_split == u64::MAX {
            return false;
        }
        let key = p.size.max(max_split);
        let set = &self.free[p.pool];
        let first = set.range((p.stream, key, 0)..).next().copied();
        match first {
            Some(k) if k.0 == p.stream && !self.expandable(k.2) => {
                self.release_block(d, k.2);
                true
            }
            _ => {
                // No single block is large enough: free oversize blocks, largest first.
                let candidates: Vec<_> = set
                    .range(..(p.stream, key, 0))
                    .rev()
                    .take_while(|k| k.0 == p.stream && k.1 >= max_split)
                    .copied()
                    .collect();
                let mut released = 0;
                for k in candidates {
                    if released >= key {
                        break;
                    }
                    if !self.expandable(k.2) && !self.is_split(k.2) {
                        self.release_block(d, k.2);
                        released += k.1;
                    }
                }
                released >= key
            }
        }
    }

    /// `release_cached_blocks` (out-of-memory and `empty_cache`): every fully-free segment
    /// goes back, the large pool first, each in (stream, size, address) order; free pages of
    /// expandable segments are unmapped.
    fn release_cached_blocks<D: Driver>(&mut self, d: &mut D) {
        for pool in [LARGE, SMALL] {
            let mut to_unmap = Vec::new();
            let order: Vec<_> = self.free[pool].iter().map(|k| k.2).collect();
            for addr in order {
                if self.expandable(addr) {
                    to_unmap.push(addr);
                } else if !self.is_split(addr) {
                    self.release_block(d, addr);
                }
            }
            for addr in to_unmap {
                let at = self.unmap_block(d, addr);
                if !self.is_split(at) && !self.blocks[&at].mapped {
                    self.release_expandable_segment(d, at);
                }
            }
        }
    }

    /// `torch.cuda.empty_cache()`.
    pub fn empty_cache<D: Driver>(&mut self, d: &mut D) {
        self.release_cached_blocks(d);
    }

    /// Frees whole cached large segments older than the average, until the pool holds at most
    /// `garbage_collection_threshold` of the allowed memory.
    fn garbage_collect_cached_blocks<D: Driver>(&mut self, d: &mut D) {
        let Some(max) = self.allowed_max(d) else { return };
        let threshold = (self.conf.garbage_collection_threshold * max as f64) as u64;
        if self.stats.reserved.current <= threshold {
            return;
        }
        let target = self.stats.reserved.current - threshold;
        let calls = self.get_free_calls[LARGE];
        let age = |m: &Self, a: u64| calls - m.blocks[&a].gc_base;
        let freeable = |m: &Self| -> Vec<u64> {
            m.free[LARGE]
                .iter()
                .map(|k| k.2)
                .filter(|&a| !m.is_split(a) && !m.expandable(a))
                .collect()
        };
        let (mut reclaimed, mut freed) = (0u64, true);
        while reclaimed < target && freed {
            let blocks = freeable(self);
            if blocks.is_empty() {
                break;
            }
            let total: u64 = blocks.iter().map(|&a| age(self, a)).sum();
            let threshold_age = total as f64 / blocks.len() as f64;
            freed = false;
            for a in blocks {
                if age(self, a) as f64 >= threshold_age {
                    reclaimed += self.blocks[&a].size;
                    self.release_block(d, a);
                    freed = true;
                }
            }
        }
    }
}

#[path = "expandable.rs"]
mod expandable;
