//! Evaluates a policy against the fixed strategies on every trace in ../shared/traces and the
//! bundled workloads, at passthrough's minimum capacity, 1.1x of it, and 2x peak live.
//!
//! `cargo run --release --example policy_eval [POLICY.toml]`

use std::sync::Arc;

use adaptalloc::Allocator;
use adaptalloc::device::{Device, Granularity, SimDevice};
use adaptalloc::policy::Policy;
use adaptalloc_cli::compare::{CompareOptions, Contender, passthrough_min_capacity, run_one};
use adaptalloc_cli::synth::{BUNDLED, WorkloadSpec};
use adaptalloc_cli::trace::{Trace, csv_files, read_csv, replay};

fn main() -> anyhow::Result<()> {
    let policy = match std::env::args().nth(1) {
        Some(p) => Policy::from_file(std::path::Path::new(&p))?,
        None => Policy::default(),
    };
    let mut traces = Vec::new();
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/traces");
    for f in csv_files(&dir).unwrap_or_default() {
        traces.push(read_csv(&f, false)?);
    }
    for (name, _) in BUNDLED {
        let spec = WorkloadSpec::bundled(name).unwrap();
        traces.push(spec.generate(spec.seed));
    }
    let opts = CompareOptions::default();
    println!(
        "{:28} {:>5} | {:>7} {:>7} {:>7} {:>7} | {:>6} {:>6} | {:>5} {:>5}",
        "trace", "cap", "pass", "cache", "sub", "ours", "ours%", "xbest", "fail", "res/l"
    );
    for t in &traces {
        let min = passthrough_min_capacity(t, Granularity::default());
        for (label, cap) in [
            ("1.0m", min),
            ("1.1m", (min as f64 * 1.1) as u64),
            ("2xl", 2 * t.peak_live_bytes() + (64 << 20)),
        ] {
            let r: Vec<_> = Contender::FIXED.iter().map(|&c| run_one(t, c, cap, &opts)).collect();
            let ours = run_with(t, &policy, cap);
            let calls = |a: u64, f: u64| a + f;
            let best = r
                .iter()
                .filter(|x| x.completed)
                .map(|x| calls(x.driver_allocs, x.driver_frees))
                .min()
                .unwrap_or(0);
            let pass = calls(r[0].driver_allocs, r[0].driver_frees);
            let o = calls(ours.driver_allocs, ours.driver_frees);
            let show = |x: &adaptalloc_cli::compare::StrategyResult| {
                if x.completed {
                    calls(x.driver_allocs, x.driver_frees).to_string()
                } else {
                    "FAIL".into()
                }
            };
            println!(
                "{:28} {:>5} | {:>7} {:>7} {:>7} {:>7} | {:>5.1}% {:>6.2} | {:>5} {:>5.2}",
                t.name,
                label,
                show(&r[0]),
                show(&r[1]),
                show(&r[2]),
                o,
                100.0 * o as f64 / pass.max(1) as f64,
                o as f64 / best.max(1) as f64,
                ours.failed_allocs,
                ours.peak_reserved_bytes as f64 / t.peak_live_bytes() as f64
            );
        }
    }
    Ok(())
}

fn run_with(t: &Trace, policy: &Policy, cap: u64) -> adaptalloc_cli::trace::ReplayMetrics {
    let dev = Arc::new(SimDevice::new(cap));
    let alloc = Allocator::with_policy(dev as Arc<dyn Device>, policy.clone());
    replay(t, &alloc)
}
