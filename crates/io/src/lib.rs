//! oxpool I/O: the [`Backend`] trait (byte-offset read, write, flush, discard; asynchronous),
//! its implementations (io_uring files and block devices, memory, fault injection), and the
//! per-thread ring driver and executors that run them ([`rt`]).
//!
//! There is no general async runtime. Each thread that does I/O owns one io_uring ring
//! (created lazily; SINGLE_ISSUER|DEFER_TASKRUN|COOP_TASKRUN when the kernel accepts them).
//! Backend futures submit operations to the current thread's ring; the thread's executor
//! ([`rt::block_on`], [`rt::LocalExecutor`]) reaps completions and wakes the futures, so
//! completion runs on the thread that submitted.

#![warn(missing_docs)]

mod arena;
mod buf;
pub mod completion;
mod driver;
mod executor;
mod fault;
mod file;
mod future;
pub mod machine;
mod memory;
mod net;
mod prealloc;
mod scatter;
pub mod scratch;
pub mod spare_cpu;
pub mod warn_limit;

pub use buf::{
    IoBuf, PoolReservation, IO_BUF_ALIGN_BYTES, IO_BUF_POOL_BYTES_MAX, IO_BUF_WARM_BYTES_MAX,
};
pub use driver::GATHER_BUFS_MAX;
pub use fault::{FaultBackend, FaultStats, LostWrite, PowerLossReport};
pub use file::FileBackend;
pub use future::{IoFuture, IoResult};
pub use memory::MemoryBackend;
pub use prealloc::create_preallocated;
pub use scatter::{Scatter, SCATTER_IOVECS_MAX};

/// Whether `len` bytes at `offset_bytes` fit in a device of `size_bytes`; the error names the
/// device (`UnexpectedEof` for reads, `InvalidInput` otherwise). Shared by the backends.
pub(crate) fn check_range(
    name: &str,
    size_bytes: u64,
    offset_bytes: u64,
    len: u64,
    what: &str,
) -> IoResult<()> {
    if offset_bytes
        .checked_add(len)
        .is_some_and(|end| end <= size_bytes)
    {
        return Ok(());
    }
    let kind = if what == "read" {
        std::io::ErrorKind::UnexpectedEof
    } else {
        std::io::ErrorKind::InvalidInput
    };
    Err(std::io::Error::new(
        kind,
        format!(
            "{name}: {what} of {len} bytes at offset {offset_bytes} beyond end of device ({size_bytes} bytes)"
        ),
    ))
}

/// How a device makes one write durable soonest ([`Backend::durable_write_mode`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DurableWriteMode {
    /// One durable (FUA) write: [`Backend::write_durable`].
    Fua,
    /// A plain write, then a [`Backend::flush`] once the write completed.
    WriteThenFlush,
    /// Either may be faster, depending on the load: the caller should measure both. A regular
    /// file opened O_DIRECT: there a durable write (`RWF_DSYNC`) is finished by the
    /// filesystem on a kernel worker bound to the CPU that took the device's interrupt (it
    /// writes the inode if needed and flushes the device from there, then completes the
    /// write). On an idle machine that saves a wake-up; when that CPU is busy, the write
    /// waits for the running task's time slice to end, milliseconds, while a flush run by
    /// the calling thread (or by io_uring's worker) may run on any CPU.
    Measure,
}

/// The storage trait: byte-offset I/O on one device. Small on purpose, so crash and fault
/// backends are easy to write.
///
/// Operations return an [`IoFuture`] bound to the calling thread; drive it with [`rt::block_on`]
/// or a [`rt::LocalExecutor`]. The buffer is moved in and handed back, so a future dropped
/// mid-flight never leaves the kernel writing into freed memory.
pub trait Backend: Send + Sync + 'static {
    /// Path or label, used in error messages.
    fn name(&self) -> &str;

    /// Device size in bytes.
    fn size_bytes(&self) -> u64;

    /// Fills the whole `buf` from `offset_bytes`; a short read past the end of the device is
    /// an `UnexpectedEof` error.
    fn read(&self, offset_bytes: u64, buf: IoBuf) -> IoFuture<IoBuf>;

    /// Fills every buffer of `bufs` (none filled yet), back to back from `offset_bytes`: the
    /// device sees one read where it can (a vectored one), and each block of an aggregated
    /// read lands in its own buffer instead of being copied out of one run buffer (that copy
    /// was 12 % of the server's CPU on uncached 128K random reads; issue 19). This default
    /// reads into one buffer and copies.
    fn read_scatter(&self, offset_bytes: u64, mut bufs: Scatter) -> IoFuture<Scatter> {
        let read = self.read(offset_bytes, IoBuf::for_overwrite(bufs.len_bytes()));
        IoFuture::boxed(async move {
            let run = read.await?;
            bufs.copy_in(&run);
            Ok(bufs)
        })
    }

    /// Writes the whole `buf` at `offset_bytes` and returns it.
    fn write(&self, offset_bytes: u64, buf: IoBuf) -> IoFuture<IoBuf>;

    /// Writes the whole `buf`, which others may be reading at the same time, at
    /// `offset_bytes`; the write holds its reference until the device is done with the bytes,
    /// even when its future is dropped first (a self-heal relies on that: its places stay
    /// held while the buffer lives). It saves the copy `write` would need of a buffer the
    /// caller cannot give up (a block still visible to readers, one buffer written to several
    /// devices). This default copies and holds the reference until its own future ends: a
    /// backend whose writes outlive their futures (io_uring's do) must override it.
    fn write_shared(&self, offset_bytes: u64, buf: std::sync::Arc<IoBuf>) -> IoFuture<()> {
        let write = self.write(offset_bytes, IoBuf::from_slice(&buf));
        IoFuture::boxed(async move {
            let written = write.await.map(drop);
            drop(buf);
            written
        })
    }

    /// Writes `bufs` back to back from `offset_bytes` (each shared as in `write_shared`): the
    /// device sees one write where it can (a vectored one), which is what aggregating
    /// adjacent block writes saves: one submission, one request in the device, instead of
    /// one per block. At most [`GATHER_BUFS_MAX`] buffers. This default writes each buffer on
    /// its own.
    fn write_gather(&self, offset_bytes: u64, bufs: Vec<std::sync::Arc<IoBuf>>) -> IoFuture<()> {
        assert!(
            bufs.len() <= GATHER_BUFS_MAX,
            "too many buffers for one write"
        );
        let mut at = offset_bytes;
        let writes: Vec<IoFuture<()>> = bufs
            .into_iter()
            .map(|buf| {
                let len = buf.len() as u64;
                let write = self.write_shared(at, buf);
                at += len;
                write
            })
            .collect();
        IoFuture::boxed(async move {
            rt::join_all(writes)
                .await
                .into_iter()
                .collect::<IoResult<Vec<()>>>()
                .map(drop)
        })
    }

    /// Writes the whole `buf` at `offset_bytes` and completes only once these bytes are
    /// durable (a FUA write: `RWF_DSYNC` on files and block devices). It says nothing about
    /// any other write: one that completed before it may still be in a volatile cache. The
    /// intent log writes a block this way when the block is all its commit needs, saving the
    /// separate flush (an fdatasync, which io_uring runs on a kernel worker thread).
    ///
    /// No default: a wrapper that fell back to `write` then `flush` would have to issue the
    /// flush only after the write completed (a flush covers only writes completed before it),
    /// and one that forgot to forward this to a fault backend would hide a commit relying on
    /// FUA for more than its own write. Every backend says what it does.
    fn write_durable(&self, offset_bytes: u64, buf: IoBuf) -> IoFuture<IoBuf>;

    /// How this device makes one write durable soonest: with [`Backend::write_durable`]
    /// (the default), or with a plain write and, once it completed, a [`Backend::flush`].
    /// Both are correct; this only says which is faster. A wrapper that does not forward it
    /// costs speed, never durability.
    fn durable_write_mode(&self) -> DurableWriteMode {
        DurableWriteMode::Fua
    }

    /// When it completes, every write completed before this call is durable.
    fn flush(&self) -> IoFuture<()>;

    /// Tells the device the range is unused. May be a no-op (later reads return either the
    /// old data or zeros).
    fn discard(&self, offset_bytes: u64, length_bytes: u64) -> IoFuture<()>;
}

/// The ring driver's executors and async socket operations.
pub mod rt {
    pub use crate::driver::{
        ops_in_flight, set_fsync_here_max, set_spin, submit_queued, FSYNC_HERE_MAX_DEFAULT,
        OP_TABLE_CAPACITY,
    };
    pub use crate::executor::{
        block_on, join2, join_all, join_all_bounded, sleep, spawn_local, try_spawn_local,
        yield_now, LocalExecutor,
    };

    /// Async socket operations on the ring for the NBD server (TCP and unix stream sockets),
    /// with owned buffers.
    pub mod net {
        pub use crate::driver::{SendList, SEND_IOVECS_MAX};
        pub use crate::net::{Listener, Stream};
    }
}
