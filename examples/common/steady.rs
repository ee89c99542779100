//! Issue 24's yardstick as Markdown: warm-up and steady state per workload, capacity and cost
//! model, adaptive against `pytorch`, `pytorch-expandable` and `cuda-async-retain`, with the
//! sums and every miss of the targets with its cause. Printed by `steady_eval` (into
//! `tuning/reports/steady.md`) and by `benchmarks_md` (into BENCHMARKS.md).

use std::path::Path;

use adaptalloc::device::{CostModel, Granularity};
use adaptalloc::policy::Policy;
use adaptalloc::size::round_up;
use adaptalloc_cli::compare::{Capacity, CompareOptions, Contender, StrategyResult, passthrough_min_capacity, run_one};
use adaptalloc_cli::trace::Trace;

fn ms(ns: u64) -> f64 {
    ns as f64 / 1e6
}

/// A kind of driver call (a key of the cost model) as the call and what makes it here.
fn call_name(kind: &str) -> &'static str {
    match kind {
        "create" => "cuMemCreate (a new handle)",
        "release" => "cuMemRelease (a handle given back)",
        "map" => "cuMemMap",
        "unmap" => "cuMemUnmap",
        "set_access" => "cuMemSetAccess",
        "unmap_sync" => "wait before unmapping",
        "reserve" => "cuMemAddressReserve",
        "unreserve" => "cuMemAddressFree",
        "alloc" => "cuMemAlloc (an exact-size block)",
        "free" => "cuMemFree",
        "free_sync" => "cudaFree's wait",
        "mem_info" => "cuMemGetInfo",
        "stream_sync" => "stream wait",
        "copy" => "cuMemcpy (a page of a split handle)",
        _ => "pool call",
    }
}

/// Why a miss costs what it does: per kind of driver call, the calls and time of one steady
/// pass (`steady`) or of the warm-up, from the 10-pass run `a` and a 5-pass run of the same:
/// a pass of the steady state is (10 passes - 5 passes) / 5, the warm-up 5 passes less four
/// of those. The dearest three kinds.
fn cause(a: &StrategyResult, five: &StrategyResult, steady: bool) -> String {
    // A figure of the 10-pass and the 5-pass runs as one steady pass, or as the warm-up.
    let part = |ten: f64, five: f64| {
        let per = (ten - five) / 5.0;
        if steady { per } else { five - 4.0 * per }
    };
    let in_five = |k: &str| {
        five.driver_by_kind
            .iter()
            .find(|x| x.kind == k)
            .map_or((0.0, 0.0), |x| (x.calls as f64, x.ns as f64))
    };
    let mut kinds: Vec<(&str, f64, f64)> = a
        .driver_by_kind
        .iter()
        .map(|x| {
            let (c5, n5) = in_five(x.kind);
            (x.kind, part(x.calls as f64, c5), part(x.ns as f64, n5))
        })
        .filter(|&(_, calls, ns)| calls >= 0.5 && ns > 0.0)
        .collect();
    kinds.sort_by(|x, y| y.2.total_cmp(&x.2));
    let mut parts: Vec<String> = kinds
        .iter()
        .take(3)
        .map(|&(k, calls, ns)| format!("{calls:.0} {} {:.1} ms", call_name(k), ns / 1e6))
        .collect();
    // What the other kinds add (negative in a warm-up where a kind costs more a steady pass
    // than it did over the first five), so that the parts add up to the miss's time.
    let total = part(a.modeled_driver_ns as f64, five.modeled_driver_ns as f64);
    let rest = total - kinds.iter().take(3).map(|k| k.2).sum::<f64>();
    if rest.abs() >= 50_000.0 {
        parts.push(format!("the other kinds {:+.1} ms", rest / 1e6));
    }
    format!("{}: {}", if steady { "a pass" } else { "warm-up" }, parts.join(", "))
}

/// What the tuning report of adaptive's run on `t` at `capacity` under `model` advises, as
/// `adaptalloc replay --repeat 10` checks it: the change kept and its warm-up and steady pass
/// over ten passes, or that none was kept.
fn advice(t: &Trace, capacity: u64, model: &CostModel, policy: &Policy) -> String {
    let run = adaptalloc_cli::advice::run_with_advice_over_passes(t, policy, capacity, model);
    let Some(kept) = run.advised else {
        return "the tuning report's advice: none held over ten passes".into();
    };
    // Each reason's remedy: what follows its first ": " (a reason says what happened, then
    // what to change).
    let changes: Vec<&str> = run
        .changes
        .iter()
        .map(|r| r.split_once(": ").map_or(r.as_str(), |(_, change)| change))
        .collect();
    format!(
        "with the tuning report's advice ({}): warm-up {:.1} ms, {:.2} ms a pass",
        changes.join("; "),
        ms(kept.passes.warmup_ns),
        ms(kept.passes.steady_pass_ns)
    )
}

/// Which of issue 24's targets a capacity carries.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Targets {
    /// Peak live times a factor: a steady pass within pytorch's + 0.5 ms, a warm-up within
    /// 1.5x pytorch's.
    Live,
    /// 1.1x passthrough's minimum: no warm-up target, the steady target against the better of
    /// the two PyTorch allocators, wherever either completes.
    NearMin,
    /// Closer to passthrough's minimum, where issue 24 sets none: the table shows what a change
    /// costs there (one that pays at 1.1x can cost at 1.0x and 1.05x), with no misses.
    Shown,
}

/// Issue 24's two price lists: the default model and `tuning/cost-models/vmm-fast.toml`.
pub fn default_models() -> Vec<(String, CostModel)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    vec![
        ("default".into(), CostModel::default()),
        (
            "vmm-fast".into(),
            CostModel::from_file(&root.join("tuning/cost-models/vmm-fast.toml")).expect("parses"),
        ),
    ]
}

/// Prints a table per cost model in `models` (name, model) and capacity (1.0x, 1.05x and 1.1x
/// passthrough's minimum, 1.5x, 2x and 4x peak live) over `traces`, each under a heading of level `h` (`##`),
/// with `policy` (the default where None) as adaptive's: failed allocations, warm-up and steady
/// state a pass in ms, the sums, and every miss of issue 24's targets with its cause and what
/// the run's tuning report advises (checked by replay over ten passes, as `adaptalloc replay
/// --repeat 10` does).
pub fn print_tables(traces: &[Trace], policy: Option<Policy>, models: &[(String, CostModel)], h: &str) {
    let g = Granularity::default();
    let factor = move |t: &Trace, f: f64| Capacity::Factor(f).bytes_for(t.peak_live_bytes(), g.large_granule);
    type Cap = Box<dyn Fn(&Trace) -> u64>;
    let of_min = move |f: f64| move |t: &Trace| round_up((passthrough_min_capacity(t, g) as f64 * f) as u64, 256);
    use Targets::{Live, NearMin, Shown};
    let caps: Vec<(&str, Targets, Cap)> = vec![
        ("1.0x min", Shown, Box::new(of_min(1.0))),
        ("1.05x min", Shown, Box::new(of_min(1.05))),
        ("1.1x min", NearMin, Box::new(of_min(1.1))),
        ("1.5x", Live, Box::new(move |t: &Trace| factor(t, 1.5))),
        ("2x", Live, Box::new(move |t: &Trace| factor(t, 2.0))),
        ("4x", Live, Box::new(move |t: &Trace| factor(t, 4.0))),
    ];
    let peers = [
        Contender::Pytorch,
        Contender::PytorchExpandable,
        Contender::CudaAsyncRetain,
    ];
    for (model_name, model) in models {
        let opts = CompareOptions {
            cost_model: model.clone(),
            repeat: 10,
            policy: policy.clone(),
            ..CompareOptions::default()
        };
        for (label, targets, cap) in &caps {
            println!("{h} {model_name} cost model, {label}\n");
            println!(
                "| workload | adaptive | pytorch | pytorch-expandable | cuda-async-retain |\n|---|---|---|---|---|"
            );
            let tight = *targets != Live;
            let targeted = *targets != Shown;
            let (mut warm, mut warm_pt, mut steady, mut steady_pt) = (0u64, 0u64, 0u64, 0u64);
            let mut misses = Vec::new();
            let mut failed = 0;
            for t in traces {
                let c = cap(t);
                let a = run_one(t, Contender::Adaptive, c, &opts);
                let rs: Vec<StrategyResult> = peers.iter().map(|&p| run_one(t, p, c, &opts)).collect();
                let p = run_one(
                    t,
                    Contender::Passthrough,
                    c,
                    &CompareOptions {
                        repeat: 1,
                        ..opts.clone()
                    },
                );
                if p.completed {
                    failed += a.failed_allocs;
                }
                let (aw, asd) = (a.warmup_ns.unwrap(), a.steady_pass_ns.unwrap());
                let pt = &rs[0];
                // Steady target: pytorch's (+0.5 ms); at 1.1x min, the better of pytorch and
                // pytorch-expandable wherever either completes.
                let best_steady = rs[..2]
                    .iter()
                    .filter(|r| r.completed && (tight || r.strategy == "pytorch"))
                    .map(|r| r.steady_pass_ns.unwrap())
                    .min();
                // The same run over five passes, for the causes of misses.
                let five = || {
                    run_one(
                        t,
                        Contender::Adaptive,
                        c,
                        &CompareOptions {
                            repeat: 5,
                            ..opts.clone()
                        },
                    )
                };
                let mut a5 = None;
                let mut advised = None;
                let used = policy.clone().unwrap_or_default();
                if let Some(b) = best_steady
                    && targeted
                    && a.completed
                    && asd > b + 500_000
                {
                    let why = cause(&a, a5.get_or_insert_with(five), true);
                    let advice = advised.get_or_insert_with(|| advice(t, c, model, &used));
                    misses.push(format!(
                        "steady {}: {:.2} vs {:.2} ms ({why}); {advice}",
                        t.name,
                        ms(asd),
                        ms(b)
                    ));
                }
                if pt.completed && a.completed {
                    steady += asd;
                    steady_pt += pt.steady_pass_ns.unwrap();
                }
                if !tight && pt.completed && a.completed {
                    warm += aw;
                    warm_pt += pt.warmup_ns.unwrap();
                    if aw as f64 > 1.5 * pt.warmup_ns.unwrap() as f64 {
                        let why = cause(&a, a5.get_or_insert_with(five), false);
                        let advice = advised.get_or_insert_with(|| advice(t, c, model, &used));
                        misses.push(format!(
                            "warm-up {}: {:.1} vs {:.1} ms ({:.1}x; {why}); {advice}",
                            t.name,
                            ms(aw),
                            ms(pt.warmup_ns.unwrap()),
                            aw as f64 / pt.warmup_ns.unwrap().max(1) as f64
                        ));
                    }
                }
                let cells: Vec<String> = std::iter::once(&a)
                    .chain(rs.iter())
                    .map(|r| {
                        format!(
                            "{} / {:.1} / {:.2}",
                            r.failed_allocs,
                            ms(r.warmup_ns.unwrap()),
                            ms(r.steady_pass_ns.unwrap())
                        )
                    })
                    .collect();
                println!("| {} | {} |", t.name, cells.join(" | "));
            }
            println!(
                "\nSums where both complete{}: warm-up adaptive {:.1} ms, pytorch {:.1} ms; steady state {:.2} vs {:.2} ms a \
                 pass. Adaptive's failed allocations where passthrough completes: {failed}. Misses of issue 24's targets: {}.\n",
                match (tight, targeted) {
                    (true, true) => " (no warm-up target at 1.1x)",
                    (true, false) => " (no target at this capacity: issue 24 sets them at 1.1x)",
                    _ => "",
                },
                ms(warm),
                ms(warm_pt),
                ms(steady),
                ms(steady_pt),
                misses.len()
            );
            for m in &misses {
                println!("- {m}");
            }
            println!();
        }
    }
}
