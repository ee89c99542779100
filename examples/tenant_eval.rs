//! Co-tenants (issue 24: "a co-tenant must still get its memory"): on every trace in
//! ../shared/traces and the bundled workloads, at 1.2x, 1.3x, 1.5x, 2x and 4x peak live, a co-tenant takes
//! memory while the workload runs its second of three passes (from 40% of all events to 60%)
//! and gives it back after. It takes half, or all, of the slack passthrough leaves (the device
//! less passthrough's peak footprint), so it fits beside passthrough at any moment: passthrough
//! never fails it, by construction. Each allocator is counted: the co-tenant's failed takes
//! (at most one a run), and the workload's own failed allocations. Default cost model.
//!
//! `cargo run --release --example tenant_eval > tuning/reports/tenants.md` (about 5 s here);
//! `-- --policy NAME|FILE` evaluates another policy as adaptive's (`multi-tenant`, say).

#[path = "common/args.rs"]
mod args;
#[path = "common/workloads.rs"]
mod workloads;

use adaptalloc::device::Granularity;
use adaptalloc::size::ByteSize;
use adaptalloc_cli::compare::{Capacity, CompareOptions, Contender, TenantSpec, passthrough_min_capacity, run_one};
use workloads::traces;

fn main() -> anyhow::Result<()> {
    let (policy_name, policy) = args::policy_arg()?.unzip();
    let traces = traces();
    let g = Granularity::default();
    let contenders = [
        Contender::Passthrough,
        Contender::Adaptive,
        Contender::Pytorch,
        Contender::PytorchExpandable,
        Contender::CudaAsyncRetain,
    ];
    println!("# Co-tenants: does a process beside the workload get memory that fits beside passthrough?\n");
    println!(
        "`cargo run --release --example tenant_eval`: {} workloads, three passes each (`--repeat 3`); a \
         co-tenant takes half or all of the slack passthrough leaves (device less passthrough's peak \
         footprint) from 40% to 60% of the events (the second pass), so it always fits beside \
         passthrough. Each cell: the co-tenant's failed takes / the workload's failed allocations, \
         summed over the workloads; then every run where adaptive failed either. Adaptive's policy: {}.\n",
        traces.len(),
        policy_name.as_deref().unwrap_or("the default")
    );
    let mut misses = Vec::new();
    println!(
        "| capacity | tenant takes | {} |",
        contenders.map(|c| c.name()).join(" | ")
    );
    println!("|---|---|{}", "---|".repeat(contenders.len()));
    for factor in [1.2, 1.3, 1.5, 2.0, 4.0] {
        for share in [0.5, 1.0] {
            let mut sums = vec![(0u64, 0u64); contenders.len()];
            for t in &traces {
                let capacity = Capacity::Factor(factor).bytes_for(t.peak_live_bytes(), g.large_granule);
                let slack = capacity.saturating_sub(passthrough_min_capacity(t, g));
                let bytes = (slack as f64 * share) as u64 / g.large_granule * g.large_granule;
                if bytes == 0 {
                    continue;
                }
                let opts = CompareOptions {
                    repeat: 3,
                    policy: policy.clone(),
                    tenant: Some(TenantSpec {
                        bytes,
                        start: 0.4,
                        end: 0.6,
                    }),
                    ..CompareOptions::default()
                };
                for (i, &c) in contenders.iter().enumerate() {
                    let r = run_one(t, c, capacity, &opts);
                    sums[i].0 += r.tenant_failures;
                    sums[i].1 += r.failed_allocs;
                    if c == Contender::Adaptive && (r.tenant_failures > 0 || r.failed_allocs > 0) {
                        misses.push(format!(
                            "{} at {factor}x ({}), tenant {}: tenant failed {}, workload failed {}; peak reserved {}",
                            t.name,
                            ByteSize(capacity),
                            ByteSize(bytes),
                            r.tenant_failures,
                            r.failed_allocs,
                            ByteSize(r.peak_reserved_bytes)
                        ));
                    }
                    assert!(
                        c != Contender::Passthrough || (r.tenant_failures == 0 && r.failed_allocs == 0),
                        "the co-tenant must fit beside passthrough: {} at {factor}x",
                        t.name
                    );
                }
            }
            let cells: Vec<String> = sums.iter().map(|(a, b)| format!("{a} / {b}")).collect();
            println!(
                "| {factor}x | {:.0}% of the slack | {} |",
                share * 100.0,
                cells.join(" | ")
            );
        }
    }
    println!(
        "\nRuns where adaptive failed the co-tenant or the workload: {}.\n",
        misses.len()
    );
    for m in misses {
        println!("- {m}");
    }
    Ok(())
}
