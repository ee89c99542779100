//! `adaptalloc tune`: offline search over policy parameters by replay.

use std::path::PathBuf;

use adaptalloc::policy::Policy;
use anyhow::Context;

use crate::common::{CapacityArgs, emit, load_traces};

#[derive(clap::Args)]
pub struct Args {
    /// Traces; with none, the bundled synthetic workloads.
    traces: Vec<PathBuf>,
    #[command(flatten)]
    capacity: CapacityArgs,
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
    let capacity = args.capacity.capacity()?;
    let tuning = crate::progress::with_spinner("tuning", || adaptalloc_cli::tune::tune(&traces, capacity, &base));
    if let Some(path) = &args.out {
        std::fs::write(path, tuning.best_policy.to_toml())
            .with_context(|| format!("{}: cannot write", path.display()))?;
    }
    emit(&tuning.to_string())?;
    Ok(())
}
