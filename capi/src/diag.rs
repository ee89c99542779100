//! The C ABI's diagnostics: the last error of each thread (`adaptalloc_last_error`) and the
//! engine's `tracing` events on stderr (`ADAPTALLOC_LOG`).

use std::cell::RefCell;
use std::ffi::{CString, c_char};

use tracing_subscriber::filter::LevelFilter;

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

/// Keeps `message` as this thread's last error and logs it as a warning.
pub(crate) fn set_error(message: String) {
    tracing::warn!("{message}");
    keep_error(message);
}

/// [`set_error`] for an error already logged where it arose (an allocation the engine found
/// no memory for: `allocation failed`, with what it held): kept, not logged twice.
pub(crate) fn keep_error(message: String) {
    let c = CString::new(message.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = c);
}

/// A successful call clears the last error, so that after a call that returns nothing (free)
/// an empty `adaptalloc_last_error()` means it worked.
pub(crate) fn clear_error() {
    LAST_ERROR.with(|e| {
        let mut e = e.borrow_mut();
        if !e.as_bytes().is_empty() {
            *e = CString::default();
        }
    });
}

/// The last error on this thread, as a NUL-terminated string ("" when none), valid until the
/// next call that sets or clears it on this thread.
pub(crate) fn last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

/// Prints the engine's `tracing` events to stderr from `ADAPTALLOC_LOG`'s level up: `off`,
/// `error`, `warn` (when unset), `info`, `debug` or `trace`. Without it a C or Python host,
/// which installs no Rust subscriber, would never see a warning. Once per process, and only
/// where the host has not installed a subscriber of its own; an unknown level is printed once
/// and `warn` kept.
pub(crate) fn init_log() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let wanted = std::env::var("ADAPTALLOC_LOG").ok();
        let level = match wanted.as_deref().map(|v| v.trim().parse::<LevelFilter>()) {
            None => LevelFilter::WARN,
            Some(Ok(level)) => level,
            Some(Err(_)) => {
                eprintln!(
                    "adaptalloc: ADAPTALLOC_LOG={:?}: use off, error, warn, info, debug or trace; printing warnings",
                    wanted.unwrap_or_default()
                );
                LevelFilter::WARN
            }
        };
        let _ = tracing_subscriber::fmt()
            .with_max_level(level)
            .with_writer(std::io::stderr)
            .with_ansi(false)
            .without_time()
            .try_init();
    });
}
