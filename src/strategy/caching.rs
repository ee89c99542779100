//! Caching: freed blocks are kept by block size (the request rounded by [`Rounding`]) and reused
//! by the next request of that size on the same stream (or on any stream once their stream has been
//! synchronized). The idle bytes kept may be bounded; least recently freed blocks go first.
//!
//! Data structure: an arena of cached-block nodes, each on two doubly linked lists: its bin's
//! list (most recently freed first) and the global LRU list. Hit, insert and trim are O(1);
//! a hit costs one hash lookup of its bin, a free none (the live block names its bin).

use serde::{Deserialize, Serialize};

use super::slots::Slots;
use super::{BlockMeta, Grant, StreamId};
use crate::device::{Device, DevicePtr};
use crate::error::DeviceError;
use crate::hash::FastMap;
use crate::size::class;

/// How a request is rounded to a cached block size.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Rounding {
    /// 8 classes per power of two ([`crate::size::class`]): at most 12.5% rounding, and near
    /// sizes share blocks.
    #[default]
    LogLinear,
    /// What the driver really consumes ([`Device::footprint`]): a cached block uses no more
    /// device memory than passthrough would; only sizes within one driver granule share blocks.
    Granule,
}

/// Settings of the caching strategy.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CachingConfig {
    /// Most idle bytes kept; `None` keeps everything (unbounded).
    pub max_idle_bytes: Option<u64>,
    /// How request sizes are rounded to blocks.
    pub rounding: Rounding,
}

const NIL: u32 = u32::MAX;
const MEMO_BITS: u32 = 6;
const MEMO: usize = 1 << MEMO_BITS;

/// (stream, block bytes); stream `None` is the shared pool of blocks whose stream has been
/// synchronized.
type BinKey = (Option<StreamId>, u64);

/// The cached blocks of one (stream, size), most recently freed first.
#[derive(Debug, Clone, Copy)]
struct Bin {
    key: BinKey,
    head: u32,
    /// Live blocks that return to this bin when freed (it is their home): a stream bin with
    /// none, emptied when its stream is synchronized, is given up for reuse.
    live: u32,
}

#[derive(Debug, Clone, Copy)]
struct Node {
    ptr: DevicePtr,
    bytes: u64,
    /// The bin whose list holds it.
    bin: u32,
    /// The operation count when it was cached, for ageing.
    freed_at: u64,
    bin_prev: u32,
    bin_next: u32,
    lru_prev: u32,
    lru_next: u32,
}

/// The caching strategy: freed blocks are kept in bins by size class and reused by requests of
/// their class, idle memory bounded by `max_idle_bytes`.
#[derive(Debug)]
pub struct Caching {
    config: CachingConfig,
    nodes: Slots<Node>,
    /// Bins by index. A live block names its home bin in its [`BlockMeta`] and is cached again
    /// with no lookup, so a bin lives while a live block names it; a stream's bins are given up
    /// when the stream is synchronized with none, and their slots reused (`spare_bins`).
    bins: Vec<Bin>,
    bin_of: FastMap<BinKey, u32>,
    /// Each stream's bins, so that synchronizing a stream touches only them.
    stream_bins: FastMap<StreamId, Vec<u32>>,
    spare_bins: Vec<u32>,
    /// A direct-mapped memo of `bin_of` for stream bins, (stream, block bytes, bin): a repeated
    /// size skips the hash lookup. A bin given up is cleared from it.
    memo: Box<[(StreamId, u64, u32); MEMO]>,
    /// Most recently freed block; `lru_tail` is the least recently freed.
    lru_head: u32,
    lru_tail: u32,
    reserved: u64,
    idle: u64,
    /// The last (request, block size) of granule rounding.
    last_rounded: (u64, u64),
    /// Bytes given back on frees because idle memory passed `max_idle_bytes`.
    released_over_bound: u64,
}

impl Caching {
    /// An empty cache.
    pub fn new(config: CachingConfig) -> Self {
        Caching {
            config,
            nodes: Slots::new(),
            bins: Vec::new(),
            bin_of: FastMap::default(),
            stream_bins: FastMap::default(),
            spare_bins: Vec::new(),
            memo: Box::new([(0, 0, NIL); MEMO]),
            lru_head: NIL,
            lru_tail: NIL,
            reserved: 0,
            idle: 0,
            last_rounded: (0, 0),
            released_over_bound: 0,
        }
    }

    /// Bytes given back so far because idle memory passed `max_idle_bytes` (on frees, or when
    /// the bound was lowered).
    pub fn released_over_bound(&self) -> u64 {
        self.released_over_bound
    }

    /// Its settings now.
    pub fn config(&self) -> CachingConfig {
        self.config
    }

    /// Changes the bound; trims at once when the new bound is lower than what is idle.
    pub fn set_max_idle_bytes(&mut self, dev: &dyn Device, bound: Option<u64>) {
        self.config.max_idle_bytes = bound;
        if let Some(b) = bound {
            self.released_over_bound += self.trim_to(dev, b);
        }
    }

    /// The block size a request of `bytes` gets. Granule rounding asks the device (two dynamic
    /// calls), so the last answer is kept: repeated sizes cost one compare.
    #[inline]
    pub fn block_size(&mut self, dev: &dyn Device, bytes: u64) -> u64 {
        match self.config.rounding {
            Rounding::LogLinear => class::size(class::of(bytes)),
            Rounding::Granule if self.last_rounded.0 == bytes => self.last_rounded.1,
            Rounding::Granule => {
                let block = dev.footprint(bytes).max(bytes);
                self.last_rounded = (bytes, block);
                block
            }
        }
    }

    pub(super) fn allocate(&mut self, dev: &dyn Device, bytes: u64, stream: StreamId) -> Result<Grant, DeviceError> {
        match self.allocate_cached(dev, bytes, stream) {
            Some(g) => Ok(g),
            None => self.allocate_new(dev, bytes, stream),
        }
    }

    /// A cached block for `bytes` if one is waiting; never calls the driver.
    /// Cost on a hit from the stream's own bin: one hash lookup and two O(1) list unlinks.
    #[inline]
    pub fn allocate_cached(&mut self, dev: &dyn Device, bytes: u64, stream: StreamId) -> Option<Grant> {
        let block_bytes = self.block_size(dev, bytes);
        let own = self.own_bin(stream, block_bytes);
        if let Some(b) = own {
            if self.bins[b as usize].head != NIL {
                return Some(self.take(b, b));
            }
        }
        self.allocate_shared(own, block_bytes, stream)
    }

    /// The bin of (stream, block bytes) if it exists: the memo, else the map (filling the memo).
    #[inline]
    fn own_bin(&mut self, stream: StreamId, block_bytes: u64) -> Option<u32> {
        let slot = ((block_bytes >> 8) ^ stream).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - MEMO_BITS);
        let (s, b, bin) = self.memo[slot as usize];
        if s == stream && b == block_bytes {
            return Some(bin);
        }
        let bin = *self.bin_of.get(&(Some(stream), block_bytes))?;
        self.memo[slot as usize] = (stream, block_bytes, bin);
        Some(bin)
    }

    /// A block from the shared pool (blocks whose stream was synchronized).
    #[cold]
    fn allocate_shared(&mut self, own: Option<u32>, block_bytes: u64, stream: StreamId) -> Option<Grant> {
        let shared = *self.bin_of.get(&(None, block_bytes))?;
        if self.bins[shared as usize].head == NIL {
            return None;
        }
        let home = own.unwrap_or_else(|| self.bin_for((Some(stream), block_bytes)));
        Some(self.take(shared, home))
    }

    /// Takes the head of bin `from`; the block returns to bin `home` when freed.
    #[inline]
    fn take(&mut self, from: u32, home: u32) -> Grant {
        let idx = self.bins[from as usize].head;
        let node = self.nodes[idx];
        self.unlink(idx);
        self.bins[home as usize].live += 1;
        self.idle -= node.bytes;
        Grant {
            ptr: node.ptr,
            block_bytes: node.bytes,
            hit: true,
            meta: BlockMeta::Cached { bin: home },
        }
    }

    /// The index of the bin for `key`, made if new (in a spare slot when there is one).
    fn bin_for(&mut self, key: BinKey) -> u32 {
        if let Some(&b) = self.bin_of.get(&key) {
            return b;
        }
        self.new_bin(key)
    }

    #[cold]
    fn new_bin(&mut self, key: BinKey) -> u32 {
        let bin = Bin {
            key,
            head: NIL,
            live: 0,
        };
        let b = match self.spare_bins.pop() {
            Some(b) => {
                self.bins[b as usize] = bin;
                b
            }
            None => {
                self.bins.push(bin);
                self.bins.len() as u32 - 1
            }
        };
        self.bin_of.insert(key, b);
        if let Some(stream) = key.0 {
            self.stream_bins.entry(stream).or_default().push(b);
        }
        b
    }

    /// A new block from the driver for `bytes` (after [`allocate_cached`](Caching::allocate_cached)
    /// found none).
    #[cold]
    pub fn allocate_new(&mut self, dev: &dyn Device, bytes: u64, stream: StreamId) -> Result<Grant, DeviceError> {
        let block_bytes = self.block_size(dev, bytes);
        let ptr = dev.allocate(block_bytes)?;
        self.reserved += block_bytes;
        let bin = self.bin_for((Some(stream), block_bytes));
        self.bins[bin as usize].live += 1;
        Ok(Grant {
            ptr,
            block_bytes,
            hit: false,
            meta: BlockMeta::Cached { bin },
        })
    }

    /// Caches the block at the head of its bin (named by `meta`) and of the LRU list (O(1), no
    /// lookup), then trims to the bound. `now` is the allocator's operation count, for ageing.
    pub(super) fn deallocate(
        &mut self,
        dev: &dyn Device,
        ptr: DevicePtr,
        block_bytes: u64,
        meta: BlockMeta,
        stream: StreamId,
        now: u64,
    ) {
        let bin = match meta {
            BlockMeta::Cached { bin } => {
                self.bins[bin as usize].live -= 1;
                bin
            }
            _ => self.bin_for((Some(stream), block_bytes)),
        };
        debug_assert_eq!(self.bins[bin as usize].key, (Some(stream), block_bytes));
        let idx = self.nodes.insert(Node {
            ptr,
            bytes: block_bytes,
            bin,
            freed_at: now,
            bin_prev: NIL,
            bin_next: NIL,
            lru_prev: NIL,
            lru_next: NIL,
        });
        self.link(idx);
        self.idle += block_bytes;
        if let Some(bound) = self.config.max_idle_bytes {
            if self.idle > bound {
                self.released_over_bound += self.trim_to(dev, bound);
            }
        }
    }

    /// Frees least recently used blocks until at most `bound` idle bytes remain; returns bytes freed.
    pub fn trim_to(&mut self, dev: &dyn Device, bound: u64) -> u64 {
        self.trim_while(dev, |c| c.idle > bound)
    }

    /// Frees blocks cached before operation `cutoff` (they were not reused); returns bytes freed.
    pub fn trim_older_than(&mut self, dev: &dyn Device, cutoff: u64) -> u64 {
        self.trim_while(dev, |c| c.lru_tail != NIL && c.nodes[c.lru_tail].freed_at < cutoff)
    }

    fn trim_while(&mut self, dev: &dyn Device, more: impl Fn(&Self) -> bool) -> u64 {
        let mut released = 0;
        while self.lru_tail != NIL && more(self) {
            let idx = self.lru_tail;
            let node = self.nodes[idx];
            self.unlink(idx);
            self.idle -= node.bytes;
            self.reserved -= node.bytes;
            released += node.bytes;
            if let Err(e) = dev.free(node.ptr) {
                tracing::error!(ptr = node.ptr, error = %e, "driver free failed; block forgotten");
            }
        }
        released
    }

    /// Moves the blocks cached on `stream` to the shared pool, keeping their age, and gives up
    /// the stream's bins that no live block names.
    pub(super) fn synchronize_stream(&mut self, stream: StreamId) {
        let Some(mut bins) = self.stream_bins.remove(&stream) else {
            return;
        };
        bins.sort_unstable();
        let mut kept = Vec::new();
        for b in bins {
            let bytes = self.bins[b as usize].key.1;
            let shared = self.bin_for((None, bytes));
            while self.bins[b as usize].head != NIL {
                let head = self.bins[b as usize].head;
                let mut node = self.nodes[head];
                self.unlink(head);
                node.bin = shared;
                let idx = self.nodes.insert(node);
                self.link(idx);
            }
            if self.bins[b as usize].live > 0 {
                kept.push(b);
                continue;
            }
            let key = self.bins[b as usize].key;
            self.bin_of.remove(&key);
            for m in self.memo.iter_mut().filter(|m| m.2 == b) {
                *m = (0, 0, NIL);
            }
            self.spare_bins.push(b);
        }
        if !kept.is_empty() {
            self.stream_bins.insert(stream, kept);
        }
    }

    /// Bins in use (per (stream, block size), and the shared ones).
    #[cfg(test)]
    pub(crate) fn bins_in_use(&self) -> usize {
        self.bins.len() - self.spare_bins.len()
    }

    pub(super) fn reserved_bytes(&self) -> u64 {
        self.reserved
    }

    pub(super) fn idle_bytes(&self) -> u64 {
        self.idle
    }

    pub(super) fn largest_free_block(&self) -> u64 {
        self.bins
            .iter()
            .filter(|b| b.head != NIL)
            .map(|b| b.key.1)
            .max()
            .unwrap_or(0)
    }

    /// Number of cached blocks.
    pub fn cached_blocks(&self) -> usize {
        self.nodes.live()
    }

    /// Puts node `idx` at the head of its bin and of the LRU list.
    #[inline]
    fn link(&mut self, idx: u32) {
        let bin = self.nodes[idx].bin as usize;
        let old_head = std::mem::replace(&mut self.bins[bin].head, idx);
        let lru_head = self.lru_head;
        {
            let n = &mut self.nodes[idx];
            n.bin_prev = NIL;
            n.bin_next = old_head;
            n.lru_prev = NIL;
            n.lru_next = lru_head;
        }
        if old_head != NIL {
            self.nodes[old_head].bin_prev = idx;
        }
        if lru_head != NIL {
            self.nodes[lru_head].lru_prev = idx;
        } else {
            self.lru_tail = idx;
        }
        self.lru_head = idx;
    }

    /// Removes node `idx` from both lists and frees its slot.
    #[inline]
    fn unlink(&mut self, idx: u32) {
        let n = self.nodes[idx];
        if n.bin_prev != NIL {
            self.nodes[n.bin_prev].bin_next = n.bin_next;
        } else {
            self.bins[n.bin as usize].head = n.bin_next;
        }
        if n.bin_next != NIL {
            self.nodes[n.bin_next].bin_prev = n.bin_prev;
        }
        if n.lru_prev != NIL {
            self.nodes[n.lru_prev].lru_next = n.lru_next;
        } else {
            self.lru_head = n.lru_next;
        }
        if n.lru_next != NIL {
            self.nodes[n.lru_next].lru_prev = n.lru_prev;
        } else {
            self.lru_tail = n.lru_prev;
        }
        self.nodes.release(idx);
    }
}
