//! SimDevice's virtual memory: reservations, handles mapped (and mapped again, and moved) as
//! CUDA's cuMemAddressReserve / cuMemCreate / cuMemMap / cuMemUnmap do, each priced by the cost
//! model.

use super::{SimDevice, State};
use crate::device::{DevicePtr, VirtualMemory, page_runs, pages_to_keep};
use crate::error::DeviceError;
use crate::size::{align_up, round_up};

impl SimDevice {
    /// The reservation holding `ptr..ptr+bytes`, if any: (base, size, mapped).
    fn reservation_of(s: &State, ptr: DevicePtr, bytes: u64) -> Option<(DevicePtr, u64, u64)> {
        let (&base, &(size, mapped)) = s.reservations.range(..=ptr).next_back()?;
        (ptr + bytes <= base + size).then_some((base, size, mapped))
    }
}

impl SimDevice {
    /// Whether `ptr..ptr+bytes` is backed by memory: true outside reservations (driver
    /// allocations), and inside one only when every page under it is mapped. Tests check every
    /// live block with it.
    pub fn is_backed(&self, ptr: DevicePtr, bytes: u64) -> bool {
        let s = self.state.lock();
        if Self::reservation_of(&s, ptr, bytes.max(1)).is_none() {
            return true;
        }
        let page = self.granularity.large_granule;
        let first = ptr / page * page;
        (first..ptr + bytes)
            .step_by(page as usize)
            .all(|p| s.mapped_pages.contains_key(&p))
    }
}

impl SimDevice {
    /// The physical page behind the mapped page at `ptr` (named by the address it was first
    /// mapped at; a page mapped again by `map_alias` names the same one), or None when `ptr` is
    /// on no mapped page. Tests count memory by it.
    pub fn physical_page(&self, ptr: DevicePtr) -> Option<DevicePtr> {
        let page = self.granularity.large_granule;
        self.state.lock().mapped_pages.get(&(ptr / page * page)).copied()
    }
}

impl SimDevice {
    /// Writes `value` to the mapped page under `ptr` (a stand-in for its contents, for tests
    /// of what copies keep); false where no page is mapped there.
    pub fn write_stamp(&self, ptr: DevicePtr, value: u64) -> bool {
        let page = self.granularity.large_granule;
        let mut s = self.state.lock();
        let Some(&phys) = s.mapped_pages.get(&(ptr / page * page)) else {
            return false;
        };
        s.stamps.insert(phys, value);
        true
    }

    /// What [`write_stamp`](Self::write_stamp) last wrote to the physical page mapped under
    /// `ptr`, if that page holds it still.
    pub fn stamp(&self, ptr: DevicePtr) -> Option<u64> {
        let page = self.granularity.large_granule;
        let s = self.state.lock();
        let phys = s.mapped_pages.get(&(ptr / page * page))?;
        s.stamps.get(phys).copied()
    }
}

impl VirtualMemory for SimDevice {
    fn page_size(&self) -> u64 {
        self.granularity.large_granule
    }

    fn reserve(&self, bytes: u64) -> Result<DevicePtr, DeviceError> {
        let page = self.page_size();
        let mut s = self.state.lock();
        s.stats.ops.reserve.charge(1, self.cost.vmm.reserve_ns);
        let ptr = align_up(s.cursor, page);
        s.cursor = ptr + round_up(bytes, page);
        s.reservations.insert(ptr, (round_up(bytes, page), 0));
        Ok(ptr)
    }

    fn unreserve(&self, ptr: DevicePtr) -> Result<(), DeviceError> {
        let mut s = self.state.lock();
        match s.reservations.get(&ptr) {
            Some(&(_, 0)) => {
                s.reservations.remove(&ptr);
                s.stats.ops.unreserve.charge(1, self.cost.vmm.unreserve_ns);
                Ok(())
            }
            _ => Err(DeviceError::UnknownPointer { ptr }),
        }
    }

    /// As `CudaDevice` maps: a handle per page, each created and mapped, and one access
    /// grant for the run.
    fn map(&self, ptr: DevicePtr, bytes: u64) -> Result<(), DeviceError> {
        self.map_new(ptr, bytes, self.page_size())
    }

    fn map_handles(&self, ptr: DevicePtr, bytes: u64, handle: u64) -> Result<(), DeviceError> {
        self.map_new(ptr, bytes, handle)
    }

    fn unmap(&self, ptr: DevicePtr, bytes: u64) -> Result<(), DeviceError> {
        self.captures.check("unmap");
        self.drop_mappings(ptr, bytes, false)
    }

    fn handles_in(&self, ptr: DevicePtr, bytes: u64) -> u64 {
        let s = self.state.lock();
        let end = ptr.saturating_add(bytes);
        (s.handles.range(ptr..end).count() + s.alias_handles.range(ptr..end).count()) as u64
    }

    fn map_alias(&self, ptr: DevicePtr, src: DevicePtr, bytes: u64) -> Result<(), DeviceError> {
        let mut s = self.state.lock();
        let page = self.page_size();
        let Some((base, _, _)) = Self::reservation_of(&s, ptr, bytes) else {
            return Err(DeviceError::UnknownPointer { ptr });
        };
        let pages = (0..bytes).step_by(page as usize);
        // Whole handles only, as cuMemMap maps them (from offset 0).
        let handles = s.handles.range(src..src + bytes.max(1));
        let whole = s.handles.contains_key(&src) && handles.clone().all(|(&h, &len)| h + len <= src + bytes);
        if ptr % page != 0
            || src % page != 0
            || !whole
            || pages.clone().any(|o| s.mapped_pages.contains_key(&(ptr + o)))
            || pages.clone().any(|o| !s.mapped_pages.contains_key(&(src + o)))
        {
            return Err(DeviceError::UnknownPointer { ptr });
        }
        // A retained handle per handle (cuMemRetainAllocationHandle: no price of its own), each
        // mapped, and one access grant for the run, priced by the handles it covers.
        let second: Vec<(DevicePtr, u64)> = handles.map(|(&h, &len)| (ptr + (h - src), len)).collect();
        let access = self.cost.vmm.set_access_ns.total(second.iter().map(|&(_, len)| len));
        let n = second.len() as u64;
        self.admit(&mut s, bytes, 0)?;
        s.alias_handles.extend(second);
        s.stats.ops.map.charge(n, self.cost.vmm.map_ns);
        s.stats.ops.set_access.charge_total(1, access);
        for o in pages {
            let phys = s.mapped_pages[&(src + o)];
            *s.phys_refs.get_mut(&phys).expect("a mapped page has a physical page") += 1;
            s.mapped_pages.insert(ptr + o, phys);
        }
        s.reservations.get_mut(&base).expect("found above").1 += bytes;
        s.stats.driver_allocs += 1;
        Ok(())
    }

    fn unmap_alias(&self, ptr: DevicePtr, bytes: u64) -> Result<(), DeviceError> {
        self.captures.check("unmap_alias");
        self.drop_mappings(ptr, bytes, true)
    }

    /// Each handle mapped at its new place, one access grant for the run, each unmapped at its
    /// old one; the physical pages take the new addresses as their names.
    fn move_handles(&self, ptr: DevicePtr, src: DevicePtr, bytes: u64) -> Result<(), DeviceError> {
        self.captures.check("move_handles");
        let mut s = self.state.lock();
        let page = self.page_size();
        let (Some((dst_base, _, _)), Some((src_base, _, src_mapped))) = (
            Self::reservation_of(&s, ptr, bytes),
            Self::reservation_of(&s, src, bytes),
        ) else {
            return Err(DeviceError::UnknownPointer { ptr });
        };
        let end = src + bytes;
        let pages = (0..bytes).step_by(page as usize);
        if bytes == 0
            || ptr % page != 0
            || src % page != 0
            || src_mapped < bytes
            || Self::splits_a_mapping(&s.handles, src, end)
            || pages.clone().any(|o| s.mapped_pages.contains_key(&(ptr + o)))
            || !Self::first_mappings_only(&s, src, bytes, page)
        {
            return Err(DeviceError::UnknownPointer { ptr });
        }
        let starts: Vec<(DevicePtr, u64)> = s.handles.range(src..end).map(|(&h, &len)| (h, len)).collect();
        for &(h, len) in &starts {
            s.handles.remove(&h);
            s.handles.insert(ptr + (h - src), len);
        }
        for o in pages {
            s.mapped_pages.remove(&(src + o));
            s.phys_refs.remove(&(src + o));
            s.mapped_pages.insert(ptr + o, ptr + o);
            s.phys_refs.insert(ptr + o, 1);
            if let Some(v) = s.stamps.remove(&(src + o)) {
                s.stamps.insert(ptr + o, v);
            }
        }
        s.reservations.get_mut(&src_base).expect("found above").1 -= bytes;
        s.reservations.get_mut(&dst_base).expect("found above").1 += bytes;
        let (v, n) = (&self.cost.vmm, starts.len() as u64);
        let lens = || starts.iter().map(|&(_, len)| len);
        s.stats.ops.map.charge(n, v.map_ns);
        s.stats.ops.set_access.charge_total(1, v.set_access_ns.total(lens()));
        s.stats.ops.unmap.charge_total(n, v.unmap_ns.total(lens()));
        Ok(())
    }

    /// Priced as `CudaDevice` makes it (`cuda_split`): on the device where it has room for the
    /// pages kept (a scratch range, a page created, mapped and granted there for each, a copy
    /// each, a wait, the handle unmapped and released, each run of new pages moved into place,
    /// the range given back), else through host memory (a copy out, the handle unmapped and
    /// released, the pages created, mapped and granted in place, a copy back, a wait). Either way the
    /// kept pages keep their names and stamps: their contents are where they were.
    fn split_handle(&self, ptr: DevicePtr, bytes: u64, keep: &[u64]) -> Result<(), DeviceError> {
        self.captures.check("split_handle");
        let mut s = self.state.lock();
        let page = self.page_size();
        let Some((base, _, _)) = Self::reservation_of(&s, ptr, bytes) else {
            return Err(DeviceError::UnknownPointer { ptr });
        };
        if s.handles.get(&ptr) != Some(&bytes)
            || bytes <= page
            || !Self::first_mappings_only(&s, ptr, bytes, page)
            || !pages_to_keep(keep, page, bytes)
        {
            return Err(DeviceError::UnknownPointer { ptr });
        }
        let (v, k) = (&self.cost.vmm, keep.len() as u64);
        let runs = page_runs(keep, page).count() as u64;
        let ops = &mut s.stats.ops;
        if k > 0 {
            // The new pages are created first, in a scratch range; the first create is where
            // a device without room for them refuses.
            ops.reserve.charge(1, v.reserve_ns);
            ops.create.charge(1, v.create_ns.ns(page));
        }
        let room = k == 0 || self.admit(&mut s, k * page, k * page).is_ok();
        let ops = &mut s.stats.ops;
        let grant = |handles: u64| handles * v.set_access_ns.ns(page);
        if k > 0 && room {
            // On the device: created, mapped and granted in the scratch range, copied, waited
            // for; after the handle goes, each run moved into place; the range given back.
            ops.create.charge(k - 1, v.create_ns.ns(page));
            ops.map.charge(2 * k, v.map_ns);
            ops.set_access.charge_total(1 + runs, 2 * grant(k));
            ops.copy.charge(k, v.copy_ns.ns(page));
            ops.unmap_sync.charge(1, v.unmap_sync_ns);
            ops.unmap.charge(k, v.unmap_ns.ns(page));
            ops.unreserve.charge(1, v.unreserve_ns);
        } else if k > 0 {
            // Through host memory: copied out, and once the handle is gone, pages created,
            // mapped and granted where they were, and copied back.
            ops.unreserve.charge(1, v.unreserve_ns);
            ops.copy.charge(2 * k, v.copy_ns.ns(page));
            ops.create.charge(k, v.create_ns.ns(page));
            ops.map.charge(k, v.map_ns);
            ops.set_access.charge_total(runs, grant(k));
            ops.unmap_sync.charge(1, v.unmap_sync_ns);
        }
        ops.unmap.charge(1, v.unmap_ns.ns(bytes));
        ops.release.charge(1, v.release_ns.ns(bytes));
        s.handles.remove(&ptr);
        for &o in keep {
            s.handles.insert(ptr + o, page);
        }
        let mut freed = 0;
        for o in (0..bytes).step_by(page as usize) {
            if keep.binary_search(&o).is_err() {
                s.mapped_pages.remove(&(ptr + o));
                s.phys_refs.remove(&(ptr + o));
                s.stamps.remove(&(ptr + o));
                freed += page;
            }
        }
        s.used -= freed;
        s.reservations.get_mut(&base).expect("found above").1 -= freed;
        s.stats.driver_frees += 1;
        s.stats.allocated_bytes -= freed;
        Ok(())
    }

    /// Counted and charged (no work runs on the simulated device; the cost model prices the
    /// wait a real one would make).
    fn quiesce(&self) -> Result<(), DeviceError> {
        self.captures.check("quiesce");
        self.quiesces.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut s = self.state.lock();
        s.stats.ops.unmap_sync.charge(1, self.cost.vmm.unmap_sync_ns);
        Ok(())
    }
}

impl SimDevice {
    /// Every page of `ptr..ptr+bytes` is a first mapping with no second one: the page's own
    /// name, one reference (what a move or a split may take).
    fn first_mappings_only(s: &State, ptr: DevicePtr, bytes: u64, page: u64) -> bool {
        (0..bytes)
            .step_by(page as usize)
            .all(|o| s.mapped_pages.get(&(ptr + o)) == Some(&(ptr + o)) && s.phys_refs.get(&(ptr + o)) == Some(&1))
    }

    /// Backs `ptr..ptr+bytes` with new physical handles of `handle` bytes each (a page multiple
    /// dividing `bytes`): each created and mapped, and access granted once for the range.
    fn map_new(&self, ptr: DevicePtr, bytes: u64, handle: u64) -> Result<(), DeviceError> {
        let mut s = self.state.lock();
        let Some((base, _, _)) = Self::reservation_of(&s, ptr, bytes) else {
            return Err(DeviceError::UnknownPointer { ptr });
        };
        let page = self.page_size();
        if bytes == 0
            || ptr % page != 0
            || handle == 0
            || handle % page != 0
            || bytes % handle != 0
            || (ptr..ptr + bytes)
                .step_by(page as usize)
                .any(|p| s.mapped_pages.contains_key(&p))
        {
            // The driver refuses to map over a mapping, or off the granularity.
            return Err(DeviceError::UnknownPointer { ptr });
        }
        // Creating the first handle is where a real device runs out of memory.
        s.stats.ops.create.charge(1, self.cost.vmm.create_ns.ns(handle));
        self.admit(&mut s, bytes, bytes)?;
        let n = bytes / handle;
        s.stats.ops.create.charge(n - 1, self.cost.vmm.create_ns.ns(handle));
        s.stats.ops.map.charge(n, self.cost.vmm.map_ns);
        // One cuMemSetAccess for the run, whose time grows with the handles it covers (on an
        // H200, 25 calls over 3,600 pages took 127.8 ms: tuning/reports/gpu-nvidia-h200.md).
        s.stats
            .ops
            .set_access
            .charge(1, n * self.cost.vmm.set_access_ns.ns(handle));
        for p in (ptr..ptr + bytes).step_by(page as usize) {
            s.mapped_pages.insert(p, p);
            s.phys_refs.insert(p, 1);
        }
        for h in (ptr..ptr + bytes).step_by(handle as usize) {
            s.handles.insert(h, handle);
        }
        s.used += bytes;
        s.reservations.get_mut(&base).expect("found above").1 += bytes;
        s.stats.driver_allocs += 1;
        s.stats.allocated_bytes += bytes;
        Ok(())
    }

    /// Some mapping of `mappings` (start -> bytes: `handles` or `alias_handles`) lies partly
    /// inside `start..end` and partly outside it (cuMemUnmap and cuMemMap take whole handles
    /// only).
    fn splits_a_mapping(
        mappings: &std::collections::BTreeMap<DevicePtr, u64>,
        start: DevicePtr,
        end: DevicePtr,
    ) -> bool {
        mappings
            .range(..start)
            .next_back()
            .is_some_and(|(&h, &len)| h + len > start)
            || mappings.range(start..end).any(|(&h, &len)| h + len > end)
    }

    /// Unmaps `ptr..ptr+bytes`, which must be inside a reservation: first mappings (whole
    /// handles only, as cuMemUnmap takes them), or with `alias` second ones. A physical page's
    /// memory goes back with its last mapping.
    fn drop_mappings(&self, ptr: DevicePtr, bytes: u64, alias: bool) -> Result<(), DeviceError> {
        let mut s = self.state.lock();
        let Some((base, _, mapped)) = Self::reservation_of(&s, ptr, bytes) else {
            return Err(DeviceError::UnknownPointer { ptr });
        };
        let page = self.page_size();
        if mapped < bytes
            || (ptr..ptr + bytes)
                .step_by(page as usize)
                .any(|p| s.mapped_pages.get(&p).is_none_or(|&phys| (phys != p) != alias))
        {
            return Err(DeviceError::UnknownPointer { ptr });
        }
        // The mappings unmapped, whole only (as cuMemUnmap takes them), by the size of each
        // one's handle.
        let end = ptr + bytes;
        let map = if alias { &mut s.alias_handles } else { &mut s.handles };
        if Self::splits_a_mapping(map, ptr, end) {
            return Err(DeviceError::UnknownPointer { ptr });
        }
        let starts: Vec<(DevicePtr, u64)> = map.range(ptr..end).map(|(&h, &len)| (h, len)).collect();
        for (h, _) in &starts {
            map.remove(h);
        }
        let mut freed = 0;
        for p in (ptr..ptr + bytes).step_by(page as usize) {
            let phys = s.mapped_pages.remove(&p).expect("checked above");
            let refs = s.phys_refs.get_mut(&phys).expect("a mapped page has a physical page");
            *refs -= 1;
            let left = *refs;
            if left == 0 {
                s.phys_refs.remove(&phys);
                s.stamps.remove(&phys);
                freed += page;
            } else if !alias {
                // The first mapping goes while second ones keep the memory (the driver allows
                // it): the physical page takes a name no address has, so that a handle mapped
                // here later is another page, not this one. Rare: a scan of the mapped pages.
                let name = s.orphan_name;
                s.orphan_name += page;
                s.phys_refs.remove(&phys);
                s.phys_refs.insert(name, left);
                if let Some(v) = s.stamps.remove(&phys) {
                    s.stamps.insert(name, v);
                }
                for v in s.mapped_pages.values_mut().filter(|v| **v == phys) {
                    *v = name;
                }
            }
        }
        s.used -= freed;
        s.reservations.get_mut(&base).expect("found above").1 -= bytes;
        s.stats.driver_frees += 1;
        s.stats.allocated_bytes -= freed;
        let (v, n) = (&self.cost.vmm, starts.len() as u64);
        let lens = || starts.iter().map(|&(_, len)| len);
        s.stats.ops.unmap.charge_total(n, v.unmap_ns.total(lens()));
        s.stats.ops.release.charge_total(n, v.release_ns.total(lens()));
        Ok(())
    }
}
