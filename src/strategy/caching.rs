//! Caching: freed blocks are kept by block size (the request rounded by [`Rounding`]) and reused
//! by the next request of that size on the same stream (or on any stream once their stream has been
//! synchronized). The idle bytes kept may be bounded; least recently freed blocks go first.
//!
//! Data structure: an arena of cached-block nodes, each on two doubly linked lists: its bin's
//! list (most recently freed first) and the global LRU list. Hit, insert and trim are O(1)
//! apart from one hash lookup of the bin.

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
    pub rounding: Rounding,
}

const NIL: u32 = u32::MAX;

/// (stream, block bytes); stream `None` is the shared pool of blocks whose stream has been
/// synchronized.
type BinKey = (Option<StreamId>, u64);

#[derive(Debug, Clone, Copy)]
struct Node {
    ptr: DevicePtr,
    bytes: u64,
    stream: Option<StreamId>,
    /// The operation count when it was cached, for ageing.
    freed_at: u64,
    bin_prev: u32,
    bin_next: u32,
    lru_prev: u32,
    lru_next: u32,
}

#[derive(Debug)]
pub struct Caching {
    config: CachingConfig,
    nodes: Slots<Node>,
    /// Head (most recently freed) of each bin's list.
    bins: FastMap<BinKey, u32>,
    /// Most recently freed block; `lru_tail` is the least recently freed.
    lru_head: u32,
    lru_tail: u32,
    reserved: u64,
    idle: u64,
}

impl Caching {
    pub fn new(config: CachingConfig) -> Self {
        Caching {
            config,
            nodes: Slots::new(),
            bins: FastMap::default(),
            lru_head: NIL,
            lru_tail: NIL,
            reserved: 0,
            idle: 0,
        }
    }

    pub fn config(&self) -> CachingConfig {
        self.config
    }

    /// Changes the bound; trims at once when the new bound is lower than what is idle.
    pub fn set_max_idle_bytes(&mut self, dev: &dyn Device, bound: Option<u64>) {
        self.config.max_idle_bytes = bound;
        if let Some(b) = bound {
            self.trim_to(dev, b);
        }
    }

    /// The block size a request of `bytes` gets.
    #[inline]
    pub fn block_size(&self, dev: &dyn Device, bytes: u64) -> u64 {
        match self.config.rounding {
            Rounding::LogLinear => class::size(class::of(bytes)),
            Rounding::Granule => dev.footprint(bytes).max(bytes),
        }
    }

    /// Fast path on a hit: one hash lookup and two list unlinks (~30 ns).
    pub(super) fn allocate(&mut self, dev: &dyn Device, bytes: u64, stream: StreamId) -> Result<Grant, DeviceError> {
        match self.allocate_cached(dev, bytes, stream) {
            Some(g) => Ok(g),
            None => self.allocate_slow(dev, self.block_size(dev, bytes)),
        }
    }

    /// A cached block for `bytes` if one is waiting; never calls the driver.
    pub fn allocate_cached(&mut self, dev: &dyn Device, bytes: u64, stream: StreamId) -> Option<Grant> {
        let block_bytes = self.block_size(dev, bytes);
        for key in [(Some(stream), block_bytes), (None, block_bytes)] {
            if let Some(&head) = self.bins.get(&key) {
                let node = self.nodes[head];
                self.unlink(head);
                self.idle -= block_bytes;
                return Some(Grant {
                    ptr: node.ptr,
                    block_bytes,
                    hit: true,
                    meta: BlockMeta::Cached,
                });
            }
        }
        None
    }

    #[cold]
    fn allocate_slow(&mut self, dev: &dyn Device, block_bytes: u64) -> Result<Grant, DeviceError> {
        let ptr = dev.allocate(block_bytes)?;
        self.reserved += block_bytes;
        Ok(Grant {
            ptr,
            block_bytes,
            hit: false,
            meta: BlockMeta::Cached,
        })
    }

    /// Caches the block at the head of its bin and of the LRU list (O(1)), then trims to the
    /// bound. `now` is the allocator's operation count, for ageing.
    pub(super) fn deallocate(
        &mut self,
        dev: &dyn Device,
        ptr: DevicePtr,
        block_bytes: u64,
        stream: StreamId,
        now: u64,
    ) {
        let idx = self.nodes.insert(Node {
            ptr,
            bytes: block_bytes,
            stream: Some(stream),
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
                self.trim_to(dev, bound);
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

    pub(super) fn synchronize_stream(&mut self, stream: StreamId) {
        let keys: Vec<BinKey> = self.bins.keys().copied().filter(|k| k.0 == Some(stream)).collect();
        for key in keys {
            while let Some(&head) = self.bins.get(&key) {
                let mut node = self.nodes[head];
                self.unlink(head);
                node.stream = None;
                let idx = self.nodes.insert(node);
                self.link(idx);
            }
        }
    }

    pub(super) fn reserved_bytes(&self) -> u64 {
        self.reserved
    }

    pub(super) fn idle_bytes(&self) -> u64 {
        self.idle
    }

    pub(super) fn largest_free_block(&self) -> u64 {
        self.bins.keys().map(|k| k.1).max().unwrap_or(0)
    }

    /// Number of cached blocks.
    pub fn cached_blocks(&self) -> usize {
        self.nodes.live()
    }

    /// Puts node `idx` at the head of its bin and of the LRU list.
    fn link(&mut self, idx: u32) {
        let key = (self.nodes[idx].stream, self.nodes[idx].bytes);
        let old_head = self.bins.insert(key, idx).unwrap_or(NIL);
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
    fn unlink(&mut self, idx: u32) {
        let n = self.nodes[idx];
        if n.bin_prev != NIL {
            self.nodes[n.bin_prev].bin_next = n.bin_next;
        } else if n.bin_next != NIL {
            self.bins.insert((n.stream, n.bytes), n.bin_next);
        } else {
            self.bins.remove(&(n.stream, n.bytes));
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
