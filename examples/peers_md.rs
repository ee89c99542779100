//! Writes `tuning/reports/peers.md` to standard output: adaptive against the allocators users
//! run (pytorch, pytorch-expandable, cuda-async, cuda-async-retain, rmm-pool, iree-caching) and
//! passthrough, on every trace in ../shared/traces and the bundled workloads, at passthrough's
//! smallest capacity, 1.1x it, and 1.5x, 2x and 4x peak live: failed allocations, modelled
//! driver time, driver calls and peak reserved; then the smallest device each completes on
//! (0.5% search); then where adaptive falls short of a peer, counted and worst case; then the
//! modelled-time targets (issue 16) under the default cost model and, for sensitivity, under
//! `tuning/cost-models/vmm-fast.toml`, each with the tuning report's advice judged over ten
//! passes as `adaptalloc replay --repeat 10` judges it (adaptive with the default policy and
//! with the advice, against `pytorch`, over the same passes); then where adaptive's modelled
//! time goes, by kind.
//!
//! `cargo run --release --example peers_md > tuning/reports/peers.md` (about a minute here).

#[path = "common/workloads.rs"]
mod workloads;

use std::path::Path;
use workloads::traces;

use adaptalloc::device::{CostModel, Granularity};
use adaptalloc::size::{ByteSize, round_up};
use adaptalloc_cli::advice::ADVICE_PASSES;
use adaptalloc_cli::compare::{
    Capacity, CompareOptions, Contender, StrategyResult, passthrough_min_capacity, run_one, smallest_capacity,
};
use adaptalloc_cli::trace::Trace;

/// A device size for a trace.
type CapacityOf<'a> = Box<dyn Fn(&Trace) -> u64 + 'a>;

/// Where adaptive fell short of a peer at one capacity: how often, and the worst case.
#[derive(Default)]
struct Shortfall {
    failures: Vec<String>,
    calls: Vec<(f64, String)>,
    reserved: Vec<(f64, String)>,
}

/// One peer's target: (peer, workloads checked, misses as (ratio, case)).
type PeerTarget = (&'static str, u32, Vec<(f64, String)>);

/// The modelled-time targets at one capacity: adaptive's time against `pytorch` wherever that
/// completes, and on training traces against `pytorch-expandable` and `cuda-async-retain`.
#[derive(Default)]
struct Targets {
    /// Per peer: workloads checked, and those where adaptive took longer (ratio, case).
    vs: Vec<PeerTarget>,
    /// Adaptive's failed allocations where passthrough completed.
    failed: u64,
    /// Modelled ms summed over the workloads: adaptive, pytorch.
    sums: (f64, f64),
    /// Over `ADVICE_PASSES` passes, summed (ms): adaptive with the default policy, adaptive
    /// with its first run's advice (where `adaptalloc replay` keeps it, else the default policy
    /// again), `pytorch`; and the runs where advice was kept.
    advised: (f64, f64, f64, u32),
    /// Workloads where the advised runs still took longer than `pytorch`'s over those passes, of
    /// those where `pytorch` completed them.
    advised_over_pytorch: (u32, u32),
    /// Adaptive's modelled time by kind, summed: kind -> (calls, ns).
    kinds: std::collections::BTreeMap<&'static str, (u64, u64)>,
}

impl Targets {
    /// Counts adaptive's runs of `ADVICE_PASSES` passes on `t` at `capacity` under `opts`'
    /// prices, with the default policy and with its first run's advice, against `pytorch`'s.
    fn advise(&mut self, t: &Trace, capacity: u64, opts: &CompareOptions) {
        let (plain, advised, kept) = advised_ns(t, capacity, &opts.cost_model);
        let passes = CompareOptions {
            repeat: ADVICE_PASSES,
            ..opts.clone()
        };
        let p = run_one(t, Contender::Pytorch, capacity, &passes);
        self.advised.0 += plain as f64 / 1e6;
        self.advised.1 += advised as f64 / 1e6;
        self.advised.2 += p.modeled_driver_ns as f64 / 1e6;
        self.advised.3 += u32::from(kept);
        if p.completed {
            self.advised_over_pytorch.1 += 1;
            self.advised_over_pytorch.0 += u32::from(advised > p.modeled_driver_ns);
        }
    }

    fn check(&mut self, peer: &'static str, t: &Trace, a: &StrategyResult, r: &StrategyResult) {
        let training = t.name.contains("train");
        let applies = peer == "pytorch" || training;
        if !applies || !r.completed {
            return;
        }
        let i = match self.vs.iter().position(|v| v.0 == peer) {
            Some(i) => i,
            None => {
                self.vs.push((peer, 0, Vec::new()));
                self.vs.len() - 1
            }
        };
        self.vs[i].1 += 1;
        if a.modeled_driver_ns > r.modeled_driver_ns {
            let ratio = a.modeled_driver_ns as f64 / r.modeled_driver_ns.max(1) as f64;
            let what = format!(
                "{}: {:.1} vs {:.1} ms",
                t.name,
                a.modeled_driver_ns as f64 / 1e6,
                r.modeled_driver_ns as f64 / 1e6
            );
            self.vs[i].2.push((ratio, what));
        }
    }

    fn line(&self, label: &str) -> String {
        let parts: Vec<String> = self
            .vs
            .iter()
            .map(|(peer, n, missed)| {
                let worst = missed
                    .iter()
                    .max_by(|a, b| a.0.total_cmp(&b.0))
                    .map_or(String::new(), |w| format!(", worst {:.1}x ({})", w.0, w.1));
                format!("over `{peer}` on {} of {n}{worst}", missed.len())
            })
            .collect();
        format!(
            "- {label}: adaptive {:.0} ms in all, `pytorch` {:.0} ms; adaptive's time is {}; adaptive failed {} \
             allocations where passthrough completed. Over {ADVICE_PASSES} passes: adaptive {:.0} ms, {:.0} ms \
             with its tuning report's advice (kept on {} workload{}), `pytorch` {:.0} ms; the advised runs over \
             `pytorch`'s on {} of {}.",
            self.sums.0,
            self.sums.1,
            parts.join("; "),
            self.failed,
            self.advised.0,
            self.advised.1,
            self.advised.3,
            if self.advised.3 == 1 { "" } else { "s" },
            self.advised.2,
            self.advised_over_pytorch.0,
            self.advised_over_pytorch.1,
        )
    }
}

fn main() {
    let traces = traces();
    let g = Granularity::default();
    let opts = CompareOptions::default();
    // Adaptive first (the shortfalls compare against it), the peers, passthrough for scale.
    let shown: Vec<Contender> = std::iter::once(Contender::Adaptive)
        .chain(Contender::USED)
        .chain([Contender::Passthrough])
        .collect();
    let names: Vec<&str> = shown.iter().map(|c| c.name()).collect();
    println!("# adaptive against the allocators users run\n");
    println!(
        "Generated by `cargo run --release --example peers_md` (one run, simulated device, default \
         cost model). {} workloads: every trace in ../shared/traces and the bundled ones. Each cell: \
         failed allocations / modelled driver time (ms) / driver calls / peak reserved (GiB). The \
         peers are models (cli/src/peers); `pytorch` is validated against 13 real PyTorch snapshots \
         (cli/tests/pytorch_snapshots.rs).\n",
        traces.len()
    );
    let factor = |t: &Trace, f: f64| Capacity::Factor(f).bytes_for(t.peak_live_bytes(), g.large_granule);
    let caps: [(&str, CapacityOf<'_>); 5] = [
        (
            "passthrough's minimum",
            Box::new(|t: &Trace| passthrough_min_capacity(t, g)),
        ),
        (
            "1.1x passthrough's minimum",
            Box::new(|t: &Trace| round_up((passthrough_min_capacity(t, g) as f64 * 1.1) as u64, 256)),
        ),
        ("1.5x peak live", Box::new(|t: &Trace| factor(t, 1.5))),
        ("2x peak live", Box::new(|t: &Trace| factor(t, 2.0))),
        ("4x peak live", Box::new(|t: &Trace| factor(t, 4.0))),
    ];
    let mut summary = Vec::new();
    let mut targets: Vec<(String, Targets)> = Vec::new();
    for (label, cap) in &caps {
        println!("## {label}\n");
        println!("| trace | {} |\n|---|{}", names.join(" | "), "---|".repeat(names.len()));
        let mut short = Shortfall::default();
        let mut tg = Targets::default();
        for t in &traces {
            let c = cap(t);
            let rs: Vec<StrategyResult> = shown.iter().map(|&s| run_one(t, s, c, &opts)).collect();
            let cells: Vec<String> = rs
                .iter()
                .map(|r| {
                    format!(
                        "{} / {:.1} / {} / {:.2}",
                        r.failed_allocs,
                        r.modeled_driver_ns as f64 / 1e6,
                        r.driver_calls,
                        r.peak_reserved_bytes as f64 / (1u64 << 30) as f64
                    )
                })
                .collect();
            println!("| {} ({}) | {} |", t.name, ByteSize(c), cells.join(" | "));
            let a = &rs[0];
            tg.sums.0 += a.modeled_driver_ns as f64 / 1e6;
            tg.advise(t, c, &opts);
            for k in &a.driver_by_kind {
                let e = tg.kinds.entry(k.kind).or_default();
                (e.0, e.1) = (e.0 + k.calls, e.1 + k.ns);
            }
            for (r, s) in rs.iter().zip(shown.iter().copied()).skip(1) {
                if s == Contender::Passthrough {
                    if r.completed {
                        tg.failed += a.failed_allocs;
                    }
                    continue;
                }
                if s == Contender::Pytorch {
                    tg.sums.1 += r.modeled_driver_ns as f64 / 1e6;
                }
                if matches!(
                    s,
                    Contender::Pytorch | Contender::PytorchExpandable | Contender::CudaAsyncRetain
                ) {
                    tg.check(s.name(), t, a, r);
                }
                let who = format!("{} vs {}", t.name, s.name());
                if r.failed_allocs < a.failed_allocs {
                    short
                        .failures
                        .push(format!("{who} ({} vs {})", a.failed_allocs, r.failed_allocs));
                }
                // Only where both completed: calls and memory of a run that failed say little.
                if r.completed && a.completed {
                    let (ac, rc) = (a.driver_calls, r.driver_calls);
                    if ac > rc {
                        short
                            .calls
                            .push((ac as f64 / rc.max(1) as f64, format!("{who}: {ac} vs {rc}")));
                    }
                    if a.peak_reserved_bytes > r.peak_reserved_bytes {
                        let ratio = a.peak_reserved_bytes as f64 / r.peak_reserved_bytes.max(1) as f64;
                        short.reserved.push((ratio, format!("{who}: {:.3}x", ratio)));
                    }
                }
            }
        }
        println!();
        summary.push((label.to_string(), short));
        targets.push((label.to_string(), tg));
    }
    println!("## Smallest device each completes on\n");
    println!("Binary search to 0.5%, as a multiple of peak live; `never` when it fails at 64x.\n");
    println!("| trace | {} |\n|---|{}", names.join(" | "), "---|".repeat(names.len()));
    let mut min_short = Vec::new();
    for t in &traces {
        let peak = t.peak_live_bytes().max(1);
        let mins: Vec<Option<u64>> = shown.iter().map(|&s| smallest_capacity(t, s, &opts)).collect();
        let cells: Vec<String> = mins
            .iter()
            .map(|m| m.map_or("never".into(), |b| format!("{:.3}x", b as f64 / peak as f64)))
            .collect();
        println!("| {} | {} |", t.name, cells.join(" | "));
        for (m, s) in mins.iter().zip(shown.iter().copied()).skip(1) {
            if let (Some(p), Some(a)) = (m, mins[0])
                && *p < a
                && s != Contender::Passthrough
            {
                min_short.push(format!(
                    "{} vs {}: {:.3}x vs {:.3}x",
                    t.name,
                    s.name(),
                    a as f64 / peak as f64,
                    *p as f64 / peak as f64
                ));
            }
        }
    }
    println!("\n## Where adaptive falls short\n");
    for (label, s) in summary {
        let worst = |v: &[(f64, String)]| {
            v.iter()
                .max_by(|a, b| a.0.total_cmp(&b.0))
                .map_or("none".to_string(), |w| w.1.clone())
        };
        println!(
            "- {label}: more failed allocations than a peer in {} cases{}; more driver calls (both complete) in {} \
             cases, worst {}; more peak reserved in {} cases, worst {}.",
            s.failures.len(),
            if s.failures.is_empty() {
                String::new()
            } else {
                format!(" ({})", s.failures.join("; "))
            },
            s.calls.len(),
            worst(&s.calls),
            s.reserved.len(),
            worst(&s.reserved)
        );
    }
    println!(
        "- Smallest device: a peer completes on a smaller device in {} cases{}.",
        min_short.len(),
        if min_short.is_empty() {
            String::new()
        } else {
            format!(" ({})", min_short.join("; "))
        }
    );
    println!("\n## Modelled driver time against the peers (issue 16's targets)\n");
    println!(
        "Targets: adaptive's modelled driver time at most `pytorch`'s wherever `pytorch` completes, and at most \
         `pytorch-expandable`'s and `cuda-async-retain`'s on the training traces; adaptive never fails where \
         passthrough completes. Default cost model (tuning/cost-models/default.toml):\n"
    );
    for (label, tg) in targets.iter().skip(1) {
        println!("{}", tg.line(label));
    }
    println!(
        "\nUnder tuning/cost-models/vmm-fast.toml (cuMemCreate 7.6 us instead of 193 us, the rest of the \
              virtual-memory prices from the same run):\n"
    );
    let fast_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tuning/cost-models/vmm-fast.toml");
    let fast = CompareOptions {
        cost_model: CostModel::from_file(&fast_path).expect("the bundled model parses"),
        ..CompareOptions::default()
    };
    for (label, cap) in caps.iter().skip(1) {
        let mut tg = Targets::default();
        for t in &traces {
            let c = cap(t);
            let a = run_one(t, Contender::Adaptive, c, &fast);
            tg.sums.0 += a.modeled_driver_ns as f64 / 1e6;
            for s in [
                Contender::Pytorch,
                Contender::PytorchExpandable,
                Contender::CudaAsyncRetain,
            ] {
                let r = run_one(t, s, c, &fast);
                if s == Contender::Pytorch {
                    tg.sums.1 += r.modeled_driver_ns as f64 / 1e6;
                    tg.advise(t, c, &fast);
                }
                tg.check(s.name(), t, &a, &r);
            }
        }
        println!("{}", tg.line(label));
    }
    println!("\n## Where adaptive's modelled time goes\n");
    println!("Summed over the workloads, default cost model: calls and ms per kind of driver operation.\n");
    for (label, tg) in &targets {
        let mut kinds: Vec<_> = tg.kinds.iter().collect();
        kinds.sort_by_key(|k| std::cmp::Reverse(k.1.1));
        let parts: Vec<String> = kinds
            .iter()
            .map(|(k, (calls, ns))| format!("{k} {:.0} ms ({calls})", *ns as f64 / 1e6))
            .collect();
        println!("- {label}: {}", parts.join(", "));
    }
}

/// Adaptive's modelled driver time over `ADVICE_PASSES` passes of `t` at `capacity` under
/// `cost`: with the default policy, and with that run's tuning report's advice, checked by
/// replay as `adaptalloc replay --repeat 10` does (the default policy's time again where none
/// was kept); and whether advice was kept.
fn advised_ns(t: &Trace, capacity: u64, cost: &CostModel) -> (u64, u64, bool) {
    let policy = adaptalloc::policy::Policy::default();
    let run = adaptalloc_cli::advice::run_with_advice_over_passes(t, &policy, capacity, cost);
    let plain = run.metrics.modeled_driver_ns;
    match run.advised {
        Some(m) => (plain, m.modeled_driver_ns, true),
        None => (plain, plain, false),
    }
}
