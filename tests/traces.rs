//! Real traces from ../shared/traces through every strategy (skipped when the folder is absent).

mod common;

use adaptalloc::size::TIB;
use adaptalloc::trace::{read_csv, replay};
use adaptalloc::{StrategyConfig, StrategyKind};
use common::{Setup, allocator, sim, trace_files};

#[test]
fn every_trace_replays_with_zero_failures_on_an_unbounded_device() {
    let files = trace_files();
    if files.is_empty() {
        common::skip("no CSV traces found in ../shared/traces");
        return;
    }
    for path in files {
        let trace = read_csv(&path, false).unwrap_or_else(|e| panic!("{e}"));
        assert!(trace.allocs() > 0, "{}", path.display());
        let setups = StrategyKind::ALL
            .iter()
            .map(|&k| (k.name(), Setup::Strategy(StrategyConfig::default_for(k))))
            .chain([("adaptive", Setup::Policy(Box::default()))]);
        for (kind, setup) in setups {
            let dev = sim(4 * TIB);
            let alloc = allocator(&dev, setup);
            let m = replay(&trace, &alloc);
            assert_eq!(m.failed_allocs, 0, "{} with {kind}", trace.name);
            assert_eq!(m.peak_live_bytes, trace.peak_live_bytes(), "{} with {kind}", trace.name);
            assert!(m.peak_reserved_bytes >= m.peak_live_bytes);
            eprintln!(
                "{:32} {:12} driver allocs {:6} frees {:6} reserved/live {:.3}",
                trace.name,
                kind,
                m.driver_allocs,
                m.driver_frees,
                m.peak_reserved_bytes as f64 / m.peak_live_bytes as f64
            );
            drop(alloc);
            assert_eq!(dev.leak_report().blocks, 0);
        }
    }
}
