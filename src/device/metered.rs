//! A device, metered: the allocator's view of its device, counting the driver calls that
//! allocator makes (allocations, frees, page maps and unmaps), and holding it to a cap on the
//! bytes it may hold (PyTorch's `set_per_process_memory_fraction`).

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
    pub(crate) allocs: AtomicU64,
    pub(crate) frees: AtomicU64,
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
        self.frees.fetch_add(1, Ordering::Relaxed);
        let r = self.inner.free(ptr);
        if r.is_ok() {
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

    /// Counts a mapping of `bytes` that succeeded as a driver allocation.
    fn mapped(&self, bytes: u64, r: Result<(), DeviceError>) -> Result<(), DeviceError> {
        if r.is_ok() {
            self.allocs.fetch_add(1, Ordering::Relaxed);
            self.held.fetch_add(bytes, Ordering::Relaxed);
        }
        r
    }
}

/// Mapping and unmapping pages are driver calls too: counted like allocations and frees.
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
        self.mapped(bytes, self.vm().map(ptr, bytes))
    }
    fn map_handles(&self, ptr: DevicePtr, bytes: u64, handle: u64) -> Result<(), DeviceError> {
        self.admit(bytes)?;
        self.mapped(bytes, self.vm().map_handles(ptr, bytes, handle))
    }
    fn unmap(&self, ptr: DevicePtr, bytes: u64) -> Result<(), DeviceError> {
        self.frees.fetch_add(1, Ordering::Relaxed);
        let r = self.vm().unmap(ptr, bytes);
        if r.is_ok() {
            self.held.fetch_sub(bytes, Ordering::Relaxed);
        }
        r
    }
    /// A second mapping of memory already held: counted as a call, holds no more bytes.
    fn map_alias(&self, ptr: DevicePtr, src: DevicePtr, bytes: u64) -> Result<(), DeviceError> {
        self.mapped(0, self.vm().map_alias(ptr, src, bytes))
    }
    fn unmap_alias(&self, ptr: DevicePtr, bytes: u64) -> Result<(), DeviceError> {
        self.frees.fetch_add(1, Ordering::Relaxed);
        self.vm().unmap_alias(ptr, bytes)
    }
    /// Memory already held, mapped elsewhere: counted as a call, holds no more bytes.
    fn move_handles(&self, ptr: DevicePtr, src: DevicePtr, bytes: u64) -> Result<(), DeviceError> {
        self.mapped(0, self.vm().move_handles(ptr, src, bytes))
    }
    fn quiesce(&self) -> Result<(), DeviceError> {
        self.vm().quiesce()
    }
}
