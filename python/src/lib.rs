//! The extension module of the `adaptalloc` Python package (`adaptalloc._native`): snapshot
//! analysis through the command line's lab, and, compiled into the same shared library, the C
//! ABI (`capi/src/lib.rs`, declared in `include/adaptalloc.h`) that PyTorch's
//! `CUDAPluggableAllocator` loads by this file's path (`adaptalloc.library_path()`).

// The C ABI: FFI entry points (their own `unsafe` blocks, each with its SAFETY comment).
#[path = "../../capi/src/lib.rs"]
mod capi;

use std::path::Path;

use adaptalloc_cli::compare::{Capacity, CompareOptions, Contender, compare};
use adaptalloc_cli::peers::PytorchConf;
use adaptalloc_cli::trace::{Trace, load, parse_snapshot};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

/// A trace from a path (a snapshot, CSV or RMM log) or from the bytes of a pickled snapshot.
fn trace_of(path: Option<&str>, bytes: Option<&[u8]>) -> PyResult<Trace> {
    let err = |e: String| PyValueError::new_err(e);
    match (path, bytes) {
        (Some(p), None) => load(Path::new(p), false).map_err(|e| err(e.to_string())),
        (None, Some(b)) => parse_snapshot(b, "snapshot").map_err(|e| err(e.to_string())),
        _ => Err(err("give a snapshot as a path or as bytes, not both".into())),
    }
}

/// The device size: `capacity` bytes, or `capacity_factor` x each trace's peak live bytes, or
/// the command line's default (80 GiB).
fn capacity_of(capacity: Option<u64>, factor: Option<f64>) -> PyResult<Capacity> {
    match (capacity, factor) {
        (Some(_), Some(_)) => Err(PyValueError::new_err("give capacity or capacity_factor, not both")),
        (Some(0), None) => Err(PyValueError::new_err("capacity must be more than 0 bytes")),
        (Some(b), None) => Ok(Capacity::Bytes(b)),
        (None, Some(f)) if !(f.is_finite() && f > 0.0) => Err(PyValueError::new_err(format!(
            "capacity_factor must be a positive number (got {f})"
        ))),
        (None, Some(f)) => Ok(Capacity::Factor(f)),
        (None, None) => Ok(Capacity::default()),
    }
}

/// Passes of the trace, back to back: 1 to 10,000, as the command line's `--repeat`.
fn repeat_of(repeat: u32) -> PyResult<u32> {
    if (1..=10_000).contains(&repeat) {
        Ok(repeat)
    } else {
        Err(PyValueError::new_err(format!(
            "repeat must be 1 to 10,000 (got {repeat})"
        )))
    }
}

/// The cost model in the file at `path` (an error names the file, line and key), or the
/// built-in default.
fn cost_model_of(path: Option<&str>) -> PyResult<adaptalloc_core::device::CostModel> {
    match path {
        Some(p) => adaptalloc_core::device::CostModel::from_file(Path::new(p))
            .map_err(|e| PyValueError::new_err(e.to_string())),
        None => Ok(Default::default()),
    }
}

/// The policy `policy` names (a preset or a file; an error names the file, line and key), or
/// the default.
fn policy_of(policy: Option<&str>) -> PyResult<adaptalloc_core::policy::Policy> {
    match policy {
        Some(p) => adaptalloc_core::policy::Policy::load(p).map_err(|e| PyValueError::new_err(e.to_string())),
        None => Ok(Default::default()),
    }
}

/// `adaptalloc compare --format json` on one snapshot: every strategy and peer (or
/// `strategies`), `repeat` passes, priced by the cost model at `cost_model` (a file), as a JSON
/// string.
#[pyfunction]
#[pyo3(signature = (path=None, data=None, capacity=None, capacity_factor=None, strategies=None, pytorch_conf=None, repeat=1, cost_model=None))]
#[allow(clippy::too_many_arguments)] // Python's keyword arguments, one each
fn compare_json(
    path: Option<&str>,
    data: Option<&[u8]>,
    capacity: Option<u64>,
    capacity_factor: Option<f64>,
    strategies: Option<Vec<String>>,
    pytorch_conf: Option<&str>,
    repeat: u32,
    cost_model: Option<&str>,
) -> PyResult<String> {
    let trace = trace_of(path, data)?;
    let contenders = match strategies {
        None => Contender::all(),
        Some(names) => names
            .iter()
            .map(|n| {
                Contender::parse(n).ok_or_else(|| {
                    PyValueError::new_err(format!("unknown strategy {n:?}; known: {}", Contender::known()))
                })
            })
            .collect::<PyResult<Vec<_>>>()?,
    };
    let pytorch_conf: PytorchConf = pytorch_conf
        .unwrap_or("")
        .parse()
        .map_err(|e: adaptalloc_cli::peers::pytorch::ConfError| PyValueError::new_err(e.to_string()))?;
    let opts = CompareOptions {
        contenders,
        capacity: capacity_of(capacity, capacity_factor)?,
        pytorch_conf,
        repeat: repeat_of(repeat)?,
        cost_model: cost_model_of(cost_model)?,
        ..CompareOptions::default()
    };
    serde_json::to_string(&compare(&[trace], &opts)).map_err(|e| PyValueError::new_err(e.to_string()))
}

/// The tuning report (Markdown) of the default policy, or `policy` (a preset name or a policy
/// file), replaying one snapshot `repeat` times, priced by the cost model at `cost_model`; its
/// recommendation replayed as `adaptalloc replay` does
/// ([`adaptalloc_cli::advice::run_with_advice`]).
#[pyfunction]
#[pyo3(signature = (path=None, data=None, capacity=None, capacity_factor=None, policy=None, repeat=1, cost_model=None))]
fn report_markdown(
    path: Option<&str>,
    data: Option<&[u8]>,
    capacity: Option<u64>,
    capacity_factor: Option<f64>,
    policy: Option<&str>,
    repeat: u32,
    cost_model: Option<&str>,
) -> PyResult<String> {
    use adaptalloc_cli::advice::run_with_advice;
    use adaptalloc_core::device::Granularity;
    let trace = trace_of(path, data)?;
    let policy = policy_of(policy)?;
    let cap = capacity_of(capacity, capacity_factor)?
        .bytes_for(trace.peak_live_bytes(), Granularity::default().large_granule);
    let sim = CompareOptions {
        repeat: repeat_of(repeat)?,
        cost_model: cost_model_of(cost_model)?,
        ..CompareOptions::default()
    };
    let run = run_with_advice(&trace, &policy, sim.replay_options(), || sim.sim_device(&trace, cap));
    Ok(run.report.to_string())
}

/// `adaptalloc tune` on one snapshot: the base policy (`policy`, or the default) and a grid of
/// variants replayed `repeat` times on a simulated device, priced by `cost_model`, beside the
/// co-tenant `tenant` (`SIZE@START..END`) if given; as a JSON string with the winner's policy
/// file (`policy_toml`) and the Markdown table (`markdown`) added.
#[pyfunction]
#[pyo3(signature = (path=None, data=None, capacity=None, capacity_factor=None, policy=None, repeat=1, cost_model=None, tenant=None))]
#[allow(clippy::too_many_arguments)] // Python's keyword arguments, one each
fn tune_json(
    path: Option<&str>,
    data: Option<&[u8]>,
    capacity: Option<u64>,
    capacity_factor: Option<f64>,
    policy: Option<&str>,
    repeat: u32,
    cost_model: Option<&str>,
    tenant: Option<&str>,
) -> PyResult<String> {
    use adaptalloc_cli::compare::TenantSpec;
    use adaptalloc_cli::tune::{TuneOptions, tune};
    let trace = trace_of(path, data)?;
    let base = policy_of(policy)?;
    let opts = TuneOptions {
        capacity: capacity_of(capacity, capacity_factor)?,
        cost_model: cost_model_of(cost_model)?,
        repeat: repeat_of(repeat)?,
        tenant: tenant
            .map(|t| t.parse::<TenantSpec>())
            .transpose()
            .map_err(PyValueError::new_err)?,
    };
    let tuning = tune(&[trace], &opts, &base);
    let mut json = serde_json::to_value(&tuning).map_err(|e| PyValueError::new_err(e.to_string()))?;
    json["policy_toml"] = tuning.best_policy.to_toml().into();
    json["markdown"] = tuning.to_string().into();
    Ok(json.to_string())
}

/// Checks a policy (a preset name or a file) as the allocator will read it: a ValueError that
/// names the preset, or the file, line and key, before anything is swapped.
#[pyfunction]
fn check_policy(policy: &str) -> PyResult<()> {
    policy_of(Some(policy)).map(|_| ())
}

/// Checks a workload profile as the allocator will read it: a ValueError naming the file, line
/// and key where it exists and does not read (a missing file is a first run).
#[pyfunction]
fn check_profile(path: &str) -> PyResult<()> {
    adaptalloc_core::profile::Profile::read(std::path::Path::new(path))
        .map(|_| ())
        .map_err(|e| PyValueError::new_err(e.to_string()))
}

/// `device`'s statistics under the keys of PyTorch's `torch.cuda.memory_stats()`, with
/// PyTorch's meanings (docs/pytorch.md has the table); None when nothing was allocated on it.
#[pyfunction]
fn torch_stats(device: i32) -> Option<std::collections::BTreeMap<String, u64>> {
    let s = capi::stats_of(device)?;
    let mut out = std::collections::BTreeMap::new();
    let mut counter = |name: &str, c: &adaptalloc_core::Counter| {
        out.insert(format!("{name}.all.current"), c.current);
        out.insert(format!("{name}.all.peak"), c.peak);
        out.insert(format!("{name}.all.allocated"), c.total);
        out.insert(format!("{name}.all.freed"), c.total - c.current);
    };
    // Bytes handed out and not yet freed, as requested. A block freed while a stream recorded
    // on it may still use it counts until that work is done: PyTorch's active_bytes; its
    // allocated_bytes counts such a block freed at once, and counts blocks by rounded size.
    counter("requested_bytes", &s.live_bytes);
    counter("allocated_bytes", &s.live_bytes);
    counter("active_bytes", &s.live_bytes);
    counter("reserved_bytes", &s.reserved_bytes);
    counter("allocation", &s.live_blocks);
    counter("active", &s.live_blocks);
    // Free memory that cannot be given back: free space in slab pages that live blocks share.
    out.insert(
        "inactive_split_bytes.all.current".into(),
        s.idle_bytes.current.saturating_sub(s.releasable_idle_bytes),
    );
    out.insert("num_alloc_retries".into(), s.oom_recoveries);
    out.insert("num_ooms".into(), s.failed_allocs);
    // Every physical allocation and every give-back that succeeded, as PyTorch counts each
    // cudaMalloc and each mapped handle: cuMemAlloc + cuMemCreate, cuMemFree + cuMemRelease
    // (the allocator's own counts: tests/counts.rs holds them to the driver's).
    out.insert("num_device_alloc".into(), s.driver_allocs);
    out.insert("num_device_free".into(), s.driver_frees);
    Some(out)
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(check_policy, m)?)?;
    m.add_function(wrap_pyfunction!(check_profile, m)?)?;
    m.add_function(wrap_pyfunction!(compare_json, m)?)?;
    m.add_function(wrap_pyfunction!(report_markdown, m)?)?;
    m.add_function(wrap_pyfunction!(tune_json, m)?)?;
    m.add_function(wrap_pyfunction!(torch_stats, m)?)?;
    Ok(())
}
