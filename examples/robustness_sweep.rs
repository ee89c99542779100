//! A wider net than `examples/robustness` for judging a change to placement or release: 897
//! windows of the traces in ../shared/traces (starts every 5% up to 70%, lengths from a quarter
//! to three quarters of the run) at 1.00, 1.01, 1.02 and 1.05x passthrough's smallest capacity,
//! and 150 random churns (six shapes of sizes and live counts, 25 seeds each) at the robustness
//! grid's 20 capacities. Prints every failing run, then the counts. A rule tuned until the
//! grid's 133 workloads pass can still fail windows the grid does not hold; this is where that
//! shows. About half a minute in release mode.
//!
//! `cargo run --release --example robustness_sweep [POLICY.toml]`

use std::sync::Arc;

use adaptalloc::Allocator;
use adaptalloc::device::{Device, Granularity, SimDevice};
use adaptalloc::policy::Policy;
use adaptalloc_cli::compare::passthrough_min_capacity;
use adaptalloc_cli::synth::WorkloadSpec;
use adaptalloc_cli::trace::{Trace, csv_files, read_csv, replay};

/// Random churns: (min size, max size, most blocks live at once).
const SHAPES: [(&str, &str, u32); 6] = [
    ("256", "64KiB", 500),
    ("512", "1MiB", 1000),
    ("256", "256KiB", 5000),
    ("4KiB", "512KiB", 300),
    ("256", "256KiB", 2000),
    ("64KiB", "4MiB", 200),
];
const SEEDS: u64 = 25;
const WINDOW_FACTORS: [f64; 4] = [1.0, 1.01, 1.02, 1.05];

fn main() -> anyhow::Result<()> {
    let policy = match std::env::args().nth(1) {
        Some(p) => Policy::from_file(std::path::Path::new(&p))?,
        None => Policy::default(),
    };
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/traces");
    let files = csv_files(&dir).unwrap_or_default();
    let mut windows = [0u32; WINDOW_FACTORS.len()];
    let mut window_runs = 0;
    for f in &files {
        let whole = read_csv(f, false)?;
        for (a, b) in spans() {
            let t = whole.window(a, b);
            let min = passthrough_min_capacity(&t, Granularity::default());
            for (i, &factor) in WINDOW_FACTORS.iter().enumerate() {
                window_runs += 1;
                let failed = failed(&t, &policy, (min as f64 * factor) as u64);
                if failed > 0 {
                    windows[i] += 1;
                    println!(
                        "{} [{:.0}%..{:.0}%] {factor:.2}x: {failed}",
                        whole.name,
                        a * 100.0,
                        b * 100.0
                    );
                }
            }
        }
    }
    let mut factors: Vec<f64> = (0..=15).map(|i| 1.0 + f64::from(i) / 100.0).collect();
    factors.extend([1.2, 1.3, 1.5, 2.0]);
    let mut churns = [0u32; 3];
    let mut churn_runs = 0;
    for (shape, (lo, hi, live)) in SHAPES.iter().enumerate() {
        for k in 0..SEEDS {
            let seed = 1000 + k * 7 + shape as u64;
            let text = format!(
                "name = \"churn {lo}..{hi}, {live} live, seed {seed}\"\nseed = {seed}\n[[phase]]\nkind = \"churn\"\n\
                 operations = 30000\nmin_bytes = \"{lo}\"\nmax_bytes = \"{hi}\"\nmax_live = {live}\n"
            );
            let spec = WorkloadSpec::from_toml_str(&text, "robustness_sweep churn")?;
            let t = spec.generate(seed);
            let min = passthrough_min_capacity(&t, Granularity::default());
            for &factor in &factors {
                churn_runs += 1;
                let failed = failed(&t, &policy, (min as f64 * factor) as u64);
                if failed > 0 {
                    churns[usize::from(factor > 1.0) + usize::from(factor > 1.025)] += 1;
                    println!("{} {factor:.2}x: {failed}", t.name);
                }
            }
        }
    }
    if files.is_empty() {
        println!("(no traces in {}: windows skipped)", dir.display());
    }
    println!(
        "windows: {window_runs} runs, failing at 1.00 / 1.01 / 1.02 / 1.05x: {}",
        windows.map(|n| n.to_string()).join(" / ")
    );
    println!(
        "churns: {churn_runs} runs, failing at the exact minimum / 1.01-1.02x / from 1.03x: {}",
        churns.map(|n| n.to_string()).join(" / ")
    );
    Ok(())
}

/// Windows as (start, end) fractions of the events: starts every 5% up to 70%, lengths of 25,
/// 30, 40, 50, 60 and 75%, those that end by 100%.
fn spans() -> Vec<(f64, f64)> {
    let mut out = Vec::new();
    for start in 0..15u32 {
        let a = f64::from(start) * 0.05;
        for len in [0.25, 0.3, 0.4, 0.5, 0.6, 0.75] {
            if a + len <= 1.0 + 1e-9 {
                out.push((a, (a + len).min(1.0)));
            }
        }
    }
    out
}

fn failed(t: &Trace, policy: &Policy, cap: u64) -> u64 {
    let dev = Arc::new(SimDevice::new(cap));
    let alloc = Allocator::with_policy(dev as Arc<dyn Device>, policy.clone());
    replay(t, &alloc).failed_allocs
}
