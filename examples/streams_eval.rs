//! Multi-stream variants of every trace: each block whose id hashes into the first `share` of
//! the range moves to stream 1 (its free too: frees stay on the allocating stream), nothing is
//! ever synchronized. Each variant replays through the default policy at 1.1x passthrough's
//! smallest capacity and at passthrough's smallest capacity, on SimDevice with in-flight work
//! completing at once (lag 0) and never on its own (lag max: memory freed on a stream serves
//! another only after a wait before a request would fail). Prints failed allocations and driver
//! allocations per case as Markdown.
//!
//! `cargo run --release --example streams_eval`

#[path = "common/workloads.rs"]
mod workloads;

use std::sync::Arc;

use adaptalloc::Allocator;
use adaptalloc::device::{Device, Granularity, SimDevice};
use adaptalloc_cli::compare::passthrough_min_capacity;
use adaptalloc_cli::trace::{Trace, replay};

/// Shares of the blocks moved to stream 1.
const SHARES: [f64; 3] = [0.0, 0.1, 0.5];

fn main() -> anyhow::Result<()> {
    let traces = workloads::traces();
    println!(
        "| trace | capacity | lag | {} |",
        SHARES.map(|s| format!("{:.0}% on stream 1", s * 100.0)).join(" | ")
    );
    println!("|---|---|---|{}", "---|".repeat(SHARES.len()));
    let (mut worse, mut cases) = (0, 0);
    for t in &traces {
        let min = passthrough_min_capacity(t, Granularity::default());
        for (label, capacity) in [("1.1x", (min as f64 * 1.1) as u64), ("1.0x", min)] {
            for (lag_name, lag) in [("0", 0), ("max", u64::MAX)] {
                let cells: Vec<(u64, u64)> = SHARES
                    .iter()
                    .map(|&s| run(&t.split_streams(s), capacity, lag))
                    .collect();
                cases += 1;
                if cells.iter().any(|c| c.0 > 0) {
                    worse += 1;
                }
                let text: Vec<String> = cells
                    .iter()
                    .map(|(f, d)| format!("{f} failed, {d} driver allocs"))
                    .collect();
                println!("| {} | {label} | {lag_name} | {} |", t.name, text.join(" | "));
            }
        }
    }
    println!("\n{worse} of {cases} cases had a failed allocation.");
    Ok(())
}

/// (failed allocations, driver allocations) of the default policy.
fn run(t: &Trace, capacity: u64, lag: u64) -> (u64, u64) {
    let dev = Arc::new(SimDevice::builder().capacity(capacity).stream_lag(lag).build());
    let alloc = Allocator::adaptive(dev as Arc<dyn Device>);
    let m = replay(t, &alloc);
    (m.failed_allocs, m.driver_allocs)
}
