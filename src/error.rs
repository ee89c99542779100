//! Typed errors. Each message says what happened and how to fix it; out-of-memory errors say
//! whether waiting or releasing memory could help (`is_transient`).

use thiserror::Error;

use crate::size::ByteSize;

/// An error from a [`Device`](crate::device::Device): the only code that obtains memory.
#[non_exhaustive]
#[derive(Debug, Clone, Error, PartialEq, Eq)]
pub enum DeviceError {
    /// The device refused an allocation because it has too little free memory right now.
    #[error(
        "the device is out of memory: asked for {requested}, {free} of {total} free; \
         free memory or lower the request"
    )]
    OutOfMemory {
        /// The bytes asked for.
        requested: ByteSize,
        /// The device's free memory when it refused.
        free: ByteSize,
        /// The device's memory in all.
        total: ByteSize,
    },

    /// The allocator's cap on the memory it may hold ([`set_memory_cap`](crate::Allocator::set_memory_cap),
    /// PyTorch's `set_per_process_memory_fraction`) would be passed.
    #[error(
        "the allocator's memory cap would be passed: asked for {requested} more, it holds {held} \
         of a cap of {cap} (set_per_process_memory_fraction); raise the fraction or free memory"
    )]
    OverCap {
        /// The bytes asked for.
        requested: ByteSize,
        /// The bytes the allocator holds.
        held: ByteSize,
        /// The cap.
        cap: ByteSize,
    },

    /// A fault injected by a test (SimDevice), reported like a driver out-of-memory.
    #[error("injected driver failure on driver allocation #{nth} (asked for {requested}); this is a test fault")]
    InjectedFault {
        /// The bytes asked for.
        requested: ByteSize,
        /// Which driver allocation attempt failed (1 = the first).
        nth: u64,
    },

    /// No CUDA driver library could be loaded on this machine.
    #[error("no CUDA driver found ({reason}); install the NVIDIA driver or use SimDevice")]
    NoDriver {
        /// Why the driver library could not be loaded.
        reason: String,
    },

    /// A driver call returned an error code.
    #[error("CUDA driver call {call} failed with {code}; check the device ordinal and driver state")]
    Driver {
        /// The driver call, e.g. `cuMemAlloc_v2`.
        call: &'static str,
        /// The error code it returned.
        code: String,
    },

    /// A wait on a stream being captured into a CUDA graph, which would break the capture.
    #[error(
        "stream {stream:#x} is being captured into a CUDA graph: the allocator neither queries nor \
         waits on it until the capture ends"
    )]
    StreamCapturing {
        /// The stream (its `cudaStream_t` value).
        stream: u64,
    },

    /// The device was asked to free a pointer it did not hand out.
    #[error("device pointer {ptr:#x} was not allocated by this device (or was freed already)")]
    UnknownPointer {
        /// The pointer.
        ptr: u64,
    },
}

impl DeviceError {
    /// True when the same request may succeed later (memory may be freed meanwhile).
    pub fn is_out_of_memory(&self) -> bool {
        matches!(
            self,
            DeviceError::OutOfMemory { .. } | DeviceError::InjectedFault { .. } | DeviceError::OverCap { .. }
        )
    }
}

/// An error from the public [`Allocator`](crate::Allocator).
#[non_exhaustive]
#[derive(Debug, Clone, Error, PartialEq, Eq)]
pub enum AllocError {
    /// A request of 0 bytes.
    #[error("zero-byte allocation requested; ask for at least 1 byte")]
    ZeroSize,

    /// Permanent: the request can never fit on this device.
    #[error("request of {requested} can never fit: the device has {capacity} in total")]
    TooLarge {
        /// The bytes asked for.
        requested: ByteSize,
        /// The device's memory in all.
        capacity: ByteSize,
    },

    /// Transient: the device is full right now. Freeing memory (or, for other tenants, waiting)
    /// may let the same request succeed.
    #[error(
        "out of memory: asked for {requested}; this allocator holds {live} live, {reserved} \
         reserved, {idle} idle (released before failing), largest free block {largest_free}; \
         device has {device_free} free of {device_total}. Free tensors, lower the batch, or give \
         a policy with a smaller cache. Cause: {cause}"
    )]
    OutOfMemory {
        /// The bytes asked for.
        requested: ByteSize,
        /// What this allocator's callers hold.
        live: ByteSize,
        /// What this allocator holds from the device.
        reserved: ByteSize,
        /// Reserved but not live (given back before failing, where it could be).
        idle: ByteSize,
        /// The largest free block this allocator holds.
        largest_free: ByteSize,
        /// The device's free memory.
        device_free: ByteSize,
        /// The device's memory in all.
        device_total: ByteSize,
        /// The device's refusal. Shown in the message, and not a `source()`: an error chain
        /// printed cause by cause would show it twice.
        cause: DeviceError,
    },

    /// Transient: the device is full while a private pool is being allocated to (a CUDA graph
    /// capture or a MemPool), when the allocator gives nothing back and waits on no stream.
    #[error(
        "out of memory while private pool(s) {pools} are being allocated to (a CUDA graph capture \
         or a MemPool): asked for {requested}; this allocator holds {reserved}, the device has \
         {device_free} free. Nothing was given back and no stream was waited on, since either \
         could break a capture under way: free cached memory (empty_cache) before the capture, \
         or capture less. Cause: {cause}"
    )]
    OutOfMemoryInPoolWindow {
        /// The bytes asked for.
        requested: ByteSize,
        /// The pools being allocated to, as `(a, b)` ids.
        pools: String,
        /// What this allocator holds from the device.
        reserved: ByteSize,
        /// The device's free memory.
        device_free: ByteSize,
        /// The device's refusal.
        cause: DeviceError,
    },

    /// A pool call naming a pool the allocator does not have (or, for `end_pool`, one with no
    /// window open).
    #[error("{call}: no private pool ({}, {}) {}", pool.0, pool.1, if *call == "end_pool" { "is being allocated to (end_pool without begin_pool)" } else { "exists (never begun, or released and its memory given back)" })]
    UnknownPool {
        /// The pool's id.
        pool: (u64, u64),
        /// The call: `end_pool` or `release_pool`.
        call: &'static str,
    },

    /// A free (or a stream call) of a pointer this allocator does not hold.
    #[error("pointer {ptr:#x} is not a live allocation of this allocator (never allocated here, or already freed)")]
    UnknownPointer {
        /// The pointer.
        ptr: u64,
    },

    /// A free on another stream than the allocation's.
    #[error(
        "pointer {ptr:#x} was allocated on stream {allocated_on} but freed on stream {freed_on}; free it on the stream it was allocated on"
    )]
    StreamMismatch {
        /// The pointer.
        ptr: u64,
        /// The stream it was allocated on.
        allocated_on: u64,
        /// The stream the free named.
        freed_on: u64,
    },

    /// A request whose size in bytes does not fit in 64 bits (`len` elements of `elem_bytes`).
    #[error("{len} elements of {elem_bytes} bytes overflow a 64-bit size; ask for fewer")]
    SizeOverflow {
        /// Elements asked for.
        len: u64,
        /// Bytes per element.
        elem_bytes: u64,
    },

    /// Memory of an allocator on one device asked for on a stream of another (or the allocator's
    /// device is not a CUDA device).
    #[error(
        "the allocator's device ({allocator}) is not the stream's CUDA device {stream_device}; use an allocator of that device"
    )]
    WrongDevice {
        /// The allocator's device, by name.
        allocator: String,
        /// The stream's CUDA device ordinal.
        stream_device: u64,
    },

    /// A device error that is not out-of-memory (no driver, a driver failure).
    #[error(transparent)]
    Device(#[from] DeviceError),
}

impl AllocError {
    /// True when retrying later may succeed (the device is full now, not forever).
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            AllocError::OutOfMemory { .. } | AllocError::OutOfMemoryInPoolWindow { .. }
        )
    }
}

/// An error in a configuration value or file (policy, cost model, workload).
#[non_exhaustive]
#[derive(Debug, Clone, Error, PartialEq)]
pub enum ConfigError {
    /// A size that does not parse.
    #[error("bad size {text:?}: {reason} (examples: \"512MiB\", \"1.5GiB\", 4096)")]
    BadSize {
        /// The text given.
        text: String,
        /// Why it is not a size.
        reason: String,
    },

    /// A file that cannot be read.
    #[error("{file}: cannot read: {reason}")]
    Read {
        /// The file (or the name given for it).
        file: String,
        /// Why.
        reason: String,
    },

    /// A file that cannot be written.
    #[error("{file}: cannot write: {reason}")]
    Write {
        /// The file.
        file: String,
        /// Why.
        reason: String,
    },

    /// A file that is not valid TOML for its schema.
    #[error("{file}:{line}:{column}: {message}{}", key.as_ref().map(|k| format!(" (key `{k}`)")).unwrap_or_default())]
    Parse {
        /// The file.
        file: String,
        /// Line of the error, from 1.
        line: usize,
        /// Column of the error, from 1.
        column: usize,
        /// The key at fault, dotted (`bounds.headroom`), where known.
        key: Option<String>,
        /// What is wrong.
        message: String,
    },

    /// A value that parses but is out of range or inconsistent.
    #[error("{file}: `{key}` = {value}: {reason}")]
    Invalid {
        /// The file.
        file: String,
        /// The key, dotted.
        key: String,
        /// The value given.
        value: String,
        /// Why it is refused, and what would be accepted.
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
