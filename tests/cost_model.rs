//! SimDevice charges every driver operation at its price in the cost model, by kind: what
//! `CudaDevice` would call for the same request.

use adaptalloc::device::{CostCurve, CostModel, Device, PoolCall, SimDevice};
use adaptalloc::size::ByteSize;
use adaptalloc::size::{GIB, MIB};

fn device(capacity: u64) -> SimDevice {
    SimDevice::builder().capacity(capacity).build()
}

#[test]
fn mapping_pages_charges_a_create_and_a_map_per_page_and_one_access_grant_priced_by_its_handles() {
    let dev = device(GIB);
    let m = CostModel::default();
    let vmm = dev.vmm().unwrap();
    let base = vmm.reserve(8 * MIB).unwrap();
    vmm.map(base, 6 * MIB).unwrap();
    let s = dev.stats();
    assert_eq!(s.ops.reserve.calls, 1);
    assert_eq!((s.ops.create.calls, s.ops.map.calls, s.ops.set_access.calls), (3, 3, 1));
    assert_eq!(s.ops.create.ns, 3 * m.vmm.create_ns.ns(2 * MIB));
    // One cuMemSetAccess for the run, its time that of the 3 handles it covers (an H200 took
    // 127.8 ms for 25 calls over 3,600 pages: tuning/reports/gpu-nvidia-h200.md).
    assert_eq!(s.ops.set_access.ns, 3 * m.vmm.set_access_ns.ns(2 * MIB));
    vmm.quiesce().unwrap();
    vmm.unmap(base, 6 * MIB).unwrap();
    vmm.unreserve(base).unwrap();
    let s = dev.stats();
    assert_eq!((s.ops.unmap.calls, s.ops.release.calls), (3, 3));
    assert_eq!(s.ops.unmap_sync.calls, 1);
    assert_eq!(s.ops.unreserve.calls, 1);
    assert_eq!(s.driver_ns, s.ops.total_ns(), "the total is the sum of the kinds");
    assert_eq!(
        s.driver_ns,
        m.vmm.reserve_ns
            + 3 * (m.vmm.create_ns.ns(2 * MIB) + m.vmm.map_ns + m.vmm.set_access_ns.ns(2 * MIB))
            + m.vmm.unmap_sync_ns
            + 3 * (m.vmm.unmap_ns.ns(2 * MIB) + m.vmm.release_ns.ns(2 * MIB))
            + m.vmm.unreserve_ns
    );
}

/// The default model with access grant, unmap and release priced by handle size (curves shaped
/// as the H200's calibration: giving back a large handle costs more), so that a handle priced at
/// a page's size would show.
fn sized_model() -> CostModel {
    let mut m = CostModel::default();
    let curve = |small: u64, large: u64| CostCurve {
        points: vec![(ByteSize(2 * MIB), small), (ByteSize(8 * MIB), large)],
    };
    (m.vmm.set_access_ns, m.vmm.unmap_ns, m.vmm.release_ns) = (curve(30, 60), curve(20, 40), curve(10, 90));
    m
}

/// 6 MiB mapped as three 2 MiB handles and as one 6 MiB handle, then given back: a create and a
/// map per handle, one access grant for the run at the price of the handles it covers, and an
/// unmap and a release per handle, every per-handle price at its handle's size (curves as the
/// H200's calibration gives them: giving back a large handle costs more).
#[test]
fn every_handle_price_follows_the_handle_size() {
    let m = sized_model();
    for handle in [2 * MIB, 6 * MIB] {
        let dev = SimDevice::builder().capacity(GIB).cost_model(m.clone()).build();
        let vmm = dev.vmm().unwrap();
        let base = vmm.reserve(8 * MIB).unwrap();
        vmm.map_handles(base, 6 * MIB, handle).unwrap();
        let (n, ops) = (6 * MIB / handle, dev.stats().ops);
        assert_eq!((ops.create.calls, ops.map.calls, ops.set_access.calls), (n, n, 1));
        assert_eq!(ops.create.ns, n * m.vmm.create_ns.ns(handle));
        assert_eq!(
            ops.set_access.ns,
            n * m.vmm.set_access_ns.ns(handle),
            "{handle} bytes a handle"
        );
        vmm.quiesce().unwrap();
        vmm.unmap(base, 6 * MIB).unwrap();
        let ops = dev.stats().ops;
        assert_eq!((ops.unmap.calls, ops.release.calls), (n, n));
        assert_eq!(ops.unmap.ns, n * m.vmm.unmap_ns.ns(handle), "{handle} bytes a handle");
        assert_eq!(
            ops.release.ns,
            n * m.vmm.release_ns.ns(handle),
            "{handle} bytes a handle"
        );
    }
    // The prices differ by size, so the two shapes were priced apart.
    assert_ne!(m.vmm.release_ns.ns(6 * MIB), 3 * m.vmm.release_ns.ns(2 * MIB));
}

/// A 6 MiB handle moved (mapped at its new place, granted, unmapped at the old) and mapped a
/// second time, then that mapping unmapped: each one call at the handle's size, not one a page.
#[test]
fn moves_and_second_mappings_price_each_handle_at_its_size() {
    let m = sized_model();
    let dev = SimDevice::builder().capacity(GIB).cost_model(m.clone()).build();
    let vmm = dev.vmm().unwrap();
    let (a, b, c) = (
        vmm.reserve(6 * MIB).unwrap(),
        vmm.reserve(6 * MIB).unwrap(),
        vmm.reserve(6 * MIB).unwrap(),
    );
    vmm.map_handles(a, 6 * MIB, 6 * MIB).unwrap();
    let before = dev.stats().ops;
    vmm.move_handles(b, a, 6 * MIB).unwrap();
    let moved = dev.stats().ops.since(&before);
    assert_eq!((moved.map.calls, moved.set_access.calls, moved.unmap.calls), (1, 1, 1));
    assert_eq!(moved.set_access.ns, m.vmm.set_access_ns.ns(6 * MIB));
    assert_eq!(moved.unmap.ns, m.vmm.unmap_ns.ns(6 * MIB));
    assert_eq!(
        moved.create.calls + moved.release.calls,
        0,
        "a move creates and releases nothing"
    );
    let before = dev.stats().ops;
    vmm.map_alias(c, b, 6 * MIB).unwrap();
    let aliased = dev.stats().ops.since(&before);
    assert_eq!(aliased.set_access.ns, m.vmm.set_access_ns.ns(6 * MIB));
    assert_eq!(dev.used_bytes(), 6 * MIB, "a second mapping takes no memory");
    vmm.quiesce().unwrap();
    // Part of the second mapping cannot go; the whole of it is one unmap at the handle's size.
    assert!(vmm.unmap_alias(c, 2 * MIB).is_err());
    let before = dev.stats().ops;
    vmm.unmap_alias(c, 6 * MIB).unwrap();
    let unmapped = dev.stats().ops.since(&before);
    assert_eq!(
        (unmapped.unmap.calls, unmapped.unmap.ns),
        (1, m.vmm.unmap_ns.ns(6 * MIB))
    );
    vmm.unmap(b, 6 * MIB).unwrap();
    assert_eq!(dev.used_bytes(), 0);
    for base in [a, b, c] {
        vmm.unreserve(base).unwrap();
    }
}

#[test]
fn large_handles_map_cheaper_and_unmap_only_whole() {
    let dev = device(GIB);
    let vmm = dev.vmm().unwrap();
    let base = vmm.reserve(40 * MIB).unwrap();
    vmm.map_handles(base, 40 * MIB, 20 * MIB).unwrap();
    let s = dev.stats();
    assert_eq!((s.ops.create.calls, s.ops.map.calls), (2, 2));
    assert_eq!(s.ops.set_access.calls, 1, "one grant for the range");
    // Part of a handle cannot be unmapped; nothing changes.
    assert!(vmm.unmap(base, 2 * MIB).is_err());
    assert!(vmm.unmap(base + 10 * MIB, 20 * MIB).is_err());
    assert_eq!(dev.used_bytes(), 40 * MIB);
    vmm.unmap(base + 20 * MIB, 20 * MIB).unwrap();
    assert_eq!(dev.used_bytes(), 20 * MIB);
    vmm.unmap(base, 20 * MIB).unwrap();
    assert_eq!(dev.stats().ops.unmap.calls, 2);
    vmm.unreserve(base).unwrap();
    assert_eq!(dev.leak_report().blocks, 0);
    // Off the granule is refused.
    let b = vmm.reserve(8 * MIB).unwrap();
    assert!(vmm.map_handles(b, 6 * MIB, 4 * MIB).is_err());
    assert!(vmm.map_handles(b, 6 * MIB, 3 * MIB).is_err());
}

#[test]
fn a_refused_map_charges_one_create_and_changes_nothing() {
    let dev = device(4 * MIB);
    let vmm = dev.vmm().unwrap();
    let base = vmm.reserve(8 * MIB).unwrap();
    assert!(vmm.map(base, 8 * MIB).unwrap_err().is_out_of_memory());
    let s = dev.stats();
    assert_eq!((s.ops.create.calls, s.ops.map.calls, s.failed_allocs), (1, 0, 1));
    assert_eq!(dev.used_bytes(), 0);
    vmm.map(base, 4 * MIB).unwrap();
    vmm.unmap(base, 4 * MIB).unwrap();
    vmm.unreserve(base).unwrap();
}

#[test]
fn driver_allocations_go_down_the_address_range_and_frees_pay_their_synchronization() {
    let dev = device(GIB);
    let m = CostModel::default();
    let ptrs: Vec<u64> = [MIB, 4096, 3 * MIB, 512]
        .iter()
        .map(|&b| dev.allocate(b).unwrap())
        .collect();
    assert!(ptrs.windows(2).all(|w| w[1] < w[0]), "{ptrs:x?}");
    let r = dev.vmm().unwrap().reserve(4 * MIB).unwrap();
    assert!(
        ptrs.iter().all(|&p| p < r),
        "reservations lie apart from driver allocations"
    );
    for p in ptrs {
        dev.free(p).unwrap();
    }
    dev.vmm().unwrap().unreserve(r).unwrap();
    let s = dev.stats();
    assert_eq!((s.ops.alloc.calls, s.ops.free.calls, s.ops.free_sync.calls), (4, 4, 4));
    assert_eq!(s.ops.free_sync.ns, 4 * m.free_sync_ns);
    assert_eq!(
        s.ops.alloc.ns,
        [MIB, 4096, 3 * MIB, 512].iter().map(|&b| m.alloc_ns(b)).sum::<u64>()
    );
}

#[test]
fn pool_calls_mem_info_and_stream_waits_are_priced() {
    let dev = device(GIB);
    let m = CostModel::default();
    dev.charge_pool_call(PoolCall::Alloc);
    dev.charge_pool_call(PoolCall::Alloc);
    dev.charge_pool_call(PoolCall::Free);
    dev.mem_info().unwrap();
    dev.stream_wait(7, u64::MAX).unwrap();
    let s = dev.stats();
    assert_eq!((s.ops.stream_sync.calls, s.ops.stream_sync.ns), (1, m.stream_sync_ns));
    assert_eq!(s.ops.async_alloc.ns, 2 * m.async_alloc_ns);
    assert_eq!(s.ops.async_free.ns, m.async_free_ns);
    assert_eq!(s.ops.mem_info.ns, m.mem_info_ns);
    assert_eq!(
        s.driver_ns,
        2 * m.async_alloc_ns + m.async_free_ns + m.mem_info_ns + m.stream_sync_ns
    );
}

#[test]
fn the_bundled_models_parse_and_the_fast_one_differs_only_in_vmm_prices() {
    let root = env!("CARGO_MANIFEST_DIR");
    let fast = CostModel::from_file(&std::path::Path::new(root).join("tuning/cost-models/vmm-fast.toml")).unwrap();
    let def = CostModel::default();
    assert!(fast.vmm.create_ns.ns(2 * MIB) * 10 < def.vmm.create_ns.ns(2 * MIB));
    assert_eq!(
        (fast.alloc.clone(), fast.free.clone()),
        (def.alloc.clone(), def.free.clone())
    );
    assert_eq!(
        (fast.mem_info_ns, fast.free_sync_ns),
        (def.mem_info_ns, def.free_sync_ns)
    );
}
