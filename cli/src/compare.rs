//! Strategies side by side on the same traces and simulated device: the engine behind
//! `adaptalloc compare` and the benchmarks.

use std::sync::Arc;

use serde::Serialize;

use crate::peers::{PytorchConf, pytorch};
use crate::trace::{ReplayMetrics, ReplayOptions, ReplayTarget, Trace, replay_with};
use adaptalloc::allocator::{Allocator, AllocatorConfig, StrategyConfig};
use adaptalloc::device::{CostModel, Device, Granularity, SimDevice, TenantAction};
use adaptalloc::policy::Policy;
use adaptalloc::report::{KindTime, by_kind, by_kind_line};
use adaptalloc::size::{ByteSize, GIB, round_up};
use adaptalloc::strategy::{CachingConfig, StrategyKind};

/// The device capacity of a comparison.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Capacity {
    /// The same number of bytes for every trace.
    Bytes(u64),
    /// This many times each trace's peak live bytes, rounded up to the device granularity.
    Factor(f64),
}

impl Default for Capacity {
    /// 80 GiB, an H100-sized device.
    fn default() -> Self {
        Capacity::Bytes(80 * GIB)
    }
}

impl Capacity {
    pub fn bytes_for(self, peak_live: u64, granule: u64) -> u64 {
        match self {
            Capacity::Bytes(b) => b,
            Capacity::Factor(f) => round_up(((peak_live as f64) * f).ceil() as u64, granule).max(granule),
        }
    }
}

/// A named allocator set-up that `compare` can run: ours, or a model of an allocator users
/// run today ([`crate::peers`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Contender {
    /// Every request to the driver.
    Passthrough,
    /// Unbounded caching with no release on out-of-memory: what opt-in caching allocators do.
    Caching,
    /// Block suballocation with default slabs.
    Suballoc,
    /// The policy engine with the built-in default policy (zero configuration).
    Adaptive,
    /// PyTorch's native caching allocator, with [`CompareOptions::pytorch_conf`].
    Pytorch,
    /// The same with `expandable_segments:True`.
    PytorchExpandable,
    /// CUDA's stream-ordered pool, release threshold 0.
    CudaAsync,
    /// CUDA's stream-ordered pool, release threshold at its maximum.
    CudaAsyncRetain,
    /// RAPIDS RMM's `pool_memory_resource`.
    RmmPool,
    /// IREE's caching allocator.
    IreeCaching,
    /// gpu-alloc 0.6 (wgpu's Vulkan allocator; `peers` feature).
    #[cfg(feature = "peers")]
    GpuAlloc,
}

impl Contender {
    /// Ours.
    pub const ALL: [Contender; 4] = [
        Contender::Passthrough,
        Contender::Caching,
        Contender::Suballoc,
        Contender::Adaptive,
    ];
    /// The single fixed strategies (no engine).
    pub const FIXED: [Contender; 3] = [Contender::Passthrough, Contender::Caching, Contender::Suballoc];
    /// The allocators users run today.
    pub const USED: [Contender; 6] = [
        Contender::Pytorch,
        Contender::PytorchExpandable,
        Contender::CudaAsync,
        Contender::CudaAsyncRetain,
        Contender::RmmPool,
        Contender::IreeCaching,
    ];

    /// Peer allocators compiled in only with the `peers` feature.
    #[cfg(feature = "peers")]
    pub const PEERS: [Contender; 1] = [Contender::GpuAlloc];
    #[cfg(not(feature = "peers"))]
    pub const PEERS: [Contender; 0] = [];

    /// Ours, then the allocators users run, then the feature-gated peers.
    pub fn all() -> Vec<Contender> {
        Self::ALL.into_iter().chain(Self::USED).chain(Self::PEERS).collect()
    }

    pub fn name(self) -> &'static str {
        match self {
            Contender::Passthrough => "passthrough",
            Contender::Caching => "caching",
            Contender::Suballoc => "suballoc",
            Contender::Adaptive => "adaptive",
            Contender::Pytorch => "pytorch",
            Contender::PytorchExpandable => "pytorch-expandable",
            Contender::CudaAsync => "cuda-async",
            Contender::CudaAsyncRetain => "cuda-async-retain",
            Contender::RmmPool => "rmm-pool",
            Contender::IreeCaching => "iree-caching",
            #[cfg(feature = "peers")]
            Contender::GpuAlloc => "gpu-alloc",
        }
    }

    pub fn parse(name: &str) -> Option<Self> {
        Self::all().into_iter().find(|c| c.name() == name)
    }

    /// The names `parse` knows, comma-separated (for error messages).
    pub fn known() -> String {
        Self::all().iter().map(|c| c.name()).collect::<Vec<_>>().join(", ")
    }

    /// What a replay drives: [`build`](Contender::build)'s allocator, or the peer model
    /// (`pytorch` with `conf`; `pytorch-expandable` with `conf` and expandable segments).
    pub fn target(self, dev: Arc<dyn Device>, conf: &PytorchConf) -> Box<dyn ReplayTarget> {
        use crate::peers::pools::{CudaAsyncPool, IreeCaching, RmmPool, peer};
        if let Some(alloc) = self.build(dev.clone()) {
            return Box::new(alloc);
        }
        match self {
            Contender::Pytorch => Box::new(pytorch::peer(dev, conf.clone())),
            Contender::PytorchExpandable => Box::new(pytorch::peer(
                dev,
                PytorchConf {
                    expandable_segments: true,
                    ..conf.clone()
                },
            )),
            Contender::CudaAsync => Box::new(peer(dev, CudaAsyncPool::new(0))),
            Contender::CudaAsyncRetain => Box::new(peer(dev, CudaAsyncPool::new(u64::MAX))),
            Contender::RmmPool => Box::new(peer(dev, RmmPool::default())),
            Contender::IreeCaching => Box::new(peer(dev, IreeCaching::default())),
            #[cfg(feature = "peers")]
            Contender::GpuAlloc => Box::new(crate::peers::GpuAllocPeer::new(dev)),
            Contender::Passthrough | Contender::Caching | Contender::Suballoc | Contender::Adaptive => {
                unreachable!("built above")
            }
        }
    }

    /// A fresh adaptalloc allocator of this kind on `dev`; `None` for a peer allocator.
    pub fn build(self, dev: Arc<dyn Device>) -> Option<Allocator> {
        Some(match self {
            Contender::Passthrough => Allocator::new(dev, AllocatorConfig::new(StrategyConfig::Passthrough)),
            Contender::Caching => Allocator::new(
                dev,
                AllocatorConfig {
                    strategy: StrategyConfig::Caching(CachingConfig {
                        max_idle_bytes: None,
                        ..Default::default()
                    }),
                    release_on_oom: false,
                },
            ),
            Contender::Suballoc => Allocator::new(
                dev,
                AllocatorConfig::new(StrategyConfig::default_for(StrategyKind::Suballoc)),
            ),
            Contender::Adaptive => Allocator::with_policy(dev, Policy::default()),
            _ => return None,
        })
    }
}

/// One strategy on one trace.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct StrategyResult {
    pub strategy: String,
    pub completed: bool,
    pub failed_allocs: u64,
    /// Physical allocations (cuMemAlloc, and cuMemCreate once per handle).
    pub driver_allocs: u64,
    /// Physical frees (cuMemFree, and cuMemRelease once per handle).
    pub driver_frees: u64,
    /// Every driver call charged, of every kind: the sum of `driver_by_kind`'s calls.
    pub driver_calls: u64,
    pub modeled_driver_ns: u64,
    /// With `--repeat` 2 or more: the first pass's modelled driver time, the mean per pass
    /// over the later half of the passes (the steady state), and the warm-up (the first pass
    /// plus the one-off costs of the passes before that half).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_pass_ns: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub steady_pass_ns: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub warmup_ns: Option<u64>,
    /// Modelled driver calls and time by kind of operation (the kinds with calls).
    pub driver_by_kind: Vec<KindTime>,
    pub peak_reserved_bytes: u64,
    pub tenant_failures: u64,
    pub wall_ns: u64,
}

/// Every strategy on one trace.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct TraceResult {
    pub trace: String,
    pub events: u64,
    pub peak_live_bytes: u64,
    /// Present when the capacity differs per trace (a factor).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capacity_bytes: Option<u64>,
    pub results: Vec<StrategyResult>,
}

/// A whole comparison.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Comparison {
    /// The capacity of every device, or None when it differs per trace.
    pub capacity_bytes: Option<u64>,
    pub traces: Vec<TraceResult>,
}

/// A co-tenant: takes `bytes` when `start` of the events have been replayed and frees them at
/// `end` (fractions of all events, repeats included). Written `2GiB@0.3..0.6`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TenantSpec {
    pub bytes: u64,
    pub start: f64,
    pub end: f64,
}

impl std::str::FromStr for TenantSpec {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let bad = |why: &str| format!("tenant {s:?}: {why}; write SIZE@START..END, e.g. 2GiB@0.3..0.6");
        let (size, range) = s.split_once('@').ok_or_else(|| bad("no '@'"))?;
        let bytes = size.parse::<ByteSize>().map_err(|e| bad(&e.to_string()))?.0;
        let (start, end) = fraction_range(range).map_err(bad)?;
        Ok(TenantSpec { bytes, start, end })
    }
}

/// `START..END` as fractions of a trace's events, with 0 <= START <= END <= 1.
fn fraction_range(range: &str) -> Result<(f64, f64), &'static str> {
    let (a, b) = range.split_once("..").ok_or("no '..' in the range")?;
    let start: f64 = a.trim().parse().map_err(|_| "the start is not a number")?;
    let end: f64 = b.trim().parse().map_err(|_| "the end is not a number")?;
    if !(0.0..=1.0).contains(&start) || !(0.0..=1.0).contains(&end) || start > end {
        return Err("need 0 <= START <= END <= 1");
    }
    Ok((start, end))
}

/// A part of each trace to replay instead of the whole (`--window 0.2..0.6`: from 20% of its
/// events to 60%), as [`Trace::window`](crate::trace::Trace::window) cuts it: a recording of
/// that part of the run, its peak somewhere else.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Window {
    pub start: f64,
    pub end: f64,
}

impl std::str::FromStr for Window {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let bad = |why: &str| format!("window {s:?}: {why}; write START..END as fractions, e.g. 0.2..0.6");
        let (start, end) = fraction_range(s).map_err(bad)?;
        if start == end {
            return Err(bad("the window is empty"));
        }
        Ok(Window { start, end })
    }
}

impl TenantSpec {
    /// The SimDevice script for a replay of `events` events in all.
    pub fn script(&self, events: u64) -> Vec<TenantAction> {
        let at = |f: f64| (events as f64 * f) as u64;
        vec![
            TenantAction::Take {
                at: at(self.start),
                tag: 1,
                bytes: self.bytes,
            },
            TenantAction::Release {
                at: at(self.end),
                tag: 1,
            },
        ]
    }
}

/// How to compare.
#[derive(Clone, Debug)]
pub struct CompareOptions {
    pub contenders: Vec<Contender>,
    pub capacity: Capacity,
    pub repeat: u32,
    pub cost_model: CostModel,
    /// A co-tenant taking memory mid-run.
    pub tenant: Option<TenantSpec>,
    /// The `pytorch` peer's `PYTORCH_CUDA_ALLOC_CONF` (PyTorch's defaults when empty).
    pub pytorch_conf: PytorchConf,
    /// A synchronization point every this many events (besides the end of each pass).
    pub sync_every: Option<u64>,
    /// The `adaptive` contender's policy (the default policy when None).
    pub policy: Option<Policy>,
}

impl Default for CompareOptions {
    fn default() -> Self {
        CompareOptions {
            contenders: Contender::all(),
            capacity: Capacity::default(),
            repeat: 1,
            cost_model: CostModel::default(),
            tenant: None,
            pytorch_conf: PytorchConf::default(),
            sync_every: None,
            policy: None,
        }
    }
}

impl CompareOptions {
    /// How each trace is replayed: the repeats and synchronization points.
    pub fn replay_options(&self) -> ReplayOptions {
        ReplayOptions {
            repeat: self.repeat,
            sync_every: self.sync_every,
        }
    }

    /// The events a replay of `trace` with these options goes through: its events times the
    /// passes.
    pub fn events(&self, trace: &Trace) -> u64 {
        trace.events.len() as u64 * u64::from(self.repeat.max(1))
    }

    /// A fresh SimDevice of `capacity` bytes for replaying `trace`, priced by the options' cost
    /// model, with their co-tenant scripted over the replay's events: the one place a replay's
    /// device is built.
    pub fn sim_device(&self, trace: &Trace, capacity: u64) -> Arc<SimDevice> {
        let events = self.events(trace);
        Arc::new(
            SimDevice::builder()
                .capacity(capacity)
                .cost_model(self.cost_model.clone())
                .tenants(self.tenant.map(|t| t.script(events)).unwrap_or_default())
                .build(),
        )
    }
}

/// A fresh SimDevice of `capacity` bytes ([`CompareOptions::sim_device`]) and a `contender`
/// allocator on it (the options' policy for `adaptive`).
fn setup(
    trace: &Trace,
    contender: Contender,
    capacity: u64,
    opts: &CompareOptions,
) -> (Arc<SimDevice>, Box<dyn ReplayTarget>) {
    let dev = opts.sim_device(trace, capacity);
    let alloc: Box<dyn ReplayTarget> = match (&opts.policy, contender) {
        (Some(policy), Contender::Adaptive) => Box::new(Allocator::with_policy(dev.clone(), policy.clone())),
        _ => contender.target(dev.clone() as Arc<dyn Device>, &opts.pytorch_conf),
    };
    (dev, alloc)
}

/// Replays `trace` once per pass through `contender` (the options' policy for `adaptive`) on
/// a fresh SimDevice of `capacity` bytes ([`CompareOptions::sim_device`]); returns the
/// metrics and the device (its co-tenant's refusals).
pub fn replay_one(
    trace: &Trace,
    contender: Contender,
    capacity: u64,
    opts: &CompareOptions,
) -> (ReplayMetrics, Arc<SimDevice>) {
    let (dev, alloc) = setup(trace, contender, capacity, opts);
    let m = replay_with(trace, &*alloc, opts.replay_options(), |i| dev.advance_clock(i));
    (m, dev)
}

/// Runs one contender over one trace on a fresh SimDevice of `capacity` bytes.
pub fn run_one(trace: &Trace, contender: Contender, capacity: u64, opts: &CompareOptions) -> StrategyResult {
    let (m, dev) = replay_one(trace, contender, capacity, opts);
    StrategyResult {
        strategy: contender.name().into(),
        completed: m.completed(),
        failed_allocs: m.failed_allocs,
        driver_allocs: m.driver_allocs,
        driver_frees: m.driver_frees,
        driver_calls: m.driver_calls,
        modeled_driver_ns: m.modeled_driver_ns,
        first_pass_ns: (opts.repeat >= 2).then_some(m.passes.first_pass_ns),
        steady_pass_ns: (opts.repeat >= 2).then_some(m.passes.steady_pass_ns),
        warmup_ns: (opts.repeat >= 2).then_some(m.passes.warmup_ns),
        driver_by_kind: by_kind(&m.driver_ops),
        peak_reserved_bytes: m.peak_reserved_bytes,
        tenant_failures: dev.tenant_failures(),
        wall_ns: m.wall_ns,
    }
}

/// Runs every contender over every trace.
pub fn compare(traces: &[Trace], opts: &CompareOptions) -> Comparison {
    let granule = adaptalloc::device::Granularity::default().large_granule;
    let per_trace = matches!(opts.capacity, Capacity::Factor(_));
    let traces = traces
        .iter()
        .map(|t| {
            let peak = t.peak_live_bytes();
            let capacity = opts.capacity.bytes_for(peak, granule);
            TraceResult {
                trace: t.name.clone(),
                events: opts.events(t),
                peak_live_bytes: peak,
                capacity_bytes: per_trace.then_some(capacity),
                results: opts.contenders.iter().map(|&c| run_one(t, c, capacity, opts)).collect(),
            }
        })
        .collect();
    let capacity_bytes = match opts.capacity {
        Capacity::Bytes(b) => Some(b),
        Capacity::Factor(_) => None,
    };
    Comparison { capacity_bytes, traces }
}

impl Comparison {
    /// The device size of trace `t` ("80GiB"): its own with a capacity factor, else the shared one.
    fn capacity_text(&self, t: &TraceResult) -> String {
        t.capacity_bytes
            .or(self.capacity_bytes)
            .map(|c| ByteSize(c).to_string())
            .unwrap_or_default()
    }

    /// A Markdown table per trace.
    pub fn to_markdown(&self) -> String {
        let mut out = String::new();
        for t in &self.traces {
            let cap = self.capacity_text(t);
            out += &format!(
                "### {}\n\n{} events, peak live {}, device {}\n\n",
                t.trace,
                t.events,
                ByteSize(t.peak_live_bytes),
                cap
            );
            let passes = t.results.iter().any(|r| r.steady_pass_ns.is_some());
            out += "| strategy | completed | failed | driver calls | physical allocs / frees | driver time (ms) |";
            out += if passes {
                " first pass (ms) | warm-up (ms) | steady, per pass (ms) |"
            } else {
                ""
            };
            out += " dearest kinds | peak reserved | reserved / live | tenant failures |\n";
            out += &"|---".repeat(if passes { 12 } else { 9 });
            out += "|\n";
            for r in &t.results {
                let pass_cells = if passes {
                    let ms = |v: Option<u64>| format!(" {:.1} |", v.unwrap_or(0) as f64 / 1e6);
                    ms(r.first_pass_ns) + &ms(r.warmup_ns) + &ms(r.steady_pass_ns)
                } else {
                    String::new()
                };
                out += &format!(
                    "| {} | {} | {} | {} | {} / {} | {:.1} |{pass_cells} {} | {} | {:.3} | {} |\n",
                    r.strategy,
                    if r.completed { "yes" } else { "no" },
                    r.failed_allocs,
                    r.driver_calls,
                    r.driver_allocs,
                    r.driver_frees,
                    r.modeled_driver_ns as f64 / 1e6,
                    by_kind_line(&r.driver_by_kind, 3),
                    ByteSize(r.peak_reserved_bytes),
                    r.peak_reserved_bytes as f64 / t.peak_live_bytes.max(1) as f64,
                    r.tenant_failures
                );
            }
            out += "\n";
        }
        out
    }
}

impl std::fmt::Display for Comparison {
    /// A plain-text table: one block per trace, one row per strategy, ratios to passthrough.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for t in &self.traces {
            let cap = self.capacity_text(t);
            writeln!(
                f,
                "{}: {} events, peak live {}, device {}",
                t.trace,
                t.events,
                ByteSize(t.peak_live_bytes),
                cap
            )?;
            let passes = t.results.iter().any(|r| r.steady_pass_ns.is_some());
            let pass_head = if passes {
                format!(" {:>12} {:>12}", "first pass", "steady/pass")
            } else {
                String::new()
            };
            writeln!(
                f,
                "  {:<18} {:>6} {:>10} {:>9} {:>12}{pass_head} {:>11} {:>14}",
                "strategy", "failed", "drv calls", "vs pass", "driver time", "reserved", "reserved/live"
            )?;
            let base = t.results.iter().find(|r| r.strategy == "passthrough");
            for r in &t.results {
                let ratio = base
                    .map(|b| format!("{:.1}%", 100.0 * r.driver_calls as f64 / b.driver_calls.max(1) as f64))
                    .unwrap_or_else(|| "-".into());
                let pass_cells = if passes {
                    let ms = |v: Option<u64>| format!(" {:>10.1}ms", v.unwrap_or(0) as f64 / 1e6);
                    ms(r.first_pass_ns) + &ms(r.steady_pass_ns)
                } else {
                    String::new()
                };
                writeln!(
                    f,
                    "  {:<18} {:>6} {:>10} {:>9} {:>10.1}ms{pass_cells} {:>11} {:>14.3}",
                    r.strategy,
                    r.failed_allocs,
                    r.driver_calls,
                    ratio,
                    r.modeled_driver_ns as f64 / 1e6,
                    ByteSize(r.peak_reserved_bytes).to_string(),
                    r.peak_reserved_bytes as f64 / t.peak_live_bytes.max(1) as f64
                )?;
            }
            writeln!(f)?;
        }
        Ok(())
    }
}

/// Live, reserved and idle bytes at one point of a replay.
#[derive(Clone, Copy, Debug, Serialize, PartialEq, Eq)]
pub struct MemoryPoint {
    pub event: u64,
    pub live_bytes: u64,
    pub reserved_bytes: u64,
    pub idle_bytes: u64,
}

/// One contender's replay for a plot: memory about every `points`-th of the way, the events
/// where an allocation failed, and its totals.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Timeline {
    pub points: Vec<MemoryPoint>,
    /// Events (indices, all passes counted) whose allocation the allocator refused.
    pub failed_at: Vec<u64>,
    pub driver_calls: u64,
    pub modeled_driver_ns: u64,
}

/// A replay target that notes the event of every refused allocation (`now` is set by the
/// replay's per-event callback).
struct MarkFailures<'a> {
    inner: &'a dyn ReplayTarget,
    now: &'a std::cell::Cell<u64>,
    failed_at: std::cell::RefCell<Vec<u64>>,
}

impl ReplayTarget for MarkFailures<'_> {
    fn allocate(&self, bytes: u64, stream: adaptalloc::strategy::StreamId) -> Option<adaptalloc::device::DevicePtr> {
        let r = self.inner.allocate(bytes, stream);
        if r.is_none() {
            self.failed_at.borrow_mut().push(self.now.get());
        }
        r
    }
    fn deallocate(&self, ptr: adaptalloc::device::DevicePtr, stream: adaptalloc::strategy::StreamId) {
        self.inner.deallocate(ptr, stream)
    }
    fn synchronize(&self) {
        self.inner.synchronize()
    }
    fn counters(&self) -> crate::trace::TargetCounters {
        self.inner.counters()
    }
    fn reset_peaks(&self) {
        self.inner.reset_peaks()
    }
    fn device(&self) -> &Arc<dyn Device> {
        self.inner.device()
    }
}

/// Replays `trace` through `contender` like [`run_one`], sampling memory about `points` times.
pub fn timeline(trace: &Trace, contender: Contender, capacity: u64, opts: &CompareOptions, points: u64) -> Timeline {
    let every = (opts.events(trace) / points.max(1)).max(1);
    let (dev, alloc) = setup(trace, contender, capacity, opts);
    let now = std::cell::Cell::new(0);
    let marked = MarkFailures {
        inner: &*alloc,
        now: &now,
        failed_at: Default::default(),
    };
    let mut out = Vec::with_capacity(points as usize + 1);
    let m = replay_with(trace, &marked, opts.replay_options(), |i| {
        now.set(i);
        dev.advance_clock(i);
        if i % every == 0 {
            let s = alloc.counters();
            out.push(MemoryPoint {
                event: i,
                live_bytes: s.live_bytes,
                reserved_bytes: s.reserved_bytes,
                idle_bytes: s.idle_bytes,
            });
        }
    });
    Timeline {
        points: out,
        failed_at: marked.failed_at.into_inner(),
        driver_calls: m.driver_calls,
        modeled_driver_ns: m.modeled_driver_ns,
    }
}

/// The smallest capacity on which passthrough completes `trace` on a SimDevice of granularity
/// `g`: the most device memory its live blocks ever consume at once. Exact, no search.
pub fn passthrough_min_capacity(trace: &Trace, g: Granularity) -> u64 {
    trace.peak_by(|size| g.consumed(adaptalloc::size::align_up(size, adaptalloc::size::ALIGNMENT)))
}

/// The smallest capacity, to 0.5%, on which `contender` completes `trace`, searched up to 64x
/// its peak live bytes (64 MiB at least): what `sweep` reports. None when it fails even there.
pub fn smallest_capacity(trace: &Trace, contender: Contender, opts: &CompareOptions) -> Option<u64> {
    let most = trace.peak_live_bytes().saturating_mul(64).max(64 << 20);
    min_capacity(trace, contender, opts, 0.005, most)
}

/// The smallest capacity (within `tolerance`, e.g. 0.005) on which `contender` completes
/// `trace`, by binary search over replays; None when it fails even at `max_bytes`.
pub fn min_capacity(
    trace: &Trace,
    contender: Contender,
    opts: &CompareOptions,
    tolerance: f64,
    max_bytes: u64,
) -> Option<u64> {
    let granule = Granularity::default().large_granule;
    let completes = |cap: u64| run_one(trace, contender, cap, opts).completed;
    let mut lo = trace.peak_live_bytes().max(1);
    if completes(lo) {
        return Some(lo);
    }
    let mut hi = round_up(lo.saturating_mul(2), granule).min(max_bytes.max(lo));
    while !completes(hi) {
        if hi >= max_bytes {
            return None;
        }
        lo = hi;
        hi = hi.saturating_mul(2).min(max_bytes);
    }
    while (hi - lo) as f64 > tolerance * lo as f64 && hi - lo > 256 {
        let mid = lo + (hi - lo) / 2;
        if completes(mid) { hi = mid } else { lo = mid }
    }
    Some(hi)
}
