//! One connection's TLS session, on the reactor that owns the connection.
//!
//! Sans-I/O over the ring: OpenSSL never touches the socket. Its BIO is [`CipherIo`], two
//! buffers in memory: ciphertext the reader received with the ring's `recv` (OpenSSL reads it
//! from there), and ciphertext OpenSSL produced (sent with the ring's `send`). OpenSSL runs
//! the handshake. After it, for TLS 1.3 with AES-GCM (what qemu's and libnbd's GnuTLS agree
//! on), our record layer (`tls_records.rs`) takes over the same buffers: records are opened
//! from the receive buffer straight into the inbox or a WRITE's blocks, and sealed from a
//! reply's buffer or the data cache's blocks (`send_slices`) straight into the send buffer;
//! the cipher's pass is the only one. A record that reaches past what the caller asked for
//! (the next request's header) is opened in place in the receive buffer and handed out from
//! there. Otherwise (TLS 1.2, ChaCha20) OpenSSL's record layer stays: `SSL_read` and
//! `SSL_write`, with its own copies (see `docs/tls.md`). No thread, no plain-text staging
//! buffer.
//!
//! Two tasks use a session: the connection's reader (`recv`) and its writer (`send_all`),
//! never at the same moment (one thread) and never holding a borrow across an await. Sends are
//! serialised: one ciphertext buffer is filled while the other is on the wire, and whoever
//! flushes sends everything produced so far, in order (records leave in the order OpenSSL
//! or our record layer sealed them). With OpenSSL's record layer the reader may need to send
//! too (a KeyUpdate answer while reading); with ours it never does: the answer is sealed
//! before the writer's next record, as RFC 8446 section 4.6.3 allows.

use std::cell::{Cell, OnceCell, RefCell};
use std::io::{self, Read, Write};

use openssl::ssl::{ErrorCode, SslStream};
use oxpool_io::rt::net::Stream;
use oxpool_io::{IoBuf, IoResult, Scatter};

use super::task::{wait_until, WakerCell};
use super::tls::{TlsCredentials, TlsIdentity};
use super::tls_records::{
    content_bytes_max, record_bytes, Opened, Records, ALERT_RECORD_BYTES, HEADER_BYTES,
    PLAINTEXT_MAX_BYTES, RECORD_MAX_BYTES, SEAL_EXTRA_MAX_BYTES,
};

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

/// OpenSSL's BIO: ciphertext in memory, on both sides. Our record layer uses the same
/// buffers once it takes over.
struct CipherIo {
    /// Received ciphertext; `rx[rx_start..rx_end]` is not yet read by OpenSSL (or opened by
    /// our record layer). `None` while the ring receives into it (or after that receive was
    /// cancelled).
    rx: Option<IoBuf>,
    rx_start: usize,
    rx_end: usize,
    /// Our record layer's plain text opened in place and not yet handed out:
    /// `rx[plain_start..plain_end]`, before `rx_start`.
    plain_start: usize,
    plain_end: usize,
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
    /// Our record layer, once the handshake agreed on what it does; else OpenSSL's is used.
    records: OnceCell<RefCell<Records>>,
    /// Our record layer opened the client's close_notify.
    closed: Cell<bool>,
    /// Our record layer refused a record: the fatal alert to send as the connection closes.
    alert_owed: Cell<Option<u8>>,
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
            plain_start: 0,
            plain_end: 0,
            tx: Some(IoBuf::zeroed(TX_BYTES)),
            tx_len: 0,
        };
        let session = TlsSession {
            ssl: RefCell::new(SslStream::new(ssl, io).map_err(tls_error)?),
            records: OnceCell::new(),
            closed: Cell::new(false),
            alert_owed: Cell::new(None),
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
                    let (identity, records) = {
                        let ssl = session.ssl.borrow();
                        // Without read-ahead OpenSSL holds no record of the client's beyond
                        // the handshake (nor plain text from one): what follows is in our
                        // receive buffer. `take_records` checks the records (SSL_has_pending)
                        // and keeps OpenSSL's layer if any were held.
                        debug_assert_eq!(ssl.ssl().pending(), 0);
                        (
                            credentials.identity(ssl.ssl()),
                            credentials.take_records(ssl.ssl()),
                        )
                    };
                    if let Some(records) = records {
                        let _ = session.records.set(RefCell::new(records));
                    }
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
                    // The server's own reason (an unknown PSK identity) over OpenSSL's
                    // follow-on error, which would send the reader of the log astray.
                    let reason = credentials.handshake_failure(session.ssl.borrow().ssl());
                    return Err(match reason {
                        Some(reason) => tls_error(reason),
                        None => tls_error(err),
                    });
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
        if self.records.get().is_some() {
            let dest = &mut Destination::Slice(&mut buf[start..end], 0);
            let count = self.recv_records(stream, dest).await?;
            return Ok((buf, count));
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

    /// Receives plain text into `blocks` after the bytes filled so far, up to byte `end`;
    /// returns the blocks and the count (0: the client closed). With our record layer a
    /// record is opened straight into the blocks it spans; with OpenSSL's, into the block
    /// being filled.
    pub(crate) async fn recv_scatter(
        &self,
        stream: &Stream,
        mut blocks: Scatter,
        end: usize,
    ) -> IoResult<(Scatter, usize)> {
        if blocks.filled_bytes() >= end || end > blocks.len_bytes() {
            return Err(io::Error::other("a TLS receive past the end of its blocks"));
        }
        if self.records.get().is_none() {
            // Taken out for OpenSSL's `SSL_read`, which takes one buffer; an empty buffer
            // holds its place (no allocation).
            let (index, buf, at) = blocks
                .swap_at_filled(IoBuf::zeroed(0))
                .ok_or_else(|| io::Error::other("a receive past the end of its blocks"))?;
            let stop = buf.len().min(at + (end - blocks.filled_bytes()));
            let (buf, count) = self.recv(stream, buf, at, stop).await?;
            blocks.put_back(index, buf);
            blocks.mark_filled(count);
            return Ok((blocks, count));
        }
        let dest = &mut Destination::Blocks {
            blocks: &mut blocks,
            end,
        };
        let count = self.recv_records(stream, dest).await?;
        Ok((blocks, count))
    }

    /// Our record layer: plain text into `dest`, receiving ciphertext until a record gives
    /// some; the count (0: the client closed).
    async fn recv_records(&self, stream: &Stream, dest: &mut Destination<'_>) -> IoResult<usize> {
        // Bounded by the stream: each pass returns or receives more ciphertext.
        loop {
            match self.open_received(dest)? {
                Step::Filled(count) => return Ok(count),
                Step::Closed => return Ok(0),
                Step::NeedBytes => {
                    if !self.fill_rx_records(stream).await? {
                        return Ok(0);
                    }
                }
            }
        }
    }

    /// Our record layer: opens the whole records already received into `dest` while there
    /// is room, without waiting.
    fn open_received(&self, dest: &mut Destination<'_>) -> IoResult<Step> {
        let records = self.records.get().expect("our record layer");
        let mut records = records.borrow_mut();
        let mut ssl = self.ssl.borrow_mut();
        let io = ssl.get_mut();
        let mut filled = 0;
        let fail = |err: super::tls_records::RecordError| {
            self.failed.set(true);
            self.alert_owed.set(err.alert());
            tls_error(err)
        };
        // Bounded: each pass hands out pending plain text or consumes a whole record of the
        // receive buffer, or returns.
        loop {
            if self.failed.get() {
                return Err(broken());
            }
            let room = dest.room();
            if room == 0 || (filled > 0 && !dest.takes_many()) {
                debug_assert!(filled > 0);
                return Ok(Step::Filled(filled));
            }
            let Some(rx) = io.rx.as_mut() else {
                self.failed.set(true);
                return Err(broken());
            };
            if io.plain_start < io.plain_end {
                let count = room.min(io.plain_end - io.plain_start);
                dest.copy_in(&rx[io.plain_start..io.plain_start + count]);
                io.plain_start += count;
                filled += count;
                continue;
            }
            // What was filled so far, else why nothing was.
            let so_far = |otherwise| {
                if filled > 0 {
                    Step::Filled(filled)
                } else {
                    otherwise
                }
            };
            if self.closed.get() {
                return Ok(so_far(Step::Closed));
            }
            let at = io.rx_start;
            let len = match record_bytes(&rx[at..io.rx_end]).map_err(fail)? {
                Some(len) if len <= io.rx_end - at => len,
                _ => return Ok(so_far(Step::NeedBytes)),
            };
            if content_bytes_max(len) <= room {
                if let Some(count) = records
                    .open_into(&rx[at..at + len], dest.pieces())
                    .map_err(fail)?
                {
                    dest.commit(count);
                    io.rx_start += len;
                    filled += count;
                    continue;
                }
                // Not application data (or padded): opened again below, in place.
            }
            let opened = records.open_in_place(&mut rx[at..at + len]).map_err(fail)?;
            io.rx_start += len;
            match opened {
                Opened::Data(count) => {
                    io.plain_start = at + HEADER_BYTES;
                    io.plain_end = at + HEADER_BYTES + count;
                }
                Opened::Control => {}
                Opened::Closed => self.closed.set(true),
            }
        }
    }

    /// Our record layer: receives more ciphertext after what is there (a partial record),
    /// first moving that to the front when a whole record might not fit after it; false at
    /// end of stream.
    async fn fill_rx_records(&self, stream: &Stream) -> IoResult<bool> {
        let (buf, at) = {
            let mut ssl = self.ssl.borrow_mut();
            let io = ssl.get_mut();
            debug_assert_eq!(io.plain_start, io.plain_end, "receiving over plain text");
            let Some(mut buf) = io.rx.take() else {
                self.failed.set(true);
                return Err(broken());
            };
            if io.rx_start == io.rx_end {
                (io.rx_start, io.rx_end) = (0, 0);
            } else if io.rx_start + RECORD_MAX_BYTES > buf.len() {
                // At most one record's bytes, once per receive buffer's worth.
                buf.copy_within(io.rx_start..io.rx_end, 0);
                (io.rx_start, io.rx_end) = (0, io.rx_end - io.rx_start);
            }
            (io.plain_start, io.plain_end) = (0, 0);
            (buf, io.rx_end)
        };
        // If this future is dropped the buffer goes with the cancelled receive: `rx` stays
        // `None` and later reads fail (the connection is ending then anyway).
        let end = buf.len();
        let (buf, count) = stream.recv_range(buf, at, end).await?;
        let mut ssl = self.ssl.borrow_mut();
        let io = ssl.get_mut();
        io.rx = Some(buf);
        io.rx_end += count;
        Ok(count > 0)
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
        if let Some(records) = self.records.get() {
            return self.seal_records(stream, records, data).await;
        }
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

    /// Our record layer: seals `data` in records of at most 16 KiB straight into the send
    /// buffers, flushing them as they fill.
    async fn seal_records(
        &self,
        stream: &Stream,
        records: &RefCell<Records>,
        data: &[u8],
    ) -> IoResult<()> {
        let mut done = 0;
        // Bounded: each pass seals a record, or flushes the send buffer (which empties it, so
        // the next pass seals).
        while done < data.len() {
            if self.failed.get() {
                return Err(broken());
            }
            let chunk = (data.len() - done).min(PLAINTEXT_MAX_BYTES);
            if self.tx_len() + chunk + SEAL_EXTRA_MAX_BYTES > TX_BYTES {
                self.flush(stream, Side::Writer).await?;
                continue;
            }
            let sealed = {
                let mut ssl = self.ssl.borrow_mut();
                let io = ssl.get_mut();
                let tx = io
                    .tx
                    .as_mut()
                    .expect("the filling buffer is always present");
                let sealed = records
                    .borrow_mut()
                    .seal(&data[done..done + chunk], &mut tx[io.tx_len..]);
                if let Ok(count) = sealed {
                    io.tx_len += count;
                }
                sealed
            };
            if let Err(err) = sealed {
                self.failed.set(true);
                return Err(tls_error(err));
            }
            done += chunk;
        }
        Ok(())
    }

    /// The protocol version and suite agreed, for the log (`TLSv1.3 TLS_AES_128_GCM_SHA256`).
    pub(crate) fn describe(&self) -> String {
        let ssl = self.ssl.borrow();
        let ssl = ssl.ssl();
        let cipher = ssl.current_cipher().map_or("none", |c| c.name());
        let records = if self.records.get().is_some() {
            "oxpool"
        } else {
            "OpenSSL"
        };
        format!("{} {cipher}, {records} records", ssl.version_str())
    }

    /// Sends close_notify (best effort) before the connection closes.
    pub(crate) async fn close(&self, stream: &Stream) {
        if let Some(records) = self.records.get() {
            return self.close_records(stream, records).await;
        }
        if self.failed.get() {
            return;
        }
        let _ = self.ssl.borrow_mut().shutdown();
        let _ = self.flush(stream, Side::Writer).await;
    }

    /// Our record layer's close: close_notify, or after a record it refused the fatal alert
    /// that says why (RFC 8446 section 5.2: bad_record_mac for a record that failed its tag).
    async fn close_records(&self, stream: &Stream, records: &RefCell<Records>) {
        let alert = self.alert_owed.take();
        if self.failed.get() && alert.is_none() {
            return;
        }
        if !self.failed.get()
            && self.tx_len() + ALERT_RECORD_BYTES > TX_BYTES
            && self.flush(stream, Side::Writer).await.is_err()
        {
            return;
        }
        let sealed = {
            let mut ssl = self.ssl.borrow_mut();
            let io = ssl.get_mut();
            let Some(mut tx) = io.tx.take() else {
                return;
            };
            let mut records = records.borrow_mut();
            let room = &mut tx[io.tx_len..];
            let count = match alert {
                _ if room.len() < ALERT_RECORD_BYTES => Err(()),
                Some(description) => records.seal_fatal_alert(description, room).map_err(|_| ()),
                None => records.seal_close_notify(room).map_err(|_| ()),
            };
            let len = io.tx_len + count.unwrap_or(0);
            io.tx_len = 0;
            count.map(|_| (tx, len))
        };
        // Best effort, straight to the socket: the session is over (failed or closing), and
        // no send is in flight (the writer has finished).
        if let Ok((tx, len)) = sealed {
            if !self.sending.get() {
                let _ = stream.send_all(tx, len).await;
            }
        }
    }
}

/// Where our record layer puts plain text.
enum Destination<'a> {
    /// A contiguous range, filled from the start (the second field counts what is filled).
    Slice(&'a mut [u8], usize),
    /// A WRITE's blocks after their filled bytes, up to byte `end`.
    Blocks { blocks: &'a mut Scatter, end: usize },
}

impl Destination<'_> {
    /// Whether to go on opening records once some plain text is in. Blocks: yes, up to
    /// their end (the payload of one WRITE). A slice (the inbox, for request headers and small
    /// payloads): one record at a time, as `SSL_read` gives, so that a large WRITE's payload
    /// is opened into its blocks rather than into the inbox and copied from there.
    fn takes_many(&self) -> bool {
        matches!(self, Destination::Blocks { .. })
    }

    /// Bytes still to fill.
    fn room(&self) -> usize {
        match self {
            Destination::Slice(slice, filled) => slice.len() - filled,
            Destination::Blocks { blocks, end } => end - blocks.filled_bytes(),
        }
    }

    /// The room, as pieces in order, for a record opened straight into it.
    fn pieces(&mut self) -> impl Iterator<Item = &mut [u8]> {
        let (slice, blocks) = match self {
            Destination::Slice(slice, filled) => (Some(&mut slice[*filled..]), None),
            Destination::Blocks { blocks, end } => (None, Some(blocks.unfilled_mut(*end))),
        };
        slice.into_iter().chain(blocks.into_iter().flatten())
    }

    /// Counts `count` bytes written through [`Destination::pieces`].
    fn commit(&mut self, count: usize) {
        match self {
            Destination::Slice(_, filled) => *filled += count,
            Destination::Blocks { blocks, .. } => blocks.mark_filled(count),
        }
    }

    /// Copies `data` (at most the room) after what is filled.
    fn copy_in(&mut self, data: &[u8]) {
        match self {
            Destination::Slice(slice, filled) => {
                slice[*filled..*filled + data.len()].copy_from_slice(data);
                *filled += data.len();
            }
            Destination::Blocks { blocks, .. } => blocks.copy_in(data),
        }
    }
}

/// What opening the received records gave.
enum Step {
    /// This many bytes (more than 0) of plain text.
    Filled(usize),
    /// The client's close_notify, and nothing before it to hand out.
    Closed,
    /// No whole record yet: receive more ciphertext.
    NeedBytes,
}
