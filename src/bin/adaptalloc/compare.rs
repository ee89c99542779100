//! `adaptalloc compare`: strategies side by side.

use std::path::PathBuf;

use adaptalloc::compare::{Capacity, CompareOptions, Contender, compare};
use adaptalloc::size::ByteSize;
use adaptalloc::synth::{BUNDLED, WorkloadSpec};
use adaptalloc::trace::{Trace, read_csv};
use anyhow::{Context, bail};

#[derive(clap::Args)]
pub struct Args {
    /// CSV traces; with none, the bundled synthetic workloads (tuning/workloads/).
    traces: Vec<PathBuf>,
    /// Comma-separated strategies: passthrough, caching, suballoc, adaptive. Default: all.
    #[arg(long, value_delimiter = ',')]
    strategies: Vec<String>,
    /// Device capacity, e.g. 24GiB (default 80GiB).
    #[arg(long, conflicts_with = "capacity_factor")]
    capacity: Option<ByteSize>,
    /// Device capacity as a multiple of each trace's peak live bytes.
    #[arg(long)]
    capacity_factor: Option<f64>,
    /// Replay each trace N times back to back (N training steps).
    #[arg(long, default_value_t = 1)]
    repeat: u32,
    /// Output format: text or json.
    #[arg(long, default_value = "text")]
    format: String,
    /// Skip frees of ids that are not live instead of failing.
    #[arg(long)]
    lenient: bool,
}

pub fn load_traces(paths: &[PathBuf], lenient: bool) -> anyhow::Result<Vec<Trace>> {
    if paths.is_empty() {
        return Ok(BUNDLED
            .iter()
            .map(|(name, _)| {
                let spec = WorkloadSpec::bundled(name).expect("bundled workload exists");
                spec.generate(spec.seed)
            })
            .collect());
    }
    paths
        .iter()
        .map(|p| read_csv(p, lenient).map_err(anyhow::Error::from))
        .collect()
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let contenders = if args.strategies.is_empty() {
        Contender::ALL.to_vec()
    } else {
        args.strategies
            .iter()
            .map(|s| {
                Contender::parse(s.trim())
                    .with_context(|| format!("unknown strategy {s:?}; known: passthrough, caching, suballoc, adaptive"))
            })
            .collect::<anyhow::Result<_>>()?
    };
    let capacity = match (args.capacity, args.capacity_factor) {
        (Some(b), _) => Capacity::Bytes(b.0),
        (None, Some(f)) if f.is_finite() && f > 0.0 => Capacity::Factor(f),
        (None, Some(f)) => bail!("--capacity-factor {f}: give a positive number"),
        (None, None) => Capacity::default(),
    };
    let traces = load_traces(&args.traces, args.lenient)?;
    let opts = CompareOptions {
        contenders,
        capacity,
        repeat: args.repeat.max(1),
        ..Default::default()
    };
    let result = compare(&traces, &opts);
    match args.format.as_str() {
        "text" => print!("{result}"),
        "json" => println!("{}", serde_json::to_string_pretty(&result)?),
        other => bail!("--format {other:?}: use text or json"),
    }
    Ok(())
}
