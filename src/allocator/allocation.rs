//! What outlives an allocator's last call: [`Allocation`], which frees itself when dropped,
//! and the allocator's own drop, which returns every byte to the device.

use std::sync::Arc;

use crate::device::DevicePtr;
use crate::strategy::StreamId;

use super::{Live, Shared};

impl Drop for Shared {
    fn drop(&mut self) {
        let files = std::mem::take(self.exit.get_mut());
        self.write_exit_files(files);
        let st = self.state.get_mut();
        let held = st.pools.close_window();
        st.freeze(false);
        let leaked: Vec<(DevicePtr, Live)> = st.live.drain();
        if !leaked.is_empty() {
            let bytes: u64 = leaked.iter().map(|(_, l)| l.requested).sum();
            tracing::warn!(
                blocks = leaked.len(),
                bytes,
                "allocator dropped with raw allocations live; freeing them"
            );
        }
        for (ptr, live) in leaked {
            Self::release_block(st, &self.device, ptr, live);
        }
        // Freed blocks still waiting for other streams: the allocator is going away, so their
        // streams' work is the caller's to have finished.
        for (ptr, live) in std::mem::take(&mut st.deferred)
            .into_iter()
            .map(|d| (d.ptr, d.live))
            .chain(held)
        {
            Self::release_block(st, &self.device, ptr, live);
        }
        st.drop_pools(&self.device);
        st.release_idle(&self.device);
        debug_assert_eq!(st.stats.reserved_bytes.current, 0, "every byte returned on drop");
    }
}

/// An allocation that frees itself when dropped. It keeps its allocator alive.
#[derive(Debug)]
pub struct Allocation {
    ptr: DevicePtr,
    bytes: u64,
    stream: StreamId,
    /// False after `into_raw`: the caller frees the pointer.
    owned: bool,
    shared: Arc<Shared>,
}

impl Allocation {
    /// A live block of `shared`'s, freed when the handle drops.
    pub(super) fn new(ptr: DevicePtr, bytes: u64, stream: StreamId, shared: Arc<Shared>) -> Self {
        Allocation {
            ptr,
            bytes,
            stream,
            owned: true,
            shared,
        }
    }

    /// The device address (256-byte aligned).
    pub fn ptr(&self) -> DevicePtr {
        self.ptr
    }
    /// The bytes asked for (the block may be larger).
    pub fn len(&self) -> u64 {
        self.bytes
    }
    /// Always false: zero-size allocations are refused.
    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }
    /// The stream the block was allocated on (and must be freed on).
    pub fn stream(&self) -> StreamId {
        self.stream
    }
    /// Gives up ownership: the caller must free the pointer with
    /// [`Allocator::deallocate`](super::Allocator::deallocate).
    pub fn into_raw(mut self) -> DevicePtr {
        self.owned = false;
        self.ptr
    }
}

impl Drop for Allocation {
    fn drop(&mut self) {
        if !self.owned {
            return;
        }
        let r = self.shared.deallocate(self.ptr, self.stream);
        debug_assert!(r.is_ok(), "an Allocation's pointer is always live: {r:?}");
    }
}
