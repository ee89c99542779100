//! The workloads the report examples run: every CSV trace in ../shared/traces (none where that
//! folder is absent) and the bundled synthetic workloads at their own seeds.

use std::path::Path;

use adaptalloc_cli::synth::{BUNDLED, WorkloadSpec};
use adaptalloc_cli::trace::{Trace, csv_files, read_csv};

pub fn traces() -> Vec<Trace> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/traces");
    let mut out: Vec<Trace> = csv_files(&dir)
        .unwrap_or_default()
        .iter()
        .map(|f| read_csv(f, false).expect("trace parses"))
        .collect();
    for (name, _) in BUNDLED {
        let spec = WorkloadSpec::bundled(name).expect("bundled");
        out.push(spec.generate(spec.seed));
    }
    out
}
