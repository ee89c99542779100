//! Real traces from ../shared/traces through every strategy (skipped when the folder is absent).

#[path = "../../tests/common/mod.rs"]
mod common;

use adaptalloc::size::TIB;
use adaptalloc::{StrategyConfig, StrategyKind};
use adaptalloc_cli::trace::{read_csv, replay};
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

/// A window of a trace keeps its own allocations and the frees of them, drops the frees of
/// blocks allocated before it, and is itself a valid trace (the replay and compare paths take
/// it as they take a file).
#[test]
fn a_window_drops_frees_of_blocks_allocated_before_it() {
    use adaptalloc_cli::trace::{Event, Op, Trace};
    let ev = |op, id, size| Event {
        op,
        timestamp_ns: 0,
        id,
        size,
        stream: 0,
    };
    let t = Trace::from_events(
        "w",
        vec![
            ev(Op::Alloc, 1, 100),
            ev(Op::Alloc, 2, 200),
            ev(Op::Free, 1, 100),
            ev(Op::Alloc, 1, 300),
            ev(Op::Free, 2, 200),
            ev(Op::Free, 1, 300),
        ],
        false,
    )
    .unwrap();
    let w = t.window(0.5, 1.0);
    assert_eq!(w.name, "w [50%..100%]");
    let ops: Vec<(Op, u64)> = w.events.iter().map(|e| (e.op, e.id)).collect();
    assert_eq!(
        ops,
        vec![(Op::Alloc, 1), (Op::Free, 1)],
        "the free of block 2 goes with it"
    );
    Trace::from_events("again", w.events.clone(), false).expect("a window is a valid trace");
    assert_eq!(t.window(0.0, 1.0).events, t.events);
    assert!(t.window(0.8, 0.2).events.is_empty(), "an empty range, not a panic");
    assert_eq!(t.window(-1.0, 2.0).events, t.events, "fractions are clamped");
}
