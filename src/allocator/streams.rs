//! Stream-ordered reuse. A block freed on stream A is reused at once by A; other streams may use
//! it once A's work up to the free has completed. The allocator remembers, for each stream it
//! freed memory on, the operation count of its last free; the device says whether the stream's
//! work up to that free is done ([`Device::stream_done`], never a wait) or waits for it
//! ([`Device::stream_wait`]). When frees move on to another stream, the device marks the
//! stream left ([`Device::stream_checkpoint`]: on CUDA an event recorded on it), so that a
//! stream that never goes idle still gives back what it freed, and a wait lasts until the
//! free's point rather than until all work queued since; without a checkpoint that covers the
//! free, the whole stream is asked (`cuStreamQuery`, `cuStreamSynchronize`). A done stream's
//! memory moves to the shared lists and the stream is forgotten, so per-stream state stays
//! bounded by the streams with work in flight.
//!
//! When: on the out-of-memory rung, for every stream but the requester's (queried first, then
//! waited on, as PyTorch's `synchronize_and_free_events`), and when a free finds many streams
//! remembered (queried; amortized O(1) a free). A single-stream program never pays for it.
//! Reclaiming at the engine's ticks as well was measured and dropped: on every trace with 10%
//! or 50% of its blocks moved to a second stream (examples/streams_eval.rs), it made 0.6-4.7%
//! more driver allocations and one more case with a failure at passthrough's smallest
//! capacity. So was reclaiming when another stream asks (a request whose strategy would
//! otherwise call the driver, while other streams hold freed memory): 5.2% and 3.3% fewer
//! driver allocations on those variants (about half as many on the bundled training and serving
//! workloads), but on the robustness grid (examples/robustness.rs) 13 runs failed at
//! passthrough's exact minimum instead of 8. The suballocator's per-stream free lists keep the
//! streams' block lifetimes apart, and mixing them strands more slab pages when there is no
//! slack at all; reclaiming on cache misses only gave 9 such runs and 0.2% more driver calls
//! over the grid. Both were dropped: a failed allocation weighs more than driver calls.

use crate::device::{Device, DevicePtr};
use crate::error::AllocError;
use crate::hash::FastMap;
use crate::strategy::StreamId;

use super::{Live, Shared, State};

/// A freed block that other streams used ([`crate::Allocator::record_stream`]): it goes back to
/// its strategy once their work up to the free is done.
#[derive(Debug)]
pub(super) struct Deferred {
    pub ptr: DevicePtr,
    pub live: Live,
    /// Streams whose work is not known done yet.
    waits: Vec<StreamId>,
    /// The operation count at the free.
    freed_at: u64,
}

/// The streams with memory freed on them since their work was last known complete.
#[derive(Debug, Default)]
pub(super) struct FreedOn {
    /// The stream of the last free and that free's operation count (0: none since it was
    /// reclaimed): a one-entry memo, so that a free on the same stream as the last costs a
    /// compare and a store.
    last: (StreamId, u64),
    /// Every other stream, with the operation count of its last free.
    others: FastMap<StreamId, u64>,
    /// Streams remembered past which a switch asks for a reclaim (0: [`CROWDED`]); after
    /// one, twice what remains, so the queries stay amortized O(1) per free.
    crowded_at: usize,
}

/// Streams remembered before the first reclaim that a free itself asks for.
const CROWDED: usize = 64;

impl FreedOn {
    /// Records a free on `stream` at operation `op` when `stream` is the last free's: a compare
    /// and a store. False, recording nothing, for another stream: the caller then takes
    /// [`State::switch_stream`] (cold).
    #[inline]
    pub fn note_same(&mut self, stream: StreamId, op: u64) -> bool {
        let same = stream == self.last.0;
        if same {
            self.last.1 = op;
        }
        same
    }

    /// Records a free on `stream` at `op`, another stream than the last free's. Returns the
    /// stream left with its last free (None when it freed nothing since it was reclaimed), and
    /// whether so many streams are remembered that the caller should reclaim.
    #[cold]
    fn switch(&mut self, stream: StreamId, op: u64) -> (Option<(StreamId, u64)>, bool) {
        let (old, at) = self.last;
        if at > 0 {
            self.others.insert(old, at);
        }
        self.others.remove(&stream);
        self.last = (stream, op);
        let left = (at > 0).then_some((old, at));
        (left, self.others.len() >= self.crowded_at.max(CROWDED))
    }

    /// After a reclaim: the next one when twice as many streams as remain are remembered.
    fn reclaimed(&mut self) {
        self.crowded_at = 2 * self.len();
    }

    /// The streams and the operation counts of their last frees.
    fn entries(&self) -> Vec<(StreamId, u64)> {
        let mut v: Vec<(StreamId, u64)> = self.others.iter().map(|(&s, &at)| (s, at)).collect();
        if self.last.1 > 0 {
            v.push(self.last);
        }
        v.sort_unstable();
        v
    }

    /// The operation count of `stream`'s last free, if it is remembered.
    fn last_free(&self, stream: StreamId) -> Option<u64> {
        if self.last.0 == stream && self.last.1 > 0 {
            return Some(self.last.1);
        }
        self.others.get(&stream).copied()
    }

    /// Forgets `stream` (its work is done).
    pub fn forget(&mut self, stream: StreamId) {
        if self.last.0 == stream {
            self.last.1 = 0;
        }
        self.others.remove(&stream);
    }

    /// Streams remembered.
    pub fn len(&self) -> usize {
        self.others.len() + usize::from(self.last.1 > 0)
    }
}

impl State {
    /// A free on `stream` at `op` when the last free was on another stream: the stream left is
    /// checkpointed on the device ([`Device::stream_checkpoint`]), and when many streams are
    /// remembered, those whose work is done are reclaimed. Cold: a change of stream.
    #[cold]
    pub(super) fn switch_stream(&mut self, dev: &dyn Device, stream: StreamId, op: u64) {
        let (left, crowded) = self.freed_on.switch(stream, op);
        if let Some((left, at)) = left {
            dev.stream_checkpoint(left, at);
        }
        if crowded {
            // Not the stream freeing now: reclaimed before its free, it would be forgotten
            // before its free lists exist, and they would never be given up.
            self.reclaim_streams(dev, Some(stream), false);
        }
    }

    /// Makes the memory freed on every stream whose work is done (all but `except`) usable by
    /// every stream; with `wait`, waits for the others' work first. Returns how many streams
    /// were reclaimed. Slow path: a device query per stream remembered.
    #[cold]
    pub(super) fn reclaim_streams(&mut self, dev: &dyn Device, except: Option<StreamId>, wait: bool) -> usize {
        let mut reclaimed = 0;
        for (stream, _) in self.freed_on.entries() {
            if Some(stream) == except {
                continue;
            }
            // Asked afresh, never from the list taken above: reclaiming an earlier stream can
            // release deferred blocks into this one's free lists (a block freed here and
            // recorded on that stream), which moves its last free past the one listed. A
            // completion answered for the older free would hand those blocks out while the
            // work queued before their free still runs.
            let Some(freed_at) = self.freed_on.last_free(stream) else {
                continue; // forgotten meanwhile: its memory already serves every stream
            };
            let done = if dev.stream_done(stream, freed_at, self.op) {
                self.stats.stream_reclaims += 1;
                true
            } else if wait {
                self.stats.stream_waits += 1;
                match dev.stream_wait(stream, freed_at) {
                    Ok(()) => true,
                    Err(e) => {
                        tracing::warn!(stream, error = %e, "cannot wait for the stream; its memory stays with it");
                        false
                    }
                }
            } else {
                false
            };
            if done {
                self.synchronize_strategies(dev, stream);
                reclaimed += 1;
            }
        }
        self.freed_on.reclaimed();
        if !self.deferred.is_empty() {
            reclaimed += self.release_deferred(dev, wait);
        }
        reclaimed
    }

    /// The stream's work is done: its freed memory serves every stream, it is forgotten, and
    /// freed blocks that waited only for it go back to their strategies.
    pub(super) fn synchronize_strategies(&mut self, dev: &dyn Device, stream: StreamId) {
        for s in &mut self.strategies {
            s.synchronize_stream(stream);
        }
        self.pools.synchronize_stream(stream);
        self.freed_on.forget(stream);
        if !self.deferred.is_empty() {
            for d in &mut self.deferred {
                d.waits.retain(|&s| s != stream);
            }
            self.release_ready(dev);
        }
    }

    /// [`crate::Allocator::record_stream`].
    #[cold]
    pub(super) fn record_stream(&mut self, ptr: DevicePtr, stream: StreamId) -> Result<(), AllocError> {
        let Some(mut live) = self.live.get(ptr).copied() else {
            return Err(AllocError::UnknownPointer { ptr });
        };
        if stream == live.stream {
            return Ok(()); // its own stream orders its reuse already
        }
        // A set: O(1) a call however many streams are recorded on the block (a list scanned
        // for duplicates made 64,000 streams on one pointer take half a second).
        self.recorded.entry(ptr).or_default().insert(stream);
        live.recorded = true;
        self.live.insert(ptr, live);
        Ok(())
    }

    /// A block with recorded streams was freed: it waits for them.
    #[cold]
    pub(super) fn defer(&mut self, dev: &dyn Device, ptr: DevicePtr, live: Live) {
        let mut waits: Vec<StreamId> = self.recorded.remove(&ptr).unwrap_or_default().into_iter().collect();
        waits.sort_unstable(); // a fixed order: checkpoints and queries do not vary by hash order
        for &s in &waits {
            dev.stream_checkpoint(s, self.op);
        }
        self.deferred.push_back(Deferred {
            ptr,
            live,
            waits,
            freed_at: self.op,
        });
    }

    /// Releases the freed blocks whose recorded streams' work is done (queried; with `wait`,
    /// waited on). Returns how many went back.
    #[cold]
    pub(super) fn release_deferred(&mut self, dev: &dyn Device, wait: bool) -> usize {
        let now = self.op;
        let mut waited = 0;
        for d in &mut self.deferred {
            d.waits.retain(|&s| {
                if dev.stream_done(s, d.freed_at, now) {
                    return false;
                }
                if wait {
                    waited += 1;
                    return dev.stream_wait(s, d.freed_at).is_err();
                }
                true
            });
        }
        self.stats.stream_waits += waited;
        self.release_ready(dev)
    }

    /// Gives the deferred blocks that wait for nothing back to their strategies.
    fn release_ready(&mut self, dev: &dyn Device) -> usize {
        let mut released = 0;
        let mut i = 0;
        while i < self.deferred.len() {
            if self.deferred[i].waits.is_empty() {
                let d = self.deferred.remove(i).expect("in range");
                Shared::release_block(self, dev, d.ptr, d.live);
                released += 1;
            } else {
                i += 1;
            }
        }
        if released > 0 {
            self.refresh();
        }
        released
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::sync::Mutex;

    use crate::SimDevice;
    use crate::device::{DeviceStats, MemInfo};
    use crate::error::DeviceError;

    /// A simulated device that records the checkpoints it is given.
    #[derive(Debug)]
    struct Checkpoints {
        sim: SimDevice,
        seen: Mutex<Vec<(StreamId, u64)>>,
    }

    impl Device for Checkpoints {
        fn allocate(&self, bytes: u64) -> Result<DevicePtr, DeviceError> {
            self.sim.allocate(bytes)
        }
        fn free(&self, ptr: DevicePtr) -> Result<(), DeviceError> {
            self.sim.free(ptr)
        }
        fn mem_info(&self) -> Result<MemInfo, DeviceError> {
            self.sim.mem_info()
        }
        fn granularity(&self) -> u64 {
            self.sim.granularity()
        }
        fn stream_checkpoint(&self, stream: StreamId, op: u64) {
            self.seen.lock().unwrap().push((stream, op));
        }
        fn stats(&self) -> DeviceStats {
            self.sim.stats()
        }
        fn name(&self) -> String {
            "checkpoints".into()
        }
    }

    fn checkpoints() -> Checkpoints {
        Checkpoints {
            sim: SimDevice::new(1 << 20),
            seen: Mutex::new(Vec::new()),
        }
    }

    /// A free on `stream` at `op` as the free path records it; true when a reclaim is asked.
    fn note(f: &mut FreedOn, stream: StreamId, op: u64) -> bool {
        !f.note_same(stream, op) && f.switch(stream, op).1
    }

    /// A change of stream on the free path checkpoints the stream left at its last free
    /// (through the allocator, each allocation and free an operation); frees on the same
    /// stream, and the first free ever, checkpoint nothing.
    #[test]
    fn a_switch_checkpoints_the_stream_left_at_its_last_free() {
        use std::sync::Arc;

        use crate::Allocator;
        use crate::strategy::StrategyKind;
        let dev = Arc::new(checkpoints());
        let alloc = Allocator::with_strategy(dev.clone(), StrategyKind::Caching);
        for stream in [0, 0, 5, 5, 5, 0, 9] {
            let p = alloc.allocate_raw(4096, stream).unwrap();
            alloc.deallocate(p, stream).unwrap();
        }
        assert_eq!(*dev.seen.lock().unwrap(), [(0, 4), (5, 10), (0, 12)]);
    }

    #[test]
    fn the_memo_keeps_the_last_stream_and_the_map_the_others() {
        let mut f = FreedOn::default();
        assert!(!note(&mut f, 0, 1));
        note(&mut f, 0, 2);
        assert!(f.others.is_empty());
        assert_eq!(f.entries(), [(0, 2)]);
        note(&mut f, 7, 3);
        assert!(!f.others.is_empty());
        note(&mut f, 0, 4);
        assert_eq!(f.entries(), [(0, 4), (7, 3)]);
        f.forget(0);
        assert_eq!((f.entries(), f.len()), (vec![(7, 3)], 1));
        note(&mut f, 7, 5);
        assert_eq!(f.entries(), [(7, 5)]);
        assert!(f.others.is_empty(), "the memo holds the only stream");
    }

    #[test]
    fn a_switch_asks_for_a_reclaim_when_crowded_and_the_limit_doubles() {
        let mut f = FreedOn::default();
        let asks: Vec<u64> = (1..=CROWDED as u64 + 1).filter(|&s| note(&mut f, s, s)).collect();
        assert_eq!(asks, [CROWDED as u64 + 1], "at {CROWDED} others");
        // A reclaim that freed nothing (65 remembered): the next ask when the others reach 130.
        f.reclaimed();
        let next = (CROWDED as u64 + 2..10 * CROWDED as u64)
            .find(|&s| note(&mut f, s, s))
            .unwrap();
        assert_eq!(next as usize - 1, 2 * (CROWDED + 1));
    }

    /// Per-stream state inside the strategies stays bounded: after 10,000 short-lived streams,
    /// none synchronized by the caller, the suballocator holds few stream list sets and the
    /// cache few bins. A reclaim that included the stream freeing at that moment left 208 list
    /// sets here: that stream was forgotten before its lists existed.
    #[test]
    fn strategies_forget_streams_that_hold_nothing() {
        use std::sync::Arc;

        use crate::strategy::{Strategy, StrategyKind};
        use crate::{Allocator, SimDevice};
        for kind in [StrategyKind::Suballoc, StrategyKind::Caching] {
            let alloc = Allocator::with_strategy(Arc::new(SimDevice::new(1 << 30)), kind);
            for stream in 1..=10_000u64 {
                let p = alloc.allocate_raw(4096 * (1 + stream % 3), stream).unwrap();
                alloc.deallocate(p, stream).unwrap();
            }
            let st = alloc.shared.state.lock();
            let held = match &st.strategies[0] {
                Strategy::Suballoc(sub) => sub.stream_list_sets(),
                Strategy::Caching(c) => c.bins_in_use(),
                Strategy::Passthrough(_) => unreachable!("not built"),
            };
            assert!(held <= 2 * CROWDED + 8, "{kind:?}: {held} per-stream sets held");
        }
    }
}
