//! The conformance suite: the same checks against every strategy on SimDevice.

mod common;

use std::sync::Arc;

use adaptalloc::device::{CostModel, Device, FaultPlan};
use adaptalloc::size::{GIB, KIB, MIB};
use adaptalloc::{AllocError, Allocator, AllocatorConfig, SimDevice};
use common::{Rng, Setup, all_configs, allocator, check_invariants, sim};

#[test]
fn random_operations_keep_invariants() {
    for (name, config) in all_configs() {
        let dev = sim(64 * GIB);
        let alloc = allocator(&dev, config);
        let mut rng = Rng(7);
        let mut live = Vec::new();
        for step in 0..3000 {
            if live.is_empty() || rng.below(100) < 55 {
                let size = rng.size(256 * MIB);
                let stream = rng.below(3);
                let ptr = alloc
                    .allocate_raw(size, stream)
                    .unwrap_or_else(|e| panic!("{name}: {e}"));
                live.push((ptr, size, stream));
            } else {
                let (ptr, _, stream) = live.swap_remove(rng.below(live.len() as u64) as usize);
                alloc.deallocate(ptr, stream).unwrap();
            }
            if step % 97 == 0 {
                alloc.synchronize_stream(rng.below(3));
            }
            check_invariants(name, &alloc, &dev, &live);
        }
    }
}

#[test]
fn dropping_the_allocator_returns_every_byte() {
    for (name, config) in all_configs() {
        let dev = sim(64 * GIB);
        {
            let alloc = allocator(&dev, config);
            let mut rng = Rng(11);
            let mut handles = Vec::new();
            for i in 0..200 {
                let size = rng.size(64 * MIB);
                if i % 3 == 0 {
                    // Raw allocations never freed: the allocator frees them on drop.
                    alloc.allocate_raw(size, 0).unwrap();
                } else {
                    handles.push(alloc.allocate(size, 0).unwrap());
                }
                if i % 5 == 0 {
                    handles.pop();
                }
            }
            // Handles outlive the allocator value; they keep its state alive.
            drop(alloc);
            assert!(dev.leak_report().blocks > 0, "{name}: handles still hold memory");
            drop(handles);
        }
        assert_eq!(dev.leak_report().blocks, 0, "{name}: leak check");
        assert_eq!(dev.used_bytes(), 0, "{name}: device fully free");
    }
}

#[test]
fn invalid_frees_are_errors_that_change_nothing() {
    for (name, config) in all_configs() {
        let dev = sim(4 * GIB);
        let alloc = allocator(&dev, config);
        let a = alloc.allocate_raw(3 * KIB, 1).unwrap();
        let before = alloc.stats();
        assert_eq!(
            alloc.deallocate(0xdead_0000, 1),
            Err(AllocError::UnknownPointer { ptr: 0xdead_0000 }),
            "{name}"
        );
        assert_eq!(
            alloc.deallocate(a + 256, 1),
            Err(AllocError::UnknownPointer { ptr: a + 256 }),
            "{name}: interior pointer"
        );
        assert_eq!(
            alloc.deallocate(a, 2),
            Err(AllocError::StreamMismatch {
                ptr: a,
                allocated_on: 1,
                freed_on: 2
            }),
            "{name}"
        );
        assert_eq!(alloc.stats(), before, "{name}: failed frees change nothing");
        alloc.deallocate(a, 1).unwrap();
        let err = alloc.deallocate(a, 1).unwrap_err();
        assert_eq!(err, AllocError::UnknownPointer { ptr: a }, "{name}: double free");
        assert!(err.to_string().contains("already freed"), "{err}");
        check_invariants(name, &alloc, &dev, &[]);
    }
}

#[test]
fn extreme_sizes_are_typed_errors() {
    for (name, config) in all_configs() {
        let dev = sim(4 * GIB);
        let alloc = allocator(&dev, config);
        assert_eq!(alloc.allocate_raw(0, 0), Err(AllocError::ZeroSize), "{name}");
        for size in [4 * GIB + 1, u64::MAX, u64::MAX - 255] {
            match alloc.allocate_raw(size, 0) {
                Err(AllocError::TooLarge { .. }) => {}
                other => panic!("{name}: size {size}: {other:?}"),
            }
        }
        assert_eq!(
            alloc.stats().failed_allocs,
            4,
            "{name}: every refused request counts as a failed allocation"
        );
        let one = alloc.allocate_raw(1, 0).unwrap();
        assert_eq!(one % 256, 0);
        alloc.deallocate(one, 0).unwrap();
        check_invariants(name, &alloc, &dev, &[]);
    }
}

/// An injected driver failure reaches the caller as a clear, transient out-of-memory error,
/// and the allocator stays usable. Where slabs are one handle each, a refused handle falls back
/// to pages (a second driver call) and the request is served; a second refusal reaches the
/// caller.
#[test]
fn injected_driver_failure_is_a_clear_oom_and_the_allocator_stays_usable() {
    for (name, config) in all_configs() {
        let run = |fail_nth: Vec<u64>| {
            let dev = Arc::new(
                SimDevice::builder()
                    .capacity(8 * GIB)
                    .cost_model(CostModel::zero())
                    .faults(FaultPlan {
                        fail_nth,
                        ..Default::default()
                    })
                    .build(),
            );
            // No release on OOM: the injected failure must reach the caller.
            let alloc = match config.clone() {
                Setup::Strategy(strategy) => Allocator::new(
                    dev.clone() as Arc<dyn Device>,
                    AllocatorConfig {
                        strategy,
                        release_on_oom: false,
                    },
                ),
                Setup::Policy(mut policy) => {
                    policy.oom.release_and_retry = false;
                    Allocator::with_policy(dev.clone() as Arc<dyn Device>, *policy)
                }
            };
            let first = alloc.allocate_raw(3 * GIB, 0).unwrap();
            let second = alloc.allocate_raw(5 * GIB / 2, 0);
            (dev, alloc, first, second)
        };
        let (mut dev, mut alloc, mut first, mut second) = run(vec![2]);
        if let Ok(p) = second {
            // Served after the refusal: by pages, where the slab was to be one handle.
            assert_eq!(dev.stats().failed_allocs, 1, "{name}: served without a refusal");
            check_invariants(name, &alloc, &dev, &[(first, 3 * GIB, 0), (p, 5 * GIB / 2, 0)]);
            assert_eq!(alloc.stats().failed_allocs, 0, "{name}");
            (dev, alloc, first, second) = run(vec![2, 3]);
        }
        let err = second.expect_err(name);
        assert!(err.is_transient(), "{name}: {err:?}");
        let text = err.to_string();
        for want in [
            "asked for 2.50GiB",
            "3GiB live",
            "reserved",
            "idle",
            "largest free block",
            "injected",
        ] {
            assert!(text.contains(want), "{name}: message lacks {want:?}: {text}");
        }
        check_invariants(name, &alloc, &dev, &[(first, 3 * GIB, 0)]);
        let second = alloc.allocate_raw(MIB, 0).unwrap();
        check_invariants(name, &alloc, &dev, &[(first, 3 * GIB, 0), (second, MIB, 0)]);
        assert_eq!(alloc.stats().failed_allocs, 1, "{name}");
    }
}

#[test]
fn allocation_handles_report_their_request() {
    for (name, config) in all_configs() {
        let dev = sim(GIB);
        let alloc = allocator(&dev, config);
        let a = alloc.allocate(1000, 4).unwrap();
        assert_eq!((a.len(), a.stream(), a.ptr() % 256), (1000, 4, 0), "{name}");
        let raw = a.into_raw();
        check_invariants(name, &alloc, &dev, &[(raw, 1000, 4)]);
        alloc.deallocate(raw, 4).unwrap();
        check_invariants(name, &alloc, &dev, &[]);
    }
}
