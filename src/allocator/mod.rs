//! The public allocator: checks each request once, routes it to a strategy, keeps the map from
//! live pointers to their owners, and recovers from out-of-memory by releasing idle memory.

use std::sync::Arc;

use parking_lot::Mutex;

mod allocation;
mod env;
mod ladder;
mod pools;
mod recovery;
mod streams;

pub use allocation::Allocation;
use ladder::Ladder;
pub use pools::{PoolId, StreamFilter};

use crate::device::{Device, DevicePtr, Metered};
use crate::error::AllocError;
use crate::policy::{BUCKETS, Engine, Policy, bucket_of};
use crate::ptrtable::PtrTable;
use crate::size::{ALIGNMENT, align_up};
use crate::stats::{Stats, StrategyStats};
use crate::strategy::{
    BlockMeta, Caching, CachingConfig, Grant, Passthrough, Strategy, StrategyKind, StreamId, Suballoc, SuballocConfig,
};

/// Which strategy serves requests, with its settings.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum StrategyConfig {
    /// Every request a driver allocation, every free a driver free.
    Passthrough,
    /// Freed blocks kept and reused by requests of their size class.
    Caching(CachingConfig),
    /// Blocks carved from slabs (large driver allocations).
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
    /// The strategy and its settings.
    pub strategy: StrategyConfig,
    /// On a device out-of-memory, release idle memory (cached blocks, then empty slabs and
    /// pages) as far as the request needs and retry, then all of it and retry, before failing.
    /// `false` models opt-in caching allocators that never give memory back.
    pub release_on_oom: bool,
}

impl AllocatorConfig {
    /// `strategy`, releasing idle memory and retrying on out-of-memory.
    pub fn new(strategy: StrategyConfig) -> Self {
        AllocatorConfig {
            strategy,
            release_on_oom: true,
        }
    }
}

/// Yields (each a chance for a preempted lock holder to run) before a contended hot-path lock
/// parks the thread.
const YIELDS_BEFORE_PARKING: u32 = 16;

/// A live allocation as the allocator records it.
#[derive(Clone, Copy, Debug, Default)]
struct Live {
    requested: u64,
    /// The operation count at allocation, for lifetimes.
    born: u64,
    block: u64,
    stream: StreamId,
    strategy: u8,
    /// Size class of the request ([`bucket_of`]), for the engine when it is freed.
    bucket: u8,
    /// Other streams use it ([`Allocator::record_stream`]): its free waits for them.
    recorded: bool,
    /// Its private pool's slot + 1 (pools.rs); 0 for none.
    pool: u16,
    meta: BlockMeta,
}

#[derive(Debug)]
struct State {
    strategies: Vec<Strategy>,
    strategy_stats: Vec<StrategyStats>,
    live: PtrTable<Live>,
    stats: Stats,
    /// Strategy index of each size class ([`bucket_of`]); the engine changes it.
    routes: [u8; BUCKETS],
    engine: Option<Box<Engine>>,
    /// Operations so far (allocations and frees).
    op: u64,
    /// Streams with memory freed on them, for stream-ordered reuse (streams.rs).
    freed_on: streams::FreedOn,
    /// Streams recorded on live blocks, and freed blocks waiting for them (streams.rs).
    recorded: crate::hash::FastMap<DevicePtr, std::collections::HashSet<StreamId, crate::hash::FastBuild>>,
    deferred: std::collections::VecDeque<streams::Deferred>,
    /// Private pools (CUDA graph capture), and blocks held while one is allocated to.
    pools: pools::Pools,
    /// Free device memory is under the policy's low watermark: place compactly.
    pressure: bool,
    /// Free device memory is under the policy's headroom: keep no releasable idle memory.
    below_headroom: bool,
    /// Each strategy's (reserved, idle) bytes as last summed into `stats`, so that a fast-path
    /// operation, which changes one strategy, re-reads only that one.
    seen: Vec<(u64, u64)>,
    /// Where the caching and passthrough strategies sit in `strategies`, if present (fixed at
    /// construction): the strand guard's and the out-of-memory paths' fallbacks.
    caching_at: Option<usize>,
    passthrough_at: Option<usize>,
}

impl State {
    /// After an operation: feed the engine's controller when it is due. Cost: one compare.
    #[inline]
    fn maybe_tick(&mut self, dev: &dyn Device) {
        if let Some(e) = self.engine.as_deref_mut() {
            // No tick in a pool window: it could give memory back during a capture.
            if e.due(self.op) && !self.pools.in_window() {
                e.tick(
                    &mut self.strategies,
                    dev,
                    &mut self.routes,
                    self.op,
                    self.stats.live_bytes.current,
                );
                self.pressure = e.in_pressure();
                self.below_headroom = e.below_headroom();
                self.refresh();
            }
        }
    }

    /// Samples free memory now and enforces the bounds (after a driver allocation, or when idle
    /// memory appears under the headroom); updates the pressure flags.
    #[cold]
    fn resample(&mut self, dev: &dyn Device) {
        if self.pools.in_window() {
            return;
        }
        if let Some(e) = self.engine.as_deref_mut() {
            e.resample(&mut self.strategies, dev, &mut self.routes, self.op);
            self.pressure = e.in_pressure();
            self.below_headroom = e.below_headroom();
        }
    }

    /// Re-derives reserved and idle bytes from every strategy (after slow paths, which may
    /// touch several).
    fn refresh(&mut self) {
        for (seen, s) in self.seen.iter_mut().zip(&self.strategies) {
            *seen = s.held_bytes();
        }
        let (pool_reserved, pool_idle) = self.pools.held_bytes();
        let reserved = pool_reserved + self.seen.iter().map(|s| s.0).sum::<u64>();
        let idle = pool_idle + self.seen.iter().map(|s| s.1).sum::<u64>();
        self.stats.reserved_bytes.set(reserved);
        self.stats.idle_bytes.set(idle);
    }

    /// Re-reads strategy `si` alone, after an operation that touched only it. Cost: two
    /// field reads and a few adds.
    #[inline]
    fn refresh_one(&mut self, si: usize) {
        let now = self.strategies[si].held_bytes();
        let was = std::mem::replace(&mut self.seen[si], now);
        if now.0 != was.0 {
            let reserved = self.stats.reserved_bytes.current + now.0 - was.0;
            self.stats.reserved_bytes.set(reserved);
        }
        let idle = self.stats.idle_bytes.current + now.1 - was.1;
        self.stats.idle_bytes.set(idle);
    }

    fn release_idle(&mut self, dev: &dyn Device) -> u64 {
        self.release_at_least(dev, u64::MAX)
    }

    /// While a private pool's window is open nothing is unmapped or moved to place a block
    /// (a capture may be under way); on when the first window opens, off when the last closes
    /// or the allocator goes away.
    fn freeze(&mut self, on: bool) {
        for s in &mut self.strategies {
            s.freeze(on);
        }
    }

    /// Gives idle memory back until `need` bytes are released or none is left: cached blocks
    /// first (least recently used first; cheap to re-create), then empty slabs, then unused
    /// pages. Returns the bytes released.
    fn release_at_least(&mut self, dev: &dyn Device, need: u64) -> u64 {
        if self.pools.in_window() {
            return 0; // nothing goes back while a capture may be under way (pools.rs)
        }
        let mut order: Vec<usize> = (0..self.strategies.len()).collect();
        order.sort_by_key(|&i| match self.strategies[i].kind() {
            StrategyKind::Caching => 0,
            _ => 1,
        });
        let mut released = 0u64;
        for i in order {
            if released >= need {
                break;
            }
            let s = &mut self.strategies[i];
            released += if need == u64::MAX {
                s.release_idle(dev)
            } else {
                let keep = s.idle_bytes().saturating_sub(need - released);
                s.release_down_to(dev, keep, true)
            };
        }
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
    /// Where to write the tuning report and the workload profile when the allocator is dropped.
    exit: Mutex<env::ExitFiles>,
}

/// A device memory allocator. `Send + Sync`: share it by reference or clone it (clones share
/// state). Results are 256-byte aligned. A block freed on a stream is reused at once by that
/// stream, and by every stream once the stream's work is done: after
/// [`synchronize_stream`](Allocator::synchronize_stream), when the device reports the stream
/// idle (asked once many streams hold freed memory, and before a request would fail), or,
/// before a request would fail for want of memory, after waiting for the stream
/// (allocator/streams.rs).
///
/// Dropping the last clone (and every [`Allocation`], which keeps the allocator alive) returns
/// every byte to the device, raw allocations still live included (with a warning).
#[derive(Clone, Debug)]
pub struct Allocator {
    shared: Arc<Shared>,
}

impl Allocator {
    /// An allocator of one fixed strategy on `device` (no policy engine; see [`Allocator::with_policy`]).
    pub fn new(device: Arc<dyn Device>, config: AllocatorConfig) -> Self {
        Self::from_parts(device, &[config.strategy], config.release_on_oom)
    }

    fn from_parts(device: Arc<dyn Device>, configs: &[StrategyConfig], release_on_oom: bool) -> Self {
        let capacity = device.mem_info().map(|m| m.total).unwrap_or(u64::MAX);
        let strategies: Vec<Strategy> = configs.iter().map(|c| c.build()).collect();
        let stats = Stats {
            per_strategy: strategies
                .iter()
                .map(|s| (s.kind(), StrategyStats::default()))
                .collect(),
            ..Stats::default()
        };
        Allocator {
            shared: Arc::new(Shared {
                device: Metered::new(device),
                capacity,
                release_on_oom,
                state: Mutex::new(State {
                    caching_at: strategies.iter().position(|s| s.kind() == StrategyKind::Caching),
                    passthrough_at: strategies.iter().position(|s| s.kind() == StrategyKind::Passthrough),
                    strategy_stats: vec![StrategyStats::default(); strategies.len()],
                    seen: vec![(0, 0); strategies.len()],
                    strategies,
                    live: PtrTable::default(),
                    stats,
                    routes: [0; BUCKETS],
                    engine: None,
                    op: 0,
                    freed_on: streams::FreedOn::default(),
                    recorded: Default::default(),
                    deferred: Default::default(),
                    pools: Default::default(),
                    pressure: false,
                    below_headroom: false,
                }),
                exit: Mutex::default(),
            }),
        }
    }

    /// An allocator run by the policy engine: adaptive routing, bounds that follow free device
    /// memory, release-and-retry on OOM, and a tuning report ([`Allocator::report`]).
    pub fn with_policy(device: Arc<dyn Device>, policy: Policy) -> Self {
        let total = device.mem_info().map(|m| m.total).unwrap_or(u64::MAX);
        // Idle memory is bounded by the engine from its first sample (the first operation).
        let caching = StrategyConfig::Caching(CachingConfig {
            max_idle_bytes: None,
            rounding: policy.caching.rounding,
        });
        let suballoc = StrategyConfig::Suballoc(SuballocConfig {
            min_slab: policy.suballoc.min_slab.0,
            max_slab: policy.suballoc.max_slab.0,
            growth: policy.suballoc.growth,
            max_empty_bytes: u64::MAX,
            segregate: policy.suballoc.segregate == crate::policy::Segregate::Always,
            page_release: policy.suballoc.page_release,
            backing: policy.suballoc.backing,
        });
        let configs = match policy.routing.mode.fixed() {
            Some(StrategyKind::Passthrough) => vec![StrategyConfig::Passthrough],
            Some(StrategyKind::Caching) => vec![caching],
            Some(StrategyKind::Suballoc) => vec![suballoc],
            None => vec![StrategyConfig::Passthrough, caching, suballoc],
        };
        let alloc = Self::from_parts(device, &configs, policy.oom.release_and_retry);
        {
            let mut st = alloc.shared.state.lock();
            let kinds = st.strategies.iter().map(Strategy::kind).collect();
            let engine = Engine::new(policy, kinds, total, alloc.shared.device.footprint_model());
            st.routes = engine.initial_routes();
            st.engine = Some(Box::new(engine));
            // A first sample before the first request (due at operation 0): the strategies
            // start with the plan for the device as it is.
            st.maybe_tick(&alloc.shared.device);
        }
        alloc
    }

    /// The tuning report so far; None for allocators built without a policy.
    pub fn report(&self) -> Option<crate::report::TuningReport> {
        self.shared.report()
    }

    /// The zero-configuration allocator: the built-in default policy.
    pub fn adaptive(device: Arc<dyn Device>) -> Self {
        Self::with_policy(device, Policy::default())
    }

    /// An allocator of one strategy with its default settings, releasing idle memory on OOM.
    pub fn with_strategy(device: Arc<dyn Device>, kind: StrategyKind) -> Self {
        Self::new(device, AllocatorConfig::new(StrategyConfig::default_for(kind)))
    }

    /// The device this allocator takes memory from.
    pub fn device(&self) -> &Arc<dyn Device> {
        &self.shared.device.inner
    }

    /// Allocates `bytes` on `stream`, returning an RAII handle that frees on drop.
    pub fn allocate(&self, bytes: u64, stream: StreamId) -> Result<Allocation, AllocError> {
        let ptr = self.allocate_raw(bytes, stream)?;
        Ok(Allocation::new(ptr, bytes, stream, Arc::clone(&self.shared)))
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
    #[inline]
    pub fn deallocate(&self, ptr: DevicePtr, stream: StreamId) -> Result<(), AllocError> {
        self.shared.deallocate(ptr, stream)
    }

    /// Tells the allocator that all work queued on `stream` has completed (call it after
    /// `cudaStreamSynchronize`): blocks freed on it become reusable by every stream.
    pub fn synchronize_stream(&self, stream: StreamId) {
        self.shared
            .state
            .lock()
            .synchronize_strategies(&self.shared.device, stream);
    }

    /// Marks the live block at `ptr` as used by `stream` too (PyTorch's `record_stream`, for a
    /// tensor used on a side stream such as NCCL's): when it is freed, it is not reused until
    /// `stream`'s work up to the free is done. Until then it counts as live. Errors:
    /// [`AllocError::UnknownPointer`] when `ptr` is not live.
    pub fn record_stream(&self, ptr: DevicePtr, stream: StreamId) -> Result<(), AllocError> {
        self.shared.state.lock().record_stream(ptr, stream)
    }

    /// Gives every idle byte that can be given back to the device; returns the bytes released.
    pub fn release_idle(&self) -> u64 {
        let mut st = self.shared.state.lock();
        st.release_idle(&self.shared.device)
    }

    /// A snapshot of the statistics.
    pub fn stats(&self) -> Stats {
        let st = self.shared.state.lock();
        self.shared.snapshot(&st)
    }

    /// Restarts every peak from the current value (say, between training steps).
    pub fn reset_peaks(&self) {
        let mut st = self.shared.state.lock();
        st.stats.live_bytes.reset_peak();
        st.stats.live_blocks.reset_peak();
        st.stats.reserved_bytes.reset_peak();
        st.stats.idle_bytes.reset_peak();
    }

    /// Opens a window in which requests on streams `filter` accepts are served from private
    /// pool `id` (made on first use), as PyTorch's `beginAllocateToPool` at the start of a CUDA
    /// graph capture: see allocator/pools.rs for what the allocator holds back meanwhile.
    pub fn begin_pool(&self, id: PoolId, filter: StreamFilter) {
        self.shared.state.lock().begin_pool(id, filter);
    }

    /// Closes pool `id`'s latest window (PyTorch's `endAllocateToPool`). Errors:
    /// [`AllocError::UnknownPool`] when no window of it is open.
    pub fn end_pool(&self, id: PoolId) -> Result<(), AllocError> {
        self.shared.state.lock().end_pool(&self.shared.device, id)
    }

    /// Pool `id` is no longer needed (PyTorch's `releasePool`, when the graph is destroyed):
    /// its memory goes back to the device once its last block is freed. Errors:
    /// [`AllocError::UnknownPool`].
    pub fn release_pool(&self, id: PoolId) -> Result<(), AllocError> {
        self.shared.state.lock().release_pool(&self.shared.device, id)
    }

    /// Caps the bytes this allocator may hold from the device (None: no cap), as PyTorch's
    /// `set_per_process_memory_fraction`: a request that would take it past the cap releases
    /// idle memory and retries, then fails as out-of-memory. Free memory as the policy sees it
    /// is what the cap leaves.
    pub fn set_memory_cap(&self, cap: Option<u64>) {
        self.shared.device.set_cap(cap);
    }

    /// The strategies in use, in routing order.
    pub fn strategies(&self) -> Vec<StrategyKind> {
        self.shared.state.lock().strategies.iter().map(Strategy::kind).collect()
    }
}

impl Shared {
    /// The state lock for the hot paths. Uncontended: one CAS, as `lock()`. Contended: a few
    /// `try_lock`s with a yield between them before parking, so that with more threads than
    /// cores a preempted holder gets the CPU back instead of every waiter sleeping in the kernel
    /// (parking costs a futex wake on every unlock).
    #[inline]
    fn lock_state(&self) -> parking_lot::MutexGuard<'_, State> {
        if let Some(g) = self.state.try_lock() {
            return g;
        }
        for _ in 0..YIELDS_BEFORE_PARKING {
            std::thread::yield_now();
            if let Some(g) = self.state.try_lock() {
                return g;
            }
        }
        self.state.lock()
    }

    fn allocate(&self, bytes: u64, stream: StreamId) -> Result<DevicePtr, AllocError> {
        if bytes == 0 || bytes > self.capacity {
            return Err(self.refuse(bytes));
        }
        let aligned = align_up(bytes, ALIGNMENT);
        let bucket = bucket_of(aligned);
        let mut st = self.lock_state();
        st.op += 1;
        if !st.deferred.is_empty() {
            st.release_deferred(&self.device, false);
        }
        if st.pools.in_window()
            && let Some(slot) = st.pools.route(stream)
        {
            return self.allocate_in_pool(&mut st, slot, bucket, aligned, bytes, stream);
        }
        let si = st.routes[bucket] as usize;
        // The strategy serves it. Fast path: a waiting cached block of the routed class. Cost:
        // one bin lookup, two list unlinks, a live-table insert and a few counter adds (~700
        // instructions a pair with the lock; callgrind on examples/hotpath.rs). Idle shrinks by
        // the block; nothing else moves. A cache miss goes to the driver without looking again.
        // The rung by mode; the ladder (ladder.rs) is the one place that chooses the steps.
        let attempt = if st.pressure {
            ladder::under_pressure(&mut st, &self.device, si, aligned, stream)
        } else if let Strategy::Caching(c) = &mut st.strategies[si] {
            match c.allocate_cached(&self.device, aligned, stream) {
                Some(grant) => {
                    st.strategy_stats[si].hits += 1;
                    st.seen[si].1 -= grant.block_bytes;
                    st.stats.idle_bytes.sub(grant.block_bytes);
                    Self::record_live(&mut st, grant, si, bucket, bytes, stream, 0);
                    st.maybe_tick(&self.device);
                    return Ok(grant.ptr);
                }
                // The rest of the Routed step: a hole in the slabs, else a new cached block.
                None => ladder::cache_miss(&mut st, &self.device, si, aligned, stream),
            }
        } else {
            ladder::routed(&mut st, &self.device, si, aligned, stream)
        };
        // Only the routed strategy changed, unless placement under pressure or recovery ran,
        // or another strategy served it (the strand guard's refusal: the routed one may have
        // given idle handles back before refusing).
        let mut one_touched = !st.pressure;
        let grant = match attempt {
            Ok(found) => found,
            Err(e) => {
                one_touched = false;
                self.allocate_after_error(&mut st, si, aligned, bytes, stream, e)?
            }
        };
        let (grant, served) = grant;
        one_touched &= served == si;
        let si = served;
        let ss = &mut st.strategy_stats[si];
        if grant.hit {
            ss.hits += 1;
        } else {
            ss.misses += 1;
        }
        Self::record_live(&mut st, grant, si, bucket, bytes, stream, 0);
        if !grant.hit {
            if let Some(e) = st.engine.as_deref_mut() {
                e.on_miss(bucket);
            }
            st.resample(&self.device);
        }
        if one_touched && grant.hit {
            st.refresh_one(si);
        } else {
            st.refresh();
        }
        st.maybe_tick(&self.device);
        Ok(grant.ptr)
    }

    /// Records a granted block as live: the live table, the engine's class statistics and the
    /// live counters (every allocation, fast path or not).
    #[inline(always)]
    fn record_live(st: &mut State, grant: Grant, si: usize, bucket: usize, bytes: u64, stream: StreamId, pool: u16) {
        let op = st.op;
        st.live.insert(
            grant.ptr,
            Live {
                requested: bytes,
                born: op,
                block: grant.block_bytes,
                stream,
                strategy: si as u8,
                bucket: bucket as u8,
                recorded: false,
                pool,
                meta: grant.meta,
            },
        );
        if let Some(e) = st.engine.as_deref_mut() {
            e.on_alloc(bucket, bytes, op);
        }
        st.stats.live_bytes.add(bytes);
        st.stats.live_blocks.add(1);
        st.stats.rounding_bytes += grant.block_bytes - bytes;
    }

    fn deallocate(&self, ptr: DevicePtr, stream: StreamId) -> Result<(), AllocError> {
        let mut st = self.lock_state();
        let Some(live) = st.live.get(ptr).copied() else {
            return Err(AllocError::UnknownPointer { ptr });
        };
        if live.stream != stream {
            return Err(AllocError::StreamMismatch {
                ptr,
                allocated_on: live.stream,
                freed_on: stream,
            });
        }
        st.live.remove(ptr);
        st.op += 1;
        if live.recorded {
            st.defer(&self.device, ptr, live);
            st.release_deferred(&self.device, false);
        } else {
            Self::release_block(&mut st, &self.device, ptr, live);
        }
        if st.below_headroom {
            Self::return_idle_under_headroom(&mut st, &self.device);
        }
        st.maybe_tick(&self.device);
        Ok(())
    }

    pub(super) fn release_block(st: &mut State, dev: &dyn Device, ptr: DevicePtr, live: Live) {
        if live.pool != 0 || st.pools.in_window() {
            return Self::release_in_pools(st, dev, ptr, live);
        }
        let op = st.op;
        let si = live.strategy as usize;
        if !st.freed_on.note_same(live.stream, op) {
            st.switch_stream(dev, live.stream, op);
        }
        st.strategies[si].deallocate(dev, ptr, live.block, live.meta, live.stream, op);
        Self::count_freed(st, &live);
        st.refresh_one(si);
    }

    /// A live block went back to its strategy or pool: the engine's class statistics and the
    /// live counters (the counterpart of [`record_live`](Self::record_live)).
    #[inline(always)]
    pub(super) fn count_freed(st: &mut State, live: &Live) {
        let op = st.op;
        if let Some(e) = st.engine.as_deref_mut() {
            e.on_free(live.bucket as usize, live.requested, op - live.born, op);
        }
        st.stats.live_bytes.sub(live.requested);
        st.stats.live_blocks.sub(1);
        st.stats.rounding_bytes -= live.block - live.requested;
    }
}

impl Shared {
    /// The statistics, with per-strategy hits and driver calls filled in.
    fn snapshot(&self, st: &State) -> Stats {
        let mut stats = st.stats.clone();
        for (i, (_, s)) in stats.per_strategy.iter_mut().enumerate() {
            *s = st.strategy_stats[i];
        }
        self.device.counts_into(&mut stats);
        stats.releasable_idle_bytes = st.strategies.iter().map(Strategy::releasable_bytes).sum();
        stats.stranded_bytes = st.strategies.iter().map(Strategy::stranded_bytes).sum();
        stats.streams_remembered = st.freed_on.len() as u64;
        stats
    }

    fn report(&self) -> Option<crate::report::TuningReport> {
        let st = self.state.lock();
        let e = st.engine.as_deref()?;
        let stats = self.snapshot(&st);
        let device_stats = self.device.stats();
        Some(crate::report::TuningReport::build(crate::report::ReportInput {
            device: self.device.name(),
            device_total: self.capacity,
            device_driver_ns: device_stats.driver_ns,
            device_ops: device_stats.ops,
            policy: e.policy(),
            stats: &stats,
            operations: st.op,
            headroom: e.headroom_bytes(),
            peak_footprint: e.footprint_peak(),
            pressure_events: e.journal.pressure_events,
            peak_stranded: e.journal.peak_stranded,
            released_by_bounds: e.journal.released_by_bounds
                + st.strategies.iter().map(Strategy::released_over_bound).sum::<u64>(),
            mem_info_samples: e.journal.mem_info_samples,
            classes: e.summaries(&st.routes),
            route_changes: e.journal.route_changes.clone(),
            decisions: e.journal.decisions.clone(),
            timeline: e.journal.timeline.clone(),
        }))
    }
}
