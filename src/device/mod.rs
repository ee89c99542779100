//! Devices: the only code that obtains memory.
//!
//! [`SimDevice`] is a simulated GPU (capacity, granularity, cost model, co-tenants, faults) that
//! carries the tests and benchmarks; [`CudaDevice`] is the CUDA driver through cudarc.

mod cost;
// The only module of the library (with the C ABI) that needs unsafe: FFI to the CUDA driver.
#[allow(unsafe_code)]
mod cuda;
// Virtual memory management on CUDA (FFI as above).
#[allow(unsafe_code)]
mod cuda_vmm;
// Splitting a larger handle into pages: device copies (FFI as above).
#[allow(unsafe_code)]
mod cuda_split;
// Timing the virtual-memory calls for gpu-bench's calibration (FFI as above).
#[allow(unsafe_code)]
mod cuda_calibrate;
// CUDA's stream-ordered pool, its driver calls (FFI as above).
#[allow(unsafe_code)]
mod cuda_pool;
// Stream completion on CUDA: checkpoint events (FFI as above).
#[allow(unsafe_code)]
mod cuda_streams;
mod metered;
mod ops;
mod sim;
mod sim_capture;

pub use cost::{CostCurve, CostModel, VmmCosts};
pub use cuda::CudaDevice;
pub use cuda_calibrate::VmmTimings;
pub use cuda_pool::CudaPool;
pub(crate) use metered::Metered;
pub use ops::{DriverOps, OpTally, PoolCall};
pub use sim::{FaultPlan, Granularity, LeakReport, SimDevice, SimDeviceBuilder, TenantAction};

use crate::error::DeviceError;

/// A device address, as `CUdeviceptr` is: an integer the host never dereferences.
pub type DevicePtr = u64;

/// Free and total bytes of the device, as `cuMemGetInfo` reports them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct MemInfo {
    /// Free bytes.
    pub free: u64,
    /// Bytes in all.
    pub total: u64,
}

/// What a device has done: driver calls, bytes, and time spent in the driver.
#[non_exhaustive]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct DeviceStats {
    /// Successful driver allocations: cuMemAlloc calls, and calls that map handles (a run of
    /// handles mapped at once counts one). Physical allocations handle by handle are
    /// `ops.physical_allocs()`; one allocator's own, `Stats::driver_allocs`.
    pub driver_allocs: u64,
    /// Driver frees: cuMemFree calls, and calls that unmap handles, counted as `driver_allocs`
    /// is (physical frees: `ops.physical_frees()`).
    pub driver_frees: u64,
    /// Driver allocations that failed (out of memory or injected).
    pub failed_allocs: u64,
    /// `mem_info` calls.
    pub mem_info_calls: u64,
    /// Bytes currently held from the driver, as the caller asked for them.
    pub allocated_bytes: u64,
    /// Time spent in the driver: modelled on SimDevice, measured on CudaDevice; the sum of
    /// `ops` (devices fill it from there in `stats()`).
    pub driver_ns: u64,
    /// The same calls and time by kind of operation. On CudaDevice each call is timed as it
    /// is made (a cuMemFree's synchronization falls under `free`; the async kinds are timed by
    /// `CudaPool` itself), and the kinds add up to `driver_ns`.
    pub ops: DriverOps,
}

/// Page-granular virtual memory, as CUDA's cuMemAddressReserve / cuMemCreate / cuMemMap /
/// cuMemUnmap give it: address space costs nothing, and physical memory is mapped into it and
/// given back a page at a time. Mapping counts as a driver allocation, unmapping as a free.
pub trait VirtualMemory: Send + Sync {
    /// The mapping granule (2 MiB on CUDA).
    fn page_size(&self) -> u64;
    /// Reserves `bytes` (a page multiple) of address space; consumes no memory.
    fn reserve(&self, bytes: u64) -> Result<DevicePtr, DeviceError>;
    /// Gives back a reserved range; every page in it must be unmapped.
    fn unreserve(&self, ptr: DevicePtr) -> Result<(), DeviceError>;
    /// Backs `ptr..ptr+bytes` (page-aligned, inside a reservation) with physical memory.
    fn map(&self, ptr: DevicePtr, bytes: u64) -> Result<(), DeviceError>;
    /// Backs `ptr..ptr+bytes` (page-aligned, inside a reservation, unmapped) with physical
    /// handles of `handle` bytes each (a page multiple dividing `bytes`), with one access grant
    /// for the whole range, as PyTorch's expandable segments map: larger handles are cheaper to
    /// map (the driver's cost goes with the number of handles) but can only be unmapped whole.
    /// The default maps page by page, as [`map`](VirtualMemory::map).
    fn map_handles(&self, ptr: DevicePtr, bytes: u64, handle: u64) -> Result<(), DeviceError> {
        let _ = handle;
        self.map(ptr, bytes)
    }
    /// Returns the physical memory behind `ptr..ptr+bytes` to the device; the range holds
    /// whole mappings (every page mapped by [`map`](VirtualMemory::map), or whole handles
    /// mapped by [`map_handles`](VirtualMemory::map_handles)).
    fn unmap(&self, ptr: DevicePtr, bytes: u64) -> Result<(), DeviceError>;
    /// The physical handles mapped at `ptr..ptr+bytes` (whole mappings, first or second ones):
    /// what unmapping the range gives back, one `cuMemRelease` each. The default, for a device
    /// that maps page by page: one per page.
    fn handles_in(&self, ptr: DevicePtr, bytes: u64) -> u64 {
        let _ = ptr;
        bytes.div_ceil(self.page_size().max(1))
    }
    /// Maps the physical handles already mapped at `src..src+bytes` (whole handles: pages, or
    /// one larger handle) a second time, at `ptr..ptr+bytes` (page-aligned, inside a
    /// reservation, unmapped): both ranges then show the same memory, and no memory is
    /// consumed. CUDA: cuMemRetainAllocationHandle on `src`, then cuMemMap. The suballocator
    /// uses it to splice the free end of a held handle onto a new block on out-of-memory.
    fn map_alias(&self, ptr: DevicePtr, src: DevicePtr, bytes: u64) -> Result<(), DeviceError>;
    /// Undoes [`map_alias`](VirtualMemory::map_alias) at `ptr..ptr+bytes`; the memory stays
    /// mapped where it was first.
    fn unmap_alias(&self, ptr: DevicePtr, bytes: u64) -> Result<(), DeviceError>;
    /// Moves the physical handles mapped at `src..src+bytes` (whole handles, first mappings
    /// with no second one) to `ptr..ptr+bytes` (page-aligned, inside a reservation, unmapped):
    /// they are mapped there and unmapped at `src`, as if first mapped at `ptr`. No memory is
    /// created or given back: a handle recycled costs a map, an access grant and an unmap
    /// instead of an unmap, a release, a create and a map. Failure changes nothing. The caller
    /// quiesces first (the memory at `src` may still be used by queued work). CUDA:
    /// cuMemRetainAllocationHandle on `src`, cuMemMap, cuMemSetAccess, cuMemUnmap of `src`.
    fn move_handles(&self, ptr: DevicePtr, src: DevicePtr, bytes: u64) -> Result<(), DeviceError>;
    /// Splits the handle of more than a page mapped whole at `ptr..ptr+bytes` (a first mapping
    /// with no second one) into pages: the page at each offset of `keep` (page-aligned,
    /// ascending, inside the range) is backed by a new handle of one page holding what the old
    /// handle held there, copied on the device, and the other pages are left unmapped, their
    /// memory given back. It needs a page free for each page kept while it runs. The caller
    /// quiesces first (queued work may still use the pages kept). Failure before the old
    /// handle is unmapped changes nothing. The suballocator uses it on out-of-memory, where a
    /// few live blocks would otherwise strand a large handle's idle memory. CUDA: a scratch
    /// reservation, cuMemCreate, cuMemMap and cuMemSetAccess of the new pages there,
    /// cuMemcpyDtoD of each page kept, cuCtxSynchronize, cuMemUnmap of the handle (its memory
    /// goes back), each new page moved to its place (as [`move_handles`](VirtualMemory::move_handles)),
    /// cuMemAddressFree of the scratch range.
    fn split_handle(&self, ptr: DevicePtr, bytes: u64, keep: &[u64]) -> Result<(), DeviceError>;
    /// Waits until no queued work can touch memory about to be unmapped. Unmapping is not
    /// stream-ordered (CUDA's cuMemUnmap neither waits for kernels nor is queued behind them:
    /// unmapping pages a kernel still uses is an illegal memory access), so callers quiesce once
    /// before a batch of [`unmap`](VirtualMemory::unmap)s and
    /// [`unmap_alias`](VirtualMemory::unmap_alias)es of memory that held blocks. CUDA:
    /// cuCtxSynchronize. The default, for a device with no queued work, returns at once.
    fn quiesce(&self) -> Result<(), DeviceError> {
        Ok(())
    }
}

/// A source of device memory. Implementations are thread-safe; every method may be called
/// concurrently. Pointers are at least [`alignment`](Device::alignment)-aligned and never overlap.
pub trait Device: Send + Sync + std::fmt::Debug {
    /// Obtains `bytes` bytes (> 0) from the driver.
    fn allocate(&self, bytes: u64) -> Result<DevicePtr, DeviceError>;
    /// Returns a pointer obtained from [`allocate`](Device::allocate). On a real GPU this
    /// synchronizes the device.
    fn free(&self, ptr: DevicePtr) -> Result<(), DeviceError>;
    /// Free and total memory now. Not free of cost: callers sample it at a bounded rate.
    fn mem_info(&self) -> Result<MemInfo, DeviceError>;
    /// The alignment of every pointer returned (256 on CUDA).
    fn alignment(&self) -> u64 {
        crate::size::ALIGNMENT
    }
    /// The unit in which large driver allocations consume memory (2 MiB on CUDA).
    fn granularity(&self) -> u64;
    /// How driver allocations consume memory. Default, as the CUDA driver does: from 1 MiB,
    /// whole granules (2 MiB pages); below, 512-byte steps in shared pages.
    fn footprint_model(&self) -> Granularity {
        Granularity {
            large_threshold: crate::size::MIB,
            large_granule: self.granularity(),
            small_granule: 512,
        }
    }
    /// Device memory a driver allocation of `bytes` really consumes
    /// ([`footprint_model`](Device::footprint_model)).
    fn footprint(&self, bytes: u64) -> u64 {
        self.footprint_model().consumed(bytes)
    }
    /// Virtual memory management, where the device has it: reserve address ranges and map or
    /// unmap physical pages in them. None (the default) means whole allocations only.
    fn vmm(&self) -> Option<&dyn VirtualMemory> {
        None
    }
    /// Whether `stream`'s work up to the allocator's last free on it has completed, so that
    /// memory freed on it may serve other streams (CUDA: the event of a
    /// [`stream_checkpoint`](Device::stream_checkpoint) that covers the free, else
    /// `cuStreamQuery` on the whole stream). Never waits. `freed_at` is the allocator's
    /// operation count at its last free on the stream and `now` the current one:
    /// [`SimDevice`] models in-flight work as completing a set number of operations after it
    /// was queued. The default, for a device that cannot tell, is false: memory freed on a
    /// stream then waits for [`stream_wait`](Device::stream_wait) or the caller's
    /// `synchronize_stream`.
    fn stream_done(&self, stream: crate::strategy::StreamId, freed_at: u64, now: u64) -> bool {
        let _ = (stream, freed_at, now);
        false
    }
    /// The allocator has stopped freeing on `stream` for now (it frees on another one) and its
    /// last free there was at operation `op`: a device that can marks the stream's position
    /// now (CUDA: an event recorded on it), so that [`stream_done`](Device::stream_done) and
    /// [`stream_wait`](Device::stream_wait) can answer for the work up to that
    /// free rather than for everything queued on the stream since. Called on the free path's
    /// cold branch (a change of stream) and for streams recorded on a freed block. The
    /// default does nothing.
    fn stream_checkpoint(&self, stream: crate::strategy::StreamId, op: u64) {
        let _ = (stream, op);
    }
    /// Waits until `stream`'s work up to the allocator's free at operation `freed_at` has
    /// completed (`u64::MAX`: all work queued on it): on CUDA, on the event of a
    /// [`stream_checkpoint`](Device::stream_checkpoint) at or after that free where there is
    /// one (`cuEventSynchronize`), else on the whole stream (`cuStreamSynchronize`). The
    /// default, for a device with no queued work, returns at once.
    fn stream_wait(&self, stream: crate::strategy::StreamId, freed_at: u64) -> Result<(), DeviceError> {
        let _ = (stream, freed_at);
        Ok(())
    }
    /// A stream-ordered pool (cudaMallocAsync) served `call` from memory it holds: a modelled
    /// device charges its price; a real one (the default) does nothing, as the pool's own
    /// calls are timed where they are made.
    fn charge_pool_call(&self, call: PoolCall) {
        let _ = call;
    }
    /// The CUDA device ordinal whose memory this device hands out; None for a device that is
    /// not a CUDA device (a simulated one).
    fn cuda_ordinal(&self) -> Option<i32> {
        None
    }
    /// What this device has done so far.
    fn stats(&self) -> DeviceStats;
    /// A short human name ("SimDevice 16GiB", "NVIDIA H200").
    fn name(&self) -> String;
}

/// Whether `keep`, the pages a [`VirtualMemory::split_handle`] of `bytes` keeps, is valid:
/// page offsets, ascending, inside the handle.
pub(crate) fn pages_to_keep(keep: &[u64], page: u64, bytes: u64) -> bool {
    keep.windows(2).all(|w| w[0] < w[1]) && keep.iter().all(|&o| o % page == 0 && o < bytes)
}

/// Runs of consecutive pages in `keep` (ascending page offsets): (index of the first, bytes).
pub(crate) fn page_runs(keep: &[u64], page: u64) -> impl Iterator<Item = (usize, u64)> + '_ {
    let mut j = 0;
    std::iter::from_fn(move || {
        if j >= keep.len() {
            return None;
        }
        let start = j;
        j += 1;
        while j < keep.len() && keep[j] == keep[j - 1] + page {
            j += 1;
        }
        Some((start, (j - start) as u64 * page))
    })
}
