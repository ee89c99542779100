//! Judges a policy beyond the traces it was tuned on: every trace in ../shared/traces and six
//! windows of it (a trace is a window of a run; another window puts the peak elsewhere), the
//! bundled workloads at three seeds, and four random churns (sizes, live counts and device sizes
//! the bundled small-churn does not cover). Each runs on SimDevice at every 1% step from
//! passthrough's smallest capacity to 1.15x, then 1.2x, 1.3x, 1.5x and 2x, and the failed
//! allocations are listed as Markdown (`tuning/reports/robustness.md`).
//!
//! `cargo run --release --example robustness [POLICY.toml] > tuning/reports/robustness.md`

use std::collections::HashSet;
use std::sync::Arc;

use adaptalloc::Allocator;
use adaptalloc::compare::passthrough_min_capacity;
use adaptalloc::device::{Device, Granularity, SimDevice};
use adaptalloc::policy::Policy;
use adaptalloc::synth::{BUNDLED, WorkloadSpec};
use adaptalloc::trace::{Op, Trace, read_csv, replay};

/// Windows as fractions of the events: prefixes end before the run's later peaks, suffixes
/// start with blocks whose allocation is outside the window (their frees are dropped).
const WINDOWS: [(f64, f64); 6] = [(0.0, 0.4), (0.0, 0.6), (0.0, 0.8), (0.2, 1.0), (0.5, 1.0), (0.25, 0.75)];
/// Random churns: (min size, max size, most blocks live at once).
const CHURNS: [(&str, &str, u32); 4] = [
    ("256", "64KiB", 500),
    ("512", "1MiB", 1000),
    ("256", "256KiB", 5000),
    ("4KiB", "512KiB", 300),
];

fn main() -> anyhow::Result<()> {
    let policy = match std::env::args().nth(1) {
        Some(p) => Policy::from_file(std::path::Path::new(&p))?,
        None => Policy::default(),
    };
    let workloads = workloads()?;
    let mut factors: Vec<f64> = (0..=15).map(|i| 1.0 + f64::from(i) / 100.0).collect();
    factors.extend([1.2, 1.3, 1.5, 2.0]);
    let mut rows = Vec::new();
    let (mut at_min, mut near_min, mut above) = (0, 0, 0);
    let mut calls = 0u64;
    for t in &workloads {
        let min = passthrough_min_capacity(t, Granularity::default());
        let mut fails = Vec::new();
        for &f in &factors {
            let m = run_with(t, &policy, (min as f64 * f) as u64);
            calls += m.driver_allocs + m.driver_frees;
            if m.failed_allocs > 0 {
                fails.push(format!("{f:.2}x: {}", m.failed_allocs));
                if f == 1.0 {
                    at_min += 1;
                } else if f < 1.025 {
                    near_min += 1;
                } else {
                    above += 1;
                }
            }
        }
        if !fails.is_empty() {
            rows.push(format!("| {} | {} | {} |", t.name, mib(min), fails.join(", ")));
        }
    }
    println!("# Robustness: failed allocations beyond the tuned traces\n");
    println!(
        "`cargo run --release --example robustness`: {} workloads x {} capacities, SimDevice \
         with the default cost model. A run fails where any allocation fails; passthrough completes \
         every one of them.\n",
        workloads.len(),
        factors.len()
    );
    println!(
        "- failing runs: {} at passthrough's exact minimum, {near_min} at 1.01-1.02x, {above} from 1.03x",
        at_min
    );
    println!("- workloads with a failing run: {} of {}", rows.len(), workloads.len());
    println!("- driver calls, all runs: {calls}\n");
    println!("| workload | passthrough's minimum | failed allocations by capacity |");
    println!("|---|---|---|");
    for r in rows {
        println!("{r}");
    }
    Ok(())
}

fn workloads() -> anyhow::Result<Vec<Trace>> {
    let mut out = Vec::new();
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/traces");
    if let Ok(rd) = std::fs::read_dir(&dir) {
        let mut files: Vec<_> = rd
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "csv"))
            .collect();
        files.sort();
        for f in files {
            let t = read_csv(&f, false)?;
            out.extend(WINDOWS.iter().map(|&(a, b)| window(&t, a, b)));
            out.push(t);
        }
    }
    for (name, _) in BUNDLED {
        let spec = WorkloadSpec::bundled(name).expect("bundled");
        for seed in [spec.seed, 11, 12] {
            let mut t = spec.generate(seed);
            t.name = format!("{name} (seed {seed})");
            out.push(t);
        }
    }
    for (i, (lo, hi, live)) in CHURNS.iter().enumerate() {
        let text = format!(
            "name = \"churn {lo}..{hi}, {live} live\"\nseed = {}\n[[phase]]\nkind = \"churn\"\n\
             operations = 30000\nmin_bytes = \"{lo}\"\nmax_bytes = \"{hi}\"\nmax_live = {live}\n",
            20 + i
        );
        let spec = WorkloadSpec::from_toml_str(&text, "robustness churn")?;
        out.push(spec.generate(spec.seed));
    }
    Ok(out)
}

/// Events `from..to` (fractions) of `t`, without frees of blocks allocated before the window.
fn window(t: &Trace, from: f64, to: f64) -> Trace {
    let n = t.events.len() as f64;
    let (a, b) = ((n * from) as usize, (n * to) as usize);
    let mut live = HashSet::new();
    let events = t.events[a..b]
        .iter()
        .filter(|e| match e.op {
            Op::Alloc => live.insert(e.id),
            Op::Free => live.remove(&e.id),
        })
        .cloned()
        .collect();
    Trace {
        name: format!("{} [{:.0}%..{:.0}%]", t.name, from * 100.0, to * 100.0),
        events,
        skipped_frees: 0,
    }
}

fn run_with(t: &Trace, policy: &Policy, cap: u64) -> adaptalloc::trace::ReplayMetrics {
    let dev = Arc::new(SimDevice::new(cap));
    let alloc = Allocator::with_policy(dev as Arc<dyn Device>, policy.clone());
    replay(t, &alloc)
}

fn mib(b: u64) -> String {
    format!("{:.1} MiB", b as f64 / f64::from(1 << 20))
}
