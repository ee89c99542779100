//! The C ABI, built as `libadaptalloc.so`: the signatures of PyTorch's `CUDAPluggableAllocator`, plus
//! `adaptalloc_empty_cache`, `adaptalloc_stats` and `adaptalloc_last_error`. Declared in
//! `include/adaptalloc.h`.
//!
//! One allocator per device, created on first use with the policy from `ADAPTALLOC_POLICY`
//! (the default when unset). `ADAPTALLOC_REPORT=path` writes each device's tuning report at
//! exit (`path` as given for device 0; for device N, N before the extension: `rep.md`, `rep.1.md`). A child made by fork() gets
//! allocators of its own on first use (never its parent's) and writes no report. `ADAPTALLOC_DEVICE=sim:SIZE`
//! runs on a simulated device of that size instead of CUDA (tests, dry runs). The engine's
//! events go to stderr from `ADAPTALLOC_LOG`'s level up (`warn` when unset: a failed
//! allocation, a workload that outgrew its policy's `bounds.expected_peak`; `info`: every
//! route change and release; `off`). No panic crosses the boundary: every entry point catches
//! it, logs it, and returns NULL or an error code.

#![forbid(unsafe_op_in_unsafe_fn)]

use std::ffi::{c_char, c_int, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use adaptalloc_core::allocator::Allocator;
use adaptalloc_core::device::{Device, SimDevice};
use adaptalloc_core::size::ByteSize;
use adaptalloc_core::{AllocError, CudaDevice, DevicePtr};

// The last error of each thread and the engine's log on stderr. By path: the Python extension
// compiles this file as a module of its own.
#[path = "diag.rs"]
mod diag;
use diag::{clear_error, init_log, keep_error, set_error};

/// The C ABI's version (`ADAPTALLOC_ABI_VERSION` in the header): 1, the first ten fields of
/// [`AdaptallocStats`]; 2, `stream_reclaims` and `stream_waits` added; 3,
/// `adaptalloc_stats_sized` and `adaptalloc_abi_version`, and `adaptalloc_stats` writing the
/// first version's fields only; 4, PyTorch's other hooks (`adaptalloc_torch_hook` and the calls
/// it names) and private pools; 5, `driver_allocs` and `driver_frees` count every physical
/// handle (each cuMemCreate and cuMemRelease, not each mapping call), and `vmm_calls` added.
pub const ABI_VERSION: u32 = 5;

/// The fields of the first version of [`AdaptallocStats`]: what `adaptalloc_stats` writes, so
/// that a caller built against any header has room for them.
const STATS_V1_BYTES: usize = 10 * std::mem::size_of::<u64>();

/// Statistics of one device's allocator, as `adaptalloc_stats_sized` fills them.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct AdaptallocStats {
    pub live_bytes: u64,
    pub peak_live_bytes: u64,
    pub reserved_bytes: u64,
    pub peak_reserved_bytes: u64,
    pub idle_bytes: u64,
    pub live_blocks: u64,
    pub driver_allocs: u64,
    pub driver_frees: u64,
    pub failed_allocs: u64,
    pub oom_recoveries: u64,
    pub stream_reclaims: u64,
    pub stream_waits: u64,
    pub vmm_calls: u64,
}

/// Devices a process may use through the C ABI (ordinals 0..MAX_DEVICES).
const MAX_DEVICES: usize = 64;

/// The one wording for a device ordinal outside 0..MAX_DEVICES, whichever call is given it.
fn out_of_range(device: c_int) -> String {
    format!("device {device}: adaptalloc serves devices 0 to {}", MAX_DEVICES - 1)
}

/// Why `device` has no allocator: out of range, or nothing allocated on it yet.
fn no_allocator(device: c_int) -> String {
    if usize::try_from(device).is_ok_and(|d| d < MAX_DEVICES) {
        format!("no allocator for device {device} yet (nothing was allocated on it)")
    } else {
        out_of_range(device)
    }
}

/// The allocators of one process, one slot per device. Looking one up takes no lock (a
/// `OnceLock` read): the malloc/free path has no global lock beyond the allocator's own. Only
/// creating an allocator takes `create`.
struct Table {
    pid: u32,
    slots: [OnceLock<Allocator>; MAX_DEVICES],
    create: Mutex<()>,
}

impl Table {
    /// Every allocator made so far, with its device.
    fn all(&self) -> impl Iterator<Item = (c_int, &Allocator)> {
        self.slots
            .iter()
            .enumerate()
            .filter_map(|(d, s)| s.get().map(|a| (d as c_int, a)))
    }

    /// The allocator of `device`, if made.
    fn get(&self, device: c_int) -> Option<&Allocator> {
        self.slots.get(usize::try_from(device).ok()?)?.get()
    }
}

/// The current process's table. A child made by fork() gets a fresh one on its first use and
/// never touches its parent's: another parent thread may have held the parent's locks at the
/// fork, and that thread does not exist in the child (so its locks would never be released),
/// and the parent's allocators hold the parent's device memory. The parent's table is left
/// alone (leaked in the child), so a child neither deadlocks nor writes the parent's report.
static TABLE: AtomicPtr<Table> = AtomicPtr::new(std::ptr::null_mut());

/// This process's id, read without a system call on every request (getpid took 170-185 ns here,
/// two a malloc/free pair): set once the fork handler is registered, and set again in a child
/// made by fork() by that handler. 0 until then.
static PID: AtomicU32 = AtomicU32::new(0);

/// Whether [`forked_child`] has been (or is being) registered.
static FORK_HANDLER: AtomicBool = AtomicBool::new(false);

/// Runs in the child after fork(), before fork() returns there: getpid is async-signal-safe.
extern "C" fn forked_child() {
    PID.store(std::process::id(), Ordering::Release);
}

/// The current process's id: a load, once [`first_pid`] has run.
#[inline]
fn current_pid() -> u32 {
    match PID.load(Ordering::Acquire) {
        0 => first_pid(),
        pid => pid,
    }
}

/// Registers the fork handler, then publishes the id, in that order: a PID set before a fork
/// means the child's handler ran. Another thread meanwhile (or a child forked in between) asks
/// the system each time, as before.
#[cold]
fn first_pid() -> u32 {
    if !FORK_HANDLER.swap(true, Ordering::AcqRel) {
        // SAFETY: registers a plain extern "C" function with no captured state, for the child
        // side only; it stores one atomic.
        unsafe { pthread_atfork(None, None, Some(forked_child)) };
        PID.store(std::process::id(), Ordering::Release);
    }
    std::process::id()
}

fn table() -> &'static Table {
    let pid = current_pid();
    let mut seen = TABLE.load(Ordering::Acquire);
    loop {
        // SAFETY: a non-null TABLE points at a leaked Box<Table> that is never freed.
        if let Some(t) = unsafe { seen.as_ref() }
            && t.pid == pid
        {
            return t;
        }
        let fresh = Box::into_raw(Box::new(Table {
            pid,
            slots: std::array::from_fn(|_| OnceLock::new()),
            create: Mutex::new(()),
        }));
        match TABLE.compare_exchange(seen, fresh, Ordering::AcqRel, Ordering::Acquire) {
            // SAFETY: `fresh` came from Box::into_raw above and is now published, never freed.
            Ok(_) => return unsafe { &*fresh },
            Err(now) => {
                // Another thread of this process made one first: use it, drop ours.
                // SAFETY: `fresh` was never published; this is its only owner.
                drop(unsafe { Box::from_raw(fresh) });
                seen = now;
            }
        }
    }
}

unsafe extern "C" {
    /// libc's atexit: statics are never dropped, so reports are written from here.
    fn atexit(callback: extern "C" fn()) -> c_int;
    /// POSIX's fork handlers (prepare, parent, child); each may be NULL.
    fn pthread_atfork(
        prepare: Option<extern "C" fn()>,
        parent: Option<extern "C" fn()>,
        child: Option<extern "C" fn()>,
    ) -> c_int;
}

/// Whether the first failure to build an allocator from the environment was printed.
static CONFIG_ERROR_PRINTED: AtomicBool = AtomicBool::new(false);

/// The process that registered [`write_files_at_exit`] (the tuning reports and profiles; 0:
/// none yet).
static REPORT_PID: AtomicU32 = AtomicU32::new(0);

extern "C" fn write_files_at_exit() {
    if REPORT_PID.load(Ordering::Acquire) != std::process::id() {
        return; // a forked child: the files are its parent's to write
    }
    let _ = catch_unwind(|| {
        // Each device's report and profile, at the paths from_env_device gave it.
        for (_, alloc) in table().all() {
            alloc.write_exit_files();
        }
    });
}

/// The allocator of `device`, created on first use (the only step that takes a lock).
fn allocator(device: c_int) -> Result<&'static Allocator, String> {
    let t = table();
    if let Some(a) = t.get(device) {
        return Ok(a);
    }
    let Some(slot) = usize::try_from(device).ok().and_then(|d| t.slots.get(d)) else {
        return Err(out_of_range(device));
    };
    let _creating = t
        .create
        .lock()
        .map_err(|_| "allocator table poisoned by an earlier panic".to_string())?;
    if let Some(a) = slot.get() {
        return Ok(a);
    }
    init_log();
    // Loud once: a broken ADAPTALLOC_DEVICE or ADAPTALLOC_POLICY would otherwise make every
    // malloc return NULL with the reason only in adaptalloc_last_error().
    let loud = |message: String| {
        if !CONFIG_ERROR_PRINTED.swap(true, Ordering::Relaxed) {
            eprintln!("adaptalloc: cannot build an allocator from the environment: {message}");
        }
        message
    };
    let dev: Arc<dyn Device> = match std::env::var("ADAPTALLOC_DEVICE") {
        Ok(spec) if spec.starts_with("sim:") => {
            let size: ByteSize = spec[4..]
                .parse()
                .map_err(|e| loud(format!("ADAPTALLOC_DEVICE={spec:?}: {e}")))?;
            Arc::new(SimDevice::new(size.0))
        }
        Ok(spec) if spec != "cuda" && !spec.is_empty() => {
            return Err(loud(format!(
                "ADAPTALLOC_DEVICE={spec:?}: use `cuda` or `sim:SIZE` (e.g. sim:16GiB), lower case, no spaces"
            )));
        }
        _ => Arc::new(CudaDevice::new(device).map_err(|e| format!("device {device}: {e}"))?),
    };
    let alloc = Allocator::from_env_device(dev, device).map_err(|e| loud(e.to_string()))?;
    // The process whose first allocator has a report or a profile to write (ADAPTALLOC_REPORT,
    // ADAPTALLOC_PROFILE, as from_env_device read them) writes the files; a child made by fork()
    // inherits the hook and this mark, and writes none (it would overwrite its parent's).
    if alloc.has_exit_files()
        && REPORT_PID
            .compare_exchange(0, std::process::id(), Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    {
        // SAFETY: registers a plain extern "C" function with no captured state.
        unsafe { atexit(write_files_at_exit) };
    }
    Ok(slot.get_or_init(|| alloc))
}

/// Allocates `size` bytes on `device` for `stream` (a `cudaStream_t`); NULL on failure, with
/// the reason in `adaptalloc_last_error()`.
#[unsafe(no_mangle)]
pub extern "C" fn adaptalloc_malloc(size: usize, device: c_int, stream: *mut c_void) -> *mut c_void {
    let stream = stream as usize as u64;
    let result = catch_unwind(AssertUnwindSafe(|| {
        let alloc = allocator(device).map_err(|e| (e, false))?;
        alloc
            .allocate_raw(size as u64, stream)
            .map_err(|e| (e.to_string(), matches!(e, AllocError::OutOfMemory { .. })))
    }));
    match result {
        Ok(Ok(ptr)) => {
            clear_error();
            ptr as usize as *mut c_void
        }
        Ok(Err((message, logged))) => {
            let message = format!("adaptalloc_malloc({size}, device {device}): {message}");
            if logged {
                keep_error(message)
            } else {
                set_error(message)
            }
            std::ptr::null_mut()
        }
        Err(_) => {
            set_error(format!(
                "adaptalloc_malloc({size}, device {device}): internal panic (a bug; please report it)"
            ));
            std::ptr::null_mut()
        }
    }
}

/// Frees `ptr` from `adaptalloc_malloc` on `device` and `stream`. Errors (an unknown pointer)
/// are logged and kept in `adaptalloc_last_error()`; nothing is corrupted.
#[unsafe(no_mangle)]
pub extern "C" fn adaptalloc_free(ptr: *mut c_void, size: usize, device: c_int, stream: *mut c_void) {
    if ptr.is_null() {
        clear_error(); // free(NULL) succeeds, as cudaFree(NULL) does
        return;
    }
    let (addr, stream) = (ptr as usize as DevicePtr, stream as usize as u64);
    let result = catch_unwind(AssertUnwindSafe(|| {
        let alloc = allocator(device)?;
        alloc.deallocate(addr, stream).map_err(|e| e.to_string())
    }));
    match result {
        Ok(Ok(())) => clear_error(),
        Ok(Err(message)) => set_error(format!(
            "adaptalloc_free({addr:#x}, {size}, device {device}): {message}"
        )),
        Err(_) => set_error(format!(
            "adaptalloc_free({addr:#x}): internal panic (a bug; please report it)"
        )),
    }
}

/// Gives every device's idle memory back to the driver; returns the bytes released.
#[unsafe(no_mangle)]
pub extern "C" fn adaptalloc_empty_cache() -> u64 {
    match catch_unwind(|| table().all().map(|(_, a)| a.release_idle()).sum()) {
        Ok(released) => {
            clear_error();
            released
        }
        Err(_) => {
            set_error("adaptalloc_empty_cache: internal panic (a bug; please report it)".into());
            0
        }
    }
}

/// Fills the first ten fields of `out` (the struct of ABI version 1) with `device`'s
/// statistics; 0 on success, -1 when `out` is NULL or the device has no allocator (nothing
/// allocated on it yet). Writes 80 bytes whatever header the caller was built against, so an
/// old caller's memory is never overwritten; [`adaptalloc_stats_sized`] fills every field.
///
/// # Safety
/// `out` must be NULL or point to writable memory for the first ten fields of an
/// `AdaptallocStats` (80 bytes).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn adaptalloc_stats(device: c_int, out: *mut AdaptallocStats) -> c_int {
    // SAFETY: the caller's contract: `out` is NULL or valid for STATS_V1_BYTES bytes.
    unsafe { write_stats("adaptalloc_stats", device, out.cast(), STATS_V1_BYTES) }
}

/// Fills `out`, a struct of `out_size` bytes, with `device`'s statistics: the fields that fit
/// (`min(out_size, sizeof(AdaptallocStats))` bytes, whole fields only), nothing beyond. 0 on
/// success, -1 when `out` is NULL or the device has no allocator yet.
///
/// # Safety
/// `out` must be NULL or point to `out_size` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn adaptalloc_stats_sized(device: c_int, out: *mut AdaptallocStats, out_size: usize) -> c_int {
    // SAFETY: the caller's contract: `out` is NULL or valid for `out_size` bytes.
    unsafe { write_stats("adaptalloc_stats_sized", device, out.cast(), out_size) }
}

/// The C ABI's version ([`ABI_VERSION`]): a caller can check that the library it loaded has the
/// calls and fields it was built for.
#[unsafe(no_mangle)]
pub extern "C" fn adaptalloc_abi_version() -> u32 {
    clear_error();
    ABI_VERSION
}

/// Writes the whole fields of `device`'s statistics that fit in `room` bytes at `out`.
///
/// # Safety
/// `out` must be NULL or point to `room` writable bytes.
unsafe fn write_stats(call: &str, device: c_int, out: *mut u8, room: usize) -> c_int {
    if out.is_null() {
        set_error(format!("{call}: out is NULL"));
        return -1;
    }
    let stats = catch_unwind(|| table().get(device).map(Allocator::stats));
    let Ok(Some(s)) = stats else {
        set_error(format!("{call}: {}", no_allocator(device)));
        return -1;
    };
    let c = AdaptallocStats {
        live_bytes: s.live_bytes.current,
        peak_live_bytes: s.live_bytes.peak,
        reserved_bytes: s.reserved_bytes.current,
        peak_reserved_bytes: s.reserved_bytes.peak,
        idle_bytes: s.idle_bytes.current,
        live_blocks: s.live_blocks.current,
        driver_allocs: s.driver_allocs,
        driver_frees: s.driver_frees,
        failed_allocs: s.failed_allocs,
        oom_recoveries: s.oom_recoveries,
        stream_reclaims: s.stream_reclaims,
        stream_waits: s.stream_waits,
        vmm_calls: s.vmm_calls,
    };
    let field = std::mem::size_of::<u64>();
    let n = room.min(std::mem::size_of::<AdaptallocStats>()) / field * field;
    // SAFETY: `c` is a live local of at least `n` bytes; `out` is non-null and, by the
    // caller's contract, valid for `room >= n` bytes; the two cannot overlap (one is a local).
    unsafe { std::ptr::copy_nonoverlapping((&raw const c).cast::<u8>(), out, n) };
    clear_error();
    0
}

/// `device`'s allocator statistics; None when nothing was allocated on it yet. For the Python
/// extension, which compiles this file in (`memory_stats`).
#[allow(dead_code)]
pub(crate) fn stats_of(device: c_int) -> Option<adaptalloc_core::Stats> {
    table().get(device).map(Allocator::stats)
}

/// Runs `f`, catching a panic: 0 with the last error cleared, or -1 with `call: reason` as the
/// last error (`f`'s error, or the panic).
fn guarded(call: &str, f: impl FnOnce() -> Result<(), String>) -> c_int {
    let message = match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => {
            clear_error();
            return 0;
        }
        Ok(Err(message)) => message,
        Err(_) => "internal panic (a bug; please report it)".to_string(),
    };
    set_error(format!("{call}: {message}"));
    -1
}

/// Runs `f` on `device`'s allocator: 0, or -1 with the reason in `adaptalloc_last_error()`
/// (prefixed by `call`) when the device has none yet, `f` fails, or `f` panicked.
fn with_allocator(call: &str, device: c_int, f: impl FnOnce(&Allocator) -> Result<(), AllocError>) -> c_int {
    guarded(call, || {
        let alloc = table().get(device).ok_or_else(|| no_allocator(device))?;
        f(alloc).map_err(|e| e.to_string())
    })
}

/// Tells `device`'s allocator that all work queued on `stream` has completed (call it after
/// `cudaStreamSynchronize`): memory freed on it serves every stream at once. Without it, such
/// memory serves other streams once the driver reports the stream idle, or after a wait
/// before a request would fail. 0, or -1 when nothing was allocated on `device` yet.
#[unsafe(no_mangle)]
pub extern "C" fn adaptalloc_synchronize_stream(device: c_int, stream: *mut c_void) -> c_int {
    let stream = stream as usize as u64;
    with_allocator("adaptalloc_synchronize_stream", device, |a| {
        a.synchronize_stream(stream);
        Ok(())
    })
}

/// Marks `ptr` (live, from `adaptalloc_malloc` on `device`) as used by `stream` too, as
/// PyTorch's `recordStream` does for a tensor used on a side stream (NCCL's, say): once freed, it
/// is not reused until `stream`'s work up to the free is done. 0, or -1 with the reason in
/// `adaptalloc_last_error()` (no allocator on `device`, or `ptr` not live).
#[unsafe(no_mangle)]
pub extern "C" fn adaptalloc_record_stream(ptr: *mut c_void, device: c_int, stream: *mut c_void) -> c_int {
    let (addr, stream) = (ptr as usize as DevicePtr, stream as usize as u64);
    let call = format!("adaptalloc_record_stream({addr:#x}, device {device})");
    with_allocator(&call, device, |a| a.record_stream(addr, stream))
}

/// Restarts `device`'s peak statistics from their current values (say, between training
/// steps). 0, or -1 when nothing was allocated on `device` yet.
#[unsafe(no_mangle)]
pub extern "C" fn adaptalloc_reset_peak_stats(device: c_int) -> c_int {
    with_allocator("adaptalloc_reset_peak_stats", device, |a| {
        a.reset_peaks();
        Ok(())
    })
}

/// The last error on this thread, as a NUL-terminated string ("" when none). Valid until the
/// next adaptalloc call on this thread.
#[unsafe(no_mangle)]
pub extern "C" fn adaptalloc_last_error() -> *const c_char {
    diag::last_error()
}

// PyTorch's hooks beyond malloc and free (CUDAPluggableAllocator's setters), each with the
// signature PyTorch casts the address to; `adaptalloc_torch_hook` gives their addresses.

/// PyTorch's reset hook, `void()`: `torch.cuda.empty_cache()` gives every device's idle memory
/// back (as [`adaptalloc_empty_cache`], whose byte count PyTorch has no use for).
#[unsafe(no_mangle)]
pub extern "C" fn adaptalloc_torch_empty_cache() {
    adaptalloc_empty_cache();
}

/// PyTorch's record_stream hook, `void(void*, cudaStream_t)`: as [`adaptalloc_record_stream`],
/// on the device whose allocator holds `ptr` (PyTorch passes no device).
#[unsafe(no_mangle)]
pub extern "C" fn adaptalloc_torch_record_stream(ptr: *mut c_void, stream: *mut c_void) {
    let (addr, s) = (ptr as usize as DevicePtr, stream as usize as u64);
    guarded(&format!("adaptalloc_torch_record_stream({addr:#x})"), || {
        if table().all().any(|(_, a)| a.record_stream(addr, s).is_ok()) {
            Ok(())
        } else {
            Err("not a live allocation of any device's allocator".into())
        }
    });
}

/// PyTorch's memory fraction hook, `void(double, int)` (`set_per_process_memory_fraction`):
/// caps what `device`'s allocator may hold at `fraction` of the device's memory; a request past
/// the cap releases idle memory and retries, then fails as out-of-memory. 0 < fraction <= 1.
#[unsafe(no_mangle)]
pub extern "C" fn adaptalloc_set_memory_fraction(fraction: f64, device: c_int) {
    let call = format!("adaptalloc_set_memory_fraction({fraction}, device {device})");
    if !(fraction.is_finite() && fraction > 0.0 && fraction <= 1.0) {
        set_error(format!("{call}: the fraction must be more than 0 and at most 1"));
        return;
    }
    guarded(&call, || {
        let alloc = allocator(device)?;
        let total = alloc.device().mem_info().map_err(|e| e.to_string())?.total;
        alloc.set_memory_cap(Some((total as f64 * fraction) as u64));
        Ok(())
    });
}

/// PyTorch's init hook, `void(int)`, called when CUDA initializes with the number of devices:
/// checks `ADAPTALLOC_POLICY` now, so that a broken policy is printed (file, line and key) when
/// CUDA starts rather than at the first allocation.
#[unsafe(no_mangle)]
pub extern "C" fn adaptalloc_torch_init(device_count: c_int) {
    guarded(&format!("adaptalloc_torch_init({device_count})"), || {
        adaptalloc_core::policy::Policy::from_env().map(drop).map_err(|e| {
            if !CONFIG_ERROR_PRINTED.swap(true, Ordering::Relaxed) {
                eprintln!("adaptalloc: cannot build an allocator from the environment: {e}");
            }
            e.to_string()
        })
    });
}

/// A stream filter passed through the C ABI: `filter(ctx, stream)` nonzero takes the stream;
/// `drop(ctx)`, if given, is called once when the filter is done with.
struct CFilter {
    filter: unsafe extern "C" fn(*mut c_void, *mut c_void) -> c_int,
    ctx: *mut c_void,
    drop: Option<unsafe extern "C" fn(*mut c_void)>,
}

// SAFETY: `adaptalloc_begin_pool`'s contract: `filter` and `drop` may be called with `ctx` from
// any thread (the allocator's lock keeps the calls apart).
unsafe impl Send for CFilter {}

impl CFilter {
    fn accepts(&self, stream: u64) -> bool {
        // SAFETY: the caller's contract for `filter` and `ctx` (alive until `self` drops).
        unsafe { (self.filter)(self.ctx, stream as usize as *mut c_void) != 0 }
    }
}

impl Drop for CFilter {
    fn drop(&mut self) {
        if let Some(drop) = self.drop {
            // SAFETY: the caller's contract: `drop(ctx)` once, after the last call of `filter`.
            unsafe { drop(self.ctx) };
        }
    }
}

/// Opens a window in which `device`'s requests on streams `filter` takes come from private pool
/// `(id0, id1)` (made on first use): PyTorch's beginAllocateToPool, at the start of a CUDA graph
/// capture or a `torch.cuda.use_mem_pool` block. Until the window ends, the allocator gives no
/// memory back and waits on no stream. A NULL `filter` takes every stream. 0, or -1 with the
/// reason in `adaptalloc_last_error()`. Takes ownership of `ctx`: `drop(ctx)` is called once,
/// when the window ends, or before returning -1.
///
/// # Safety
/// `filter` (if not NULL) and `drop` (if not NULL) must be safe to call with `ctx` from any
/// thread until `drop` is called; `filter` must not call adaptalloc.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn adaptalloc_begin_pool(
    device: c_int,
    id0: u64,
    id1: u64,
    filter: Option<unsafe extern "C" fn(*mut c_void, *mut c_void) -> c_int>,
    ctx: *mut c_void,
    drop: Option<unsafe extern "C" fn(*mut c_void)>,
) -> c_int {
    let held = filter.map(|filter| CFilter { filter, ctx, drop });
    if held.is_none()
        && let Some(drop) = drop
    {
        // SAFETY: the caller's contract; there is no filter to call, so this is the last use.
        unsafe { drop(ctx) };
    }
    let call = format!("adaptalloc_begin_pool(device {device}, pool ({id0}, {id1}))");
    guarded(&call, || {
        let alloc = allocator(device)?;
        let filter: adaptalloc_core::StreamFilter = match held {
            Some(f) => Box::new(move |s| f.accepts(s)),
            None => Box::new(|_| true),
        };
        alloc.begin_pool((id0, id1), filter);
        Ok(())
    })
}

/// Ends pool `(id0, id1)`'s latest window on `device` (PyTorch's endAllocateToPool, after the
/// capture ends). 0, or -1 (no such window; the reason in `adaptalloc_last_error()`).
#[unsafe(no_mangle)]
pub extern "C" fn adaptalloc_end_pool(device: c_int, id0: u64, id1: u64) -> c_int {
    let call = format!("adaptalloc_end_pool(device {device}, pool ({id0}, {id1}))");
    with_allocator(&call, device, |a| a.end_pool((id0, id1)))
}

/// Pool `(id0, id1)` on `device` is no longer needed (PyTorch's releasePool, when the graph or
/// MemPool is destroyed): its memory goes back to the device once its last block is freed. 0,
/// or -1 (no such pool).
#[unsafe(no_mangle)]
pub extern "C" fn adaptalloc_release_pool(device: c_int, id0: u64, id1: u64) -> c_int {
    let call = format!("adaptalloc_release_pool(device {device}, pool ({id0}, {id1}))");
    with_allocator(&call, device, |a| a.release_pool((id0, id1)))
}

unsafe extern "C" {
    /// capi/src/torch_hooks.cpp: the address of PyTorch's pool hook `which` (0 begin, 1 end,
    /// 2 release), C++ functions taking `MempoolId_t` and `std::function` as PyTorch passes them.
    fn adaptalloc_shim_pool_hook(which: c_int) -> *mut c_void;
}

/// The address of the function to give PyTorch's `CUDAPluggableAllocator` for hook `name`
/// (NUL-terminated): `malloc`, `free`, `reset` (`set_reset_fn`), `record_stream`,
/// `memory_fraction`, `init`, `begin_allocate_to_pool`, `end_allocate_to_pool`,
/// `release_pool`; NULL for any other name (the reason in `adaptalloc_last_error()`).
///
/// # Safety
/// `name` must be NULL or a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn adaptalloc_torch_hook(name: *const c_char) -> *mut c_void {
    if name.is_null() {
        set_error("adaptalloc_torch_hook: name is NULL".into());
        return std::ptr::null_mut();
    }
    // SAFETY: the caller's contract: a NUL-terminated string.
    let name = unsafe { std::ffi::CStr::from_ptr(name) }.to_string_lossy();
    let pool = |which| {
        // SAFETY: a plain C function of the shim, valid for 0..=2.
        unsafe { adaptalloc_shim_pool_hook(which) }
    };
    let address = match &*name {
        "malloc" => adaptalloc_malloc as *mut c_void,
        "free" => adaptalloc_free as *mut c_void,
        "reset" => adaptalloc_torch_empty_cache as *mut c_void,
        "record_stream" => adaptalloc_torch_record_stream as *mut c_void,
        "memory_fraction" => adaptalloc_set_memory_fraction as *mut c_void,
        "init" => adaptalloc_torch_init as *mut c_void,
        "begin_allocate_to_pool" => pool(0),
        "end_allocate_to_pool" => pool(1),
        "release_pool" => pool(2),
        other => {
            set_error(format!(
                "adaptalloc_torch_hook({other:?}): no such hook; the hooks are malloc, free, reset, \
                 record_stream, memory_fraction, init, begin_allocate_to_pool, end_allocate_to_pool, release_pool"
            ));
            return std::ptr::null_mut();
        }
    };
    clear_error();
    address
}
