//! The public allocator: checks each request once, routes it to a strategy, keeps the map from
//! live pointers to their owners, and recovers from out-of-memory by releasing idle memory.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use crate::device::{Device, DevicePtr, DeviceStats, MemInfo};
use crate::error::{AllocError, DeviceError};
use crate::hash::FastMap;
use crate::size::{ALIGNMENT, ByteSize, align_up};
use crate::stats::{Stats, StrategyStats};
use crate::strategy::{
    BlockMeta, Caching, CachingConfig, Passthrough, Strategy, StrategyKind, StreamId, Suballoc,
    SuballocConfig,
};

/// Which strategy serves requests, with its settings.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum StrategyConfig {
    Passthrough,
    Caching(CachingConfig),
    Suballoc(SuballocConfig),
}

impl StrategyConfig {
    /// The strategy with its default settings.
    pub fn default_for(kind: StrategyKind) -> Self {
        match kind {
            StrategyKind::Passthrough => StrategyConfig::Passthrough,
            StrategyKind::Caching => StrategyConfig::Caching(CachingConfig::default()),
            StrategyKind::Suballoc => StrategyConfig::Suballoc(SuballocConfig::default()),
        }
    }

    fn build(self) -> Strategy {
        match self {
            StrategyConfig::Passthrough => Strategy::Passthrough(Passthrough::new()),
            StrategyConfig::Caching(c) => Strategy::Caching(Caching::new(c)),
            StrategyConfig::Suballoc(c) => Strategy::Suballoc(Suballoc::new(c)),
        }
    }
}

/// How an [`Allocator`] is built.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AllocatorConfig {
    pub strategy: StrategyConfig,
    /// On a device out-of-memory, release idle memory (cached blocks, then empty slabs) and retry
    /// once before failing. `false` models opt-in caching allocators that never give memory back.
    pub release_on_oom: bool,
}

impl AllocatorConfig {
    pub fn new(strategy: StrategyConfig) -> Self {
        AllocatorConfig {
            strategy,
            release_on_oom: true,
        }
    }
}

type PtrMap<V> = FastMap<DevicePtr, V>;

/// A live allocation as the allocator records it.
#[derive(Clone, Copy, Debug)]
struct Live {
    requested: u64,
    block: u64,
    stream: StreamId,
    strategy: u8,
    meta: BlockMeta,
}

/// The device, metered: counts this allocator's driver calls (atomics on the slow path only).
#[derive(Debug)]
struct Metered {
    inner: Arc<dyn Device>,
    allocs: AtomicU64,
    frees: AtomicU64,
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
    fn stats(&self) -> DeviceStats {
        self.inner.stats()
    }
    fn name(&self) -> String {
        self.inner.name()
    }
}

#[derive(Debug)]
struct State {
    strategies: Vec<Strategy>,
    strategy_stats: Vec<StrategyStats>,
    live: PtrMap<Live>,
    stats: Stats,
}

impl State {
    /// The seam where the policy engine routes a size class; today one strategy serves all.
    #[inline]
    fn route(&self, _bytes: u64) -> usize {
        0
    }

    /// Re-derives reserved and idle bytes from the strategies (1-3 of them: a few adds).
    #[inline]
    fn refresh(&mut self) {
        let reserved = self.strategies.iter().map(Strategy::reserved_bytes).sum();
        let idle = self.strategies.iter().map(Strategy::idle_bytes).sum();
        self.stats.reserved_bytes.set(reserved);
        self.stats.idle_bytes.set(idle);
    }

    fn release_idle(&mut self, dev: &dyn Device) -> u64 {
        // Cached blocks first (cheap to re-create), then empty slabs.
        let mut order: Vec<usize> = (0..self.strategies.len()).collect();
        order.sort_by_key(|&i| match self.strategies[i].kind() {
            StrategyKind::Caching => 0,
            _ => 1,
        });
        let released = order
            .into_iter()
            .map(|i| self.strategies[i].release_idle(dev))
            .sum();
        self.refresh();
        released
    }
}

#[derive(Debug)]
struct Shared {
    device: Metered,
    capacity: u64,
    release_on_oom: bool,
    state: Mutex<State>,
}

/// A device memory allocator. `Send + Sync`: share it by reference or clone it (clones share
/// state). Results are 256-byte aligned. A freed block is reused only by requests on the same
/// stream until [`synchronize_stream`](Allocator::synchronize_stream) is called for that stream.
///
/// Dropping the last clone (and every [`Allocation`], which keeps the allocator alive) returns
/// every byte to the device, raw allocations still live included (with a warning).
#[derive(Clone, Debug)]
pub struct Allocator {
    shared: Arc<Shared>,
}

impl Allocator {
    pub fn new(device: Arc<dyn Device>, config: AllocatorConfig) -> Self {
        let capacity = device.mem_info().map(|m| m.total).unwrap_or(u64::MAX);
        let strategy = config.strategy.build();
        let kind = strategy.kind();
        let stats = Stats {
            per_strategy: vec![(kind, StrategyStats::default())],
            ..Stats::default()
        };
        Allocator {
            shared: Arc::new(Shared {
                device: Metered {
                    inner: device,
                    allocs: AtomicU64::new(0),
                    frees: AtomicU64::new(0),
                },
                capacity,
                release_on_oom: config.release_on_oom,
                state: Mutex::new(State {
                    strategies: vec![strategy],
                    strategy_stats: vec![StrategyStats::default()],
                    live: PtrMap::default(),
                    stats,
                }),
            }),
        }
    }

    /// An allocator of one strategy with its default settings, releasing idle memory on OOM.
    pub fn with_strategy(device: Arc<dyn Device>, kind: StrategyKind) -> Self {
        Self::new(
            device,
            AllocatorConfig::new(StrategyConfig::default_for(kind)),
        )
    }

    /// The device this allocator takes memory from.
    pub fn device(&self) -> &Arc<dyn Device> {
        &self.shared.device.inner
    }

    /// Allocates `bytes` on `stream`, returning an RAII handle that frees on drop.
    pub fn allocate(&self, bytes: u64, stream: StreamId) -> Result<Allocation, AllocError> {
        let ptr = self.allocate_raw(bytes, stream)?;
        Ok(Allocation {
            ptr,
            bytes,
            stream,
            owned: true,
            shared: Arc::clone(&self.shared),
        })
    }

    /// Allocates `bytes` on `stream`; the caller frees with [`deallocate`](Allocator::deallocate).
    ///
    /// Errors: [`AllocError::ZeroSize`]; [`AllocError::TooLarge`] when `bytes` exceeds the
    /// device (permanent); [`AllocError::OutOfMemory`] when the device is full even after
    /// releasing idle memory (transient).
    pub fn allocate_raw(&self, bytes: u64, stream: StreamId) -> Result<DevicePtr, AllocError> {
        self.shared.allocate(bytes, stream)
    }

    /// Frees a pointer from [`allocate_raw`](Allocator::allocate_raw) on the stream it was
    /// allocated on. Unknown, already freed, or other-stream pointers are errors that change nothing.
    pub fn deallocate(&self, ptr: DevicePtr, stream: StreamId) -> Result<(), AllocError> {
        self.shared.deallocate(ptr, stream)
    }

    /// Tells the allocator that all work queued on `stream` has completed (call it after
    /// `cudaStreamSynchronize`): blocks freed on it become reusable by every stream.
    pub fn synchronize_stream(&self, stream: StreamId) {
        let mut st = self.shared.state.lock();
        for s in &mut st.strategies {
            s.synchronize_stream(stream);
        }
    }

    /// Gives every idle byte that can be given back to the device; returns the bytes released.
    pub fn release_idle(&self) -> u64 {
        let mut st = self.shared.state.lock();
        st.release_idle(&self.shared.device)
    }

    /// A snapshot of the statistics.
    pub fn stats(&self) -> Stats {
        let st = self.shared.state.lock();
        let mut stats = st.stats.clone();
        for (i, (_, s)) in stats.per_strategy.iter_mut().enumerate() {
            *s = st.strategy_stats[i];
        }
        stats.driver_allocs = self.shared.device.allocs.load(Ordering::Relaxed);
        stats.driver_frees = self.shared.device.frees.load(Ordering::Relaxed);
        stats
    }

    /// Restarts every peak from the current value (say, between training steps).
    pub fn reset_peaks(&self) {
        let mut st = self.shared.state.lock();
        st.stats.live_bytes.reset_peak();
        st.stats.live_blocks.reset_peak();
        st.stats.reserved_bytes.reset_peak();
        st.stats.idle_bytes.reset_peak();
    }

    /// The strategies in use, in routing order.
    pub fn strategies(&self) -> Vec<StrategyKind> {
        self.shared
            .state
            .lock()
            .strategies
            .iter()
            .map(Strategy::kind)
            .collect()
    }
}

impl Shared {
    fn allocate(&self, bytes: u64, stream: StreamId) -> Result<DevicePtr, AllocError> {
        if bytes == 0 {
            return Err(AllocError::ZeroSize);
        }
        if bytes > self.capacity {
            return Err(AllocError::TooLarge {
                requested: ByteSize(bytes),
                capacity: ByteSize(self.capacity),
            });
        }
        let aligned = align_up(bytes, ALIGNMENT);
        let mut st = self.state.lock();
        let si = st.route(aligned);
        // Fast path: the strategy serves it (a cache hit or a slab carve makes no driver call).
        let grant = match st.strategies[si].allocate(&self.device, aligned, stream) {
            Ok(g) => g,
            Err(e) => self.allocate_after_error(&mut st, si, aligned, bytes, stream, e)?,
        };
        let ss = &mut st.strategy_stats[si];
        if grant.hit {
            ss.hits += 1;
        } else {
            ss.misses += 1;
        }
        st.live.insert(
            grant.ptr,
            Live {
                requested: bytes,
                block: grant.block_bytes,
                stream,
                strategy: si as u8,
                meta: grant.meta,
            },
        );
        st.stats.live_bytes.add(bytes);
        st.stats.live_blocks.add(1);
        st.stats.rounding_bytes += grant.block_bytes - bytes;
        st.refresh();
        Ok(grant.ptr)
    }

    /// Slow path: release idle memory and retry on out-of-memory, else build the error.
    #[cold]
    fn allocate_after_error(
        &self,
        st: &mut State,
        si: usize,
        aligned: u64,
        bytes: u64,
        stream: StreamId,
        err: DeviceError,
    ) -> Result<crate::strategy::Grant, AllocError> {
        if !err.is_out_of_memory() {
            st.stats.failed_allocs += 1;
            return Err(AllocError::Device(err));
        }
        let mut last = err;
        if self.release_on_oom {
            let released = st.release_idle(&self.device);
            if released > 0 {
                match st.strategies[si].allocate(&self.device, aligned, stream) {
                    Ok(g) => {
                        st.stats.oom_recoveries += 1;
                        tracing::info!(
                            requested = bytes,
                            released,
                            "out of memory: released idle memory and retried"
                        );
                        return Ok(g);
                    }
                    Err(e) if e.is_out_of_memory() => last = e,
                    Err(e) => {
                        st.stats.failed_allocs += 1;
                        return Err(AllocError::Device(e));
                    }
                }
            }
        }
        st.stats.failed_allocs += 1;
        st.refresh();
        let info = self
            .device
            .mem_info()
            .unwrap_or(MemInfo { free: 0, total: 0 });
        let err = AllocError::OutOfMemory {
            requested: ByteSize(bytes),
            live: ByteSize(st.stats.live_bytes.current),
            reserved: ByteSize(st.stats.reserved_bytes.current),
            idle: ByteSize(st.stats.idle_bytes.current),
            largest_free: ByteSize(
                st.strategies
                    .iter()
                    .map(Strategy::largest_free_block)
                    .max()
                    .unwrap_or(0),
            ),
            device_free: ByteSize(info.free),
            device_total: ByteSize(info.total),
            source: last,
        };
        tracing::warn!(error = %err, "allocation failed");
        Err(err)
    }

    fn deallocate(&self, ptr: DevicePtr, stream: StreamId) -> Result<(), AllocError> {
        let mut st = self.state.lock();
        let Some(live) = st.live.get(&ptr).copied() else {
            return Err(AllocError::UnknownPointer { ptr });
        };
        if live.stream != stream {
            return Err(AllocError::StreamMismatch {
                ptr,
                allocated_on: live.stream,
                freed_on: stream,
            });
        }
        st.live.remove(&ptr);
        Self::release_block(&mut st, &self.device, ptr, live);
        Ok(())
    }

    fn release_block(st: &mut State, dev: &dyn Device, ptr: DevicePtr, live: Live) {
        st.strategies[live.strategy as usize].deallocate(
            dev,
            ptr,
            live.block,
            live.meta,
            live.stream,
        );
        st.stats.live_bytes.sub(live.requested);
        st.stats.live_blocks.sub(1);
        st.stats.rounding_bytes -= live.block - live.requested;
        st.refresh();
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        let st = self.state.get_mut();
        let leaked: Vec<(DevicePtr, Live)> = st.live.drain().collect();
        if !leaked.is_empty() {
            let bytes: u64 = leaked.iter().map(|(_, l)| l.requested).sum();
            tracing::warn!(
                blocks = leaked.len(),
                bytes,
                "allocator dropped with raw allocations live; freeing them"
            );
        }
        for (ptr, live) in leaked {
            Self::release_block(st, &self.device, ptr, live);
        }
        st.release_idle(&self.device);
        debug_assert_eq!(
            st.stats.reserved_bytes.current, 0,
            "every byte returned on drop"
        );
    }
}

/// An allocation that frees itself when dropped. It keeps its allocator alive.
#[derive(Debug)]
pub struct Allocation {
    ptr: DevicePtr,
    bytes: u64,
    stream: StreamId,
    /// False after `into_raw`: the caller frees the pointer.
    owned: bool,
    shared: Arc<Shared>,
}

impl Allocation {
    /// The device address (256-byte aligned).
    pub fn ptr(&self) -> DevicePtr {
        self.ptr
    }
    /// The bytes asked for (the block may be larger).
    pub fn len(&self) -> u64 {
        self.bytes
    }
    /// Always false: zero-size allocations are refused.
    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }
    pub fn stream(&self) -> StreamId {
        self.stream
    }
    /// Gives up ownership: the caller must free the pointer with [`Allocator::deallocate`].
    pub fn into_raw(mut self) -> DevicePtr {
        self.owned = false;
        self.ptr
    }
}

impl Drop for Allocation {
    fn drop(&mut self) {
        if !self.owned {
            return;
        }
        let r = self.shared.deallocate(self.ptr, self.stream);
        debug_assert!(r.is_ok(), "an Allocation's pointer is always live: {r:?}");
    }
}
