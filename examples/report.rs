//! Replays one trace (or a bundled workload) through the default policy on SimDevice and
//! prints the tuning report.
//!
//! `cargo run --release --example report -- TRACE.csv|WORKLOAD [CAPACITY-FACTOR]`
use std::sync::Arc;

use adaptalloc::Allocator;
use adaptalloc::device::{Device, SimDevice};
use adaptalloc_cli::synth::WorkloadSpec;
use adaptalloc_cli::trace::{read_csv, replay};

fn main() -> anyhow::Result<()> {
    let arg = std::env::args().nth(1).unwrap_or_else(|| "training".into());
    let factor: f64 = std::env::args().nth(2).map(|f| f.parse()).transpose()?.unwrap_or(2.0);
    let trace = match WorkloadSpec::bundled(&arg) {
        Some(spec) => spec.generate(spec.seed),
        None => read_csv(std::path::Path::new(&arg), false)?,
    };
    let cap = (trace.peak_live_bytes() as f64 * factor) as u64 + (64 << 20);
    let alloc = Allocator::adaptive(Arc::new(SimDevice::new(cap)) as Arc<dyn Device>);
    replay(&trace, &alloc);
    print!("{}", alloc.report().expect("adaptive allocators report"));
    Ok(())
}
