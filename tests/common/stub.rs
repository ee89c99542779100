//! The stub libcuda (tests/stub/libcuda.c: host memory with a set capacity), built with the
//! system C compiler for the tests that run CudaDevice's own code on the CPU.

use std::path::PathBuf;
use std::process::Command;

use adaptalloc::CudaDevice;

pub fn build_stub(tag: &str) -> Result<PathBuf, String> {
    let src = super::project_root().join("tests/stub/libcuda.c");
    // Under the build directory (cargo sets CARGO_TARGET_TMPDIR for integration tests), not the
    // system temp dir: a test that fails before removing its copy leaves it there.
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("adaptalloc-stub-{tag}-{}", std::process::id()));
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

/// The stub's test hooks, found with dlsym in the libcuda the process loaded. Streams are
/// handle values, never dereferenced.
pub struct StubHooks {
    pub queue_work: extern "C" fn(u64, usize),
    pub unsafe_unmaps: extern "C" fn() -> i32,
    pub stream_work: extern "C" fn(usize, i32),
    pub stream_finish: extern "C" fn(usize, i32),
    pub stream_pending: extern "C" fn(usize) -> i32,
    pub stream_syncs: extern "C" fn() -> i32,
    pub event_syncs: extern "C" fn() -> i32,
    pub live_events: extern "C" fn() -> i32,
    /// Kernels completed on a stream so far.
    pub stream_completed: extern "C" fn(usize) -> u64,
    /// Queues a kernel using a range on a stream; returns its place in the stream's queue.
    pub stream_kernel: extern "C" fn(usize, u64, usize) -> u64,
    /// Marks a stream as being captured into a CUDA graph, and ends it.
    pub begin_capture: extern "C" fn(usize),
    pub end_capture: extern "C" fn(usize),
    /// Calls refused because a capture was under way (a query, sync or event on a capturing
    /// stream; a cuMemFree or cuCtxSynchronize during any capture).
    pub capture_violations: extern "C" fn() -> i32,
    /// Writes a tag to the mapped page over an address (1), or finds none there (0).
    pub write_tag: extern "C" fn(u64, u64) -> i32,
    /// The tag of the mapped page over an address (0: none).
    pub read_tag: extern "C" fn(u64) -> u64,
}

pub fn stub_hooks() -> StubHooks {
    use std::ffi::{CStr, c_char, c_int, c_void};
    unsafe extern "C" {
        fn dlopen(name: *const c_char, flags: c_int) -> *mut c_void;
        fn dlsym(handle: *mut c_void, name: *const c_char) -> *mut c_void;
    }
    // SAFETY: the name is a NUL-terminated literal; RTLD_NOW (2) opens the libcuda already
    // loaded (the stub, found through LD_LIBRARY_PATH).
    let lib = unsafe { dlopen(c"libcuda.so".as_ptr(), 2) };
    assert!(!lib.is_null(), "the stub is loaded");
    /// The stub's function `name` as an `F`.
    ///
    /// # Safety
    /// `F` must be an `extern "C" fn` type with the stub function's signature.
    unsafe fn sym<F: Copy>(lib: *mut c_void, name: &CStr) -> F {
        // SAFETY: a live handle from dlopen and a NUL-terminated name.
        let f = unsafe { dlsym(lib, name.as_ptr()) };
        assert!(!f.is_null(), "the stub's hook {name:?}");
        // SAFETY: `f` is the function's address and `F` its pointer type (the caller's
        // contract); both are one pointer wide.
        unsafe { std::mem::transmute_copy::<*mut c_void, F>(&f) }
    }
    // SAFETY: each field's type is the signature of the stub function named beside it.
    unsafe {
        StubHooks {
            queue_work: sym(lib, c"stub_queue_work"),
            unsafe_unmaps: sym(lib, c"stub_unsafe_unmaps"),
            stream_work: sym(lib, c"stub_stream_work"),
            stream_finish: sym(lib, c"stub_stream_finish"),
            stream_pending: sym(lib, c"stub_stream_pending"),
            stream_syncs: sym(lib, c"stub_stream_syncs"),
            event_syncs: sym(lib, c"stub_event_syncs"),
            live_events: sym(lib, c"stub_live_events"),
            stream_completed: sym(lib, c"stub_stream_completed"),
            stream_kernel: sym(lib, c"stub_stream_kernel"),
            begin_capture: sym(lib, c"stub_begin_capture"),
            end_capture: sym(lib, c"stub_end_capture"),
            capture_violations: sym(lib, c"stub_capture_violations"),
            write_tag: sym(lib, c"stub_write_tag"),
            read_tag: sym(lib, c"stub_read_tag"),
        }
    }
}

/// The variable that tells a test it runs as the child of [`in_child_on_stub`].
pub const CHILD: &str = "ADAPTALLOC_STUB_CUDA_CHILD";
/// The stub device's capacity in the tests that run on it.
pub const CAPACITY: u64 = 96 << 20;

/// In the child process (test `name` run again with `CHILD` set to it): runs `child`. Otherwise
/// runs test `name` again in a child process whose libcuda is the stub (the loader reads
/// LD_LIBRARY_PATH at process start), with `CHILD` set to `name` and the `env` given; the child
/// must succeed and print `marker`. Skips, saying why, where the stub cannot be used.
pub fn in_child_on_stub(name: &str, env: &[(&str, &str)], marker: &str, child: fn()) {
    if is_child(name) {
        return child();
    }
    let Some(dir) = stub_or_skip(name) else {
        return;
    };
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", name, "--nocapture", "--test-threads", "1"])
        .env(CHILD, name)
        .envs(env.iter().copied());
    let (ok, text) = run_on_stub(&mut cmd, &dir, CAPACITY);
    assert!(ok, "child failed:\n{text}");
    assert!(text.contains(marker), "{text}");
    std::fs::remove_dir_all(&dir).ok();
}

/// True in the child of [`in_child_on_stub`] for test `name`.
pub fn is_child(name: &str) -> bool {
    std::env::var(CHILD).is_ok_and(|v| v == name)
}
