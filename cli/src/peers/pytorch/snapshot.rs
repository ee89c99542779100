//! The `pytorch` model checked against what PyTorch's allocator really did: a snapshot
//! (`torch.cuda.memory._dump_snapshot`) records every cudaMalloc / cudaFree it made
//! (`segment_alloc` / `segment_free`) and the address of every allocation.
//!
//! The state at the start of the recording window is the final `segments` walked back through
//! the window: segments allocated in it are removed, segments freed in it put back; the blocks
//! live then are those still live at the end that the window did not allocate (their sizes are
//! in `segments`) and those the window frees without having allocated them (the snapshot gives
//! only their requested size). Every gap between live blocks is one free block, as merging
//! leaves it. A small-pool block is exactly its rounded request; a large-pool block keeps up to 1 MiB of unsplit slack: where the gap after it is
//! that small, the slack is its own; where the gap is larger, an allocation landing within
//! 1 MiB after it while it is live marks where it ends.
//!
//! The window is then replayed through the model, which is handed the recorded cudaMalloc
//! addresses in order; `empty_cache()` is called where the recording's segment frees name
//! `emptyCache`. A faithful model makes the same cudaMalloc sizes and cudaFree addresses in
//! the same order and hands out every recorded address.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};

use serde_pickle::Value;

use super::conf::{PytorchConf, consts};
use super::model::{Driver, LiveBlock, Model};
use crate::TraceError;
use crate::trace::pytorch::{Dict, as_u64, device_traces, field, read_pickle_dict, text};

/// What a snapshot entry did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    Alloc,
    FreeRequested,
    FreeCompleted,
    SegmentAlloc,
    SegmentFree,
    Other,
}

/// One entry of `device_traces[0]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    pub action: Action,
    pub addr: u64,
    pub size: u64,
    pub stream: u64,
    /// A segment free made by `torch.cuda.empty_cache()` (its frames name `emptyCache`).
    pub empty_cache: bool,
}

/// A segment of the final state.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FinalSegment {
    pub addr: u64,
    pub size: u64,
    pub stream: u64,
    pub small: bool,
    pub expandable: bool,
    /// Allocated blocks: (address, size).
    pub allocated: Vec<(u64, u64)>,
}

/// What a snapshot recorded on its first device.
#[derive(Clone, Debug, Default)]
pub struct Recording {
    pub name: String,
    pub segments: Vec<FinalSegment>,
    pub entries: Vec<Entry>,
    /// The allocator settings of the run (`PYTORCH_CUDA_ALLOC_CONF`), when recorded.
    pub conf: Option<String>,
}

/// Reads a snapshot pickle; `file` names it in errors.
pub fn read_recording(bytes: &[u8], file: &str) -> Result<Recording, TraceError> {
    let bad = |message: String| TraceError::Format {
        file: file.to_string(),
        message,
    };
    let root = read_pickle_dict(bytes, file)?;
    let num = |d: &Dict, k: &str| field(d, k).and_then(as_u64);
    let mut rec = Recording {
        name: std::path::Path::new(file)
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        ..Default::default()
    };
    if let Some(Value::Dict(s)) = field(&root, "allocator_settings") {
        rec.conf = text(s, "PYTORCH_CUDA_ALLOC_CONF").map(str::to_string);
    }
    let Some(Value::List(segments)) = field(&root, "segments") else {
        return Err(bad("no `segments` list: not a PyTorch memory snapshot".into()));
    };
    for (i, s) in segments.iter().enumerate() {
        let Value::Dict(s) = s else {
            return Err(bad(format!("segments[{i}] is not a dict")));
        };
        if num(s, "device").unwrap_or(0) != 0 {
            continue;
        }
        let need = |k: &str| num(s, k).ok_or_else(|| bad(format!("segments[{i}]: no integer `{k}`")));
        let mut seg = FinalSegment {
            addr: need("address")?,
            size: need("total_size")?,
            stream: num(s, "stream").unwrap_or(0),
            small: text(s, "segment_type") == Some("small"),
            expandable: matches!(field(s, "is_expandable"), Some(Value::Bool(true))),
            allocated: Vec::new(),
        };
        if let Some(Value::List(blocks)) = field(s, "blocks") {
            let mut at = seg.addr;
            for (j, b) in blocks.iter().enumerate() {
                let Value::Dict(b) = b else {
                    return Err(bad(format!("segments[{i}].blocks[{j}] is not a dict")));
                };
                let size = num(b, "size").ok_or_else(|| bad(format!("segments[{i}].blocks[{j}]: no `size`")))?;
                let addr = num(b, "address").unwrap_or(at);
                if text(b, "state").is_some_and(|st| st.starts_with("active")) {
                    seg.allocated.push((addr, size));
                }
                at = addr + size;
            }
        }
        rec.segments.push(seg);
    }
    let devices = device_traces(&root, file)?;
    for (i, e) in devices.first().into_iter().flatten().enumerate() {
        let action = match text(e, "action") {
            Some("alloc") => Action::Alloc,
            Some("free_requested") => Action::FreeRequested,
            Some("free_completed") => Action::FreeCompleted,
            Some("segment_alloc") => Action::SegmentAlloc,
            Some("segment_free") => Action::SegmentFree,
            Some(_) => Action::Other,
            None => return Err(bad(format!("device_traces[0][{i}]: no `action` string"))),
        };
        let empty_cache = match field(e, "frames") {
            Some(Value::List(frames)) => frames.iter().any(|f| match f {
                Value::Dict(f) => text(f, "name").is_some_and(|n| n.contains("emptyCache")),
                _ => false,
            }),
            _ => false,
        };
        rec.entries.push(Entry {
            action,
            addr: num(e, "addr").unwrap_or(0),
            size: num(e, "size").unwrap_or(0),
            stream: num(e, "stream").unwrap_or(0),
            empty_cache,
        });
    }
    Ok(rec)
}

/// How the model compared with the recording.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Validation {
    pub name: String,
    /// Allocations replayed, and those whose address differed from the recorded one.
    pub allocs: u64,
    pub address_mismatches: u64,
    /// The first differing allocation: entry index, recorded and modelled address.
    pub first_mismatch: Option<(usize, u64, Option<u64>)>,
    /// cudaMalloc sizes in order: the model's and the recording's.
    pub segment_allocs: Vec<u64>,
    pub recorded_segment_allocs: Vec<u64>,
    /// cudaFree addresses in order: the model's and the recording's.
    pub segment_frees: Vec<u64>,
    pub recorded_segment_frees: Vec<u64>,
    /// Segments and live blocks at the window's start.
    pub initial_segments: usize,
    pub initial_live: usize,
    pub empty_cache_calls: u64,
}

impl Validation {
    /// True when the model did exactly what PyTorch did.
    pub fn exact(&self) -> bool {
        self.address_mismatches == 0
            && self.segment_allocs == self.recorded_segment_allocs
            && self.segment_frees == self.recorded_segment_frees
    }
}

impl std::fmt::Display for Validation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}: {} segments and {} live blocks at the start; {} allocations, {} at another address; \
             cudaMalloc {} (recorded {}){}; cudaFree {} (recorded {}){}; {} empty_cache calls",
            self.name,
            self.initial_segments,
            self.initial_live,
            self.allocs,
            self.address_mismatches,
            self.segment_allocs.len(),
            self.recorded_segment_allocs.len(),
            if self.segment_allocs == self.recorded_segment_allocs {
                ", same sizes in order"
            } else {
                ", DIFFERENT"
            },
            self.segment_frees.len(),
            self.recorded_segment_frees.len(),
            if self.segment_frees == self.recorded_segment_frees {
                ", same addresses in order"
            } else {
                ", DIFFERENT"
            },
            self.empty_cache_calls
        )?;
        if let Some((i, want, got)) = self.first_mismatch {
            write!(
                f,
                "; first differing allocation: entry {i}, recorded {want:#x}, model {got:x?}"
            )?;
        }
        Ok(())
    }
}

/// The recorded cudaMalloc addresses, handed to the model in order.
struct Scripted {
    addrs: VecDeque<u64>,
    /// Past the recording's own, addresses that cannot collide with real ones.
    spare: u64,
    mallocs: Vec<u64>,
    frees: Vec<u64>,
}

impl Driver for Scripted {
    fn malloc(&mut self, bytes: u64) -> Option<u64> {
        self.mallocs.push(bytes);
        Some(self.addrs.pop_front().unwrap_or_else(|| {
            self.spare += bytes.next_multiple_of(1 << 21);
            self.spare
        }))
    }

    fn free(&mut self, ptr: u64, _bytes: u64) {
        self.frees.push(ptr);
    }

    fn total_memory(&self) -> u64 {
        u64::MAX / 4
    }
}

/// The model at the start of the recording window (see the module docs); also the number of
/// live blocks placed.
pub fn initial_state(rec: &Recording, conf: PytorchConf) -> (Model, usize, usize) {
    // Segments then: the final ones, walked back.
    let mut segs: BTreeMap<u64, (u64, u64, bool)> = rec
        .segments
        .iter()
        .map(|s| (s.addr, (s.size, s.stream, s.small)))
        .collect();
    for e in rec.entries.iter().rev() {
        match e.action {
            Action::SegmentAlloc => {
                segs.remove(&e.addr);
            }
            Action::SegmentFree => {
                segs.insert(e.addr, (e.size, e.stream, e.size == consts::SMALL_BUFFER));
            }
            _ => {}
        }
    }
    // Blocks live then: freed by the window without its alloc (requested size only, and the
    // entry index of that free), and live at the end without the window's alloc.
    let mut live_in_window = HashSet::new();
    let mut unknown: Vec<(u64, u64, usize)> = Vec::new();
    for (i, e) in rec.entries.iter().enumerate() {
        match e.action {
            Action::Alloc => {
                live_in_window.insert(e.addr);
            }
            Action::FreeRequested if !live_in_window.remove(&e.addr) => unknown.push((e.addr, e.size, i)),
            _ => {}
        }
    }
    let mut live: BTreeMap<u64, u64> = BTreeMap::new();
    for s in &rec.segments {
        for &(addr, size) in &s.allocated {
            if !live_in_window.contains(&addr) {
                live.insert(addr, size);
            }
        }
    }
    let seg_of = |addr: u64| {
        segs.range(..=addr)
            .next_back()
            .map(|(&b, &(size, _, small))| (b, size, small))
    };
    // Sizes of the blocks the snapshot names only by their request.
    let boundaries: BTreeSet<u64> = live.keys().copied().chain(unknown.iter().map(|u| u.0)).collect();
    for &(addr, requested, freed_at) in &unknown {
        let (Some(rounded), Some((base, seg_size, small))) = (conf.round_size(requested), seg_of(addr)) else {
            continue;
        };
        let end = boundaries
            .range(addr + 1..)
            .next()
            .map_or(base + seg_size, |&a| a)
            .min(base + seg_size);
        let gap = end.saturating_sub(addr + rounded);
        let size = if small {
            // Small-pool sizes are multiples of 512 B and split at 512 B: no slack.
            rounded
        } else if gap <= consts::SMALL_SIZE {
            rounded + gap
        } else {
            // An allocation landing within 1 MiB after it while it is live marks its end.
            let slack_end = addr + rounded + consts::SMALL_SIZE;
            rec.entries[..freed_at]
                .iter()
                .find(|e| e.action == Action::Alloc && e.addr > addr + rounded && e.addr <= slack_end)
                .map_or(rounded, |e| e.addr - addr)
        };
        live.insert(addr, size);
    }
    let mut model = Model::new(conf);
    let mut placed = 0;
    for (&base, &(size, stream, small)) in &segs {
        let blocks: Vec<LiveBlock> = live
            .range(base..base + size)
            .map(|(&addr, &size)| LiveBlock { addr, size })
            .collect();
        placed += blocks.len();
        model.restore(base, size, stream, small, &blocks);
    }
    (model, segs.len(), placed)
}

/// Replays the recording through the model (see the module docs).
pub fn validate(rec: &Recording, conf: PytorchConf) -> Validation {
    let (mut model, initial_segments, initial_live) = initial_state(rec, conf);
    let mut v = Validation {
        name: rec.name.clone(),
        initial_segments,
        initial_live,
        ..Default::default()
    };
    let recorded = |a: Action| rec.entries.iter().filter(move |e| e.action == a);
    v.recorded_segment_allocs = recorded(Action::SegmentAlloc).map(|e| e.size).collect();
    v.recorded_segment_frees = recorded(Action::SegmentFree).map(|e| e.addr).collect();
    let mut driver = Scripted {
        addrs: recorded(Action::SegmentAlloc).map(|e| e.addr).collect(),
        spare: 1 << 62,
        mallocs: Vec::new(),
        frees: Vec::new(),
    };
    // Recorded address -> the model's, where they differ.
    let mut moved: HashMap<u64, u64> = HashMap::new();
    let mut in_empty_cache = false;
    for (i, e) in rec.entries.iter().enumerate() {
        let emptying = e.action == Action::SegmentFree && e.empty_cache;
        if emptying && !in_empty_cache {
            model.empty_cache(&mut driver);
            v.empty_cache_calls += 1;
        }
        in_empty_cache = emptying;
        match e.action {
            Action::Alloc => {
                v.allocs += 1;
                let got = model.malloc(&mut driver, e.size, e.stream);
                if got != Some(e.addr) {
                    v.address_mismatches += 1;
                    v.first_mismatch.get_or_insert((i, e.addr, got));
                    if let Some(g) = got {
                        moved.insert(e.addr, g);
                    }
                }
            }
            Action::FreeRequested => {
                let at = moved.remove(&e.addr).unwrap_or(e.addr);
                model.free(at);
            }
            _ => {}
        }
    }
    v.segment_allocs = driver.mallocs;
    v.segment_frees = driver.frees;
    v
}
