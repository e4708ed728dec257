//! One connection's TLS session, on the reactor that owns the connection.
//!
//! Sans-I/O over the ring: OpenSSL never touches the socket. Its BIO is [`CipherIo`], two
//! buffers in memory: ciphertext the reader received with the ring's `recv` (OpenSSL reads it
//! from there), and ciphertext OpenSSL produced (sent with the ring's `send`). Plain text goes
//! straight between OpenSSL and the connection's own buffers: `SSL_read` decrypts into the
//! inbox or a WRITE's slot buffer, `SSL_write` encrypts from a reply's buffer or, for a large
//! READ, from the data cache's blocks (`send_slices`). No thread, no
//! plain-text staging buffer; the copies are OpenSSL's own (ciphertext into its record buffer,
//! where it is decrypted in place, then out to our buffer; plain text into its record buffer,
//! where it is encrypted in place, then out to ours), see `docs/tls.md`.
//!
//! Two tasks use a session: the connection's reader (`recv`) and its writer (`send_all`),
//! never at the same moment (one thread) and never holding a borrow across an await. Sends are
//! serialised: one ciphertext buffer is filled while the other is on the wire, and whoever
//! flushes sends everything produced so far, in order (records leave in the order OpenSSL
//! wrote them). The reader may need to send too (a TLS 1.3 KeyUpdate answer while reading).

use std::cell::{Cell, RefCell};
use std::io::{self, Read, Write};

use openssl::ssl::{ErrorCode, SslStream};
use oxpool_io::rt::net::Stream;
use oxpool_io::{IoBuf, IoResult};

use super::task::{wait_until, WakerCell};
use super::tls::{TlsCredentials, TlsIdentity};

/// Ciphertext received per `recv` (and the most OpenSSL has yet to read). Twice a 128 KiB
/// WRITE's records: with 128 KiB a 128 KiB sequential write took 3.5 receives per request,
/// with 256 KiB fewer, and the server 4 % less CPU per request (docs/tls.md).
const RX_BYTES: usize = 256 * 1024;

/// Each of the two ciphertext send buffers.
const TX_BYTES: usize = 256 * 1024;

/// Largest plain text in one TLS record.
const RECORD_PLAINTEXT_MAX_BYTES: usize = 16 * 1024;

/// A bound on what a record adds to its plain text: header (5), explicit nonce or IV (16),
/// MAC or tag (48 for SHA-384), CBC padding (16), with room to spare.
const RECORD_OVERHEAD_MAX_BYTES: usize = 256;

/// Plain text encrypted per `SSL_write`: its records fit an empty send buffer.
const TX_CHUNK_BYTES: usize =
    TX_BYTES - (TX_BYTES / RECORD_PLAINTEXT_MAX_BYTES + 1) * RECORD_OVERHEAD_MAX_BYTES;

/// Most receive/send rounds of one TLS handshake. A handshake is two or three flights; the
/// bound stops a client that trickles its handshake a byte at a time from holding the
/// connection in it forever.
const HANDSHAKE_ROUNDS_MAX: usize = 4096;

/// Ciphertext worst case for `plain_bytes` of plain text in records.
fn sealed_bytes_max(plain_bytes: usize) -> usize {
    plain_bytes + (plain_bytes / RECORD_PLAINTEXT_MAX_BYTES + 1) * RECORD_OVERHEAD_MAX_BYTES
}

/// OpenSSL's BIO: ciphertext in memory, on both sides.
struct CipherIo {
    /// Received ciphertext; `rx[rx_start..rx_end]` is not yet read by OpenSSL. `None` while
    /// the ring receives into it (or after that receive was cancelled).
    rx: Option<IoBuf>,
    rx_start: usize,
    rx_end: usize,
    /// Ciphertext to send: `tx[..tx_len]`.
    tx: Option<IoBuf>,
    tx_len: usize,
}

impl Read for CipherIo {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        let Some(rx) = self.rx.as_ref() else {
            return Err(io::ErrorKind::WouldBlock.into());
        };
        let available = self.rx_end - self.rx_start;
        if available == 0 {
            // OpenSSL turns this into WANT_READ: the reader receives more.
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let count = available.min(out.len());
        out[..count].copy_from_slice(&rx[self.rx_start..self.rx_start + count]);
        self.rx_start += count;
        Ok(count)
    }
}

impl Write for CipherIo {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let Some(tx) = self.tx.as_mut() else {
            return Err(io::ErrorKind::WouldBlock.into());
        };
        let count = (tx.len() - self.tx_len).min(data.len());
        if count == 0 && !data.is_empty() {
            // OpenSSL turns this into WANT_WRITE: flush, then retry the same call.
            return Err(io::ErrorKind::WouldBlock.into());
        }
        tx[self.tx_len..self.tx_len + count].copy_from_slice(&data[..count]);
        self.tx_len += count;
        Ok(count)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// Which task is waiting for a send to finish.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Side {
    /// The connection task (handshake) or the reader.
    Reader = 0,
    /// The writer.
    Writer = 1,
}

/// The TLS state of one connection.
pub(crate) struct TlsSession {
    ssl: RefCell<SslStream<CipherIo>>,
    /// The other send buffer, `None` while it is on the wire.
    tx_spare: RefCell<Option<IoBuf>>,
    /// A ciphertext send is in flight.
    sending: Cell<bool>,
    /// Tasks waiting for that send to finish (indexed by [`Side`]).
    send_waiters: [WakerCell; 2],
    /// A TLS error or a lost buffer: nothing more goes through this session.
    failed: Cell<bool>,
}

fn tls_error(err: impl std::fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("TLS: {err}"))
}

fn broken() -> io::Error {
    io::Error::new(io::ErrorKind::BrokenPipe, "TLS session already failed")
}

/// Clears `sending` and fails the session if a send's future is dropped before it finishes
/// (its buffer is then lost to the cancelled operation).
struct SendGuard<'a> {
    session: &'a TlsSession,
    finished: bool,
}

impl Drop for SendGuard<'_> {
    fn drop(&mut self) {
        if !self.finished {
            self.session.failed.set(true);
        }
        self.session.sending.set(false);
        for waiter in &self.session.send_waiters {
            waiter.wake();
        }
    }
}

impl TlsSession {
    /// Runs the server side of the TLS handshake on `stream` (right after the STARTTLS ACK
    /// was sent). Returns the session and the identity the client proved, if any; an error
    /// (a bad or foreign handshake, a client gone) ends the connection.
    pub(crate) async fn accept(
        stream: &Stream,
        credentials: &TlsCredentials,
    ) -> IoResult<(TlsSession, Option<TlsIdentity>)> {
        let ssl = credentials.new_ssl().map_err(tls_error)?;
        let io = CipherIo {
            rx: Some(IoBuf::zeroed(RX_BYTES)),
            rx_start: 0,
            rx_end: 0,
            tx: Some(IoBuf::zeroed(TX_BYTES)),
            tx_len: 0,
        };
        let session = TlsSession {
            ssl: RefCell::new(SslStream::new(ssl, io).map_err(tls_error)?),
            tx_spare: RefCell::new(Some(IoBuf::zeroed(TX_BYTES))),
            sending: Cell::new(false),
            send_waiters: [WakerCell::default(), WakerCell::default()],
            failed: Cell::new(false),
        };
        for _ in 0..HANDSHAKE_ROUNDS_MAX {
            let result = session.ssl.borrow_mut().accept();
            match result {
                Ok(()) => {
                    session.flush(stream, Side::Reader).await?;
                    let identity = credentials.identity(session.ssl.borrow().ssl());
                    return Ok((session, identity));
                }
                Err(err) if err.code() == ErrorCode::WANT_READ => {
                    session.flush(stream, Side::Reader).await?;
                    if !session.fill_rx(stream).await? {
                        return Err(io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            "client closed the connection during the TLS handshake",
                        ));
                    }
                }
                Err(err) if err.code() == ErrorCode::WANT_WRITE => {
                    session.flush(stream, Side::Reader).await?;
                }
                Err(err) => {
                    // The alert OpenSSL queued tells the client why; best effort.
                    let _ = session.flush(stream, Side::Reader).await;
                    return Err(tls_error(err));
                }
            }
        }
        Err(tls_error("the handshake took too many rounds"))
    }

    fn tx_len(&self) -> usize {
        self.ssl.borrow_mut().get_mut().tx_len
    }

    /// Receives ciphertext into the (fully read) receive buffer; false at end of stream.
    async fn fill_rx(&self, stream: &Stream) -> IoResult<bool> {
        let buf = {
            let mut ssl = self.ssl.borrow_mut();
            let io = ssl.get_mut();
            debug_assert_eq!(io.rx_start, io.rx_end, "receiving over unread ciphertext");
            io.rx.take()
        };
        let Some(buf) = buf else {
            self.failed.set(true);
            return Err(broken());
        };
        // If this future is dropped the buffer goes with the cancelled receive: `rx` stays
        // `None` and later reads fail (the connection is ending then anyway).
        let (buf, count) = stream.recv(buf, 0).await?;
        let mut ssl = self.ssl.borrow_mut();
        let io = ssl.get_mut();
        io.rx = Some(buf);
        io.rx_start = 0;
        io.rx_end = count;
        Ok(count > 0)
    }

    /// Sends every ciphertext byte produced so far (also what the other task produced), in
    /// order; waits for a send in flight first.
    async fn flush(&self, stream: &Stream, side: Side) -> IoResult<()> {
        // Bounded: each pass sends the pending bytes or waits for the send in flight, which
        // finishes on its own; nothing is added while we send but what another task produces,
        // and that task flushes it itself if we are gone.
        loop {
            if self.failed.get() {
                return Err(broken());
            }
            if self.tx_len() == 0 {
                return Ok(());
            }
            if self.sending.get() {
                wait_until(&self.send_waiters[side as usize], || !self.sending.get()).await;
                continue;
            }
            let Some(spare) = self.tx_spare.borrow_mut().take() else {
                self.failed.set(true);
                return Err(broken());
            };
            let (full, len) = {
                let mut ssl = self.ssl.borrow_mut();
                let io = ssl.get_mut();
                let full = io
                    .tx
                    .replace(spare)
                    .expect("the filling buffer is always present");
                (full, std::mem::replace(&mut io.tx_len, 0))
            };
            self.sending.set(true);
            let mut guard = SendGuard {
                session: self,
                finished: false,
            };
            let result = stream.send_all(full, len).await;
            guard.finished = true;
            match result {
                Ok(buf) => *self.tx_spare.borrow_mut() = Some(buf),
                Err(err) => {
                    self.failed.set(true);
                    return Err(err);
                }
            }
            drop(guard);
        }
    }

    /// Receives plain text into `buf[start..end]` (never past `end`), decrypting as much
    /// ciphertext as needed; returns the buffer and the count (0: the client closed).
    pub(crate) async fn recv(
        &self,
        stream: &Stream,
        mut buf: IoBuf,
        start: usize,
        end: usize,
    ) -> IoResult<(IoBuf, usize)> {
        if start >= end || end > buf.len() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "TLS recv into {start}..{end} of a {}-byte buffer",
                    buf.len()
                ),
            ));
        }
        // Bounded by the stream: each pass returns, or receives ciphertext (which OpenSSL
        // consumes on the next pass), or sends what OpenSSL wrote.
        loop {
            if self.failed.get() {
                return Err(broken());
            }
            let result = self.ssl.borrow_mut().ssl_read(&mut buf[start..end]);
            // Reading can produce records to send (a TLS 1.3 KeyUpdate answer). If a send is
            // in flight, its flush loop sends them after its own bytes.
            if self.tx_len() > 0 && !self.sending.get() {
                self.flush(stream, Side::Reader).await?;
            }
            match result {
                Ok(count) => {
                    debug_assert!(count > 0 && count <= end - start);
                    return Ok((buf, count));
                }
                Err(err) => match err.code() {
                    // close_notify: the client ended TLS cleanly.
                    ErrorCode::ZERO_RETURN => return Ok((buf, 0)),
                    ErrorCode::WANT_READ => {
                        if !self.fill_rx(stream).await? {
                            return Ok((buf, 0));
                        }
                    }
                    ErrorCode::WANT_WRITE => self.flush(stream, Side::Reader).await?,
                    _ => {
                        self.failed.set(true);
                        return Err(tls_error(err));
                    }
                },
            }
        }
    }

    /// Encrypts and sends `buf[..len]`; returns the buffer once every record is on the wire.
    pub(crate) async fn send_all(
        &self,
        stream: &Stream,
        buf: IoBuf,
        len: usize,
    ) -> IoResult<IoBuf> {
        if len > buf.len() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("TLS send of {len} bytes from a {}-byte buffer", buf.len()),
            ));
        }
        self.seal(stream, &buf[..len]).await?;
        self.flush(stream, Side::Writer).await?;
        Ok(buf)
    }

    /// Encrypts and sends `slices` one after the other, as one stream of plain text; returns
    /// once every record is on the wire. The slices are read in place: OpenSSL encrypts from
    /// them (a READ reply's header, then the data cache's blocks), no copy of ours first.
    /// Each slice ends a record (OpenSSL seals what one `SSL_write` gets), so a caller hands
    /// few, large slices.
    pub(crate) async fn send_slices<'a>(
        &self,
        stream: &Stream,
        slices: impl IntoIterator<Item = &'a [u8]>,
    ) -> IoResult<()> {
        // Bounded by the slices.
        for slice in slices {
            self.seal(stream, slice).await?;
        }
        self.flush(stream, Side::Writer).await
    }

    /// Encrypts `data` into the send buffers, flushing them as they fill; the last records
    /// may still be unsent when this returns.
    async fn seal(&self, stream: &Stream, data: &[u8]) -> IoResult<()> {
        let len = data.len();
        let mut done = 0;
        // Bounded: each pass encrypts a chunk, or flushes the send buffer (which empties it,
        // so the next pass encrypts).
        while done < len {
            if self.failed.get() {
                return Err(broken());
            }
            let chunk = (len - done).min(TX_CHUNK_BYTES);
            if self.tx_len() + sealed_bytes_max(chunk) > TX_BYTES {
                self.flush(stream, Side::Writer).await?;
                continue;
            }
            let result = self.ssl.borrow_mut().ssl_write(&data[done..done + chunk]);
            match result {
                Ok(count) => {
                    debug_assert!(count > 0 && count <= chunk);
                    done += count;
                }
                // Retried with the same bytes after the flush, as OpenSSL requires.
                Err(err) if err.code() == ErrorCode::WANT_WRITE => {
                    self.flush(stream, Side::Writer).await?;
                }
                Err(err) => {
                    self.failed.set(true);
                    return Err(tls_error(err));
                }
            }
        }
        Ok(())
    }

    /// The protocol version and suite agreed, for the log (`TLSv1.3 TLS_AES_128_GCM_SHA256`).
    pub(crate) fn describe(&self) -> String {
        let ssl = self.ssl.borrow();
        let ssl = ssl.ssl();
        let cipher = ssl.current_cipher().map_or("none", |c| c.name());
        format!("{} {cipher}", ssl.version_str())
    }

    /// Sends close_notify (best effort) before the connection closes.
    pub(crate) async fn close(&self, stream: &Stream) {
        if self.failed.get() {
            return;
        }
        let _ = self.ssl.borrow_mut().shutdown();
        let _ = self.flush(stream, Side::Writer).await;
    }
}
