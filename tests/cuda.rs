//! CudaDevice on a real GPU. Skips with a printed reason where no CUDA driver is present.

use std::sync::Arc;

use adaptalloc::device::Device;
use adaptalloc::{Allocator, CudaDevice, DeviceError, StrategyKind};

/// Prints past the harness's capture so a plain `cargo test` shows why a test did nothing.
fn skip(reason: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "SKIPPED: {reason}");
}

fn device() -> Option<CudaDevice> {
    match CudaDevice::new(0) {
        Ok(d) => Some(d),
        Err(e) => {
            skip(&format!("CUDA test needs a GPU: {e}"));
            None
        }
    }
}

#[test]
fn no_driver_is_a_clear_error_not_a_panic() {
    if CudaDevice::driver_present() {
        skip("a CUDA driver is present; this test checks the no-driver path");
        return;
    }
    match CudaDevice::new(0) {
        Err(DeviceError::NoDriver { .. }) => {}
        other => panic!("expected NoDriver, got {other:?}"),
    }
    let msg = CudaDevice::new(0).unwrap_err().to_string();
    assert!(msg.contains("no CUDA driver found"), "{msg}");
}

#[test]
fn allocates_frees_and_reports_memory_on_a_gpu() {
    let Some(dev) = device() else { return };
    let info = dev.mem_info().unwrap();
    assert!(info.total > 0 && info.free <= info.total);
    let p = dev.allocate(1 << 20).unwrap();
    assert_eq!(p % 256, 0);
    dev.free(p).unwrap();
    assert_eq!(dev.stats().driver_allocs, 1);
}

#[test]
fn every_strategy_runs_on_a_gpu() {
    let Some(dev) = device() else { return };
    let dev: Arc<dyn Device> = Arc::new(dev);
    for kind in StrategyKind::ALL {
        let alloc = Allocator::with_strategy(dev.clone(), kind);
        let blocks: Vec<_> = (0..64).map(|i| alloc.allocate((i + 1) * 4096, 0).unwrap()).collect();
        drop(blocks);
        let again = alloc.allocate(4096, 0).unwrap();
        assert_eq!(again.ptr() % 256, 0);
    }
}

#[test]
fn out_of_memory_on_a_gpu_is_a_typed_error() {
    let Some(dev) = device() else { return };
    let total = dev.mem_info().unwrap().total;
    match dev.allocate(total) {
        Err(e) => assert!(e.is_out_of_memory(), "{e:?}"),
        Ok(p) => {
            dev.free(p).unwrap();
            panic!("allocating the whole device should fail");
        }
    }
}
