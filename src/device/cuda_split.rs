//! Splitting a larger handle into pages on CUDA ([`VirtualMemory::split_handle`]): the pages
//! live blocks keep are copied into page handles of their own, mapped at the same addresses,
//! and the handle goes back.
//!
//! Two ways, the first where the device has room for the pages kept beside the handle:
//! - **On the device**: the new pages are created and mapped in a scratch reservation, each
//!   kept page copied there (cuMemcpyDtoD), the copies waited for, the handle unmapped (its
//!   memory goes back), each run of new pages moved to its place (as `move_handles`: retained,
//!   mapped, granted, unmapped from the scratch range) and the scratch range given back. Any
//!   failure before the handle is unmapped changes nothing.
//! - **Through host memory**, where the device has no room: the kept pages are copied to a
//!   host buffer (cuMemcpyDtoH), the handle unmapped, new pages mapped at the kept pages'
//!   addresses, and the contents copied back (cuMemcpyHtoD). The buffer is taken with
//!   `try_reserve`, so a host without the memory refuses the split instead of aborting. If the
//!   new pages cannot be created once the handle is gone (another process took the memory in
//!   between), the handle is created again whole and every kept page copied back; only if
//!   that fails too are the kept pages' contents lost, and the error says so.
//!
//! The caller has waited for queued work (`quiesce`): the copies read live blocks. A program
//! that queues work from another thread while an allocation fails could see that work race
//! the copy; the allocator splits only on that failure path.

use cudarc::driver::sys;

use super::cuda::check;
use super::{CudaDevice, DevicePtr, VirtualMemory, page_runs, pages_to_keep};
use crate::error::DeviceError;

impl CudaDevice {
    /// [`VirtualMemory::split_handle`] (module doc).
    pub(super) fn split(&self, ptr: DevicePtr, bytes: u64, keep: &[u64]) -> Result<(), DeviceError> {
        let page = self.page();
        if bytes <= page || self.handle_at(ptr) != bytes || !pages_to_keep(keep, page, bytes) {
            return Err(DeviceError::UnknownPointer { ptr });
        }
        let kept = keep.len() as u64 * page;
        if kept == 0 {
            return self.unmap_range(ptr, bytes, true);
        }
        let sc = self.reserve(kept)?;
        match self.map_range(sc, None, kept, page) {
            Ok(()) => {}
            Err(e) if e.is_out_of_memory() => {
                let _ = self.unreserve(sc);
                return self.split_through_host(ptr, bytes, keep);
            }
            Err(e) => {
                let _ = self.unreserve(sc);
                return Err(e);
            }
        }
        let copied = keep
            .iter()
            .enumerate()
            .try_for_each(|(j, &o)| self.copy_dtod(sc + j as u64 * page, ptr + o, page))
            .and_then(|()| self.synchronize());
        // The handle goes, and its memory with it (no other reference is held: cuda_vmm's doc).
        if let Err(e) = copied.and_then(|()| self.unmap_range(ptr, bytes, true)) {
            let _ = self.unmap_range(sc, kept, true);
            let _ = self.unreserve(sc);
            return Err(e);
        }
        for (j, len) in page_runs(keep, page) {
            let at = ptr + keep[j];
            if let Err(e) = self.move_handles(at, sc + j as u64 * page, len) {
                // The copies stay mapped in the scratch range, and the blocks on these pages
                // have lost their memory. Not expected: the addresses were mapped a moment ago.
                tracing::error!(ptr = at, error = %e, "a split handle's page could not be mapped back");
                return Err(e);
            }
        }
        self.unreserve(sc)
    }

    /// The host-memory way of [`split`](Self::split) (module doc).
    fn split_through_host(&self, ptr: DevicePtr, bytes: u64, keep: &[u64]) -> Result<(), DeviceError> {
        let page = self.page();
        let len = keep.len() * page as usize;
        let mut buf: Vec<u8> = Vec::new();
        if buf.try_reserve_exact(len).is_err() {
            return Err(DeviceError::Driver {
                call: "split_handle",
                code: format!("no host memory for {len} bytes of pages to copy out"),
            });
        }
        buf.resize(len, 0);
        for (j, &o) in keep.iter().enumerate() {
            let chunk = &mut buf[j * page as usize..(j + 1) * page as usize];
            self.copy_dtoh(chunk, ptr + o)?;
        }
        self.unmap_range(ptr, bytes, true)?;
        let mapped = page_runs(keep, page).try_fold(Vec::new(), |mut done, (j, len)| {
            match self.map_range(ptr + keep[j], None, len, page) {
                Ok(()) => {
                    done.push((j, len));
                    Ok(done)
                }
                Err(e) => {
                    for &(j, len) in &done {
                        let _ = self.unmap_range(ptr + keep[j], len, true);
                    }
                    Err(e)
                }
            }
        });
        if let Err(e) = mapped {
            // The memory just given back was taken: the handle again, whole, if it can be.
            tracing::warn!(ptr, error = %e, "pages for a split handle refused; mapping it whole again");
            self.map_range(ptr, None, bytes, bytes)
                .map_err(|again| DeviceError::Driver {
                    call: "split_handle",
                    code: format!(
                        "the contents of {} pages at {ptr:#x} were lost: new pages were refused ({e}), \
                     and so was the handle again ({again})",
                        keep.len()
                    ),
                })?;
        }
        for (j, &o) in keep.iter().enumerate() {
            self.copy_htod(ptr + o, &buf[j * page as usize..(j + 1) * page as usize])?;
        }
        // A copy from pageable memory may still be on its way to the device when the call
        // returns; work queued next on a non-blocking stream is not ordered after it.
        self.synchronize()
    }

    /// Copies `bytes` from device address `src` to `dst` (both mapped, read-write), timed as a
    /// `copy`.
    fn copy_dtod(&self, dst: DevicePtr, src: DevicePtr, bytes: u64) -> Result<(), DeviceError> {
        let _current = self.make_current()?;
        // SAFETY: `src..src+bytes` and `dst..dst+bytes` are mapped ranges of ours with
        // read-write access (the callers map them); the call takes no host pointers.
        check(
            "cuMemcpyDtoD_v2",
            self.timed(
                |t| &mut t.copy,
                || unsafe { sys::cuMemcpyDtoD_v2(dst, src, bytes as usize) },
            ),
        )
    }

    /// Copies device memory at `src` (mapped, read-write) into `dst`, timed as a `copy`.
    fn copy_dtoh(&self, dst: &mut [u8], src: DevicePtr) -> Result<(), DeviceError> {
        let _current = self.make_current()?;
        // SAFETY: `dst` is a live, writable host buffer of `dst.len()` bytes that nothing else
        // touches during the call, and `src..src+dst.len()` a mapped range of ours; pageable
        // host memory makes the copy synchronous, so the buffer is done with on return.
        check(
            "cuMemcpyDtoH_v2",
            self.timed(
                |t| &mut t.copy,
                || unsafe { sys::cuMemcpyDtoH_v2(dst.as_mut_ptr().cast(), src, dst.len()) },
            ),
        )
    }

    /// Copies `src` into device memory at `dst` (mapped, read-write), timed as a `copy`.
    fn copy_htod(&self, dst: DevicePtr, src: &[u8]) -> Result<(), DeviceError> {
        let _current = self.make_current()?;
        // SAFETY: `src` is a live host buffer of `src.len()` bytes, read only, and
        // `dst..dst+src.len()` a mapped range of ours; the copy from pageable memory has read
        // the buffer by the time the call returns.
        check(
            "cuMemcpyHtoD_v2",
            self.timed(
                |t| &mut t.copy,
                || unsafe { sys::cuMemcpyHtoD_v2(dst, src.as_ptr().cast(), src.len()) },
            ),
        )
    }

    /// Waits for the device's queued work (the copies), timed as `unmap_sync`: the memory they
    /// read is unmapped next, or the memory they write is handed back to the caller's work.
    fn synchronize(&self) -> Result<(), DeviceError> {
        let _current = self.make_current()?;
        // SAFETY: the device's context is current on this thread; the call takes no pointers.
        check(
            "cuCtxSynchronize",
            self.timed(|t| &mut t.unmap_sync, || unsafe { sys::cuCtxSynchronize() }),
        )
    }
}
