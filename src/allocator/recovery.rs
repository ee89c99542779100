//! The allocator's cold paths: out-of-memory recovery (release idle memory and retry, then
//! memory already held, then an exact-size driver allocation), placement under memory pressure,
//! and the error that finally reaches the caller.

use crate::device::{Device, MemInfo};
use crate::error::{AllocError, DeviceError};
use crate::size::ByteSize;
use crate::strategy::{Grant, Strategy, StreamId};

use super::{Shared, State};

impl Shared {
    /// Slow path: release idle memory and retry on out-of-memory, else build the error.
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
        let mut last = err;
        if self.release_on_oom {
            // Retry even when nothing was idle: the refusal may have been transient (another
            // tenant freed memory meanwhile, or an injected fault). One failed call at most.
            let released = st.release_idle(&self.device);
            {
                match st.strategies[si].allocate(&self.device, aligned, stream) {
                    Ok(g) => {
                        st.stats.oom_recoveries += 1;
                        tracing::info!(
                            requested = bytes,
                            released,
                            "out of memory: released idle memory and retried"
                        );
                        return Ok((g, si));
                    }
                    Err(e) if e.is_out_of_memory() => last = e,
                    Err(e) => {
                        st.stats.failed_allocs += 1;
                        return Err(AllocError::Device(e));
                    }
                }
            }
            if let Some(found) = Self::allocate_fallback(st, si, aligned, stream, &self.device) {
                st.stats.oom_recoveries += 1;
                tracing::info!(requested = bytes, "out of memory: served by a fallback strategy");
                return Ok(found);
            }
        }
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
            source: last,
        };
        tracing::warn!(error = %err, "allocation failed");
        Err(err)
    }

    /// Under memory pressure: fill holes in slabs first (no new memory), then a cached block of
    /// the size, then an exact-size driver allocation, so the footprint stays near passthrough's.
    #[cold]
    pub(super) fn allocate_compact(
        st: &mut State,
        routed: usize,
        aligned: u64,
        stream: StreamId,
        dev: &dyn Device,
    ) -> Result<(Grant, usize), DeviceError> {
        if let Some(found) = Self::reuse_without_driver(st, aligned, stream, dev, true) {
            return Ok(found);
        }
        let i = st.passthrough_at.unwrap_or(routed);
        st.strategies[i].allocate(dev, aligned, stream).map(|g| (g, i))
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

    /// Memory the allocator already holds that fits the request, in any strategy: a hole in a
    /// slab (best fit) or a waiting cached block of its size. No driver call.
    #[cold]
    fn reuse_without_driver(
        st: &mut State,
        aligned: u64,
        stream: StreamId,
        dev: &dyn Device,
        strict: bool,
    ) -> Option<(Grant, usize)> {
        st.strategies.iter_mut().enumerate().find_map(|(i, s)| {
            let hit = match s {
                Strategy::Suballoc(sub) => sub.allocate_existing(dev, aligned, stream, strict),
                Strategy::Caching(c) => c.allocate_cached(dev, aligned, stream),
                Strategy::Passthrough(_) => None,
            };
            hit.map(|g| (g, i))
        })
    }

    /// Last resorts after out-of-memory: memory already held that fits (no driver call), then an
    /// exact-size driver allocation (a rounded cache block may not fit where the request does),
    /// then a block spliced from the free ends of held slab pages.
    #[cold]
    fn allocate_fallback(
        st: &mut State,
        routed: usize,
        aligned: u64,
        stream: StreamId,
        dev: &dyn Device,
    ) -> Option<(Grant, usize)> {
        if let Some(found) = Self::reuse_without_driver(st, aligned, stream, dev, false) {
            return Some(found);
        }
        if let Some(i) = st.passthrough_at
            && i != routed
            && let Ok(g) = st.strategies[i].allocate(dev, aligned, stream)
        {
            return Some((g, i));
        }
        // Less new memory than the driver's own allocation would take: a block spliced from the
        // free ends of held pages and fresh pages.
        st.strategies.iter_mut().enumerate().find_map(|(i, s)| match s {
            Strategy::Suballoc(sub) => sub.allocate_spliced(dev, aligned, stream).map(|g| (g, i)),
            _ => None,
        })
    }
}
