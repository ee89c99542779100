//! Arguments and helpers shared by the subcommands.

use std::path::PathBuf;

use adaptalloc::device::CostModel;
use adaptalloc::size::ByteSize;
use adaptalloc_cli::compare::{Capacity, Contender, Window};
use adaptalloc_cli::synth::{BUNDLED, WorkloadSpec};
use adaptalloc_cli::trace::{Trace, load};
use anyhow::{Context, bail};

/// The simulated device's capacity.
#[derive(clap::Args, Clone, Debug)]
pub struct CapacityArgs {
    /// Device capacity, e.g. 24GiB (default 80GiB).
    #[arg(long, conflicts_with = "capacity_factor")]
    pub capacity: Option<ByteSize>,
    /// Device capacity as a multiple of each trace's peak live bytes (rounded up to 2 MiB).
    #[arg(long)]
    pub capacity_factor: Option<f64>,
}

impl CapacityArgs {
    pub fn capacity(&self) -> anyhow::Result<Capacity> {
        Ok(match (self.capacity, self.capacity_factor) {
            (Some(b), _) if b.0 == 0 => bail!("--capacity 0: give a positive size"),
            (Some(b), _) => Capacity::Bytes(b.0),
            (None, Some(f)) if f.is_finite() && f > 0.0 => Capacity::Factor(f),
            (None, Some(f)) => bail!("--capacity-factor {f}: give a positive number"),
            (None, None) => Capacity::default(),
        })
    }
}

/// How driver calls are priced on the simulated device.
#[derive(clap::Args, Clone, Debug)]
pub struct CostArgs {
    /// Price driver calls with this cost model file (default: tuning/cost-models/default.toml,
    /// built in; `adaptalloc gpu-bench` writes one for a real GPU).
    #[arg(long)]
    pub cost_model: Option<PathBuf>,
}

impl CostArgs {
    /// The model from the file given (an error names the file and what is wrong in it), or the
    /// built-in default.
    pub fn model(&self) -> anyhow::Result<CostModel> {
        Ok(match &self.cost_model {
            Some(path) => CostModel::from_file(path)?,
            None => CostModel::default(),
        })
    }
}

/// How traces are replayed: repeats and a co-tenant.
#[derive(clap::Args, Clone, Debug)]
pub struct ReplayArgs {
    /// Replay each trace N times back to back (N training steps; blocks still live at the end
    /// of a pass are freed between passes): 1 to 10,000.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub repeat: u32,
    /// A co-tenant, e.g. 2GiB@0.3..0.6: takes 2 GiB at 30% of the events, frees it at 60%.
    #[arg(long)]
    pub tenant: Option<adaptalloc_cli::compare::TenantSpec>,
    /// Replay only part of each trace, e.g. 0.2..0.6: its events from 20% to 60%, without
    /// the frees of blocks allocated before (what a recording of that part would hold).
    #[arg(long)]
    pub window: Option<Window>,
    /// The `pytorch` and `pytorch-expandable` peers' PYTORCH_CUDA_ALLOC_CONF, e.g.
    /// "max_split_size_mb:128,roundup_power2_divisions:4" (PyTorch's defaults when absent).
    #[arg(long, default_value = "")]
    pub pytorch_conf: adaptalloc_cli::peers::PytorchConf,
    /// A synchronization point every N events, besides the end of each pass (where
    /// `cuda-async` gives its unused memory back).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub sync_every: Option<u64>,
}

/// Traces from files (CSV, RMM log or PyTorch snapshot, told apart by content), or the bundled
/// synthetic workloads when no file is given.
/// A `window` cuts each to that part of it.
pub fn load_traces(paths: &[PathBuf], lenient: bool, window: Option<Window>) -> anyhow::Result<Vec<Trace>> {
    let traces: Vec<Trace> = if paths.is_empty() {
        BUNDLED
            .iter()
            .map(|(name, _)| {
                let spec = WorkloadSpec::bundled(name).expect("bundled workload exists");
                spec.generate(spec.seed)
            })
            .collect()
    } else {
        paths
            .iter()
            .map(|p| load(p, lenient).map_err(anyhow::Error::from))
            .collect::<anyhow::Result<_>>()?
    };
    Ok(match window {
        Some(w) => traces.iter().map(|t| t.window(w.start, w.end)).collect(),
        None => traces,
    })
}

/// Strategy names from a comma-separated list (all of them when empty).
pub fn contenders(names: &[String]) -> anyhow::Result<Vec<Contender>> {
    if names.is_empty() {
        return Ok(Contender::all());
    }
    names
        .iter()
        .map(|s| {
            Contender::parse(s.trim()).with_context(|| format!("unknown strategy {s:?}; known: {}", Contender::known()))
        })
        .collect()
}

/// Writes `text` to standard output. A closed pipe (`adaptalloc ... | head`) is an io error the
/// caller passes up; `main` treats it as a normal end, not a failure.
pub fn emit(text: &str) -> std::io::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes())?;
    out.flush()
}
