//! A device, metered: the allocator's view of its device, counting the driver calls that
//! allocator makes (allocations, frees, page maps and unmaps).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::{Device, DevicePtr, DeviceStats, MemInfo, VirtualMemory};
use crate::error::DeviceError;

/// The device, metered: counts this allocator's driver calls (atomics on the slow path only).
#[derive(Debug)]
pub(crate) struct Metered {
    pub(crate) inner: Arc<dyn Device>,
    pub(crate) allocs: AtomicU64,
    pub(crate) frees: AtomicU64,
}

impl Device for Metered {
    fn allocate(&self, bytes: u64) -> Result<DevicePtr, DeviceError> {
        let r = self.inner.allocate(bytes);
        if r.is_ok() {
            self.allocs.fetch_add(1, Ordering::Relaxed);
        }
        r
    }
    fn free(&self, ptr: DevicePtr) -> Result<(), DeviceError> {
        self.frees.fetch_add(1, Ordering::Relaxed);
        self.inner.free(ptr)
    }
    fn mem_info(&self) -> Result<MemInfo, DeviceError> {
        self.inner.mem_info()
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

    /// Counts a mapping that succeeded as a driver allocation.
    fn mapped(&self, r: Result<(), DeviceError>) -> Result<(), DeviceError> {
        if r.is_ok() {
            self.allocs.fetch_add(1, Ordering::Relaxed);
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
        self.mapped(self.vm().map(ptr, bytes))
    }
    fn map_handles(&self, ptr: DevicePtr, bytes: u64, handle: u64) -> Result<(), DeviceError> {
        self.mapped(self.vm().map_handles(ptr, bytes, handle))
    }
    fn unmap(&self, ptr: DevicePtr, bytes: u64) -> Result<(), DeviceError> {
        self.frees.fetch_add(1, Ordering::Relaxed);
        self.vm().unmap(ptr, bytes)
    }
    fn map_alias(&self, ptr: DevicePtr, src: DevicePtr, bytes: u64) -> Result<(), DeviceError> {
        self.mapped(self.vm().map_alias(ptr, src, bytes))
    }
    fn unmap_alias(&self, ptr: DevicePtr, bytes: u64) -> Result<(), DeviceError> {
        self.frees.fetch_add(1, Ordering::Relaxed);
        self.vm().unmap_alias(ptr, bytes)
    }
    fn quiesce(&self) -> Result<(), DeviceError> {
        self.vm().quiesce()
    }
}
