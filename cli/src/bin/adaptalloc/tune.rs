//! `adaptalloc tune`: offline search over policy parameters by replay.

use std::path::PathBuf;

use adaptalloc::policy::Policy;
use anyhow::Context;

use adaptalloc_cli::tune::TuneOptions;

use crate::common::{CapacityArgs, CostArgs, emit, load_traces};

#[derive(clap::Args)]
pub struct Args {
    /// Traces; with none, the bundled synthetic workloads.
    traces: Vec<PathBuf>,
    #[command(flatten)]
    capacity: CapacityArgs,
    #[command(flatten)]
    prices: CostArgs,
    /// Replay each trace N times back to back (N training steps) and rank the variants by the
    /// driver time of all N passes, so that one which saves the first pass but costs every
    /// later one loses: 1 to 10,000.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    repeat: u32,
    /// A co-tenant beside each trace, e.g. 2GiB@0.3..0.6 (as in compare): each take of it the
    /// device refuses counts as a failure, so variants that leave it no room lose.
    #[arg(long)]
    tenant: Option<adaptalloc_cli::compare::TenantSpec>,
    /// Start from this policy file or preset (default: the built-in default).
    #[arg(long)]
    policy: Option<String>,
    /// Write the winning policy here (TOML, loadable with ADAPTALLOC_POLICY).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Skip frees of ids that are not live instead of failing.
    #[arg(long)]
    lenient: bool,
    /// Only part of each trace, e.g. 0.2..0.6 (as in compare).
    #[arg(long)]
    window: Option<adaptalloc_cli::compare::Window>,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let base = match &args.policy {
        None => Policy::default(),
        Some(p) => Policy::load(p)?,
    };
    let traces = load_traces(&args.traces, args.lenient, args.window)?;
    let opts = TuneOptions {
        capacity: args.capacity.capacity()?,
        cost_model: args.prices.model()?,
        repeat: args.repeat,
        tenant: args.tenant,
    };
    let tuning = crate::progress::with_spinner("tuning", || adaptalloc_cli::tune::tune(&traces, &opts, &base));
    if let Some(path) = &args.out {
        std::fs::write(path, tuning.best_policy.to_toml())
            .with_context(|| format!("{}: cannot write", path.display()))?;
    }
    emit(&tuning.to_string())?;
    Ok(())
}
