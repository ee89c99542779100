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
    /// reading). Errors as [`Allocator::allocate_raw`], and [`AllocError::WrongDevice`] when the
    /// allocator's device is not the stream's CUDA device, [`AllocError::SizeOverflow`] when
    /// `len` elements do not fit in a 64-bit size.
    pub fn new(alloc: &Allocator, stream: &Arc<CudaStream>, len: usize) -> Result<Self, AllocError> {
        let stream_device = stream.context().ordinal() as u64;
        let device = alloc.device();
        if device.cuda_ordinal().and_then(|o| u64::try_from(o).ok()) != Some(stream_device) {
            return Err(AllocError::WrongDevice {
                allocator: device.name(),
                stream_device,
            });
        }
        let bytes = slice_bytes(len, std::mem::size_of::<T>())?;
        let sid = stream_id(stream);
        let ptr = alloc.allocate_raw(bytes, sid)?;
        // SAFETY: `ptr` is a live allocation of at least `len * size_of::<T>()` bytes (checked
        // above, no overflow) from this allocator, whose device is the stream's CUDA device
        // (checked above); it is ours until Drop leaks the slice back and frees it; the contents
        // are uninitialized, as the type's docs say.
        let slice = unsafe { stream.upgrade_device_ptr::<T>(ptr, len) };
        Ok(AdaptSlice {
            slice: ManuallyDrop::new(slice),
            alloc: alloc.clone(),
            stream: sid,
        })
    }
}

/// Bytes of `len` elements of `elem` bytes (at least 1: a zero-size slice still takes a block).
fn slice_bytes(len: usize, elem: usize) -> Result<u64, AllocError> {
    let (len, elem) = (len.max(1) as u64, elem.max(1) as u64);
    len.checked_mul(elem)
        .ok_or(AllocError::SizeOverflow { len, elem_bytes: elem })
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_checked_for_overflow() {
        assert_eq!(slice_bytes(0, 4).unwrap(), 4);
        assert_eq!(slice_bytes(1 << 20, 4).unwrap(), 4 << 20);
        assert!(matches!(
            slice_bytes(usize::MAX, 8),
            Err(AllocError::SizeOverflow { elem_bytes: 8, .. })
        ));
    }
}
