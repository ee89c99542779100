//! Device memory from adaptalloc as cudarc [`CudaSlice`]s, so candle and cudarc users can launch
//! kernels on it. The slice is built with `CudaStream::upgrade_device_ptr` and leaked back
//! before cudarc would free it: the memory always returns to the allocator, never to cuMemFree.

use std::mem::ManuallyDrop;
use std::ops::{Deref, DerefMut};
use std::sync::Arc;

use cudarc::driver::{CudaSlice, CudaStream, DeviceRepr};

use crate::allocator::Allocator;
use crate::error::AllocError;
use crate::strategy::StreamId;

/// The allocator's stream id for a cudarc stream: the `CUstream` handle's value.
pub fn stream_id(stream: &CudaStream) -> StreamId {
    stream.cu_stream() as usize as StreamId
}

/// A `CudaSlice<T>` whose memory belongs to an adaptalloc [`Allocator`]. Derefs to the slice;
/// dropping it returns the memory to the allocator on the slice's stream.
#[derive(Debug)]
pub struct AdaptSlice<T> {
    slice: ManuallyDrop<CudaSlice<T>>,
    alloc: Allocator,
    stream: StreamId,
}

impl<T: DeviceRepr> AdaptSlice<T> {
    /// `len` elements of `T` on `stream`, uninitialized (zero them with `memset_zeros` before
    /// reading). Errors as [`Allocator::allocate_raw`].
    pub fn new(alloc: &Allocator, stream: &Arc<CudaStream>, len: usize) -> Result<Self, AllocError> {
        let bytes = (len.max(1) * std::mem::size_of::<T>().max(1)) as u64;
        let sid = stream_id(stream);
        let ptr = alloc.allocate_raw(bytes, sid)?;
        // SAFETY: `ptr` is a live allocation of at least `len * size_of::<T>()` bytes on this
        // stream's device, owned by us until Drop leaks the slice back and frees it; the
        // contents are uninitialized, as the type's docs say.
        let slice = unsafe { stream.upgrade_device_ptr::<T>(ptr, len) };
        Ok(AdaptSlice {
            slice: ManuallyDrop::new(slice),
            alloc: alloc.clone(),
            stream: sid,
        })
    }
}

impl<T> Deref for AdaptSlice<T> {
    type Target = CudaSlice<T>;
    fn deref(&self) -> &CudaSlice<T> {
        &self.slice
    }
}

impl<T> DerefMut for AdaptSlice<T> {
    fn deref_mut(&mut self) -> &mut CudaSlice<T> {
        &mut self.slice
    }
}

impl<T> Drop for AdaptSlice<T> {
    fn drop(&mut self) {
        // SAFETY: the slice is taken exactly once, here, and never used again.
        let slice = unsafe { ManuallyDrop::take(&mut self.slice) };
        // leak() hands the pointer back without cuMemFree; the allocator frees it its own way.
        let ptr = slice.leak();
        if let Err(e) = self.alloc.deallocate(ptr, self.stream) {
            tracing::error!(ptr, error = %e, "returning a cudarc slice to adaptalloc failed");
        }
    }
}
