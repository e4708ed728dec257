//! Async socket operations on the current thread's ring, for the NBD server (TCP and unix
//! stream sockets). Buffers are owned ([`IoBuf`]) so a dropped future is safe.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;

use crate::buf::IoBuf;
use crate::driver::{RingOp, SendList};
use crate::scatter::Scatter;
use crate::IoResult;

/// A listening socket whose `accept` runs on the ring (no need for non-blocking mode).
#[derive(Debug)]
pub struct Listener {
    fd: Arc<OwnedFd>,
}

impl Listener {
    /// Wraps a TCP listener.
    pub fn tcp(l: std::net::TcpListener) -> Self {
        // io_uring reports EAGAIN instead of waiting on O_NONBLOCK sockets.
        if let Err(err) = l.set_nonblocking(false) {
            tracing::warn!(%err, "oxpool-io: cannot make TCP listener blocking");
        }
        Listener {
            fd: Arc::new(OwnedFd::from(l)),
        }
    }

    /// Wraps a unix-domain stream listener.
    pub fn unix(l: std::os::unix::net::UnixListener) -> Self {
        if let Err(err) = l.set_nonblocking(false) {
            tracing::warn!(%err, "oxpool-io: cannot make unix listener blocking");
        }
        Listener {
            fd: Arc::new(OwnedFd::from(l)),
        }
    }

    /// Waits for and accepts one connection.
    pub async fn accept(&self) -> IoResult<Stream> {
        let out = RingOp::accept(self.fd.clone()).await?;
        // SAFETY: the kernel returned a new fd for the accepted connection; nobody else owns it.
        let fd = unsafe { OwnedFd::from_raw_fd(out.value as i32) };
        Ok(Stream { fd: Arc::new(fd) })
    }
}

/// A connected stream socket; owns the fd (closed when the `Stream` and every op using it are
/// gone).
#[derive(Debug)]
pub struct Stream {
    fd: Arc<OwnedFd>,
}

impl Stream {
    /// Wraps a connected TCP stream (e.g. a client in tests).
    pub fn from_tcp(s: std::net::TcpStream) -> Self {
        if let Err(err) = s.set_nonblocking(false) {
            tracing::warn!(%err, "oxpool-io: cannot make TCP stream blocking");
        }
        Stream {
            fd: Arc::new(OwnedFd::from(s)),
        }
    }

    /// Wraps a connected unix-domain stream.
    pub fn from_unix(s: std::os::unix::net::UnixStream) -> Self {
        if let Err(err) = s.set_nonblocking(false) {
            tracing::warn!(%err, "oxpool-io: cannot make unix stream blocking");
        }
        Stream {
            fd: Arc::new(OwnedFd::from(s)),
        }
    }

    /// Who is at the other end, for messages: `IP:port`, `a unix-socket client`, or why it
    /// is not known (a TCP client that already reset: `ENOTCONN`). Costs a `dup` and a
    /// `getsockname`/`getpeername`: for what is logged, not for the I/O path.
    pub fn peer_name(&self) -> String {
        let fd = match self.fd.try_clone() {
            Ok(fd) => fd,
            Err(err) => return format!("unknown ({err})"),
        };
        let socket = std::net::TcpStream::from(fd);
        // getsockname answers for a TCP socket even once its peer is gone.
        if socket.local_addr().is_err() {
            return "a unix-socket client".to_string();
        }
        match socket.peer_addr() {
            Ok(addr) => addr.to_string(),
            Err(err) => format!("a TCP client no longer connected ({err})"),
        }
    }

    /// Receives into `buf[offset..]` and returns the buffer and the byte count (0 = EOF).
    pub async fn recv(&self, buf: IoBuf, offset: usize) -> IoResult<(IoBuf, usize)> {
        let end = buf.len();
        self.recv_range(buf, offset, end).await
    }

    /// Receives into `buf[start..end]` (never past `end`: the NBD server receives a WRITE
    /// payload straight into a request buffer larger than the payload, and must not consume
    /// the next request's header) and returns the buffer and the byte count (0 = EOF).
    pub async fn recv_range(
        &self,
        buf: IoBuf,
        start: usize,
        end: usize,
    ) -> IoResult<(IoBuf, usize)> {
        if start >= end || end > buf.len() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "recv into {start}..{end} leaves no room in a {}-byte buffer",
                    buf.len()
                ),
            ));
        }
        let out = RingOp::recv(self.fd.clone(), buf, start, end).await?;
        let buf = out.buf.expect("recv returns its buffer").into_owned();
        let count = out.value as usize;
        debug_assert!(count <= end - start);
        Ok((buf, count))
    }

    /// Receives into `scatter`'s buffers after the bytes filled so far, up to byte `end` of
    /// their concatenation (one vectored receive: it may return fewer bytes, never more) and
    /// returns the scatter, its filled bytes counted, and the byte count (0 = EOF).
    pub async fn recv_scatter(&self, scatter: Scatter, end: usize) -> IoResult<(Scatter, usize)> {
        let start = scatter.filled_bytes();
        if start >= end || end > scatter.len_bytes() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "recv into {start}..{end} leaves no room in a {}-byte scatter",
                    scatter.len_bytes()
                ),
            ));
        }
        let out = RingOp::recv_scatter(self.fd.clone(), scatter, start, end).await?;
        let mut scatter = out.buf.expect("recv returns its buffers").into_scatter();
        let count = out.value as usize;
        debug_assert!(count <= end - start);
        scatter.received(count);
        Ok((scatter, count))
    }

    /// Sends `buf[..len]` entirely (looping on short sends) and returns the buffer.
    pub async fn send_all(&self, buf: IoBuf, len: usize) -> IoResult<IoBuf> {
        if len > buf.len() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("send of {len} bytes from a {}-byte buffer", buf.len()),
            ));
        }
        if len == 0 {
            return Ok(buf);
        }
        let out = RingOp::send_all(self.fd.clone(), buf, len).await?;
        Ok(out.buf.expect("send returns its buffer").into_owned())
    }

    /// Sends every byte of `list` (one `sendmsg` of its pieces, more after a short send) and
    /// returns the list, still holding its pieces ([`SendList::finish`] lets them go).
    pub async fn send_list(&self, list: SendList) -> IoResult<SendList> {
        if list.is_empty() {
            return Ok(list);
        }
        let out = RingOp::send_list(self.fd.clone(), list).await?;
        Ok(out.buf.expect("send returns its list").into_list())
    }

    /// Shuts down both directions (a pending `recv` on the peer sees EOF). Synchronous.
    pub fn shutdown(&self) {
        // SAFETY: plain syscall on an fd we own; failure (e.g. ENOTCONN) needs no handling.
        unsafe { libc::shutdown(self.fd.as_raw_fd(), libc::SHUT_RDWR) };
    }
}

impl AsRawFd for Stream {
    /// The socket's fd, for socket options (e.g. TCP_NODELAY); it stays owned by the `Stream`.
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.fd.as_raw_fd()
    }
}
