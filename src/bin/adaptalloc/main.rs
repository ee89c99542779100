//! The `adaptalloc` command line. This file only parses arguments and dispatches; each
//! subcommand lives in a file of its own.

mod compare;

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
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Compare(args) => compare::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("adaptalloc: {e:#}");
            ExitCode::from(2)
        }
    }
}
