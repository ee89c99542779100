//! Strategies: how a size class is served. The set is closed, so it is an enum, not `dyn`.
//!
//! Every strategy keeps its bookkeeping on the host and obtains memory only through a
//! [`Device`]. The allocator holds the live-pointer map and passes back the [`BlockMeta`] a
//! strategy returned when that pointer is freed.

mod caching;
mod pages;
mod passthrough;
mod slots;
mod suballoc;

pub use caching::{Caching, CachingConfig, Rounding};
pub use passthrough::Passthrough;
pub use suballoc::{SlabBacking, Split, Suballoc, SuballocConfig};

use serde::{Deserialize, Serialize};

use crate::device::{Device, DevicePtr};
use crate::error::DeviceError;

/// A stream id: the integer value of a `cudaStream_t` (0 = the legacy default stream).
pub type StreamId = u64;

/// The strategies by name, as the command line and policy files spell them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum StrategyKind {
    /// `passthrough`: straight to the driver.
    Passthrough,
    /// `caching`: freed blocks kept for requests of their size class.
    Caching,
    /// `suballoc`: blocks carved from slabs.
    Suballoc,
}

impl StrategyKind {
    /// Every kind, in the allocator's order.
    pub const ALL: [StrategyKind; 3] = [StrategyKind::Passthrough, StrategyKind::Caching, StrategyKind::Suballoc];

    /// The name as the command line and policy files spell it.
    pub fn name(self) -> &'static str {
        match self {
            StrategyKind::Passthrough => "passthrough",
            StrategyKind::Caching => "caching",
            StrategyKind::Suballoc => "suballoc",
        }
    }
}

impl std::fmt::Display for StrategyKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Where a live block came from inside its strategy.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BlockMeta {
    /// A driver allocation of its own (passthrough).
    #[default]
    Direct,
    /// A cached block (its size is the grant's `block_bytes`); the index of the bin it returns
    /// to when freed.
    Cached {
        /// The bin's index.
        bin: u32,
    },
    /// A block carved from a slab; the index of its node in the suballocator.
    Sub {
        /// The node's index.
        node: u32,
    },
    /// A block the suballocator spliced together on out-of-memory from the free ends of held
    /// pages and fresh pages; the index of its record.
    Spliced {
        /// The record's index.
        splice: u32,
    },
}

/// A block handed out by a strategy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Grant {
    /// The block's device address.
    pub ptr: DevicePtr,
    /// Bytes the block occupies (>= the request; the difference is rounding).
    pub block_bytes: u64,
    /// Whether the block came without a driver call.
    pub hit: bool,
    /// Where the block came from inside its strategy (needed to free it).
    pub meta: BlockMeta,
}

/// One strategy instance with its state.
// An allocator holds at most three strategies, so the suballocator's larger inline tables
// cost nothing worth a Box (and an indirection on the hot path).
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum Strategy {
    /// See [`Passthrough`].
    Passthrough(Passthrough),
    /// See [`Caching`].
    Caching(Caching),
    /// See [`Suballoc`].
    Suballoc(Suballoc),
}

impl Strategy {
    /// Which strategy this is.
    pub fn kind(&self) -> StrategyKind {
        match self {
            Strategy::Passthrough(_) => StrategyKind::Passthrough,
            Strategy::Caching(_) => StrategyKind::Caching,
            Strategy::Suballoc(_) => StrategyKind::Suballoc,
        }
    }

    /// Serves `bytes` (already aligned to 256) on `stream`.
    pub fn allocate(&mut self, dev: &dyn Device, bytes: u64, stream: StreamId) -> Result<Grant, DeviceError> {
        match self {
            Strategy::Passthrough(s) => s.allocate(dev, bytes),
            Strategy::Caching(s) => s.allocate(dev, bytes, stream),
            Strategy::Suballoc(s) => s.allocate(dev, bytes, stream),
        }
    }

    /// Takes back a block this strategy granted. Releasing memory cannot fail for the caller: a
    /// driver error on free is logged and the block forgotten. `now` is the allocator's
    /// operation count (for ageing idle memory). Inlined into the allocator's free path (a
    /// match and the strategy's own free: callgrind counts ~15 instructions more per free when
    /// the compiler leaves it out of line).
    #[inline]
    pub fn deallocate(
        &mut self,
        dev: &dyn Device,
        ptr: DevicePtr,
        block_bytes: u64,
        meta: BlockMeta,
        stream: StreamId,
        now: u64,
    ) {
        match self {
            Strategy::Passthrough(s) => s.deallocate(dev, ptr, block_bytes),
            Strategy::Caching(s) => s.deallocate(dev, ptr, block_bytes, meta, stream, now),
            // Spliced blocks (rare, cold) are told apart here, so the suballocator's own free
            // path stays as it was.
            Strategy::Suballoc(s) if matches!(meta, BlockMeta::Spliced { .. }) => {
                s.free_spliced(dev, meta, stream, now)
            }
            Strategy::Suballoc(s) => s.deallocate(dev, meta, stream, now),
        }
    }

    /// Releases idle memory unused since operation `cutoff`; returns the bytes released.
    pub fn release_older_than(&mut self, dev: &dyn Device, cutoff: u64) -> u64 {
        match self {
            Strategy::Passthrough(_) => 0,
            Strategy::Caching(s) => s.trim_older_than(dev, cutoff),
            Strategy::Suballoc(s) => s.release_empty_older_than(dev, cutoff),
        }
    }

    /// Releases idle memory until at most `keep` idle bytes remain, where it can (free space
    /// inside slabs that hold live blocks cannot be released).
    /// `unmap_pages` also unmaps unused pages inside paged slabs that hold live blocks (worth it
    /// when others need the memory, not to meet an idle bound: they are mapped again soon).
    pub fn release_down_to(&mut self, dev: &dyn Device, keep: u64, unmap_pages: bool) -> u64 {
        match self {
            Strategy::Passthrough(_) => 0,
            Strategy::Caching(s) => s.trim_to(dev, keep),
            Strategy::Suballoc(s) => s.release_down_to(dev, keep, unmap_pages),
        }
    }

    /// Gives every idle byte that can be given back to the device; returns the bytes released.
    pub fn release_idle(&mut self, dev: &dyn Device) -> u64 {
        match self {
            Strategy::Passthrough(_) => 0,
            Strategy::Caching(s) => s.trim_to(dev, 0),
            Strategy::Suballoc(s) => s.release_empty_slabs(dev, 0) + s.unmap_unused(dev, u64::MAX),
        }
    }

    /// While on, nothing is unmapped or moved to place a block (a private pool's window is
    /// open); see [`Suballoc::freeze`].
    pub fn freeze(&mut self, on: bool) {
        if let Strategy::Suballoc(s) = self {
            s.freeze(on);
        }
    }

    /// Blocks freed on `stream` become usable by every stream.
    pub fn synchronize_stream(&mut self, stream: StreamId) {
        match self {
            Strategy::Passthrough(_) => {}
            Strategy::Caching(s) => s.synchronize_stream(stream),
            Strategy::Suballoc(s) => s.synchronize_stream(stream),
        }
    }

    /// Bytes held from the driver.
    pub fn reserved_bytes(&self) -> u64 {
        match self {
            Strategy::Passthrough(s) => s.reserved_bytes(),
            Strategy::Caching(s) => s.reserved_bytes(),
            Strategy::Suballoc(s) => s.reserved_bytes(),
        }
    }

    /// (reserved, idle) bytes in one dispatch, for the allocator's fast paths.
    #[inline]
    pub fn held_bytes(&self) -> (u64, u64) {
        match self {
            Strategy::Passthrough(s) => (s.reserved_bytes(), 0),
            Strategy::Caching(s) => (s.reserved_bytes(), s.idle_bytes()),
            Strategy::Suballoc(s) => (s.reserved_bytes(), s.idle_bytes()),
        }
    }

    /// Reserved bytes not in a live block.
    pub fn idle_bytes(&self) -> u64 {
        match self {
            Strategy::Passthrough(_) => 0,
            Strategy::Caching(s) => s.idle_bytes(),
            Strategy::Suballoc(s) => s.idle_bytes(),
        }
    }

    /// Idle bytes that [`release_idle`](Strategy::release_idle) would give back.
    pub fn releasable_bytes(&self) -> u64 {
        self.releasable(true)
    }

    /// Idle bytes [`release_down_to`](Strategy::release_down_to) can reach with `unmap_pages`:
    /// cached blocks and empty slabs, and with it unused pages of slabs in use.
    pub fn releasable(&self, unmap_pages: bool) -> u64 {
        match self {
            Strategy::Passthrough(_) => 0,
            Strategy::Caching(s) => s.idle_bytes(),
            Strategy::Suballoc(s) if unmap_pages => s.releasable_bytes(),
            Strategy::Suballoc(s) => s.empty_bytes(),
        }
    }

    /// Bytes given back on frees so far because the strategy's own bound on idle memory was
    /// passed (cached blocks over `max_idle_bytes`, empty slabs over `max_empty_bytes`).
    pub fn released_over_bound(&self) -> u64 {
        match self {
            Strategy::Passthrough(_) => 0,
            Strategy::Caching(s) => s.released_over_bound(),
            Strategy::Suballoc(s) => s.released_over_bound(),
        }
    }

    /// Bytes live blocks pin beyond what the driver would consume for them (slabs only).
    pub fn stranded_bytes(&self) -> u64 {
        match self {
            Strategy::Suballoc(s) => s.stranded_bytes(),
            _ => 0,
        }
    }

    /// The largest request that could be served with no driver call.
    pub fn largest_free_block(&self) -> u64 {
        match self {
            Strategy::Passthrough(_) => 0,
            Strategy::Caching(s) => s.largest_free_block(),
            Strategy::Suballoc(s) => s.largest_free_block(),
        }
    }
}
