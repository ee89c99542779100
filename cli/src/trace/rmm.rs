//! Reader of RMM `logging_resource_adaptor` logs: CSV with the header
//! `Thread,Time,Action,Pointer,Size,Stream`; actions `allocate`, `free` (and `allocate failure`,
//! which is skipped). Time is seconds (`12.5`) or a clock time (`08:13:18.312345`); pointers and
//! streams are hex (`0x7f...`) or decimal.

use super::{Event, Op, Trace};
use crate::TraceError;

pub(crate) const HEADER: &str = "Thread,Time,Action,Pointer,Size,Stream";

fn parse_time_ns(s: &str) -> Option<u64> {
    if let Ok(secs) = s.parse::<f64>() {
        return (secs >= 0.0).then_some((secs * 1e9) as u64);
    }
    let mut parts = s.split(':');
    let (h, m, sec) = (parts.next()?, parts.next()?, parts.next()?);
    let total = h.parse::<f64>().ok()? * 3600.0 + m.parse::<f64>().ok()? * 60.0 + sec.parse::<f64>().ok()?;
    Some((total * 1e9) as u64)
}

fn parse_int(s: &str) -> Option<u64> {
    match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => s.parse().ok(),
    }
}

/// Parses an RMM log; `lenient` skips frees of pointers not live (counted in the trace).
pub fn parse_rmm(bytes: &[u8], file: &str, lenient: bool) -> Result<Trace, TraceError> {
    let text = std::str::from_utf8(bytes).map_err(|e| TraceError::Parse {
        file: file.into(),
        line: 1 + bytes[..e.valid_up_to()].iter().filter(|&&b| b == b'\n').count(),
        message: "not text (binary data)".into(),
    })?;
    let mut events = Vec::new();
    let mut last = 0u64;
    // Zero-size allocations hold no memory: skipped with their frees (an allocator refuses
    // them, and the CSV format has no size 0).
    let mut empty = std::collections::HashSet::new();
    for (i, line) in text.lines().enumerate() {
        let n = i + 1;
        let line = line.trim();
        if n == 1 {
            if line != HEADER {
                return Err(TraceError::Parse {
                    file: file.into(),
                    line: 1,
                    message: format!("expected the RMM log header `{HEADER}`"),
                });
            }
            continue;
        }
        if line.is_empty() {
            continue;
        }
        let f: Vec<&str> = line.split(',').map(str::trim).collect();
        let err = |message: String| TraceError::Parse {
            file: file.into(),
            line: n,
            message,
        };
        if f.len() != 6 {
            return Err(err(format!("expected 6 fields ({HEADER}), found {}", f.len())));
        }
        let op = match f[2] {
            "allocate" => Op::Alloc,
            "free" => Op::Free,
            "allocate failure" => continue,
            other => return Err(err(format!("unknown action {other:?}; expected allocate or free"))),
        };
        let ts = parse_time_ns(f[1])
            .ok_or_else(|| err(format!("time {:?} is neither seconds nor HH:MM:SS.ffffff", f[1])))?;
        let id = parse_int(f[3]).ok_or_else(|| err(format!("pointer {:?} is not a hex or decimal integer", f[3])))?;
        let size = parse_int(f[4]).ok_or_else(|| err(format!("size {:?} is not a non-negative integer", f[4])))?;
        let stream = parse_int(f[5]).ok_or_else(|| err(format!("stream {:?} is not an integer", f[5])))?;
        match op {
            Op::Alloc if size == 0 => {
                empty.insert(id);
                continue;
            }
            Op::Free if empty.remove(&id) => continue,
            _ => {}
        }
        // RMM logs from several threads may interleave slightly out of order: keep time monotone.
        last = last.max(ts);
        events.push((
            n,
            Event {
                op,
                timestamp_ns: last,
                id,
                size,
                stream,
            },
        ));
    }
    super::csv::validate(events, file, lenient)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_allocate_and_free() {
        let log = "Thread,Time,Action,Pointer,Size,Stream\n1,08:00:00.000001,allocate,0x7f0000,256,0x0\n1,08:00:00.5,free,0x7f0000,256,0x0\n1,1.0,allocate failure,0x0,99,0x0\n";
        let t = parse_rmm(log.as_bytes(), "r.csv", false).unwrap();
        assert_eq!(t.events.len(), 2);
        assert_eq!(t.events[1].timestamp_ns, 28_800_500_000_000);
        // A zero-size allocation and its free hold no memory: skipped, not a failed request.
        let zero = "Thread,Time,Action,Pointer,Size,Stream\n1,0.1,allocate,0x0,0,0\n1,0.2,allocate,0x100,512,0\n1,0.3,free,0x0,0,0\n";
        let t = parse_rmm(zero.as_bytes(), "z.csv", false).unwrap();
        assert_eq!(t.events.len(), 1);
        assert_eq!(t.events[0].size, 512);
        let bad = "Thread,Time,Action,Pointer,Size,Stream\n1,0.1,grab,0x1,2,0\n";
        assert!(
            parse_rmm(bad.as_bytes(), "r.csv", false)
                .unwrap_err()
                .to_string()
                .contains("r.csv:2: unknown action")
        );
    }
}
