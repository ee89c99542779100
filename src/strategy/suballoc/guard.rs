//! The strand guard: what a placement would pin beyond the driver's footprint of its block,
//! and whether that passes the budget the policy engine sets; under `SlabBacking::Blocks`, the
//! idle handles a placement would pin in part, given back instead. Also the held-hole search
//! (pressure and out-of-memory), which ranks holes by what they would pin.

use super::{BlockMeta, Grant, NIL, Node, SlabBacking, Suballoc};
use crate::device::Device;
use crate::size::{ALIGNMENT, round_up};
use crate::strategy::StreamId;

impl Suballoc {
    /// The guard's test: a block of `bytes` placed `pad` into free node `found` (a new slab
    /// when None) pins more than its driver `footprint` and leaves the slabs stranding more
    /// than `budget`. Decided without looking at pages when even the most the block could pin
    /// (its pages, one more at each end) stays within the budget: the common case with room.
    #[inline]
    pub(super) fn strands_over(
        &self,
        dev: &dyn Device,
        found: Option<u32>,
        pad: u64,
        bytes: u64,
        footprint: u64,
        budget: u64,
    ) -> bool {
        let granule = self.model.map_or_else(|| dev.granularity(), |m| m.large_granule);
        let worst = bytes + 2 * granule;
        // What live blocks will consume with this one, at least the given peak's footprint.
        let consumed = (self.acct.consumed() + footprint).max(self.strand_floor);
        let within = self.acct.pinned() + worst <= consumed + budget;
        // Under `SlabBacking::Blocks` a block may pin an idle handle larger than its own pages:
        // the quick test holds only where no such handle is there.
        if within && (self.config.backing != SlabBacking::Blocks || !self.may_overhang(found)) {
            return false;
        }
        let pinned = self.would_pin(dev, found, pad, bytes);
        pinned > footprint && (self.acct.pinned() + pinned).saturating_sub(consumed) > budget
    }

    /// What a block of `bytes` placed `pad` into free node `found` (a new slab when None)
    /// would newly pin: [`strands_over`](Self::strands_over) past its quick test.
    #[cold]
    #[inline(never)]
    fn would_pin(&self, dev: &dyn Device, found: Option<u32>, pad: u64, bytes: u64) -> u64 {
        match found {
            Some(idx) => self.pins(idx, pad, bytes),
            // A new slab: the block's pages (its handle, where larger, is split out of memory).
            None => match self.vmm_for_new(dev) {
                Some(vmm) => round_up(bytes, vmm.page_size()),
                None => round_up(bytes, dev.granularity().max(ALIGNMENT)),
            },
        }
    }

    /// A block placed in free node `found` may pin an idle handle larger than its own pages:
    /// the slab has an idle handle (cold: only under `SlabBacking::Blocks`).
    #[cold]
    #[inline(never)]
    fn may_overhang(&self, found: Option<u32>) -> bool {
        self.config.backing == SlabBacking::Blocks
            && found.is_some_and(|idx| {
                let slab = self.nodes[idx].slab;
                matches!(self.pages.get(slab as usize), Some(Some(pm)) if pm.has_idle_handles())
            })
    }

    /// Bytes a block of `bytes` placed `pad` bytes into free node `idx` would newly pin.
    #[inline]
    pub(super) fn pins(&self, idx: u32, pad: u64, bytes: u64) -> u64 {
        let n = &self.nodes[idx];
        let slab = &self.slabs[n.slab];
        match self.pages.get(n.slab as usize) {
            Some(Some(pm)) => pm.unpinned_bytes(n.addr + pad - slab.base, bytes),
            _ if slab.used == 0 => slab.size,
            _ => 0,
        }
    }

    /// Sets the strand guard's budget (None: no guard). See [`allocate_guarded`](Self::allocate_guarded).
    pub fn set_strand_budget(&mut self, budget: Option<u64>) {
        self.strand_budget = budget;
    }

    /// Bytes pinned by live blocks over what the driver would consume for them, or 0 when the
    /// blocks share pages well enough to hold less.
    pub fn stranded_bytes(&self) -> u64 {
        self.acct.pinned().saturating_sub(self.acct.consumed())
    }

    /// Serves `bytes` from free slab space only (no driver call), or None. The last resort on
    /// out-of-memory and the first choice under memory pressure: a scan of every usable free
    /// block, O(blocks). In a paged slab only a block whose pages are all mapped qualifies
    /// (mapping more would be a driver call, and handing out unmapped memory a fault on the GPU).
    ///
    /// Among the holes that fit, it takes the one that pins the least memory that could
    /// otherwise go back (pages no live block touches, or a whole empty slab), then the
    /// smallest. When `strict`, a hole that would pin more than the driver's own allocation of
    /// the block would consume is refused: under pressure a small block that pins a fresh 2 MiB
    /// page holds more than the driver (which packs small allocations) would. A hole larger
    /// than `max_hole` is passed over (`u64::MAX`: none is).
    #[cold]
    pub fn allocate_existing(
        &mut self,
        dev: &dyn Device,
        bytes: u64,
        stream: StreamId,
        strict: bool,
        max_hole: u64,
    ) -> Option<Grant> {
        let footprint = self.footprint(dev, bytes);

        // Memory a placement at the hole's start would newly pin; None when its pages are not
        // mapped, or (strict) when it pins more than a driver allocation would consume.
        let cost = |i: u32, n: &Node| {
            let pad = self.page_pad(i, bytes);
            if let Some(Some(pm)) = self.pages.get(n.slab as usize)
                && !pm.covers(n.addr + pad - self.slabs[n.slab].base, bytes)
            {
                return None;
            }
            let pinned = self.pins(i, pad, bytes);
            (!strict || pinned <= footprint).then_some((pinned, pad))
        };
        let mut best: Option<((u64, u64), u32, u64)> = None;
        for slab_head in self.slabs_heads() {
            let mut i = slab_head;
            while i != NIL {
                let n = self.nodes[i];
                if self.free_for(&n, stream)
                    && n.size >= bytes
                    && n.size <= max_hole
                    && let Some((pinned, pad)) = cost(i, &n)
                    && best.is_none_or(|(c, _, _)| (pinned, n.size) < c)
                {
                    best = Some(((pinned, n.size), i, pad));
                }
                i = n.phys_next;
            }
        }
        let (_, idx, pad) = best?;
        let (idx, ptr) = self.take(idx, pad, bytes, footprint);
        Some(Grant {
            ptr,
            block_bytes: bytes,
            hit: true,
            meta: BlockMeta::Sub { node: idx },
        })
    }
}
