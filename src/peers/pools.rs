//! Three pool allocators users run, each a small model over a [`Device`]:
//!
//! - `rmm-pool`: RAPIDS RMM's `pool_memory_resource` over `cuda_memory_resource`. Exact:
//!   sizes aligned to 256 B; a coalescing free list searched best fit (smallest block that
//!   fits, then lowest address); the block split at the front; freed blocks merge with free
//!   neighbours of the same upstream allocation only; the pool never shrinks; growth is
//!   `max(request, pool size)` (doubling), halved on refusal down to the request, then
//!   `rmm::out_of_memory`. Assumed: the initial pool is half of the device's free memory (what
//!   `rmm::percent_of_free_device_memory(50)` gives and what RMM's Python `reinitialize` uses
//!   when no size is given; the C++ constructor now requires one) and no maximum. Not modelled:
//!   per-stream free lists (every trace here is one stream).
//! - `cuda-async` / `cuda-async-retain`: CUDA's stream-ordered pool (`cudaMallocAsync`) with
//!   release threshold 0 (IREE's CUDA HAL, an untuned pool, PyTorch's `backend:cudaMallocAsync`)
//!   or at its maximum (what RMM's `cuda_async_memory_resource` and CCCL set). The driver's
//!   internals are not public; the model assumes that the pool grows by the request rounded
//!   up to the 2 MiB granule, suballocates best fit within what it holds, merges free
//!   neighbours within one growth, and at each synchronization releases every wholly free
//!   growth while it holds more than the threshold. Synchronizations are the end of each
//!   `--repeat` pass and every `--sync-every N` events. It does not trim on out-of-memory
//!   (assumed: the documentation names synchronization as the only release point).
//! - `iree-caching`: IREE's caching allocator (`--device_allocator=caching`): a freed buffer is
//!   kept and reused only by a request of exactly its size, most recently freed first; the
//!   cache is unbounded and nothing is released on out-of-memory.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use parking_lot::Mutex;

use crate::device::{Device, DevicePtr};
use crate::hash::FastMap;
use crate::size::{ALIGNMENT, MIB, align_up};
use crate::stats::Counter;
use crate::strategy::StreamId;
use crate::trace::{ReplayTarget, TargetCounters};

/// Driver traffic and memory held, kept by the [`PoolPeer`] for every model.
#[derive(Debug, Default)]
pub struct Held {
    pub allocs: u64,
    pub frees: u64,
    pub reserved: Counter,
}

impl Held {
    fn malloc(&mut self, dev: &dyn Device, bytes: u64) -> Option<DevicePtr> {
        let p = dev.allocate(bytes).ok()?;
        self.allocs += 1;
        self.reserved.add(bytes);
        Some(p)
    }

    fn free(&mut self, dev: &dyn Device, ptr: DevicePtr, bytes: u64) {
        if let Err(e) = dev.free(ptr) {
            tracing::error!(ptr, error = %e, "pool peer: driver free failed");
        }
        self.frees += 1;
        self.reserved.sub(bytes);
    }
}

/// One pool's rules.
pub trait PoolModel: Send {
    fn alloc(&mut self, h: &mut Held, dev: &dyn Device, bytes: u64) -> Option<DevicePtr>;
    fn free(&mut self, ptr: DevicePtr, bytes: u64);
    /// A synchronization point (stream or device synchronize).
    fn synchronize(&mut self, _h: &mut Held, _dev: &dyn Device) {}
    /// Gives everything back (the peer is dropped; every block is free).
    fn release_all(&mut self, h: &mut Held, dev: &dyn Device);
}

/// A free list over driver allocations ("chunks"): best fit by (size, address), split at the
/// front, merged with free neighbours of the same chunk.
#[derive(Debug, Default)]
struct FreeList {
    /// Chunk base -> size.
    chunks: BTreeMap<u64, u64>,
    /// Free blocks: (size, address), and address -> size.
    by_size: BTreeSet<(u64, u64)>,
    by_addr: BTreeMap<u64, u64>,
}

impl FreeList {
    fn add_chunk(&mut self, base: u64, size: u64) {
        self.chunks.insert(base, size);
        self.insert(base, size);
    }

    fn insert(&mut self, addr: u64, size: u64) {
        self.by_size.insert((size, addr));
        self.by_addr.insert(addr, size);
    }

    fn remove(&mut self, addr: u64) -> u64 {
        let size = self.by_addr.remove(&addr).expect("free block");
        self.by_size.remove(&(size, addr));
        size
    }

    fn take(&mut self, bytes: u64) -> Option<u64> {
        let &(size, addr) = self.by_size.range((bytes, 0)..).next()?;
        self.remove(addr);
        if size > bytes {
            self.insert(addr + bytes, size - bytes);
        }
        Some(addr)
    }

    fn chunk_of(&self, addr: u64) -> (u64, u64) {
        let (&b, &s) = self.chunks.range(..=addr).next_back().expect("chunk");
        (b, s)
    }

    fn give(&mut self, mut addr: u64, mut size: u64) {
        let (base, csize) = self.chunk_of(addr);
        if let Some((&p, &ps)) = self.by_addr.range(base..addr).next_back()
            && p + ps == addr
        {
            self.remove(p);
            addr = p;
            size += ps;
        }
        if addr + size < base + csize && self.by_addr.contains_key(&(addr + size)) {
            size += self.remove(addr + size);
        }
        self.insert(addr, size);
    }

    /// Chunks wholly free now.
    fn free_chunks(&self) -> Vec<(u64, u64)> {
        self.chunks
            .iter()
            .filter(|(b, s)| self.by_addr.get(b) == Some(s))
            .map(|(&b, &s)| (b, s))
            .collect()
    }

    fn drop_chunk(&mut self, base: u64) {
        self.remove(base);
        self.chunks.remove(&base);
    }
}

/// `rmm::mr::pool_memory_resource` (see the module docs).
#[derive(Debug, Default)]
pub struct RmmPool {
    list: FreeList,
    pool_size: u64,
    initialized: bool,
}

impl PoolModel for RmmPool {
    fn alloc(&mut self, h: &mut Held, dev: &dyn Device, bytes: u64) -> Option<DevicePtr> {
        let bytes = align_up(bytes.max(1), ALIGNMENT);
        if !self.initialized {
            self.initialized = true;
            let free = dev.mem_info().map(|m| m.free).unwrap_or(0);
            let initial = align_up(free / 2, ALIGNMENT);
            if initial > 0
                && let Some(p) = h.malloc(dev, initial)
            {
                self.list.add_chunk(p, initial);
                self.pool_size = initial;
            }
        }
        if let Some(p) = self.list.take(bytes) {
            return Some(p);
        }
        let mut try_size = bytes.max(self.pool_size);
        loop {
            if let Some(p) = h.malloc(dev, try_size) {
                self.list.add_chunk(p, try_size);
                self.pool_size += try_size;
                return self.list.take(bytes);
            }
            if try_size == bytes {
                return None;
            }
            try_size = bytes.max(try_size / 2);
        }
    }

    fn free(&mut self, ptr: DevicePtr, bytes: u64) {
        self.list.give(ptr, align_up(bytes.max(1), ALIGNMENT));
    }

    fn release_all(&mut self, h: &mut Held, dev: &dyn Device) {
        for (b, s) in self.list.free_chunks() {
            self.list.drop_chunk(b);
            h.free(dev, b, s);
        }
    }
}

/// CUDA's stream-ordered pool with a release threshold (see the module docs).
#[derive(Debug)]
pub struct CudaAsyncPool {
    list: FreeList,
    /// `cudaMemPoolAttrReleaseThreshold`.
    pub threshold: u64,
}

impl CudaAsyncPool {
    /// The 2 MiB granule the pool maps in.
    pub const GRANULE: u64 = 2 * MIB;

    pub fn new(threshold: u64) -> Self {
        CudaAsyncPool {
            list: FreeList::default(),
            threshold,
        }
    }
}

impl PoolModel for CudaAsyncPool {
    fn alloc(&mut self, h: &mut Held, dev: &dyn Device, bytes: u64) -> Option<DevicePtr> {
        let bytes = align_up(bytes.max(1), ALIGNMENT);
        if let Some(p) = self.list.take(bytes) {
            return Some(p);
        }
        let grow = align_up(bytes, Self::GRANULE);
        let p = h.malloc(dev, grow)?;
        self.list.add_chunk(p, grow);
        self.list.take(bytes)
    }

    fn free(&mut self, ptr: DevicePtr, bytes: u64) {
        self.list.give(ptr, align_up(bytes.max(1), ALIGNMENT));
    }

    fn synchronize(&mut self, h: &mut Held, dev: &dyn Device) {
        for (b, s) in self.list.free_chunks() {
            if h.reserved.current <= self.threshold {
                break;
            }
            self.list.drop_chunk(b);
            h.free(dev, b, s);
        }
    }

    fn release_all(&mut self, h: &mut Held, dev: &dyn Device) {
        let threshold = std::mem::replace(&mut self.threshold, 0);
        self.synchronize(h, dev);
        self.threshold = threshold;
    }
}

/// IREE's caching allocator (see the module docs).
#[derive(Debug, Default)]
pub struct IreeCaching {
    /// Size -> freed buffers, most recent last.
    cache: HashMap<u64, Vec<DevicePtr>>,
    sizes: FastMap<DevicePtr, u64>,
}

impl PoolModel for IreeCaching {
    fn alloc(&mut self, h: &mut Held, dev: &dyn Device, bytes: u64) -> Option<DevicePtr> {
        let bytes = bytes.max(1);
        if let Some(p) = self.cache.get_mut(&bytes).and_then(|v| v.pop()) {
            return Some(p);
        }
        let p = h.malloc(dev, bytes)?;
        self.sizes.insert(p, bytes);
        Some(p)
    }

    fn free(&mut self, ptr: DevicePtr, _bytes: u64) {
        let size = self.sizes[&ptr];
        self.cache.entry(size).or_default().push(ptr);
    }

    fn release_all(&mut self, h: &mut Held, dev: &dyn Device) {
        for (size, ptrs) in self.cache.drain() {
            for p in ptrs {
                self.sizes.remove(&p);
                h.free(dev, p, size);
            }
        }
    }
}

struct Inner<M> {
    model: M,
    held: Held,
    live: FastMap<DevicePtr, u64>,
    live_bytes: Counter,
}

/// A [`PoolModel`] as a [`ReplayTarget`].
pub struct PoolPeer<M: PoolModel> {
    inner: Mutex<Inner<M>>,
    dev: Arc<dyn Device>,
}

impl<M: PoolModel> PoolPeer<M> {
    pub fn new(dev: Arc<dyn Device>, model: M) -> Self {
        PoolPeer {
            inner: Mutex::new(Inner {
                model,
                held: Held::default(),
                live: FastMap::default(),
                live_bytes: Counter::default(),
            }),
            dev,
        }
    }
}

impl<M: PoolModel> ReplayTarget for PoolPeer<M> {
    fn allocate(&self, bytes: u64, _stream: StreamId) -> Option<DevicePtr> {
        let mut g = self.inner.lock();
        let Inner {
            model,
            held,
            live,
            live_bytes,
        } = &mut *g;
        let p = model.alloc(held, &*self.dev, bytes)?;
        live.insert(p, bytes);
        live_bytes.add(bytes);
        Some(p)
    }

    fn deallocate(&self, ptr: DevicePtr, _stream: StreamId) {
        let mut g = self.inner.lock();
        let Some(bytes) = g.live.remove(&ptr) else {
            tracing::error!(ptr, "pool peer: free of an unknown pointer");
            return;
        };
        g.live_bytes.sub(bytes);
        g.model.free(ptr, bytes);
    }

    fn synchronize(&self) {
        let mut g = self.inner.lock();
        let Inner { model, held, .. } = &mut *g;
        model.synchronize(held, &*self.dev);
    }

    fn counters(&self) -> TargetCounters {
        let g = self.inner.lock();
        TargetCounters {
            driver_allocs: g.held.allocs,
            driver_frees: g.held.frees,
            oom_recoveries: 0,
            live_bytes: g.live_bytes.current,
            peak_live_bytes: g.live_bytes.peak,
            reserved_bytes: g.held.reserved.current,
            peak_reserved_bytes: g.held.reserved.peak,
            idle_bytes: g.held.reserved.current.saturating_sub(g.live_bytes.current),
        }
    }

    fn reset_peaks(&self) {
        let mut g = self.inner.lock();
        g.live_bytes.reset_peak();
        g.held.reserved.reset_peak();
    }

    fn device(&self) -> &Arc<dyn Device> {
        &self.dev
    }
}

impl<M: PoolModel> Drop for PoolPeer<M> {
    fn drop(&mut self) {
        let Inner { model, held, live, .. } = self.inner.get_mut();
        for (p, b) in live.drain() {
            model.free(p, b);
        }
        model.release_all(held, &*self.dev);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::SimDevice;

    fn dev(cap: u64) -> Arc<SimDevice> {
        Arc::new(SimDevice::new(cap))
    }

    #[test]
    fn rmm_starts_with_half_the_free_memory_doubles_then_backs_off() {
        let d = dev(1001 * MIB);
        let p = PoolPeer::new(d.clone(), RmmPool::default());
        let initial = 1001 * MIB / 2;
        let a = p.allocate(450 * MIB, 0).unwrap();
        assert_eq!(p.counters().reserved_bytes, initial, "half of the free memory");
        // 100 MiB does not fit the 50.5 MiB left; growing by the pool size is refused (the
        // device's 2 MiB granules leave 499 MiB), half of that is granted.
        let b = p.allocate(100 * MIB, 0).unwrap();
        assert_eq!(p.counters().driver_allocs, 2);
        assert_eq!(p.counters().reserved_bytes, initial + initial / 2);
        // Blocks of two upstream allocations never merge: 600 MiB fits neither chunk, and the
        // device cannot grow the pool by it.
        p.deallocate(a, 0);
        p.deallocate(b, 0);
        assert!(p.allocate(600 * MIB, 0).is_none());
        assert_eq!(p.allocate(initial, 0), Some(a), "the first chunk, merged whole again");
        assert_eq!(p.counters().driver_frees, 0, "never shrinks");
        p.deallocate(a, 0);
        drop(p);
        assert_eq!(d.stats().allocated_bytes, 0);
    }

    #[test]
    fn cuda_async_gives_back_at_synchronization_unless_it_retains() {
        for (threshold, kept) in [(0, 0), (u64::MAX, 4 * MIB)] {
            let d = dev(1 << 30);
            let p = PoolPeer::new(d.clone(), CudaAsyncPool::new(threshold));
            let a = p.allocate(3 * MIB, 0).unwrap();
            let b = p.allocate(3 * MIB, 0).unwrap();
            assert_eq!(
                p.counters().reserved_bytes,
                8 * MIB,
                "each 3 MiB grows the pool by 4 MiB"
            );
            p.deallocate(a, 0);
            assert_eq!(p.allocate(3 * MIB, 0), Some(a), "reused without a driver call");
            p.deallocate(a, 0);
            p.synchronize();
            assert_eq!(p.counters().reserved_bytes, 4 * MIB + kept);
            p.deallocate(b, 0);
            drop(p);
            assert_eq!(d.stats().allocated_bytes, 0);
        }
    }

    #[test]
    fn iree_reuses_only_exact_sizes_most_recent_first_and_never_releases() {
        let d = dev(8 * MIB);
        let p = PoolPeer::new(d.clone(), IreeCaching::default());
        let a = p.allocate(MIB, 0).unwrap();
        let b = p.allocate(MIB, 0).unwrap();
        p.deallocate(a, 0);
        p.deallocate(b, 0);
        assert_eq!(p.allocate(MIB, 0), Some(b), "most recently freed first");
        assert!(p.allocate(MIB + 1, 0).is_some(), "another size: a driver allocation");
        assert_eq!(p.counters().driver_allocs, 3);
        // 1 MiB cached; 6 MiB cannot fit beside three 2 MiB granules: no release, no retry.
        assert!(p.allocate(6 * MIB, 0).is_none());
        assert_eq!(p.counters().driver_frees, 0);
    }
}
