//! Engine errors: one clear line each, naming the device or object and what was wrong.

use oxpool_format::FormatError;

/// Result alias for the engine.
pub type Result<T> = std::result::Result<T, EngineError>;

/// Everything the engine can fail with.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// An I/O error on a named device.
    #[error("{device}: {source}")]
    Io {
        /// Backend name (path).
        device: String,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A device holds something that is not a valid oxpool structure.
    #[error("{device}: {what}: {source}")]
    Corrupt {
        /// Backend name (path).
        device: String,
        /// Which structure (label, uberblock, ...).
        what: String,
        /// What the decoder found wrong.
        source: FormatError,
    },
    /// A block failed its checksum on every copy.
    #[error("checksum mismatch on every copy of {what}")]
    Checksum {
        /// Which block.
        what: String,
    },
    /// The request is not valid (bad argument, out of range, wrong state).
    #[error("{0}")]
    Invalid(String),
    /// A named object does not exist.
    #[error("{0}: not found")]
    NotFound(String),
    /// A named object already exists.
    #[error("{0}: already exists")]
    Exists(String),
    /// The object is in use in a way that forbids the change (held, cloned, not the latest):
    /// the message says why.
    #[error("{0}")]
    Busy(String),
    /// The pool has no free space for the allocation.
    #[error("pool {pool}: out of space{detail}")]
    NoSpace {
        /// Pool name.
        pool: String,
        /// Where the free space is, when known (starts with "; "), or empty.
        detail: String,
    },
    /// The pool stopped accepting writes after a failed commit.
    #[error("pool {pool} is suspended: {reason}")]
    Suspended {
        /// Pool name.
        pool: String,
        /// Why it was suspended.
        reason: String,
    },
}

impl EngineError {
    /// Wraps an I/O error with the device it came from.
    pub fn io(device: &str, source: std::io::Error) -> EngineError {
        EngineError::Io {
            device: device.to_string(),
            source,
        }
    }

    /// Shorthand for [`EngineError::Invalid`].
    pub fn invalid(msg: impl Into<String>) -> EngineError {
        EngineError::Invalid(msg.into())
    }

    /// The errno that best describes this error to a block-protocol client.
    pub fn errno(&self) -> i32 {
        match self {
            EngineError::Io { .. } | EngineError::Corrupt { .. } | EngineError::Checksum { .. } => {
                libc_eio()
            }
            EngineError::Invalid(_) => 22,
            EngineError::NotFound(_) => 2,
            EngineError::Exists(_) => 17,
            EngineError::Busy(_) => 16,
            EngineError::NoSpace { .. } => 28,
            EngineError::Suspended { .. } => libc_eio(),
        }
    }
}

const fn libc_eio() -> i32 {
    5
}
