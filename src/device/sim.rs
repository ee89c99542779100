//! `SimDevice`: a simulated GPU with a capacity, a granularity model, a cost model for driver
//! calls, co-tenants that take and return memory, fault injection and a leak check.

use std::collections::HashMap;

use parking_lot::Mutex;

use super::{CostModel, Device, DevicePtr, DeviceStats, MemInfo, VirtualMemory};
use crate::error::DeviceError;
use crate::rng::SplitMix64;
use crate::size::{ByteSize, GIB, MIB, align_up, round_up};

mod vmm;

/// What one driver allocation really consumes on the device.
///
/// Default, modelled on the CUDA driver: allocations of at least `large_threshold` (1 MiB) are
/// backed by whole 2 MiB pages, so they consume `bytes` rounded up to 2 MiB; smaller ones are
/// packed by the driver into shared pages and consume `bytes` rounded up to 512 B.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Granularity {
    /// Allocations of at least this many bytes consume whole large granules.
    pub large_threshold: u64,
    /// The large granule (a CUDA page: 2 MiB).
    pub large_granule: u64,
    /// The step smaller allocations consume in shared pages.
    pub small_granule: u64,
}

impl Default for Granularity {
    fn default() -> Self {
        Granularity {
            large_threshold: MIB,
            large_granule: 2 * MIB,
            small_granule: 512,
        }
    }
}

impl Granularity {
    /// Bytes consumed on the device by a driver allocation of `bytes`.
    pub fn consumed(&self, bytes: u64) -> u64 {
        if bytes >= self.large_threshold {
            round_up(bytes, self.large_granule)
        } else {
            round_up(bytes, self.small_granule)
        }
    }
}

/// Driver failures to inject: the listed driver allocations (1-based), and/or a seeded rate.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FaultPlan {
    /// Fail exactly these driver allocations (1 = the first one ever attempted).
    pub fail_nth: Vec<u64>,
    /// Fail each driver allocation with this probability (0.0 = never).
    pub rate: f64,
    /// Seed of the rate's random sequence; the same seed fails the same calls.
    pub seed: u64,
}

/// A co-tenant's scripted step: at clock `at` (see [`SimDevice::advance_clock`]) it takes
/// `bytes` under `tag`, or returns what it holds under `tag`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TenantAction {
    /// Takes `bytes` at clock `at`, under `tag`.
    Take {
        /// When.
        at: u64,
        /// Whose.
        tag: u32,
        /// How much.
        bytes: u64,
    },
    /// Returns everything held under `tag` at clock `at`.
    Release {
        /// When.
        at: u64,
        /// Whose.
        tag: u32,
    },
}

impl TenantAction {
    fn at(&self) -> u64 {
        match self {
            TenantAction::Take { at, .. } | TenantAction::Release { at, .. } => *at,
        }
    }
}

/// What was still allocated from the device: by the allocator (driver blocks) and by tenants.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LeakReport {
    /// Driver allocations and address reservations still live.
    pub blocks: u64,
    /// Their bytes.
    pub bytes: u64,
}

#[derive(Debug)]
struct State {
    /// Consumed bytes of every live driver allocation and tenant holding.
    used: u64,
    /// Next reservation starts here (going up). Addresses are never reused, so none overlap.
    cursor: u64,
    live: HashMap<DevicePtr, (u64, u64)>,
    stats: DeviceStats,
    attempts: u64,
    rng: SplitMix64,
    tenant_held: HashMap<u32, u64>,
    tenant_failures: u64,
    script: Vec<TenantAction>,
    script_pos: usize,
    /// Address reservations (virtual memory): base -> (size, mapped bytes).
    reservations: std::collections::BTreeMap<DevicePtr, (u64, u64)>,
    /// Mapped pages (their addresses), so a double map, an unmap of an unmapped page and a
    /// block handed out over unmapped memory are caught; each with its physical page, named by
    /// the address it was first mapped at (a page mapped again by `map_alias` names another's).
    mapped_pages: std::collections::BTreeMap<DevicePtr, DevicePtr>,
    /// Mappings of each physical page: its memory goes back when the last one is unmapped.
    phys_refs: HashMap<DevicePtr, u32>,
    /// The next name for a physical page whose first mapping was unmapped while second ones
    /// keep it: above every address, so that a page mapped later at that address is another.
    orphan_name: u64,
    /// Physical handles mapped at their first address: start -> bytes (a page, or more when
    /// mapped by [`VirtualMemory::map_handles`]); unmapped whole only.
    handles: std::collections::BTreeMap<DevicePtr, u64>,
    /// Second mappings of handles ([`VirtualMemory::map_alias`]): start -> the handle's bytes;
    /// unmapped whole only, as first mappings.
    alias_handles: std::collections::BTreeMap<DevicePtr, u64>,
    /// Next driver allocation ends here: driver allocations go down from the top of the
    /// address range, as cudaMalloc's addresses mostly do; reservations go up from it.
    alloc_top: u64,
    /// What tests wrote to physical pages ([`SimDevice::write_stamp`]), by the page's name: a
    /// copy carries it, and it goes with the page's memory.
    stamps: HashMap<DevicePtr, u64>,
}

/// A simulated GPU. Thread-safe; every call takes one short lock.
#[derive(Debug)]
pub struct SimDevice {
    capacity: u64,
    granularity: Granularity,
    cost: CostModel,
    faults: FaultPlan,
    vmm: bool,
    /// Operations after which work queued on a stream has completed ([`Device::stream_done`]).
    stream_lag: u64,
    /// Calls of [`VirtualMemory::quiesce`].
    quiesces: std::sync::atomic::AtomicU64,
    /// Streams being captured into a CUDA graph (sim_capture.rs).
    pub(super) captures: super::sim_capture::Captures,
    state: Mutex<State>,
}

/// Builds a [`SimDevice`]. Defaults: 16 GiB, CUDA-like granularity, the default cost model,
/// no faults, no co-tenants.
#[derive(Clone, Debug)]
pub struct SimDeviceBuilder {
    capacity: u64,
    granularity: Granularity,
    cost: CostModel,
    faults: FaultPlan,
    script: Vec<TenantAction>,
    vmm: bool,
    stream_lag: u64,
}

impl SimDeviceBuilder {
    /// In-flight work: what a stream has queued completes this many allocator operations after
    /// its last free (default 0: at once, the device runs no kernels). `u64::MAX` models streams
    /// that never finish on their own, so that memory freed on them serves other streams only
    /// after a wait ([`Device::stream_wait`]) or the caller's `synchronize_stream`.
    pub fn stream_lag(mut self, ops: u64) -> Self {
        self.stream_lag = ops;
        self
    }

    /// Whether the device offers virtual memory management ([`VirtualMemory`]); default true,
    /// as CUDA does since 10.2.
    pub fn vmm(mut self, on: bool) -> Self {
        self.vmm = on;
        self
    }
    /// The device's memory in all.
    pub fn capacity(mut self, bytes: u64) -> Self {
        self.capacity = bytes;
        self
    }
    /// How driver allocations consume memory.
    pub fn granularity(mut self, g: Granularity) -> Self {
        self.granularity = g;
        self
    }
    /// The prices of driver calls.
    pub fn cost_model(mut self, cost: CostModel) -> Self {
        self.cost = cost;
        self
    }
    /// Driver failures to inject.
    pub fn faults(mut self, faults: FaultPlan) -> Self {
        self.faults = faults;
        self
    }
    /// Co-tenant steps, applied by [`SimDevice::advance_clock`] in order of `at`.
    pub fn tenants(mut self, mut script: Vec<TenantAction>) -> Self {
        script.sort_by_key(TenantAction::at);
        self.script = script;
        self
    }
    /// The device.
    pub fn build(self) -> SimDevice {
        let align = self.granularity.large_granule.max(crate::size::ALIGNMENT);
        SimDevice {
            capacity: self.capacity,
            granularity: self.granularity,
            cost: self.cost,
            state: Mutex::new(State {
                used: 0,
                cursor: align_up(0x7f00_0000_0000, align),
                live: HashMap::new(),
                stats: DeviceStats::default(),
                attempts: 0,
                rng: SplitMix64(self.faults.seed),
                tenant_held: HashMap::new(),
                tenant_failures: 0,
                script: self.script,
                script_pos: 0,
                reservations: std::collections::BTreeMap::new(),
                mapped_pages: std::collections::BTreeMap::new(),
                phys_refs: HashMap::new(),
                orphan_name: 1 << 63,
                handles: std::collections::BTreeMap::new(),
                alias_handles: std::collections::BTreeMap::new(),
                alloc_top: align_up(0x7f00_0000_0000, align),
                stamps: HashMap::new(),
            }),
            faults: self.faults,
            vmm: self.vmm,
            stream_lag: self.stream_lag,
            quiesces: std::sync::atomic::AtomicU64::new(0),
            captures: Default::default(),
        }
    }
}

impl SimDevice {
    /// A builder with the defaults (16 GiB, CUDA-like granularity, the default cost model).
    pub fn builder() -> SimDeviceBuilder {
        SimDeviceBuilder {
            capacity: 16 * GIB,
            granularity: Granularity::default(),
            cost: CostModel::default(),
            faults: FaultPlan::default(),
            script: Vec::new(),
            vmm: true,
            stream_lag: 0,
        }
    }

    /// A device of `capacity` bytes with every other setting at its default.
    pub fn new(capacity: u64) -> Self {
        Self::builder().capacity(capacity).build()
    }

    /// Calls of [`VirtualMemory::quiesce`] so far (synchronizations before unmapping).
    pub fn quiesces(&self) -> u64 {
        self.quiesces.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The device's memory in all.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// How driver allocations consume memory.
    pub fn granularity_model(&self) -> Granularity {
        self.granularity
    }

    /// The prices it charges.
    pub fn cost_model(&self) -> &CostModel {
        &self.cost
    }

    /// What is still allocated by callers of [`Device::allocate`] (tenants not counted).
    pub fn leak_report(&self) -> LeakReport {
        let s = self.state.lock();
        LeakReport {
            blocks: (s.live.len() + s.reservations.len()) as u64,
            bytes: s.live.values().map(|v| v.0).sum::<u64>() + s.reservations.values().map(|r| r.1).sum::<u64>(),
        }
    }

    /// Bytes of device memory in use, tenants included, at their consumed (rounded) size.
    pub fn used_bytes(&self) -> u64 {
        self.state.lock().used
    }

    /// A co-tenant takes `bytes` now under `tag` (adding to what it holds). Fails, and counts a
    /// tenant failure, when the device has too little free memory.
    pub fn tenant_take(&self, tag: u32, bytes: u64) -> Result<(), DeviceError> {
        let mut s = self.state.lock();
        self.tenant_take_locked(&mut s, tag, bytes)
    }

    /// A co-tenant returns everything it holds under `tag`; returns the bytes released.
    pub fn tenant_release(&self, tag: u32) -> u64 {
        let mut s = self.state.lock();
        let held = s.tenant_held.remove(&tag).unwrap_or(0);
        s.used -= held;
        held
    }

    /// Tenant requests the device refused so far.
    pub fn tenant_failures(&self) -> u64 {
        self.state.lock().tenant_failures
    }

    /// Bytes co-tenants hold now.
    pub fn tenant_bytes(&self) -> u64 {
        self.state.lock().tenant_held.values().sum()
    }

    /// Moves the scripted clock to `now`, applying every tenant step with `at <= now`.
    /// Replays call it with the index of the event about to run.
    pub fn advance_clock(&self, now: u64) {
        let mut s = self.state.lock();
        while s.script_pos < s.script.len() && s.script[s.script_pos].at() <= now {
            let action = s.script[s.script_pos].clone();
            s.script_pos += 1;
            match action {
                TenantAction::Take { tag, bytes, .. } => {
                    let _ = self.tenant_take_locked(&mut s, tag, bytes);
                }
                TenantAction::Release { tag, .. } => {
                    let held = s.tenant_held.remove(&tag).unwrap_or(0);
                    s.used -= held;
                }
            }
        }
    }

    fn tenant_take_locked(&self, s: &mut State, tag: u32, bytes: u64) -> Result<(), DeviceError> {
        let consumed = self.granularity.consumed(bytes);
        if consumed > self.capacity - s.used {
            s.tenant_failures += 1;
            return Err(DeviceError::OutOfMemory {
                requested: ByteSize(bytes),
                free: ByteSize(self.capacity - s.used),
                total: ByteSize(self.capacity),
            });
        }
        s.used += consumed;
        *s.tenant_held.entry(tag).or_insert(0) += consumed;
        Ok(())
    }

    /// Counts a driver allocation attempt of `bytes` (consuming `consumed`; the caller charges
    /// its price), and refuses it on an injected fault or when it does not fit.
    fn admit(&self, s: &mut State, bytes: u64, consumed: u64) -> Result<(), DeviceError> {
        s.attempts += 1;
        if self.inject_fault(s) {
            s.stats.failed_allocs += 1;
            return Err(DeviceError::InjectedFault {
                requested: ByteSize(bytes),
                nth: s.attempts,
            });
        }
        if consumed > self.capacity - s.used {
            s.stats.failed_allocs += 1;
            return Err(DeviceError::OutOfMemory {
                requested: ByteSize(bytes),
                free: ByteSize(self.capacity - s.used),
                total: ByteSize(self.capacity),
            });
        }
        Ok(())
    }

    fn inject_fault(&self, s: &mut State) -> bool {
        if self.faults.fail_nth.contains(&s.attempts) {
            return true;
        }
        if self.faults.rate > 0.0 {
            return s.rng.unit() < self.faults.rate;
        }
        false
    }
}

impl Device for SimDevice {
    fn allocate(&self, bytes: u64) -> Result<DevicePtr, DeviceError> {
        let consumed = self.granularity.consumed(bytes.max(1));
        let mut s = self.state.lock();
        s.stats.ops.alloc.charge(1, self.cost.alloc_ns(bytes));
        self.admit(&mut s, bytes, consumed)?;
        let align = if bytes >= self.granularity.large_threshold {
            self.granularity.large_granule.max(crate::size::ALIGNMENT)
        } else {
            crate::size::ALIGNMENT
        };
        // Below every earlier driver allocation (addresses are never reused, so none overlap).
        let ptr = (s.alloc_top - consumed) / align * align;
        s.alloc_top = ptr;
        s.used += consumed;
        s.live.insert(ptr, (bytes, consumed));
        s.stats.driver_allocs += 1;
        s.stats.allocated_bytes += bytes;
        Ok(ptr)
    }

    fn free(&self, ptr: DevicePtr) -> Result<(), DeviceError> {
        self.captures.check("free");
        let mut s = self.state.lock();
        let Some((bytes, consumed)) = s.live.remove(&ptr) else {
            return Err(DeviceError::UnknownPointer { ptr });
        };
        s.used -= consumed;
        s.stats.driver_frees += 1;
        s.stats.allocated_bytes -= bytes;
        s.stats.ops.free.charge(1, self.cost.free.ns(bytes));
        s.stats.ops.free_sync.charge(1, self.cost.free_sync_ns);
        Ok(())
    }

    fn mem_info(&self) -> Result<MemInfo, DeviceError> {
        let mut s = self.state.lock();
        s.stats.mem_info_calls += 1;
        s.stats.ops.mem_info.charge(1, self.cost.mem_info_ns);
        Ok(MemInfo {
            free: self.capacity - s.used,
            total: self.capacity,
        })
    }

    fn granularity(&self) -> u64 {
        self.granularity.large_granule
    }

    fn footprint_model(&self) -> Granularity {
        self.granularity
    }

    fn stats(&self) -> DeviceStats {
        let mut stats = self.state.lock().stats;
        stats.driver_ns = stats.ops.total_ns();
        stats
    }

    fn charge_pool_call(&self, call: super::PoolCall) {
        let mut s = self.state.lock();
        match call {
            super::PoolCall::Alloc => s.stats.ops.async_alloc.charge(1, self.cost.async_alloc_ns),
            super::PoolCall::Free => s.stats.ops.async_free.charge(1, self.cost.async_free_ns),
        }
    }

    fn vmm(&self) -> Option<&dyn VirtualMemory> {
        if self.vmm { Some(self) } else { None }
    }

    /// A capturing stream is "not done", as CudaDevice answers after `cuStreamIsCapturing`.
    fn stream_done(&self, stream: crate::strategy::StreamId, freed_at: u64, now: u64) -> bool {
        now.saturating_sub(freed_at) >= self.stream_lag && !self.captures.capturing(stream)
    }

    /// Charged at the cost model's price (nothing runs on the simulated device to wait for).
    fn stream_wait(&self, _stream: crate::strategy::StreamId, _freed_at: u64) -> Result<(), DeviceError> {
        self.captures.check("stream_wait");
        let mut s = self.state.lock();
        s.stats.ops.stream_sync.charge(1, self.cost.stream_sync_ns);
        Ok(())
    }

    fn name(&self) -> String {
        format!("SimDevice {}", ByteSize(self.capacity))
    }
}

impl Drop for SimDevice {
    fn drop(&mut self) {
        let leaks = self.leak_report();
        if leaks.blocks > 0 {
            tracing::warn!(
                blocks = leaks.blocks,
                bytes = leaks.bytes,
                "SimDevice dropped with driver allocations still live (leak)"
            );
        }
    }
}
