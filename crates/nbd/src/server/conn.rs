//! One NBD connection on a reactor thread.
//!
//! - The connection task does the handshake, then becomes the **reader**: it receives into a
//!   64 KiB inbox, decodes request headers, takes a free **slot** for each request (waiting when
//!   none is free: back-pressure, nothing more is read), validates it, receives a WRITE payload
//!   straight into the slot's buffer, and hands the request to the slot's **request task**.
//! - Each slot has one request task for the connection's life (spawned after the handshake,
//!   so that serving a request allocates nothing: no task box, no waker per request). It runs
//!   the volume operation and leaves its reply in its slot (a small inline array, or the
//!   slot's buffer for READ data and BLOCK_STATUS), queues the slot, and waits for the next.
//! - The **writer** task sends queued replies in completion order (any order is allowed):
//!   small replies are copied into one batch and sent together; large ones go straight from
//!   the slot's buffer, and a large READ's data from the data cache's blocks where they are
//!   (`read_in_parts`: one `sendmsg` of the header and the blocks in clear text, with the
//!   large READ replies queued behind it; encrypted from them over TLS). A slot is free again
//!   once its reply is sent.
//!
//! Bounds: slots per connection (requests in flight); bytes of slot buffers per connection
//! (a request that would exceed it waits for earlier ones; idle slots' buffers are dropped
//! first); the inbox and the batch buffer are fixed. All state is on one thread (`Rc`,
//! `RefCell`); no borrow is held across an await.

use std::cell::{Cell, OnceCell, RefCell};
use std::collections::VecDeque;
use std::io;
use std::os::fd::AsRawFd;
use std::rc::Rc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use oxpool_engine::{BlockState, ReadPart, Volume};
use oxpool_io::rt;
use oxpool_io::rt::net::{SendList, Stream};
use oxpool_io::warn_limit::WarnLimit;
use oxpool_io::{IoBuf, Scatter};

use super::change_maps::{ChangeMaps, ExportCatalog};
use super::exports::{ExportId, OfferedNames, ReactorCommand};
use super::task::{select, wait_until, CatchUnwind, Either, WakerCell};
use super::tls::{self, TlsIdentity};
use super::tls_session::TlsSession;
use super::{errno_for, ConnectionPermit, Limits, Shared};
use crate::proto::reply::{
    block_status_chunk_bytes, encode_block_status, encode_error_reply, encode_offset_data_header,
    encode_offset_hole, encode_simple_reply, Done, ERROR_REPLY_MAX_BYTES, OFFSET_DATA_HEADER_BYTES,
    OFFSET_HOLE_CHUNK_BYTES, SIMPLE_REPLY_BYTES,
};
use crate::proto::{
    validate, BlockStatusDescriptor, BlockStatusFlags, Command, CommandFlags, Cookie, Errno,
    ExportAccess, ExportInfo, Handshake, HandshakeStatus, MetaContext, Negotiated, ProtocolError,
    Request, RequestDecoder, MAX_BLOCK_BYTES, REQUEST_HEADER_BYTES,
};

/// Receive buffer of the reader: request headers and small WRITE payloads arrive here, many
/// per `recv`.
const INBOX_BYTES: usize = 64 * 1024;

/// A WRITE payload with at least this much still to come is received straight into its slot's
/// buffer; a smaller rest comes through the inbox with the requests behind it (one `recv` for
/// several small writes, at the cost of a copy).
const DIRECT_RECV_MIN_BYTES: usize = 32 * 1024;

/// The writer's batch buffer (also the handshake's send buffer).
const BATCH_BYTES: usize = 64 * 1024;

/// Replies up to this size, header included, are copied into the batch. Larger READ replies
/// are sent from the data cache's blocks where `run_request` shares them (in clear text;
/// over TLS with blocks of a record or more), other large ones from their slot.
const BATCH_COPY_MAX_BYTES: usize = 16 * 1024;

/// Plain text of a full TLS record: over TLS, READ data is shared from the data cache only
/// for volumes whose blocks fill a record at least (see `run_request`).
const TLS_RECORD_PLAINTEXT_BYTES: usize = 16 * 1024;

/// Room for a reply without payload: a simple reply (16) or an ERROR chunk without message (26).
const INLINE_REPLY_BYTES: usize = 32;

/// Smallest slot buffer allocated (then reused for every later request of the slot).
const SLOT_BUFFER_MIN_BYTES: usize = 16 * 1024;

/// Largest slot buffer: a maximal READ reply with its chunk headers (see `read_need_bytes`).
const SLOT_BUFFER_MAX_BYTES: usize = MAX_BLOCK_BYTES as usize + 4096;

/// BLOCK_STATUS looks at most this much of the volume per request; the protocol lets the reply
/// cover a prefix of the range, and the client asks again for the rest.
const BLOCK_STATUS_QUERY_MAX_BYTES: u64 = 1 << 30;

/// Most extents in one BLOCK_STATUS reply (keeps the reply within the minimum slot buffer).
const BLOCK_STATUS_DESCRIPTORS_MAX: usize = 1024;

/// Hole runs shorter than this (only possible at the unaligned edges of a read) are sent as
/// data: an OFFSET_HOLE chunk costs 32 bytes, more than the zeros it replaces. This is also
/// what bounds a READ reply to `length + OFFSET_DATA_HEADER_BYTES` (see `read_structured`).
const HOLE_CHUNK_MIN_BYTES: u64 = 64;

/// The connections of one reactor, so that shutdown can stop them all.
pub(crate) struct ReactorConns {
    entries: RefCell<Vec<Option<Rc<Conn>>>>,
    free: RefCell<Vec<usize>>,
    live: Cell<usize>,
    stopping: Cell<bool>,
    drained: WakerCell,
}

impl ReactorConns {
    pub(crate) fn new() -> Self {
        ReactorConns {
            entries: RefCell::new(Vec::new()),
            free: RefCell::new(Vec::new()),
            live: Cell::new(0),
            stopping: Cell::new(false),
            drained: WakerCell::default(),
        }
    }

    /// Connections registered and not yet finished.
    pub(crate) fn live(&self) -> usize {
        self.live.get()
    }

    /// Woken each time a connection finishes.
    pub(crate) fn drained_waker(&self) -> &WakerCell {
        &self.drained
    }

    /// Tells every connection to stop reading requests; later registrations stop at once.
    pub(crate) fn stop_all(&self) {
        self.stopping.set(true);
        let conns: Vec<Rc<Conn>> = self.entries.borrow().iter().flatten().cloned().collect();
        for conn in conns {
            conn.stop();
        }
    }

    /// Applies an administrator's command to the connections of its export.
    pub(crate) fn apply(&self, command: ReactorCommand) {
        let (ReactorCommand::Stop(id) | ReactorCommand::Break(id)) = command;
        let conns: Vec<Rc<Conn>> = self
            .entries
            .borrow()
            .iter()
            .flatten()
            .filter(|c| c.export.get() == Some(id))
            .cloned()
            .collect();
        for conn in conns {
            match command {
                ReactorCommand::Stop(_) => conn.stop(),
                ReactorCommand::Break(_) => conn.break_connection(),
            }
        }
    }

    fn register(self: &Rc<Self>, conn: Rc<Conn>) -> Registration {
        if self.stopping.get() {
            conn.stop();
        }
        let mut entries = self.entries.borrow_mut();
        let index = match self.free.borrow_mut().pop() {
            Some(index) => {
                entries[index] = Some(conn);
                index
            }
            None => {
                entries.push(Some(conn));
                entries.len() - 1
            }
        };
        self.live.set(self.live.get() + 1);
        Registration {
            conns: self.clone(),
            index,
        }
    }
}

/// A connection's entry in [`ReactorConns`]; removed when dropped (also when unwinding).
struct Registration {
    conns: Rc<ReactorConns>,
    index: usize,
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.conns.entries.borrow_mut()[self.index] = None;
        self.conns.free.borrow_mut().push(self.index);
        self.conns.live.set(self.conns.live.get() - 1);
        self.conns.drained.wake();
    }
}

/// Where a finished request's reply is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ReplyAt {
    /// Not finished (or the slot is free).
    Nowhere,
    /// The first `n` bytes of the slot's inline array.
    Inline(usize),
    /// The first `n` bytes of the slot's buffer.
    Buffer(usize),
    /// A READ reply sent on its own: its header is the first `n` bytes of the slot's buffer,
    /// its data the slot's read parts (their copied ranges are of the buffer from byte `n` on).
    Parts(usize),
}

/// One request slot: preallocated, reused for request after request.
struct Slot {
    /// WRITE payload in, READ / BLOCK_STATUS reply out. `None` until first needed, while a
    /// request task or a socket operation holds it, or after it was dropped to make room.
    buffer: Option<IoBuf>,
    /// A request handed to the slot's task and not yet taken by it, with its buffer.
    pending: Option<(Request, Option<IoBuf>)>,
    /// The slot's request task has ended (it panicked, or the connection is over).
    task_gone: bool,
    inline: [u8; INLINE_REPLY_BYTES],
    reply: ReplyAt,
    /// A READ's data as the volume handed it (see [`ReplyAt::Parts`]); empty otherwise. Kept
    /// from request to request for its capacity; cleared once sent, so that no cached block
    /// is held longer than its reply.
    parts: Vec<ReadPart>,
    /// A WRITE of whole volume blocks: the buffers its payload is received into, which the
    /// volume takes as the blocks (`Volume::write_blocks`). Empty otherwise; kept for its
    /// capacity.
    blocks: Scatter,
    /// Bytes of `blocks` charged to the connection's buffer budget until the slot is
    /// released (the blocks themselves go to the volume's dirty data, which has its own
    /// bound).
    blocks_charged_bytes: usize,
}

/// State of one connection, shared by its reader, writer and request tasks (one thread).
struct Conn {
    stream: Stream,
    /// Set once STARTTLS succeeded: every later byte goes through it.
    tls: OnceCell<TlsSession>,
    /// The writer's list for READ replies in parts in clear text (`send_parts`), kept for its
    /// capacity; out of the cell while a send has it (lost if that send fails).
    send_list: Cell<Option<SendList>>,
    limits: Limits,
    slots: RefCell<Vec<Slot>>,
    /// Free slot indices (capacity: the slot count).
    free_slots: RefCell<Vec<usize>>,
    /// Slots whose reply waits for the writer (capacity: the slot count).
    replies: RefCell<VecDeque<usize>>,
    /// Bytes of every slot buffer, in its slot or lent to a task or an operation.
    buffer_bytes: Cell<usize>,
    /// Slots taken and not yet released.
    in_flight: Cell<usize>,
    /// Releases so far: a waiting reader sees progress by this changing.
    releases: Cell<u64>,
    /// Shutdown asked the reader to stop.
    stopping: Cell<bool>,
    /// The peer is gone or a task failed: stop reading, drop replies.
    broken: Cell<bool>,
    reader_done: Cell<bool>,
    writer_done: Cell<bool>,
    reader_waker: WakerCell,
    writer_waker: WakerCell,
    /// Per slot: where its request task waits for a request.
    slot_wakers: Vec<WakerCell>,
    /// The export it negotiated (set once registered in the export table).
    export: Cell<Option<ExportId>>,
}

impl Conn {
    fn new(stream: Stream, limits: Limits) -> Conn {
        let slots = (0..limits.slots)
            .map(|_| Slot {
                buffer: None,
                pending: None,
                task_gone: false,
                inline: [0; INLINE_REPLY_BYTES],
                reply: ReplyAt::Nowhere,
                parts: Vec::new(),
                blocks: Scatter::default(),
                blocks_charged_bytes: 0,
            })
            .collect();
        Conn {
            stream,
            tls: OnceCell::new(),
            send_list: Cell::new(None),
            limits,
            slots: RefCell::new(slots),
            // Reversed so slot 0 is used first (traces are easier to read).
            free_slots: RefCell::new((0..limits.slots).rev().collect()),
            replies: RefCell::new(VecDeque::with_capacity(limits.slots)),
            buffer_bytes: Cell::new(0),
            in_flight: Cell::new(0),
            releases: Cell::new(0),
            stopping: Cell::new(false),
            broken: Cell::new(false),
            reader_done: Cell::new(false),
            writer_done: Cell::new(false),
            reader_waker: WakerCell::default(),
            writer_waker: WakerCell::default(),
            slot_wakers: (0..limits.slots).map(|_| WakerCell::default()).collect(),
            export: Cell::new(None),
        }
    }

    /// Receives into `buf[start..end]` (plain text, through TLS once it is on); the buffer
    /// and the count (0: the client closed).
    async fn recv_range(
        &self,
        buf: IoBuf,
        start: usize,
        end: usize,
    ) -> oxpool_io::IoResult<(IoBuf, usize)> {
        match self.tls.get() {
            None => self.stream.recv_range(buf, start, end).await,
            Some(tls) => tls.recv(&self.stream, buf, start, end).await,
        }
    }

    /// Receives into `blocks` after the bytes filled so far, up to byte `end` (one vectored
    /// receive in plain text; through TLS, records opened into the blocks they span); the
    /// scatter and the count (0: the client closed).
    async fn recv_scatter(
        &self,
        blocks: Scatter,
        end: usize,
    ) -> oxpool_io::IoResult<(Scatter, usize)> {
        match self.tls.get() {
            None => self.stream.recv_scatter(blocks, end).await,
            Some(tls) => tls.recv_scatter(&self.stream, blocks, end).await,
        }
    }

    /// Sends a READ reply held as parts through TLS: `header`, then each part's bytes (`data`
    /// is the buffer its copied parts are ranges of), encrypted where they are.
    async fn send_parts_tls(
        &self,
        header: &[u8],
        data: &[u8],
        parts: &[ReadPart],
    ) -> oxpool_io::IoResult<()> {
        let Some(tls) = self.tls.get() else {
            return Err(io::Error::other("a READ reply for TLS without TLS"));
        };
        let slices = std::iter::once(header).chain(parts.iter().map(|part| part.bytes(data)));
        tls.send_slices(&self.stream, slices).await
    }

    /// Sends `buf[..len]` entirely (through TLS once it is on) and returns the buffer.
    async fn send_all(&self, buf: IoBuf, len: usize) -> oxpool_io::IoResult<IoBuf> {
        match self.tls.get() {
            None => self.stream.send_all(buf, len).await,
            Some(tls) => tls.send_all(&self.stream, buf, len).await,
        }
    }

    /// Hands a validated request (and its buffer) to slot `index`'s request task.
    fn start_request(&self, index: usize, request: Request, buffer: Option<IoBuf>) {
        {
            let mut slots = self.slots.borrow_mut();
            let slot = &mut slots[index];
            debug_assert!(slot.pending.is_none(), "a slot holds two requests");
            if !slot.task_gone {
                slot.pending = Some((request, buffer));
                drop(slots);
                self.slot_wakers[index].wake();
                return;
            }
            // Only after a request task panicked, which broke the connection: nothing will
            // answer, so give the slot back at once.
            if buffer.is_some() {
                slot.buffer = buffer;
            }
        }
        self.release(index);
    }

    /// Wakes every request task (the reader is done: idle ones end).
    fn wake_request_tasks(&self) {
        for waker in &self.slot_wakers {
            waker.wake();
        }
    }

    fn stop(&self) {
        self.stopping.set(true);
        self.reader_waker.wake();
    }

    /// The reader should stop reading requests.
    fn halted(&self) -> bool {
        self.stopping.get() || self.broken.get()
    }

    /// The peer is gone (or a task failed): unblock the reader, drop the replies.
    fn break_connection(&self) {
        if !self.broken.replace(true) {
            self.stream.shutdown();
        }
        self.reader_waker.wake();
        self.writer_waker.wake();
    }

    /// Completes when the reader must stop (shutdown or a broken connection).
    async fn halt(&self) {
        wait_until(&self.reader_waker, || self.halted()).await;
    }

    fn try_acquire_slot(&self) -> Option<usize> {
        let index = self.free_slots.borrow_mut().pop()?;
        self.in_flight.set(self.in_flight.get() + 1);
        Some(index)
    }

    /// A free slot, waiting for one (back-pressure); `None` when the reader must stop.
    async fn acquire_slot(&self) -> Option<usize> {
        wait_until(&self.reader_waker, || {
            self.halted() || !self.free_slots.borrow().is_empty()
        })
        .await;
        if self.halted() {
            return None;
        }
        self.try_acquire_slot()
    }

    /// Frees a slot: its reply was sent or dropped.
    fn release(&self, index: usize) {
        {
            let mut slots = self.slots.borrow_mut();
            slots[index].reply = ReplyAt::Nowhere;
            // A reply dropped unsent (the connection broke) lets go of its cached blocks.
            slots[index].parts.clear();
            // Blocks a failed write left behind go back to the buffer pool.
            slots[index].blocks.clear();
            let charged_bytes = std::mem::take(&mut slots[index].blocks_charged_bytes);
            self.buffer_bytes
                .set(self.buffer_bytes.get() - charged_bytes);
        }
        self.free_slots.borrow_mut().push(index);
        self.in_flight.set(self.in_flight.get() - 1);
        self.releases.set(self.releases.get() + 1);
        self.reader_waker.wake();
        self.writer_waker.wake();
    }

    /// Takes slot `index`'s buffer, grown to at least `need_bytes` within the connection's
    /// budget; waits for other requests to finish when the budget is spent. `None` when the
    /// reader must stop.
    async fn reserve(&self, index: usize, need_bytes: usize) -> Option<IoBuf> {
        debug_assert!(need_bytes <= SLOT_BUFFER_MAX_BYTES);
        // Each pass either returns or waits for a release; releases come from requests in
        // flight, which finish on their own.
        loop {
            let current_bytes = self.slots.borrow()[index]
                .buffer
                .as_ref()
                .map_or(0, |b| b.len());
            if current_bytes >= need_bytes {
                return self.slots.borrow_mut()[index].buffer.take();
            }
            let new_bytes = grown_buffer_bytes(need_bytes);
            if self.try_charge(new_bytes - current_bytes) {
                self.slots.borrow_mut()[index].buffer = None;
                return Some(IoBuf::zeroed(new_bytes));
            }
            if !self.wait_for_release().await {
                return None;
            }
        }
    }

    /// Fills slot `index`'s blocks with `count` buffers of `block_bytes` for a WRITE of whole
    /// blocks, charged to the connection's budget like a slot buffer; waits for other
    /// requests to finish when the budget is spent. The blocks, or `None` when the reader
    /// must stop.
    async fn reserve_blocks(
        &self,
        index: usize,
        block_bytes: usize,
        count: usize,
    ) -> Option<Scatter> {
        // Through TLS the blocks are filled by a copy out of the session, which needs
        // initialised buffers; in plain text, new ones need no zeroing.
        let over_tls = self.tls.get().is_some();
        let need_bytes = block_bytes * count;
        debug_assert!(need_bytes <= SLOT_BUFFER_MAX_BYTES);
        // Each pass either returns or waits for a release; releases come from requests in
        // flight, which finish on their own.
        loop {
            if self.try_charge(need_bytes) {
                let mut slots = self.slots.borrow_mut();
                let slot = &mut slots[index];
                debug_assert_eq!(slot.blocks_charged_bytes, 0);
                slot.blocks_charged_bytes = need_bytes;
                let mut blocks = std::mem::take(&mut slot.blocks);
                drop(slots);
                debug_assert!(blocks.is_empty());
                for _ in 0..count {
                    if over_tls {
                        blocks.push(IoBuf::for_overwrite(block_bytes));
                    } else {
                        blocks.push_for_receive(block_bytes);
                    }
                }
                return Some(blocks);
            }
            if !self.wait_for_release().await {
                return None;
            }
        }
    }

    /// Waits until a request in flight releases its slot: true, or false when the reader
    /// must stop.
    async fn wait_for_release(&self) -> bool {
        let releases = self.releases.get();
        wait_until(&self.reader_waker, || {
            self.halted() || self.releases.get() != releases
        })
        .await;
        !self.halted()
    }

    /// Adds `extra_bytes` to the buffers' bytes if the budget allows it, after dropping idle
    /// slots' buffers if that makes room.
    fn try_charge(&self, extra_bytes: usize) -> bool {
        if self.buffer_bytes.get() + extra_bytes > self.limits.buffer_bytes {
            self.drop_idle_buffers(
                self.buffer_bytes.get() + extra_bytes - self.limits.buffer_bytes,
            );
        }
        if self.buffer_bytes.get() + extra_bytes > self.limits.buffer_bytes {
            return false;
        }
        self.buffer_bytes.set(self.buffer_bytes.get() + extra_bytes);
        true
    }

    /// Drops buffers of free slots until `wanted_bytes` are freed (or none is left).
    fn drop_idle_buffers(&self, wanted_bytes: usize) {
        let mut freed_bytes = 0;
        let free = self.free_slots.borrow();
        let mut slots = self.slots.borrow_mut();
        for &index in free.iter() {
            if freed_bytes >= wanted_bytes {
                break;
            }
            if let Some(buffer) = slots[index].buffer.take() {
                freed_bytes += buffer.len();
            }
        }
        self.buffer_bytes.set(self.buffer_bytes.get() - freed_bytes);
    }

    /// A buffer lent out was lost (its socket operation was cancelled): forget its bytes.
    fn forget_buffer(&self, bytes: usize) {
        self.buffer_bytes.set(self.buffer_bytes.get() - bytes);
    }

    /// Stores a finished request's reply (and gives its buffer and its read parts back), then
    /// queues it.
    fn complete(&self, index: usize, reply: Reply, buffer: Option<IoBuf>, parts: Vec<ReadPart>) {
        {
            let mut slots = self.slots.borrow_mut();
            let slot = &mut slots[index];
            if buffer.is_some() {
                slot.buffer = buffer;
            }
            if parts.capacity() > 0 {
                slot.parts = parts;
            }
            slot.reply = match reply {
                Reply::Inline { bytes, len } => {
                    slot.inline[..len].copy_from_slice(&bytes[..len]);
                    ReplyAt::Inline(len)
                }
                Reply::Buffer(len) => ReplyAt::Buffer(len),
                Reply::Parts(header_len) => ReplyAt::Parts(header_len),
            };
        }
        self.replies.borrow_mut().push_back(index);
        self.writer_waker.wake();
    }
}

/// Size of a new slot buffer for a request needing `need_bytes`: powers of two, so a slot
/// serving growing requests reallocates a few times only, capped at the largest request.
fn grown_buffer_bytes(need_bytes: usize) -> usize {
    need_bytes
        .max(SLOT_BUFFER_MIN_BYTES)
        .next_power_of_two()
        .min(SLOT_BUFFER_MAX_BYTES.next_multiple_of(4096))
        .max(need_bytes)
}

/// A finished request's reply.
enum Reply {
    Inline {
        bytes: [u8; INLINE_REPLY_BYTES],
        len: usize,
    },
    /// The first `n` bytes of the request's buffer.
    Buffer(usize),
    /// A large READ: the first `n` bytes of the request's buffer are the header, the read
    /// parts the data.
    Parts(usize),
}

impl Reply {
    fn ok(cookie: Cookie) -> Reply {
        let mut bytes = [0u8; INLINE_REPLY_BYTES];
        let header: &mut [u8; SIMPLE_REPLY_BYTES] = (&mut bytes[..SIMPLE_REPLY_BYTES])
            .try_into()
            .expect("16 bytes");
        encode_simple_reply(cookie, None, header);
        Reply::Inline {
            bytes,
            len: SIMPLE_REPLY_BYTES,
        }
    }

    fn error(cookie: Cookie, errno: Errno, structured: bool) -> Reply {
        let mut bytes = [0u8; INLINE_REPLY_BYTES];
        let out: &mut [u8; ERROR_REPLY_MAX_BYTES] = (&mut bytes[..ERROR_REPLY_MAX_BYTES])
            .try_into()
            .expect("sized for the error reply");
        let len = encode_error_reply(cookie, errno, structured, out);
        Reply::Inline { bytes, len }
    }
}

/// What a negotiated connection serves.
struct Session {
    volume: Volume,
    export: ExportInfo,
    negotiated: Negotiated,
    /// Where its change maps come from (the server's).
    change_maps: Arc<dyn ChangeMaps>,
}

impl Session {
    fn structured(&self) -> bool {
        self.negotiated.structured_replies
    }
}

/// Starts serving an accepted connection on this reactor.
pub(crate) fn spawn_connection(
    stream: Stream,
    permit: ConnectionPermit,
    shared: Arc<Shared>,
    conns: Rc<ReactorConns>,
) {
    rt::spawn_local(CatchUnwind::new(
        "connection",
        connection(stream, permit, shared, conns),
    ));
}

async fn connection(
    stream: Stream,
    permit: ConnectionPermit,
    shared: Arc<Shared>,
    conns: Rc<ReactorConns>,
) {
    let _permit = permit;
    super::socket::configure(stream.as_raw_fd(), &shared.tcp_congestion);
    let conn = Rc::new(Conn::new(stream, shared.limits));
    let _registration = conns.register(conn.clone());
    let mut inbox = Inbox::new();
    let mut batch = Some(IoBuf::zeroed(BATCH_BYTES));
    let limit = shared.limits.handshake_limit;
    let deadline = async {
        if limit.is_zero() {
            std::future::pending::<()>().await;
        }
        rt::sleep(limit).await;
    };
    // Dropping the handshake at the deadline cancels its receive or send in flight.
    let negotiated = match select(handshake(&conn, &shared, &mut inbox, &mut batch), deadline).await
    {
        Either::Left(negotiated) => negotiated,
        Either::Right(()) => {
            tracing::debug!(?limit, "nbd: handshake not done within the limit");
            // No close_notify to a client that may have stopped mid-way through TLS.
            conn.break_connection();
            None
        }
    };
    let Some((session, export)) = negotiated else {
        close(&conn).await;
        return;
    };
    // Counted on its export (so that the administrator sees it and can stop it), unless the
    // export was removed since the handshake offered it.
    if !shared.exports.register(export, &session.export.name) {
        tracing::debug!(
            export = %session.export.name,
            "nbd: export removed or renamed during the handshake"
        );
        close(&conn).await;
        return;
    }
    let _export_registration = ExportRegistration {
        shared: &shared,
        id: export,
    };
    conn.export.set(Some(export));
    let session = Rc::new(session);
    rt::spawn_local(CatchUnwind::new(
        "writer",
        write_replies(conn.clone(), batch),
    ));
    for index in 0..conn.limits.slots {
        rt::spawn_local(CatchUnwind::new(
            "request",
            request_task(conn.clone(), session.clone(), index),
        ));
    }
    let end = read_requests(&conn, &session, &mut inbox).await;
    match &end {
        End::RecvFailed(err) => {
            tracing::debug!(export = %session.export.name, %err, "nbd: receive failed")
        }
        End::Protocol(err) => {
            tracing::debug!(export = %session.export.name, %err, "nbd: protocol error")
        }
        other => tracing::debug!(export = %session.export.name, ?other, "nbd: stops reading"),
    }
    conn.reader_done.set(true);
    conn.wake_request_tasks();
    conn.writer_waker.wake();
    // Requests already read finish and their replies are sent (bounded by the reactor's
    // shutdown grace period if the client stops reading).
    wait_until(&conn.reader_waker, || conn.writer_done.get()).await;
    close(&conn).await;
}

/// Ends the connection: TLS's close_notify if TLS is on (best effort, and not when the
/// connection broke), then a TCP shutdown.
async fn close(conn: &Conn) {
    if let Some(tls) = conn.tls.get() {
        if !conn.broken.get() {
            tls.close(&conn.stream).await;
        }
    }
    conn.stream.shutdown();
}

/// A connection's place in its export's count; removed when the connection ends (also when
/// unwinding).
struct ExportRegistration<'a> {
    shared: &'a Shared,
    id: ExportId,
}

impl Drop for ExportRegistration<'_> {
    fn drop(&mut self) {
        self.shared.exports.unregister(self.id);
    }
}

/// Why a connection stopped reading.
#[derive(Debug)]
enum End {
    /// NBD_CMD_DISC.
    Disconnect,
    /// The client closed the connection.
    Closed,
    /// Shutdown, or the writer found the peer gone.
    Halted,
    /// A receive failed.
    RecvFailed(io::Error),
    /// The client broke the protocol.
    Protocol(ProtocolError),
}

/// The reader's receive buffer: unconsumed bytes are `buf[start..end]`.
struct Inbox {
    /// `None` once lost to a cancelled receive (the connection is ending then).
    buf: Option<IoBuf>,
    start: usize,
    end: usize,
    /// The next fill receives one request header at most (see [`Inbox::header_next`]).
    header_only: bool,
}

impl Inbox {
    fn new() -> Inbox {
        Inbox {
            buf: Some(IoBuf::zeroed(INBOX_BYTES)),
            start: 0,
            end: 0,
            header_only: false,
        }
    }

    /// A large WRITE payload was just received straight into its buffers: the next request
    /// is likely another, so the next fill takes its header alone and leaves its payload on
    /// the socket for a direct receive. A full fill would bring up to `INBOX_BYTES` of that
    /// payload here, to be copied out again (9 % of the server's CPU on 128K writes).
    fn header_next(&mut self) {
        self.header_only = true;
    }

    fn is_empty(&self) -> bool {
        self.start == self.end
    }

    fn bytes(&self) -> &[u8] {
        match &self.buf {
            Some(buf) => &buf[self.start..self.end],
            None => &[],
        }
    }

    fn consume(&mut self, count: usize) {
        debug_assert!(count <= self.end - self.start);
        self.start += count;
    }

    /// Receives more bytes into the (empty) inbox.
    async fn fill(&mut self, conn: &Conn) -> Result<(), End> {
        debug_assert!(self.is_empty());
        let Some(buf) = self.buf.take() else {
            return Err(End::Halted);
        };
        self.start = 0;
        self.end = 0;
        let end = if std::mem::take(&mut self.header_only) {
            REQUEST_HEADER_BYTES
        } else {
            buf.len()
        };
        match select(conn.recv_range(buf, 0, end), conn.halt()).await {
            Either::Left(Ok((buf, count))) => {
                self.buf = Some(buf);
                if count == 0 {
                    return Err(End::Closed);
                }
                self.end = count;
                Ok(())
            }
            Either::Left(Err(err)) => Err(End::RecvFailed(err)),
            Either::Right(()) => Err(End::Halted),
        }
    }
}

/// Sends `data` through the batch buffer (or a one-off buffer when it does not fit: a LIST
/// reply over many exports). Handshake only.
async fn send_bytes(conn: &Conn, batch: &mut Option<IoBuf>, data: &[u8]) -> io::Result<()> {
    let fits = batch.as_ref().is_some_and(|b| b.len() >= data.len());
    let mut buf = if fits {
        batch.take().expect("checked")
    } else {
        IoBuf::from_slice(data)
    };
    buf[..data.len()].copy_from_slice(data);
    let buf = conn.send_all(buf, data.len()).await?;
    if fits {
        *batch = Some(buf);
    }
    Ok(())
}

/// Negotiation; `None` when the connection ends in it (ABORT, error, shutdown, client gone).
/// The exports offered are the table's at the start of the handshake.
async fn handshake(
    conn: &Conn,
    shared: &Arc<Shared>,
    inbox: &mut Inbox,
    batch: &mut Option<IoBuf>,
) -> Option<(Session, ExportId)> {
    let offer = shared.exports.offer();
    let mut handshake = Handshake::with_tls(offer.infos, shared.tls.policy);
    handshake.set_default_export(offer.default_index);
    handshake.set_access(export_access(shared, &offer.targets, false, None));
    handshake.set_change_maps(Box::new(ExportCatalog {
        volumes: offer.targets.iter().map(|(_, v)| v.clone()).collect(),
        maps: shared.change_maps.clone(),
    }));
    handshake.set_offer_check(Box::new(OfferedNames {
        shared: shared.clone(),
        listed: offer
            .targets
            .iter()
            .zip(handshake.exports())
            .map(|((id, _), info)| (*id, info.name.clone()))
            .collect(),
    }));
    if let Err(err) = send_bytes(conn, batch, &handshake.greeting()).await {
        tracing::debug!(%err, "nbd: client left before the greeting");
        return None;
    }
    let mut out = Vec::new();
    // Bounded by the codec: it ends the handshake after MAX_OPTIONS_PER_HANDSHAKE options,
    // and every pass consumes input or ends.
    loop {
        if inbox.is_empty() {
            if let Err(end) = inbox.fill(conn).await {
                tracing::debug!(?end, "nbd: connection ended during the handshake");
                return None;
            }
        }
        out.clear();
        let progress = handshake.receive(inbox.bytes(), &mut out);
        let send = !out.is_empty();
        match progress {
            Ok(progress) => {
                inbox.consume(progress.consumed_bytes);
                if send {
                    if let Err(err) = send_bytes(conn, batch, &out).await {
                        // EPIPE right after ABORT is an ordinary close.
                        tracing::debug!(%err, "nbd: client left during the handshake");
                        return None;
                    }
                }
                match progress.status {
                    HandshakeStatus::Continue => {}
                    HandshakeStatus::Abort => return None,
                    HandshakeStatus::StartTls => {
                        // The codec refused bytes after STARTTLS in what it was given; the
                        // inbox holds nothing else.
                        debug_assert!(inbox.is_empty());
                        let identity = start_tls(conn, shared).await?;
                        let access = export_access(shared, &offer.targets, true, identity.as_ref());
                        if let Err(err) = handshake.tls_established(access) {
                            tracing::debug!(%err, "nbd: handshake failed after TLS");
                            return None;
                        }
                    }
                    HandshakeStatus::Done(negotiated) => {
                        let index = negotiated.export_index;
                        let (id, volume) = offer.targets.get(index)?.clone();
                        let export = handshake.exports().get(index)?.clone();
                        return Some((
                            Session {
                                volume,
                                export,
                                negotiated,
                                change_maps: shared.change_maps.clone(),
                            },
                            id,
                        ));
                    }
                }
            }
            Err(err) => {
                if send {
                    let _ = send_bytes(conn, batch, &out).await;
                }
                tracing::debug!(%err, "nbd: handshake failed");
                return None;
            }
        }
    }
}

/// This client's access to each export offered (`targets`, in the handshake's order). The
/// allow lists are read now, so a change applies to the next connection.
fn export_access(
    shared: &Shared,
    targets: &[(ExportId, Volume)],
    tls_active: bool,
    identity: Option<&TlsIdentity>,
) -> Vec<ExportAccess> {
    let allow_lists = targets.iter().map(|(_, volume)| volume.props().nbd_allow);
    tls::export_access(allow_lists, shared.tls.policy, tls_active, identity)
}

/// The bound on the log lines of refused TLS handshakes, over every connection.
static TLS_WARNINGS: WarnLimit = WarnLimit::new(10);

/// The TLS handshake after STARTTLS's ACK; the client's identity, or `None` if the
/// connection must end (a failed handshake, shutdown, the client gone).
async fn start_tls(conn: &Conn, shared: &Shared) -> Option<Option<TlsIdentity>> {
    let Some(credentials) = shared.tls.credentials.as_ref() else {
        debug_assert!(false, "STARTTLS acknowledged without credentials");
        return None;
    };
    let accepted = match select(TlsSession::accept(&conn.stream, credentials), conn.halt()).await {
        Either::Left(accepted) => accepted,
        Either::Right(()) => return None,
    };
    match accepted {
        Ok((session, identity)) => {
            tracing::debug!(
                identity = identity.as_ref().map(|id| id.to_string()),
                session = session.describe(),
                "nbd: TLS on"
            );
            let _ = conn.tls.set(session);
            Some(identity)
        }
        Err(err) => {
            // A warning, as an authentication failure is: a wrong key, an unknown identity,
            // a certificate the CA did not sign or that was revoked (a new user found a
            // refused client left no trace at the default level). Bounded: a client
            // retrying in a loop would otherwise fill the log.
            if let Some(left_out) = TLS_WARNINGS.allow() {
                if left_out > 0 {
                    tracing::warn!(
                        "nbd: {left_out} more TLS handshake failures were left out of the log \
                         (at most {} a second)",
                        TLS_WARNINGS.per_second()
                    );
                }
                tracing::warn!(
                    peer = %conn.stream.peer_name(),
                    %err,
                    "nbd: TLS handshake failed; closing the connection"
                );
            }
            None
        }
    }
}

/// Encodes into `buf[..data_at]` the header of a structured READ reply sent as one
/// OFFSET_DATA chunk holding all `request.length_bytes` (`data_at` is the header's size).
fn encode_single_chunk_header(buf: &mut [u8], data_at: usize, request: &Request) {
    let header: &mut [u8; OFFSET_DATA_HEADER_BYTES] =
        (&mut buf[..data_at]).try_into().expect("28 bytes");
    encode_offset_data_header(
        request.cookie,
        request.offset_bytes,
        request.length_bytes,
        Done::Last,
        header,
    )
    .expect("nonzero data within the chunk limit");
}

/// Bytes of slot buffer a valid request needs (0: none).
fn buffer_need_bytes(request: &Request, session: &Session) -> usize {
    let length = request.length_bytes as usize;
    match request.command {
        Command::Write => length,
        Command::Read if session.structured() => read_need_bytes(length),
        Command::Read => SIMPLE_REPLY_BYTES + length,
        // One chunk per selected context (at most 1 + CHANGE_MAPS_SELECTED_MAX of them).
        Command::BlockStatus => {
            session.negotiated.meta_contexts.len().max(1)
                * block_status_chunk_bytes(BLOCK_STATUS_DESCRIPTORS_MAX)
        }
        _ => 0,
    }
}

/// A structured READ reply never exceeds `length + OFFSET_DATA_HEADER_BYTES` (proof at
/// `read_structured`); a few bytes more for safety.
fn read_need_bytes(length: usize) -> usize {
    length + OFFSET_DATA_HEADER_BYTES + 4
}

/// The reader: decodes requests and starts them until the connection must stop.
async fn read_requests(conn: &Rc<Conn>, session: &Rc<Session>, inbox: &mut Inbox) -> End {
    let mut decoder = RequestDecoder::new();
    // Unbounded by design: one request (or part of a header) per iteration for the
    // connection's lifetime; every iteration consumes input or waits for it.
    loop {
        if conn.halted() {
            return End::Halted;
        }
        if inbox.is_empty() {
            if let Err(end) = inbox.fill(conn).await {
                return end;
            }
        }
        let (used, request) = match decoder.decode(inbox.bytes()) {
            Ok(decoded) => decoded,
            Err(err) => {
                protocol_error_reply(conn, session, &err);
                return End::Protocol(err);
            }
        };
        inbox.consume(used);
        let Some(request) = request else {
            continue; // Part of a header: the decoder keeps it.
        };
        if request.command == Command::Disconnect {
            return End::Disconnect;
        }
        let Some(index) = conn.acquire_slot().await else {
            return End::Halted;
        };
        if let Err(errno) = validate(&request, &session.export, &session.negotiated) {
            // A refused WRITE's payload is still on the wire (its length was checked by the
            // decoder): drop it before the next header.
            if let Err(end) = discard_payload(conn, &mut decoder, inbox).await {
                conn.release(index);
                return end;
            }
            conn.complete(
                index,
                Reply::error(request.cookie, errno, session.structured()),
                None,
                Vec::new(),
            );
            continue;
        }
        if let Some(block_bytes) = whole_blocks_of(&request, &session.volume) {
            let count = request.length_bytes as usize / block_bytes;
            let Some(blocks) = conn.reserve_blocks(index, block_bytes, count).await else {
                conn.release(index);
                return End::Halted;
            };
            let length = request.length_bytes as usize;
            match receive_blocks(conn, &mut decoder, inbox, blocks, length).await {
                Ok(blocks) => conn.slots.borrow_mut()[index].blocks = blocks,
                Err(end) => {
                    conn.complete_aborted(index, Err(0));
                    return end;
                }
            }
            conn.start_request(index, request, None);
            continue;
        }
        let need_bytes = buffer_need_bytes(&request, session);
        let mut buffer = None;
        if need_bytes > 0 {
            match conn.reserve(index, need_bytes).await {
                Some(buf) => buffer = Some(buf),
                None => {
                    conn.release(index);
                    return End::Halted;
                }
            }
        }
        if request.command == Command::Write {
            let buf = buffer.take().expect("a write has a buffer");
            let length = request.length_bytes as usize;
            match receive_payload(conn, &mut decoder, inbox, buf, length).await {
                Ok(buf) => buffer = Some(buf),
                Err((end, buf)) => {
                    conn.complete_aborted(index, buf);
                    return end;
                }
            }
        }
        conn.start_request(index, request, buffer);
    }
}

impl Conn {
    /// A request abandoned before it started: give back its buffer (if it came back from
    /// the cancelled receive) and free its slot without a reply.
    fn complete_aborted(&self, index: usize, buffer: Result<IoBuf, usize>) {
        match buffer {
            Ok(buf) => self.slots.borrow_mut()[index].buffer = Some(buf),
            Err(lost_bytes) => self.forget_buffer(lost_bytes),
        }
        self.release(index);
    }
}

/// The courtesy reply a protocol error allows before closing (an oversized WRITE), if a slot
/// is free right now.
fn protocol_error_reply(conn: &Conn, session: &Session, err: &ProtocolError) {
    tracing::debug!(%err, "nbd: protocol error; closing the connection");
    let Some((cookie, errno)) = err.reply_errno() else {
        return;
    };
    if let Some(index) = conn.try_acquire_slot() {
        conn.complete(
            index,
            Reply::error(cookie, errno, session.structured()),
            None,
            Vec::new(),
        );
    }
}

/// Drops the payload of a refused WRITE.
async fn discard_payload(
    conn: &Conn,
    decoder: &mut RequestDecoder,
    inbox: &mut Inbox,
) -> Result<(), End> {
    // Bounded: each pass consumes at least one payload byte or ends.
    while decoder.payload_remaining_bytes() > 0 {
        if inbox.is_empty() {
            inbox.fill(conn).await?;
        }
        let taken = decoder.take_payload(inbox.bytes()).len();
        inbox.consume(taken);
    }
    Ok(())
}

/// Receives a WRITE payload of `length` bytes into `buf[..length]`: first what the inbox
/// already holds, then straight from the socket. On failure, the buffer if it came back (else
/// its size, to forget).
async fn receive_payload(
    conn: &Conn,
    decoder: &mut RequestDecoder,
    inbox: &mut Inbox,
    mut buf: IoBuf,
    length: usize,
) -> Result<IoBuf, (End, Result<IoBuf, usize>)> {
    debug_assert!(buf.len() >= length);
    debug_assert_eq!(decoder.payload_remaining_bytes() as usize, length);
    let mut filled = 0;
    // Bounded: each pass moves at least one byte or ends.
    while filled < length {
        if !inbox.is_empty() {
            let taken = decoder.take_payload(inbox.bytes());
            let count = taken.len();
            buf[filled..filled + count].copy_from_slice(taken);
            inbox.consume(count);
            filled += count;
            continue;
        }
        if length - filled < DIRECT_RECV_MIN_BYTES {
            if let Err(end) = inbox.fill(conn).await {
                return Err((end, Ok(buf)));
            }
            continue;
        }
        let buf_bytes = buf.len();
        match select(conn.recv_range(buf, filled, length), conn.halt()).await {
            Either::Left(Ok((back, 0))) => return Err((End::Closed, Ok(back))),
            Either::Left(Ok((back, count))) => {
                buf = back;
                filled += count;
                // count <= length - filled <= MAX_BLOCK_BYTES, so it fits in u32.
                decoder.payload_received(count as u32);
            }
            Either::Left(Err(err)) => return Err((End::RecvFailed(err), Err(buf_bytes))),
            Either::Right(()) => return Err((End::Halted, Err(buf_bytes))),
        }
    }
    if length >= DIRECT_RECV_MIN_BYTES {
        inbox.header_next();
    }
    Ok(buf)
}

/// The block size, if `request` is a WRITE of whole blocks of `volume` (starting and ending
/// on block boundaries): its payload is then received into one buffer per block, which the
/// volume takes as they are (`receive_blocks`).
fn whole_blocks_of(request: &Request, volume: &Volume) -> Option<usize> {
    let block_bytes = volume.block_size_bytes() as usize;
    let length = request.length_bytes as usize;
    (request.command == Command::Write
        && length > 0
        && length.is_multiple_of(block_bytes)
        && request.offset_bytes.is_multiple_of(block_bytes as u64))
    .then_some(block_bytes)
}

/// Receives a WRITE payload of `length` bytes into `blocks` (of `length` bytes in all): first
/// what the inbox already holds, then straight from the socket with vectored receives. On
/// failure the blocks are dropped (back to the buffer pool).
async fn receive_blocks(
    conn: &Conn,
    decoder: &mut RequestDecoder,
    inbox: &mut Inbox,
    mut blocks: Scatter,
    length: usize,
) -> Result<Scatter, End> {
    debug_assert_eq!(blocks.len_bytes(), length);
    debug_assert_eq!(blocks.filled_bytes(), 0);
    debug_assert_eq!(decoder.payload_remaining_bytes() as usize, length);
    // Bounded: each pass moves at least one byte or ends.
    while blocks.filled_bytes() < length {
        if !inbox.is_empty() {
            let taken = decoder.take_payload(inbox.bytes());
            let count = taken.len();
            blocks.copy_in(taken);
            inbox.consume(count);
            continue;
        }
        if length - blocks.filled_bytes() < DIRECT_RECV_MIN_BYTES {
            inbox.fill(conn).await?;
            continue;
        }
        match select(conn.recv_scatter(blocks, length), conn.halt()).await {
            Either::Left(Ok((_, 0))) => return Err(End::Closed),
            Either::Left(Ok((back, count))) => {
                blocks = back;
                // count <= length - filled <= MAX_BLOCK_BYTES, so it fits in u32.
                decoder.payload_received(count as u32);
            }
            Either::Left(Err(err)) => return Err(End::RecvFailed(err)),
            Either::Right(()) => return Err(End::Halted),
        }
    }
    if length >= DIRECT_RECV_MIN_BYTES {
        inbox.header_next();
    }
    Ok(blocks)
}

/// Frees the slot if the request task ends without completing (it panicked): the connection
/// is then broken, so nothing waits for a reply that will never come.
struct SlotGuard<'a> {
    conn: &'a Conn,
    index: usize,
    armed: bool,
}

impl Drop for SlotGuard<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.conn.break_connection();
            self.conn.release(self.index);
        }
    }
}

/// Marks a slot's request task gone when it ends (also when unwinding), and frees the slot of
/// a request it will never take.
struct RequestTaskGone<'a> {
    conn: &'a Conn,
    index: usize,
}

impl Drop for RequestTaskGone<'_> {
    fn drop(&mut self) {
        let orphan = {
            let mut slots = self.conn.slots.borrow_mut();
            let slot = &mut slots[self.index];
            slot.task_gone = true;
            slot.pending.take()
        };
        if let Some((_, buffer)) = orphan {
            if buffer.is_some() {
                self.conn.slots.borrow_mut()[self.index].buffer = buffer;
            }
            self.conn.release(self.index);
        }
    }
}

/// Slot `index`'s request task: runs the requests the reader hands to the slot, one at a time
/// (a slot holds one request until its reply is sent), until the reader is done.
async fn request_task(conn: Rc<Conn>, session: Rc<Session>, index: usize) {
    let _gone = RequestTaskGone { conn: &conn, index };
    // Unbounded by design: one request per iteration for the connection's lifetime.
    loop {
        wait_until(&conn.slot_wakers[index], || {
            conn.slots.borrow()[index].pending.is_some() || conn.reader_done.get()
        })
        .await;
        let pending = conn.slots.borrow_mut()[index].pending.take();
        let Some((request, buffer)) = pending else {
            return; // The reader is done and handed nothing more.
        };
        run_request(conn.clone(), session.clone(), index, request, buffer).await;
    }
}

/// One request in flight: runs it and queues its reply.
async fn run_request(
    conn: Rc<Conn>,
    session: Rc<Session>,
    index: usize,
    request: Request,
    mut buffer: Option<IoBuf>,
) {
    let mut guard = SlotGuard {
        conn: &conn,
        index,
        armed: true,
    };
    let _in_flight = oxpool_io::completion::RequestGuard::new();
    // A READ whose reply is too large for the writer's batch (`BATCH_COPY_MAX_BYTES`, the
    // header included) is sent straight from the data cache's blocks (`read_in_parts`): in
    // clear text by one `sendmsg` of the header and the blocks, with the replies in parts
    // queued behind it, over TLS encrypted from them. Its parts vector is the slot's, reused.
    // So in clear text a READ's reply goes out with others whether it is small or large
    // (but for a reply with a hole chunk to lay out, rare: it is copied after all). When
    // the data alone was compared with the batch's limit, a 16 KiB READ, one default block,
    // made a reply of 16 KiB and a header that was neither: it went out alone.
    let mut parts = Vec::new();
    let reply_header_bytes = read_reply_header_bytes(session.structured());
    // Over TLS only with blocks of a whole TLS record or more: each shared block is its own
    // `SSL_write`, so smaller blocks would mean more, smaller records than one copied reply.
    // In clear text any block size: a block is one iovec of the send.
    let share = request.command == Command::Read
        && request.length_bytes as usize + reply_header_bytes > BATCH_COPY_MAX_BYTES
        && (conn.tls.get().is_none()
            || session.volume.block_size_bytes() as usize >= TLS_RECORD_PLAINTEXT_BYTES);
    if share {
        parts = std::mem::take(&mut conn.slots.borrow_mut()[index].parts);
    }
    // A WRITE of whole blocks received into its blocks (`receive_blocks`).
    let mut blocks = std::mem::take(&mut conn.slots.borrow_mut()[index].blocks);
    let reply = execute(
        &session,
        &request,
        buffer.as_mut(),
        share.then_some(&mut parts),
        &mut blocks,
    )
    .await;
    guard.armed = false;
    conn.slots.borrow_mut()[index].blocks = blocks;
    conn.complete(index, reply, buffer, parts);
}

/// Runs one request. With `parts` (a large READ), the data may come back as read parts
/// (`Reply::Parts`) instead of in the buffer. A WRITE's payload is in `buffer`, or in
/// `blocks` (whole blocks, which the volume takes; left empty on success).
async fn execute(
    session: &Session,
    request: &Request,
    buffer: Option<&mut IoBuf>,
    parts: Option<&mut Vec<ReadPart>>,
    blocks: &mut Scatter,
) -> Reply {
    let volume = &session.volume;
    let cookie = request.cookie;
    let offset_bytes = request.offset_bytes;
    let length_bytes = u64::from(request.length_bytes);
    let fua = request.flags.contains(CommandFlags::FUA);
    let in_buffer = |len: usize| Some(Reply::Buffer(len));
    let result = match (request.command, buffer, parts) {
        (Command::Read, Some(buf), Some(parts)) => {
            read_in_parts(session, request, buf, parts).await.map(Some)
        }
        (Command::Read, Some(buf), None) if session.structured() => {
            read_structured(session, request, buf).await.map(in_buffer)
        }
        (Command::Read, Some(buf), None) => read_simple(volume, request, buf).await.map(in_buffer),
        (Command::Write, None, _) if !blocks.is_empty() => volume
            .write_blocks(offset_bytes, blocks.bufs_mut(), fua)
            .await
            .map(|()| None),
        (Command::Write, Some(buf), _) => {
            let data = &buf[..request.length_bytes as usize];
            volume.write(offset_bytes, data, fua).await.map(|()| None)
        }
        (Command::BlockStatus, Some(buf), _) => {
            block_status(session, request, buf).await.map(in_buffer)
        }
        (Command::Flush, _, _) => volume.flush().await.map(|()| None),
        (Command::Trim, _, _) => volume
            .trim(offset_bytes, length_bytes, fua)
            .await
            .map(|()| None),
        // NO_HOLE asks for allocated zeros, which a copy-on-write pool does not have (the next
        // write allocates anew anyway): whole blocks become holes either way, and reads are
        // the same. FAST_ZERO: zeroing is always fast here (no data is written).
        (Command::WriteZeroes, _, _) => volume
            .write_zeroes(offset_bytes, length_bytes, fua)
            .await
            .map(|()| None),
        // CACHE is advisory: the range was validated; the engine has no read-ahead to start.
        (Command::Cache, _, _) => Ok(None),
        (command, buffer, _) => {
            // Unreachable after validation and buffer reservation; answered, not panicked.
            tracing::error!(
                ?command,
                has_buffer = buffer.is_some(),
                "nbd: request reached execution in an unexpected state"
            );
            return Reply::error(cookie, Errno::Io, session.structured());
        }
    };
    match result {
        Ok(Some(reply)) => reply,
        Ok(None) => Reply::ok(cookie),
        Err(err) => {
            let errno = errno_for(&err);
            if errno == Errno::Io {
                tracing::warn!(export = %session.export.name, %err, "nbd: request failed");
            } else {
                tracing::debug!(export = %session.export.name, %err, "nbd: request refused");
            }
            Reply::error(cookie, errno, session.structured())
        }
    }
}

/// Bytes before the data in a READ reply sent in parts: a simple reply's header, or the
/// header of its one OFFSET_DATA chunk.
fn read_reply_header_bytes(structured: bool) -> usize {
    if structured {
        OFFSET_DATA_HEADER_BYTES
    } else {
        SIMPLE_REPLY_BYTES
    }
}

/// READ for a reply the writer sends on its own: the data stays where the volume has it
/// (cached blocks are shared, not copied into the buffer), and the reply is a header in the
/// buffer followed by the read parts (`ReplyAt::Parts`). In clear text the writer sends them
/// with one `sendmsg` (an iovec per part), so a cached byte is copied once, by the kernel into
/// the socket, instead of twice; over TLS the session encrypts them in place (with OpenSSL's
/// own copy into its record buffer and the memory BIO's, three copies became two).
///
/// The reply is the same as `read_simple`'s or `read_structured`'s: a simple header, or one
/// OFFSET_DATA chunk when no 4 KiB piece of the data reads as zeros. A read with a zero piece
/// (a hole chunk to lay out, rare on a volume in use) is copied into the buffer and laid out
/// by `lay_out_chunks` as before.
async fn read_in_parts(
    session: &Session,
    request: &Request,
    buf: &mut IoBuf,
    parts: &mut Vec<ReadPart>,
) -> oxpool_engine::Result<Reply> {
    let length = request.length_bytes as usize;
    let structured = session.structured();
    let data_at = read_reply_header_bytes(structured);
    session
        .volume
        .read_shared(
            request.offset_bytes,
            &mut buf[data_at..data_at + length],
            parts,
        )
        .await?;
    if !structured {
        let header: &mut [u8; SIMPLE_REPLY_BYTES] = (&mut buf[..SIMPLE_REPLY_BYTES])
            .try_into()
            .expect("16 bytes");
        encode_simple_reply(request.cookie, None, header);
        return Ok(Reply::Parts(data_at));
    }
    let df = request.flags.contains(CommandFlags::DF);
    if !df && has_zero_piece(request.offset_bytes, length, parts, &buf[data_at..]) {
        // Into the buffer, as `read_structured` has it, and laid out the same way.
        let mut at = data_at;
        // Bounded by the parts of the read.
        for part in parts.drain(..) {
            if !matches!(part, ReadPart::Copied(_)) {
                // A block's bytes (`out` is only read for copied parts).
                buf[at..at + part.len()].copy_from_slice(part.bytes(&[]));
            }
            at += part.len();
        }
        debug_assert_eq!(at, data_at + length);
        return Ok(Reply::Buffer(lay_out_chunks(
            request.cookie,
            request.offset_bytes,
            length,
            buf,
        )));
    }
    encode_single_chunk_header(buf, data_at, request);
    Ok(Reply::Parts(data_at))
}

/// Whether some 4 KiB piece of a read (of `length` bytes at `offset_bytes`, given as `parts`
/// whose copied ranges are of `out`) reads as zeros and is long enough for a hole chunk:
/// exactly when `lay_out_chunks` would lay out a hole. Stops at the first nonzero word of
/// each piece, as `lay_out_chunks` does.
///
/// First only the first word of each piece is looked at: the data of shared blocks is
/// usually not in the CPU's caches, and these loads do not depend on each other, so they
/// wait for memory together instead of one piece after the other (the full scan alone was
/// 7 % of the server's CPU at 128 KiB sequential reads). Data rarely starts a piece with a
/// zero word; only then are the pieces scanned in full.
fn has_zero_piece(offset_bytes: u64, length: usize, parts: &[ReadPart], out: &[u8]) -> bool {
    let first_word_zero = |bytes: &[u8]| bytes.iter().take(8).all(|&b| b == 0);
    zero_piece_where(offset_bytes, length, parts, out, first_word_zero)
        && zero_piece_where(offset_bytes, length, parts, out, oxpool_format::all_zero)
}

/// [`has_zero_piece`] with `zero` as the test of each piece's bytes in a part: a piece counts
/// when `zero` holds for all of them. A test weaker than `all_zero` finds a superset.
fn zero_piece_where(
    offset_bytes: u64,
    length: usize,
    parts: &[ReadPart],
    out: &[u8],
    zero: impl Fn(&[u8]) -> bool,
) -> bool {
    let piece_end_of = |pos: usize| -> usize {
        let end_bytes = ((offset_bytes + pos as u64) / HOLE_PIECE_BYTES + 1) * HOLE_PIECE_BYTES;
        ((end_bytes - offset_bytes) as usize).min(length)
    };
    let mut pos = 0usize;
    let mut piece_start = 0usize;
    let mut piece_end = piece_end_of(0);
    let mut piece_zero = true;
    // Bounded by the bytes of the read: each inner pass consumes at least one byte.
    for part in parts {
        let mut bytes = part.bytes(out);
        while !bytes.is_empty() {
            let take = bytes.len().min(piece_end - pos);
            if piece_zero && !zero(&bytes[..take]) {
                piece_zero = false;
            }
            pos += take;
            bytes = &bytes[take..];
            if pos == piece_end {
                if piece_zero && (piece_end - piece_start) as u64 >= HOLE_CHUNK_MIN_BYTES {
                    return true;
                }
                piece_start = pos;
                piece_end = piece_end_of(pos);
                piece_zero = true;
            }
        }
    }
    debug_assert_eq!(pos, length);
    false
}

/// READ without structured replies: simple header, then the data.
async fn read_simple(
    volume: &Volume,
    request: &Request,
    buf: &mut IoBuf,
) -> oxpool_engine::Result<usize> {
    let length = request.length_bytes as usize;
    let end = SIMPLE_REPLY_BYTES + length;
    volume
        .read(request.offset_bytes, &mut buf[SIMPLE_REPLY_BYTES..end])
        .await?;
    let header: &mut [u8; SIMPLE_REPLY_BYTES] = (&mut buf[..SIMPLE_REPLY_BYTES])
        .try_into()
        .expect("16 bytes");
    encode_simple_reply(request.cookie, None, header);
    Ok(end)
}

/// READ with structured replies: the range is read once, straight into the reply buffer
/// behind room for one OFFSET_DATA header; then each run of 4 KiB pieces (of volume offsets)
/// that reads as zeros becomes an OFFSET_HOLE chunk and the rest OFFSET_DATA chunks, in offset
/// order, laid out in place (`lay_out_chunks`), the last one flagged DONE. With DF, one data
/// chunk.
///
/// Holes are found in the data, not asked of the volume first: OFFSET_HOLE means "reads as
/// zeros", which the bytes show, and asking the block tree before reading cost every READ a
/// second tree lookup and five heap allocations (a quarter of the server's CPU at 4 KiB
/// random reads, iodepth 32, was spent around them). The scan stops at the first nonzero
/// word of each piece, so data costs next to nothing.
///
/// Size bound: holes and data alternate, so with H hole chunks there are at most H+1 data
/// chunks, and the reply is `length + 28 * (H + 1) + sum over holes of (32 - hole)`, at most
/// `length + 28` because every hole chunk replaces at least `HOLE_CHUNK_MIN_BYTES` (64) of
/// zeros.
async fn read_structured(
    session: &Session,
    request: &Request,
    buf: &mut IoBuf,
) -> oxpool_engine::Result<usize> {
    let length = request.length_bytes as usize;
    let data_at = OFFSET_DATA_HEADER_BYTES;
    session
        .volume
        .read(request.offset_bytes, &mut buf[data_at..data_at + length])
        .await?;
    if request.flags.contains(CommandFlags::DF) {
        encode_single_chunk_header(buf, data_at, request);
        return Ok(data_at + length);
    }
    Ok(lay_out_chunks(
        request.cookie,
        request.offset_bytes,
        length,
        buf,
    ))
}

/// Pieces of a READ tested for zeros: 4 KiB of volume offsets (the smallest device sector
/// and page; smaller holes are not worth a chunk each).
const HOLE_PIECE_BYTES: u64 = 4096;

/// Turns `buf` (28 bytes of room, then the `length` bytes read at `offset_bytes`) into the
/// chunks of a structured READ reply, in place, and returns the reply's length. See
/// [`read_structured`].
///
/// In place is safe: with `out` the bytes of reply laid out and `at` the offset of the first
/// byte not yet consumed (in the data, which starts at 28), a data run begins only when
/// `out <= at - 28` (true at the start; a data run adds 28 to `out - at`, and it is followed
/// only by a hole of at least 4 KiB, or 64 bytes at the end of the read, which takes
/// `L - 32` off), so its header and its bytes move down, never over bytes still unread; a
/// hole chunk (32 bytes) is written over zeros it replaces or over bytes already moved.
fn lay_out_chunks(cookie: Cookie, offset_bytes: u64, length: usize, buf: &mut [u8]) -> usize {
    let data_at = OFFSET_DATA_HEADER_BYTES;
    debug_assert!(length > 0 && buf.len() >= data_at + length);
    let mut out = 0usize;
    // Emits the run [start, end) of the data as one chunk.
    let mut emit = |buf: &mut [u8], zero: bool, start: usize, end: usize, done: Done| {
        let len32 = u32::try_from(end - start).expect("a run fits the request length");
        let cursor_bytes = offset_bytes + start as u64;
        if zero {
            debug_assert!(out + OFFSET_HOLE_CHUNK_BYTES <= data_at + end);
            let chunk: &mut [u8; OFFSET_HOLE_CHUNK_BYTES] = (&mut buf
                [out..out + OFFSET_HOLE_CHUNK_BYTES])
                .try_into()
                .expect("32 bytes");
            encode_offset_hole(cookie, cursor_bytes, len32, done, chunk).expect("a nonzero hole");
            out += OFFSET_HOLE_CHUNK_BYTES;
        } else {
            // The invariant above: nothing unread is overwritten.
            assert!(out <= start, "structured read layout overran its data");
            buf.copy_within(data_at + start..data_at + end, out + data_at);
            let header: &mut [u8; OFFSET_DATA_HEADER_BYTES] =
                (&mut buf[out..out + data_at]).try_into().expect("28 bytes");
            encode_offset_data_header(cookie, cursor_bytes, len32, done, header)
                .expect("nonzero data within the chunk limit");
            out += data_at + (end - start);
        }
    };
    let mut run_start = 0usize;
    let mut run_zero: Option<bool> = None;
    let mut pos = 0usize;
    // Bounded by the pieces of the request.
    while pos < length {
        let piece_end_bytes =
            ((offset_bytes + pos as u64) / HOLE_PIECE_BYTES + 1) * HOLE_PIECE_BYTES;
        let next = ((piece_end_bytes - offset_bytes) as usize).min(length);
        let zero = (next - pos) as u64 >= HOLE_CHUNK_MIN_BYTES
            && oxpool_format::all_zero(&buf[data_at + pos..data_at + next]);
        match run_zero {
            Some(z) if z != zero => {
                emit(buf, z, run_start, pos, Done::More);
                run_start = pos;
                run_zero = Some(zero);
            }
            Some(_) => {}
            None => run_zero = Some(zero),
        }
        pos = next;
    }
    emit(
        buf,
        run_zero.expect("a nonempty read has a run"),
        run_start,
        length,
        Done::Last,
    );
    debug_assert!(out <= data_at + length);
    out
}

/// BLOCK_STATUS: one chunk per selected context, in id order, the last flagged DONE. Each
/// covers a prefix of the range (at most `BLOCK_STATUS_QUERY_MAX_BYTES`,
/// `BLOCK_STATUS_DESCRIPTORS_MAX` extents; one extent with REQ_ONE), as the protocol allows.
/// The whole reply is laid out before anything is sent, so a context that fails makes the
/// request fail cleanly.
async fn block_status(
    session: &Session,
    request: &Request,
    buf: &mut IoBuf,
) -> oxpool_engine::Result<usize> {
    let query_bytes = u64::from(request.length_bytes).min(BLOCK_STATUS_QUERY_MAX_BYTES);
    let max = if request.flags.contains(CommandFlags::REQ_ONE) {
        1
    } else {
        BLOCK_STATUS_DESCRIPTORS_MAX
    };
    let contexts = &session.negotiated.meta_contexts;
    let mut written = 0;
    for (index, selected) in contexts.iter().enumerate() {
        let descriptors = match &selected.context {
            MetaContext::BaseAllocation => {
                let runs = session
                    .volume
                    .block_status(request.offset_bytes, query_bytes, max)
                    .await?;
                let runs = runs.iter().map(|&(len, state)| {
                    let flags = match state {
                        BlockState::Hole => BlockStatusFlags::HOLE_ZERO,
                        BlockState::Data => BlockStatusFlags::DATA,
                    };
                    (len, flags)
                });
                descriptors_of(runs, query_bytes, max)
            }
            MetaContext::ChangedSince(base, pin) => {
                let extents = session
                    .change_maps
                    .changed_extents(
                        &session.volume,
                        base,
                        *pin,
                        request.offset_bytes,
                        query_bytes,
                    )
                    .await?;
                let runs = extents.iter().map(|extent| {
                    let flags = if extent.changed {
                        BlockStatusFlags::CHANGED
                    } else {
                        BlockStatusFlags::UNCHANGED
                    };
                    (extent.length_bytes, flags)
                });
                descriptors_of(runs, query_bytes, max)
            }
        };
        if descriptors.is_empty() {
            return Err(oxpool_engine::EngineError::Invalid(format!(
                "no extent for {}",
                selected.context.name()
            )));
        }
        let done = if index + 1 == contexts.len() {
            Done::Last
        } else {
            Done::More
        };
        let out = buf.get_mut(written..).unwrap_or_default();
        written += encode_block_status(request.cookie, selected.id, &descriptors, done, out)
            .map_err(|err| {
                oxpool_engine::EngineError::Invalid(format!("block status reply: {err}"))
            })?;
    }
    if written == 0 {
        // Validation refuses BLOCK_STATUS without a selected context.
        return Err(oxpool_engine::EngineError::Invalid(
            "block status without a meta context".into(),
        ));
    }
    Ok(written)
}

/// Descriptors of `runs` (length, flags), merged where adjacent runs have the same flags,
/// cut at `query_bytes` in total and at `max` descriptors; empty runs are skipped. What a
/// source returns beyond the query is never sent: the protocol bounds the reply by the
/// request.
fn descriptors_of(
    runs: impl Iterator<Item = (u64, BlockStatusFlags)>,
    query_bytes: u64,
    max: usize,
) -> Vec<BlockStatusDescriptor> {
    let mut descriptors: Vec<BlockStatusDescriptor> = Vec::new();
    let mut covered_bytes = 0u64;
    // Bounded by the runs, and stops at the query's end.
    for (len, flags) in runs {
        let len = len.min(query_bytes - covered_bytes);
        if len == 0 {
            if covered_bytes == query_bytes {
                break;
            }
            continue;
        }
        covered_bytes += len;
        // len <= query_bytes <= the request's length, a u32.
        let len32 = u32::try_from(len).unwrap_or(u32::MAX);
        let merged = descriptors.last_mut().is_some_and(|last| {
            let fits = last.flags == flags && last.length_bytes.checked_add(len32).is_some();
            if fits {
                last.length_bytes += len32;
            }
            fits
        });
        if merged {
            continue;
        }
        if descriptors.len() == max {
            break;
        }
        descriptors.push(BlockStatusDescriptor {
            length_bytes: len32,
            flags,
        });
    }
    descriptors
}

/// Marks the writer finished when dropped (also when unwinding), so the connection task never
/// waits for a writer that is gone.
struct WriterDone(Rc<Conn>);

impl Drop for WriterDone {
    fn drop(&mut self) {
        self.0.writer_done.set(true);
        self.0.reader_waker.wake();
    }
}

/// The writer: sends queued replies until the reader is done and nothing is in flight.
async fn write_replies(conn: Rc<Conn>, mut batch: Option<IoBuf>) {
    let _done = WriterDone(conn.clone());
    // Unbounded by design: one round per wake-up for the connection's lifetime.
    loop {
        wait_until(&conn.writer_waker, || {
            !conn.replies.borrow().is_empty()
                || (conn.reader_done.get() && conn.in_flight.get() == 0)
        })
        .await;
        if conn.replies.borrow().is_empty() {
            return; // The reader is done and every reply went out.
        }
        let mut batch_bytes = 0usize;
        // Bounded: at most two rounds of the slot count per wake-up, then the batch goes out.
        for _ in 0..2 * conn.limits.slots {
            let Some(index) = conn.replies.borrow_mut().pop_front() else {
                break;
            };
            if conn.broken.get() {
                conn.release(index);
                continue;
            }
            let reply = conn.slots.borrow()[index].reply;
            let (len, inline) = match reply {
                ReplyAt::Inline(len) => (len, true),
                ReplyAt::Buffer(len) => (len, false),
                ReplyAt::Parts(header_len) => {
                    if batch_bytes > 0 {
                        send_batch(&conn, &mut batch, batch_bytes).await;
                        batch_bytes = 0;
                    }
                    // Frees the slot, and those of the replies it sends along.
                    send_parts(&conn, index, header_len).await;
                    continue;
                }
                ReplyAt::Nowhere => {
                    debug_assert!(false, "queued slot without a reply");
                    conn.release(index);
                    continue;
                }
            };
            if len <= BATCH_COPY_MAX_BYTES && batch.is_some() {
                if batch_bytes + len > BATCH_BYTES {
                    send_batch(&conn, &mut batch, batch_bytes).await;
                    batch_bytes = 0;
                }
                if let Some(out) = batch.as_mut() {
                    let slots = conn.slots.borrow();
                    let slot = &slots[index];
                    let source: &[u8] = if inline {
                        &slot.inline[..len]
                    } else {
                        slot.buffer.as_deref().map_or(&[], |b| &b[..len])
                    };
                    debug_assert_eq!(source.len(), len);
                    out[batch_bytes..batch_bytes + source.len()].copy_from_slice(source);
                    batch_bytes += source.len();
                }
                conn.release(index);
                continue;
            }
            if batch_bytes > 0 {
                send_batch(&conn, &mut batch, batch_bytes).await;
                batch_bytes = 0;
            }
            if inline {
                // Only reachable without a batch buffer, i.e. after a failed send.
                conn.release(index);
                continue;
            }
            let buffer = conn.slots.borrow_mut()[index].buffer.take();
            let Some(buffer) = buffer else {
                debug_assert!(false, "buffered reply without its buffer");
                conn.release(index);
                continue;
            };
            let buffer_bytes = buffer.len();
            match conn.send_all(buffer, len).await {
                Ok(buffer) => conn.slots.borrow_mut()[index].buffer = Some(buffer),
                Err(err) => {
                    conn.forget_buffer(buffer_bytes);
                    send_failed(&conn, &err);
                }
            }
            conn.release(index);
        }
        if batch_bytes > 0 {
            send_batch(&conn, &mut batch, batch_bytes).await;
        }
    }
}

/// Sends slot `first`'s READ reply held as parts (`ReplyAt::Parts`), with (in clear text) the
/// READ replies in parts queued right behind it, then drops their parts (the cached blocks
/// they share), gives each buffer back to its slot and frees the slots.
///
/// In clear text the headers, the copied ranges of the buffers and the shared blocks go out
/// as one `sendmsg` of a `SendList` (adjacent ranges of a buffer, such as the header and the
/// bytes copied right behind it, are one iovec). The list holds the blocks until the kernel
/// has copied them, so a writer meanwhile cannot change what is sent: a cached block is
/// never written in place while shared (the cache gives a writer a copy of it instead).
async fn send_parts(conn: &Conn, first: usize, header_len: usize) {
    if conn.tls.get().is_none() && !conn.broken.get() {
        send_parts_plain(conn, first, header_len).await;
        return;
    }
    let (buffer, parts) = take_reply_parts(conn, first);
    if let Some(buffer) = &buffer {
        if !conn.broken.get() {
            let result = conn
                .send_parts_tls(&buffer[..header_len], &buffer[header_len..], &parts)
                .await;
            if let Err(err) = result {
                send_failed(conn, &err);
            }
        }
    } else {
        debug_assert!(false, "a reply in parts without its buffer");
    }
    give_back_reply_parts(conn, first, buffer, parts);
    conn.release(first);
}

/// Takes slot `index`'s READ reply in parts out of the slot: its buffer (the header and the
/// copied ranges) and its parts. Out of the slot while they are sent (no borrow across an
/// await); the writer owns them until [`give_back_reply_parts`].
fn take_reply_parts(conn: &Conn, index: usize) -> (Option<IoBuf>, Vec<ReadPart>) {
    let mut slots = conn.slots.borrow_mut();
    let slot = &mut slots[index];
    (slot.buffer.take(), std::mem::take(&mut slot.parts))
}

/// Puts back into slot `index` its buffer (if it came back from the send) and its parts
/// vector, emptied (for its capacity: the slot must not hold the sent reply's blocks).
fn give_back_reply_parts(
    conn: &Conn,
    index: usize,
    buffer: Option<IoBuf>,
    mut parts: Vec<ReadPart>,
) {
    parts.clear();
    let mut slots = conn.slots.borrow_mut();
    if buffer.is_some() {
        slots[index].buffer = buffer;
    }
    slots[index].parts = parts;
}

/// Most READ replies in parts one `sendmsg` carries in clear text. Why batch: the writer
/// sends one reply at a time, and while a 128 KiB reply goes out the next ones queue up
/// (5 on average, 128K reads at iodepth 8 from the cache); each `sendmsg` costs its own
/// submission, TCP push and wake-up of the client.
const PARTS_REPLIES_PER_SEND_MAX: usize = 16;

/// No more replies join a send once it holds this many bytes: a send's fixed costs are
/// paid off long before, and its slots are freed only when all of it is sent (on a slow
/// link, later the larger the send).
const PARTS_SEND_BYTES_MAX: usize = 1 << 20;

/// READ replies in parts sent in clear text, and the `sendmsg`s that carried them, since
/// the process started (every server together): their ratio is how well replies are batched
/// ([`parts_reply_counts`]).
static PARTS_REPLIES_SENT: AtomicU64 = AtomicU64::new(0);
static PARTS_SENDS: AtomicU64 = AtomicU64::new(0);

/// READ replies in parts sent in clear text and the `sendmsg`s that carried them, since the
/// process started, every server together (for tests and diagnostics: at iodepth 8 from
/// the cache, about four replies per send).
pub fn parts_reply_counts() -> (u64, u64) {
    (
        PARTS_REPLIES_SENT.load(Ordering::Relaxed),
        PARTS_SENDS.load(Ordering::Relaxed),
    )
}

/// [`send_parts`] in clear text: slot `first`'s reply and the READ replies in parts queued
/// right behind it (at most [`PARTS_REPLIES_PER_SEND_MAX`] in all, none added past
/// [`PARTS_SEND_BYTES_MAX`]), in queue order, as one `SendList`.
async fn send_parts_plain(conn: &Conn, first: usize, first_header_len: usize) {
    let mut list = conn.send_list.take().unwrap_or_default();
    let mut sent = [0usize; PARTS_REPLIES_PER_SEND_MAX];
    let mut count = 0usize;
    let mut buffers_bytes = 0usize;
    let mut next = Some((first, first_header_len));
    // Bounded: at most PARTS_REPLIES_PER_SEND_MAX replies.
    while let Some((index, header_len)) = next.take() {
        let (buffer, mut parts) = take_reply_parts(conn, index);
        if let Some(buffer) = buffer {
            buffers_bytes += buffer.len();
            if count == 0 {
                list.start(buffer);
            } else {
                list.add_own(buffer);
            }
            list.push_own(0..header_len);
            // Bounded by the parts of the read.
            for part in parts.drain(..) {
                match part {
                    ReadPart::Copied(range) => {
                        list.push_own(header_len + range.start..header_len + range.end);
                    }
                    ReadPart::Shared { block, range, .. } => list.push_shared(block, range),
                    ReadPart::Owned { block, range, .. } => list.push_taken(block, range),
                }
            }
            sent[count] = index;
            count += 1;
        } else {
            debug_assert!(false, "a reply in parts without its buffer");
            conn.release(index);
        }
        // The vector back, emptied (also when the buffer was missing: the slot is free then,
        // and must not hold the dropped reply's cached blocks); the buffer comes back after
        // the send.
        give_back_reply_parts(conn, index, None, parts);
        if count < PARTS_REPLIES_PER_SEND_MAX && list.len() < PARTS_SEND_BYTES_MAX {
            next = pop_parts_reply(conn);
        }
    }
    if count == 0 {
        conn.send_list.set(Some(list));
        return;
    }
    PARTS_REPLIES_SENT.fetch_add(count as u64, Ordering::Relaxed);
    PARTS_SENDS.fetch_add(1, Ordering::Relaxed);
    match conn.stream.send_list(list).await {
        Ok(mut list) => {
            {
                let mut slots = conn.slots.borrow_mut();
                let buffers = list.finish();
                // One owned buffer per reply sent: any other count would lose a buffer
                // without forgetting its bytes (the budget would shrink for good).
                debug_assert_eq!(buffers.len(), count);
                for (buffer, &index) in buffers.zip(&sent[..count]) {
                    slots[index].buffer = Some(buffer);
                }
            }
            conn.send_list.set(Some(list));
        }
        Err(err) => {
            // The list went with the failed send, and the buffers in it.
            conn.forget_buffer(buffers_bytes);
            send_failed(conn, &err);
        }
    }
    for &index in &sent[..count] {
        conn.release(index);
    }
}

/// Takes the next queued reply off the queue if it is a READ reply in parts: its slot and
/// header length.
fn pop_parts_reply(conn: &Conn) -> Option<(usize, usize)> {
    let mut replies = conn.replies.borrow_mut();
    let &index = replies.front()?;
    let ReplyAt::Parts(header_len) = conn.slots.borrow()[index].reply else {
        return None;
    };
    replies.pop_front();
    Some((index, header_len))
}

async fn send_batch(conn: &Conn, batch: &mut Option<IoBuf>, len: usize) {
    let Some(buf) = batch.take() else {
        return;
    };
    if conn.broken.get() {
        *batch = Some(buf);
        return;
    }
    match conn.send_all(buf, len).await {
        Ok(buf) => *batch = Some(buf),
        Err(err) => send_failed(conn, &err),
    }
}

fn send_failed(conn: &Conn, err: &io::Error) {
    // A client that disconnects without reading its replies (or right after ABORT/DISC) makes
    // sends fail with EPIPE or ECONNRESET: an ordinary close.
    let ordinary = matches!(
        err.raw_os_error(),
        Some(libc::EPIPE | libc::ECONNRESET | libc::ENOTCONN)
    );
    if ordinary {
        tracing::debug!(%err, "nbd: client gone; dropping its replies");
    } else {
        tracing::warn!(%err, "nbd: send failed; closing the connection");
    }
    conn.break_connection();
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::reply::CHUNK_HEADER_BYTES;
    use proptest::prelude::*;

    /// A chunk of a structured READ reply, parsed back: (offset, hole length or data, done).
    #[derive(Debug)]
    enum Parsed {
        Data(u64, Vec<u8>, bool),
        Hole(u64, u32, bool),
    }

    fn be_u16(b: &[u8]) -> u16 {
        u16::from_be_bytes(b[..2].try_into().unwrap())
    }
    fn be_u32(b: &[u8]) -> u32 {
        u32::from_be_bytes(b[..4].try_into().unwrap())
    }
    fn be_u64(b: &[u8]) -> u64 {
        u64::from_be_bytes(b[..8].try_into().unwrap())
    }

    fn parse(mut reply: &[u8]) -> Vec<Parsed> {
        let mut out = Vec::new();
        while !reply.is_empty() {
            assert_eq!(be_u32(reply), 0x668e_33ef, "structured reply magic");
            let done = be_u16(&reply[4..]) & 1 != 0;
            let kind = be_u16(&reply[6..]);
            assert_eq!(be_u64(&reply[8..]), 77, "cookie");
            let len = be_u32(&reply[16..]) as usize;
            let body = &reply[CHUNK_HEADER_BYTES..CHUNK_HEADER_BYTES + len];
            out.push(match kind {
                1 => Parsed::Data(be_u64(body), body[8..].to_vec(), done),
                2 => Parsed::Hole(be_u64(body), be_u32(&body[8..]), done),
                k => panic!("unexpected chunk type {k}"),
            });
            reply = &reply[CHUNK_HEADER_BYTES + len..];
        }
        out
    }

    /// Lays `data` (read at `offset`) out as `read_structured` does and checks the reply.
    fn check(offset: u64, data: &[u8]) -> Vec<Parsed> {
        let mut buf = vec![0xAAu8; OFFSET_DATA_HEADER_BYTES + data.len()];
        buf[OFFSET_DATA_HEADER_BYTES..].copy_from_slice(data);
        let n = lay_out_chunks(Cookie(77), offset, data.len(), &mut buf);
        assert!(
            n <= OFFSET_DATA_HEADER_BYTES + data.len(),
            "reply over its bound"
        );
        let chunks = parse(&buf[..n]);
        let mut rebuilt = Vec::new();
        let mut last_hole: Option<bool> = None;
        for (i, c) in chunks.iter().enumerate() {
            let (at, hole, done) = match c {
                Parsed::Data(at, bytes, done) => {
                    rebuilt.extend_from_slice(bytes);
                    (*at, false, *done)
                }
                Parsed::Hole(at, len, done) => {
                    assert!(
                        u64::from(*len) >= HOLE_CHUNK_MIN_BYTES,
                        "hole chunk of {len} bytes"
                    );
                    rebuilt.resize(rebuilt.len() + *len as usize, 0);
                    (*at, true, *done)
                }
            };
            assert_eq!(done, i == chunks.len() - 1, "DONE on the last chunk only");
            assert_ne!(last_hole, Some(hole), "two chunks of one kind in a row");
            last_hole = Some(hole);
            let prefix = rebuilt.len()
                - match c {
                    Parsed::Data(_, b, _) => b.len(),
                    Parsed::Hole(_, l, _) => *l as usize,
                };
            assert_eq!(
                at,
                offset + prefix as u64,
                "chunks in offset order, contiguous"
            );
        }
        assert_eq!(rebuilt, data, "the reply reads back as the data");
        chunks
    }

    #[test]
    fn data_is_one_chunk_and_zeros_are_one_hole() {
        let data: Vec<u8> = (0..65536u32).map(|i| (i % 251) as u8 + 1).collect();
        assert!(matches!(check(4096, &data)[..], [Parsed::Data(..)]));
        assert!(matches!(
            check(0, &[0u8; 16384])[..],
            [Parsed::Hole(0, 16384, true)]
        ));
        // A zero 4 KiB piece inside data is a hole; zeros not covering a whole piece are data.
        let mut mixed = data.clone();
        mixed[8192..12288].fill(0);
        mixed[20000..24000].fill(0);
        let chunks = check(0, &mixed);
        assert!(matches!(
            chunks[..],
            [
                Parsed::Data(0, _, false),
                Parsed::Hole(8192, 4096, false),
                Parsed::Data(12288, _, true)
            ]
        ));
    }

    proptest! {
        #[test]
        fn any_layout_reads_back_within_bound(
            offset in 0u64..1 << 20,
            runs in proptest::collection::vec((any::<bool>(), 1usize..20000), 1..12),
            seed in any::<u8>(),
        ) {
            let mut data = Vec::new();
            for (zero, len) in runs {
                if zero {
                    data.resize(data.len() + len, 0);
                } else {
                    data.extend((0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) | 1));
                }
            }
            check(offset, &data);
        }

        /// `has_zero_piece` (which looks at each piece's first word, then scans) answers as
        /// `lay_out_chunks` lays out holes, whatever the data (runs of zeros, of data, and of
        /// data behind a few zero bytes, which passes the first look) and however it is cut
        /// into copied and shared parts.
        #[test]
        fn zero_pieces_are_found_where_the_layout_has_holes(
            offset in 0u64..1 << 20,
            runs in proptest::collection::vec((0u8..3, 1usize..20000), 1..12),
            cuts in proptest::collection::vec(any::<proptest::sample::Index>(), 0..8),
            seed in any::<u8>(),
        ) {
            let mut data = Vec::new();
            for (kind, len) in runs {
                let start = data.len();
                data.extend((0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) | 1));
                match kind {
                    0 => data[start..].fill(0),
                    1 => {}
                    _ => {
                        let zeros = len.min(100);
                        data[start..start + zeros].fill(0);
                    }
                }
            }
            let len = data.len();
            let mut points: Vec<usize> = cuts.iter().map(|i| i.index(len)).collect();
            points.extend([0, len]);
            points.sort_unstable();
            points.dedup();
            // Copied parts' bytes in `out`; shared parts' in blocks of their own (`out` holds
            // garbage there).
            let mut out = vec![0xEEu8; len];
            let mut parts = Vec::new();
            for (k, w) in points.windows(2).enumerate() {
                let range = w[0]..w[1];
                if k % 2 == 0 {
                    out[range.clone()].copy_from_slice(&data[range.clone()]);
                    parts.push(ReadPart::Copied(range));
                } else {
                    let mut block = vec![0x55u8; 7 + range.len()];
                    block[7..].copy_from_slice(&data[range.clone()]);
                    parts.push(ReadPart::Shared {
                        block: Arc::new(IoBuf::from_slice(&block)),
                        range: 7..7 + range.len(),
                        at: range.start,
                    });
                }
            }
            let holes = check(offset, &data)
                .iter()
                .any(|c| matches!(c, Parsed::Hole(..)));
            prop_assert_eq!(has_zero_piece(offset, len, &parts, &out), holes);
        }
    }
}
