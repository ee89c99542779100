//! Stream completion on CUDA: whether the work a stream had queued when the allocator freed
//! memory on it is done. When the allocator stops freeing on a stream for a while (it frees on
//! another: [`Device::stream_checkpoint`](super::Device::stream_checkpoint)), an event is
//! recorded on the stream. `stream_done` then queries that event, never waiting, when it covers
//! the free asked about, and `stream_wait` waits on it: a stream that never goes idle
//! still gives back what was freed on it earlier, and an out-of-memory wait lasts until the
//! free's point, not until all the work queued since. Without a checkpoint that covers the
//! free, the whole stream is asked (`cuStreamQuery`, `cuStreamSynchronize`).
//!
//! A stream being captured into a CUDA graph is never queried, synchronized or given an event
//! (each would break the capture): `cuStreamIsCapturing` is asked first, and such a stream reads
//! as not done, gets no checkpoint, and a wait on it is refused
//! ([`DeviceError::StreamCapturing`]).
//!
//! One event per stream with a checkpoint, re-recorded at the next one; destroyed once seen
//! complete or waited on, and the complete ones swept whenever [`SWEEP_AT`] are held, so the
//! table stays bounded by the streams with work still in flight.

use std::collections::HashMap;

use cudarc::driver::sys;

use super::cuda::{CudaDevice, check};
use crate::error::DeviceError;
use crate::strategy::StreamId;

/// A stream's last checkpoint: its event and the allocator's operation count of the last free
/// the event covers.
#[derive(Debug, Clone, Copy)]
pub(super) struct Checkpoint {
    event: sys::CUevent,
    op: u64,
}

/// Checkpoints held before the complete ones are swept.
const SWEEP_AT: usize = 1024;

/// The driver's handle for a stream id (what the C ABI passes; 0 is the legacy default stream).
fn handle(stream: StreamId) -> sys::CUstream {
    stream as usize as sys::CUstream
}

impl CudaDevice {
    /// Whether `stream` is being captured into a CUDA graph (`cuStreamIsCapturing`: a host-side
    /// query that neither syncs nor breaks a capture). A driver error reads as not capturing,
    /// so the call that follows reports it.
    fn capturing(&self, stream: StreamId) -> bool {
        let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        // SAFETY: `status` is a live local out-pointer; the stream is one the caller allocated
        // or freed on (as for cuStreamQuery); the driver only reads it.
        let r = unsafe { sys::cuStreamIsCapturing(handle(stream), &mut status) };
        r == sys::CUresult::CUDA_SUCCESS && status != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE
    }

    /// [`Device::stream_checkpoint`](super::Device::stream_checkpoint): records (or re-records)
    /// the stream's event. A driver error is logged and leaves the stream without a checkpoint
    /// (it is then asked as a whole).
    pub(super) fn checkpoint(&self, stream: StreamId, op: u64) {
        let Ok(_current) = self.make_current() else {
            return;
        };
        if self.capturing(stream) {
            return; // an event recorded now would be a node of the graph, not a checkpoint
        }
        let mut cps = self.checkpoints.lock();
        if cps.len() >= SWEEP_AT && !cps.contains_key(&stream) {
            cps.retain(|_, cp| {
                // SAFETY: an event of this context, kept in the table until destroyed on
                // removal (here, once complete); the context is current.
                let done = unsafe { sys::cuEventQuery(cp.event) } == sys::CUresult::CUDA_SUCCESS;
                if done {
                    destroy(cp.event);
                }
                !done
            });
        }
        // Re-recorded now, the event covers every free the old record did: the op it answers
        // for never goes back (a checkpoint for a later free is never replaced by an older one).
        let (event, op) = match cps.get(&stream) {
            Some(cp) => (cp.event, cp.op.max(op)),
            None => {
                let mut event = std::ptr::null_mut();
                let flags = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
                // SAFETY: `event` is a live local out-pointer; this device's context is current.
                if let Err(e) = check("cuEventCreate", unsafe { sys::cuEventCreate(&mut event, flags) }) {
                    tracing::warn!(stream, error = %e, "no checkpoint event; the stream is asked as a whole");
                    return;
                }
                (event, op)
            }
        };
        // SAFETY: `event` was created in this context (above, or earlier and kept in the table
        // until destroyed on removal). The stream is one the caller allocated and freed on, live
        // while it has work or memory with us (as for cuStreamQuery); the driver only reads it.
        let r = unsafe { sys::cuEventRecord(event, handle(stream)) };
        if let Err(e) = check("cuEventRecord", r) {
            tracing::warn!(stream, error = %e, "checkpoint not recorded; the stream is asked as a whole");
            cps.remove(&stream);
            destroy(event);
            return;
        }
        cps.insert(stream, Checkpoint { event, op });
    }

    /// [`Device::stream_done`](super::Device::stream_done): the checkpoint's event when it
    /// covers the free at `freed_at`, else the whole stream. Never waits; an error reads as not
    /// done (logged).
    pub(super) fn done_since(&self, stream: StreamId, freed_at: u64) -> bool {
        let Ok(_current) = self.make_current() else {
            return false;
        };
        if self.capturing(stream) {
            return false;
        }
        let mut cps = self.checkpoints.lock();
        if let Some(cp) = cps.get(&stream).copied().filter(|cp| cp.op >= freed_at) {
            // SAFETY: an event of this context, kept in the table until destroyed on removal.
            match unsafe { sys::cuEventQuery(cp.event) } {
                sys::CUresult::CUDA_SUCCESS => {
                    forget(&mut cps, stream);
                    return true;
                }
                sys::CUresult::CUDA_ERROR_NOT_READY => return false,
                other => tracing::warn!(stream, error = ?other, "cuEventQuery failed; asking the stream"),
            }
        }
        // SAFETY: as in `checkpoint` for the stream; the context is current.
        match unsafe { sys::cuStreamQuery(handle(stream)) } {
            sys::CUresult::CUDA_SUCCESS => {
                forget(&mut cps, stream);
                true
            }
            sys::CUresult::CUDA_ERROR_NOT_READY => false,
            other => {
                tracing::warn!(stream, error = ?other, "cuStreamQuery failed; the stream's memory stays with it");
                false
            }
        }
    }

    /// [`Device::stream_wait`](super::Device::stream_wait): on the checkpoint's
    /// event when it covers the free at `freed_at` (`u64::MAX`: the whole stream), else
    /// `cuStreamSynchronize`. Timed as `stream_sync`.
    pub(super) fn wait_until(&self, stream: StreamId, freed_at: u64) -> Result<(), DeviceError> {
        let _current = self.make_current()?;
        if self.capturing(stream) {
            return Err(DeviceError::StreamCapturing { stream });
        }
        let mut cps = self.checkpoints.lock();
        if let Some(cp) = cps.get(&stream).copied().filter(|cp| cp.op >= freed_at) {
            // SAFETY: an event of this context, kept in the table until destroyed on removal.
            let r = self.timed(|o| &mut o.stream_sync, || unsafe { sys::cuEventSynchronize(cp.event) });
            match check("cuEventSynchronize", r) {
                Ok(()) => {
                    forget(&mut cps, stream);
                    return Ok(());
                }
                Err(e) => tracing::warn!(stream, error = %e, "waiting on the whole stream instead"),
            }
        }
        // SAFETY: as in `checkpoint` for the stream; the context is current.
        let r = self.timed(
            |o| &mut o.stream_sync,
            || unsafe { sys::cuStreamSynchronize(handle(stream)) },
        );
        check("cuStreamSynchronize", r)?;
        forget(&mut cps, stream);
        Ok(())
    }

    /// Destroys every checkpoint event (the device is going away; its context is current).
    pub(super) fn drop_checkpoints(&self) {
        for (_, cp) in self.checkpoints.lock().drain() {
            destroy(cp.event);
        }
    }
}

/// While alive, this thread's stream capture mode is relaxed (the old mode comes back on drop),
/// so that a driver allocation made while a CUDA graph is being captured is allowed, as
/// PyTorch's own allocator does (in the default global mode the driver refuses it and the
/// capture breaks). Memory so allocated is never given back during the capture (pools.rs).
/// Cost: two host-side driver calls around a driver allocation.
pub(super) struct RelaxedCapture(sys::CUstreamCaptureMode);

impl RelaxedCapture {
    pub(super) fn new() -> Self {
        let mut mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
        // SAFETY: `mode` is a live local the driver reads and overwrites with the old mode.
        let r = unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut mode) };
        if r != sys::CUresult::CUDA_SUCCESS {
            // Nothing was exchanged: restore the usual default on drop.
            mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL;
        }
        RelaxedCapture(mode)
    }
}

impl Drop for RelaxedCapture {
    fn drop(&mut self) {
        // SAFETY: as in `new`; puts back the mode this thread had.
        let _ = unsafe { sys::cuThreadExchangeStreamCaptureMode(&mut self.0) };
    }
}

/// Removes `stream`'s checkpoint, if any, and destroys its event.
fn forget(cps: &mut HashMap<StreamId, Checkpoint>, stream: StreamId) {
    if let Some(cp) = cps.remove(&stream) {
        destroy(cp.event);
    }
}

/// Destroys a checkpoint event taken out of the table.
fn destroy(event: sys::CUevent) {
    // SAFETY: the event was created by cuEventCreate and is no longer in the table, so nothing
    // uses it again; destroying an event whose work is pending is allowed (the driver frees it
    // once the work completes).
    let r = unsafe { sys::cuEventDestroy_v2(event) };
    if let Err(e) = check("cuEventDestroy_v2", r) {
        tracing::warn!(error = %e, "a checkpoint event could not be destroyed");
    }
}
