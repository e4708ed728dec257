//! `oxpool recv`: a send stream (or several, one after the other, as `send -I` writes them)
//! into a volume, all or nothing per stream.
//!
//! Each stream is written into a hidden dataset `VOL%recv` (a clone of the base snapshot for
//! an incremental stream, a new volume for a full one) while the target stays as it is; once
//! END is verified and that data is synced, one change applied by the txg sync swaps it into
//! the target and snapshots it with the sender's guid (`dsl/recv.rs`). A stream that is
//! damaged, cut short or refused destroys the hidden dataset: the target is exactly as it
//! was, and nothing leaks. A hidden dataset left by a crash is destroyed at import (and by
//! the next receive into that volume).
//!
//! With `-s` ([`ReceiveOptions::resumable`]) a stream that stops early (cut, damaged, or the
//! power failed) keeps what it applied: the hidden dataset stays with the stream's identity
//! and the offset below which every record is durable ([`crate::dsl::resume`]), and
//! [`Pool::receive_resume_token`] hands that to `oxpool send -t`, whose stream continues it.
//! The target still changes only at END. `recv -A` ([`Pool::abort_receive`]) discards it.

use super::snapshot::now_s;
use super::Pool;
use crate::dmu::dirty::StoredForm;
use crate::dmu::object::Object;
use crate::dmu::tree::{levels_for, BlockTree};
use crate::dsl::dataset::Dataset;
use crate::dsl::recv::{ReceiveSwap, ReceiveTarget};
use crate::dsl::resume::ResumeProgress;
use crate::dsl::snapshot::{Lineage, SnapOp};
use crate::props::{SyncMode, VolumeProps};
use crate::spa::check_name;
use crate::spa::Spa;
use crate::zil::Zil;
use crate::zvol::{StoredBlock, VolumeInner};
use crate::{EngineError, Result, Volume};
use oxpool_format::stream::{
    ResumeToken, StreamBegin, StreamDecoder, StreamFeatures, StreamRecord, RECORD_HEADER_BYTES,
};
use oxpool_format::{
    BlockPtr, DataRecord, Guid, OriginMeta, ReceiveResumeMeta, VolumeId, SECTOR_BYTES,
};
use oxpool_io::IoBuf;
use std::collections::VecDeque;
use std::io::{IoSliceMut, Read};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex};

/// What [`Pool::receive_with`] calls before `-F` destroys anything: the target volume and
/// the snapshots to destroy; an error (one line) refuses the stream.
pub type BeforeDestroy<'a> = dyn Fn(&str, &[String]) -> std::result::Result<(), String> + 'a;

/// What [`Pool::receive_with`] calls as each stream of the input is received (in a dry run,
/// checked): a caller can say what was kept even when a later stream fails.
pub type OnKept<'a> = dyn Fn(&Received) + 'a;

/// How to receive.
#[derive(Clone, Debug, Default)]
pub struct ReceiveOptions {
    /// `-F`: for an incremental stream, destroy the target's snapshots after the base and
    /// discard the changes made since it (else either is refused).
    pub force: bool,
    /// `-s`: a stream that stops early keeps what it applied, to be resumed.
    pub resumable: bool,
    /// `-n`: read and verify the input as a receive would, and change nothing
    /// ([`Pool::receive`] then returns what it would have received).
    pub dry_run: bool,
    /// The name the received snapshot takes instead of the stream's (`recv POOL/VOL@SNAP`,
    /// as `zfs recv` names it). An input of one stream only: a second is refused (those
    /// before it are kept, as after any failed stream). A resumed receive takes the name its
    /// own command gives, or without one the name its interrupted receive was given.
    pub snapshot: Option<String>,
}

/// One snapshot received.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Received {
    /// `pool/volume@snapshot` as received.
    pub snapshot: String,
    /// The sent snapshot's name as the sender gave it (the stream's BEGIN).
    pub source: String,
    /// Its guid: the sender's.
    pub guid: u64,
    /// Whether the stream was incremental.
    pub incremental: bool,
    /// DATA records applied (by this receive: a resumed one counts from where it resumed).
    pub data_records: u64,
    /// FREE records applied (likewise).
    pub free_records: u64,
    /// Where a resumed stream (`send -t`, marked `RESUMING`) began: the volume offset below
    /// which an earlier, interrupted receive had applied every record (0 if it applied
    /// none). None for a stream from the start.
    pub resumed_at_bytes: Option<u64>,
}

/// A full receive's new volume, registered when the receive ends: its dataset and log.
type NewTarget = (Arc<Dataset>, Arc<Zil>);

/// Most bytes of verified blocks the reading thread may have queued for the applying
/// thread: the receive's read-ahead (as the send's `SEND_PREFETCH_BYTES_DEFAULT`, ZFS's
/// `zfs_recv_queue_length` is 16 MiB).
const RECEIVE_QUEUE_BYTES_MAX: usize = 32 << 20;

/// What one queued item takes besides its blocks' bytes (see [`ApplyQueue::push`]).
const QUEUED_ITEM_BYTES: usize = std::mem::size_of::<(Applied, usize)>();

/// Contiguous blocks handed to the volume in one write (one range lock, one txg hold).
const WRITE_RUN_BYTES_MAX: u64 = 1 << 20;

/// Bytes of free block buffers the applying thread keeps in the I/O buffer pool for the
/// reading thread (made and touched by the applying thread when the pool runs short).
const PREFILL_BYTES: usize = 4 << 20;

/// A record the decoder handed out, owned (so the input can move on). A DATA record's block
/// is the buffer its payload was read into, as stored by the sender.
enum Record {
    Begin(StreamBegin),
    Data {
        offset_bytes: u64,
        block: StoredBlock,
    },
    Free {
        offset_bytes: u64,
        length_bytes: u64,
    },
    SetSize(u64),
    End,
}

/// The input, cut into records of one stream after the other.
///
/// Every payload is read straight into a buffer of its own (`IoBuf`, whole sectors), which
/// the decoder verifies where it lies and which then becomes the volume's dirty block: the
/// kernel's copy into it is the only copy of a block on the receive's side. Each read asks
/// for the rest of the current payload and the next header at once (`read_vectored`), so a
/// record costs one system call; nothing past the next header is read, so the bytes of a
/// stream that follows END are left for the next stream's decoder.
struct Input<'a> {
    input: &'a mut dyn Read,
    /// The start of the next record's header, read ahead with a payload.
    head: [u8; RECORD_HEADER_BYTES],
    head_len: usize,
    eof: bool,
    /// Streams decoded to their END, and their bytes: where in the input the current one
    /// starts, for its errors (a decoder counts from its stream's start).
    streams_ended: u32,
    streams_ended_bytes: u64,
}

impl Input<'_> {
    /// Whether the input is at its end (reading more if needed): no further stream.
    fn at_end(&mut self) -> Result<bool> {
        if self.head_len == 0 && !self.eof {
            self.read_into(&mut [])?;
        }
        Ok(self.head_len == 0)
    }

    /// One read: into `payload` first, then into the header buffer (which has room). Returns
    /// the bytes read into `payload`; 0 bytes read in all marks the end of the input.
    fn read_into(&mut self, payload: &mut [u8]) -> Result<usize> {
        let payload_len = payload.len();
        // Bounded: read returns data, 0 at the end, or an error; interrupted reads retry.
        loop {
            let head = &mut self.head[self.head_len..];
            let read = if payload.is_empty() {
                self.input.read(head)
            } else {
                let mut bufs = [IoSliceMut::new(payload), IoSliceMut::new(head)];
                self.input.read_vectored(&mut bufs)
            };
            match read {
                Ok(0) => {
                    self.eof = true;
                    return Ok(0);
                }
                Ok(n) => {
                    let into_payload = n.min(payload_len);
                    self.head_len += n - into_payload;
                    return Ok(into_payload);
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(EngineError::io("receive stream", e)),
            }
        }
    }

    /// The next record of the stream `dec` decodes.
    fn next(&mut self, dec: &mut StreamDecoder) -> Result<Record> {
        // Bounded by the input: each round consumes a header's bytes or ends it.
        loop {
            while self.head_len < RECORD_HEADER_BYTES && !self.eof {
                self.read_into(&mut [])?;
            }
            if self.head_len == 0 {
                return Err(self.stream_error(dec.finish().err()));
            }
            // At most one header: the decoder stops at its end (or takes what the end of
            // the input left of it).
            let d = dec
                .decode(&self.head[..self.head_len])
                .map_err(|e| self.stream_error(Some(e)))?;
            let consumed = d.consumed_bytes;
            let record = d.record.map(owned);
            self.head.copy_within(consumed..self.head_len, 0);
            self.head_len -= consumed;
            if let Some(record) = record {
                if matches!(record, Record::End) {
                    self.streams_ended += 1;
                    self.streams_ended_bytes += dec.position_bytes();
                }
                return Ok(record);
            }
            let pending = dec.payload_pending_bytes();
            if pending == 0 {
                continue;
            }
            // Bounded by the record type (a block, at most `volblocksize`) before the header
            // was accepted. A recycled buffer (a block of a txg synced before, kept by the
            // receive's pool reservation), not zeroed: the payload overwrites it, and only
            // the padding past the payload to the sector is zeroed here.
            let mut buf = IoBuf::for_overwrite(pending.next_multiple_of(SECTOR_BYTES as usize));
            buf[pending..].fill(0);
            let mut filled = 0;
            debug_assert_eq!(self.head_len, 0, "no byte past a header is read before it");
            // Bounded by the input: each round reads bytes or ends it.
            while filled < pending && !self.eof {
                filled += self.read_into(&mut buf[filled..pending])?;
            }
            let d = dec
                .decode(&buf[..filled])
                .map_err(|e| self.stream_error(Some(e)))?;
            let Some(record) = d.record else {
                // Cut inside the payload: the decoder took what there was.
                return Err(self.stream_error(dec.finish().err()));
            };
            // A DATA record's payload is `buf` itself: its fields are copied out, and `buf`
            // becomes the block.
            let record = match record {
                StreamRecord::Data(data) => Ok(stored_form(&data)),
                other => Err(owned(other)),
            };
            return Ok(match record {
                Ok((offset_bytes, form)) => Record::Data {
                    offset_bytes,
                    block: StoredBlock { buf, form },
                },
                Err(other) => other,
            });
        }
    }

    /// `e` (None: the input ended before the stream did) as a receive's error. Past the
    /// input's first stream (`-I`), it says where in the input as well as in its stream.
    fn stream_error(&self, e: Option<oxpool_format::stream::StreamError>) -> EngineError {
        match e {
            Some(e) if self.streams_ended > 0 => EngineError::invalid(format!(
                "cannot receive: byte {} of the input (byte {} of its stream {}): {}",
                self.streams_ended_bytes + e.offset_bytes,
                e.offset_bytes,
                self.streams_ended + 1,
                e.kind
            )),
            Some(e) => EngineError::invalid(format!("cannot receive: {e}")),
            None => EngineError::invalid("cannot receive: the stream ended early"),
        }
    }
}

/// `e`, which stopped a stream of the input after `received` (`-I`: one stream per
/// snapshot), saying which were received, each whole, and stay.
fn after_received(e: EngineError, received: &[Received], dry_run: bool) -> EngineError {
    let Some(last) = received.last() else {
        return e;
    };
    let kept = format!(
        " (stream {} of the input; {} {} before it, up to {})",
        received.len() + 1,
        received.len(),
        if dry_run { "checked" } else { "received" },
        last.snapshot
    );
    match e {
        EngineError::Invalid(m) => EngineError::Invalid(m + &kept),
        EngineError::Busy(m) => EngineError::Busy(m + &kept),
        other => other,
    }
}

/// What one stream made (or, in a dry run, would make): `full@snapshot` from `begin`'s
/// stream, with its records' counts.
fn received(
    full: &str,
    snapshot: &str,
    begin: &StreamBegin,
    data_records: u64,
    free_records: u64,
) -> Received {
    Received {
        snapshot: format!("{full}@{snapshot}"),
        source: begin.name.clone(),
        guid: begin.toguid.0,
        incremental: begin.fromguid.is_some(),
        data_records,
        free_records,
        resumed_at_bytes: begin
            .features
            .contains(StreamFeatures::RESUMING)
            .then_some(begin.resume_offset_bytes),
    }
}

/// The options a stream is planned with: one that resumes `resumed` keeps the name its
/// interrupted receive was to give (`recv -s POOL/VOL@SNAP`) unless this command names one
/// (the plan checks the name read back like any other).
fn plan_options(opts: &ReceiveOptions, resumed: Option<&ReceiveResumeMeta>) -> ReceiveOptions {
    let mut planned = opts.clone();
    if planned.snapshot.is_none() {
        planned.snapshot = resumed.map(|meta| meta.snapshot.clone());
    }
    planned
}

/// The snapshot a stream makes (its name after `@`), checked as a snapshot name.
fn stream_snapshot(begin: &StreamBegin) -> Result<String> {
    let snapshot = begin
        .name
        .rsplit_once('@')
        .map(|(_, s)| s.to_string())
        .unwrap_or_default();
    check_name("snapshot", &snapshot)?;
    Ok(snapshot)
}

/// A DATA record's offset and how its block is stored.
fn stored_form(data: &DataRecord<'_>) -> (u64, StoredForm) {
    let form = StoredForm {
        compression: data.compression,
        lsize_bytes: data.lsize_bytes,
        // At most `volblocksize` (the rules), so it fits.
        psize_bytes: data.payload.len() as u32,
        checksum_type: data.checksum_type,
        checksum: data.checksum,
    };
    (data.offset_bytes, form)
}

/// A record, owned. A DATA record's block is copied (padded to whole sectors): `Input::next`
/// reads every payload into a buffer of its own instead, so this is only for a DATA record
/// without payload, which the rules refuse (its payload is at least one byte).
fn owned(record: StreamRecord<'_>) -> Record {
    match record {
        StreamRecord::Begin(b) => Record::Begin(b.clone()),
        StreamRecord::Data(data) => {
            let (offset_bytes, form) = stored_form(&data);
            let len = data.payload.len().next_multiple_of(SECTOR_BYTES as usize);
            let mut buf = IoBuf::zeroed(len);
            buf[..data.payload.len()].copy_from_slice(data.payload);
            Record::Data {
                offset_bytes,
                block: StoredBlock { buf, form },
            }
        }
        StreamRecord::Free {
            offset_bytes,
            length_bytes,
        } => Record::Free {
            offset_bytes,
            length_bytes,
        },
        StreamRecord::SetSize { volsize_bytes } => Record::SetSize(volsize_bytes),
        StreamRecord::End { .. } => Record::End,
    }
}

/// What the reading thread hands the applying thread.
enum Applied {
    /// Whole blocks from this offset on, contiguous.
    Blocks(u64, Vec<StoredBlock>),
    Free {
        offset_bytes: u64,
        length_bytes: u64,
    },
    SetSize(u64),
    End,
}

/// The queue between the receive's two threads, bounded in bytes of block buffers.
struct ApplyQueue {
    state: Mutex<QueueState>,
    changed: Condvar,
}

struct QueueState {
    items: VecDeque<(Applied, usize)>,
    bytes: usize,
    /// The reading thread is done: no more items.
    closed: bool,
    /// The applying thread is gone (it failed): pushing is pointless.
    abandoned: bool,
}

impl ApplyQueue {
    fn new() -> ApplyQueue {
        ApplyQueue {
            state: Mutex::new(QueueState {
                items: VecDeque::new(),
                bytes: 0,
                closed: false,
                abandoned: false,
            }),
            changed: Condvar::new(),
        }
    }

    /// Queues `item` (of `bytes` of blocks), waiting while the queue is full; false if the
    /// applying thread is gone. Every item also counts its own memory, so that records
    /// without blocks (FREE, a stream of nothing else) are bounded too: counted as 0 bytes
    /// they never waited, and the reading thread queued as many as the input held. So does
    /// a run's vector, allocated at a run's full length: a stream of lone blocks queued
    /// runs of one block in vectors of thousands of slots.
    fn push(&self, item: Applied, bytes: usize) -> bool {
        let vector_bytes = match &item {
            Applied::Blocks(_, blocks) => blocks.capacity() * std::mem::size_of::<StoredBlock>(),
            _ => 0,
        };
        let bytes = bytes + QUEUED_ITEM_BYTES + vector_bytes;
        let mut st = self.state.lock().unwrap();
        // Bounded: the applying thread takes items until it is gone.
        while !st.abandoned && st.bytes > 0 && st.bytes + bytes > RECEIVE_QUEUE_BYTES_MAX {
            st = self.changed.wait(st).unwrap();
        }
        if st.abandoned {
            return false;
        }
        st.bytes += bytes;
        st.items.push_back((item, bytes));
        drop(st);
        self.changed.notify_all();
        true
    }

    /// The next item; None once the reading thread is done and everything was taken.
    fn pop(&self) -> Option<Applied> {
        let mut st = self.state.lock().unwrap();
        // Bounded: the reading thread pushes or closes.
        loop {
            if let Some((item, bytes)) = st.items.pop_front() {
                st.bytes -= bytes;
                drop(st);
                self.changed.notify_all();
                return Some(item);
            }
            if st.closed {
                return None;
            }
            st = self.changed.wait(st).unwrap();
        }
    }

    /// The reading thread is done.
    fn close(&self) {
        self.state.lock().unwrap().closed = true;
        self.changed.notify_all();
    }

    /// The applying thread is gone: what is queued is dropped, the reader stops.
    fn abandon(&self) {
        let mut st = self.state.lock().unwrap();
        st.abandoned = true;
        st.items.clear();
        st.bytes = 0;
        drop(st);
        self.changed.notify_all();
    }
}

/// What a stream's BEGIN asks of the target, checked.
struct Plan {
    /// The snapshot name after `@`.
    snapshot: String,
    /// The base snapshot's name and the later snapshots `-F` destroys, each with the guid
    /// it had when checked (what the destroy is queued by: a rename while the stream
    /// arrives must not turn it on another snapshot).
    base: Option<(String, Vec<(String, Guid)>)>,
    /// A full stream replaces an existing volume (`-F`, a volume without snapshots), this
    /// one (its id as checked): the stream is received into a new hidden dataset, and its
    /// end swaps that into the volume, freeing all the volume held.
    replaces: Option<VolumeId>,
}

/// Whether `name` is a receive's hidden dataset (`VOL%recv`; `%` is in no name a user can
/// make, `check_name`). Lookups by a user's name do not find them: written to, snapshotted or
/// set, one would no longer hold what the sender sent.
pub(crate) fn is_hidden(name: &str) -> bool {
    name.contains('%')
}

/// What a volume's name takes to name its receive's hidden dataset (`VOL%recv`).
pub(crate) const HIDDEN_SUFFIX: &str = "%recv";

impl Pool {
    /// Receives the stream(s) on `input` into volume `volume`. Each stream is applied whole
    /// or not at all; an error names the first stream that failed (those before it are
    /// received).
    pub fn receive(
        &self,
        volume: &str,
        input: &mut dyn Read,
        opts: &ReceiveOptions,
    ) -> Result<Vec<Received>> {
        self.receive_with(volume, input, opts, &|_, _| Ok(()), &|_| {})
    }

    /// [`Pool::receive`], calling `before_destroy` with the target and the snapshots `-F`
    /// is to destroy (those after the stream's base) before anything is applied: its error
    /// (one line) refuses the stream with nothing changed. A server takes down those
    /// snapshots' exports there, refusing while a client has one open, as `destroy` does.
    /// `on_kept` is told of each stream received (checked, in a dry run) as it ends.
    pub fn receive_with(
        &self,
        volume: &str,
        input: &mut dyn Read,
        opts: &ReceiveOptions,
        before_destroy: &BeforeDestroy<'_>,
        on_kept: &OnKept<'_>,
    ) -> Result<Vec<Received>> {
        check_name("volume", volume)?;
        // The blocks of each synced txg are kept for the blocks read next, instead of going
        // back to the allocator and coming out again as fresh pages (page faults, zeroing):
        // at most a txg's worth are free at once, and txgs hold at most `dirty_max`.
        let _recycled = IoBuf::reserve_pool(self.spa.txg.dirty_max_bytes() as usize);
        let mut input = Input {
            input,
            head: [0; RECORD_HEADER_BYTES],
            head_len: 0,
            eof: false,
            streams_ended: 0,
            streams_ended_bytes: 0,
        };
        let mut received: Vec<Received> = Vec::new();
        // Bounded by the input: each stream consumes at least its BEGIN.
        loop {
            if input.at_end()? {
                break;
            }
            if let (Some(name), false) = (&opts.snapshot, received.is_empty()) {
                // The first stream is kept under the name: the rest can follow it as an
                // incremental from the snapshot it was sent from.
                let e = EngineError::invalid(format!(
                    "cannot receive: the input holds more than one stream, and @{name} names \
                     one snapshot: the first {} received as @{name}; send the rest as an \
                     incremental from {}",
                    if opts.dry_run { "would be" } else { "was" },
                    received[0].source
                ));
                return Err(after_received(e, &received, opts.dry_run));
            }
            let one = if opts.dry_run {
                let previous = received.last().map(|r| Guid(r.guid));
                self.check_one(volume, &mut input, opts, previous)
            } else {
                self.receive_one(volume, &mut input, opts, before_destroy)
            };
            match one {
                Ok(r) => {
                    on_kept(&r);
                    received.push(r);
                }
                Err(e) => return Err(after_received(e, &received, opts.dry_run)),
            }
        }
        if received.is_empty() {
            return Err(EngineError::invalid(
                "cannot receive: no stream on the input",
            ));
        }
        Ok(received)
    }

    fn hidden_name(volume: &str) -> String {
        format!("{volume}{HIDDEN_SUFFIX}")
    }

    /// Whether a full stream may replace existing volume `ds` (`full` is its name): as `zfs
    /// recv -F` does, only with `-F`, only a volume without snapshots (they would have to go
    /// too: destroying them is for the user to do), not a clone (it shares its origin's
    /// blocks), and of the stream's block size (the swap keeps the volume's tree shape).
    fn check_replaceable(
        full: &str,
        ds: &Dataset,
        begin: &StreamBegin,
        opts: &ReceiveOptions,
    ) -> Result<()> {
        if !opts.force {
            return Err(EngineError::invalid(format!(
                "{full} exists: a full stream makes a new volume (use -F to replace it, receive \
                 into another name, or send an incremental stream)"
            )));
        }
        let l = ds.lineage.lock().unwrap();
        if let Some(s) = l.snapshots().first() {
            return Err(EngineError::Busy(format!(
                "cannot receive a full stream into {full}: it has snapshots (e.g. {full}@{}); \
                 destroy them to replace it",
                s.name
            )));
        }
        if l.origin.is_some() {
            return Err(EngineError::Busy(format!(
                "cannot receive a full stream into {full}: it is a clone (it shares its \
                 origin's blocks); destroy it to replace it"
            )));
        }
        drop(l);
        let volblocksize_bytes = ds.props.lock().unwrap().volblocksize_bytes;
        if volblocksize_bytes != begin.volblocksize_bytes {
            return Err(EngineError::invalid(format!(
                "cannot receive a full stream into {full}: the stream's volblocksize ({}) is \
                 not the volume's ({volblocksize_bytes}); destroy it to receive the stream \
                 under its name",
                begin.volblocksize_bytes
            )));
        }
        Ok(())
    }

    /// The hidden datasets receives write into (`VOL%recv`), by name: one per receive in
    /// progress, saved by `recv -s`, or left by a crash until the next import. No other
    /// lookup finds them ([`is_hidden`]).
    pub fn receive_datasets(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .dsl
            .all()
            .into_iter()
            .filter(|d| is_hidden(&d.name()))
            .map(|d| d.name())
            .collect();
        names.sort();
        names
    }

    /// Checks BEGIN against the target.
    fn receive_plan(
        &self,
        volume: &str,
        begin: &StreamBegin,
        opts: &ReceiveOptions,
    ) -> Result<Plan> {
        let full = format!("{}/{volume}", self.spa.name);
        let snapshot = match &opts.snapshot {
            Some(name) => {
                check_name("snapshot", name)?;
                name.clone()
            }
            None => stream_snapshot(begin)?,
        };
        let target = self.dsl.get(volume);
        let Some(fromguid) = begin.fromguid else {
            if let Some(ds) = &target {
                Self::check_replaceable(&full, ds, begin, opts)?;
            }
            return Ok(Plan {
                snapshot,
                base: None,
                replaces: target.as_ref().map(|ds| ds.id),
            });
        };
        let ds = target.ok_or_else(|| {
            EngineError::invalid(format!(
                "cannot receive incremental stream: {full} does not exist"
            ))
        })?;
        if ds.props.lock().unwrap().volblocksize_bytes != begin.volblocksize_bytes {
            return Err(EngineError::invalid(format!(
                "cannot receive: the stream's volblocksize ({}) is not {full}'s",
                begin.volblocksize_bytes
            )));
        }
        // Modified since the latest snapshot: the head's root born after it.
        self.spa.sync_now()?;
        let l = ds.lineage.lock().unwrap();
        let Some(i) = l.snapshots().iter().position(|s| s.guid == fromguid) else {
            let latest = l
                .snapshots()
                .last()
                .map_or("none".to_string(), |s| format!("@{}", s.name));
            return Err(EngineError::invalid(format!(
                "cannot receive incremental stream: {full} has no snapshot with the stream's \
                 base guid {:016x} (latest: {latest})",
                fromguid.0
            )));
        };
        let base = l.snapshots()[i].clone();
        let later: Vec<(String, Guid)> = l.snapshots()[i + 1..]
            .iter()
            .map(|s| (s.name.clone(), s.guid))
            .collect();
        // The stream's snapshot already here after its base (the same stream received twice,
        // or a snapshot of the name taken since): said so, as `zfs recv` says the destination
        // exists, before the -F hint, which would destroy it only to receive it again.
        if !opts.force {
            let here = &l.snapshots()[i + 1..];
            if let Some(s) = here.iter().find(|s| s.guid == begin.toguid) {
                return Err(EngineError::invalid(format!(
                    "cannot receive incremental stream: destination {full}@{} is the stream's \
                     snapshot (guid {:016x}), received already",
                    s.name, begin.toguid.0
                )));
            }
            if here.iter().any(|s| s.name == snapshot) {
                return Err(EngineError::invalid(format!(
                    "cannot receive incremental stream: destination {full}@{snapshot} exists"
                )));
            }
        }
        if !opts.force && !later.is_empty() {
            let names: Vec<&str> = later.iter().map(|(n, _)| n.as_str()).collect();
            return Err(EngineError::Busy(format!(
                "cannot receive incremental stream: its base {full}@{} is not the latest \
                 snapshot (later: {}); use -F to destroy them",
                base.name,
                names.join(", ")
            )));
        }
        let head_root = ds.data().tree.lock().unwrap().root();
        if !opts.force && head_root.birth > base.txg {
            return Err(EngineError::Busy(format!(
                "cannot receive incremental stream: {full} was modified since @{}; use -F to \
                 discard the changes",
                base.name
            )));
        }
        if l.snapshots()[..=i].iter().any(|s| s.name == snapshot) {
            return Err(EngineError::Exists(format!("{full}@{snapshot}")));
        }
        // A guid names one snapshot of a volume: the views, clones and base lookups of the
        // volume go by it.
        if let Some(s) = l.snapshots()[..=i].iter().find(|s| s.guid == begin.toguid) {
            return Err(EngineError::invalid(format!(
                "cannot receive incremental stream: {full}@{} already has the stream's \
                 snapshot guid {:016x}",
                s.name, begin.toguid.0
            )));
        }
        // Not under the lineage's lock: the refusals take it, and the clones' lookup takes
        // every dataset's. The later snapshots get the refusals `destroy` gives them (held,
        // the origin of a clone, being sent).
        drop(l);
        for (name, _) in &later {
            if let Some(why) = self.destroy_refusal(volume, name)? {
                return Err(EngineError::Busy(format!("cannot receive: {why}")));
            }
        }
        Ok(Plan {
            snapshot,
            base: Some((base.name.clone(), later)),
            replaces: None,
        })
    }

    /// The partial receive `begin`'s stream resumes (None: it is a new one), checked
    /// against the one `recv -s` may have saved for `volume`: a resuming stream needs one,
    /// and its own; a new stream is refused while one is saved.
    fn check_saved(&self, volume: &str, begin: &StreamBegin) -> Result<Option<ReceiveResumeMeta>> {
        let full = format!("{}/{volume}", self.spa.name);
        let saved = self.saved_receive(&Self::hidden_name(volume));
        let resuming = begin.features.contains(StreamFeatures::RESUMING);
        match (&saved, resuming) {
            (Some(saved), true) => check_resume(&full, saved, begin)?,
            (None, true) => {
                return Err(EngineError::invalid(format!(
                    "cannot resume receive: {full} has no partially received stream (the \
                     token is stale: it was resumed, finished or aborted since)"
                )))
            }
            (Some(_), false) => {
                return Err(EngineError::Busy(format!(
                    "cannot receive: {full} has a partially received stream saved by recv \
                     -s: resume it (oxpool send -t with its receive_resume_token) or discard \
                     it with oxpool recv -A {full}"
                )))
            }
            (None, false) => {}
        }
        Ok(saved.filter(|_| resuming))
    }

    /// `recv -n`'s pass over one stream: its BEGIN checked against the target as a receive
    /// checks it (for the input's first stream; a later one's base must be the snapshot of
    /// the stream before it, `previous`, which a dry run did not make), every record read and
    /// verified (the decoder checks each checksum and rule), nothing written.
    fn check_one(
        &self,
        volume: &str,
        input: &mut Input<'_>,
        opts: &ReceiveOptions,
        previous: Option<Guid>,
    ) -> Result<Received> {
        let mut dec = StreamDecoder::new();
        let Record::Begin(begin) = input.next(&mut dec)? else {
            unreachable!("the decoder hands out BEGIN first");
        };
        let full = format!("{}/{volume}", self.spa.name);
        let snapshot = match previous {
            None => {
                let resumed = self.check_saved(volume, &begin)?;
                let opts = plan_options(opts, resumed.as_ref());
                self.receive_plan(volume, &begin, &opts)?.snapshot
            }
            Some(previous) if begin.fromguid == Some(previous) => stream_snapshot(&begin)?,
            Some(previous) => {
                return Err(EngineError::invalid(format!(
                    "cannot receive: the stream's base guid is {}, not the guid of the \
                     stream before it ({:016x})",
                    begin
                        .fromguid
                        .map_or("none (a full stream)".to_string(), |g| format!(
                            "{:016x}",
                            g.0
                        )),
                    previous.0
                )))
            }
        };
        let (mut data_records, mut free_records) = (0u64, 0u64);
        // Bounded by the stream: each round consumes a record; END ends it.
        loop {
            match input.next(&mut dec)? {
                Record::Begin(_) => unreachable!("the decoder refuses a second BEGIN"),
                Record::Data { .. } => data_records += 1,
                Record::Free { .. } => free_records += 1,
                Record::SetSize(_) => {}
                Record::End => break,
            }
        }
        Ok(received(
            &full,
            &snapshot,
            &begin,
            data_records,
            free_records,
        ))
    }

    /// Receives one stream, from its BEGIN to its END.
    fn receive_one(
        &self,
        volume: &str,
        input: &mut Input<'_>,
        opts: &ReceiveOptions,
        before_destroy: &BeforeDestroy<'_>,
    ) -> Result<Received> {
        let mut dec = StreamDecoder::new();
        let Record::Begin(begin) = input.next(&mut dec)? else {
            unreachable!("the decoder hands out BEGIN first");
        };
        let full = format!("{}/{volume}", self.spa.name);
        let hidden_name = Self::hidden_name(volume);
        let resumed = self.check_saved(volume, &begin)?;
        let plan = self.receive_plan(volume, &begin, &plan_options(opts, resumed.as_ref()))?;
        if let Some((_, later)) = plan.base.as_ref().filter(|(_, l)| !l.is_empty()) {
            let names: Vec<String> = later.iter().map(|(n, _)| n.clone()).collect();
            before_destroy(volume, &names).map_err(EngineError::Busy)?;
        }
        let (hidden, new_target) = if resumed.is_some() {
            let hidden = self.hidden_volume(&hidden_name)?;
            // The name this resume gives is the one a later resume keeps (the next sync
            // writes it with the offset).
            if let Some(r) = &mut hidden.vol.ds.lineage.lock().unwrap().receive_resume {
                r.meta.snapshot = plan.snapshot.clone();
            }
            let target = match &plan.base {
                Some(_) => None,
                None if plan.replaces.is_some() => None,
                None => Some(self.new_target(volume, &begin)?),
            };
            (hidden, target)
        } else {
            // A hidden dataset left by an interrupted receive (a crash) goes first.
            if self.dsl.get(&hidden_name).is_some() {
                self.destroy_hidden(&hidden_name)?;
            }
            let (hidden, new_target) = match &plan.base {
                Some((base, _)) => {
                    // The plan is incremental only with a base guid.
                    let guid = begin.fromguid.ok_or_else(|| {
                        EngineError::invalid("an incremental stream without its base guid")
                    })?;
                    (self.hidden_clone(volume, base, guid, &hidden_name)?, None)
                }
                None => match plan.replaces {
                    Some(id) => (
                        self.hidden_replacing(volume, id, &hidden_name, &begin)?,
                        None,
                    ),
                    None => {
                        let (hidden, target) = self.hidden_new(volume, &hidden_name, &begin)?;
                        (hidden, Some(target))
                    }
                },
            };
            if opts.resumable {
                hidden.vol.ds.lineage.lock().unwrap().receive_resume =
                    Some(ResumeProgress::new(resume_meta(&begin, &plan.snapshot)));
            }
            (hidden, new_target)
        };
        let applied = self.apply_records(&hidden, &begin, input, &mut dec);
        let (data_records, free_records) = match applied {
            Ok(counts) => counts,
            Err(e) if opts.resumable => return Err(self.keep_partial(&full, &hidden_name, e)),
            Err(e) => {
                self.destroy_hidden(&hidden_name)?;
                return Err(e);
            }
        };
        // The hidden dataset's data durable and its tree clean before the swap.
        if let Err(e) = self.spa.sync_now() {
            if !opts.resumable {
                let _ = self.destroy_hidden(&hidden_name);
            }
            return Err(e);
        }
        let mut ops: Vec<(VolumeId, SnapOp)> = Vec::new();
        if let Some((_, later)) = &plan.base {
            // Applied before the swap in the same sync: the target's name sorts before the
            // hidden one's (a prefix of it), and a sync applies ops dataset by dataset in
            // name order. By the guids checked: the sync skips one destroyed since.
            let target = match self.dataset(volume) {
                Ok(ds) => ds,
                Err(e) => {
                    // Unreachable while the hidden clone's origin (the base) keeps the
                    // target; never leave the hidden dataset behind all the same.
                    if !opts.resumable {
                        let _ = self.destroy_hidden(&hidden_name);
                    }
                    return Err(e);
                }
            };
            ops.extend(later.iter().rev().map(|(name, guid)| {
                (
                    target.id,
                    SnapOp::Destroy {
                        name: name.clone(),
                        guid: *guid,
                    },
                )
            }));
        }
        let target = match &new_target {
            Some((ds, _)) => ReceiveTarget::New(ds.clone()),
            None => ReceiveTarget::Existing(volume.to_string()),
        };
        ops.push((
            hidden.vol.ds.id,
            SnapOp::Receive(ReceiveSwap {
                target,
                base_guid: begin.fromguid,
                snapshot: plan.snapshot.clone(),
                guid: begin.toguid,
                creation_s: begin.creation_time_ns / 1_000_000_000,
                force: opts.force,
                replaces: plan.replaces,
            }),
        ));
        let queued = self.spa.txg.check_writable().and_then(|()| {
            let open = self.spa.txg.open_txg();
            self.dsl.queue_ops(open, ops);
            self.spa.sync_now()
        });
        let swapped = self.dsl.get(&hidden_name).is_none();
        if !swapped {
            let _ = self.destroy_hidden(&hidden_name);
            queued?;
            let what = if plan.replaces.is_some() {
                "was snapshotted, destroyed or replaced"
            } else {
                "was written to, or its snapshots changed,"
            };
            return Err(EngineError::Busy(format!(
                "cannot receive: {full} {what} while the stream was received; nothing was \
                 applied"
            )));
        }
        self.volumes.lock().unwrap().remove(&hidden_name);
        if let Some((ds, zil)) = new_target {
            self.volumes
                .lock()
                .unwrap()
                .insert(volume.to_string(), Arc::new(VolumeInner::new(ds, zil)));
        }
        queued?;
        Ok(received(
            &full,
            &plan.snapshot,
            &begin,
            data_records,
            free_records,
        ))
    }

    /// The saved state of a resumable receive into hidden dataset `hidden`, if any.
    fn saved_receive(&self, hidden: &str) -> Option<ReceiveResumeMeta> {
        let ds = self.dsl.get(hidden)?;
        let l = ds.lineage.lock().unwrap();
        l.receive_resume.as_ref().map(|r| r.meta.clone())
    }

    /// A resumable receive stopped by `e`: what it applied is synced and kept, and the error
    /// says how to resume it. If even that sync fails, the error says so (the hidden dataset
    /// then holds what the last good sync wrote, still consistent with its offset).
    fn keep_partial(&self, full: &str, hidden: &str, e: EngineError) -> EngineError {
        if let Err(sync) = self.spa.sync_now() {
            return EngineError::invalid(format!(
                "{e}; the partially received state could not be saved: {sync}"
            ));
        }
        match self.resume_token_of(hidden) {
            Some(token) => EngineError::invalid(format!(
                "{e}; partially received state saved: resume with oxpool send -t {token} \
                 (the receive_resume_token of {full}), or discard it with oxpool recv -A {full}"
            )),
            None => e,
        }
    }

    /// The token of the receive saved in hidden dataset `hidden`.
    fn resume_token_of(&self, hidden: &str) -> Option<String> {
        let m = self.saved_receive(hidden)?;
        Some(
            ResumeToken {
                toguid: m.toguid,
                fromguid: m.fromguid,
                offset_bytes: m.offset_bytes,
                features: StreamFeatures(m.features),
            }
            .to_string(),
        )
    }

    /// `receive_resume_token` of `volume`: where an interrupted `recv -s` into it stopped
    /// (for `oxpool send -t`), or None. The volume itself need not exist (a full stream
    /// makes it only at its end).
    pub fn receive_resume_token(&self, volume: &str) -> Option<String> {
        self.resume_token_of(&Self::hidden_name(volume))
    }

    /// `recv -A`: discards the partially received stream saved for `volume`.
    pub fn abort_receive(&self, volume: &str) -> Result<()> {
        check_name("volume", volume)?;
        let hidden = Self::hidden_name(volume);
        if self.saved_receive(&hidden).is_none() {
            return Err(EngineError::NotFound(format!(
                "{}/{volume} has no partially received stream to abort",
                self.spa.name
            )));
        }
        self.destroy_hidden(&hidden)
    }

    /// The registered hidden dataset `name`, as a volume.
    fn hidden_volume(&self, name: &str) -> Result<Volume> {
        let vol = self
            .volumes
            .lock()
            .unwrap()
            .get(name)
            .cloned()
            .ok_or_else(|| EngineError::NotFound(format!("{}/{name}", self.spa.name)))?;
        Ok(Volume {
            pool: self.spa.clone(),
            dsl: self.dsl.clone(),
            vol,
        })
    }

    /// At import: destroys the hidden datasets of receives a crash interrupted, except the
    /// partial receives `recv -s` saved (they wait for `send -t` or `recv -A`).
    pub(super) fn destroy_stale_receives(&self) -> Result<()> {
        let stale: Vec<String> = self
            .dsl
            .all()
            .into_iter()
            .filter(|ds| {
                ds.name().ends_with("%recv") && ds.lineage.lock().unwrap().receive_resume.is_none()
            })
            .map(|ds| ds.name())
            .collect();
        for name in stale {
            tracing::info!(
                pool = self.spa.name,
                dataset = name,
                "destroying an interrupted receive"
            );
            self.destroy_hidden(&name)?;
        }
        Ok(())
    }

    /// Destroys hidden dataset `name` (a receive that failed or was left by a crash).
    fn destroy_hidden(&self, name: &str) -> Result<()> {
        if self.dsl.get(name).is_some() {
            self.volumes.lock().unwrap().remove(name);
            self.dsl.destroy(name)?;
            self.spa.txg.mark_dirty();
        }
        self.spa.sync_now()
    }

    /// Applies the records after BEGIN to `hidden`, through END, on two threads: this one
    /// reads and verifies the records (`Input`, the decoder), a second one writes them into
    /// the volume, joined by a queue of at most `RECEIVE_QUEUE_BYTES_MAX` bytes of blocks.
    /// On a resumable receive, the applying thread notes after each write how far the
    /// records are applied. If the input fails, the verified records queued before the
    /// failure are written first; if a write fails, reading stops. Either error ends the
    /// receive.
    fn apply_records(
        &self,
        hidden: &Volume,
        begin: &StreamBegin,
        input: &mut Input<'_>,
        dec: &mut StreamDecoder,
    ) -> Result<(u64, u64)> {
        let queue = ApplyQueue::new();
        // The device busy from the first 32 MiB on, not the first fifth of `dirty_max`.
        let _eager = self.spa.txg.eager_syncs();
        std::thread::scope(|scope| {
            let applier = std::thread::Builder::new()
                .name("recv-apply".into())
                .spawn_scoped(scope, || {
                    let applied = apply_queued(&self.spa, hidden, begin, &queue);
                    if applied.is_err() {
                        queue.abandon();
                    }
                    applied
                })
                .map_err(|e| EngineError::io("receive: starting its applying thread", e))?;
            let read = read_records(input, dec, begin, &queue);
            queue.close();
            let applied = match applier.join() {
                Ok(applied) => applied,
                Err(panic) => std::panic::resume_unwind(panic),
            };
            match (read, applied) {
                (Ok(()), Ok(Some(counts))) => Ok(counts),
                // Unreachable: the reader queues END before it returns Ok, unless the applier
                // is gone (an error).
                (Ok(()), Ok(None)) => Err(input.stream_error(None)),
                (Ok(()), Err(e)) | (Err(e), Ok(_)) => Err(e),
                (Err(read), Err(apply)) => Err(EngineError::invalid(format!(
                    "{read}; writing the records received before it failed too: {apply}"
                ))),
            }
        })
    }

    /// A hidden writable clone `hidden` of `volume@snap`, for an incremental stream.
    fn hidden_clone(
        &self,
        volume: &str,
        snap: &str,
        snap_guid: Guid,
        hidden: &str,
    ) -> Result<Volume> {
        let src = self
            .dsl
            .get(volume)
            .ok_or_else(|| EngineError::NotFound(format!("{}/{volume}", self.spa.name)))?;
        let s = {
            // By guid, as the plan found it: a rename since (the stream's base is checked
            // before the hook that takes exports down runs) keeps it.
            let l = src.lineage.lock().unwrap();
            l.snapshots()
                .iter()
                .find(|s| s.guid == snap_guid)
                .ok_or_else(|| {
                    EngineError::NotFound(format!(
                        "{}/{volume}@{snap} (the stream's base): destroyed since it was checked",
                        self.spa.name
                    ))
                })?
                .clone()
        };
        let mut p = src.props.lock().unwrap().clone();
        p.volsize_bytes = s.volsize_bytes;
        p.readonly = false;
        // Never the target's: its end takes only the data (and would count them twice in
        // the pool's user-property budget meanwhile).
        p.clear_user();
        // Nor the target's reservation: it would be counted twice while the stream arrives.
        p.refreservation_bytes = 0;
        // Nothing of a receive is logged: it is durable at its END, by the sync.
        p.sync = SyncMode::Disabled;
        let data = Object::new(
            BlockTree::new(s.levels.max(1), s.root),
            s.volsize_bytes,
            s.referenced_bytes,
        );
        data.compressed_bytes
            .store(s.compressed_bytes, Ordering::Relaxed);
        let mut lineage = Lineage::new(crate::spa::random_guid(), self.spa.txg.open_txg(), now_s());
        lineage.origin = Some(OriginMeta {
            volume: src.id,
            snapshot_guid: s.guid,
            txg: s.txg,
        });
        lineage.prev_snap_txg = s.txg;
        let vol = self.insert_hidden(hidden, p, data, lineage)?;
        self.dsl.link_origins();
        Ok(vol)
    }

    /// A hidden new volume `hidden` for a full stream, and the target volume `volume` it will
    /// become (not registered: the sync that ends the receive does that).
    fn hidden_new(
        &self,
        volume: &str,
        hidden: &str,
        begin: &StreamBegin,
    ) -> Result<(Volume, NewTarget)> {
        let target = self.new_target(volume, begin)?;
        let mut hp = target.0.props.lock().unwrap().clone();
        hp.sync = SyncMode::Disabled;
        let lineage = Lineage::new(crate::spa::random_guid(), self.spa.txg.open_txg(), now_s());
        let vol = self.insert_hidden(hidden, hp, empty_object(begin), lineage)?;
        Ok((vol, target))
    }

    /// Hidden dataset `hidden`, new and empty, for a full stream that replaces existing
    /// volume `volume` ([`Plan::replaces`], whose id is `id`): the volume's properties but
    /// the stream's size, and a lineage without snapshots or origin, as the volume's (the
    /// swap frees the whole of the volume's tree and gives it this one).
    fn hidden_replacing(
        &self,
        volume: &str,
        id: VolumeId,
        hidden: &str,
        begin: &StreamBegin,
    ) -> Result<Volume> {
        let full = format!("{}/{volume}", self.spa.name);
        let target = self
            .dsl
            .get(volume)
            .filter(|ds| ds.id == id)
            .ok_or_else(|| EngineError::NotFound(format!("{full} (destroyed since checked)")))?;
        let mut p = target.props.lock().unwrap().clone();
        // Checked by the plan; the swap checks the volume's again.
        debug_assert_eq!(p.volblocksize_bytes, begin.volblocksize_bytes);
        VolumeProps::check_new_volsize(begin.volsize_bytes)?;
        p.volsize_bytes = begin.volsize_bytes;
        p.readonly = false;
        // As for an incremental's hidden clone: not the target's user properties nor its
        // reservation, no log.
        p.clear_user();
        p.refreservation_bytes = 0;
        p.sync = SyncMode::Disabled;
        let lineage = Lineage::new(crate::spa::random_guid(), self.spa.txg.open_txg(), now_s());
        self.insert_hidden(hidden, p, empty_object(begin), lineage)
    }

    /// The new volume `volume` a full stream makes (not registered: the sync that ends the
    /// receive does that, taking the hidden dataset's data).
    fn new_target(&self, volume: &str, begin: &StreamBegin) -> Result<NewTarget> {
        let mut p = VolumeProps::new(begin.volsize_bytes);
        p.set_initial("volblocksize", &begin.volblocksize_bytes.to_string())?;
        VolumeProps::check_new_volsize(begin.volsize_bytes)?;
        p.validate()?;
        let id = VolumeId(self.dsl.next_id());
        let zil = Arc::new(Zil::new(self.spa.guid, id, 1, Vec::new()));
        let target = Arc::new(Dataset::volume(
            id,
            &self.spa.name,
            volume,
            p,
            empty_object(begin),
            zil.clone(),
            Lineage::new(crate::spa::random_guid(), self.spa.txg.open_txg(), now_s()),
        ));
        Ok((target, zil))
    }

    /// Registers hidden dataset `name` and its volume.
    fn insert_hidden(
        &self,
        name: &str,
        p: VolumeProps,
        data: Object,
        lineage: Lineage,
    ) -> Result<Volume> {
        p.validate()?;
        let mut volumes = self.volumes.lock().unwrap();
        let id = VolumeId(self.dsl.next_id());
        let zil = Arc::new(Zil::new(self.spa.guid, id, 1, Vec::new()));
        let ds = Arc::new(Dataset::volume(
            id,
            &self.spa.name,
            name,
            p,
            data,
            zil.clone(),
            lineage,
        ));
        self.dsl.insert(ds.clone())?;
        let vol = Arc::new(VolumeInner::new(ds, zil));
        volumes.insert(name.to_string(), vol.clone());
        drop(volumes);
        self.spa.txg.mark_dirty();
        Ok(Volume {
            pool: self.spa.clone(),
            dsl: self.dsl.clone(),
            vol,
        })
    }
}

/// An empty volume object of the size and block size BEGIN gives.
fn empty_object(begin: &StreamBegin) -> Object {
    let nblocks = begin.volsize_bytes / u64::from(begin.volblocksize_bytes);
    Object::new(
        BlockTree::new(levels_for(nblocks), BlockPtr::HOLE),
        begin.volsize_bytes,
        0,
    )
}

/// The saved state of a resumable receive of the stream `begin` opens, before any record.
fn resume_meta(begin: &StreamBegin, snapshot: &str) -> ReceiveResumeMeta {
    ReceiveResumeMeta {
        toguid: begin.toguid,
        fromguid: begin.fromguid,
        snapshot: snapshot.to_string(),
        creation_time_ns: begin.creation_time_ns,
        volsize_bytes: begin.volsize_bytes,
        volblocksize_bytes: begin.volblocksize_bytes,
        features: begin.features.0,
        offset_bytes: 0,
    }
}

/// Whether the resuming stream `begin` continues the receive saved as `saved` exactly.
fn check_resume(full: &str, saved: &ReceiveResumeMeta, begin: &StreamBegin) -> Result<()> {
    let same_stream = saved.toguid == begin.toguid
        && saved.fromguid == begin.fromguid
        && saved.volsize_bytes == begin.volsize_bytes
        && saved.volblocksize_bytes == begin.volblocksize_bytes
        && saved.features | StreamFeatures::RESUMING.0 == begin.features.0;
    if !same_stream {
        return Err(EngineError::invalid(format!(
            "cannot resume receive: the stream continues snapshot guid {:016x}, but {full}'s \
             partial receive is of guid {:016x} (a token for another receive)",
            begin.toguid.0, saved.toguid.0
        )));
    }
    if saved.offset_bytes != begin.resume_offset_bytes {
        return Err(EngineError::invalid(format!(
            "cannot resume receive: the stream starts at byte {}, but {full}'s partial receive \
             stopped at byte {} (a stale token: get the current one with oxpool get \
             receive_resume_token {full})",
            begin.resume_offset_bytes, saved.offset_bytes
        )));
    }
    Ok(())
}

/// The reading side of [`Pool::apply_records`]: records from `input`, verified, queued for
/// the applying thread (contiguous blocks gathered into runs of up to `WRITE_RUN_BYTES_MAX`).
/// Ok once END is queued, or as soon as the applying thread is gone (its error ends the
/// receive); an input or stream error after queueing every verified block before it.
fn read_records(
    input: &mut Input<'_>,
    dec: &mut StreamDecoder,
    begin: &StreamBegin,
    queue: &ApplyQueue,
) -> Result<()> {
    let bs = u64::from(begin.volblocksize_bytes);
    // A run's vector is allocated once at its full size, not grown block by block.
    let run_blocks_max = (WRITE_RUN_BYTES_MAX / bs).max(1) as usize;
    let mut run: Vec<StoredBlock> = Vec::with_capacity(run_blocks_max);
    let mut run_at = 0u64;
    let mut run_bytes = 0usize;
    let flush = |run: &mut Vec<StoredBlock>, at: u64, bytes: &mut usize| -> bool {
        if run.is_empty() {
            return true;
        }
        let blocks = std::mem::replace(run, Vec::with_capacity(run_blocks_max));
        queue.push(Applied::Blocks(at, blocks), std::mem::take(bytes))
    };
    // Bounded by the stream: each round consumes a record; END ends it.
    loop {
        let record = match input.next(dec) {
            Ok(record) => record,
            Err(e) => {
                flush(&mut run, run_at, &mut run_bytes);
                return Err(e);
            }
        };
        let item = match record {
            Record::Begin(_) => unreachable!("the decoder refuses a second BEGIN"),
            Record::Data {
                offset_bytes,
                block,
            } => {
                let run_end = run_at + run.len() as u64 * bs;
                if !run.is_empty()
                    && (run_end != offset_bytes
                        || (run.len() as u64 + 1) * bs > WRITE_RUN_BYTES_MAX)
                    && !flush(&mut run, run_at, &mut run_bytes)
                {
                    return Ok(());
                }
                if run.is_empty() {
                    run_at = offset_bytes;
                }
                run_bytes += block.buf.len();
                run.push(block);
                continue;
            }
            Record::Free {
                offset_bytes,
                length_bytes,
            } => Applied::Free {
                offset_bytes,
                length_bytes,
            },
            Record::SetSize(size) => Applied::SetSize(size),
            Record::End => Applied::End,
        };
        let end = matches!(item, Applied::End);
        if !flush(&mut run, run_at, &mut run_bytes) || !queue.push(item, 0) || end {
            return Ok(());
        }
    }
}

/// The applying side of [`Pool::apply_records`]: writes what the reading thread queued into
/// `hidden`, in order, noting the progress of a resumable receive after each write returned.
/// The counts of DATA and FREE records applied once END is; None if the queue closed before
/// END (the reading side failed; everything it queued was written).
fn apply_queued(
    spa: &Spa,
    hidden: &Volume,
    begin: &StreamBegin,
    queue: &ApplyQueue,
) -> Result<Option<(u64, u64)>> {
    let bs = u64::from(begin.volblocksize_bytes);
    let (mut data_records, mut free_records) = (0, 0);
    let note = |end_bytes: u64| {
        let mut l = hidden.vol.ds.lineage.lock().unwrap();
        if let Some(r) = &mut l.receive_resume {
            // After the write returned: it went into this txg or an earlier one.
            r.note(spa.txg.open_txg(), end_bytes);
        }
    };
    let block_bytes = (bs as usize).next_multiple_of(SECTOR_BYTES as usize);
    // Bounded by what the reading thread queues; END ends it.
    loop {
        // Buffers ready for the reading thread, while the pool has none to give back yet (the
        // first txgs of the receive): their page faults here, not on the reading thread,
        // which bounds the receive (in steady state the pool holds more than this already).
        IoBuf::prefill_pool(block_bytes, PREFILL_BYTES);
        let Some(item) = queue.pop() else { break };
        match item {
            Applied::Blocks(at, blocks) => {
                let count = blocks.len() as u64;
                oxpool_io::rt::block_on(hidden.write_stored(at, blocks))?;
                data_records += count;
                note(at + count * bs);
            }
            Applied::Free {
                offset_bytes,
                length_bytes,
            } => {
                free_records += 1;
                oxpool_io::rt::block_on(hidden.trim(offset_bytes, length_bytes, false))?;
                note(offset_bytes + length_bytes);
            }
            Applied::SetSize(size) => {
                let _one = hidden.vol.resizing.lock().unwrap();
                oxpool_io::rt::block_on(hidden.resize(size))?;
            }
            Applied::End => {
                if hidden.size_bytes() != begin.volsize_bytes {
                    return Err(EngineError::invalid(format!(
                        "cannot receive: the stream's volume is {} bytes but its records \
                         leave {}",
                        begin.volsize_bytes,
                        hidden.size_bytes()
                    )));
                }
                return Ok(Some((data_records, free_records)));
            }
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records without blocks count against the queue's bound: a stream of FREE records fills
    /// the queue to its bound and no further (counted as 0 bytes, they never waited).
    #[test]
    fn records_without_blocks_fill_the_queue_to_its_bound() {
        let q = ApplyQueue::new();
        let free = || Applied::Free {
            offset_bytes: 0,
            length_bytes: 4096,
        };
        let fit = RECEIVE_QUEUE_BYTES_MAX / QUEUED_ITEM_BYTES;
        // Bounded: as many as fit, each returning at once (no applying thread takes any).
        for _ in 0..fit {
            assert!(q.push(free(), 0));
        }
        let st = q.state.lock().unwrap();
        assert_eq!(st.items.len(), fit);
        assert_eq!(st.bytes, fit * QUEUED_ITEM_BYTES);
        // The next one would wait for the applying thread.
        assert!(st.bytes + QUEUED_ITEM_BYTES > RECEIVE_QUEUE_BYTES_MAX);
    }

    /// A run counts the vector it was gathered in, not only its blocks' bytes.
    #[test]
    fn a_run_counts_its_vector() {
        let q = ApplyQueue::new();
        assert!(q.push(Applied::Blocks(0, Vec::with_capacity(2048)), 0));
        let st = q.state.lock().unwrap();
        assert!(st.bytes >= 2048 * std::mem::size_of::<StoredBlock>());
    }
}
