//! Allocate+free pairs and trace replay through each strategy on SimDevice (zero-cost model, so
//! only allocator overhead is timed). Fixed seeds; passthrough is always measured alongside.

use std::sync::Arc;

use adaptalloc::device::{CostModel, Device};
use adaptalloc::{Allocator, SimDevice, StrategyKind};
use adaptalloc_cli::synth::WorkloadSpec;
use adaptalloc_cli::trace::replay;
use criterion::{BatchSize, Criterion, Throughput, criterion_group, criterion_main};

fn device() -> Arc<dyn Device> {
    Arc::new(
        SimDevice::builder()
            .capacity(1 << 40)
            .cost_model(CostModel::zero())
            .build(),
    )
}

fn alloc_free_pairs(c: &mut Criterion) {
    let mut group = c.benchmark_group("alloc_free_pair");
    for kind in StrategyKind::ALL {
        for size in [256u64, 64 << 10, 4 << 20] {
            let alloc = Allocator::with_strategy(device(), kind);
            // Warm: one block of this size has been freed, so caching and suballoc hit.
            let warm = alloc.allocate_raw(size, 0).unwrap();
            let keep = alloc.allocate_raw(size, 0).unwrap();
            alloc.deallocate(warm, 0).unwrap();
            group.bench_function(format!("{kind}/{size}"), |b| {
                b.iter(|| {
                    let p = alloc.allocate_raw(std::hint::black_box(size), 0).unwrap();
                    alloc.deallocate(p, 0).unwrap();
                })
            });
            alloc.deallocate(keep, 0).unwrap();
        }
    }
    group.finish();
}

fn replay_workload(c: &mut Criterion) {
    let spec = WorkloadSpec::bundled("small-churn").unwrap();
    let trace = spec.generate(spec.seed);
    let mut group = c.benchmark_group("replay_small_churn");
    group.throughput(Throughput::Elements(trace.events.len() as u64));
    group.sample_size(20);
    for kind in StrategyKind::ALL {
        group.bench_function(kind.name(), |b| {
            b.iter_batched(
                || Allocator::with_strategy(device(), kind),
                |alloc| replay(&trace, &alloc),
                BatchSize::LargeInput,
            )
        });
    }
    group.bench_function("adaptive", |b| {
        b.iter_batched(
            || Allocator::adaptive(device()),
            |alloc| replay(&trace, &alloc),
            BatchSize::LargeInput,
        )
    });
    group.finish();
}

criterion_group!(benches, alloc_free_pairs, replay_workload);
criterion_main!(benches);
