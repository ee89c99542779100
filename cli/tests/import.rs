//! Trace readers: PyTorch snapshots convert to the same events as the CSVs made from them, and
//! the format is told apart by content.

#[path = "../../tests/common/mod.rs"]
mod common;

use adaptalloc_cli::trace::{Op, load, read_csv};

#[test]
fn pytorch_snapshots_give_the_csv_sequences() {
    let Some(dir) = common::traces_dir() else { return };
    for name in [
        "gpu-medium-ctx128-train",
        "gpu-medium-ctx128-infer",
        "gpu-small-fwd-fp32",
    ] {
        let pickle = dir.join("snapshots").join(format!("{name}.pickle"));
        if !pickle.exists() {
            common::skip(&format!("{} is absent", pickle.display()));
            continue;
        }
        let from_pickle = load(&pickle, false).unwrap_or_else(|e| panic!("{e}"));
        let from_csv = read_csv(&dir.join(format!("{name}.csv")), false).unwrap();
        assert_eq!(from_pickle.events.len(), from_csv.events.len(), "{name}");
        for (i, (a, b)) in from_pickle.events.iter().zip(&from_csv.events).enumerate() {
            assert_eq!(
                (a.op, a.id, a.size, a.stream),
                (b.op, b.id, b.size, b.stream),
                "{name}: event {i}"
            );
            assert_eq!(a.timestamp_ns, b.timestamp_ns, "{name}: event {i}");
        }
        assert!(from_pickle.events.iter().any(|e| e.op == Op::Free));
    }
}

#[test]
fn formats_are_told_apart_by_content_and_garbage_is_named() {
    let dir = std::env::temp_dir().join(format!("adaptalloc-import-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let write = |name: &str, bytes: &[u8]| {
        let p = dir.join(name);
        std::fs::write(&p, bytes).unwrap();
        p
    };
    let csv = write(
        "a.log",
        b"op,timestamp_ns,ptr,size,stream\nalloc,1,0x10,5,0\nfree,2,0x10,5,0\n",
    );
    assert_eq!(load(&csv, false).unwrap().events.len(), 2);
    let rmm = write(
        "b.csv",
        b"Thread,Time,Action,Pointer,Size,Stream\n7,0.5,allocate,0x20,64,0x0\n7,0.6,free,0x20,64,0x0\n",
    );
    assert_eq!(load(&rmm, false).unwrap().events.len(), 2);
    // A pickle that is not a snapshot: protocol 2 pickle of the integer 1.
    let not_snapshot = write("c.pickle", b"\x80\x02K\x01.");
    let err = load(&not_snapshot, false).unwrap_err().to_string();
    assert!(err.contains("c.pickle") && err.contains("not a dict"), "{err}");
    let binary = write("d.bin", &[0u8, 159, 146, 150, 1, 2, 3]);
    let err = load(&binary, false).unwrap_err().to_string();
    assert!(
        err.contains("d.bin") && err.contains("unrecognised trace format"),
        "{err}"
    );
    let empty = write("e.csv", b"");
    assert!(load(&empty, false).unwrap_err().to_string().contains("empty file"));
    let missing = load(&dir.join("nope.csv"), false).unwrap_err().to_string();
    assert!(
        missing.contains("nope.csv") && missing.contains("cannot read"),
        "{missing}"
    );
    std::fs::remove_dir_all(&dir).ok();
}
