//! Allocation traces: the CSV format of `../shared/traces` and replay through an allocator.
//!
//! Format: header `op,timestamp_ns,ptr,size,stream`, then one event a line: `alloc` or `free`,
//! non-decreasing nanoseconds, a hex block id (`0x...`, live from its alloc to its free, reusable
//! after), the requested bytes (a free repeats its alloc's size), an integer stream id.

mod csv;
mod pickle;
pub(crate) mod pytorch;
mod replay;
mod rmm;

pub use csv::{parse_csv, read_csv, write_csv};
pub use pytorch::parse_snapshot;
pub use rmm::parse_rmm;

/// The CSV traces in `dir`, sorted by name (how `../shared/traces` holds them).
pub fn csv_files(dir: &std::path::Path) -> std::io::Result<Vec<std::path::PathBuf>> {
    let mut files: Vec<std::path::PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "csv"))
        .collect();
    files.sort();
    Ok(files)
}

/// Reads a trace in any supported format, told apart by content: the CSV trace format
/// (`op,timestamp_ns,...`), an RMM log (`Thread,Time,Action,...`) or a PyTorch snapshot pickle.
/// `lenient` skips frees of ids that are not live (CSV and RMM).
pub fn load(path: &std::path::Path, lenient: bool) -> Result<Trace, crate::TraceError> {
    let file = path.display().to_string();
    let bytes = std::fs::read(path).map_err(|e| crate::TraceError::Read {
        file: file.clone(),
        reason: e.to_string(),
    })?;
    if bytes.first() == Some(&0x80) {
        return parse_snapshot(&bytes, &file);
    }
    let head = &bytes[..bytes.len().min(64)];
    if head.starts_with(rmm::HEADER.as_bytes()) {
        return parse_rmm(&bytes, &file, lenient);
    }
    if bytes.is_empty() || head.starts_with(b"op,") || head.starts_with("\u{feff}op,".as_bytes()) {
        return parse_csv(&bytes, &file, lenient);
    }
    Err(crate::TraceError::Format {
        file,
        message: "unrecognised trace format: expected the CSV header `op,timestamp_ns,ptr,size,stream`, an RMM log \
                  (`Thread,Time,Action,Pointer,Size,Stream`) or a PyTorch memory snapshot pickle"
            .into(),
    })
}
pub use replay::{PassTimes, ReplayMetrics, ReplayOptions, ReplayTarget, TargetCounters, replay, replay_with};

use serde::Serialize;

use adaptalloc::strategy::StreamId;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Op {
    Alloc,
    Free,
}

/// One trace event.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Event {
    pub op: Op,
    pub timestamp_ns: u64,
    /// The block id (an address in the traced program); unique among live blocks.
    pub id: u64,
    pub size: u64,
    pub stream: StreamId,
}

/// A validated trace: every free matches a live alloc of the same id.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Trace {
    /// Where it came from (a file name or a workload name).
    pub name: String,
    pub events: Vec<Event>,
    /// Frees of ids that were not live, dropped when read leniently.
    pub skipped_frees: u64,
}

/// The largest request a trace may hold: 1 PiB, thousands of times any device's memory, and
/// small enough that the live bytes of thousands of such requests still add up in 64 bits.
pub const MAX_SIZE: u64 = 1 << 50;

impl Trace {
    /// Builds a trace from events, checking that frees match live allocs of the same size
    /// (skipping unknown frees when `lenient`). Errors name the event's 1-based position.
    pub fn from_events(name: impl Into<String>, events: Vec<Event>, lenient: bool) -> Result<Self, crate::TraceError> {
        let name = name.into();
        let numbered = events.into_iter().enumerate().map(|(i, e)| (i + 1, e)).collect();
        let mut t = csv::validate(numbered, &name, lenient)?;
        t.name = name;
        Ok(t)
    }

    /// The trace with some of its blocks on a second stream, never synchronized: each block
    /// whose id hashes into the first `share` of the range (0..1) moves to stream `stream + 1`
    /// of its own, its free too (frees stay on the allocating stream). Deterministic; named
    /// "NAME (P% on a second stream)". Multi-stream data from single-stream recordings.
    pub fn split_streams(&self, share: f64) -> Trace {
        let cut = (share.clamp(0.0, 1.0) * u64::MAX as f64) as u64;
        let events = self
            .events
            .iter()
            .map(|e| {
                let mut e = *e;
                if e.id.wrapping_mul(0x9E37_79B9_7F4A_7C15) < cut {
                    e.stream += 1;
                }
                e
            })
            .collect();
        Trace {
            name: format!("{} ({:.0}% on a second stream)", self.name, share * 100.0),
            events,
            skipped_frees: self.skipped_frees,
        }
    }

    /// The most bytes live at once.
    pub fn peak_live_bytes(&self) -> u64 {
        self.peak_by(|size| size)
    }

    /// The most of `cost(size)` summed over the blocks live at once (e.g. the device memory
    /// their driver allocations would consume).
    pub fn peak_by(&self, cost: impl Fn(u64) -> u64) -> u64 {
        let mut costs = std::collections::HashMap::new();
        let (mut live, mut peak) = (0u64, 0u64);
        for e in &self.events {
            match e.op {
                Op::Alloc => {
                    let c = cost(e.size);
                    costs.insert(e.id, c);
                    live = live.saturating_add(c);
                    peak = peak.max(live);
                }
                Op::Free => live = live.saturating_sub(costs.remove(&e.id).unwrap_or(0)),
            }
        }
        peak
    }

    pub fn allocs(&self) -> usize {
        self.events.iter().filter(|e| e.op == Op::Alloc).count()
    }

    /// The events from `from` to `to` (fractions of the trace, clamped to 0..=1), without the
    /// frees of blocks allocated before them: what a recording of that part of the run would
    /// hold. A trace is itself a window of a run; another window puts its peak elsewhere (a
    /// prefix, a first step that never cycles), which is how heuristics get judged beyond the
    /// traces they were tuned on. Named "NAME [A%..B%]".
    pub fn window(&self, from: f64, to: f64) -> Trace {
        let n = self.events.len() as f64;
        let at = |f: f64| (f.clamp(0.0, 1.0) * n) as usize;
        let (a, b) = (at(from), at(to).max(at(from)));
        let mut live = std::collections::HashSet::new();
        let events = self.events[a..b]
            .iter()
            .filter(|e| match e.op {
                Op::Alloc => live.insert(e.id),
                Op::Free => live.remove(&e.id),
            })
            .copied()
            .collect();
        Trace {
            name: format!("{} [{:.0}%..{:.0}%]", self.name, from * 100.0, to * 100.0),
            events,
            skipped_frees: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_streams_moves_whole_blocks_and_keeps_the_trace_valid() {
        let spec = crate::synth::WorkloadSpec::bundled("small-churn").unwrap();
        let t = spec.generate(spec.seed);
        assert_eq!(t.split_streams(0.0).events, t.events);
        assert!(t.split_streams(1.0).events.iter().all(|e| e.stream == 1));
        let half = t.split_streams(0.5);
        let on_1 = half.events.iter().filter(|e| e.stream == 1).count();
        assert!(
            on_1 > t.events.len() / 3 && on_1 < 2 * t.events.len() / 3,
            "{on_1} of {}",
            t.events.len()
        );
        // A block's free is on its allocation's stream: the trace still validates.
        Trace::from_events("half", half.events.clone(), false).unwrap();
        assert_eq!(half.name, format!("{} (50% on a second stream)", t.name));
    }
}
