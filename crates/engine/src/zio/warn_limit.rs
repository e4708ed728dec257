//! A bound on the warnings a damaged device prints: one bad range of a disk read by a scrub
//! or a client is hundreds of blocks, each failing on its own, and a line for each buries
//! everything else in the log. As ZFS bounds its checksum and I/O events
//! (`zfs_checksum_events_per_second`, 20), at most [`IO_WARNINGS_PER_SECOND`] lines a second
//! are printed; the first line of the next second says how many were left out. Every error is
//! still counted on its device (`oxpool status`) and recorded in the pool's error log.

use oxpool_io::warn_limit::WarnLimit;

/// I/O warning lines printed per second at most.
pub(crate) const IO_WARNINGS_PER_SECOND: u64 = 20;

static IO_WARNINGS: WarnLimit = WarnLimit::new(IO_WARNINGS_PER_SECOND);

thread_local! {
    /// Set while this thread runs [`quietly`].
    static QUIET: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// While it lives, this thread's I/O warnings are left out: for a caller that says what
/// failed itself, once (an import probing its uberblocks: each bad copy of an unusable one
/// would print a line on every command that opens a damaged pool). The errors are still
/// counted on their devices. For work polled on this thread only (`block_on`).
pub(crate) struct Quiet {
    was: bool,
    /// Not sent to another thread, whose flag it would restore.
    _here: std::marker::PhantomData<*const ()>,
}

impl Quiet {
    /// Leaves this thread's I/O warnings out until dropped.
    pub(crate) fn enter() -> Quiet {
        Quiet {
            was: QUIET.with(|q| q.replace(true)),
            _here: std::marker::PhantomData,
        }
    }
}

impl Drop for Quiet {
    fn drop(&mut self) {
        QUIET.with(|q| q.set(self.was));
    }
}

/// Whether an I/O warning may be printed now (see [`WarnLimit::allow`]).
pub(crate) fn allow() -> Option<u64> {
    if QUIET.with(|q| q.get()) {
        return None;
    }
    IO_WARNINGS.allow()
}

/// `tracing::warn!` for an I/O error or a damaged block, within [`IO_WARNINGS_PER_SECOND`].
macro_rules! io_warn {
    ($($arg:tt)*) => {
        if let Some(left_out) = $crate::zio::warn_limit::allow() {
            if left_out > 0 {
                tracing::warn!("{left_out} more I/O warnings were left out (at most {} a second)",
                    $crate::zio::warn_limit::IO_WARNINGS_PER_SECOND);
            }
            tracing::warn!($($arg)*);
        }
    };
}
pub(crate) use io_warn;
