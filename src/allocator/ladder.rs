//! Where a request goes: the only code that chooses, out-of-memory included. The route table
//! (set by the engine's controller) names each size class's strategy; the ladder says what is
//! tried, in order, in each mode:
//!
//! | mode | steps |
//! |---|---|
//! | roomy (the fast path) | [`Step::Routed`]: a cache hit, else (outside tight mode) a slab hole that pins nothing new, else a new cached block; a slab fit within the strand limit, else an exact-size cached block; or a driver allocation |
//! | pressure (free memory under the low watermark) | [`Step::HeldHole`] strict, then [`Step::Driver`] (the routed strategy when there is no passthrough) |
//! | after out-of-memory, `oom.release_and_retry` | [`Step::ReclaimStreams`], [`Step::ReleaseAndRetry`], [`Step::HeldHole`] loose, [`Step::Driver`] when not routed, [`Step::Splice`], [`Step::SplitHandles`] |
//! | after out-of-memory, no release | none: the error goes to the caller |
//!
//! [`steps`] is that table as data (unit-tested); [`Ladder`] walks it. The allocator picks the
//! rung from its mode ([`routed`] or [`under_pressure`]); the roomy rung's one step is code, not
//! a walk: it is the hot path. The cache-hit fast path in `Shared::allocate` is the
//! first part of [`Step::Routed`], inlined there for its cost.

use crate::device::Device;
use crate::error::DeviceError;
use crate::strategy::{Grant, Strategy, StreamId};

use super::State;

/// One way to serve a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Step {
    /// The routed strategy. A slab placement runs under the strand guard: one that would pin
    /// memory the driver would not consume for the block (say, a small block opening a fresh
    /// 2 MiB page) while the slabs already strand more than their budget gets an exact-size
    /// cached block instead, so what the allocator cannot give back stays near passthrough's
    /// footprint.
    Routed,
    /// Memory already held that fits, in any strategy, with no driver call: a hole in a slab
    /// (best fit) or a waiting cached block of the size. `strict`: only a hole that pins no more
    /// than the driver would consume for the block (under pressure, to keep the footprint near
    /// passthrough's).
    HeldHole { strict: bool },
    /// An exact-size driver allocation through the passthrough strategy, or the routed one
    /// where there is no passthrough (a rounded cache block or a slab may not fit where the
    /// request does). After out-of-memory, only through a strategy other than the routed one,
    /// which has just failed.
    Driver,
    /// Make memory freed on other streams usable by the requester's: every stream whose work
    /// is done, then, waiting for their work, the rest; retry the routed strategy when any was
    /// reclaimed.
    ReclaimStreams,
    /// Release idle memory (cached blocks, least recently used first, then empty slabs and
    /// unused pages) as far as the request's footprint and retry the routed strategy; then
    /// every idle byte and retry, even when nothing was idle: the refusal may have been
    /// transient. The idle memory the request does not need is what the next requests of the
    /// cycle ask for (gpu-small-fwd-fp32 at 2x peak live: 3.35 ms a pass with the whole release
    /// on every step's out-of-memory, 0.01 with this).
    ReleaseAndRetry,
    /// A block spliced from the free ends of held slab pages and fresh pages: less new memory
    /// than the driver's own allocation would take.
    Splice,
    /// Split slab handles of more than a page that live blocks touch only in part: their live
    /// pages copied into pages of their own at the same addresses, the rest given back
    /// ([`Suballoc::split_held_handles`](crate::strategy::Suballoc::split_held_handles)), as
    /// far as the request's footprint, and where that falls short, handles with free bytes
    /// inside split into pages so that a splice finds those bytes at page ends; then the routed
    /// strategy, the driver through another and a splice, again. Cold, and dear: it waits for
    /// all queued work and copies live pages.
    SplitHandles,
}

/// Why the ladder is being walked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Rung {
    /// A request, with free memory above the low watermark.
    Roomy,
    /// A request, with free memory under the low watermark.
    Pressure,
    /// The first steps failed with out-of-memory.
    OutOfMemory { release_and_retry: bool },
}

/// The steps tried, in order, on `rung`. Pure.
pub(super) fn steps(rung: Rung) -> &'static [Step] {
    match rung {
        Rung::Roomy => &[Step::Routed],
        Rung::Pressure => &[Step::HeldHole { strict: true }, Step::Driver],
        Rung::OutOfMemory {
            release_and_retry: true,
        } => &[
            Step::ReclaimStreams,
            Step::ReleaseAndRetry,
            Step::HeldHole { strict: false },
            Step::Driver,
            Step::Splice,
            Step::SplitHandles,
        ],
        Rung::OutOfMemory {
            release_and_retry: false,
        } => &[],
    }
}

/// A request on its way down the ladder.
pub(super) struct Ladder<'a> {
    st: &'a mut State,
    dev: &'a dyn Device,
    /// The routed strategy.
    routed: usize,
    aligned: u64,
    stream: StreamId,
}

/// What a step gave: the block and the strategy that granted it.
pub(super) type Served = (Grant, usize);

/// The roomy rung: its one step, [`Step::Routed`], for a strategy other than a cache hit (the
/// hot path, so a free function over the request's parts, kept in registers). Slabs place
/// under the strand guard; the refusal is cold. An error goes on to
/// [`Ladder::after_out_of_memory`] (or to the caller, not being one).
#[inline]
pub(super) fn routed(
    st: &mut State,
    dev: &dyn Device,
    routed: usize,
    aligned: u64,
    stream: StreamId,
) -> Result<Served, DeviceError> {
    debug_assert_eq!(steps(Rung::Roomy), [Step::Routed]);
    let Strategy::Suballoc(sub) = &mut st.strategies[routed] else {
        return st.strategies[routed]
            .allocate(dev, aligned, stream)
            .map(|g| (g, routed));
    };
    match sub.allocate_guarded(dev, aligned, stream)? {
        Some(g) => Ok((g, routed)),
        None => Ladder::new(st, dev, routed, aligned, stream).refused(),
    }
}

/// The rest of [`Step::Routed`] for a cached class after a miss: memory already held serves
/// before the driver is asked for more. A hole in the slabs, its pages mapped, whose placement
/// pins no more than the driver's own allocation of the block would consume (as
/// [`Step::HeldHole`] strict), else a new cached block. Not in tight mode: there small classes are
/// cached precisely so that the slabs' stranded pages drain (filling their holes kept them
/// pinned: 15 / 12 / 35 failing runs on the robustness grid, against 9 / 6 / 14).
///
/// 17 workloads (steady_eval), 1.1x passthrough's minimum: 177 -> 149 ms a pass summed
/// (cpu-gpt2-train 37.8 -> 11.6, cpu-resnet18-train 7.6 -> 0; gpu-medium-ctx1024-infer
/// 174 -> 203, whose cached 256 MiB blocks now land in slabs that the headroom unmaps); 48 ->
/// 28 under vmm-fast.toml; gpu-small-fwd-fp32 at 1.5x 15 -> 0. Cold: a scan of the slabs'
/// free blocks, O(blocks), in place of a driver call.
#[cold]
pub(super) fn cache_miss(
    st: &mut State,
    dev: &dyn Device,
    routed: usize,
    aligned: u64,
    stream: StreamId,
) -> Result<Served, DeviceError> {
    // Held holes of the slabs only, not `Ladder::held_hole`: that one also looks in the cache,
    // which just missed, and calling it here cost the allocate/free pair 4 instructions in
    // code generation (callgrind, 748 against 744).
    if !st.engine.as_deref().is_some_and(|e| e.in_tight()) {
        for (i, s) in st.strategies.iter_mut().enumerate() {
            if let Strategy::Suballoc(sub) = s
                && let Some(g) = sub.allocate_existing(dev, aligned, stream, true, u64::MAX)
            {
                return Ok((g, i));
            }
        }
    }
    match &mut st.strategies[routed] {
        Strategy::Caching(c) => c.allocate_new(dev, aligned, stream),
        other => other.allocate(dev, aligned, stream),
    }
    .map(|g| (g, routed))
}

/// The pressure rung (free memory under the low watermark); an error goes on as in [`routed`].
/// A cold free function, not `Ladder::new(..).under_pressure()` at the call site: building the
/// `Ladder` inline in `Shared::allocate` cost every request 8 instructions (callgrind, pair,
/// suballoc churn and adaptive churn alike).
#[cold]
pub(super) fn under_pressure(
    st: &mut State,
    dev: &dyn Device,
    routed: usize,
    aligned: u64,
    stream: StreamId,
) -> Result<Served, DeviceError> {
    Ladder::new(st, dev, routed, aligned, stream).under_pressure()
}

impl<'a> Ladder<'a> {
    pub fn new(st: &'a mut State, dev: &'a dyn Device, routed: usize, aligned: u64, stream: StreamId) -> Self {
        Ladder {
            st,
            dev,
            routed,
            aligned,
            stream,
        }
    }

    /// The strand guard refused a slab placement: an exact-size cached block instead (or the
    /// slab placement after all, with no caching strategy to fall back on).
    #[cold]
    #[inline(never)]
    fn refused(&mut self) -> Result<Served, DeviceError> {
        let Some(ci) = self.st.caching_at else {
            let si = self.routed;
            return self.st.strategies[si]
                .allocate(self.dev, self.aligned, self.stream)
                .map(|g| (g, si));
        };
        self.st.stats.strand_refusals += 1;
        self.st.strategies[ci]
            .allocate(self.dev, self.aligned, self.stream)
            .map(|g| (g, ci))
    }

    /// The pressure rung ([`steps`]): fill holes first (no new memory), then an exact-size
    /// driver allocation, whose error is the request's.
    fn under_pressure(&mut self) -> Result<Served, DeviceError> {
        for &step in steps(Rung::Pressure) {
            match step {
                Step::HeldHole { strict } => {
                    if let Some(found) = self.held_hole(strict) {
                        return Ok(found);
                    }
                }
                Step::Driver => {
                    let i = self.driver_target();
                    return self.st.strategies[i]
                        .allocate(self.dev, self.aligned, self.stream)
                        .map(|g| (g, i));
                }
                Step::Routed | Step::ReclaimStreams | Step::ReleaseAndRetry | Step::Splice | Step::SplitHandles => {
                    unreachable!("not a pressure step")
                }
            }
        }
        unreachable!("the pressure rung ends with the driver")
    }

    /// The out-of-memory rung ([`steps`]): its steps in order until one serves. `Err` carries
    /// the retry's error: a device error other than out-of-memory ends the walk at once.
    #[cold]
    pub fn after_out_of_memory(&mut self, release_and_retry: bool, err: DeviceError) -> Result<Served, DeviceError> {
        let mut last = err;
        for &step in steps(Rung::OutOfMemory { release_and_retry }) {
            let found = match step {
                Step::ReleaseAndRetry => {
                    // What the request needs first (the rest of the idle memory is what the
                    // next requests of the cycle will ask for), then everything.
                    let need = self.dev.footprint_model().consumed(self.aligned);
                    let mut found = None;
                    for need in [need, u64::MAX] {
                        let released = self.st.release_at_least(self.dev, need);
                        if released == 0 && need != u64::MAX {
                            continue;
                        }
                        let si = self.routed;
                        match self.st.strategies[si].allocate(self.dev, self.aligned, self.stream) {
                            Ok(g) => {
                                tracing::info!(
                                    requested = self.aligned,
                                    released,
                                    "out of memory: released idle memory and retried"
                                );
                                found = Some((g, si));
                                break;
                            }
                            Err(e) if e.is_out_of_memory() => last = e,
                            Err(e) => return Err(e),
                        }
                    }
                    found
                }
                Step::ReclaimStreams => {
                    if self.st.reclaim_streams(self.dev, Some(self.stream), true) == 0 {
                        None
                    } else {
                        let si = self.routed;
                        match self.st.strategies[si].allocate(self.dev, self.aligned, self.stream) {
                            Ok(g) => Some((g, si)),
                            Err(e) if e.is_out_of_memory() => {
                                last = e;
                                None
                            }
                            Err(e) => return Err(e),
                        }
                    }
                }
                Step::HeldHole { strict } => self.held_hole(strict),
                Step::Driver => self.driver_elsewhere(),
                Step::Splice => self.splice(),
                Step::SplitHandles => match self.split_handles() {
                    Ok(found) => found,
                    Err(e) if e.is_out_of_memory() => {
                        last = e;
                        None
                    }
                    Err(e) => return Err(e),
                },
                Step::Routed => unreachable!("not a step after out-of-memory"),
            };
            if let Some(found) = found {
                if step != Step::ReleaseAndRetry {
                    tracing::info!(
                        requested = self.aligned,
                        ?step,
                        "out of memory: served by a fallback step"
                    );
                }
                return Ok(found);
            }
        }
        Err(last)
    }

    /// [`Step::Driver`] after out-of-memory: the routed strategy has just failed, so the
    /// driver only through another one.
    fn driver_elsewhere(&mut self) -> Option<Served> {
        let i = Some(self.driver_target()).filter(|&i| i != self.routed)?;
        let g = self.st.strategies[i]
            .allocate(self.dev, self.aligned, self.stream)
            .ok()?;
        Some((g, i))
    }

    /// Where [`Step::Driver`] goes: the passthrough strategy, else the routed one.
    fn driver_target(&self) -> usize {
        self.st.passthrough_at.unwrap_or(self.routed)
    }

    /// [`Step::HeldHole`]: memory the allocator already holds that fits the request, in any
    /// strategy. No driver call.
    fn held_hole(&mut self, strict: bool) -> Option<Served> {
        let (dev, aligned, stream) = (self.dev, self.aligned, self.stream);
        self.st.strategies.iter_mut().enumerate().find_map(|(i, s)| {
            let hit = match s {
                Strategy::Suballoc(sub) => sub.allocate_existing(dev, aligned, stream, strict, u64::MAX),
                Strategy::Caching(c) => c.allocate_cached(dev, aligned, stream),
                Strategy::Passthrough(_) => None,
            };
            hit.map(|g| (g, i))
        })
    }

    /// [`Step::SplitHandles`]: handles split in every suballocator as far as the request's
    /// footprint, then the routed strategy, the driver through another and a splice; nothing
    /// when no handle was split.
    fn split_handles(&mut self) -> Result<Option<Served>, DeviceError> {
        let need = self.dev.footprint_model().consumed(self.aligned);
        let (mut released, mut changed) = (0, false);
        for s in &mut self.st.strategies {
            if let Strategy::Suballoc(sub) = s
                && released < need
            {
                let split = sub.split_held_handles(self.dev, need - released);
                released += split.released;
                changed |= split.any();
            }
        }
        if !changed {
            return Ok(None);
        }
        self.st.refresh();
        let si = self.routed;
        let routed = match self.st.strategies[si].allocate(self.dev, self.aligned, self.stream) {
            Ok(g) => return Ok(Some((g, si))),
            Err(e) => e,
        };
        match self.driver_elsewhere().or_else(|| self.splice()) {
            Some(found) => Ok(Some(found)),
            None => Err(routed),
        }
    }

    /// [`Step::Splice`], in the first suballocator that can.
    fn splice(&mut self) -> Option<Served> {
        let (dev, aligned, stream) = (self.dev, self.aligned, self.stream);
        self.st.strategies.iter_mut().enumerate().find_map(|(i, s)| match s {
            Strategy::Suballoc(sub) => sub.allocate_spliced(dev, aligned, stream).map(|g| (g, i)),
            _ => None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The table in the module's documentation, row by row.
    #[test]
    fn each_rung_tries_its_steps_in_order() {
        use Step::*;
        let rows: [(&str, Rung, &[Step]); 4] = [
            ("roomy: the routed strategy alone", Rung::Roomy, &[Routed]),
            (
                "pressure: a hole that pins nothing new, then the driver",
                Rung::Pressure,
                &[HeldHole { strict: true }, Driver],
            ),
            (
                "out of memory: other streams' memory, release and retry, any hole, the driver, a splice, split handles",
                Rung::OutOfMemory {
                    release_and_retry: true,
                },
                &[
                    ReclaimStreams,
                    ReleaseAndRetry,
                    HeldHole { strict: false },
                    Driver,
                    Splice,
                    SplitHandles,
                ],
            ),
            (
                "out of memory without release: nothing more",
                Rung::OutOfMemory {
                    release_and_retry: false,
                },
                &[],
            ),
        ];
        for (name, rung, want) in rows {
            assert_eq!(steps(rung), want, "{name}");
        }
    }

    use std::sync::Arc;

    use crate::allocator::{Allocator, AllocatorConfig, StrategyConfig};
    use crate::device::SimDevice;
    use crate::policy::{Policy, SizeOrFraction};
    use crate::size::MIB;

    /// Under pressure a hole in a slab serves before the driver; with no hole, the driver
    /// serves at the request's size (swapping the two steps fails it).
    #[test]
    fn pressure_fills_a_hole_before_calling_the_driver() {
        let mut policy = Policy::default();
        policy.bounds.low_watermark = SizeOrFraction::Fraction(1.0); // always under it
        policy.bounds.headroom = SizeOrFraction::Bytes(0);
        let alloc = Allocator::with_policy(Arc::new(SimDevice::new(256 * MIB)), policy);
        let blocks: Vec<_> = (0..4).map(|_| alloc.allocate(MIB, 0).unwrap()).collect();
        let calls = alloc.stats().driver_allocs;
        drop(blocks);
        let hole = alloc.allocate(MIB, 0).unwrap();
        assert_eq!(alloc.stats().driver_allocs, calls, "the freed slab space served it");
        let big = alloc.allocate(3 * MIB + 256, 0).unwrap();
        assert_eq!(
            alloc.stats().driver_allocs,
            calls + 1,
            "one exact-size driver allocation"
        );
        drop((hole, big));
    }

    /// Out of memory: with release and retry, idle memory goes back and the request is served;
    /// without, the request fails and the idle memory stays.
    #[test]
    fn out_of_memory_releases_and_retries_only_when_asked() {
        for release_on_oom in [true, false] {
            let dev = Arc::new(SimDevice::new(64 * MIB));
            let config = AllocatorConfig {
                release_on_oom,
                ..AllocatorConfig::new(StrategyConfig::default_for(crate::StrategyKind::Caching))
            };
            let alloc = Allocator::new(dev, config);
            drop(alloc.allocate(40 * MIB, 0).unwrap()); // cached, idle
            let got = alloc.allocate(48 * MIB, 0);
            let stats = alloc.stats();
            assert_eq!(got.is_ok(), release_on_oom, "release_on_oom = {release_on_oom}");
            assert_eq!(stats.oom_recoveries, u64::from(release_on_oom));
            assert_eq!(stats.failed_allocs, u64::from(!release_on_oom));
        }
    }
}
