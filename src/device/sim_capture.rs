//! CUDA graph capture on the simulated device: streams marked as capturing, and what a real
//! device would refuse meanwhile, counted as violations.
//!
//! On CUDA, while a stream is being captured, a query, a synchronization or an event wait on it
//! is an error that invalidates the capture, and a driver free (cuMemFree synchronizes the
//! device) or a device synchronization before an unmap is refused in the default (global)
//! capture mode. [`SimDevice`] answers a completion query on a capturing stream "not done", as
//! `CudaDevice` does after `cuStreamIsCapturing`, and counts every free, unmap, quiesce or
//! stream wait made while a capture is under way as a violation, so that tests can show the
//! allocator makes none.

use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use super::SimDevice;
use crate::strategy::StreamId;

/// The streams being captured, and the violations seen.
#[derive(Debug, Default)]
pub(super) struct Captures {
    streams: Mutex<Vec<StreamId>>,
    violations: AtomicU64,
}

impl Captures {
    /// Whether `stream` is being captured.
    pub(super) fn capturing(&self, stream: StreamId) -> bool {
        self.streams.lock().contains(&stream)
    }

    /// A call a real device refuses while any stream is being captured: counted if one is.
    pub(super) fn check(&self, call: &str) {
        let streams = self.streams.lock();
        if !streams.is_empty() {
            self.violations.fetch_add(1, Ordering::Relaxed);
            tracing::error!(call, capturing = ?*streams, "a call that breaks a CUDA graph capture was made during one");
        }
    }
}

impl SimDevice {
    /// Marks `stream` as being captured into a CUDA graph (cudaStreamBeginCapture), until
    /// [`end_capture`](SimDevice::end_capture).
    pub fn begin_capture(&self, stream: StreamId) {
        let mut s = self.captures.streams.lock();
        if !s.contains(&stream) {
            s.push(stream);
        }
    }

    /// Ends `stream`'s capture (cudaStreamEndCapture).
    pub fn end_capture(&self, stream: StreamId) {
        self.captures.streams.lock().retain(|&s| s != stream);
    }

    /// Calls made during a capture that a real device would refuse (or that would invalidate
    /// the capture): driver frees, unmaps, quiesces and stream waits.
    pub fn capture_violations(&self) -> u64 {
        self.captures.violations.load(Ordering::Relaxed)
    }
}
