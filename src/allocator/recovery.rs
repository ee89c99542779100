//! The allocator's cold paths: the out-of-memory rung of the ladder (ladder.rs) and the error
//! that finally reaches the caller, and giving idle memory back under the headroom.

use crate::device::{Device, MemInfo};
use crate::error::{AllocError, DeviceError};
use crate::size::ByteSize;
use crate::strategy::{Grant, Strategy, StreamId};

use super::{Ladder, Shared, State};

impl Shared {
    /// A request no device memory could serve (size 0, or more than the device holds): counted
    /// as a failed allocation, as every refusal is. Cold: one lock for the count.
    #[cold]
    pub(super) fn refuse(&self, bytes: u64) -> AllocError {
        self.state.lock().stats.failed_allocs += 1;
        if bytes == 0 {
            AllocError::ZeroSize
        } else {
            AllocError::TooLarge {
                requested: ByteSize(bytes),
                capacity: ByteSize(self.capacity),
            }
        }
    }

    /// Slow path: on out-of-memory, the ladder's out-of-memory rung; else (or when it fails too)
    /// the error the caller gets.
    #[cold]
    pub(super) fn allocate_after_error(
        &self,
        st: &mut State,
        si: usize,
        aligned: u64,
        bytes: u64,
        stream: StreamId,
        err: DeviceError,
    ) -> Result<(Grant, usize), AllocError> {
        if !err.is_out_of_memory() {
            st.stats.failed_allocs += 1;
            return Err(AllocError::Device(err));
        }
        if st.pools.in_window() {
            // No release and no wait while a capture may be under way (pools.rs).
            return Err(self.fail_in_window(st, bytes, err));
        }
        let last =
            match Ladder::new(st, &self.device, si, aligned, stream).after_out_of_memory(self.release_on_oom, err) {
                Ok(found) => {
                    st.stats.oom_recoveries += 1;
                    return Ok(found);
                }
                Err(e) if !e.is_out_of_memory() => {
                    st.stats.failed_allocs += 1;
                    return Err(AllocError::Device(e));
                }
                Err(last) => last,
            };
        st.stats.failed_allocs += 1;
        st.refresh();
        let info = self.device.mem_info().unwrap_or(MemInfo { free: 0, total: 0 });
        let err = AllocError::OutOfMemory {
            requested: ByteSize(bytes),
            live: ByteSize(st.stats.live_bytes.current),
            reserved: ByteSize(st.stats.reserved_bytes.current),
            idle: ByteSize(st.stats.idle_bytes.current),
            largest_free: ByteSize(
                st.strategies
                    .iter()
                    .map(Strategy::largest_free_block)
                    .max()
                    .unwrap_or(0),
            ),
            device_free: ByteSize(info.free),
            device_total: ByteSize(info.total),
            cause: last,
        };
        tracing::warn!(error = %err, "allocation failed");
        Err(err)
    }

    /// The device was under the headroom at the last sample and a free just made idle memory
    /// that could go back (a cached block, an emptied slab): give it back now.
    #[cold]
    pub(super) fn return_idle_under_headroom(st: &mut State, dev: &dyn Device) {
        if st.strategies.iter().map(Strategy::releasable_bytes).sum::<u64>() == 0 {
            return;
        }
        st.resample(dev);
        st.refresh();
    }
}
