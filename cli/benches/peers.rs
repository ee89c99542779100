//! adaptalloc beside peer allocators in the same run: allocate+free pairs, churn (N live blocks,
//! one replaced at random) and threads on one allocator. Zero-cost SimDevice, so only allocator
//! work is timed. Peers: offset-allocator 0.2 (O(1) TLSF over offsets) and range-alloc, both
//! single-threaded `&mut` structures with no lock, while every adaptalloc call takes its lock and
//! keeps statistics; with `--features peers`, gpu-alloc 0.6 over SimDevice (behind a mutex and a
//! pointer map, as a usable GPU allocator needs). Sizes are in 256-byte units for
//! offset-allocator (it counts in u32).
//!
//! `cargo bench --features peers --bench peers`; `scripts/benchmarks.sh` turns the results into
//! BENCHMARKS.md.

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use adaptalloc::device::{CostModel, Device};
use adaptalloc::rng::SplitMix64;
use adaptalloc::{Allocator, SimDevice, StrategyKind};
use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, Criterion, criterion_group, criterion_main};

fn device() -> Arc<dyn Device> {
    Arc::new(
        SimDevice::builder()
            .capacity(1 << 44)
            .cost_model(CostModel::zero())
            .build(),
    )
}

const SIZES: [u64; 4] = [256, 64 << 10, 4 << 20, 64 << 20];

/// cubecl-runtime 0.5's memory management over SimDevice (see cli/src/peers/gpu_alloc.rs for its limits:
/// timed on reserve + release, without the crate-private address lookup).
#[cfg(feature = "peers")]
mod cubecl {
    use std::collections::HashMap;
    use std::sync::Arc;

    use adaptalloc::device::{Device, DevicePtr};
    use cubecl_runtime::memory_management::{MemoryConfiguration, MemoryDeviceProperties, MemoryManagement};
    use cubecl_runtime::storage::{ComputeStorage, StorageHandle, StorageId, StorageUtilization};

    pub struct SimStorage {
        dev: Arc<dyn Device>,
        blocks: HashMap<StorageId, DevicePtr>,
    }

    impl ComputeStorage for SimStorage {
        type Resource = DevicePtr;
        const ALIGNMENT: u64 = 256;

        fn get(&mut self, handle: &StorageHandle) -> DevicePtr {
            self.blocks[&handle.id] + handle.offset()
        }

        fn alloc(&mut self, size: u64) -> StorageHandle {
            // The trait has no error path: the bench device is unbounded.
            let ptr = self.dev.allocate(size).expect("unbounded bench device");
            let id = StorageId::new();
            self.blocks.insert(id, ptr);
            StorageHandle::new(id, StorageUtilization { offset: 0, size })
        }

        fn dealloc(&mut self, id: StorageId) {
            if let Some(ptr) = self.blocks.remove(&id) {
                self.dev.free(ptr).expect("a block of this storage");
            }
        }
    }

    /// Burn's default for sub-slicing devices, with 1 GiB pages (requests up to 1 GiB).
    pub fn new(dev: Arc<dyn Device>) -> MemoryManagement<SimStorage> {
        MemoryManagement::from_configuration(
            SimStorage {
                dev,
                blocks: HashMap::new(),
            },
            &MemoryDeviceProperties {
                max_page_size: 1 << 30,
                alignment: 256,
            },
            MemoryConfiguration::SubSlices,
        )
    }
}

fn pairs(c: &mut Criterion) {
    let mut g = c.benchmark_group("pair");
    for size in SIZES {
        // Ours: the default's cache-hit path (the class warmed), and each strategy.
        let ours: Vec<(String, Allocator)> = std::iter::once(("adaptive".to_string(), Allocator::adaptive(device())))
            .chain(
                StrategyKind::ALL
                    .iter()
                    .map(|&k| (k.name().to_string(), Allocator::with_strategy(device(), k))),
            )
            .collect();
        for (name, alloc) in &ours {
            let keep = alloc.allocate_raw(size, 0).unwrap();
            for _ in 0..4096 {
                let p = alloc.allocate_raw(size, 0).unwrap();
                alloc.deallocate(p, 0).unwrap();
            }
            g.bench_function(format!("{name}/{size}"), |b| {
                b.iter(|| {
                    let p = alloc.allocate_raw(black_box(size), 0).unwrap();
                    alloc.deallocate(p, 0).unwrap();
                })
            });
            alloc.deallocate(keep, 0).unwrap();
        }
        let mut oa = offset_allocator::Allocator::<u32>::new(u32::MAX);
        let units = (size / 256) as u32;
        g.bench_function(format!("offset-allocator/{size}"), |b| {
            b.iter(|| {
                let a = oa.allocate(black_box(units)).unwrap();
                oa.free(a);
            })
        });
        #[cfg(feature = "peers")]
        {
            let mut mm = cubecl::new(device());
            let keep = mm.reserve(size, None);
            g.bench_function(format!("cubecl/{size}"), |b| {
                b.iter(|| drop(black_box(mm.reserve(black_box(size), None))))
            });
            drop(keep);
        }
        #[cfg(feature = "peers")]
        {
            use adaptalloc_cli::trace::ReplayTarget;
            let ga = adaptalloc_cli::peers::GpuAllocPeer::new(device());
            let keep = ga.allocate(size, 0).unwrap();
            g.bench_function(format!("gpu-alloc/{size}"), |b| {
                b.iter(|| {
                    let p = ga.allocate(black_box(size), 0).unwrap();
                    ga.deallocate(p, 0);
                })
            });
            ga.deallocate(keep, 0);
        }
        let mut ra = range_alloc::RangeAllocator::new(0u64..1 << 44);
        g.bench_function(format!("range-alloc/{size}"), |b| {
            b.iter(|| {
                let r = ra.allocate_range(black_box(size)).unwrap();
                ra.free_range(r);
            })
        });
    }
    g.finish();
}

/// A seeded sequence of (slot, size): replace the block in `slot` with one of `size`.
fn churn_ops(n: usize, live: usize) -> Vec<(usize, u64)> {
    let mut rng = SplitMix64(42);
    (0..n)
        .map(|_| {
            let bits = 8 + rng.below(19); // 256 B .. 64 MiB, log-uniform
            (
                (rng.below(live as u64)) as usize,
                (1u64 << bits) + rng.below(1 << bits) / 2 / 256 * 256,
            )
        })
        .collect()
}

/// Times one churn step: `replace(slot, size)` frees the block in `slot` and allocates `size`
/// in its place, walking the seeded `ops` in turn.
fn churn_with(
    g: &mut BenchmarkGroup<'_, WallTime>,
    name: &str,
    ops: &[(usize, u64)],
    mut replace: impl FnMut(usize, u64),
) {
    let mut i = 0;
    g.bench_function(name, |b| {
        b.iter(|| {
            let (slot, size) = ops[i % ops.len()];
            i += 1;
            replace(slot, size);
        })
    });
}

fn churn(c: &mut Criterion) {
    const LIVE: usize = 256;
    let ops = churn_ops(1 << 16, LIVE);
    let mut g = c.benchmark_group("churn");
    let ours = [
        ("adaptive", Allocator::adaptive(device())),
        ("suballoc", Allocator::with_strategy(device(), StrategyKind::Suballoc)),
        ("caching", Allocator::with_strategy(device(), StrategyKind::Caching)),
    ];
    for (name, alloc) in &ours {
        let mut slots: Vec<u64> = (0..LIVE).map(|_| alloc.allocate_raw(4096, 0).unwrap()).collect();
        churn_with(&mut g, name, &ops, |slot, size| {
            alloc.deallocate(slots[slot], 0).unwrap();
            slots[slot] = alloc.allocate_raw(size, 0).unwrap();
        });
        for p in slots {
            alloc.deallocate(p, 0).unwrap();
        }
    }
    let mut oa = offset_allocator::Allocator::<u32>::new(u32::MAX);
    let mut slots: Vec<_> = (0..LIVE).map(|_| oa.allocate(16).unwrap()).collect();
    churn_with(&mut g, "offset-allocator", &ops, |slot, size| {
        oa.free(slots[slot]);
        slots[slot] = oa.allocate((size / 256) as u32).unwrap();
    });
    #[cfg(feature = "peers")]
    {
        let mut mm = cubecl::new(device());
        let mut slots: Vec<_> = (0..LIVE).map(|_| Some(mm.reserve(4096, None))).collect();
        churn_with(&mut g, "cubecl", &ops, |slot, size| {
            slots[slot] = None; // released first, as the others free before allocating
            slots[slot] = Some(mm.reserve(size, None));
        });
    }
    #[cfg(feature = "peers")]
    {
        use adaptalloc_cli::trace::ReplayTarget;
        let ga = adaptalloc_cli::peers::GpuAllocPeer::new(device());
        let mut slots: Vec<u64> = (0..LIVE).map(|_| ga.allocate(4096, 0).unwrap()).collect();
        churn_with(&mut g, "gpu-alloc", &ops, |slot, size| {
            ga.deallocate(slots[slot], 0);
            slots[slot] = ga.allocate(size, 0).unwrap();
        });
    }
    let mut ra = range_alloc::RangeAllocator::new(0u64..1 << 44);
    let mut slots: Vec<_> = (0..LIVE).map(|_| ra.allocate_range(4096).unwrap()).collect();
    churn_with(&mut g, "range-alloc", &ops, |slot, size| {
        ra.free_range(slots[slot].clone());
        slots[slot] = ra.allocate_range(size).unwrap();
    });
    g.finish();
}

/// Allocate+free pairs (64 KiB, cache hits) from `threads` threads on one adaptive allocator,
/// each on its own stream; criterion times `iters` pairs per thread, all threads at once.
fn threads(c: &mut Criterion) {
    let mut g = c.benchmark_group("threads");
    g.measurement_time(Duration::from_secs(4));
    for n in [1u64, 2, 4, 8] {
        let alloc = Allocator::adaptive(device());
        g.bench_function(format!("adaptive/{n}"), |b| {
            b.iter_custom(|iters| {
                let start = Instant::now();
                std::thread::scope(|s| {
                    for t in 0..n {
                        let alloc = &alloc;
                        s.spawn(move || {
                            for _ in 0..iters {
                                let p = alloc.allocate_raw(64 << 10, t).unwrap();
                                alloc.deallocate(p, t).unwrap();
                            }
                        });
                    }
                });
                start.elapsed()
            })
        });
    }
    g.finish();
}

/// Allocate+free pairs (64 KiB) each on a stream never seen before, after `seen` such streams:
/// the time per pair must not grow with the streams the allocator has seen (it forgets streams
/// that hold nothing). criterion times `iters` pairs on a fresh allocator that has first served
/// `seen` streams (untimed).
fn streams(c: &mut Criterion) {
    let mut g = c.benchmark_group("streams");
    g.sample_size(20);
    for seen in [1_000u64, 100_000] {
        g.bench_function(format!("adaptive/{seen}"), |b| {
            b.iter_custom(|iters| {
                let alloc = Allocator::adaptive(device());
                let pair = |stream: u64| {
                    let p = alloc.allocate_raw(64 << 10, stream).unwrap();
                    alloc.deallocate(p, stream).unwrap();
                };
                (1..=seen).for_each(pair);
                let start = Instant::now();
                (seen + 1..=seen + iters).for_each(pair);
                start.elapsed()
            })
        });
    }
    g.finish();
}

criterion_group!(benches, pairs, churn, threads, streams);
criterion_main!(benches);
