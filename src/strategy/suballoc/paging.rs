//! Page-backed slabs of the suballocator: mapping the pages a new block needs, and giving back
//! pages no live block touches (the page bookkeeping itself is `strategy::pages`).

use crate::device::Device;
use crate::error::DeviceError;
use crate::size::round_up;

use super::{SlabBacking, Suballoc};

impl Suballoc {
    /// Where in free node `idx` a block of `bytes` should start, as an offset from the node's
    /// start: a block of half a page or more in a paged slab starts on a page boundary when
    /// that covers fewer pages and the node has room, so it pins no more pages than the
    /// driver would round it to and shares none with a neighbour that could outlive it and
    /// strand the page; 0 otherwise. Cost: a few arithmetic operations.
    #[inline]
    pub(super) fn page_pad(&self, idx: u32, bytes: u64) -> u64 {
        let n = &self.nodes[idx];
        let Some(Some(pm)) = self.pages.get(n.slab as usize) else {
            return 0;
        };
        let page = pm.page_size();
        let off = n.addr - self.slabs[n.slab].base;
        if bytes < page / 2 || off % page == 0 {
            return 0;
        }
        let pad = round_up(off, page) - off;
        let spans_more = (off % page + bytes).div_ceil(page) > bytes.div_ceil(page);
        if spans_more && pad + bytes <= n.size { pad } else { 0 }
    }

    /// Where in free node `idx` a block of `bytes` goes: as [`page_pad`](Self::page_pad) says,
    /// except that every other block it moves to start on a page boundary ends on one instead,
    /// where the node has room (the same pages either way). Pages then offer free starts as well
    /// as free ends, and a spliced block ([`super::splice`]) starts in a free end and ends in a
    /// free start. Cost: one compare for blocks under half a page; the rest is cold.
    #[inline]
    pub(super) fn placement_pad(&mut self, idx: u32, bytes: u64) -> u64 {
        let pad = self.page_pad(idx, bytes);
        if pad == 0 {
            return 0;
        }
        self.end_aligned_pad(idx, bytes).unwrap_or(pad)
    }

    /// The pad that makes a block of `bytes` end on a page boundary in free node `idx`, every
    /// other time it fits.
    #[cold]
    fn end_aligned_pad(&mut self, idx: u32, bytes: u64) -> Option<u64> {
        let n = self.nodes[idx];
        let page = self.pages.get(n.slab as usize)?.as_ref()?.page_size();
        let end = n.addr - self.slabs[n.slab].base + bytes;
        let pad = round_up(end, page) - end;
        if pad + bytes > n.size {
            return None;
        }
        self.next_at_end = !self.next_at_end;
        self.next_at_end.then_some(pad)
    }

    /// Where a block of `bytes` goes in new slab `idx`, as an offset from its start. A block of
    /// half a page or more that got a paged slab of its own size leaves the slab's slack (under
    /// a page) free at one end, and the ends alternate as in
    /// [`placement_pad`](Self::placement_pad). 0 (the start) otherwise. Slow path (a new slab).
    pub(super) fn own_slab_pad(&mut self, idx: u32, bytes: u64) -> u64 {
        let n = self.nodes[idx];
        let Some(Some(pm)) = self.pages.get(n.slab as usize) else {
            return 0;
        };
        let page = pm.page_size();
        if bytes < page / 2 || n.size == bytes || n.size != round_up(bytes, page) {
            return 0;
        }
        self.next_at_end = !self.next_at_end;
        if self.next_at_end { n.size - bytes } else { 0 }
    }

    /// Under `SlabBacking::Blocks`: gives back the idle handles of more than one page that a
    /// block of `bytes` placed `pad` bytes into free node `idx` would cover only in part, so
    /// that the block pins no more than its own pages ([`map_for`](Self::map_for) then maps
    /// handles shaped to it). Leaves them when the device cannot quiesce.
    /// Returns whether it gave any back.
    #[cold]
    pub(super) fn reshape(&mut self, dev: &dyn Device, idx: u32, pad: u64, bytes: u64) -> bool {
        if self.config.backing != SlabBacking::Blocks {
            return false;
        }
        let n = self.nodes[idx];
        let slab = self.slabs[n.slab];
        let start = n.addr + pad - slab.base;
        let Some(Some(pm)) = self.pages.get(n.slab as usize) else {
            return false;
        };
        if !pm.overhangs_idle(start, bytes) || !self.quiesce(dev) {
            return false;
        }
        let vmm = dev.vmm().expect("a paged slab's device has vmm");
        let Some(Some(pm)) = self.pages.get_mut(n.slab as usize) else {
            return false;
        };
        for (off, len) in pm.take_unused_overhanging(start, bytes) {
            if let Err(e) = vmm.unmap(slab.base + off, len) {
                tracing::error!(ptr = slab.base + off, error = %e, "unmap failed; pages forgotten");
            }
            self.acct.given_back(slab.pool, len);
        }
        true
    }

    /// Maps the pages a block of `bytes` placed `pad` bytes into free node `idx` needs; true
    /// when it made driver calls. Fails (changing nothing) when the device cannot back them.
    /// Cost: one compare where the slab is wholly mapped (the common case); the rest is cold.
    #[inline]
    pub(super) fn map_for(&mut self, dev: &dyn Device, idx: u32, pad: u64, bytes: u64) -> Result<bool, DeviceError> {
        match self.pages.get(self.nodes[idx].slab as usize) {
            Some(Some(pm)) if !pm.all_mapped() => self.map_unmapped(dev, idx, pad, bytes),
            _ => Ok(false),
        }
    }

    #[cold]
    #[inline(never)]
    fn map_unmapped(&mut self, dev: &dyn Device, idx: u32, pad: u64, bytes: u64) -> Result<bool, DeviceError> {
        let n = self.nodes[idx];
        let slab = self.slabs[n.slab];
        let Some(Some(pm)) = self.pages.get_mut(n.slab as usize) else {
            return Ok(false);
        };
        let runs = pm.unmapped_runs(n.addr + pad - slab.base, bytes);
        if runs.is_empty() {
            return Ok(false);
        }
        let vmm = dev.vmm().expect("a paged slab's device has vmm");
        let page = pm.page_size();
        let pieces = if self.config.backing == SlabBacking::Blocks {
            let start = n.addr + pad - slab.base;
            shaped(&runs, start, start + bytes, page)
        } else {
            runs.iter().map(|&(off, len)| (off, len, page)).collect()
        };
        let mut done: Vec<(u64, u64)> = Vec::new();
        for &(off, len, handle) in &pieces {
            if let Err(e) = vmm.map_handles(slab.base + off, len, handle) {
                for &(o, l) in &done {
                    let _ = vmm.unmap(slab.base + o, l);
                }
                return Err(e);
            }
            done.push((off, len));
        }
        let mut added = 0;
        for (off, len, handle) in pieces {
            pm.mark_mapped(off, len, handle);
            added += len;
        }
        self.acct.held(slab.pool, added);
        Ok(true)
    }

    /// Unmaps pages no live block touches, in every paged slab, until `want` bytes are given
    /// back; returns the bytes unmapped. Slabs left empty and unmapped drop their reservation.
    pub fn unmap_unused(&mut self, dev: &dyn Device, want: u64) -> u64 {
        let Some(vmm) = dev.vmm() else { return 0 };
        let any = self.pages.iter().flatten().any(|pm| pm.has_idle_handles());
        if want == 0 || !any || !self.quiesce(dev) {
            return 0;
        }
        let mut released = 0;
        for id in 0..self.pages.len() {
            if released >= want {
                break;
            }
            let Some(pm) = self.pages[id].as_mut() else { continue };
            if !pm.has_idle_handles() {
                continue;
            }
            let base = self.slabs[id as u32].base;
            let pool = self.slabs[id as u32].pool;
            for (off, len) in pm.take_unused_runs(want - released) {
                if let Err(e) = vmm.unmap(base + off, len) {
                    tracing::error!(ptr = base + off, error = %e, "unmap failed; pages forgotten");
                }
                released += len;
                self.acct.given_back(pool, len);
            }
        }
        // Empty slabs with nothing mapped cost nothing but address space: drop them.
        let unmapped_empty: Vec<u32> = self
            .empty
            .iter()
            .copied()
            .filter(|&id| self.pages[id as usize].as_ref().is_some_and(|pm| pm.mapped_bytes == 0))
            .collect();
        for id in unmapped_empty {
            let _ = self.release_slab(dev, id);
        }
        released
    }

    /// Idle bytes that can be given back now: empty slabs, and in paged slabs every mapped
    /// page no live block touches.
    pub fn releasable_bytes(&self) -> u64 {
        let paged: u64 = self.pages.iter().flatten().map(|pm| pm.unused_mapped_bytes).sum();
        let whole: u64 = self
            .empty
            .iter()
            .filter(|&&id| self.pages[id as usize].is_none())
            .map(|&id| self.slabs[id].size)
            .sum();
        paged + whole
    }

    /// Gives back idle memory until at most `keep` idle bytes remain, where it can: empty slabs
    /// first, then (with `unmap_pages`) unused pages of paged slabs.
    pub fn release_down_to(&mut self, dev: &dyn Device, keep: u64, unmap_pages: bool) -> u64 {
        let mut released = 0;
        while self.idle_bytes() > keep {
            let Some(&id) = self.empty.last() else { break };
            match self.release_slab(dev, id) {
                Some(r) => released += r,
                None => return released,
            }
        }
        if unmap_pages && self.idle_bytes() > keep {
            released += self.unmap_unused(dev, self.idle_bytes() - keep);
        }
        released
    }
}

/// Under `SlabBacking::Blocks`, how unmapped `runs` under a block at `start..end` are backed,
/// as `(offset, len, handle)`: the pages the block covers whole in one handle per run, the
/// pages it shares at its ends (with blocks that may outlive it) one handle each, so that a
/// handle held by a neighbour pins one page, not the block's.
fn shaped(runs: &[(u64, u64)], start: u64, end: u64, page: u64) -> Vec<(u64, u64, u64)> {
    let (inner_start, inner_end) = (round_up(start, page), end / page * page);
    let mut pieces = Vec::with_capacity(runs.len() + 2);
    for &(off, len) in runs {
        let run_end = off + len;
        let a = inner_start.clamp(off, run_end);
        let b = inner_end.clamp(a, run_end);
        for (o, l, whole) in [(off, a - off, false), (a, b - a, true), (b, run_end - b, false)] {
            if l > 0 {
                pieces.push((o, l, if whole { l } else { page }));
            }
        }
    }
    pieces
}
