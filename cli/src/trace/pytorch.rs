//! Reader of PyTorch CUDA memory snapshots (the pickle `torch.cuda.memory._dump_snapshot`
//! writes): `device_traces`, one list of entries per device, each with `action`, `addr`, `size`,
//! `stream` and `time_us`.
//!
//! Conversion (as `../shared/traces/README.md` states it), per device in order: `alloc` -> alloc;
//! `free_requested` -> free (or `free_completed` -> free in a trace with no `free_requested`
//! entries at all); a free whose address is not live (allocated before recording started) is
//! dropped; other actions are ignored; `time_us` x 1000 is the timestamp (0 where absent); a
//! missing stream is 0. Devices after the first get their index in the id's top byte, so ids of
//! different devices never collide.

use std::collections::HashMap;

use serde_pickle::{HashableValue, Value};

use super::{Event, Op, Trace};
use crate::TraceError;

fn key(name: &str) -> HashableValue {
    HashableValue::String(name.to_string())
}

/// A pickled dict.
pub(crate) type Dict = std::collections::BTreeMap<HashableValue, Value>;

pub(crate) fn field<'a>(entry: &'a Dict, name: &str) -> Option<&'a Value> {
    entry.get(&key(name))
}

/// A string field.
pub(crate) fn text<'a>(entry: &'a Dict, name: &str) -> Option<&'a str> {
    match field(entry, name) {
        Some(Value::String(s)) => Some(s),
        _ => None,
    }
}

pub(crate) fn as_u64(v: &Value) -> Option<u64> {
    match v {
        Value::I64(i) => u64::try_from(*i).ok(),
        Value::Int(i) => u64::try_from(i).ok(),
        Value::F64(f) if *f >= 0.0 => Some(*f as u64),
        _ => None,
    }
}

/// The top-level dict of a snapshot pickle; `file` names it in errors.
pub(crate) fn read_pickle_dict(bytes: &[u8], file: &str) -> Result<Dict, TraceError> {
    let bad = |message: String| TraceError::Format {
        file: file.to_string(),
        message,
    };
    let root = super::pickle::read(bytes).map_err(|e| bad(format!("not a readable pickle: {e}")))?;
    match root {
        Value::Dict(root) => Ok(root),
        _ => Err(bad(
            "the pickle is not a dict; expected a PyTorch memory snapshot with `device_traces`".into(),
        )),
    }
}

/// `device_traces`: each device's entries, as dicts; errors name the one that is not.
pub(crate) fn device_traces<'a>(root: &'a Dict, file: &str) -> Result<Vec<Vec<&'a Dict>>, TraceError> {
    let bad = |message: String| TraceError::Format {
        file: file.to_string(),
        message,
    };
    let Some(Value::List(devices)) = root.get(&key("device_traces")) else {
        return Err(bad(
            "no `device_traces` list: not a PyTorch memory snapshot (record with torch.cuda.memory._record_memory_history)"
                .into(),
        ));
    };
    devices
        .iter()
        .enumerate()
        .map(|(device, entries)| {
            let Value::List(entries) = entries else {
                return Err(bad(format!("device_traces[{device}] is not a list")));
            };
            entries
                .iter()
                .enumerate()
                .map(|(i, e)| match e {
                    Value::Dict(d) => Ok(d),
                    _ => Err(bad(format!("device_traces[{device}][{i}] is not a dict"))),
                })
                .collect()
        })
        .collect()
}

/// Parses snapshot pickle bytes; `file` names the source in errors.
pub fn parse_snapshot(bytes: &[u8], file: &str) -> Result<Trace, TraceError> {
    let bad = |message: String| TraceError::Format {
        file: file.to_string(),
        message,
    };
    let root = read_pickle_dict(bytes, file)?;
    let mut events = Vec::new();
    for (device, dicts) in device_traces(&root, file)?.into_iter().enumerate() {
        let has_requested = dicts.iter().any(|d| text(d, "action") == Some("free_requested"));
        let free_action = if has_requested {
            "free_requested"
        } else {
            "free_completed"
        };
        let tag = (device as u64) << 56;
        let mut live: HashMap<u64, ()> = HashMap::new();
        for (i, d) in dicts.into_iter().enumerate() {
            let Some(act) = text(d, "action") else {
                return Err(bad(format!("device_traces[{device}][{i}]: no `action` string")));
            };
            let op = match act {
                "alloc" => Op::Alloc,
                a if a == free_action => Op::Free,
                _ => continue,
            };
            let num = |name: &str| field(d, name).and_then(as_u64);
            let addr =
                num("addr").ok_or_else(|| bad(format!("device_traces[{device}][{i}] ({act}): no integer `addr`")))?;
            let size =
                num("size").ok_or_else(|| bad(format!("device_traces[{device}][{i}] ({act}): no integer `size`")))?;
            let id = addr | tag;
            match op {
                Op::Alloc => {
                    live.insert(id, ());
                }
                Op::Free => {
                    if live.remove(&id).is_none() {
                        continue;
                    }
                }
            }
            events.push(Event {
                op,
                timestamp_ns: num("time_us").unwrap_or(0).saturating_mul(1000),
                id,
                size,
                stream: num("stream").unwrap_or(0),
            });
        }
    }
    let name = std::path::Path::new(file)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    Trace::from_events(name, events, false)
}
