//! Page-backed slabs of the suballocator: mapping the pages a new block needs, and giving back
//! pages no live block touches (the page bookkeeping itself is `strategy::pages`).

use std::ops::Range;

use crate::device::{Device, DevicePtr};
use crate::error::DeviceError;
use crate::size::round_up;
use crate::strategy::{Grant, StreamId};

use super::fewest::MANY_PAGES;
use super::{NIL, PageMap, SlabBacking, Suballoc, USED};

/// What [`Suballoc::map_for`] did for a placement.
pub(super) enum Mapping {
    /// Its pages were mapped already.
    Nothing,
    /// It mapped pages (driver calls: the placement is no hit).
    Made,
    /// Best fit chose a node whose pages the block would need mapped, more of them than the
    /// slab limit lets the driver create (free memory is at the headroom, or what is held at
    /// the share cap: idle pages would be moved there, each an unmap, a map and an access
    /// grant, or created past it), so a hole no larger than that node, whose pages are all
    /// mapped, served instead; it pins no more than the driver would consume for the block.
    /// Measured on the 17 workloads of
    /// `steady_eval` at 1.1x passthrough's minimum, summed where PyTorch's allocator completes:
    /// 200.7 -> 153.3 ms a pass (vmm-fast: 43.9 -> 35.8), robustness grid and
    /// `examples/robustness_sweep` unchanged. No larger: taking any mapped hole that fits (a big
    /// one split for a smaller block) cut it to 68.6 ms, but failed windows of the traces that
    /// complete today (`examples/robustness_sweep`: 3 more at passthrough's exact minimum, 2
    /// at 1.02x). Not under `SlabBacking::Auto`, where free memory decides how large the next
    /// slab's handles are (as for the page recycler in `map_pages`): memory left unmapped there
    /// went to large handles that stranded requests (robustness grid, failing runs from 1.03x:
    /// 125 -> 127; 1.1x: 429 -> 460 ms a pass). `blocks`: 243 -> 219 ms a pass, the grid the same.
    /// Once slabs are backed by pages, also a placement that lacks fewer pages than best
    /// fit's, where best fit's would move [`MANY_PAGES`] or more
    /// ([`fewest_unmapped`](Suballoc::fewest_unmapped)).
    Elsewhere(Grant),
}

/// What [`Suballoc::split_held_handles`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Split {
    /// Bytes given back.
    pub released: u64,
    /// Handles split into pages with nothing given back (their free bytes now at page ends).
    pub into_pages: u32,
}

impl Split {
    /// Anything changed: a retry may now succeed.
    pub fn any(&self) -> bool {
        self.released > 0 || self.into_pages > 0
    }
}

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

    /// Maps the pages a block of `bytes` placed `pad` bytes into free node `idx` needs. Fails
    /// (changing nothing) when the device cannot back them. With `elsewhere` (the requester's
    /// stream; best fit chose `idx` among held nodes, not a new slab), a block that needs more
    /// pages than the headroom has room for is served from a mapped hole instead where one
    /// fits ([`Mapping::Elsewhere`]). Cost: one compare where the slab is wholly mapped (the
    /// common case); the rest is cold.
    #[inline]
    pub(super) fn map_for(
        &mut self,
        dev: &dyn Device,
        idx: u32,
        pad: u64,
        bytes: u64,
        elsewhere: Option<StreamId>,
    ) -> Result<Mapping, DeviceError> {
        match self.pages.get(self.nodes[idx].slab as usize) {
            Some(Some(pm)) if !pm.all_mapped() => self.map_unmapped(dev, idx, pad, bytes, elsewhere),
            _ => Ok(Mapping::Nothing),
        }
    }

    #[cold]
    #[inline(never)]
    fn map_unmapped(
        &mut self,
        dev: &dyn Device,
        idx: u32,
        pad: u64,
        bytes: u64,
        elsewhere: Option<StreamId>,
    ) -> Result<Mapping, DeviceError> {
        let n = self.nodes[idx];
        let slab = self.slabs[n.slab];
        let Some(Some(pm)) = self.pages.get(n.slab as usize) else {
            return Ok(Mapping::Nothing);
        };
        let (runs, page) = (pm.unmapped_runs(n.addr + pad - slab.base, bytes), pm.page_size());
        if runs.is_empty() {
            return Ok(Mapping::Nothing);
        }
        let pages: u64 = runs.iter().map(|&(_, len)| len / page).sum();
        if let Some(stream) = elsewhere
            && self.config.backing != SlabBacking::Auto
            && self.pages_past_room(pages, page) > 0
            && let Some(g) = self.allocate_existing(dev, bytes, stream, true, n.size)
        {
            return Ok(Mapping::Elsewhere(g));
        }
        if let Some(stream) = elsewhere
            && self.by_pages
            && pages >= MANY_PAGES
            && self.pages_past_room(pages, page) > 0
            && let Some((j, at, fewer)) = self.fewest_unmapped(bytes, stream)
            && fewer < pages
        {
            return self.map_elsewhere(dev, j, at, bytes).map(Mapping::Elsewhere);
        }
        let pm = self.pages[n.slab as usize].as_mut().expect("checked above");
        let vmm = dev.vmm().expect("a paged slab's device has vmm");
        let pieces = if self.config.backing == SlabBacking::Blocks {
            let start = n.addr + pad - slab.base;
            shaped(&runs, start, start + bytes, page)
        } else {
            runs.iter().map(|&(off, len)| (off, len, page)).collect()
        };
        if pieces.iter().all(|&(_, _, handle)| handle == page) && pm.pages_only() {
            let start = n.addr + pad - slab.base;
            return self
                .map_pages(dev, n.slab, &runs, page, start..start + bytes)
                .map(|()| Mapping::Made);
        }
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
        Ok(Mapping::Made)
    }

    /// Of `pages` new pages of `page` bytes, how many the slab limit (free memory less the
    /// headroom, within the share cap; set by the controller) has no room for: the ones that
    /// would be moved from idle slabs, or created past it.
    fn pages_past_room(&self, pages: u64, page: u64) -> u64 {
        pages.saturating_sub(self.slab_limit / page)
    }

    /// Backs unmapped `runs` of slab `id` page by page. Idle pages of other slabs are moved
    /// there first when new ones would pass the controller's slab limit (free memory under the
    /// headroom, or what is held over the share cap), and after the device refuses new ones,
    /// where the prices say a move pays (a page recycled costs a map, an access grant and an
    /// unmap, against an unmap and a release where it was, then a create and a map here) or the
    /// engine knows the workload's peak ([`set_peak_known`](Suballoc::set_peak_known)). The rest
    /// are created. On failure the pages created here are unmapped; those moved stay, idle and
    /// mapped.
    fn map_pages(
        &mut self,
        dev: &dyn Device,
        id: u32,
        runs: &[(u64, u64)],
        page: u64,
        block: Range<u64>,
    ) -> Result<(), DeviceError> {
        let vmm = dev.vmm().expect("a paged slab's device has vmm");
        let slab = self.slabs[id];
        let mut todo: Vec<u64> = runs
            .iter()
            .flat_map(|&(off, len)| (off..off + len).step_by(page as usize))
            .collect();
        let past = self.pages_past_room(todo.len() as u64, page) as usize;
        if past > 0 && self.moves_pages(dev) {
            let room = todo.len() - past;
            let moved = self.recycle(dev, id, &todo[room..], page, block.clone());
            todo.drain(room..room + moved);
        }
        let mut done: Vec<(u64, u64)> = Vec::new();
        let mut result = Ok(());
        let mut i = 0;
        for (off, len) in crate::device::page_runs(&todo, page).map(|(j, len)| (todo[j], len)) {
            if let Err(e) = vmm.map_handles(slab.base + off, len, page) {
                result = Err(e);
                break;
            }
            done.push((off, len));
            i += (len / page) as usize;
        }
        if let Err(e) = result {
            let moved = if e.is_out_of_memory() && self.moves_pages(dev) {
                self.recycle(dev, id, &todo[i..], page, block)
            } else {
                0
            };
            if i + moved < todo.len() {
                for &(o, l) in &done {
                    let _ = vmm.unmap(slab.base + o, l);
                }
                return Err(e);
            }
        }
        let pm = self.pages[id as usize].as_mut().expect("a paged slab");
        let mut added = 0;
        for (off, len) in done {
            pm.mark_mapped(off, len, page);
            added += len;
        }
        self.acct.held(slab.pool, added);
        Ok(())
    }

    /// Whether idle pages are moved where new ones are needed rather than created anew: the
    /// prices the device has shown say a move pays, or the engine knows the workload's peak;
    /// only with slabs backed by pages, or by one handle each (`Auto`), whose handles split
    /// into pages become donors (`PageMap::pages_only`). Under `LargeHandles` free memory
    /// decided how large the next slab's handles were, and pages moved instead of created kept
    /// it high enough to take large handles that then stranded requests (robustness grid,
    /// failing runs: 53 / 39 / 28 without moves, 54 / 44 / 53 with them; `auto` too while it
    /// sized handles by free memory). Under `Auto` now (`steady_eval`, 17 workloads): the grid
    /// the same (7 / 3 / 4), 1.1x passthrough's minimum 235.7 -> 229.0 ms a pass summed, 1.5x
    /// and up the same. Slow path (reads the device's statistics).
    pub(super) fn moves_pages(&self, dev: &dyn Device) -> bool {
        matches!(self.config.backing, SlabBacking::Pages | SlabBacking::Auto)
            && (self.peak_known || dev.stats().ops.recycling_pays())
    }

    /// Moves idle pages of other paged slabs (every handle a page) onto `targets` (unmapped
    /// page offsets in slab `id`, in order) until they run out; returns how many targets were
    /// filled, each marked mapped. One quiesce first: the pages moved may hold freed blocks
    /// whose work is still queued. Cold.
    ///
    /// Once slabs are backed by pages, the target slab donates too, outside `block` (the
    /// offsets of the block being mapped, whose idle pages it is about to use): with slabs of
    /// twice their block ([`range_for`](Suballoc::range_for)) one slab often holds both a
    /// grown block's missing pages and its predecessor's idle ones, and with other slabs as
    /// the only donors those pages were given back and created instead. What the three rules
    /// measured together is at [`fewest_unmapped`](Suballoc::fewest_unmapped). Measured
    /// before, and not kept: slabs spanning the workload's peak footprint instead of twice
    /// their block failed 2 requests at passthrough's exact minimum (`gpu-medium-ctx128-train`:
    /// a 39 MiB request, 36 MiB free, the rest idle inside pages live blocks share); placement
    /// by the fewest missing pages for any block, 1 at 1.05x (`gpu-small-fwd-fp32`).
    #[cold]
    fn recycle(&mut self, dev: &dyn Device, id: u32, targets: &[u64], page: u64, block: Range<u64>) -> usize {
        let Some(vmm) = dev.vmm() else { return 0 };
        // Once slabs are backed by pages, the target slab donates too (its pages outside the
        // block): with slabs of twice their block (`range_for`), a grown block's pages are
        // often idle in its own slab.
        let same = self.by_pages;
        let donor = |i: usize, pm: &PageMap| (same || i != id as usize) && pm.pages_only();
        let any = self
            .pages
            .iter()
            .enumerate()
            .any(|(i, pm)| pm.as_ref().is_some_and(|pm| pm.has_idle_handles() && donor(i, pm)));
        if targets.is_empty() || !any || !self.quiesce(dev) {
            return 0;
        }
        // Each donor page with the run it was taken in: a move stays within one run (one
        // slab's reservation), even where two slabs' reservations happen to adjoin. Pages of
        // one run are adjacent, so the run alone says whether donors continue.
        let donors: Vec<(DevicePtr, usize)> = self
            .take_idle(targets.len() as u64 * page, donor, Some((id, block)))
            .into_iter()
            .enumerate()
            .flat_map(|(run, (ptr, len))| (ptr..ptr + len).step_by(page as usize).map(move |p| (p, run)))
            .collect();
        let slab = self.slabs[id];
        let mut filled = 0;
        let n = donors.len().min(targets.len());
        while filled < n {
            let mut j = filled + 1;
            while j < n && donors[j].1 == donors[j - 1].1 && targets[j] == targets[j - 1] + page {
                j += 1;
            }
            let len = (j - filled) as u64 * page;
            if let Err(e) = vmm.move_handles(slab.base + targets[filled], donors[filled].0, len) {
                tracing::warn!(error = %e, "moving idle pages failed; they go back instead");
                break;
            }
            let pm = self.pages[id as usize].as_mut().expect("a paged slab");
            pm.mark_mapped(targets[filled], len, page);
            self.acct.held(slab.pool, len);
            filled = j;
        }
        // Pages taken but not moved (the last run may pass what was asked, or a move failed):
        // given back, as `unmap_unused` would.
        for &(d, _) in &donors[filled..] {
            if let Err(e) = vmm.unmap(d, page) {
                tracing::error!(ptr = d, error = %e, "unmap failed; page forgotten");
            }
        }
        self.drop_unmapped_empty(dev, Some(id));
        filled
    }

    /// Out-of-memory's last resort: splits handles of more than a page that live blocks touch
    /// only in part ([`VirtualMemory::split_handle`](crate::device::VirtualMemory::split_handle)):
    /// the pages those blocks touch are copied into pages of their own, at the same addresses,
    /// and the rest of each handle goes back. Handles with the fewest live pages first (the
    /// fewest copies, and the least memory the split needs while it runs), until `want` bytes
    /// are back. Where that falls short, handles every page of which live blocks touch but with
    /// free bytes inside are split into pages too, the most free bytes first, until those free
    /// bytes cover what is still wanted: nothing goes back, but a splice
    /// ([`allocate_spliced`](Self::allocate_spliced)) finds their free bytes at page ends, as
    /// it would in slabs backed by pages. Waits for all queued work first, every time: the
    /// pages copied hold live blocks.
    ///
    /// Measured with slabs backed by one handle each (`SlabBacking::Auto`), robustness grid
    /// (failing runs at the exact minimum / 1.01-1.02x / from 1.03x): 7 / 3 / 4 with these
    /// splits into pages, as with pages, against 19 / 3 / 4 without (`gpu-medium-ctx128-train`
    /// [25%..75%] at the exact minimum: a 16 MiB request, 14 MiB free and 4.6 MiB free inside
    /// handles live blocks touch on every page; as pages, a splice serves it).
    #[cold]
    pub fn split_held_handles(&mut self, dev: &dyn Device, want: u64) -> Split {
        self.split_handles(dev, want, true)
    }

    /// [`split_held_handles`](Self::split_held_handles), with (`into_pages`) or without the
    /// splits into pages that give nothing back.
    #[cold]
    pub(super) fn split_handles(&mut self, dev: &dyn Device, want: u64, into_pages: bool) -> Split {
        let mut done = Split::default();
        let Some(vmm) = self.paged_vmm(dev) else { return done };
        let page = vmm.page_size();
        // (slab, first page, pages, order): live pages for handles to give back from, free
        // bytes (reversed) for handles to split into pages.
        let mut partly: Vec<(u32, usize, usize, u64)> = Vec::new();
        let mut full: Vec<(u32, usize, usize, u64)> = Vec::new();
        for head in self.slabs_heads() {
            let id = self.nodes[head].slab;
            let Some(Some(pm)) = self.pages.get(id as usize) else {
                continue;
            };
            if pm.pages_only() {
                continue;
            }
            let base = self.slabs[id].base;
            // (No handle split here is one a splice maps again: splices take page ends only.)
            partly.extend(
                pm.partly_live_handles()
                    .into_iter()
                    .map(|(f, n, live)| (id, f, n, live as u64)),
            );
            let mut i = if into_pages { head } else { NIL };
            while i != NIL {
                let n = self.nodes[i];
                if n.list != USED {
                    for (f, pages) in pm.fully_live_handles_over(n.addr - base, n.size) {
                        match full.iter_mut().find(|e| e.0 == id && e.1 == f) {
                            Some(e) => e.3 += n.size,
                            None => full.push((id, f, pages, n.size)),
                        }
                    }
                }
                i = n.phys_next;
            }
        }
        if (partly.is_empty() && full.is_empty()) || !self.wait_for_queued_work(dev, true) {
            return done;
        }
        partly.sort_by_key(|&(_, _, n, live)| (live, std::cmp::Reverse(n)));
        full.sort_by_key(|&(_, _, _, free)| std::cmp::Reverse(free));
        let mut freed_inside = 0;
        let full_from = partly.len();
        for (k, (id, first, n, free)) in partly.into_iter().chain(full).enumerate() {
            if done.released >= want || (k >= full_from && done.released + freed_inside >= want) {
                break;
            }
            let slab = self.slabs[id];
            let pm = self.pages[id as usize].as_mut().expect("a paged slab");
            let keep = pm.live_pages_of(first);
            let at = slab.base + first as u64 * page;
            match vmm.split_handle(at, n as u64 * page, &keep) {
                Ok(()) => {
                    let back = pm.split(first);
                    self.acct.given_back(slab.pool, back);
                    done.released += back;
                    if k >= full_from {
                        done.into_pages += 1;
                        freed_inside += free;
                    }
                    tracing::info!(
                        ptr = at,
                        bytes = n as u64 * page,
                        kept = keep.len(),
                        "split a held handle"
                    );
                }
                Err(e) if e.is_out_of_memory() => break,
                Err(e) => tracing::warn!(ptr = at, error = %e, "splitting a held handle failed"),
            }
        }
        done
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
        for (ptr, len) in self.take_idle(want, |_, _| true, None) {
            if let Err(e) = vmm.unmap(ptr, len) {
                tracing::error!(ptr, error = %e, "unmap failed; pages forgotten");
            }
            released += len;
        }
        self.drop_unmapped_empty(dev, None);
        released
    }

    /// Takes whole idle handles of the paged slabs `from` accepts (by slab id), slab by slab,
    /// until `want` bytes are found (the last handle may pass it): marks them unmapped, counts
    /// them given back, and returns them as `(address, len)` for the caller to unmap or move.
    /// The caller has quiesced.
    /// `except` (slab, offsets): handles there are not taken (the block being mapped).
    fn take_idle(
        &mut self,
        want: u64,
        from: impl Fn(usize, &PageMap) -> bool,
        except: Option<(u32, Range<u64>)>,
    ) -> Vec<(DevicePtr, u64)> {
        let mut taken = Vec::new();
        let mut bytes = 0;
        for id in 0..self.pages.len() {
            if bytes >= want {
                break;
            }
            let Some(pm) = self.pages[id].as_mut() else { continue };
            if !pm.has_idle_handles() || !from(id, pm) {
                continue;
            }
            let (base, pool) = (self.slabs[id as u32].base, self.slabs[id as u32].pool);
            let skip = match &except {
                Some((slab, range)) if *slab as usize == id => range.clone(),
                _ => 0..0,
            };
            for (off, len) in pm.take_unused_runs_except(want - bytes, skip) {
                self.acct.given_back(pool, len);
                bytes += len;
                taken.push((base + off, len));
            }
        }
        taken
    }

    /// Empty slabs with nothing mapped cost nothing but address space: drops them, all but
    /// `keep` (the slab a block is being mapped into).
    fn drop_unmapped_empty(&mut self, dev: &dyn Device, keep: Option<u32>) {
        let unmapped_empty: Vec<u32> = self
            .empty
            .iter()
            .copied()
            .filter(|&id| Some(id) != keep)
            .filter(|&id| self.pages[id as usize].as_ref().is_some_and(|pm| pm.mapped_bytes == 0))
            .collect();
        for id in unmapped_empty {
            let _ = self.release_slab(dev, id);
        }
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
    /// first, then (with `unmap_pages`) unused pages of paged slabs, then, where the release is
    /// for other processes ([`set_split_for_others`](Self::set_split_for_others)), the
    /// untouched pages of handles live blocks hold in part, by splitting them.
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
        if unmap_pages && self.split_for_others && self.idle_bytes() > keep {
            released += self.split_handles(dev, self.idle_bytes() - keep, false).released;
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
