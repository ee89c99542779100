//! Helpers shared by the integration tests: strategy configurations, an invariant checker, a
//! seeded random sequence, and the location of ../shared/traces.
#![allow(dead_code)]

pub mod stub;

use std::path::PathBuf;
use std::sync::Arc;

use adaptalloc::device::{CostModel, Device, DevicePtr};
use adaptalloc::policy::Policy;
use adaptalloc::size::{MIB, align_up};
use adaptalloc::strategy::{CachingConfig, SlabBacking, SuballocConfig};
use adaptalloc::{Allocator, AllocatorConfig, SimDevice, StrategyConfig};

/// An allocator set-up: one strategy, or the policy engine.
#[derive(Clone, Debug)]
pub enum Setup {
    Strategy(StrategyConfig),
    Policy(Box<Policy>),
}

/// Every set-up the conformance suite runs against: each strategy (suballoc with whole slabs,
/// page-backed slabs and handles shaped to blocks), and the policy engine with its default, a
/// tight policy, and a tight one on handles shaped to blocks.
pub fn all_configs() -> Vec<(&'static str, Setup)> {
    let mut tight = Policy::default();
    tight.bounds.tight_below = adaptalloc::policy::SizeOrFraction::Fraction(1.0);
    tight.routing.interval_ops = 64;
    // Handles shaped to blocks, with a strand budget of nothing: every placement that would
    // pin an idle handle in part gives it back first.
    let mut blocks = tight.clone();
    blocks.suballoc.backing = SlabBacking::Blocks;
    blocks.bounds.strand_share = 0.0;
    vec![
        ("passthrough", Setup::Strategy(StrategyConfig::Passthrough)),
        (
            "caching",
            Setup::Strategy(StrategyConfig::Caching(CachingConfig::default())),
        ),
        (
            "caching-bounded",
            Setup::Strategy(StrategyConfig::Caching(CachingConfig {
                max_idle_bytes: Some(8 * MIB),
                ..Default::default()
            })),
        ),
        (
            "suballoc",
            Setup::Strategy(StrategyConfig::Suballoc(SuballocConfig::default())),
        ),
        (
            "suballoc-keep",
            Setup::Strategy(StrategyConfig::Suballoc(SuballocConfig {
                max_empty_bytes: 64 * MIB,
                ..Default::default()
            })),
        ),
        (
            "suballoc-paged-segregated",
            Setup::Strategy(StrategyConfig::Suballoc(SuballocConfig {
                page_release: true,
                segregate: true,
                max_empty_bytes: 32 * MIB,
                ..Default::default()
            })),
        ),
        (
            "suballoc-blocks",
            Setup::Strategy(StrategyConfig::Suballoc(SuballocConfig {
                page_release: true,
                backing: SlabBacking::Blocks,
                max_empty_bytes: 32 * MIB,
                ..Default::default()
            })),
        ),
        ("adaptive", Setup::Policy(Box::default())),
        ("adaptive-pages", Setup::Policy(Box::new(pages_policy()))),
        ("adaptive-tight", Setup::Policy(Box::new(tight.clone()))),
        ("adaptive-tight-blocks", Setup::Policy(Box::new(blocks))),
    ]
}

/// The default policy with slabs a handle per page (`backing = "pages"`, the default before
/// one handle a slab): for the rules that hold for pages only.
pub fn pages_policy() -> Policy {
    let mut p = Policy::default();
    p.suballoc.backing = SlabBacking::Pages;
    p
}

pub fn sim(capacity: u64) -> Arc<SimDevice> {
    Arc::new(
        SimDevice::builder()
            .capacity(capacity)
            .cost_model(CostModel::zero())
            .build(),
    )
}

impl From<StrategyConfig> for Setup {
    fn from(c: StrategyConfig) -> Self {
        Setup::Strategy(c)
    }
}

pub fn allocator(dev: &Arc<SimDevice>, setup: impl Into<Setup>) -> Allocator {
    let dev = dev.clone() as Arc<dyn Device>;
    match setup.into() {
        Setup::Strategy(config) => Allocator::new(dev, AllocatorConfig::new(config)),
        Setup::Policy(policy) => Allocator::with_policy(dev, *policy),
    }
}

/// Checks the allocator's invariants against the blocks the test holds: no two live blocks
/// overlap, every pointer is 256-byte aligned, live bytes match, reserved = live + idle +
/// rounding (rounding within its documented bound), and the device holds exactly `reserved`.
pub fn check_invariants(name: &str, alloc: &Allocator, dev: &SimDevice, live: &[(DevicePtr, u64, u64)]) {
    // In device memory, not addresses: a spliced block maps slab pages a second time.
    let mut memory: Vec<(u64, u64, DevicePtr)> = live
        .iter()
        .flat_map(|&(p, len, _)| physical_ranges(dev, p, len).into_iter().map(move |(m, n)| (m, n, p)))
        .collect();
    memory.sort_unstable();
    for w in memory.windows(2) {
        assert!(
            w[0].0 + w[0].1 <= w[1].0,
            "{name}: blocks {:#x} and {:#x} share device memory",
            w[0].2,
            w[1].2
        );
    }
    let mut sorted: Vec<(DevicePtr, u64)> = live.iter().map(|&(p, s, _)| (p, s)).collect();
    sorted.sort_unstable();
    for &(p, len) in &sorted {
        assert_eq!(p % 256, 0, "{name}: pointer {p:#x} not 256-byte aligned");
        assert!(
            dev.is_backed(p, len),
            "{name}: block {p:#x}+{len} lies over unmapped pages"
        );
    }
    let st = alloc.stats();
    let live_bytes: u64 = live.iter().map(|l| l.1).sum();
    assert_eq!(st.live_bytes.current, live_bytes, "{name}: live bytes");
    assert_eq!(st.live_blocks.current, live.len() as u64, "{name}: live blocks");
    assert_eq!(
        st.reserved_bytes.current,
        st.live_bytes.current + st.idle_bytes.current + st.rounding_bytes,
        "{name}: reserved = live + idle + rounding"
    );
    assert!(
        st.releasable_idle_bytes <= st.idle_bytes.current,
        "{name}: releasable {} > idle {}",
        st.releasable_idle_bytes,
        st.idle_bytes.current
    );
    // Rounding per block: 256-byte alignment plus log-linear size classes (at most 12.5%) or
    // granule rounding (what passthrough's driver allocation would consume).
    let granule_bound: u64 = live.iter().map(|l| dev.footprint(l.1).saturating_sub(l.1) + 256).sum();
    assert!(
        st.rounding_bytes <= (live_bytes / 8 + 256 * live.len() as u64).max(granule_bound),
        "{name}: rounding {} too large",
        st.rounding_bytes
    );
    assert_eq!(
        dev.stats().allocated_bytes,
        st.reserved_bytes.current,
        "{name}: device holds exactly reserved"
    );
    assert!(
        st.stranded_bytes <= st.reserved_bytes.current,
        "{name}: stranded over reserved"
    );
    if name.starts_with("suballoc-paged") {
        // Reference: physical pages any live block touches (a spliced block's range maps
        // slab pages a second time), less what the driver would consume for the blocks as
        // separate allocations.
        let page = dev.granularity_model().large_granule;
        let pages: std::collections::BTreeSet<u64> = live
            .iter()
            .flat_map(|&(p, len, _)| p / page..(p + align_up(len, 256)).div_ceil(page))
            .map(|p| dev.physical_page(p * page).unwrap_or(p * page))
            .collect();
        let consumed: u64 = live.iter().map(|l| dev.footprint(align_up(l.1, 256))).sum();
        assert_eq!(
            st.stranded_bytes,
            (pages.len() as u64 * page).saturating_sub(consumed),
            "{name}: stranded bytes against the reference"
        );
    }
}

/// The device memory under `p..p+len`, as (start, length) ranges named by physical page (see
/// [`SimDevice::physical_page`]); a driver allocation is its own address range.
fn physical_ranges(dev: &SimDevice, p: DevicePtr, len: u64) -> Vec<(u64, u64)> {
    let page = dev.granularity_model().large_granule;
    let mut out = Vec::new();
    let mut q = p / page * page;
    while q < p + len {
        let (lo, hi) = (p.max(q), (p + len).min(q + page));
        out.push((dev.physical_page(q).unwrap_or(q) + lo - q, hi - lo));
        q += page;
    }
    out
}

/// A seeded test sequence (the library's SplitMix64) with a log-uniform size helper.
pub struct Rng(pub u64);

impl Rng {
    pub fn below(&mut self, n: u64) -> u64 {
        let mut g = adaptalloc::rng::SplitMix64(self.0);
        let v = g.below(n);
        self.0 = g.0;
        v
    }
    /// A size spread log-uniformly over [1, max].
    pub fn size(&mut self, max: u64) -> u64 {
        let bits = 64 - max.leading_zeros() as u64;
        let b = self.below(bits) + 1;
        self.below(1u64 << b).clamp(1, max)
    }
}

/// The workspace's root (these helpers serve the core's tests and the command line's, from
/// `cli/tests`): the nearest folder up from the package holding `policies/`.
pub fn project_root() -> PathBuf {
    let here = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    here.ancestors()
        .find(|d| d.join("policies").is_dir())
        .map(PathBuf::from)
        .unwrap_or(here)
}

/// `../shared/traces` relative to the project root, if present.
pub fn traces_dir() -> Option<PathBuf> {
    let dir = project_root().join("../shared/traces");
    if dir.is_dir() {
        Some(dir)
    } else {
        skip("../shared/traces is absent; trace tests need it");
        None
    }
}

/// Every CSV trace in ../shared/traces, sorted by name.
pub fn trace_files() -> Vec<PathBuf> {
    let Some(dir) = traces_dir() else {
        return Vec::new();
    };
    adaptalloc_cli::trace::csv_files(&dir).expect("traces dir readable")
}

/// Prints a skip reason past the test harness's output capture, so it shows in a plain
/// `cargo test` run.
pub fn skip(reason: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "SKIPPED: {reason}");
}

/// Prints a measured shortfall that a test reports but does not assert, past the output capture.
pub fn known_gap(what: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "KNOWN GAP: {what}");
}

/// Prints a measured figure past the output capture (for RELIABILITY.md and the notes).
pub fn figure(what: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "FIGURE: {what}");
}

/// Every CSV trace in ../shared/traces (when present) and the bundled synthetic workloads.
pub fn all_traces() -> Vec<adaptalloc_cli::trace::Trace> {
    let mut traces: Vec<adaptalloc_cli::trace::Trace> = trace_files()
        .iter()
        .map(|p| adaptalloc_cli::trace::read_csv(p, false).unwrap_or_else(|e| panic!("{e}")))
        .collect();
    for (name, _) in adaptalloc_cli::synth::BUNDLED {
        let spec = adaptalloc_cli::synth::WorkloadSpec::bundled(name).unwrap();
        traces.push(spec.generate(spec.seed));
    }
    traces
}
