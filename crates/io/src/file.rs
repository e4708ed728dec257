//! [`FileBackend`]: io_uring I/O on a regular file or a block device.

use std::ffi::CString;
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;

use crate::buf::{IoBuf, IO_BUF_ALIGN_BYTES};
use crate::driver::{Gather, OpBuf, RingOp, RingOutput, GATHER_BUFS_MAX};
use crate::scatter::Scatter;
use crate::{Backend, DurableWriteMode, IoFuture, IoResult};

/// `_IOR(0x12, 114, size_t)`: size of a block device in bytes.
const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;
/// `_IO(0x12, 119)`: discard a byte range `[u64; 2]` of a block device.
const BLKDISCARD: libc::c_ulong = 0x1277;

/// Direct-I/O offset/length alignment assumed when the kernel does not report one.
const DIO_ALIGN_FALLBACK_BYTES: u32 = 4096;

/// io_uring I/O on a regular file or block device, O_DIRECT where the filesystem allows it.
///
/// Reads and writes are io_uring Read/Write ops on the calling thread's ring, `flush` is an
/// io_uring `fdatasync`, `discard` punches a hole (files) or issues BLKDISCARD (block
/// devices), synchronously. Requests not aligned to the device's direct-I/O alignment go
/// through a second, buffered descriptor of the same file (correct, slower; Linux keeps the
/// page cache coherent with direct I/O, and `fdatasync` covers both descriptors).
#[derive(Debug)]
pub struct FileBackend {
    name: Arc<str>,
    /// The main descriptor: O_DIRECT when `direct`, else buffered.
    fd: Arc<OwnedFd>,
    /// Buffered descriptor for unaligned requests (only when `direct`).
    buffered_fd: Option<Arc<OwnedFd>>,
    size_bytes: u64,
    direct: bool,
    block_device: bool,
    /// Offset and length alignment O_DIRECT requires here.
    dio_align_bytes: u32,
}

impl FileBackend {
    /// Opens (O_RDWR|O_DIRECT|O_CLOEXEC). If `create_size_bytes` is Some and the file is
    /// missing, creates it sparse with that size. Where O_DIRECT is refused (EINVAL, e.g.
    /// tmpfs on older kernels) falls back to buffered I/O with a `tracing::warn!` that names
    /// the path; flush is `fdatasync` either way. Block devices: size via BLKGETSIZE64.
    pub fn open(path: &Path, create_size_bytes: Option<u64>) -> IoResult<FileBackend> {
        Self::open_with(path, create_size_bytes, |cpath| {
            open_fd(cpath, libc::O_DIRECT)
        })
    }

    /// `open` with the O_DIRECT attempt injectable, so tests can exercise the fallback on
    /// filesystems that accept O_DIRECT.
    fn open_with(
        path: &Path,
        create_size_bytes: Option<u64>,
        open_direct: impl FnOnce(&CString) -> io::Result<OwnedFd>,
    ) -> IoResult<FileBackend> {
        let name: Arc<str> = Arc::from(path.display().to_string());
        let cpath = CString::new(path.as_os_str().as_bytes()).map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{name}: path contains NUL"),
            )
        })?;
        if let Some(size_bytes) = create_size_bytes {
            create_sparse_if_missing(&cpath, size_bytes)
                .map_err(|err| context(&name, "create", err))?;
        }
        let (fd, direct) = match open_direct(&cpath) {
            Ok(fd) => (fd, true),
            Err(err) if err.raw_os_error() == Some(libc::EINVAL) => {
                tracing::warn!(
                    path = %name,
                    "O_DIRECT refused; falling back to buffered I/O (flush = fdatasync)"
                );
                (
                    open_fd(&cpath, 0).map_err(|err| context(&name, "open", err))?,
                    false,
                )
            }
            Err(err) => return Err(context(&name, "open", err)),
        };
        Self::from_fd(name, &cpath, fd, direct)
    }

    /// Like [`FileBackend::open`] but never uses O_DIRECT (page-cache I/O). For tests of the
    /// fallback path and for filesystems where direct I/O is undesirable.
    pub fn open_buffered(path: &Path, create_size_bytes: Option<u64>) -> IoResult<FileBackend> {
        let name: Arc<str> = Arc::from(path.display().to_string());
        let cpath = CString::new(path.as_os_str().as_bytes()).map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{name}: path contains NUL"),
            )
        })?;
        if let Some(size_bytes) = create_size_bytes {
            create_sparse_if_missing(&cpath, size_bytes)
                .map_err(|err| context(&name, "create", err))?;
        }
        let fd = open_fd(&cpath, 0).map_err(|err| context(&name, "open", err))?;
        Self::from_fd(name, &cpath, fd, false)
    }

    fn from_fd(name: Arc<str>, cpath: &CString, fd: OwnedFd, direct: bool) -> IoResult<Self> {
        let raw = fd.as_raw_fd();
        let stat = fstat(raw).map_err(|err| context(&name, "fstat", err))?;
        let file_type = stat.st_mode & libc::S_IFMT;
        let block_device = file_type == libc::S_IFBLK;
        if !block_device && file_type != libc::S_IFREG {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{name}: not a regular file or block device"),
            ));
        }
        let size_bytes = if block_device {
            block_device_size(raw).map_err(|err| context(&name, "BLKGETSIZE64", err))?
        } else {
            stat.st_size as u64
        };
        let dio_align_bytes = if direct { dio_alignment(raw) } else { 1 };
        let buffered_fd = if direct {
            let buffered = open_fd(cpath, 0).map_err(|err| context(&name, "open", err))?;
            Some(Arc::new(buffered))
        } else {
            None
        };
        debug_assert!(dio_align_bytes.is_power_of_two());
        Ok(FileBackend {
            name,
            fd: Arc::new(fd),
            buffered_fd,
            size_bytes,
            direct,
            block_device,
            dio_align_bytes,
        })
    }

    /// True if I/O bypasses the page cache (O_DIRECT).
    pub fn is_direct(&self) -> bool {
        self.direct
    }

    /// True if the path is a block device.
    pub fn is_block_device(&self) -> bool {
        self.block_device
    }

    /// Offset and length alignment of requests that take the O_DIRECT path (1 if buffered).
    pub fn dio_align_bytes(&self) -> u32 {
        self.dio_align_bytes
    }

    /// The descriptor for a request: the direct one if it is aligned, else the buffered one.
    fn fd_for(&self, offset_bytes: u64, len: usize) -> &Arc<OwnedFd> {
        let align = u64::from(self.dio_align_bytes);
        self.fd_if(offset_bytes.is_multiple_of(align) && (len as u64).is_multiple_of(align))
    }

    /// The descriptor for a vectored request of pieces `lens` from `offset_bytes`: O_DIRECT
    /// needs every piece aligned, not just the whole.
    fn fd_for_pieces(
        &self,
        offset_bytes: u64,
        mut lens: impl Iterator<Item = usize>,
    ) -> &Arc<OwnedFd> {
        let align = u64::from(self.dio_align_bytes);
        self.fd_if(
            offset_bytes.is_multiple_of(align)
                && lens.all(|len| (len as u64).is_multiple_of(align)),
        )
    }

    /// The direct descriptor if the request is `aligned`, else the buffered one.
    fn fd_if(&self, aligned: bool) -> &Arc<OwnedFd> {
        // IoBuf memory is always 4096-aligned, which covers every dio_mem_align we know
        // (`dio_alignment` forces the buffered path otherwise).
        match &self.buffered_fd {
            Some(buffered) if !aligned => buffered,
            _ => &self.fd,
        }
    }

    /// Writes all of an owned `buf` at `offset_bytes`, durably (`RWF_DSYNC`) or not.
    fn write_owned(&self, offset_bytes: u64, buf: IoBuf, durable: bool) -> IoFuture<IoBuf> {
        if let Err(err) = self.check_range(offset_bytes, buf.len() as u64, "write") {
            return IoFuture::ready(Err(err));
        }
        if buf.is_empty() {
            return IoFuture::ready(Ok(buf));
        }
        let fd = self.fd_for(offset_bytes, buf.len()).clone();
        let op = RingOp::write_all(
            fd,
            offset_bytes,
            OpBuf::Owned(buf),
            durable,
            self.name.clone(),
        );
        IoFuture::ring(op, take_buf)
    }

    fn check_range(&self, offset_bytes: u64, len: u64, what: &str) -> IoResult<()> {
        crate::check_range(&self.name, self.size_bytes, offset_bytes, len, what)
    }

    fn discard_now(&self, offset_bytes: u64, length_bytes: u64) -> IoResult<()> {
        self.check_range(offset_bytes, length_bytes, "discard")?;
        if length_bytes == 0 {
            return Ok(());
        }
        let raw = self.fd.as_raw_fd();
        let result = if self.block_device {
            let range: [u64; 2] = [offset_bytes, length_bytes];
            // SAFETY: BLKDISCARD reads a `[u64; 2]` from the pointer, which is a live local.
            unsafe { libc::ioctl(raw, BLKDISCARD, range.as_ptr()) }
        } else {
            // SAFETY: plain syscall on an fd we own.
            unsafe {
                libc::fallocate(
                    raw,
                    libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                    offset_bytes as libc::off_t,
                    length_bytes as libc::off_t,
                )
            }
        };
        if result == 0 {
            return Ok(());
        }
        let err = io::Error::last_os_error();
        match err.raw_os_error() {
            // Discard is advisory: a device or filesystem without it simply keeps the data.
            Some(libc::EOPNOTSUPP) | Some(libc::ENOTTY) | Some(libc::EINVAL) => Ok(()),
            _ => Err(context(&self.name, "discard", err)),
        }
    }
}

fn take_buf(out: RingOutput) -> IoBuf {
    out.buf
        .expect("read and write ops return their buffer")
        .into_owned()
}

fn unit(_: RingOutput) {}

impl Backend for FileBackend {
    fn name(&self) -> &str {
        &self.name
    }

    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    fn read(&self, offset_bytes: u64, buf: IoBuf) -> IoFuture<IoBuf> {
        if let Err(err) = self.check_range(offset_bytes, buf.len() as u64, "read") {
            return IoFuture::ready(Err(err));
        }
        if buf.is_empty() {
            return IoFuture::ready(Ok(buf));
        }
        let fd = self.fd_for(offset_bytes, buf.len()).clone();
        IoFuture::ring(
            RingOp::read_exact(fd, offset_bytes, buf, self.name.clone()),
            take_buf,
        )
    }

    fn read_scatter(&self, offset_bytes: u64, bufs: Scatter) -> IoFuture<Scatter> {
        let len = bufs.len_bytes();
        if let Err(err) = self.check_range(offset_bytes, len as u64, "read") {
            return IoFuture::ready(Err(err));
        }
        if len == 0 {
            return IoFuture::ready(Ok(bufs));
        }
        let fd = self.fd_for_pieces(offset_bytes, bufs.buf_lens()).clone();
        IoFuture::ring(
            RingOp::read_exact_scatter(fd, offset_bytes, bufs, self.name.clone()),
            |output| {
                output
                    .buf
                    .expect("a read hands its scatter back")
                    .into_scatter()
            },
        )
    }

    fn write(&self, offset_bytes: u64, buf: IoBuf) -> IoFuture<IoBuf> {
        self.write_owned(offset_bytes, buf, false)
    }

    /// `RWF_DSYNC` on the write itself: the kernel makes the bytes durable before the
    /// completion (on a block device, a FUA write where the device has FUA, else a cache
    /// flush the block layer issues after the write; on a regular file, the filesystem's
    /// fdatasync of the range, run on a kernel worker after the write: see
    /// [`FileBackend::durable_write_mode`]).
    fn write_durable(&self, offset_bytes: u64, buf: IoBuf) -> IoFuture<IoBuf> {
        self.write_owned(offset_bytes, buf, true)
    }

    /// A block device, or a file without O_DIRECT: one durable write. A regular file with
    /// O_DIRECT: either, measured. There a `RWF_DSYNC` write completes through the
    /// filesystem's direct-I/O completion work queue (ext4 and XFS alike), whose worker is
    /// bound to the CPU that took the interrupt and flushes the device from there; with that
    /// CPU busy (the txg sync, a client, another process), the write waited for the running
    /// task's slice, 3-4 ms on a 2-vCPU guest, while a write and then an fdatasync, run by
    /// the calling thread at queue depth 1 (`driver.rs`, `fsync_here`) or by io_uring's
    /// unbound worker, took about a tenth of that (docs/io-scheduling.md, "Durable log
    /// writes on a file").
    fn durable_write_mode(&self) -> DurableWriteMode {
        if self.direct && !self.block_device {
            DurableWriteMode::Measure
        } else {
            DurableWriteMode::Fua
        }
    }

    fn write_shared(&self, offset_bytes: u64, buf: Arc<IoBuf>) -> IoFuture<()> {
        if let Err(err) = self.check_range(offset_bytes, buf.len() as u64, "write") {
            return IoFuture::ready(Err(err));
        }
        if buf.is_empty() {
            return IoFuture::ready(Ok(()));
        }
        let fd = self.fd_for(offset_bytes, buf.len()).clone();
        IoFuture::ring(
            RingOp::write_all(
                fd,
                offset_bytes,
                OpBuf::Shared(buf),
                false,
                self.name.clone(),
            ),
            unit,
        )
    }

    fn write_gather(&self, offset_bytes: u64, bufs: Vec<Arc<IoBuf>>) -> IoFuture<()> {
        assert!(
            bufs.len() <= GATHER_BUFS_MAX,
            "too many buffers for one write"
        );
        let len: usize = bufs.iter().map(|b| b.len()).sum();
        if let Err(err) = self.check_range(offset_bytes, len as u64, "write") {
            return IoFuture::ready(Err(err));
        }
        if len == 0 {
            return IoFuture::ready(Ok(()));
        }
        if bufs.len() == 1 {
            let buf = bufs.into_iter().next().expect("one buffer");
            return self.write_shared(offset_bytes, buf);
        }
        let fd = self
            .fd_for_pieces(offset_bytes, bufs.iter().map(|b| b.len()))
            .clone();
        IoFuture::ring(
            RingOp::write_all(
                fd,
                offset_bytes,
                OpBuf::Gather(Gather::new(bufs)),
                false,
                self.name.clone(),
            ),
            unit,
        )
    }

    fn flush(&self) -> IoFuture<()> {
        IoFuture::ring(RingOp::fdatasync(self.fd.clone(), self.name.clone()), unit)
    }

    fn discard(&self, offset_bytes: u64, length_bytes: u64) -> IoFuture<()> {
        // Synchronous: discards are rare (trim), and fallocate/BLKDISCARD are not worth an
        // async path yet.
        IoFuture::ready(self.discard_now(offset_bytes, length_bytes))
    }
}

fn context(name: &str, what: &str, err: io::Error) -> io::Error {
    io::Error::new(err.kind(), format!("{name}: {what}: {err}"))
}

fn open_fd(path: &CString, extra_flags: libc::c_int) -> io::Result<OwnedFd> {
    let flags = libc::O_RDWR | libc::O_CLOEXEC | extra_flags;
    // SAFETY: `path` is a valid NUL-terminated string; the result is checked.
    let raw = unsafe { libc::open(path.as_ptr(), flags) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh fd owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(raw) })
}

/// Creates the file if it does not exist (O_EXCL: an existing file is never truncated or
/// resized) and returns its descriptor; None if it existed.
pub(crate) fn create_exclusive(path: &CString) -> io::Result<Option<OwnedFd>> {
    let flags = libc::O_RDWR | libc::O_CLOEXEC | libc::O_CREAT | libc::O_EXCL;
    // SAFETY: valid NUL-terminated path; mode is a plain integer; the result is checked.
    let raw = unsafe { libc::open(path.as_ptr(), flags, 0o644 as libc::c_uint) };
    if raw < 0 {
        let err = io::Error::last_os_error();
        return if err.raw_os_error() == Some(libc::EEXIST) {
            Ok(None)
        } else {
            Err(err)
        };
    }
    // SAFETY: a fresh fd owned by nobody else.
    Ok(Some(unsafe { OwnedFd::from_raw_fd(raw) }))
}

/// Creates the file sparse with `size_bytes` if it does not exist.
fn create_sparse_if_missing(path: &CString, size_bytes: u64) -> io::Result<()> {
    let Some(fd) = create_exclusive(path)? else {
        return Ok(());
    };
    // SAFETY: plain syscall on an fd we own.
    if unsafe { libc::ftruncate(fd.as_raw_fd(), size_bytes as libc::off_t) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

fn fstat(fd: RawFd) -> io::Result<libc::stat> {
    let mut stat = MaybeUninit::<libc::stat>::uninit();
    // SAFETY: `stat` is a writable buffer of the right type; the result is checked.
    if unsafe { libc::fstat(fd, stat.as_mut_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fstat succeeded, so it filled the struct.
    Ok(unsafe { stat.assume_init() })
}

fn block_device_size(fd: RawFd) -> io::Result<u64> {
    let mut size_bytes: u64 = 0;
    // SAFETY: BLKGETSIZE64 writes one u64 through the pointer, which is a live local.
    if unsafe { libc::ioctl(fd, BLKGETSIZE64, &mut size_bytes as *mut u64) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(size_bytes)
}

/// The offset/length alignment O_DIRECT needs on this file (`statx` STATX_DIOALIGN), or a
/// conservative 4096 if the kernel or filesystem does not say.
fn dio_alignment(fd: RawFd) -> u32 {
    let mut stx = MaybeUninit::<libc::statx>::zeroed();
    let empty = c"";
    // SAFETY: AT_EMPTY_PATH with an empty path stats `fd` itself; `stx` is a writable buffer.
    let result = unsafe {
        libc::statx(
            fd,
            empty.as_ptr(),
            libc::AT_EMPTY_PATH,
            libc::STATX_DIOALIGN,
            stx.as_mut_ptr(),
        )
    };
    if result != 0 {
        return DIO_ALIGN_FALLBACK_BYTES;
    }
    // SAFETY: statx succeeded (and the buffer was zeroed anyway).
    let stx = unsafe { stx.assume_init() };
    let align = stx.stx_dio_offset_align;
    if stx.stx_mask & libc::STATX_DIOALIGN == 0 || align == 0 || !align.is_power_of_two() {
        return DIO_ALIGN_FALLBACK_BYTES;
    }
    if stx.stx_dio_mem_align as usize > IO_BUF_ALIGN_BYTES {
        // Our buffers could not satisfy it: send everything through the buffered fd.
        return u32::MAX / 2 + 1;
    }
    align
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rt::block_on;

    #[test]
    fn falls_back_to_buffered_when_direct_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fallback");
        let refuse = |_: &CString| Err(io::Error::from_raw_os_error(libc::EINVAL));
        let dev = FileBackend::open_with(&path, Some(1 << 20), refuse).unwrap();
        assert!(!dev.is_direct());
        assert_eq!(dev.dio_align_bytes(), 1);
        assert_eq!(dev.size_bytes(), 1 << 20);
        let data = IoBuf::from_slice(&[7u8; 1000]);
        block_on(dev.write(3, data.clone())).unwrap();
        block_on(dev.flush()).unwrap();
        assert_eq!(block_on(dev.read(3, IoBuf::zeroed(1000))).unwrap(), data);
    }

    #[test]
    fn other_open_errors_are_reported() {
        let dir = tempfile::tempdir().unwrap();
        let refuse = |_: &CString| Err(io::Error::from_raw_os_error(libc::EACCES));
        let err = FileBackend::open_with(&dir.path().join("x"), Some(4096), refuse).unwrap_err();
        assert_eq!(err.raw_os_error(), None);
        assert_eq!(err.kind(), io::ErrorKind::PermissionDenied);
        // A directory is neither a file nor a block device.
        assert!(FileBackend::open_buffered(dir.path(), None).is_err());
    }
}
