//! `adaptalloc import`: a PyTorch snapshot or RMM log to the CSV trace format.

use std::path::PathBuf;

use adaptalloc_cli::trace::{load, write_csv};
use anyhow::Context;

#[derive(clap::Args)]
pub struct Args {
    /// A PyTorch CUDA memory snapshot pickle or an RMM log (or a CSV trace, re-checked).
    file: PathBuf,
    /// The CSV trace to write.
    #[arg(long)]
    out: PathBuf,
    /// Skip frees of pointers that are not live (RMM logs).
    #[arg(long)]
    lenient: bool,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let trace = crate::progress::with_spinner("reading", || load(&args.file, args.lenient))?;
    let mut f = std::fs::File::create(&args.out).with_context(|| format!("{}: cannot create", args.out.display()))?;
    write_csv(&trace, &mut f).with_context(|| format!("{}: cannot write", args.out.display()))?;
    eprintln!(
        "{}: {} events ({} allocations), peak live {}",
        args.out.display(),
        trace.events.len(),
        trace.allocs(),
        adaptalloc::size::ByteSize(trace.peak_live_bytes())
    );
    Ok(())
}
