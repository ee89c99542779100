//! Allocation traces: the CSV format of `../shared/traces` and replay through an allocator.
//!
//! Format: header `op,timestamp_ns,ptr,size,stream`, then one event a line: `alloc` or `free`,
//! non-decreasing nanoseconds, a hex block id (`0x...`, live from its alloc to its free, reusable
//! after), the requested bytes (a free repeats its alloc's size), an integer stream id.

mod csv;
mod replay;

pub use csv::{parse_csv, read_csv, write_csv};
pub use replay::{ReplayMetrics, ReplayOptions, replay, replay_with};

use serde::Serialize;

use crate::strategy::StreamId;

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

    /// The most bytes live at once.
    pub fn peak_live_bytes(&self) -> u64 {
        let mut sizes = std::collections::HashMap::new();
        let (mut live, mut peak) = (0u64, 0u64);
        for e in &self.events {
            match e.op {
                Op::Alloc => {
                    sizes.insert(e.id, e.size);
                    live += e.size;
                    peak = peak.max(live);
                }
                Op::Free => live -= sizes.remove(&e.id).unwrap_or(0),
            }
        }
        peak
    }

    pub fn allocs(&self) -> usize {
        self.events.iter().filter(|e| e.op == Op::Alloc).count()
    }
}
