//! A randomized, shadow-checked stream harness on the stub libcuda (tests/stub/libcuda.c), run
//! by the reliability suite. The stub models per-stream queues of kernels that use address
//! ranges, events, and completion when the harness says so (at random times); `cuMemFree`
//! completes queued work as CUDA's synchronizing cudaFree does, and unmapping a range that a
//! pending kernel uses fails and is counted.
//!
//! Random interleavings, across many streams whose handles lie above and below each other, of
//! malloc, free, record_stream plus a kernel on the side stream, kernels on a block's own
//! stream, kernels finishing, synchronize_stream and empty_cache. A shadow records, for every
//! block, the latest kernel queued on each stream that used it; when the block is freed those
//! stay with its address range until they are done. A hand-out to stream C of memory that a
//! pending kernel on another stream still uses is an unsafe hand-out: the allocator reused the
//! block before the work queued before its free was done.

use std::collections::HashMap;
use std::sync::Arc;

use adaptalloc::strategy::StreamId;
use adaptalloc::{AllocError, Allocator, CudaDevice, Device, DevicePtr, StrategyKind};

use crate::common::Rng;
use crate::common::stub::StubHooks;

/// The allocator set-ups the harness runs (each with VMM on and off, as the stub is told).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Setup {
    Default,
    Suballoc,
    Caching,
}

impl Setup {
    pub const ALL: [Setup; 3] = [Setup::Default, Setup::Suballoc, Setup::Caching];

    fn build(self, dev: Arc<dyn Device>) -> Allocator {
        match self {
            Setup::Default => Allocator::adaptive(dev),
            Setup::Suballoc => Allocator::with_strategy(dev, StrategyKind::Suballoc),
            Setup::Caching => Allocator::with_strategy(dev, StrategyKind::Caching),
        }
    }
}

/// What one run found.
#[derive(Debug, Default)]
pub struct Outcome {
    pub steps: u64,
    pub handouts: u64,
    pub unsafe_handouts: u64,
    pub unsafe_unmaps: i32,
    pub out_of_memory: u64,
    pub kernels: u64,
    /// The allocator's own counts: streams whose freed memory it found done without a wait,
    /// and its waits (on the out-of-memory path).
    pub stream_reclaims: u64,
    pub stream_waits: u64,
    /// The first few unsafe hand-outs, described.
    pub first: Vec<String>,
}

/// Streams the harness uses; more than the 64 past which a free asks for a crowded reclaim.
const STREAMS: u64 = 96;
/// Streams that take most of the work (the rest come and go).
const HOT: u64 = 4;

/// The stream handle of logical stream `i` (1-based): ascending or descending with `i`, so
/// that a stream's handle sorts above or below the others'.
fn handle(i: u64, descending: bool) -> StreamId {
    if descending {
        0x40_0000 - i * 0x100
    } else {
        0x1000 + i * 0x100
    }
}

struct Block {
    size: u64,
    stream: StreamId,
    /// The latest kernel queued on each stream that used it: (stream, place in its queue).
    uses: Vec<(StreamId, u64)>,
}

/// A freed range and the kernels that used it, until they are done.
struct Freed {
    start: DevicePtr,
    end: DevicePtr,
    uses: Vec<(StreamId, u64)>,
}

/// Runs `steps` random steps on `setup` with stream handles ascending or descending; the
/// device is CUDA device 0 of the stub (its VMM as the process's STUB_CUDA_VMM says).
pub fn run(hooks: &StubHooks, setup: Setup, descending: bool, steps: u64, seed: u64) -> Outcome {
    let dev = Arc::new(CudaDevice::new(0).expect("stub device 0"));
    let capacity = dev.mem_info().unwrap().total;
    let alloc = setup.build(dev.clone() as Arc<dyn Device>);
    let mut rng = Rng(seed);
    let mut out = Outcome::default();
    let unmaps_before = (hooks.unsafe_unmaps)();
    let done = |s: StreamId, at: u64| (hooks.stream_completed)(s as usize) >= at;
    let mut live: HashMap<DevicePtr, Block> = HashMap::new();
    let mut order: Vec<DevicePtr> = Vec::new();
    let mut freed: Vec<Freed> = Vec::new();
    let mut live_bytes = 0u64;
    let pick_stream = |rng: &mut Rng| {
        let i = if rng.below(10) < 6 {
            1 + rng.below(HOT)
        } else {
            1 + rng.below(STREAMS)
        };
        handle(i, descending)
    };
    for step in 0..steps {
        let heavy = live_bytes > capacity / 10 * 7;
        let op = if order.is_empty() { 0 } else { rng.below(100) };
        if op < 30 && !heavy {
            // malloc
            // Half from a few sizes that recur (as a training step's tensors do), so that a
            // freed block is often handed out whole again; half spread over three ranges.
            const RECURRING: [u64; 6] = [4 << 10, 48 << 10, 256 << 10, 1 << 20, 3 << 20, 5 << 20];
            let size = match rng.below(20) {
                0..=9 => RECURRING[rng.below(RECURRING.len() as u64) as usize],
                10..=16 => 256 + rng.size(64 << 10),
                17..=18 => (64 << 10) + rng.size(1 << 20),
                _ => (1 << 20) + rng.size(5 << 20),
            };
            let stream = pick_stream(&mut rng);
            match alloc.allocate_raw(size, stream) {
                Ok(p) => {
                    out.handouts += 1;
                    check_handout(&freed, p, size, stream, &done, step, &mut out);
                    live.insert(
                        p,
                        Block {
                            size,
                            stream,
                            uses: Vec::new(),
                        },
                    );
                    order.push(p);
                    live_bytes += size;
                }
                Err(AllocError::OutOfMemory { .. }) => out.out_of_memory += 1,
                Err(e) => panic!("{setup:?}: step {step}: {size} B on {stream:#x}: {e}"),
            }
        } else if op < 55 {
            // free, on the block's own stream
            let p = order.swap_remove(rng.below(order.len() as u64) as usize);
            let b = live.remove(&p).unwrap();
            alloc.deallocate(p, b.stream).unwrap();
            live_bytes -= b.size;
            let uses: Vec<_> = b.uses.into_iter().filter(|&(s, at)| !done(s, at)).collect();
            if !uses.is_empty() {
                freed.push(Freed {
                    start: p,
                    end: p + b.size,
                    uses,
                });
            }
        } else if op < 75 {
            // a kernel that uses a live block: on its own stream, or on a side stream that
            // the block is recorded on first (as Tensor.record_stream)
            let p = order[rng.below(order.len() as u64) as usize];
            let b = live.get_mut(&p).unwrap();
            let s = if rng.below(10) < 5 {
                b.stream
            } else {
                pick_stream(&mut rng)
            };
            if s != b.stream {
                alloc.record_stream(p, s).unwrap();
            }
            let at = (hooks.stream_kernel)(s as usize, p, b.size as usize);
            assert!(at > 0, "the stub tracks stream {s:#x}");
            out.kernels += 1;
            b.uses.retain(|&(u, _)| u != s);
            b.uses.push((s, at));
        } else if op < 93 {
            // kernels finish: the oldest few on one stream
            let s = pick_stream(&mut rng);
            (hooks.stream_finish)(s as usize, 1 + rng.below(3) as i32);
        } else if op < 97 {
            // the caller synchronizes a stream and says so
            let s = pick_stream(&mut rng);
            (hooks.stream_finish)(s as usize, i32::MAX);
            alloc.synchronize_stream(s);
        } else {
            alloc.release_idle();
        }
        if step % 256 == 0 {
            freed.retain_mut(|f| {
                f.uses.retain(|&(s, at)| !done(s, at));
                !f.uses.is_empty()
            });
        }
        out.steps += 1;
    }
    for p in order {
        let b = live.remove(&p).unwrap();
        alloc.deallocate(p, b.stream).unwrap();
    }
    for i in 1..=STREAMS {
        (hooks.stream_finish)(handle(i, descending) as usize, i32::MAX);
    }
    let stats = alloc.stats();
    (out.stream_reclaims, out.stream_waits) = (stats.stream_reclaims, stats.stream_waits);
    drop(alloc);
    out.unsafe_unmaps = (hooks.unsafe_unmaps)() - unmaps_before;
    assert_eq!(
        dev.mem_info().unwrap().free,
        capacity,
        "{setup:?}: every byte back to the stub once the allocator is gone"
    );
    out
}

/// Counts (and describes the first few of) the pending kernels on streams other than `stream`
/// that use memory in `p..p + size`, just handed to `stream`.
fn check_handout(
    freed: &[Freed],
    p: DevicePtr,
    size: u64,
    stream: StreamId,
    done: &dyn Fn(StreamId, u64) -> bool,
    step: u64,
    out: &mut Outcome,
) {
    for f in freed.iter().filter(|f| f.start < p + size && p < f.end) {
        for &(s, at) in &f.uses {
            if s != stream && !done(s, at) {
                out.unsafe_handouts += 1;
                if out.first.len() < 3 {
                    out.first.push(format!(
                        "step {step}: {size} B at {p:#x} to stream {stream:#x} while kernel {at} of stream {s:#x} uses {:#x}..{:#x}",
                        f.start, f.end
                    ));
                }
            }
        }
    }
}
