//! The allocator's hot paths in a loop, for instruction counts under
//! `valgrind --tool=callgrind target/release/examples/hotpath [pair|churn|churn-adaptive|churn-offset|threads|lock] [N] [SIZE]`
//! (`threads`: SIZE threads on one allocator; a timing, not for callgrind)
//! (instruction counts repeat exactly on a noisy machine, unlike timings).

use std::sync::Arc;

use adaptalloc::device::CostModel;
use adaptalloc::rng::SplitMix64;
use adaptalloc::{Allocator, SimDevice, StrategyKind};

fn main() {
    let mut args = std::env::args().skip(1);
    let what = args.next().unwrap_or_else(|| "pair".into());
    let n: u64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(100_000);
    // Request size of the pair workload.
    let size: u64 = args.next().and_then(|s| s.parse().ok()).unwrap_or(65536);
    let device = Arc::new(
        SimDevice::builder()
            .capacity(1 << 44)
            .cost_model(CostModel::zero())
            .build(),
    );
    match what.as_str() {
        "pair" => {
            let alloc = Allocator::adaptive(device);
            for _ in 0..n {
                let p = alloc.allocate_raw(std::hint::black_box(size), 0).expect("allocate");
                alloc.deallocate(p, 0).expect("free");
            }
        }
        "churn" | "churn-adaptive" => {
            let alloc = if what == "churn" {
                Allocator::with_strategy(device, StrategyKind::Suballoc)
            } else {
                Allocator::adaptive(device)
            };
            let mut rng = SplitMix64(42);
            let mut slots: Vec<u64> = (0..256)
                .map(|_| alloc.allocate_raw(4096, 0).expect("allocate"))
                .collect();
            for _ in 0..n {
                let bits = 8 + rng.below(19);
                let size = (1u64 << bits) + rng.below(1 << bits) / 2 / 256 * 256;
                let slot = rng.below(256) as usize;
                alloc.deallocate(slots[slot], 0).expect("free");
                slots[slot] = alloc.allocate_raw(size, 0).expect("allocate");
            }
            for p in slots {
                alloc.deallocate(p, 0).expect("free");
            }
        }
        "threads" => {
            // `size` threads on one allocator, each on its own stream, n pairs each.
            let alloc = Allocator::adaptive(device);
            let t = std::time::Instant::now();
            std::thread::scope(|s| {
                for stream in 0..size {
                    let alloc = &alloc;
                    s.spawn(move || {
                        for _ in 0..n {
                            let p = alloc.allocate_raw(65536, stream).expect("allocate");
                            alloc.deallocate(p, stream).expect("free");
                        }
                    });
                }
            });
            println!(
                "{size} threads: {:.1} ns per pair per thread",
                t.elapsed().as_nanos() as f64 / n as f64
            );
        }
        "churn-offset" => {
            // The same churn through offset-allocator (a dev-dependency), for comparison.
            let mut oa = offset_allocator::Allocator::<u32>::new(u32::MAX);
            let mut rng = SplitMix64(42);
            let mut slots: Vec<_> = (0..256).map(|_| oa.allocate(16).expect("allocate")).collect();
            for _ in 0..n {
                let bits = 8 + rng.below(19);
                let size = (1u64 << bits) + rng.below(1 << bits) / 2 / 256 * 256;
                let slot = rng.below(256) as usize;
                oa.free(slots[slot]);
                slots[slot] = oa.allocate((size / 256) as u32).expect("allocate");
            }
        }
        "lock" => {
            // The floor under every allocator call: an uncontended lock and unlock, twice a pair.
            let m = parking_lot::Mutex::new(0u64);
            let t = std::time::Instant::now();
            for _ in 0..n {
                *m.lock() += 1;
                *m.lock() += 1;
            }
            println!(
                "two lock/unlock pairs: {:.1} ns",
                t.elapsed().as_nanos() as f64 / n as f64
            );
        }
        other => eprintln!("unknown workload {other}: pair, churn, churn-adaptive, churn-offset, threads or lock"),
    }
}
