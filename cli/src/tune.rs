//! Offline tuning: replays traces under the base policy and a grid of variants of it on
//! SimDevice and picks the one that fails least, then takes the least modelled driver time
//! over all passes (with `repeat` passes, a training loop of that many steps: the first pass
//! and every later one count), then makes the fewest driver calls, then reserves least. The
//! base policy is the first row (the baseline), so a grid that cannot beat it says so. Driver
//! calls are priced by the cost model given (a GPU's own, from `adaptalloc gpu-bench`), so the
//! winner follows the prices.

use serde::Serialize;

use crate::compare::{Capacity, CompareOptions, Contender, TenantSpec, replay_one, smallest_capacity};
use crate::trace::Trace;
use adaptalloc::device::{CostModel, Granularity};
use adaptalloc::policy::{Policy, Segregate, SizeOrFraction};
use adaptalloc::size::ByteSize;
use adaptalloc::strategy::SlabBacking;

/// One policy variant over every trace.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Trial {
    /// What differs from the base policy.
    pub label: String,
    pub failed_allocs: u64,
    /// Takes of the co-tenant the device refused (with `TuneOptions::tenant`).
    pub tenant_failures: u64,
    pub driver_calls: u64,
    pub modeled_driver_ns: u64,
    /// Of that, the first passes and the steady state (the mean of a later pass), summed over
    /// the traces; zero with one pass.
    pub first_pass_ns: u64,
    pub steady_pass_ns: u64,
    /// The worst peak reserved / peak live over the traces.
    pub max_reserved_over_live: f64,
}

impl Trial {
    /// What ranks first: failed allocations, and the co-tenant's refused takes.
    pub fn failures(&self) -> u64 {
        self.failed_allocs + self.tenant_failures
    }

    /// Its failed allocations, and with a co-tenant replayed its refused takes: "3", or
    /// "3 (+1 co-tenant)". The table and the verdict show both the same way.
    fn failed_text(&self, tenant: bool) -> String {
        if tenant {
            format!("{} (+{} co-tenant)", self.failed_allocs, self.tenant_failures)
        } else {
            self.failed_allocs.to_string()
        }
    }
}

/// How `tune` replays: the device, the prices and the passes.
#[derive(Clone, Debug)]
pub struct TuneOptions {
    pub capacity: Capacity,
    /// Prices every driver call (the built-in default model, or a GPU's).
    pub cost_model: CostModel,
    /// Passes of each trace, back to back (1 to 10,000).
    pub repeat: u32,
    /// A co-tenant taking memory mid-run: each take it is refused counts as a failure, so a
    /// variant that keeps more idle memory than the co-tenant leaves room for loses.
    pub tenant: Option<TenantSpec>,
}

/// What `tune` tried, and the winner.
#[derive(Clone, Debug, Serialize)]
pub struct Tuning {
    pub trials: Vec<Trial>,
    pub best: usize,
    pub best_policy: Policy,
    pub why: String,
    /// Passes of each trace, and the cost model's description.
    pub repeat: u32,
    pub prices: String,
    /// A co-tenant was replayed beside each trace.
    pub tenant: bool,
    /// What the winner gives up, where it is not the base policy: the smallest device on which
    /// each trace completes (every pass) under the base policy and under the winner.
    pub smallest: Vec<Smallest>,
}

/// The smallest device (to 0.5%, up to 64x peak live) on which one trace completes.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Smallest {
    pub trace: String,
    pub peak_live_bytes: u64,
    /// None where it fails even at 64x peak live.
    pub base_bytes: Option<u64>,
    pub winner_bytes: Option<u64>,
}

impl TuneOptions {
    /// How `adaptive` under `policy` is replayed: these prices, passes and co-tenant.
    fn compare(&self, policy: &Policy) -> CompareOptions {
        CompareOptions {
            contenders: vec![Contender::Adaptive],
            repeat: self.repeat.max(1),
            cost_model: self.cost_model.clone(),
            policy: Some(policy.clone()),
            tenant: self.tenant,
            ..CompareOptions::default()
        }
    }
}

/// The label of the base policy's row.
pub const BASELINE: &str = "the base policy (baseline)";

fn variants(base: &Policy) -> Vec<(String, Policy)> {
    let mut out = vec![(BASELINE.to_string(), base.clone())];
    for spare_share in [0.25, 0.5, 0.75] {
        for loose in [0.25, 0.5, 1.0] {
            for seg in [Segregate::Never, Segregate::Always] {
                for tight in [0.20, 0.35, 0.60] {
                    let mut p = base.clone();
                    p.bounds.spare_share = spare_share;
                    p.suballoc.loose_growth = loose;
                    p.suballoc.segregate = seg;
                    p.bounds.tight_below = SizeOrFraction::Fraction(tight);
                    let seg_name = if seg == Segregate::Always { "always" } else { "never" };
                    let label = format!(
                        "spare_share {spare_share}, loose_growth {loose}, segregate {seg_name}, tight_below {:.0}%",
                        tight * 100.0
                    );
                    out.push((label, p));
                }
            }
        }
    }
    // Each other backing with the base policy's other settings: the backing decides the
    // warm-up (README, "The cost model"), and which one is cheapest depends on the prices.
    for backing in [
        SlabBacking::Auto,
        SlabBacking::Pages,
        SlabBacking::Blocks,
        SlabBacking::LargeHandles,
        SlabBacking::Whole,
    ] {
        if backing != base.suballoc.backing {
            let mut p = base.clone();
            p.suballoc.backing = backing;
            out.push((format!("suballoc.backing {}", backing_name(backing)), p));
        }
    }
    out
}

/// The policy file's word for `backing`, as the policy's own serialization writes it.
fn backing_name(backing: SlabBacking) -> String {
    let name = serde_json::to_value(backing).expect("a unit variant serializes");
    name.as_str().expect("a unit variant serializes as its name").to_owned()
}

/// Tunes `base` for `traces` on devices of `opts.capacity`, priced by `opts.cost_model`.
pub fn tune(traces: &[Trace], opts: &TuneOptions, base: &Policy) -> Tuning {
    let granule = Granularity::default().large_granule;
    let candidates = variants(base);
    let trials: Vec<Trial> = candidates
        .iter()
        .map(|(label, policy)| {
            let compare = opts.compare(policy);
            let mut t = Trial {
                label: label.clone(),
                failed_allocs: 0,
                tenant_failures: 0,
                driver_calls: 0,
                modeled_driver_ns: 0,
                first_pass_ns: 0,
                steady_pass_ns: 0,
                max_reserved_over_live: 0.0,
            };
            for trace in traces {
                let cap = opts.capacity.bytes_for(trace.peak_live_bytes(), granule);
                let (m, dev) = replay_one(trace, Contender::Adaptive, cap, &compare);
                t.failed_allocs += m.failed_allocs;
                t.tenant_failures += dev.tenant_failures();
                t.driver_calls += m.driver_calls;
                t.modeled_driver_ns += m.modeled_driver_ns;
                t.first_pass_ns += m.passes.first_pass_ns;
                t.steady_pass_ns += m.passes.steady_pass_ns;
                let ratio = m.peak_reserved_bytes as f64 / m.peak_live_bytes.max(1) as f64;
                t.max_reserved_over_live = t.max_reserved_over_live.max(ratio);
            }
            t
        })
        .collect();
    let rank = |x: &Trial, y: &Trial| {
        (x.failures(), x.modeled_driver_ns, x.driver_calls)
            .cmp(&(y.failures(), y.modeled_driver_ns, y.driver_calls))
            .then(x.max_reserved_over_live.total_cmp(&y.max_reserved_over_live))
    };
    // Ties go to the earlier row: the baseline wins unless a variant is strictly better.
    let best = (0..trials.len())
        .min_by(|&a, &b| rank(&trials[a], &trials[b]).then(a.cmp(&b)))
        .expect("the grid is not empty");
    let w = &trials[best];
    let runner_up = trials
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != best)
        .min_by(|a, b| rank(a.1, b.1))
        .map(|(_, t)| t);
    let ms = |t: &Trial| t.modeled_driver_ns as f64 / 1e6;
    let tenant = opts.tenant.is_some();
    let why = match runner_up {
        Some(r) => format!(
            "{} failed allocations and {:.1} ms modelled driver time ({} driver calls) over {} trace(s){}, against \
             the runner-up's {} and {:.1} ms ({}); the baseline's {} and {:.1} ms; worst reserved/live {:.2}x",
            w.failed_text(tenant),
            ms(w),
            w.driver_calls,
            traces.len(),
            if opts.repeat > 1 {
                format!(" of {} passes", opts.repeat)
            } else {
                String::new()
            },
            r.failed_text(tenant),
            ms(r),
            r.label,
            trials[0].failed_text(tenant),
            ms(&trials[0]),
            w.max_reserved_over_live
        ),
        None => "the only candidate".into(),
    };
    let smallest = if best == 0 {
        Vec::new()
    } else {
        traces
            .iter()
            .map(|t| Smallest {
                trace: t.name.clone(),
                peak_live_bytes: t.peak_live_bytes(),
                base_bytes: smallest_capacity(t, Contender::Adaptive, &opts.compare(base)),
                winner_bytes: smallest_capacity(t, Contender::Adaptive, &opts.compare(&candidates[best].1)),
            })
            .collect()
    };
    let mut best_policy = candidates[best].1.clone();
    best_policy.description = format!("tuned by adaptalloc tune: {}", w.label);
    Tuning {
        trials,
        best,
        best_policy,
        why,
        repeat: opts.repeat.max(1),
        prices: opts.cost_model.description.clone(),
        tenant: opts.tenant.is_some(),
        smallest,
    }
}

impl std::fmt::Display for Tuning {
    /// Markdown: the winner, why, and every trial.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "# adaptalloc tune\n\nWinner: {}.\n\nWhy: {}.\n",
            self.trials[self.best].label, self.why
        )?;
        if self.best == 0 {
            writeln!(f, "No variant beats the base policy: keep it.\n")?;
        } else {
            writeln!(
                f,
                "To apply it: `adaptalloc tune ... --out FILE.toml` writes it; run with \
                 `ADAPTALLOC_POLICY=FILE.toml`.\n"
            )?;
        }
        if !self.smallest.is_empty() {
            writeln!(
                f,
                "What the winner gives up: the smallest device on which each trace completes (to 0.5%), under the base \
                 policy and under the winner. Tuned for one capacity, it may fail on a smaller device where the base \
                 policy would not.\n"
            )?;
            writeln!(f, "| trace | peak live | base policy | winner |")?;
            writeln!(f, "|---|---|---|---|")?;
            let at = |b: Option<u64>, peak: u64| match b {
                Some(b) => format!("{} ({:.3}x)", ByteSize(b), b as f64 / peak.max(1) as f64),
                None => "never (64x)".into(),
            };
            for s in &self.smallest {
                writeln!(
                    f,
                    "| {} | {} | {} | {} |",
                    s.trace,
                    ByteSize(s.peak_live_bytes),
                    at(s.base_bytes, s.peak_live_bytes),
                    at(s.winner_bytes, s.peak_live_bytes)
                )?;
            }
            writeln!(f)?;
        }
        writeln!(f, "Priced by: {}.\n", self.prices)?;
        if self.tenant {
            writeln!(
                f,
                "A co-tenant was replayed beside each trace: each take the device refused it counts as a failed \
                 allocation.\n"
            )?;
        } else {
            writeln!(
                f,
                "No co-tenant was replayed: a variant that keeps more memory idle (a higher bounds.spare_share) leaves \
                 less to other processes; `--tenant SIZE@START..END` ranks with one beside each trace.\n"
            )?;
        }
        let passes = self.repeat > 1;
        if passes {
            writeln!(
                f,
                "Each trace replayed {} times back to back; driver time is all of them, split into the first pass and \
                 the steady state (the mean of a later pass), summed over the traces.\n",
                self.repeat
            )?;
            writeln!(
                f,
                "| policy variant | failed | driver calls | driver time (ms) | first pass (ms) | steady/pass (ms) | worst \
                 reserved/live |"
            )?;
            writeln!(f, "|---|---|---|---|---|---|---|")?;
        } else {
            writeln!(
                f,
                "One pass of each trace: a variant that saves the first pass but pays again on every later one can \
                 win here; `--repeat N` ranks by N passes (N training steps).\n"
            )?;
            writeln!(
                f,
                "| policy variant | failed | driver calls | driver time (ms) | worst reserved/live |"
            )?;
            writeln!(f, "|---|---|---|---|---|")?;
        }
        let ms = |ns: u64| ns as f64 / 1e6;
        for (i, t) in self.trials.iter().enumerate() {
            let mark = if i == self.best { " **(winner)**" } else { "" };
            let split = if passes {
                format!(" {:.1} | {:.2} |", ms(t.first_pass_ns), ms(t.steady_pass_ns))
            } else {
                String::new()
            };
            let failed = t.failed_text(self.tenant);
            writeln!(
                f,
                "| {}{} | {} | {} | {:.1} |{} {:.2} |",
                t.label,
                mark,
                failed,
                t.driver_calls,
                ms(t.modeled_driver_ns),
                split,
                t.max_reserved_over_live
            )?;
        }
        Ok(())
    }
}
