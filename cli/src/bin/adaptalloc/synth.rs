//! `adaptalloc synth`: a deterministic synthetic workload as a CSV trace.

use std::path::PathBuf;

use adaptalloc_cli::synth::{BUNDLED, WorkloadSpec};
use adaptalloc_cli::trace::write_csv;
use anyhow::Context;

#[derive(clap::Args)]
pub struct Args {
    /// A bundled workload (training, serving, phase-change, small-churn) or a workload TOML file.
    kind: String,
    /// Seed (default: the workload's own).
    #[arg(long)]
    seed: Option<u64>,
    /// Write the CSV here instead of standard output.
    #[arg(long)]
    out: Option<PathBuf>,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let spec = match WorkloadSpec::bundled(&args.kind) {
        Some(spec) => spec,
        None if std::path::Path::new(&args.kind).exists() => WorkloadSpec::from_file(std::path::Path::new(&args.kind))?,
        None => {
            let names: Vec<&str> = BUNDLED.iter().map(|(n, _)| *n).collect();
            anyhow::bail!(
                "no workload {:?}: give a file or one of {}",
                args.kind,
                names.join(", ")
            );
        }
    };
    let trace = spec.generate(args.seed.unwrap_or(spec.seed));
    match &args.out {
        Some(path) => {
            let mut f = std::fs::File::create(path).with_context(|| format!("{}: cannot create", path.display()))?;
            write_csv(&trace, &mut f).with_context(|| format!("{}: cannot write", path.display()))?;
            eprintln!(
                "{}: {} events, peak live {}",
                path.display(),
                trace.events.len(),
                adaptalloc::size::ByteSize(trace.peak_live_bytes())
            );
        }
        None => write_csv(&trace, &mut std::io::stdout().lock())?,
    }
    Ok(())
}
