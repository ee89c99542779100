//! Private pools: the memory of a CUDA graph capture (PyTorch's `beginAllocateToPool`,
//! `endAllocateToPool`, `releasePool`) or of a `torch.cuda.MemPool`.
//!
//! Between [`Allocator::begin_pool`] and [`Allocator::end_pool`], a request on a stream the
//! pool's filter accepts is served from the pool's own memory (a caching strategy that keeps
//! everything): a block of a pool is never handed out outside it, and memory of the rest of the
//! allocator never inside it. A pool's memory goes back to the device only once
//! [`Allocator::release_pool`] was called and its last block is freed.
//!
//! While any pool is being allocated to (the window), the allocator must not break a capture
//! that may be under way: it gives nothing back to the driver (a driver free synchronizes the
//! device, an unmap waits for it), waits on no stream and runs no policy tick. Blocks from
//! outside the pools freed in the window are held, and go back to their strategies when the
//! last pool's window ends; a request that would need memory back fails with
//! [`AllocError::OutOfMemoryInPoolWindow`], which says so. Stream queries on a capturing
//! stream are the device's to avoid (CUDA: `cuStreamIsCapturing` first).

use crate::device::{Device, DevicePtr};
use crate::error::{AllocError, DeviceError};
use crate::size::ByteSize;
use crate::strategy::{Caching, CachingConfig, Grant, Strategy, StreamId};

use super::{Live, Shared, State};

/// A pool's id: PyTorch's `MempoolId_t` (a pair of 64-bit integers).
pub type PoolId = (u64, u64);

/// Which streams allocate to a pool while it is being allocated to (PyTorch: the streams
/// being captured into the graph). Called under the allocator's lock: it must not call the
/// allocator.
pub type StreamFilter = Box<dyn Fn(StreamId) -> bool + Send>;

/// One private pool.
#[derive(Debug)]
struct Pool {
    id: PoolId,
    /// Its memory: cached blocks kept until the pool is released.
    memory: Strategy,
    /// Its blocks live now.
    live: u64,
    /// `release_pool` was called: its memory goes back once no block of it is live.
    released: bool,
}

/// The allocator's private pools. Slot `i` is `Live::pool == i + 1` (0: no pool).
#[derive(Default)]
pub(super) struct Pools {
    slots: Vec<Option<Pool>>,
    /// Pools being allocated to, oldest first, with their filters.
    active: Vec<(usize, PoolId, StreamFilter)>,
    /// Blocks from outside the pools freed during the window.
    held: Vec<(DevicePtr, Live)>,
}

impl std::fmt::Debug for Pools {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pools")
            .field("slots", &self.slots)
            .field("active", &self.active.iter().map(|a| a.1).collect::<Vec<_>>())
            .field("held", &self.held.len())
            .finish()
    }
}

impl Pools {
    /// Whether a pool is being allocated to. Cost: one length load.
    #[inline(always)]
    pub(super) fn in_window(&self) -> bool {
        !self.active.is_empty()
    }

    /// The slot of the newest pool being allocated to whose filter accepts `stream`.
    pub(super) fn route(&self, stream: StreamId) -> Option<usize> {
        self.active.iter().rev().find(|a| (a.2)(stream)).map(|a| a.0)
    }

    /// (reserved, idle) bytes of every pool.
    pub(super) fn held_bytes(&self) -> (u64, u64) {
        self.slots
            .iter()
            .flatten()
            .map(|p| p.memory.held_bytes())
            .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
    }

    /// The ids of the pools being allocated to, for messages.
    fn active_ids(&self) -> String {
        let ids: Vec<String> = self.active.iter().map(|a| format!("({}, {})", a.1.0, a.1.1)).collect();
        ids.join(", ")
    }

    fn slot_of(&self, id: PoolId) -> Option<usize> {
        self.slots.iter().position(|p| p.as_ref().is_some_and(|p| p.id == id))
    }

    /// Closes every window (the allocator is dropped); the blocks held meanwhile.
    pub(super) fn close_window(&mut self) -> Vec<(DevicePtr, Live)> {
        self.active.clear();
        std::mem::take(&mut self.held)
    }

    /// Memory streams freed on reach every stream of the pools too (outside the window).
    pub(super) fn synchronize_stream(&mut self, stream: StreamId) {
        for p in self.slots.iter_mut().flatten() {
            p.memory.synchronize_stream(stream);
        }
    }
}

impl State {
    /// [`Allocator::begin_pool`](super::Allocator::begin_pool).
    #[cold]
    pub(super) fn begin_pool(&mut self, id: PoolId, filter: StreamFilter) {
        let slot = match self.pools.slot_of(id) {
            Some(s) => {
                // Begun again (PyTorch shares a pool between graphs): it is in use again.
                if let Some(p) = self.pools.slots[s].as_mut() {
                    p.released = false;
                }
                s
            }
            None => {
                let pool = Pool {
                    id,
                    memory: Strategy::Caching(Caching::new(CachingConfig {
                        max_idle_bytes: None,
                        rounding: Default::default(),
                    })),
                    live: 0,
                    released: false,
                };
                match self.pools.slots.iter().position(Option::is_none) {
                    Some(free) => {
                        self.pools.slots[free] = Some(pool);
                        free
                    }
                    None => {
                        self.pools.slots.push(Some(pool));
                        self.pools.slots.len() - 1
                    }
                }
            }
        };
        self.pools.active.push((slot, id, filter));
        self.freeze(true);
    }

    /// [`Allocator::end_pool`](super::Allocator::end_pool): the pool's latest window ends; when
    /// it was the last one, blocks held meanwhile go back and released pools with nothing live
    /// give their memory back.
    #[cold]
    pub(super) fn end_pool(&mut self, dev: &dyn Device, id: PoolId) -> Result<(), AllocError> {
        let Some(at) = self.pools.active.iter().rposition(|a| a.1 == id) else {
            return Err(AllocError::UnknownPool {
                pool: id,
                call: "end_pool",
            });
        };
        drop(self.pools.active.remove(at));
        if !self.pools.in_window() {
            self.freeze(false);
            for (ptr, live) in std::mem::take(&mut self.pools.held) {
                Shared::release_block(self, dev, ptr, live);
            }
            for slot in 0..self.pools.slots.len() {
                self.drop_pool_if_done(dev, slot);
            }
            self.refresh();
        }
        Ok(())
    }

    /// [`Allocator::release_pool`](super::Allocator::release_pool).
    #[cold]
    pub(super) fn release_pool(&mut self, dev: &dyn Device, id: PoolId) -> Result<(), AllocError> {
        let Some(slot) = self.pools.slot_of(id) else {
            return Err(AllocError::UnknownPool {
                pool: id,
                call: "release_pool",
            });
        };
        if let Some(p) = self.pools.slots[slot].as_mut() {
            p.released = true;
        }
        self.drop_pool_if_done(dev, slot);
        self.refresh();
        Ok(())
    }

    /// Gives a released pool's memory back once none of it is live and no window is open.
    fn drop_pool_if_done(&mut self, dev: &dyn Device, slot: usize) {
        let done = self.pools.slots[slot]
            .as_ref()
            .is_some_and(|p| p.released && p.live == 0)
            && !self.pools.in_window();
        if done {
            if let Some(mut p) = self.pools.slots[slot].take() {
                p.memory.release_idle(dev);
                debug_assert_eq!(p.memory.held_bytes().0, 0, "a released pool keeps nothing");
            }
        }
    }

    /// Every pool's memory back (the allocator is dropped; its blocks were freed first).
    pub(super) fn drop_pools(&mut self, dev: &dyn Device) {
        self.pools.active.clear();
        for mut p in self.pools.slots.iter_mut().filter_map(Option::take) {
            p.memory.release_idle(dev);
        }
    }
}

impl Shared {
    /// A request routed to pool `slot` (the window is open and its filter took the stream).
    #[cold]
    pub(super) fn allocate_in_pool(
        &self,
        st: &mut State,
        slot: usize,
        bucket: usize,
        aligned: u64,
        bytes: u64,
        stream: StreamId,
    ) -> Result<DevicePtr, AllocError> {
        let pool = st.pools.slots[slot].as_mut().expect("an active pool has a slot");
        let grant: Grant = match pool.memory.allocate(&self.device, aligned, stream) {
            Ok(g) => g,
            Err(e) => return Err(self.fail_in_window(st, bytes, e)),
        };
        pool.live += 1;
        Self::record_live(st, grant, 0, bucket, bytes, stream, slot as u16 + 1);
        st.refresh();
        Ok(grant.ptr)
    }

    /// A request that failed while a pool is being allocated to: nothing is given back and no
    /// stream waited on, since either could break a capture under way.
    #[cold]
    pub(super) fn fail_in_window(&self, st: &mut State, bytes: u64, cause: DeviceError) -> AllocError {
        st.stats.failed_allocs += 1;
        if !cause.is_out_of_memory() {
            return AllocError::Device(cause);
        }
        st.refresh();
        let free = self.device.mem_info().map(|m| m.free).unwrap_or(0);
        let err = AllocError::OutOfMemoryInPoolWindow {
            requested: ByteSize(bytes),
            pools: st.pools.active_ids(),
            reserved: ByteSize(st.stats.reserved_bytes.current),
            device_free: ByteSize(free),
            cause,
        };
        tracing::warn!(error = %err, "allocation failed in a pool window");
        err
    }

    /// The free of a pool's block, or of any block while the window is open (held until it
    /// closes). Called by `release_block`, the one place blocks go back.
    #[cold]
    pub(super) fn release_in_pools(st: &mut State, dev: &dyn Device, ptr: DevicePtr, live: Live) {
        if live.pool == 0 {
            // Freed in the window: its strategy may give memory back, which must wait.
            st.pools.held.push((ptr, live));
            return;
        }
        let slot = live.pool as usize - 1;
        let op = st.op;
        let pool = st.pools.slots[slot].as_mut().expect("a live pool block's pool is kept");
        pool.memory.deallocate(dev, ptr, live.block, live.meta, live.stream, op);
        pool.live -= 1;
        Shared::count_freed(st, &live);
        st.drop_pool_if_done(dev, slot);
        st.refresh();
    }
}
