//! `adaptalloc compare`: strategies side by side.

use std::path::PathBuf;

use adaptalloc::policy::Policy;
use adaptalloc_cli::compare::{CompareOptions, compare};
use anyhow::{Context, bail};

use crate::common::{CapacityArgs, CostArgs, ReplayArgs, contenders, emit, load_traces};

#[derive(clap::Args)]
pub struct Args {
    /// Traces (CSV, RMM log or PyTorch snapshot); with none, the bundled synthetic workloads.
    traces: Vec<PathBuf>,
    /// Comma-separated strategies: passthrough, caching, suballoc, adaptive; the allocators users run: pytorch, pytorch-expandable, cuda-async, cuda-async-retain, rmm-pool, iree-caching; gpu-alloc with the `peers` feature. Default: all.
    #[arg(long, value_delimiter = ',')]
    strategies: Vec<String>,
    #[command(flatten)]
    capacity: CapacityArgs,
    #[command(flatten)]
    run: ReplayArgs,
    /// Output format: text, markdown or json.
    #[arg(long, default_value = "text")]
    format: String,
    /// Skip frees of ids that are not live instead of failing.
    #[arg(long)]
    lenient: bool,
    /// Also write the comparison as Markdown to this file.
    #[arg(long)]
    report: Option<PathBuf>,
    /// Plot live, reserved and idle bytes over the first trace, one panel per strategy (SVG).
    #[arg(long)]
    plot: Option<PathBuf>,
    /// The `adaptive` strategy's policy: a preset name or a policy file (default: the default
    /// policy).
    #[arg(long)]
    policy: Option<String>,
    #[command(flatten)]
    prices: CostArgs,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    if !["text", "markdown", "json"].contains(&args.format.as_str()) {
        bail!("--format {:?}: use text, markdown or json", args.format);
    }
    for (path, ext, what) in [
        (&args.report, "md", "--report (Markdown)"),
        (&args.plot, "svg", "--plot (SVG)"),
    ] {
        if let Some(p) = path
            && p.extension().and_then(|e| e.to_str()) != Some(ext)
        {
            bail!("{}: {what} writes a .{ext} file; name it so", p.display());
        }
    }
    let opts = CompareOptions {
        contenders: contenders(&args.strategies)?,
        capacity: args.capacity.capacity()?,
        repeat: args.run.repeat,
        tenant: args.run.tenant,
        pytorch_conf: args.run.pytorch_conf.clone(),
        sync_every: args.run.sync_every,
        policy: args.policy.as_deref().map(Policy::load).transpose()?,
        cost_model: args.prices.model()?,
    };
    let traces = load_traces(&args.traces, args.lenient, args.run.window)?;
    let result = crate::progress::with_spinner("replaying", || compare(&traces, &opts));
    let text = match args.format.as_str() {
        "json" => serde_json::to_string_pretty(&result)? + "\n",
        "markdown" => result.to_markdown(),
        _ => result.to_string(),
    };
    emit(&text)?;
    for path in [&args.report, &args.plot].into_iter().flatten() {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).with_context(|| format!("{}: cannot create", dir.display()))?;
        }
    }
    if let Some(path) = &args.report {
        std::fs::write(path, result.to_markdown()).with_context(|| format!("{}: cannot write", path.display()))?;
    }
    if let (Some(path), Some(first)) = (&args.plot, traces.first()) {
        let granule = adaptalloc::device::Granularity::default().large_granule;
        let capacity = opts.capacity.bytes_for(first.peak_live_bytes(), granule);
        crate::progress::with_spinner("plotting", || crate::plot::plot(path, first, capacity, &opts))?;
    }
    Ok(())
}
