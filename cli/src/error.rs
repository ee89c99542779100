//! Errors of the lab: reading traces.

use thiserror::Error;

/// An error reading an allocation trace.
#[derive(Debug, Clone, Error, PartialEq, Eq)]
pub enum TraceError {
    #[error("{file}: cannot read: {reason}")]
    Read { file: String, reason: String },

    #[error("{file}:{line}: {message}")]
    Parse { file: String, line: usize, message: String },

    #[error(
        "{file}:{line}: free of id {id:#x}, which is not live (never allocated, or freed already); pass --lenient to skip such frees"
    )]
    UnknownFree { file: String, line: usize, id: u64 },

    #[error("{file}:{line}: alloc of id {id:#x}, which is still live since line {since}")]
    DuplicateAlloc {
        file: String,
        line: usize,
        id: u64,
        since: usize,
    },

    #[error("{file}: {message}")]
    Format { file: String, message: String },
}
