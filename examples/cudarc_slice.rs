//! Allocating cudarc `CudaSlice`s from adaptalloc and using them with cudarc's own API.
//! Needs a CUDA GPU; without one it says so and exits.
//!
//! `cargo run --release --example cudarc_slice`

use std::sync::Arc;

use adaptalloc::cudarc_ext::AdaptSlice;
use adaptalloc::{Allocator, CudaDevice, Device};
use cudarc::driver::CudaContext;

fn main() -> anyhow::Result<()> {
    let device = match CudaDevice::new(0) {
        Ok(d) => d,
        Err(e) => {
            println!("skipped: {e}");
            return Ok(());
        }
    };
    let alloc = Allocator::adaptive(Arc::new(device) as Arc<dyn Device>);
    let ctx = CudaContext::new(0)?;
    let stream = ctx.default_stream();
    for step in 0..100 {
        // Activations of varying length, as a model with dynamic shapes makes them.
        let n = 1 << (10 + step % 8);
        let mut x: AdaptSlice<f32> = AdaptSlice::new(&alloc, &stream, n)?;
        stream.memset_zeros(&mut *x)?;
        let host: Vec<f32> = (0..n).map(|i| i as f32).collect();
        stream.memcpy_htod(&host, &mut *x)?;
        let back = stream.clone_dtoh(&*x)?;
        assert_eq!(back, host);
    } // each slice goes back to adaptalloc here, not to cuMemFree
    stream.synchronize()?;
    let stats = alloc.stats();
    println!(
        "100 steps: {} driver allocations for {} requests; peak reserved {}",
        stats.driver_allocs,
        stats.live_blocks.total,
        adaptalloc::size::ByteSize(stats.reserved_bytes.peak)
    );
    Ok(())
}
