//! Property tests: random allocate/free sequences (1 B .. 1 GiB, several streams) against a
//! simple reference model: a map of what should be live.

mod common;

use std::collections::BTreeMap;

use adaptalloc::size::GIB;
use adaptalloc::{AllocError, DevicePtr, StrategyKind};
use common::{all_configs, allocator, check_invariants, sim};
use proptest::prelude::*;

#[derive(Clone, Debug)]
enum Op {
    Alloc {
        size: u64,
        stream: u64,
    },
    /// Free the live block at this index (modulo the number live).
    Free {
        pick: usize,
    },
    /// Free a pointer that is not live (offset from a live one, or made up).
    BadFree {
        pick: usize,
        offset: u64,
    },
    Sync {
        stream: u64,
    },
    ReleaseIdle,
}

fn op() -> impl Strategy<Value = Op> {
    let size = prop_oneof![1u64..=4096, 4096u64..=(16 << 20), (16u64 << 20)..=GIB];
    prop_oneof![
        5 => (size, 0u64..3).prop_map(|(size, stream)| Op::Alloc { size, stream }),
        4 => any::<usize>().prop_map(|pick| Op::Free { pick }),
        1 => (any::<usize>(), 1u64..1 << 20).prop_map(|(pick, offset)| Op::BadFree { pick, offset }),
        1 => (0u64..3).prop_map(|stream| Op::Sync { stream }),
        1 => Just(Op::ReleaseIdle),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn strategies_match_the_reference_model(ops in proptest::collection::vec(op(), 1..160)) {
        for (name, config) in all_configs() {
            // 24 GiB: big requests sometimes do not fit, so failures are exercised too.
            let dev = sim(24 * GIB);
            let alloc = allocator(&dev, config);
            let mut model: BTreeMap<DevicePtr, (u64, u64)> = BTreeMap::new();
            for op in &ops {
                match *op {
                    Op::Alloc { size, stream } => match alloc.allocate_raw(size, stream) {
                        Ok(ptr) => {
                            prop_assert!(model.insert(ptr, (size, stream)).is_none(), "{}: pointer handed out twice", name);
                        }
                        Err(AllocError::OutOfMemory { .. }) => {
                            let live: u64 = model.values().map(|v| v.0).sum();
                            prop_assert!(live + size > 24 * GIB / 2, "{}: OOM with only {} live", name, live);
                        }
                        Err(e) => prop_assert!(false, "{}: unexpected {:?}", name, e),
                    },
                    Op::Free { pick } if !model.is_empty() => {
                        let (&ptr, &(_, stream)) = model.iter().nth(pick % model.len()).unwrap();
                        alloc.deallocate(ptr, stream).unwrap();
                        model.remove(&ptr);
                    }
                    Op::Free { .. } => {}
                    Op::BadFree { pick, offset } => {
                        let ptr = if model.is_empty() { 0x42 << 8 } else { *model.keys().nth(pick % model.len()).unwrap() + offset * 256 };
                        if !model.contains_key(&ptr) {
                            let before = alloc.stats();
                            prop_assert_eq!(alloc.deallocate(ptr, 0), Err(AllocError::UnknownPointer { ptr }));
                            prop_assert_eq!(alloc.stats(), before);
                        }
                    }
                    Op::Sync { stream } => alloc.synchronize_stream(stream),
                    Op::ReleaseIdle => {
                        alloc.release_idle();
                        // Only free space inside slabs (or pages) that hold live blocks may stay.
                        let st = alloc.stats();
                        prop_assert_eq!(st.releasable_idle_bytes, 0, "{}", name);
                        if model.is_empty() {
                            prop_assert_eq!(st.reserved_bytes.current, 0, "{}", name);
                        }
                        if !alloc.strategies().contains(&StrategyKind::Suballoc) {
                            prop_assert_eq!(st.idle_bytes.current, 0, "{}", name);
                        }
                    }
                }
                let live: Vec<_> = model.iter().map(|(&p, &(s, st))| (p, s, st)).collect();
                check_invariants(name, &alloc, &dev, &live);
            }
            drop(alloc);
            prop_assert_eq!(dev.leak_report().blocks, 0);
        }
    }
}
