//! Passthrough: every request is a driver allocation, every free a driver free.

use super::{BlockMeta, Grant};
use crate::device::{Device, DevicePtr};
use crate::error::DeviceError;

/// The passthrough strategy: every request a driver allocation, every free a driver free.
#[derive(Debug, Default)]
pub struct Passthrough {
    reserved: u64,
}

impl Passthrough {
    /// A strategy holding nothing.
    pub fn new() -> Self {
        Self::default()
    }

    pub(super) fn allocate(&mut self, dev: &dyn Device, bytes: u64) -> Result<Grant, DeviceError> {
        let ptr = dev.allocate(bytes)?;
        self.reserved += bytes;
        Ok(Grant {
            ptr,
            block_bytes: bytes,
            hit: false,
            meta: BlockMeta::Direct,
        })
    }

    pub(super) fn deallocate(&mut self, dev: &dyn Device, ptr: DevicePtr, bytes: u64) {
        self.reserved -= bytes;
        if let Err(e) = dev.free(ptr) {
            tracing::error!(ptr, error = %e, "driver free failed; block forgotten");
        }
    }

    pub(super) fn reserved_bytes(&self) -> u64 {
        self.reserved
    }
}
