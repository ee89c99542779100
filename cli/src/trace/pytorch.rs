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
        // A whole number that 64 bits hold exactly; never saturated (1e30 is not u64::MAX).
        Value::F64(f) if *f >= 0.0 && f.fract() == 0.0 && *f < 9_007_199_254_740_992.0 => Some(*f as u64),
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
        // Zero-size allocations hold no memory: skipped with their frees (an allocator refuses
        // them, and the CSV format has no size 0).
        let mut empty: HashMap<u64, ()> = HashMap::new();
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
            let stream = match field(d, "stream") {
                None => 0,
                Some(v) => as_u64(v).ok_or_else(|| {
                    bad(format!(
                        "device_traces[{device}][{i}] ({act}): stream {v:?} is not a stream handle (a non-negative integer)"
                    ))
                })?,
            };
            let id = addr | tag;
            match op {
                Op::Alloc if size == 0 => {
                    empty.insert(id, ());
                    continue;
                }
                Op::Alloc => {
                    live.insert(id, ());
                }
                Op::Free => {
                    if live.remove(&id).is_none() {
                        empty.remove(&id);
                        continue;
                    }
                }
            }
            events.push(Event {
                op,
                timestamp_ns: num("time_us").unwrap_or(0).saturating_mul(1000),
                id,
                size,
                stream,
            });
        }
    }
    let name = std::path::Path::new(file)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    Trace::from_events(name, events, false)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// pickle.dumps(protocol=2) of a snapshot with one device: an allocation of size 0 at 0x1000,
    /// one of 512 bytes at 0x2000 on stream 0, and the free of the first.
    const ZERO_SIZE: &[u8] = b"\x80\x02}q\x00(X\x08\x00\x00\x00segmentsq\x01]q\x02X\r\x00\x00\x00device_tracesq\x03]q\x04]q\x05(}q\x06(X\x06\x00\x00\x00actionq\x07X\x05\x00\x00\x00allocq\x08X\x04\x00\x00\x00addrq\tM\x00\x10X\x04\x00\x00\x00sizeq\nK\x00X\x06\x00\x00\x00streamq\x0bK\x00X\x07\x00\x00\x00time_usq\x0cK\x01u}q\r(h\x07h\x08h\tM\x00 h\nM\x00\x02h\x0bK\x00h\x0cK\x02u}q\x0e(h\x07X\x0e\x00\x00\x00free_completedq\x0fh\tM\x00\x10h\nK\x00h\x0bK\x00h\x0cK\x03ueau.";
    /// The same with the 512-byte allocation on stream -1.
    const NEGATIVE_STREAM: &[u8] = b"\x80\x02}q\x00(X\x08\x00\x00\x00segmentsq\x01]q\x02X\r\x00\x00\x00device_tracesq\x03]q\x04]q\x05(}q\x06(X\x06\x00\x00\x00actionq\x07X\x05\x00\x00\x00allocq\x08X\x04\x00\x00\x00addrq\tM\x00\x10X\x04\x00\x00\x00sizeq\nK\x00X\x06\x00\x00\x00streamq\x0bK\x00X\x07\x00\x00\x00time_usq\x0cK\x01u}q\r(h\x07h\x08h\tM\x00 h\nM\x00\x02h\x0bJ\xff\xff\xff\xffh\x0cK\x02u}q\x0e(h\x07X\x0e\x00\x00\x00free_completedq\x0fh\tM\x00\x10h\nK\x00h\x0bK\x00h\x0cK\x03ueau.";

    #[test]
    fn zero_size_allocations_are_skipped_with_their_frees() {
        let t = parse_snapshot(ZERO_SIZE, "z.pickle").unwrap();
        assert_eq!(t.events.len(), 1, "{:?}", t.events);
        assert_eq!((t.events[0].size, t.events[0].id), (512, 0x2000));
    }

    #[test]
    fn sizes_are_whole_numbers_no_device_is_too_small_for() {
        let d = |v: f64| as_u64(&Value::F64(v));
        assert_eq!(d(4096.0), Some(4096));
        for v in [1e30, f64::INFINITY, f64::NAN, 1.5, -1.0] {
            assert_eq!(d(v), None, "{v}");
        }
        // A size as large as 64 bits hold is a trace error naming the event, not a replay.
        let mut big = ZERO_SIZE.to_vec();
        // The 512-byte allocation (M\x00\x02 after `h\n`) becomes 2^62 (\x8a\x08 + 8 bytes).
        let at = big.windows(4).position(|w| w == b"h\nM\x00").unwrap() + 2;
        big.splice(at..at + 3, *b"\x8a\x08\x00\x00\x00\x00\x00\x00\x00\x40");
        let err = parse_snapshot(&big, "big.pickle").unwrap_err().to_string();
        assert!(
            err.contains("big.pickle") && err.contains("more than any device holds"),
            "{err}"
        );
    }

    #[test]
    fn a_negative_stream_is_an_error_that_names_it() {
        let err = parse_snapshot(NEGATIVE_STREAM, "n.pickle").unwrap_err().to_string();
        assert!(
            err.contains("n.pickle") && err.contains("device_traces[0][1]") && err.contains("stream"),
            "{err}"
        );
    }
}
