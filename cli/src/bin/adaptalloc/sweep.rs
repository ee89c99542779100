//! `adaptalloc sweep`: the smallest capacity on which each strategy completes each trace.

use std::path::PathBuf;

use adaptalloc::policy::Policy;
use adaptalloc::size::ByteSize;
use adaptalloc_cli::compare::{CompareOptions, smallest_capacity};
use anyhow::bail;
use serde::Serialize;

use crate::common::{contenders, load_traces};

#[derive(clap::Args)]
pub struct Args {
    /// Traces; with none, the bundled synthetic workloads.
    traces: Vec<PathBuf>,
    /// Comma-separated strategies (default: all).
    #[arg(long, value_delimiter = ',')]
    strategies: Vec<String>,
    /// Output format: text or json.
    #[arg(long, default_value = "text")]
    format: String,
    /// Skip frees of ids that are not live instead of failing.
    #[arg(long)]
    lenient: bool,
    /// Only part of each trace, e.g. 0.2..0.6 (as in compare).
    #[arg(long)]
    window: Option<adaptalloc_cli::compare::Window>,
    /// The `pytorch` peers' PYTORCH_CUDA_ALLOC_CONF (as in compare).
    #[arg(long, default_value = "")]
    pytorch_conf: adaptalloc_cli::peers::PytorchConf,
    /// The `adaptive` strategy's policy: a preset name or a policy file (default: the default
    /// policy), e.g. the one `tune` or a tuning report recommended, to see where it still
    /// completes.
    #[arg(long)]
    policy: Option<String>,
    /// Replay each trace N times back to back: a capacity counts only where every pass
    /// completes (1 to 10,000).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    repeat: u32,
}

#[derive(Serialize)]
struct MinCapacity {
    strategy: String,
    /// None when it fails even at 64x peak live.
    bytes: Option<u64>,
    factor: Option<f64>,
}

#[derive(Serialize)]
struct TraceSweep {
    trace: String,
    peak_live_bytes: u64,
    min_capacity: Vec<MinCapacity>,
}

#[derive(Serialize)]
struct Sweep {
    /// The `adaptive` strategy's policy (the preset or file given, or "default") and the
    /// passes replayed.
    policy: String,
    repeat: u32,
    traces: Vec<TraceSweep>,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    if !["text", "json"].contains(&args.format.as_str()) {
        bail!("--format {:?}: use text or json", args.format);
    }
    let list = contenders(&args.strategies)?;
    let traces = load_traces(&args.traces, args.lenient, args.window)?;
    let opts = CompareOptions {
        pytorch_conf: args.pytorch_conf.clone(),
        policy: args.policy.as_deref().map(Policy::load).transpose()?,
        repeat: args.repeat,
        ..Default::default()
    };
    let policy = args.policy.clone().unwrap_or_else(|| "default".into());
    let sweep = crate::progress::with_spinner("searching capacities", || Sweep {
        policy,
        repeat: args.repeat,
        traces: traces
            .iter()
            .map(|t| {
                let peak = t.peak_live_bytes();
                TraceSweep {
                    trace: t.name.clone(),
                    peak_live_bytes: peak,
                    min_capacity: list
                        .iter()
                        .map(|&c| {
                            let bytes = smallest_capacity(t, c, &opts);
                            MinCapacity {
                                strategy: c.name().into(),
                                bytes,
                                factor: bytes.map(|b| b as f64 / peak.max(1) as f64),
                            }
                        })
                        .collect(),
                }
            })
            .collect(),
    });
    if args.format == "json" {
        crate::common::emit(&(serde_json::to_string_pretty(&sweep)? + "\n"))?;
        return Ok(());
    }
    let mut text = String::new();
    if args.policy.is_some() || args.repeat > 1 {
        text += &format!(
            "adaptive's policy: {}; {} pass(es) of each trace\n",
            sweep.policy, sweep.repeat
        );
    }
    for t in &sweep.traces {
        text += &format!("{}: peak live {}\n", t.trace, ByteSize(t.peak_live_bytes));
        for m in &t.min_capacity {
            text += &match (m.bytes, m.factor) {
                (Some(b), Some(f)) => format!(
                    "  {:<18} {:>12}  {:.3}x peak live\n",
                    m.strategy,
                    ByteSize(b).to_string(),
                    f
                ),
                _ => format!("  {:<18} {:>12}\n", m.strategy, "never (64x)"),
            };
        }
    }
    crate::common::emit(&text)?;
    Ok(())
}
