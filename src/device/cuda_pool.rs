//! CUDA's stream-ordered pool (cuMemAllocAsync / cuMemFreeAsync on the device's default memory
//! pool), the driver calls only: the pool's release threshold is set to its maximum, so freed
//! memory stays in the pool (the driver's own caching allocator). Calls are ordered on the
//! legacy default stream. `adaptalloc-cli` replays traces through it (`gpu-bench`) and calibrates
//! the cost model's async prices with it.

use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::sys;

use super::cuda::check;
use super::{CudaDevice, DevicePtr};
use crate::error::DeviceError;

/// The device's default memory pool with its release threshold at the maximum.
pub struct CudaPool {
    cuda: Arc<CudaDevice>,
    pool: sys::CUmemoryPool,
}

// SAFETY: the pool handle is an opaque driver handle valid for the device's lifetime (the
// default pool is never destroyed); every call makes the primary context current first, and
// the pool itself is thread-safe in the driver.
unsafe impl Send for CudaPool {}
// SAFETY: as above.
unsafe impl Sync for CudaPool {}

impl CudaPool {
    /// The device's default stream-ordered pool, its release threshold at its maximum.
    pub fn new(cuda: Arc<CudaDevice>) -> Result<Self, DeviceError> {
        let _current = cuda.make_current()?;
        let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
        // SAFETY: `pool` is a valid out-pointer; the device handle comes from a live CudaDevice.
        check("cuDeviceGetDefaultMemPool", unsafe {
            sys::cuDeviceGetDefaultMemPool(&mut pool, cuda.handle())
        })?;
        let mut threshold = u64::MAX;
        // SAFETY: the release threshold attribute takes a pointer to a cuuint64_t.
        check("cuMemPoolSetAttribute", unsafe {
            sys::cuMemPoolSetAttribute(
                pool,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                (&mut threshold as *mut u64).cast(),
            )
        })?;
        Ok(CudaPool { cuda, pool })
    }

    /// One timed cuMemAllocAsync (ns) and its pointer.
    pub fn alloc_async(&self, bytes: u64) -> Result<(DevicePtr, u64), DeviceError> {
        let _current = self.cuda.make_current()?;
        let mut ptr: sys::CUdeviceptr = 0;
        let t = Instant::now();
        // SAFETY: `ptr` is a valid out-pointer; the null stream is the legacy default stream.
        let r = unsafe { sys::cuMemAllocAsync(&mut ptr, bytes as usize, std::ptr::null_mut()) };
        let ns = t.elapsed().as_nanos() as u64;
        check("cuMemAllocAsync", r)?;
        Ok((ptr, ns))
    }

    /// One timed cuMemFreeAsync (ns).
    pub fn free_async(&self, ptr: DevicePtr) -> Result<u64, DeviceError> {
        let _current = self.cuda.make_current()?;
        let t = Instant::now();
        // SAFETY: `ptr` came from cuMemAllocAsync on this pool and is freed once.
        let r = unsafe { sys::cuMemFreeAsync(ptr, std::ptr::null_mut()) };
        let ns = t.elapsed().as_nanos() as u64;
        check("cuMemFreeAsync", r)?;
        Ok(ns)
    }

    /// Waits for the stream-ordered frees to complete.
    pub fn synchronize(&self) -> Result<(), DeviceError> {
        let _current = self.cuda.make_current()?;
        // SAFETY: the null stream is always valid.
        check("cuStreamSynchronize", unsafe {
            sys::cuStreamSynchronize(std::ptr::null_mut())
        })
    }

    /// The most memory the pool has held (CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH).
    pub fn reserved_high(&self) -> Result<u64, DeviceError> {
        let mut v = 0u64;
        // SAFETY: this attribute writes a cuuint64_t.
        check("cuMemPoolGetAttribute", unsafe {
            sys::cuMemPoolGetAttribute(
                self.pool,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH,
                (&mut v as *mut u64).cast(),
            )
        })?;
        Ok(v)
    }

    /// Gives the pool's idle memory back to the driver.
    pub fn trim(&self) -> Result<(), DeviceError> {
        self.synchronize()?;
        // SAFETY: the pool is the device's default pool, valid while the device lives.
        check("cuMemPoolTrimTo", unsafe { sys::cuMemPoolTrimTo(self.pool, 0) })
    }

    /// The device this pool allocates on.
    pub fn cuda(&self) -> &Arc<CudaDevice> {
        &self.cuda
    }

    /// Restarts [`reserved_high`](Self::reserved_high) from the pool's current size.
    pub fn reset_reserved_high(&self) -> Result<(), DeviceError> {
        let mut zero = 0u64;
        // SAFETY: resetting the high watermark takes a pointer to a zero cuuint64_t.
        let r = unsafe {
            sys::cuMemPoolSetAttribute(
                self.pool,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH,
                (&mut zero as *mut u64).cast(),
            )
        };
        check("cuMemPoolSetAttribute", r)
    }
}
