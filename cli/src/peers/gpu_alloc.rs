//! gpu-alloc as a peer over adaptalloc's [`Device`], so that `compare`, `sweep` and the benches
//! measure them beside ours on the same traces, capacities and cost model (`peers` feature).
//!
//! - gpu-alloc 0.6 (the allocator of wgpu's Vulkan and Metal back ends, and of rafx): buddy and
//!   free-list suballocation in chunks, dedicated objects for large requests. Its device trait,
//!   `MemoryDevice`, is implemented here over a [`Device`]. Configuration: its documented
//!   starting point for desktop GPUs (`Config::i_am_prototyping`). On out-of-memory the wrapper
//!   does what a careful user does: `cleanup()` (frees its empty chunks) and retries once.
//!
//! cubecl-runtime (the memory management behind Burn) is a peer in `benches/peers.rs` only. In
//! 0.11 its pools are no longer public. In 0.5, `MemoryManagement` takes a custom
//! `ComputeStorage` (so it runs over SimDevice), but the storage's `alloc` cannot report
//! out-of-memory (it returns a handle, no error), `reserve` panics above its largest page, and
//! the binding that resolves a slice to an address is crate-private: it cannot replay a trace at
//! a capacity it may exceed, nor hand out addresses, so it is timed on reserve + release only.
//!
//! gpu-alloc's calls are `unsafe fn`: their contract is that one device instance serves one
//! allocator and its blocks, which this module keeps by owning both in one struct.

use std::borrow::Cow;
use std::cell::Cell;
use std::sync::Arc;

use gpu_alloc::{Config, GpuAllocator, MemoryBlock, Request, UsageFlags};
use gpu_alloc_types::{
    AllocationFlags, DeviceMapError, DeviceProperties, MappedMemoryRange, MemoryDevice, MemoryHeap,
    MemoryPropertyFlags, MemoryType, OutOfMemory,
};
use parking_lot::Mutex;

use crate::trace::{ReplayTarget, TargetCounters};
use adaptalloc::device::{Device, DevicePtr};
use adaptalloc::hash::FastMap;
use adaptalloc::stats::Counter;
use adaptalloc::strategy::StreamId;

/// One driver allocation, as gpu-alloc holds it.
#[derive(Debug)]
pub struct DriverBlock {
    ptr: DevicePtr,
    bytes: u64,
}

/// A [`Device`] as gpu-alloc's `MemoryDevice`: device-local memory that is never mapped.
struct AsMemoryDevice {
    dev: Arc<dyn Device>,
    allocs: Cell<u64>,
    frees: Cell<u64>,
    reserved: Cell<Counter>,
}

impl MemoryDevice<DriverBlock> for AsMemoryDevice {
    unsafe fn allocate_memory(
        &self,
        size: u64,
        _memory_type: u32,
        _flags: AllocationFlags,
    ) -> Result<DriverBlock, OutOfMemory> {
        let ptr = self.dev.allocate(size).map_err(|_| OutOfMemory::OutOfDeviceMemory)?;
        self.allocs.set(self.allocs.get() + 1);
        let mut r = self.reserved.get();
        r.add(size);
        self.reserved.set(r);
        Ok(DriverBlock { ptr, bytes: size })
    }

    unsafe fn deallocate_memory(&self, memory: DriverBlock) {
        if let Err(e) = self.dev.free(memory.ptr) {
            tracing::error!(ptr = memory.ptr, error = %e, "gpu-alloc peer: driver free failed");
        }
        self.frees.set(self.frees.get() + 1);
        let mut r = self.reserved.get();
        r.sub(memory.bytes);
        self.reserved.set(r);
    }

    unsafe fn map_memory(
        &self,
        _memory: &mut DriverBlock,
        _offset: u64,
        _size: u64,
    ) -> Result<std::ptr::NonNull<u8>, DeviceMapError> {
        // Device memory is not host-visible; requests never ask for mapping.
        Err(DeviceMapError::MapFailed)
    }

    unsafe fn unmap_memory(&self, _memory: &mut DriverBlock) {}

    unsafe fn invalidate_memory_ranges(
        &self,
        _ranges: &[MappedMemoryRange<'_, DriverBlock>],
    ) -> Result<(), OutOfMemory> {
        Ok(())
    }

    unsafe fn flush_memory_ranges(&self, _ranges: &[MappedMemoryRange<'_, DriverBlock>]) -> Result<(), OutOfMemory> {
        Ok(())
    }
}

struct Inner {
    alloc: GpuAllocator<DriverBlock>,
    device: AsMemoryDevice,
    live: FastMap<DevicePtr, (MemoryBlock<DriverBlock>, u64)>,
    live_bytes: Counter,
}

impl Inner {
    fn request(bytes: u64) -> Request {
        Request {
            size: bytes,
            align_mask: 255,
            usage: UsageFlags::FAST_DEVICE_ACCESS,
            memory_types: 1,
        }
    }
}

/// gpu-alloc over a [`Device`], as a [`ReplayTarget`].
pub struct GpuAllocPeer {
    // (Send + Sync: the Mutex makes the Cells inside safe to share.)
    inner: Mutex<Inner>,
    dev: Arc<dyn Device>,
}

impl GpuAllocPeer {
    /// gpu-alloc with its desktop starting configuration, one device-local heap the size of the
    /// device's memory.
    pub fn new(dev: Arc<dyn Device>) -> Self {
        let total = dev.mem_info().map(|m| m.total).unwrap_or(u64::MAX);
        let props = DeviceProperties {
            memory_types: Cow::Owned(vec![MemoryType {
                heap: 0,
                props: MemoryPropertyFlags::DEVICE_LOCAL,
            }]),
            memory_heaps: Cow::Owned(vec![MemoryHeap { size: total }]),
            // CUDA has no limit on the number of allocations (Vulkan's is 4096 on many drivers).
            max_memory_allocation_count: u32::MAX,
            max_memory_allocation_size: total,
            non_coherent_atom_size: 256,
            buffer_device_address: false,
        };
        GpuAllocPeer {
            inner: Mutex::new(Inner {
                alloc: GpuAllocator::new(Config::i_am_prototyping(), props),
                device: AsMemoryDevice {
                    dev: dev.clone(),
                    allocs: Cell::new(0),
                    frees: Cell::new(0),
                    reserved: Cell::new(Counter::default()),
                },
                live: FastMap::default(),
                live_bytes: Counter::default(),
            }),
            dev,
        }
    }
}

impl ReplayTarget for GpuAllocPeer {
    fn allocate(&self, bytes: u64, _stream: StreamId) -> Option<DevicePtr> {
        let mut g = self.inner.lock();
        let inner = &mut *g;
        // SAFETY: `inner.device` is the one device of this allocator, for all its blocks.
        let block = match unsafe { inner.alloc.alloc(&inner.device, Inner::request(bytes)) } {
            Ok(b) => b,
            Err(_) => {
                // SAFETY: as above.
                unsafe { inner.alloc.cleanup(&inner.device) };
                // SAFETY: as above.
                unsafe { inner.alloc.alloc(&inner.device, Inner::request(bytes)) }.ok()?
            }
        };
        let ptr = block.memory().ptr + block.offset();
        inner.live.insert(ptr, (block, bytes));
        inner.live_bytes.add(bytes);
        Some(ptr)
    }

    fn deallocate(&self, ptr: DevicePtr, _stream: StreamId) {
        let mut g = self.inner.lock();
        let inner = &mut *g;
        let Some((block, bytes)) = inner.live.remove(&ptr) else {
            tracing::error!(ptr, "gpu-alloc peer: free of an unknown pointer");
            return;
        };
        inner.live_bytes.sub(bytes);
        // SAFETY: the block came from this allocator with this device.
        unsafe { inner.alloc.dealloc(&inner.device, block) };
    }

    fn counters(&self) -> TargetCounters {
        let g = self.inner.lock();
        let reserved = g.device.reserved.get();
        TargetCounters {
            driver_allocs: g.device.allocs.get(),
            driver_frees: g.device.frees.get(),
            oom_recoveries: 0,
            live_bytes: g.live_bytes.current,
            peak_live_bytes: g.live_bytes.peak,
            reserved_bytes: reserved.current,
            peak_reserved_bytes: reserved.peak,
            idle_bytes: reserved.current.saturating_sub(g.live_bytes.current),
        }
    }

    fn reset_peaks(&self) {
        let mut g = self.inner.lock();
        g.live_bytes.reset_peak();
        let mut r = g.device.reserved.get();
        r.reset_peak();
        g.device.reserved.set(r);
    }

    fn device(&self) -> &Arc<dyn Device> {
        &self.dev
    }
}

impl Drop for GpuAllocPeer {
    fn drop(&mut self) {
        let inner = self.inner.get_mut();
        for (_, (block, _)) in inner.live.drain() {
            // SAFETY: the block came from this allocator with this device.
            unsafe { inner.alloc.dealloc(&inner.device, block) };
        }
        // SAFETY: as above; frees every chunk, now empty.
        unsafe { inner.alloc.cleanup(&inner.device) };
    }
}

#[cfg(test)]
mod tests {
    fn _send_sync<T: Send + Sync>() {}
    #[test]
    fn peer_is_send_and_sync() {
        _send_sync::<super::GpuAllocPeer>();
    }
}
