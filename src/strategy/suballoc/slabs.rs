//! The suballocator's slabs: taking one from the device (whole, or a reserved range backed page
//! by page), giving one back, the list of wholly free slabs kept for reuse, the empty slab a
//! smaller request leaves to the large block it was made for, and the switch to pages.

use super::{NIL, Node, PageMap, Slab, SlabBacking, Suballoc, USED};
use crate::device::Device;
use crate::error::DeviceError;
use crate::size::{ALIGNMENT, round_up};

impl Suballoc {
    /// Releases empty slabs until at most `keep` bytes of them remain: newest first, but the
    /// one with the fewest mapped bytes first where idle pages are moved rather than created
    /// anew (`moves_pages`). The bound counts an empty slab's address space, not its mapped
    /// pages; where pages move, an empty slab's mapped pages are a store the next request's
    /// slab takes pages from by a map, so the slab whose release gives the most address space
    /// for the fewest unmaps and releases goes first. Where a move does not pay, a kept slab's
    /// pages serve only requests placed in it, and the order stays newest first.
    ///
    /// Measured at 1.1x passthrough's minimum over 10 passes (`steady_eval`, the 17 workloads,
    /// default model): steady state 2130.8 -> 1848.9 ms a pass summed (`serving` 487.1 ->
    /// 238.2: its 2 GiB slab, emptied last at each pass's end, was released and created again
    /// every pass; `gpu-medium-ctx128-infer` 89.6 -> 63.3, `cpu-resnet18-train` 3.0 -> 1.4,
    /// no workload's dearer), warm-up 8852 -> 8661 ms (dearer: `gpu-medium-ctx512-infer` 197 -> 347,
    /// `training` 1055 -> 1176, `gpu-medium-ctx128-infer` 59 -> 85); at 1.2x steady state
    /// 1912 -> 1519 ms a pass, ten passes 24842 -> 21121 ms; at 1.05x 3957 -> 3938 ms a pass,
    /// but ten passes 44070 -> 44912 ms (`phase-change`'s warm-up 876 -> 1361). Under
    /// vmm-fast.toml and the H200's prices, where moves do not pay, nothing changed; nor did
    /// the robustness grid (7 / 3 / 4) or any figure from 1.5x peak live up. Fewest mapped
    /// first whatever the prices (vmm-fast at 1.1x: `training` 35 -> 161 ms a pass, 1553 ->
    /// 1679 summed: the kept slabs' pages were released by the headroom and created again).
    ///
    /// Measured before, against newest first (bundled `training` at 1.1x passthrough's minimum, 20 ms a
    /// pass over passes 6-10 of `compare --repeat 10`; `serving` at 1.2x peak live, 376 ms a
    /// pass, its 2 GiB slab released and created again every pass): the slab with the fewest
    /// mapped bytes first, 18 and 0.04 ms, but 229 ms in `training`'s third pass and 136 ms a
    /// pass under vmm-fast.toml where newest first pays 35; the lowest mapped share first,
    /// 213 and 269; the most unmapped bytes first, 167 and 269; the fewest-mapped slab that
    /// alone brings the empty slabs under `keep`, 0.0 on `serving` but 248 and 321 ms in
    /// `training`'s ninth and tenth passes. Near the minimum the steady state swings with any
    /// of these orders; none is better everywhere.
    pub fn release_empty_slabs(&mut self, dev: &dyn Device, keep: u64) -> u64 {
        if self.acct.empty() <= keep {
            return 0;
        }
        let mut released = 0;
        let reservoir = self.moves_pages(dev);
        while self.acct.empty() > keep {
            let pick = if reservoir {
                self.empty
                    .iter()
                    .copied()
                    .min_by_key(|&id| match self.pages.get(id as usize) {
                        Some(Some(pm)) => pm.mapped_bytes,
                        _ => self.slabs[id].size,
                    })
            } else {
                self.empty.last().copied()
            };
            let Some(slab_id) = pick else {
                break;
            };
            match self.release_slab(dev, slab_id) {
                Some(r) => released += r,
                None => break,
            }
        }
        released
    }

    /// From now on, back new slabs by pages (under `SlabBacking::Auto`; once on, it stays on):
    /// the empty slabs in larger handles go back now, the untouched pages of handles live
    /// blocks hold in part go back by a split, and slabs in larger handles go back as they
    /// empty, so that the layout is pages by the next cycle's peak. The controller turns it on
    /// where a cycle has run without the headroom free at its peak.
    #[cold]
    pub fn back_by_pages(&mut self, dev: &dyn Device) {
        if self.by_pages || self.config.backing != SlabBacking::Auto || self.paged_vmm(dev).is_none() {
            return;
        }
        self.by_pages = true;
        let large: Vec<u32> = self
            .empty
            .iter()
            .copied()
            .filter(|&id| self.in_larger_handles(id))
            .collect();
        let mut released = 0;
        for id in large {
            released += self.release_slab(dev, id).unwrap_or(0);
        }
        released += self.split_handles(dev, u64::MAX, false).released;
        tracing::info!(released, "slabs backed by pages from now on");
    }

    /// Slab `id` is mapped in handles some of which are larger than a page.
    pub(super) fn in_larger_handles(&self, id: u32) -> bool {
        self.pages[id as usize].as_ref().is_some_and(|pm| !pm.pages_only())
    }

    /// The handle a new page-backed slab of `size` bytes (a multiple of `page`) is mapped in,
    /// on a device of `page`.
    pub(super) fn handle_for(&self, page: u64, size: u64) -> u64 {
        match self.config.backing {
            // One handle for the whole slab: a create and a map, where pages cost one each per
            // 2 MiB. Out of memory it is split into pages (`split_held_handles`), so it strands
            // no more than pages would.
            SlabBacking::Auto if self.by_pages => page,
            SlabBacking::Auto => size.max(page),
            SlabBacking::LargeHandles if size / 8 >= page => (1u64 << (63 - (size / 8).leading_zeros())).max(page),
            // Handles are shaped to blocks as they are placed (`map_for`); the unit is the page.
            SlabBacking::Blocks | SlabBacking::LargeHandles | SlabBacking::Pages | SlabBacking::Whole => page,
        }
    }

    /// Whether best fit's choice, free node `idx`, is an empty slab made for one larger block
    /// that a request of `bytes` (under half of it) should leave for that block's kind: the
    /// workload's cycle has been seen (its large blocks come back), free device memory less the
    /// headroom is under the slab's size, so the larger block, back, could not get a new slab
    /// without a release, and the slab limit has room for the request's own slab twice over.
    /// The request then gets a new slab. Split instead, the slab stays pinned by the smaller
    /// blocks and the larger one takes a slab of its own again, giving back under the headroom
    /// to make room: `gpu-medium-ctx1024-infer` at 1.1x passthrough's minimum, four 256 MiB
    /// blocks a layer and 16 MiB ones living across layers, released and created 1.2 GiB of
    /// pages every pass (220 ms); now none (0.02 ms; vmm-fast.toml 49.3 -> 0.02). Measured on
    /// `steady_eval`'s 17 workloads (steady state a pass, summed): 1.1x 1889 -> 1586 ms (where
    /// PyTorch's allocator completes 58.8 -> 6.5; `cpu-gpt2-train` 53.3 -> 0.08,
    /// `gpu-medium-ctx256-infer` 45.7 -> 1.3; dearer `gpu-medium-ctx512-infer` 98.7 -> 115.3),
    /// vmm-fast.toml 1453 -> 1363; but 1.05x 3559 -> 3958 and 1.0x 5976 -> 6243 (`serving` and
    /// `phase-change`, where PyTorch's allocator fails; where it completes, 1.05x 686.8 ->
    /// 710.0); 1.5x peak live's warm-up 1756 -> 1757 ms, 2x and 4x, the robustness grid (7 / 3
    /// / 4), `robustness_sweep` and the known failure at the exact minimum the same. From the
    /// first request instead of the cycle, a co-tenant taking the headroom mid-run was refused
    /// (`gpu-medium-ctx1024-infer` at 1.5x passthrough's minimum: the new slab took the slab
    /// limit whole beside the idle one); a new slab of the request's size or of half the slab
    /// limit lost the gain (233-248 ms a pass). Tested against the slab limit instead of free
    /// memory (the share cap then counts too), `gpu-medium-ctx128-infer` at 1.5x peak live
    /// warmed up in 78 ms instead of 10, its small blocks' new slabs given back over the cap
    /// and made again; without either test, 2x and 4x warm-ups grew by half and the grid failed
    /// 19 runs at the exact minimum. Cost on the hot path: one compare of two fields (free
    /// memory less the headroom against the largest such slab).
    #[inline]
    pub(super) fn kept_for_its_block(&self, dev: &dyn Device, idx: u32, bytes: u64) -> bool {
        self.device_room < self.largest_own && self.kept_cold(dev, idx, bytes)
    }

    #[cold]
    #[inline(never)]
    fn kept_cold(&self, dev: &dyn Device, idx: u32, bytes: u64) -> bool {
        let n = &self.nodes[idx];
        let slab = &self.slabs[n.slab];
        let granule = dev.granularity().max(ALIGNMENT);
        slab.own
            && slab.used == 0
            && n.size == slab.size
            && slab.size > self.device_room
            && bytes.saturating_mul(2) < slab.size
            && self.slab_limit / 2 >= round_up(bytes, granule)
    }

    #[cold]
    pub(super) fn new_slab(&mut self, dev: &dyn Device, bytes: u64, pool: u8) -> Result<u32, DeviceError> {
        let granule = dev.granularity().max(ALIGNMENT);
        let exact = round_up(bytes, granule);
        let limit = exact.max(self.slab_limit / granule * granule);
        let max_slab = self.config.max_slab.max(self.config.min_slab);
        // Larger growth where there is room was measured and not kept (`steady_eval`, 17
        // workloads; warm-up sums at 2x / 4x peak live 213.6 / 207.6 ms today):
        // - `loose_growth = 1`: 645.1 / 111.4 (vmm-fast.toml 4x misses 2 -> 0), 4 failed
        //   requests at passthrough's exact minimum, robustness grid 13 / 2 / 5 (7 / 3 / 4);
        // - growth 1 while the memory expected free at the peak is at least the peak: 641.9 /
        //   111.4 (`small-churn` 2.4 -> 492.9 at 2x; the others 211 -> 149), grid 12 / 2 / 6;
        // - growth 1 while the new slab is within the strand budget: 709.3 / 117.0, grid 13 / 5 /
        //   6; within a quarter of it: 165.9 / 141.6, but `training` at 1.1x passthrough's
        //   minimum 0.02 -> 15.1 ms a pass, `gpu-medium-ctx1024-infer`'s 1.5x warm-up 9.6 ->
        //   39.7, grid 14 / 3 / 4 and `robustness_sweep`'s windows at the minimum 142 -> 169.
        // Early in a run the peak so far is small, so "room" holds at passthrough's exact
        // minimum too, and the larger slabs made then fail there later.
        let preferred = if pool == 0 {
            let basis = if self.config.segregate {
                self.acct.pool_reserved(0)
            } else {
                self.acct.reserved()
            };
            let target = (basis as f64 * self.config.growth) as u64;
            let grown = if target == 0 {
                0
            } else {
                1u64 << (63 - target.leading_zeros())
            };
            grown.clamp(self.config.min_slab, max_slab)
        } else {
            // A whole number of this pool's requests, growing with what the pool holds.
            let target = (self.acct.pool_reserved(pool) as f64 * self.config.growth) as u64;
            let count = (target / bytes).max(1);
            round_up(count.saturating_mul(bytes), granule).min(max_slab)
        };
        let own = exact >= preferred.min(limit);
        if own {
            self.largest_own = self.largest_own.max(exact);
        }
        let preferred = preferred.min(limit).max(exact);
        // The handle the slab would be mapped in. A slab one handle backs whole is that handle,
        // not one driver allocation, even where an allocation costs less (the default model's
        // A100 handle prices: a 1 GiB slab 600 us as an allocation, 1116 as a handle; an H200's
        // 512 MiB 98 against 104): out of memory, a handle a few live blocks hold is split and
        // gives back the rest (`split_held_handles`), an allocation cannot be. Measured under
        // `auto` (`scripts/short-peak.sh`, each workload's peak given at 0.5 / 0.75 / 0.9 of
        // itself, at 1 / 1.05 / 1.1 / 1.2x passthrough's minimum, 17 workloads): 18 runs with
        // failed requests with allocations, 1 with handles; a second run given its profile's
        // peak (`scripts/second-run.py`) warms up in 323 / 223 / 210 ms summed at 1.5x / 2x /
        // 4x peak live against 227 / 113 / 95 with allocations (PyTorch's allocator 236 / 222 /
        // 221; vmm-fast.toml, where handles were chosen anyway, unchanged). Measured again
        // without a given peak: slabs as one driver allocation (where the prices seen say it
        // costs less than a handle) while they could strand whole within the guard's first
        // budget, at least half of it in size: 4x peak live's warm-up 208 -> 61 ms summed, but
        // 1.5x 1746 -> 3131, 2x 214 -> 989 and the robustness grid 7 / 3 / 4 -> 66 / 86 / 96;
        // while what is held stays within a quarter of the device, 4x 99, 2x 1087, grid 26 / 14
        // / 8. A first pass cannot tell a device with room from one its peak will fill.
        let paged = self.vmm_for_new(dev).map(|vmm| {
            let page = vmm.page_size();
            let whole = round_up(preferred, page);
            (vmm, page, whole, self.handle_for(page, whole))
        });
        let (base, size, counted, page_map) = match paged {
            Some((vmm, page, _, handle)) => {
                // Address space is free: reserve the whole slab, map what fits (all of it, or
                // just the request's handles on a tight device; nothing yet under
                // `SlabBacking::Blocks`).
                let mut handle = handle;
                let preferred = round_up(preferred, handle);
                let range = self.range_for(bytes, preferred, own, handle);
                let base = vmm.reserve(range)?;
                let (mut pm, mapped) = if self.config.backing == SlabBacking::Blocks {
                    // Nothing yet: the request's pages are mapped in handles shaped to it
                    // (`map_for`), the rest as later blocks land there.
                    (PageMap::new(preferred, page), 0)
                } else {
                    let mut mapped = vmm.map_handles(base, preferred, handle).map(|()| preferred);
                    if handle > page && mapped.as_ref().is_err_and(|e| e.is_out_of_memory()) {
                        // No room for one large handle: pages, as many as fit.
                        handle = page;
                        mapped = vmm.map_handles(base, preferred, handle).map(|()| preferred);
                    }
                    let exact = round_up(bytes, handle);
                    let mapped = match mapped {
                        Ok(m) => m,
                        Err(e) if e.is_out_of_memory() && preferred > exact => {
                            match vmm.map_handles(base, exact, handle) {
                                Ok(()) => exact,
                                Err(e) => {
                                    let _ = vmm.unreserve(base);
                                    return Err(e);
                                }
                            }
                        }
                        Err(e) => {
                            let _ = vmm.unreserve(base);
                            return Err(e);
                        }
                    };
                    (PageMap::new(range, page), mapped)
                };
                pm.mark_mapped(0, mapped, handle);
                (base, range, preferred, Some(pm))
            }
            None => match dev.allocate(preferred) {
                Ok(p) => (p, preferred, preferred, None),
                // Tight device: a slab just big enough may still fit.
                Err(e) if e.is_out_of_memory() && preferred > exact => (dev.allocate(exact)?, exact, exact, None),
                Err(e) => return Err(e),
            },
        };
        let held = page_map.as_ref().map(|pm| pm.mapped_bytes).unwrap_or(size);
        self.acct.held(pool, held);
        let slab = Slab {
            base,
            size,
            head_node: NIL,
            used: 0,
            pool,
            empty_pos: None,
            emptied_at: self.now,
            own,
            counted,
        };
        let slab_id = self.slabs.insert(slab);
        if self.pages.len() <= slab_id as usize {
            self.pages.resize(slab_id as usize + 1, None);
        }
        self.pages[slab_id as usize] = page_map;
        let idx = self.nodes.insert(Node {
            addr: base,
            size,
            slab: slab_id,
            phys_prev: NIL,
            phys_next: NIL,
            free_prev: NIL,
            free_next: NIL,
            list: USED,
        });
        self.slabs[slab_id].head_node = idx;
        let any = self.any_list(pool);
        self.push_free(idx, any);
        self.mark_empty(slab_id);
        Ok(idx)
    }

    /// The address range a new page-backed slab of `preferred` bytes (in `handle`s) made for a
    /// request of `bytes` reserves. Once slabs are backed by pages (`back_by_pages`), a slab
    /// made for one block larger than the growth rule's slab (`own`) reserves twice the block:
    /// address space costs nothing, only mapped pages hold memory, and a block that grows by
    /// reallocation (a new one a little larger, a copy, the old one freed) then finds address
    /// space beside its mapped pages instead of a new slab of its own. Otherwise the slab.
    /// Measured with [`fewest_unmapped`](Suballoc::fewest_unmapped) and same-slab donors
    /// (`recycle`), see there. Slow path (a new slab).
    fn range_for(&self, bytes: u64, preferred: u64, own: bool, handle: u64) -> u64 {
        if self.by_pages && own {
            round_up(bytes.saturating_mul(2), handle).max(preferred)
        } else {
            preferred
        }
    }

    /// Gives a wholly free slab back; None (the slab kept) when it has mapped pages and the
    /// device cannot [`quiesce`](Self::quiesce).
    pub(super) fn release_slab(&mut self, dev: &dyn Device, slab_id: u32) -> Option<u64> {
        let mapped = self.pages[slab_id as usize]
            .as_ref()
            .is_some_and(|pm| pm.mapped_bytes > 0);
        if mapped && !self.quiesce(dev) {
            return None;
        }
        let slab = self.slabs[slab_id];
        self.unmark_empty(slab_id);
        // The slab is wholly free; its free space may be split among streams' lists.
        let mut idx = slab.head_node;
        while idx != NIL {
            let next = self.nodes[idx].phys_next;
            self.remove_free(idx);
            self.nodes[idx].slab = NIL;
            self.nodes.release(idx);
            idx = next;
        }
        self.slabs.release(slab_id);
        let released = match self.pages[slab_id as usize].take() {
            Some(mut pm) => {
                let mapped = pm.mapped_bytes;
                let vmm = dev.vmm().expect("a paged slab's device has vmm");
                for (off, len) in pm.take_unused_runs(u64::MAX) {
                    if let Err(e) = vmm.unmap(slab.base + off, len) {
                        tracing::error!(ptr = slab.base + off, error = %e, "unmap failed; pages forgotten");
                    }
                }
                if let Err(e) = vmm.unreserve(slab.base) {
                    tracing::error!(ptr = slab.base, error = %e, "unreserve failed; range forgotten");
                }
                mapped
            }
            None => {
                if let Err(e) = dev.free(slab.base) {
                    tracing::error!(ptr = slab.base, error = %e, "driver free of a slab failed; slab forgotten");
                }
                slab.size
            }
        };
        self.acct.given_back(slab.pool, released);
        Some(released)
    }

    /// Makes sure no queued work can touch memory about to be unmapped (cuMemUnmap is not
    /// stream-ordered). Work on a block is queued before its free, so one synchronization serves
    /// every unmap until the next free: the operation count of the last free (`now`) marks it.
    /// False (logged) when the device cannot synchronize; the caller then unmaps nothing.
    pub(super) fn quiesce(&mut self, dev: &dyn Device) -> bool {
        self.wait_for_queued_work(dev, false)
    }

    /// [`quiesce`](Self::quiesce), or with `fresh` a new wait even where no free came since the
    /// last: work may be queued on live blocks at any time, and a split copies them. None of it
    /// while a capture may be under way (`frozen`).
    pub(super) fn wait_for_queued_work(&mut self, dev: &dyn Device, fresh: bool) -> bool {
        if self.frozen {
            return false;
        }
        if !fresh && self.quiesced_at == Some(self.now) {
            return true;
        }
        let Some(vmm) = dev.vmm() else { return true };
        match vmm.quiesce() {
            Ok(()) => {
                self.quiesced_at = Some(self.now);
                true
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot wait for queued work; pages stay mapped");
                false
            }
        }
    }

    pub(super) fn mark_empty(&mut self, slab_id: u32) {
        let slab = &mut self.slabs[slab_id];
        if slab.empty_pos.is_none() {
            slab.empty_pos = Some(self.empty.len() as u32);
            self.acct.emptied(slab.counted);
            self.empty.push(slab_id);
        }
    }

    pub(super) fn unmark_empty(&mut self, slab_id: u32) {
        let slab = &mut self.slabs[slab_id];
        if let Some(pos) = slab.empty_pos.take() {
            self.acct.filled(slab.counted);
            self.empty.swap_remove(pos as usize);
            if let Some(&moved) = self.empty.get(pos as usize) {
                self.slabs[moved].empty_pos = Some(pos);
            }
        }
    }
}
