//! The `adaptalloc` command line. This file only parses arguments and dispatches; each
//! subcommand lives in a file of its own. Errors print one line and exit with code 2.

mod common;
mod compare;
mod gpubench;
mod import;
mod plot;
mod policy;
mod progress;
mod replay;
mod sweep;
mod synth;
mod tune;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "adaptalloc",
    version,
    about = "What each GPU allocation strategy would do on your workload and device"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Strategies side by side on traces (or the bundled synthetic workloads) on a simulated device.
    Compare(compare::Args),
    /// One allocator over one trace, with its tuning report.
    Replay(replay::Args),
    /// The smallest device on which each strategy completes each trace.
    Sweep(sweep::Args),
    /// A PyTorch memory snapshot or an RMM log to the CSV trace format.
    Import(import::Args),
    /// A deterministic synthetic workload as a CSV trace.
    Synth(synth::Args),
    /// Searches policy parameters by replay and writes the best policy.
    Tune(tune::Args),
    /// On an NVIDIA GPU: calibrate the cost model and replay traces through the driver.
    GpuBench(gpubench::Args),
    /// Check or show policy files.
    #[command(subcommand)]
    Policy(policy::Command),
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Compare(args) => compare::run(args),
        Command::Replay(args) => replay::run(args),
        Command::Sweep(args) => sweep::run(args),
        Command::Import(args) => import::run(args),
        Command::Synth(args) => synth::run(args),
        Command::Tune(args) => tune::run(args),
        Command::Policy(cmd) => policy::run(cmd),
        Command::GpuBench(args) => gpubench::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        // The reader went away (`adaptalloc ... | head`): not a failure.
        Err(e)
            if e.downcast_ref::<std::io::Error>()
                .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe) =>
        {
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("adaptalloc: {e:#}");
            ExitCode::from(2)
        }
    }
}
