//! Errors of the raidz layout and parity code: one line each, saying what was asked and why it
//! cannot be done.

/// What raidz planning or reconstruction can fail with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RaidzError {
    /// A geometry that raidz cannot have.
    #[error("invalid raidz layout: {0}")]
    Layout(String),
    /// A block address or size that does not fit the layout.
    #[error("invalid raidz block: {0}")]
    Block(String),
    /// More columns are missing than there is parity left to rebuild them from.
    #[error("{missing} columns of the block are missing and only {parity} parity columns survive")]
    TooManyMissing {
        /// Data columns that are missing or known bad.
        missing: usize,
        /// Parity columns that can be used.
        parity: usize,
    },
    /// No choice of up to `parity` bad columns makes the block verify.
    #[error(
        "the block fails its checksum and no combination of up to {parity} bad columns repairs it"
    )]
    Unrecoverable {
        /// The vdev's parity count.
        parity: usize,
    },
}
