//! The `pytorch` peer against what PyTorch's allocator really did: every snapshot in
//! `../shared/traces/snapshots` is replayed from the state at its window's start, with the
//! recorded cudaMalloc addresses, and must agree exactly on every allocation's address, every
//! cudaMalloc size and every cudaFree (see `adaptalloc_cli::peers::pytorch::snapshot`). Skips when
//! the folder is absent.

#[path = "../../tests/common/mod.rs"]
mod common;

use adaptalloc_cli::peers::pytorch::snapshot::{read_recording, validate};

#[test]
fn the_pytorch_model_does_what_pytorch_did_on_every_snapshot() {
    // The workspace root's sibling, as every other trace test finds it (this test once looked
    // beside cli/ instead, so it skipped everywhere).
    let Some(dir) = common::traces_dir().map(|d| d.join("snapshots")) else {
        return;
    };
    let Ok(entries) = std::fs::read_dir(&dir) else {
        common::skip(&format!("{} is absent", dir.display()));
        return;
    };
    let mut files: Vec<_> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "pickle"))
        .collect();
    files.sort();
    let mut failures = Vec::new();
    for f in &files {
        let bytes = std::fs::read(f).unwrap();
        let rec = read_recording(&bytes, &f.display().to_string()).unwrap();
        let conf = rec.conf.as_deref().unwrap_or("").parse().unwrap();
        let v = validate(&rec, conf);
        eprintln!("{v}");
        assert!(v.allocs > 0, "{}: no allocations replayed", v.name);
        if !v.exact() {
            failures.push(v.to_string());
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} snapshots differ:\n{}",
        failures.len(),
        files.len(),
        failures.join("\n")
    );
}
