//! Typed errors. Each message says what happened and how to fix it; out-of-memory errors say
//! whether waiting or releasing memory could help (`is_transient`).

use thiserror::Error;

use crate::size::ByteSize;

/// An error from a [`Device`](crate::device::Device): the only code that obtains memory.
#[derive(Debug, Clone, Error, PartialEq, Eq)]
pub enum DeviceError {
    /// The device refused an allocation because it has too little free memory right now.
    #[error(
        "the device is out of memory: asked for {requested}, {free} of {total} free; \
         free memory or lower the request"
    )]
    OutOfMemory {
        requested: ByteSize,
        free: ByteSize,
        total: ByteSize,
    },

    /// A fault injected by a test (SimDevice), reported like a driver out-of-memory.
    #[error("injected driver failure on driver allocation #{nth} (asked for {requested}); this is a test fault")]
    InjectedFault { requested: ByteSize, nth: u64 },

    /// No CUDA driver library could be loaded on this machine.
    #[error("no CUDA driver found ({reason}); install the NVIDIA driver or use SimDevice")]
    NoDriver { reason: String },

    /// A driver call returned an error code.
    #[error("CUDA driver call {call} failed with {code}; check the device ordinal and driver state")]
    Driver { call: &'static str, code: String },

    /// The device was asked to free a pointer it did not hand out.
    #[error("device pointer {ptr:#x} was not allocated by this device (or was freed already)")]
    UnknownPointer { ptr: u64 },
}

impl DeviceError {
    /// True when the same request may succeed later (memory may be freed meanwhile).
    pub fn is_out_of_memory(&self) -> bool {
        matches!(
            self,
            DeviceError::OutOfMemory { .. } | DeviceError::InjectedFault { .. }
        )
    }
}

/// An error from the public [`Allocator`](crate::Allocator).
#[derive(Debug, Clone, Error, PartialEq, Eq)]
pub enum AllocError {
    #[error("zero-byte allocation requested; ask for at least 1 byte")]
    ZeroSize,

    /// Permanent: the request can never fit on this device.
    #[error("request of {requested} can never fit: the device has {capacity} in total")]
    TooLarge { requested: ByteSize, capacity: ByteSize },

    /// Transient: the device is full right now. Freeing memory (or, for other tenants, waiting)
    /// may let the same request succeed.
    #[error(
        "out of memory: asked for {requested}; this allocator holds {live} live, {reserved} \
         reserved, {idle} idle (released before failing), largest free block {largest_free}; \
         device has {device_free} free of {device_total}. Free tensors, lower the batch, or give \
         a policy with a smaller cache. Cause: {cause}"
    )]
    OutOfMemory {
        requested: ByteSize,
        live: ByteSize,
        reserved: ByteSize,
        idle: ByteSize,
        largest_free: ByteSize,
        device_free: ByteSize,
        device_total: ByteSize,
        /// The device's refusal. Shown in the message, and not a `source()`: an error chain
        /// printed cause by cause would show it twice.
        cause: DeviceError,
    },

    #[error("pointer {ptr:#x} is not a live allocation of this allocator (never allocated here, or already freed)")]
    UnknownPointer { ptr: u64 },

    #[error(
        "pointer {ptr:#x} was allocated on stream {allocated_on} but freed on stream {freed_on}; free it on the stream it was allocated on"
    )]
    StreamMismatch { ptr: u64, allocated_on: u64, freed_on: u64 },

    /// A request whose size in bytes does not fit in 64 bits (`len` elements of `elem_bytes`).
    #[error("{len} elements of {elem_bytes} bytes overflow a 64-bit size; ask for fewer")]
    SizeOverflow { len: u64, elem_bytes: u64 },

    /// Memory of an allocator on one device asked for on a stream of another (or the allocator's
    /// device is not a CUDA device).
    #[error(
        "the allocator's device ({allocator}) is not the stream's CUDA device {stream_device}; use an allocator of that device"
    )]
    WrongDevice { allocator: String, stream_device: u64 },

    /// A device error that is not out-of-memory (no driver, a driver failure).
    #[error(transparent)]
    Device(#[from] DeviceError),
}

impl AllocError {
    /// True when retrying later may succeed (the device is full now, not forever).
    pub fn is_transient(&self) -> bool {
        matches!(self, AllocError::OutOfMemory { .. })
    }
}

/// An error in a configuration value or file (policy, cost model, workload).
#[derive(Debug, Clone, Error, PartialEq)]
pub enum ConfigError {
    #[error("bad size {text:?}: {reason} (examples: \"512MiB\", \"1.5GiB\", 4096)")]
    BadSize { text: String, reason: String },

    #[error("{file}: cannot read: {reason}")]
    Read { file: String, reason: String },

    #[error("{file}:{line}:{column}: {message}{}", key.as_ref().map(|k| format!(" (key `{k}`)")).unwrap_or_default())]
    Parse {
        file: String,
        line: usize,
        column: usize,
        key: Option<String>,
        message: String,
    },

    #[error("{file}: `{key}` = {value}: {reason}")]
    Invalid {
        file: String,
        key: String,
        value: String,
        reason: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Printed as an error chain (each cause after the message, as `{:#}` in anyhow does), the
    /// device's refusal appears once.
    #[test]
    fn an_out_of_memory_chain_shows_its_cause_once() {
        let cause = DeviceError::OutOfMemory {
            requested: ByteSize(3 << 20),
            free: ByteSize(1 << 20),
            total: ByteSize(1 << 30),
        };
        let err = AllocError::OutOfMemory {
            requested: ByteSize(3 << 20),
            live: ByteSize(0),
            reserved: ByteSize(0),
            idle: ByteSize(0),
            largest_free: ByteSize(0),
            device_free: ByteSize(1 << 20),
            device_total: ByteSize(1 << 30),
            cause: cause.clone(),
        };
        let mut chain = err.to_string();
        let mut next = std::error::Error::source(&err);
        while let Some(e) = next {
            chain += &format!(": {e}");
            next = e.source();
        }
        assert_eq!(chain.matches(&cause.to_string()).count(), 1, "{chain}");
    }
}
