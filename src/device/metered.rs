//! A device, metered: the allocator's view of its device, counting what that allocator asks of
//! the driver (physical allocations and frees, each handle of a mapping counted; the mapping
//! calls themselves), and holding it to a cap on the bytes it may hold (PyTorch's
//! `set_per_process_memory_fraction`).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use super::{Device, DevicePtr, DeviceStats, MemInfo, VirtualMemory};
use crate::error::DeviceError;
use crate::hash::FastMap;
use crate::size::ByteSize;

/// The device, metered: counts this allocator's driver calls and the bytes it holds (atomics,
/// and a map of driver allocations' sizes, on the slow path only: driver calls).
#[derive(Debug)]
pub(crate) struct Metered {
    pub(crate) inner: Arc<dyn Device>,
    /// Physical allocations: cuMemAlloc calls, and every handle a mapping created (cuMemCreate).
    allocs: AtomicU64,
    /// Physical frees: cuMemFree calls, and every handle an unmap gave back (cuMemRelease).
    frees: AtomicU64,
    /// Mapping calls: maps of new handles, moves, second mappings, and their unmaps (a run of
    /// handles mapped or unmapped at once is one).
    vmm_calls: AtomicU64,
    /// Bytes held from the driver: allocations plus mapped pages.
    held: AtomicU64,
    /// The size of each driver allocation (a free names only the pointer).
    sizes: Mutex<FastMap<DevicePtr, u64>>,
    /// Most bytes this allocator may hold (`u64::MAX`: no cap).
    cap: AtomicU64,
}

impl Metered {
    pub(crate) fn new(inner: Arc<dyn Device>) -> Self {
        Metered {
            inner,
            allocs: AtomicU64::new(0),
            frees: AtomicU64::new(0),
            vmm_calls: AtomicU64::new(0),
            held: AtomicU64::new(0),
            sizes: Mutex::new(FastMap::default()),
            cap: AtomicU64::new(u64::MAX),
        }
    }

    /// Sets (or, with None, lifts) the cap on the bytes held. Lowering it under what is held
    /// gives nothing back by itself: the next request past it releases idle memory and retries,
    /// as any out-of-memory does.
    pub(crate) fn set_cap(&self, cap: Option<u64>) {
        self.cap.store(cap.unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    /// Writes the counts (physical allocations and frees, mapping calls) into `stats`.
    pub(crate) fn counts_into(&self, stats: &mut crate::Stats) {
        stats.driver_allocs = self.allocs.load(Ordering::Relaxed);
        stats.driver_frees = self.frees.load(Ordering::Relaxed);
        stats.vmm_calls = self.vmm_calls.load(Ordering::Relaxed);
    }

    /// The cap, if one is set.
    pub(crate) fn cap(&self) -> Option<u64> {
        Some(self.cap.load(Ordering::Relaxed)).filter(|&c| c != u64::MAX)
    }

    /// Refuses `bytes` more when they would take the bytes held past the cap.
    fn admit(&self, bytes: u64) -> Result<(), DeviceError> {
        let cap = self.cap.load(Ordering::Relaxed);
        let held = self.held.load(Ordering::Relaxed);
        if cap != u64::MAX && held.saturating_add(bytes) > cap {
            return Err(DeviceError::OverCap {
                requested: ByteSize(bytes),
                held: ByteSize(held),
                cap: ByteSize(cap),
            });
        }
        Ok(())
    }
}

impl Device for Metered {
    fn allocate(&self, bytes: u64) -> Result<DevicePtr, DeviceError> {
        self.admit(bytes)?;
        let r = self.inner.allocate(bytes);
        if let Ok(ptr) = r {
            self.allocs.fetch_add(1, Ordering::Relaxed);
            self.held.fetch_add(bytes, Ordering::Relaxed);
            self.sizes.lock().insert(ptr, bytes);
        }
        r
    }
    fn free(&self, ptr: DevicePtr) -> Result<(), DeviceError> {
        let r = self.inner.free(ptr);
        if r.is_ok() {
            self.frees.fetch_add(1, Ordering::Relaxed);
            if let Some(bytes) = self.sizes.lock().remove(&ptr) {
                self.held.fetch_sub(bytes, Ordering::Relaxed);
            }
        }
        r
    }
    /// Under a cap, free memory is what the cap leaves too, so the policy plans within it.
    fn mem_info(&self) -> Result<MemInfo, DeviceError> {
        let mut info = self.inner.mem_info()?;
        if let Some(cap) = self.cap() {
            info.free = info.free.min(cap.saturating_sub(self.held.load(Ordering::Relaxed)));
        }
        Ok(info)
    }
    fn alignment(&self) -> u64 {
        self.inner.alignment()
    }
    fn granularity(&self) -> u64 {
        self.inner.granularity()
    }
    fn footprint_model(&self) -> super::Granularity {
        self.inner.footprint_model()
    }
    fn vmm(&self) -> Option<&dyn VirtualMemory> {
        self.inner.vmm().map(|_| self as &dyn VirtualMemory)
    }
    fn stream_done(&self, stream: crate::strategy::StreamId, freed_at: u64, now: u64) -> bool {
        self.inner.stream_done(stream, freed_at, now)
    }
    fn stream_wait(&self, stream: crate::strategy::StreamId, freed_at: u64) -> Result<(), DeviceError> {
        self.inner.stream_wait(stream, freed_at)
    }
    fn stream_checkpoint(&self, stream: crate::strategy::StreamId, op: u64) {
        self.inner.stream_checkpoint(stream, op)
    }
    fn cuda_ordinal(&self) -> Option<i32> {
        self.inner.cuda_ordinal()
    }
    fn charge_pool_call(&self, call: super::PoolCall) {
        self.inner.charge_pool_call(call)
    }
    fn stats(&self) -> DeviceStats {
        self.inner.stats()
    }
    fn name(&self) -> String {
        self.inner.name()
    }
}

impl Metered {
    /// The inner device's virtual memory (callers reach this only through `vmm()`, which
    /// exists only when the inner device has it).
    fn vm(&self) -> &dyn VirtualMemory {
        self.inner.vmm().expect("vmm checked by the caller")
    }

    /// Counts a mapping of new handles of `handle` bytes, `bytes` in all, that succeeded: a
    /// mapping call, a physical allocation per handle, and the bytes held.
    fn mapped(&self, bytes: u64, handle: u64, r: Result<(), DeviceError>) -> Result<(), DeviceError> {
        self.vmm_calls.fetch_add(1, Ordering::Relaxed);
        if r.is_ok() {
            self.allocs.fetch_add(bytes.div_ceil(handle.max(1)), Ordering::Relaxed);
            self.held.fetch_add(bytes, Ordering::Relaxed);
        }
        r
    }

    /// Counts an unmapping call of `ptr..ptr+bytes` (first mappings, or with `alias` second
    /// ones): a mapping call, and when it succeeded a physical free per handle the device had
    /// mapped there (a reference given back, for a second mapping), and, for first mappings,
    /// the bytes no longer held.
    fn unmapped(&self, ptr: DevicePtr, bytes: u64, alias: bool) -> Result<(), DeviceError> {
        self.vmm_calls.fetch_add(1, Ordering::Relaxed);
        let handles = self.vm().handles_in(ptr, bytes);
        let r = if alias {
            self.vm().unmap_alias(ptr, bytes)
        } else {
            self.vm().unmap(ptr, bytes)
        };
        if r.is_ok() {
            self.frees.fetch_add(handles, Ordering::Relaxed);
            if !alias {
                self.held.fetch_sub(bytes, Ordering::Relaxed);
            }
        }
        r
    }
}

/// Mapping and unmapping are counted as mapping calls; the handles they create and give back
/// as physical allocations and frees; moves and second mappings create and give back none.
impl VirtualMemory for Metered {
    fn page_size(&self) -> u64 {
        self.inner.vmm().map(|v| v.page_size()).unwrap_or(0)
    }
    fn reserve(&self, bytes: u64) -> Result<DevicePtr, DeviceError> {
        self.vm().reserve(bytes)
    }
    fn unreserve(&self, ptr: DevicePtr) -> Result<(), DeviceError> {
        self.vm().unreserve(ptr)
    }
    fn map(&self, ptr: DevicePtr, bytes: u64) -> Result<(), DeviceError> {
        self.admit(bytes)?;
        let page = self.page_size();
        self.mapped(bytes, page, self.vm().map(ptr, bytes))
    }
    fn map_handles(&self, ptr: DevicePtr, bytes: u64, handle: u64) -> Result<(), DeviceError> {
        self.admit(bytes)?;
        self.mapped(bytes, handle, self.vm().map_handles(ptr, bytes, handle))
    }
    fn unmap(&self, ptr: DevicePtr, bytes: u64) -> Result<(), DeviceError> {
        self.unmapped(ptr, bytes, false)
    }
    fn handles_in(&self, ptr: DevicePtr, bytes: u64) -> u64 {
        self.vm().handles_in(ptr, bytes)
    }
    /// A second mapping of memory already held: a mapping call; no handle created (each is
    /// retained, cuMemRetainAllocationHandle), no bytes.
    fn map_alias(&self, ptr: DevicePtr, src: DevicePtr, bytes: u64) -> Result<(), DeviceError> {
        self.vmm_calls.fetch_add(1, Ordering::Relaxed);
        self.vm().map_alias(ptr, src, bytes)
    }
    /// Each retained handle's reference goes back (cuMemRelease): a physical free each, as
    /// the driver counts them, though the memory stays mapped where it was first.
    fn unmap_alias(&self, ptr: DevicePtr, bytes: u64) -> Result<(), DeviceError> {
        self.unmapped(ptr, bytes, true)
    }
    /// Handles already held, mapped elsewhere: a mapping call; no handle created or given back,
    /// no more bytes held.
    fn move_handles(&self, ptr: DevicePtr, src: DevicePtr, bytes: u64) -> Result<(), DeviceError> {
        self.vmm_calls.fetch_add(1, Ordering::Relaxed);
        self.vm().move_handles(ptr, src, bytes)
    }
    /// Pages created for those kept and the handle given back: a mapping call, a physical
    /// allocation per page kept, a free for the handle, and the pages not kept no longer held.
    /// Not held to the cap: the new pages replace memory already held, and what is held after
    /// is less than before.
    fn split_handle(&self, ptr: DevicePtr, bytes: u64, keep: &[u64]) -> Result<(), DeviceError> {
        self.vmm_calls.fetch_add(1, Ordering::Relaxed);
        let kept = keep.len() as u64 * self.page_size();
        let r = self.vm().split_handle(ptr, bytes, keep);
        if r.is_ok() {
            self.allocs.fetch_add(keep.len() as u64, Ordering::Relaxed);
            self.frees.fetch_add(1, Ordering::Relaxed);
            self.held.fetch_sub(bytes - kept, Ordering::Relaxed);
        }
        r
    }
    fn quiesce(&self) -> Result<(), DeviceError> {
        self.vm().quiesce()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::SimDevice;

    const P: u64 = 2 << 20;
    const PAGES: usize = 32;

    /// A handle the test mapped: its first page, its pages, and whether it is a second mapping.
    #[derive(Clone, Copy, Debug)]
    struct Handle {
        page: usize,
        pages: usize,
        alias: bool,
    }

    /// Some second mapping may be of `x` (one of its size elsewhere): the device refuses to
    /// move or split a first mapping with a second one on it, or to map it a second time again.
    fn aliased(handles: &[Handle], x: &Handle) -> bool {
        handles
            .iter()
            .any(|a| a.alias && a.pages == x.pages && a.page != x.page)
    }

    fn free_run(used: &[bool; PAGES], at: usize, pages: usize) -> bool {
        at + pages <= PAGES && used[at..at + pages].iter().all(|u| !u)
    }

    proptest::proptest! {
        /// Maps of runs of handles, unmaps of whole handles (a run in part, or several runs
        /// at once), moves, second mappings and splits, in any order, some refused for want of
        /// memory: the metered counts stay the device's physical allocations (less those it
        /// refused) and frees, and a mapping call is counted for each call made.
        #[test]
        fn counts_follow_the_handles_as_the_device_counts_them(
            ops in proptest::collection::vec((0u8..6, 0usize..PAGES, 1usize..4, 1usize..4), 1..200)
        ) {
            // Fewer pages of memory than of address space: some maps are refused.
            let sim: Arc<dyn Device> = Arc::new(SimDevice::new(24 * P));
            let m = Metered::new(sim.clone());
            let vmm: &dyn VirtualMemory = m.vmm().expect("SimDevice has vmm");
            let base = vmm.reserve(PAGES as u64 * P).unwrap();
            let mut used = [false; PAGES];
            let mut handles: Vec<Handle> = Vec::new();
            let mut calls = 0;
            for (op, at, n, h) in ops {
                let addr = |page: usize| base + page as u64 * P;
                match op {
                    0 if free_run(&used, at, n * h) => {
                        calls += 1;
                        if vmm.map_handles(addr(at), (n * h) as u64 * P, h as u64 * P).is_ok() {
                            for i in 0..n {
                                handles.push(Handle { page: at + i * h, pages: h, alias: false });
                            }
                            used[at..at + n * h].iter_mut().for_each(|u| *u = true);
                        }
                    }
                    4 if !handles.is_empty() => {
                        // A first mapping of more than a page, with no second one, split:
                        // every `n`th of its pages kept (none where `n` passes it).
                        let i = at % handles.len();
                        let x = handles[i];
                        if x.alias || aliased(&handles, &x) || x.pages < 2 {
                            continue;
                        }
                        let keep: Vec<u64> = (0..x.pages).step_by(n).filter(|_| n < 3).map(|k| k as u64 * P).collect();
                        calls += 1;
                        if vmm.split_handle(addr(x.page), x.pages as u64 * P, &keep).is_ok() {
                            handles.remove(i);
                            for k in 0..x.pages {
                                let kept = keep.contains(&(k as u64 * P));
                                used[x.page + k] = kept;
                                if kept {
                                    handles.push(Handle { page: x.page + k, pages: 1, alias: false });
                                }
                            }
                        }
                    }
                    1..=3 if !handles.is_empty() => {
                        handles.sort_by_key(|x| x.page);
                        let i = at % handles.len();
                        let first = handles[i];
                        // An alias is only unmapped as an alias; a first mapping with a second
                        // one on it is neither moved nor aliased again (the device refuses).
                        match op {
                            1 => {
                                // Whole handles from `first` on, adjacent and of one kind.
                                let mut j = i + 1;
                                while j < handles.len() && j - i < n
                                    && handles[j].alias == first.alias
                                    && handles[j].page == handles[j - 1].page + handles[j - 1].pages
                                {
                                    j += 1;
                                }
                                let pages: usize = handles[i..j].iter().map(|x| x.pages).sum();
                                let (a, len) = (addr(first.page), pages as u64 * P);
                                calls += 1;
                                let r = if first.alias { vmm.unmap_alias(a, len) } else { vmm.unmap(a, len) };
                                if r.is_ok() {
                                    used[first.page..first.page + pages].iter_mut().for_each(|u| *u = false);
                                    handles.drain(i..j);
                                }
                            }
                            _ if !first.alias && !aliased(&handles, &first) => {
                                let to = (0..PAGES).map(|k| (at + k) % PAGES).find(|&t| free_run(&used, t, first.pages));
                                if let Some(t) = to {
                                    let (a, len) = (addr(t), first.pages as u64 * P);
                                    calls += 1;
                                    let ok = if op == 2 {
                                        vmm.move_handles(a, addr(first.page), len).is_ok()
                                    } else {
                                        vmm.map_alias(a, addr(first.page), len).is_ok()
                                    };
                                    if ok {
                                        used[t..t + first.pages].iter_mut().for_each(|u| *u = true);
                                        if op == 2 {
                                            used[first.page..first.page + first.pages].iter_mut().for_each(|u| *u = false);
                                            handles[i].page = t;
                                        } else {
                                            handles.push(Handle { page: t, pages: first.pages, alias: true });
                                        }
                                    }
                                }
                            }
                            _ => {}
                        }
                    }
                    _ => {}
                }
                let d = sim.stats();
                let (allocs, frees) = (m.allocs.load(Ordering::Relaxed), m.frees.load(Ordering::Relaxed));
                proptest::prop_assert_eq!(allocs + d.failed_allocs, d.ops.physical_allocs(), "{:?}", d.ops);
                proptest::prop_assert_eq!(frees, d.ops.physical_frees(), "{:?}", d.ops);
                proptest::prop_assert_eq!(m.vmm_calls.load(Ordering::Relaxed), calls);
            }
        }
    }
}
