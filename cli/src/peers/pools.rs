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

use super::{PeerCounts, PeerModel, PeerTarget};
use adaptalloc::device::{Device, DevicePtr, PoolCall};
use adaptalloc::size::{ALIGNMENT, MIB, align_up};
use adaptalloc::strategy::StreamId;

/// The device a pool allocates from, and what it made the driver do: the one place a pool
/// obtains or returns memory.
#[derive(Debug)]
pub struct Held {
    dev: Arc<dyn Device>,
    counts: PeerCounts,
}

impl Held {
    pub fn new(dev: Arc<dyn Device>) -> Self {
        Held {
            dev,
            counts: PeerCounts::default(),
        }
    }

    fn malloc(&mut self, bytes: u64) -> Option<DevicePtr> {
        let p = self.dev.allocate(bytes).ok()?;
        self.counts.driver_allocs += 1;
        self.counts.reserved.add(bytes);
        Some(p)
    }

    fn free(&mut self, ptr: DevicePtr, bytes: u64) {
        if let Err(e) = self.dev.free(ptr) {
            tracing::error!(ptr, error = %e, "pool peer: driver free failed");
        }
        self.counts.driver_frees += 1;
        self.counts.reserved.sub(bytes);
    }
}

/// One pool's rules, over the memory it [`Held`].
pub trait PoolModel: Send {
    /// Whether every alloc and free is a driver call (cudaMallocAsync / cudaFreeAsync, priced by
    /// the device's cost model) rather than host code alone.
    const DRIVER_CALLS: bool = false;
    fn alloc(&mut self, h: &mut Held, bytes: u64) -> Option<DevicePtr>;
    fn free(&mut self, ptr: DevicePtr, bytes: u64);
    /// A synchronization point (stream or device synchronize).
    fn synchronize(&mut self, _h: &mut Held) {}
    /// Gives everything back (every block is free).
    fn release_all(&mut self, h: &mut Held);
}

/// A pool and what it holds, as a [`PeerModel`].
pub struct Pooled<M> {
    model: M,
    held: Held,
}

/// `model` over `dev`, ready to replay.
pub fn peer<M: PoolModel>(dev: Arc<dyn Device>, model: M) -> PeerTarget<Pooled<M>> {
    let held = Held::new(dev.clone());
    PeerTarget::new(dev, Pooled { model, held })
}

impl<M: PoolModel> PeerModel for Pooled<M> {
    fn alloc(&mut self, bytes: u64, _stream: StreamId) -> Option<DevicePtr> {
        let p = self.model.alloc(&mut self.held, bytes)?;
        if M::DRIVER_CALLS {
            self.held.dev.charge_pool_call(PoolCall::Alloc);
        }
        Some(p)
    }

    fn free(&mut self, ptr: DevicePtr, bytes: u64) {
        self.model.free(ptr, bytes);
        if M::DRIVER_CALLS {
            self.held.dev.charge_pool_call(PoolCall::Free);
        }
    }

    fn synchronize(&mut self) {
        self.model.synchronize(&mut self.held);
    }

    fn release_all(&mut self) {
        self.model.release_all(&mut self.held);
    }

    fn counts(&self) -> PeerCounts {
        self.held.counts
    }

    fn reset_peak(&mut self) {
        self.held.counts.reserved.reset_peak();
    }
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

    /// Gives wholly free chunks back to the device, lowest address first, while the pool holds
    /// more than `keep` bytes.
    fn release_free_chunks(&mut self, h: &mut Held, keep: u64) {
        let free: Vec<(u64, u64)> = self
            .chunks
            .iter()
            .filter(|(b, s)| self.by_addr.get(b) == Some(s))
            .map(|(&b, &s)| (b, s))
            .collect();
        for (base, size) in free {
            if h.counts.reserved.current <= keep {
                break;
            }
            self.remove(base);
            self.chunks.remove(&base);
            h.free(base, size);
        }
    }
}

/// What the free-list pools hand out for a request: whole 256 B units, at least one.
fn aligned(bytes: u64) -> u64 {
    align_up(bytes.max(1), ALIGNMENT)
}

/// `rmm::mr::pool_memory_resource` (see the module docs).
#[derive(Debug, Default)]
pub struct RmmPool {
    list: FreeList,
    pool_size: u64,
    initialized: bool,
}

impl PoolModel for RmmPool {
    fn alloc(&mut self, h: &mut Held, bytes: u64) -> Option<DevicePtr> {
        let bytes = aligned(bytes);
        if !self.initialized {
            self.initialized = true;
            let free = h.dev.mem_info().map(|m| m.free).unwrap_or(0);
            let initial = align_up(free / 2, ALIGNMENT);
            if initial > 0
                && let Some(p) = h.malloc(initial)
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
            if let Some(p) = h.malloc(try_size) {
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
        self.list.give(ptr, aligned(bytes));
    }

    fn release_all(&mut self, h: &mut Held) {
        self.list.release_free_chunks(h, 0);
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
    const DRIVER_CALLS: bool = true;

    fn alloc(&mut self, h: &mut Held, bytes: u64) -> Option<DevicePtr> {
        let bytes = aligned(bytes);
        if let Some(p) = self.list.take(bytes) {
            return Some(p);
        }
        let grow = align_up(bytes, Self::GRANULE);
        let p = h.malloc(grow)?;
        self.list.add_chunk(p, grow);
        self.list.take(bytes)
    }

    fn free(&mut self, ptr: DevicePtr, bytes: u64) {
        self.list.give(ptr, aligned(bytes));
    }

    fn synchronize(&mut self, h: &mut Held) {
        self.list.release_free_chunks(h, self.threshold);
    }

    fn release_all(&mut self, h: &mut Held) {
        self.list.release_free_chunks(h, 0);
    }
}

/// IREE's caching allocator (see the module docs). A buffer is only ever reused by a request
/// of exactly its size, so the size a free names is the buffer's.
#[derive(Debug, Default)]
pub struct IreeCaching {
    /// Size -> freed buffers, most recent last.
    cache: HashMap<u64, Vec<DevicePtr>>,
}

impl PoolModel for IreeCaching {
    fn alloc(&mut self, h: &mut Held, bytes: u64) -> Option<DevicePtr> {
        let bytes = bytes.max(1);
        if let Some(p) = self.cache.get_mut(&bytes).and_then(|v| v.pop()) {
            return Some(p);
        }
        h.malloc(bytes)
    }

    fn free(&mut self, ptr: DevicePtr, bytes: u64) {
        self.cache.entry(bytes.max(1)).or_default().push(ptr);
    }

    fn release_all(&mut self, h: &mut Held) {
        for (size, ptrs) in self.cache.drain() {
            for p in ptrs {
                h.free(p, size);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace::ReplayTarget;
    use adaptalloc::device::SimDevice;

    fn dev(cap: u64) -> Arc<SimDevice> {
        Arc::new(SimDevice::new(cap))
    }

    #[test]
    fn rmm_starts_with_half_the_free_memory_doubles_then_backs_off() {
        let d = dev(1001 * MIB);
        let p = peer(d.clone(), RmmPool::default());
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
            let p = peer(d.clone(), CudaAsyncPool::new(threshold));
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
        let p = peer(d.clone(), IreeCaching::default());
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
