//! `adaptalloc replay`: one allocator over one trace on SimDevice, with its tuning report.

use std::path::PathBuf;
use std::sync::Arc;

use adaptalloc::device::{Device, Granularity};
use adaptalloc::policy::Policy;
use adaptalloc::profile::RunSummary;
use adaptalloc::size::ByteSize;
use adaptalloc_cli::advice::run_with_advice;
use adaptalloc_cli::compare::{CompareOptions, Contender};
use adaptalloc_cli::trace::{ReplayTarget, load, replay_with};
use anyhow::Context;

use crate::common::{CapacityArgs, CostArgs, ReplayArgs};

#[derive(clap::Args)]
pub struct Args {
    /// The trace (CSV, RMM log or PyTorch snapshot).
    trace: PathBuf,
    /// A policy file, or a preset name (default, training, inference-edge, multi-tenant, ...).
    #[arg(long, conflicts_with = "strategy")]
    policy: Option<String>,
    /// A fixed strategy or a peer instead: passthrough, caching, suballoc, adaptive, pytorch,
    /// pytorch-expandable, cuda-async, cuda-async-retain, rmm-pool, iree-caching.
    #[arg(long)]
    strategy: Option<String>,
    #[command(flatten)]
    capacity: CapacityArgs,
    #[command(flatten)]
    run: ReplayArgs,
    #[command(flatten)]
    prices: CostArgs,
    /// Write the tuning report here (.toml, .json or .md by extension).
    #[arg(long)]
    report: Option<PathBuf>,
    /// Skip frees of ids that are not live instead of failing (they are counted).
    #[arg(long)]
    lenient: bool,
    /// A workload profile, as ADAPTALLOC_PROFILE gives a live run: where the file exists, its
    /// peak is given to the policy (bounds.expected_peak, backing "auto"); the run's figures
    /// are written back. Run twice to see what a second run of the workload costs.
    #[arg(long, conflicts_with = "strategy")]
    profile: Option<PathBuf>,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let trace = load(&args.trace, args.lenient)?;
    let trace = match args.run.window {
        Some(w) => trace.window(w.start, w.end),
        None => trace,
    };
    let granule = Granularity::default().large_granule;
    let capacity = args.capacity.capacity()?.bytes_for(trace.peak_live_bytes(), granule);
    let sim = CompareOptions {
        repeat: args.run.repeat,
        sync_every: args.run.sync_every,
        tenant: args.run.tenant,
        cost_model: args.prices.model()?,
        ..CompareOptions::default()
    };
    let device = || sim.sim_device(&trace, capacity);
    let options = sim.replay_options();
    let contender = match &args.strategy {
        Some(name) => Some(
            Contender::parse(name)
                .with_context(|| format!("unknown strategy {name:?}; known: {}", Contender::known()))?,
        ),
        None => None,
    };
    // The policy the engine runs (a policy given, or the adaptive strategy), or None for a
    // fixed strategy or a peer (no tuning report).
    let mut policy = match (&args.policy, contender) {
        (Some(p), _) => {
            let policy = Policy::load(p)?;
            policy.check_fits(p, capacity)?;
            Some(policy)
        }
        (None, None | Some(Contender::Adaptive)) => Some(Policy::default()),
        (None, Some(_)) => None,
    };
    let (mut profile_note, mut given) = (String::new(), false);
    if let (Some(path), Some(policy)) = (&args.profile, policy.as_mut())
        && let Some(applied) = adaptalloc::profile::apply_file(path, policy, capacity)?
    {
        given = applied.gave_peak();
        profile_note = format!("Profile {}: {applied}.\n", path.display());
    }
    let (m, dev, report) = match (policy, contender) {
        (Some(policy), _) => {
            let run = crate::progress::with_spinner("replaying", || run_with_advice(&trace, &policy, options, device));
            (run.metrics, run.device, Some(run.report))
        }
        (None, Some(c)) => {
            let dev = device();
            let target: Box<dyn ReplayTarget> = match c.build(dev.clone() as Arc<dyn Device>) {
                Some(a) => Box::new(a),
                None => c.target(dev.clone() as Arc<dyn Device>, &args.run.pytorch_conf),
            };
            let m = crate::progress::with_spinner("replaying", || {
                replay_with(&trace, &*target, options, |i| dev.advance_clock(i))
            });
            (m, dev, None)
        }
        (None, None) => unreachable!("no strategy means the default policy"),
    };
    let mut text = format!(
        "{}: {} events on {}: {} failed allocations, {} driver calls ({} physical allocations + {} frees), modelled \
         driver time {:.1} ms, peak live {}, peak reserved {}, {} tenant failures{}\nPriced by: {}.\n",
        trace.name,
        m.events,
        dev.name(),
        m.failed_allocs,
        m.driver_calls,
        m.driver_allocs,
        m.driver_frees,
        m.modeled_driver_ns as f64 / 1e6,
        ByteSize(m.peak_live_bytes),
        ByteSize(m.peak_reserved_bytes),
        dev.tenant_failures(),
        if args.lenient {
            format!(", {} unknown frees skipped", trace.skipped_frees)
        } else {
            String::new()
        },
        sim.cost_model.description,
    );
    text += &profile_note;
    match report {
        Some(report) => {
            if let Some(path) = &args.profile
                && let Some(p) = adaptalloc::profile::record(path, RunSummary::of(&report, given))?
            {
                text += &format!(
                    "Profile {} written: peak {} over {} runs.\n",
                    path.display(),
                    ByteSize(p.peak_footprint_bytes),
                    p.runs
                );
            }
            text += &format!("\n{report}");
            if let Some(path) = &args.report {
                report
                    .write_to(path)
                    .with_context(|| format!("{}: cannot write the report", path.display()))?;
            }
        }
        None => {
            if args.report.is_some() {
                eprintln!("note: fixed strategies have no policy engine, so no tuning report; use --policy");
            }
        }
    }
    crate::common::emit(&text)?;
    Ok(())
}
