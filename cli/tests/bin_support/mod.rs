//! Running the `adaptalloc` binary from an integration test: its output on success, its
//! one-line error on failure (exit code 2, never a panic), and a scratch folder per process.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Command, Output};

pub fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_adaptalloc"))
        .args(args)
        .output()
        .expect("the binary runs")
}

/// Runs a command that must succeed; returns its stdout.
pub fn ok(args: &[&str]) -> String {
    let out = run(args);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// Runs a command that must succeed and print JSON; returns it parsed.
pub fn ok_json(args: &[&str]) -> serde_json::Value {
    serde_json::from_str(&ok(args)).unwrap_or_else(|e| panic!("{args:?}: not JSON: {e}"))
}

/// Runs a command that must fail cleanly; returns its stderr.
pub fn fails(args: &[&str]) -> String {
    let out = run(args);
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
    assert!(!err.contains("panicked"), "{args:?} panicked: {err}");
    // Our errors are one line; clap's usage errors add a "try --help" hint after theirs.
    if !err.starts_with("error:") {
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: one line expected: {err}");
    }
    err
}

/// A path in this test process's scratch folder.
pub fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("adaptalloc-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// Writes `bytes` to a scratch file; returns its path.
pub fn write(name: &str, bytes: &[u8]) -> String {
    let p = tmp(name);
    std::fs::write(&p, bytes).unwrap();
    p.to_string_lossy().into_owned()
}
