//! The stub libcuda (tests/stub/libcuda.c: host memory with a set capacity), built with the
//! system C compiler for the tests that run CudaDevice's own code on the CPU.

use std::path::PathBuf;
use std::process::Command;

use adaptalloc::CudaDevice;

pub fn build_stub(tag: &str) -> Result<PathBuf, String> {
    let src = super::project_root().join("tests/stub/libcuda.c");
    let dir = std::env::temp_dir().join(format!("adaptalloc-stub-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let lib = dir.join("libcuda.so");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let out = Command::new(&cc)
        .args(["-shared", "-fPIC", "-O2", "-o"])
        .arg(&lib)
        .arg(&src)
        .output()
        .map_err(|e| format!("no C compiler ({cc}): {e}"))?;
    if !out.status.success() {
        return Err(format!("{cc} failed: {}", String::from_utf8_lossy(&out.stderr)));
    }
    Ok(dir)
}

/// The stub's folder, or None (after printing why) where a real driver is present or no C
/// compiler builds the stub.
pub fn stub_or_skip(tag: &str) -> Option<PathBuf> {
    if CudaDevice::driver_present() {
        super::skip("a real CUDA driver is present; the stub test runs where there is none");
        return None;
    }
    build_stub(tag)
        .map_err(|e| super::skip(&format!("stub libcuda not built: {e}")))
        .ok()
}

/// Runs `cmd` against the stub libcuda in `dir` with a device of `capacity` bytes; returns
/// whether it succeeded and its stdout and stderr.
pub fn run_on_stub(cmd: &mut Command, dir: &std::path::Path, capacity: u64) -> (bool, String) {
    let out = cmd
        .env("LD_LIBRARY_PATH", dir)
        .env("STUB_CUDA_CAPACITY", capacity.to_string())
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}
