//! Reader and writer of the CSV trace format. Every error names the file and line.

use std::io::Write;
use std::path::Path;

use super::{Event, Op, Trace};
use crate::TraceError;

const HEADER: &str = "op,timestamp_ns,ptr,size,stream";

/// Reads a CSV trace file. `lenient` skips frees of ids that are not live (counted in
/// [`Trace::skipped_frees`]) instead of failing.
pub fn read_csv(path: &Path, lenient: bool) -> Result<Trace, TraceError> {
    let file = path.display().to_string();
    let bytes = std::fs::read(path).map_err(|e| TraceError::Read {
        file: file.clone(),
        reason: e.to_string(),
    })?;
    parse_csv(&bytes, &file, lenient)
}

/// Parses CSV trace text; `file` names the source in errors.
pub fn parse_csv(bytes: &[u8], file: &str, lenient: bool) -> Result<Trace, TraceError> {
    let err = |line: usize, message: String| TraceError::Parse {
        file: file.to_string(),
        line,
        message,
    };
    if bytes.is_empty() {
        return Err(TraceError::Format {
            file: file.into(),
            message: format!("empty file; expected the header `{HEADER}`"),
        });
    }
    let mut events = Vec::with_capacity(bytes.len() / 40);
    let mut last_ts = 0u64;
    let mut lines = bytes.split(|&b| b == b'\n').enumerate();
    let (_, header) = lines.next().expect("split yields at least one item");
    let header =
        std::str::from_utf8(header).map_err(|_| err(1, "not text (binary data); expected a CSV trace".into()))?;
    if header.trim().trim_start_matches('\u{feff}') != HEADER {
        return Err(err(
            1,
            format!("header is {:?}; expected `{HEADER}`", truncate(header.trim())),
        ));
    }
    for (i, raw) in lines {
        let line = i + 1;
        let text = std::str::from_utf8(raw).map_err(|_| err(line, "not text (binary data)".into()))?;
        let text = text.trim();
        if text.is_empty() {
            continue;
        }
        let fields: Vec<&str> = text.split(',').map(str::trim).collect();
        if fields.len() != 5 {
            return Err(err(
                line,
                format!(
                    "expected 5 fields ({HEADER}), found {}: {:?}",
                    fields.len(),
                    truncate(text)
                ),
            ));
        }
        let op = match fields[0] {
            "alloc" => Op::Alloc,
            "free" => Op::Free,
            other => {
                return Err(err(
                    line,
                    format!("unknown op {:?}; expected `alloc` or `free`", truncate(other)),
                ));
            }
        };
        let timestamp_ns = parse_u64(fields[1]).map_err(|m| err(line, format!("timestamp_ns {m}")))?;
        let id = parse_ptr(fields[2]).map_err(|m| err(line, format!("ptr {m}")))?;
        let size = parse_u64(fields[3]).map_err(|m| err(line, format!("size {m}")))?;
        let stream = parse_stream(fields[4]).map_err(|m| err(line, format!("stream {m}")))?;
        if op == Op::Alloc && size == 0 {
            return Err(err(line, "alloc of size 0; sizes must be at least 1 byte".into()));
        }
        if timestamp_ns < last_ts {
            return Err(err(
                line,
                format!("timestamp {timestamp_ns} goes back in time (previous {last_ts})"),
            ));
        }
        last_ts = timestamp_ns;
        events.push((
            line,
            Event {
                op,
                timestamp_ns,
                id,
                size,
                stream,
            },
        ));
    }
    validate(events, file, lenient)
}

/// Checks frees against live allocs, naming the file line of any mismatch.
pub(super) fn validate(events: Vec<(usize, Event)>, file: &str, lenient: bool) -> Result<Trace, TraceError> {
    let mut live: std::collections::HashMap<u64, (usize, u64)> = std::collections::HashMap::new();
    let mut kept = Vec::with_capacity(events.len());
    let mut skipped = 0;
    for (line, e) in events {
        match e.op {
            Op::Alloc => {
                if e.size > super::MAX_SIZE {
                    return Err(TraceError::Parse {
                        file: file.into(),
                        line,
                        message: format!(
                            "size {} is more than any device holds; a trace may ask for at most {} bytes (1 PiB)",
                            e.size,
                            super::MAX_SIZE
                        ),
                    });
                }
                if let Some((since, _)) = live.insert(e.id, (line, e.size)) {
                    return Err(TraceError::DuplicateAlloc {
                        file: file.into(),
                        line,
                        id: e.id,
                        since,
                    });
                }
            }
            Op::Free => match live.remove(&e.id) {
                Some((_, size)) if size != e.size && !lenient => {
                    return Err(TraceError::Parse {
                        file: file.into(),
                        line,
                        message: format!(
                            "free of id {:#x} gives size {} but it was allocated with {size}",
                            e.id, e.size
                        ),
                    });
                }
                Some(_) => {}
                None if lenient => {
                    skipped += 1;
                    continue;
                }
                None => {
                    return Err(TraceError::UnknownFree {
                        file: file.into(),
                        line,
                        id: e.id,
                    });
                }
            },
        }
        kept.push(e);
    }
    let name = Path::new(file)
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| file.into());
    Ok(Trace {
        name,
        events: kept,
        skipped_frees: skipped,
    })
}

fn truncate(s: &str) -> String {
    if s.chars().count() > 60 {
        format!("{}...", s.chars().take(60).collect::<String>())
    } else {
        s.to_string()
    }
}

fn parse_u64(s: &str) -> Result<u64, String> {
    if s.starts_with('-') {
        return Err(format!(
            "{:?} is negative; expected a non-negative integer",
            truncate(s)
        ));
    }
    s.parse()
        .map_err(|_| format!("{:?} is not a non-negative integer", truncate(s)))
}

fn parse_ptr(s: &str) -> Result<u64, String> {
    let parsed = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16),
        None => s.parse(),
    };
    parsed.map_err(|_| format!("{:?} is not a hex (0x...) or decimal id", truncate(s)))
}

fn parse_stream(s: &str) -> Result<u64, String> {
    if let Some(hex) = s.strip_prefix("0x") {
        return u64::from_str_radix(hex, 16).map_err(|_| format!("{:?} is not an integer", truncate(s)));
    }
    match s.parse::<i64>() {
        Ok(v) => Ok(v as u64),
        Err(_) => parse_u64(s),
    }
}

/// Writes a trace in the CSV format.
pub fn write_csv(trace: &Trace, out: &mut dyn Write) -> std::io::Result<()> {
    let mut w = std::io::BufWriter::new(out);
    writeln!(w, "{HEADER}")?;
    for e in &trace.events {
        let op = match e.op {
            Op::Alloc => "alloc",
            Op::Free => "free",
        };
        writeln!(w, "{op},{},{:#x},{},{}", e.timestamp_ns, e.id, e.size, e.stream)?;
    }
    w.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Trace, TraceError> {
        parse_csv(text.as_bytes(), "t.csv", false)
    }

    #[test]
    fn reads_and_writes_round_trip() {
        let text = "op,timestamp_ns,ptr,size,stream\nalloc,1,0x10,512,0\nalloc,2,0x20,100,1\nfree,3,0x10,512,0\nfree,4,0x20,100,1\n";
        let t = parse(text).unwrap();
        assert_eq!(t.events.len(), 4);
        assert_eq!(t.peak_live_bytes(), 612);
        let mut out = Vec::new();
        write_csv(&t, &mut out).unwrap();
        assert_eq!(String::from_utf8(out).unwrap(), text);
    }

    #[test]
    fn errors_name_file_and_line() {
        let cases = [
            ("", "empty file"),
            ("op,ts\n", "t.csv:1: header"),
            (
                "op,timestamp_ns,ptr,size,stream\nalloc,1,0x10,5\n",
                "t.csv:2: expected 5 fields",
            ),
            (
                "op,timestamp_ns,ptr,size,stream\nmalloc,1,0x10,5,0\n",
                "t.csv:2: unknown op",
            ),
            (
                "op,timestamp_ns,ptr,size,stream\nalloc,1,0x10,-5,0\n",
                "t.csv:2: size \"-5\" is negative",
            ),
            (
                "op,timestamp_ns,ptr,size,stream\nalloc,1,0x10,abc,0\n",
                "t.csv:2: size \"abc\" is not",
            ),
            ("op,timestamp_ns,ptr,size,stream\nalloc,1,zz,5,0\n", "t.csv:2: ptr"),
            (
                "op,timestamp_ns,ptr,size,stream\nalloc,1,0x10,5,0\nfree,2,0x99,5,0\n",
                "t.csv:3: free of id 0x99",
            ),
            (
                "op,timestamp_ns,ptr,size,stream\nalloc,1,0x10,5,0\nalloc,2,0x10,5,0\n",
                "t.csv:3: alloc of id 0x10, which is still live since line 2",
            ),
            (
                "op,timestamp_ns,ptr,size,stream\nalloc,5,0x10,5,0\nfree,2,0x10,5,0\n",
                "t.csv:3: timestamp 2 goes back",
            ),
            (
                "op,timestamp_ns,ptr,size,stream\nalloc,1,0x10,0,0\n",
                "t.csv:2: alloc of size 0",
            ),
        ];
        for (text, want) in cases {
            let got = parse(text).unwrap_err().to_string();
            assert!(got.contains(want), "for {text:?}: {got}");
        }
        let binary = b"op,timestamp_ns,ptr,size,stream\n\xff\xfe\x00\n";
        assert!(
            parse_csv(binary, "b.csv", false)
                .unwrap_err()
                .to_string()
                .contains("b.csv:2: not text")
        );
    }

    #[test]
    fn lenient_skips_unknown_frees() {
        let text = "op,timestamp_ns,ptr,size,stream\nfree,1,0x10,5,0\nalloc,2,0x20,5,0\n";
        let t = parse_csv(text.as_bytes(), "t.csv", true).unwrap();
        assert_eq!((t.events.len(), t.skipped_frees), (1, 1));
    }
}
