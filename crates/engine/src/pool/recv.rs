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
use crate::dmu::object::Object;
use crate::dmu::tree::{levels_for, BlockTree};
use crate::dsl::dataset::Dataset;
use crate::dsl::recv::{ReceiveSwap, ReceiveTarget};
use crate::dsl::resume::ResumeProgress;
use crate::dsl::snapshot::{Lineage, SnapOp};
use crate::props::{SyncMode, VolumeProps};
use crate::spa::check_name;
use crate::zil::Zil;
use crate::zvol::VolumeInner;
use crate::{EngineError, Result, Volume};
use oxpool_format::stream::{
    ResumeToken, StreamBegin, StreamDecoder, StreamFeatures, StreamRecord,
};
use oxpool_format::{
    decompress_block, BlockPtr, Compression, OriginMeta, ReceiveResumeMeta, VolumeId,
};
use std::io::Read;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// How to receive.
#[derive(Clone, Debug, Default)]
pub struct ReceiveOptions {
    /// `-F`: for an incremental stream, destroy the target's snapshots after the base and
    /// discard the changes made since it (else either is refused).
    pub force: bool,
    /// `-s`: a stream that stops early keeps what it applied, to be resumed.
    pub resumable: bool,
}

/// One snapshot received.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Received {
    /// `pool/volume@snapshot` as received.
    pub snapshot: String,
    /// Its guid: the sender's.
    pub guid: u64,
    /// Whether the stream was incremental.
    pub incremental: bool,
    /// DATA records applied.
    pub data_records: u64,
    /// FREE records applied.
    pub free_records: u64,
}

/// A full receive's new volume, registered when the receive ends: its dataset and log.
type NewTarget = (Arc<Dataset>, Arc<Zil>);

/// Bytes read from the input at once.
const INPUT_CHUNK_BYTES: usize = 1 << 20;

/// Contiguous blocks gathered into one volume write.
const WRITE_RUN_BYTES_MAX: usize = 1 << 20;

/// A record the decoder handed out, owned (so the input can move on).
enum Record {
    Begin(StreamBegin),
    Data {
        offset_bytes: u64,
        compression: Compression,
        payload: Vec<u8>,
    },
    Free {
        offset_bytes: u64,
        length_bytes: u64,
    },
    SetSize(u64),
    End,
}

/// The input, cut into records of one stream after the other.
struct Input<'a> {
    input: &'a mut dyn Read,
    buf: Vec<u8>,
    pos: usize,
    len: usize,
    eof: bool,
}

impl Input<'_> {
    /// Whether the input is at its end (reading more if needed): no further stream.
    fn at_end(&mut self) -> Result<bool> {
        if self.pos < self.len {
            return Ok(false);
        }
        self.fill()?;
        Ok(self.pos == self.len)
    }

    fn fill(&mut self) -> Result<()> {
        if self.eof {
            return Ok(());
        }
        // Bounded: read returns data, 0 at the end, or an error; interrupted reads retry.
        loop {
            match self.input.read(&mut self.buf) {
                Ok(0) => {
                    self.eof = true;
                    self.pos = 0;
                    self.len = 0;
                    return Ok(());
                }
                Ok(n) => {
                    self.pos = 0;
                    self.len = n;
                    return Ok(());
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(EngineError::io("receive stream", e)),
            }
        }
    }

    /// The next record of the stream `dec` decodes.
    fn next(&mut self, dec: &mut StreamDecoder) -> Result<Record> {
        // Bounded by the input: each round consumes bytes or ends it.
        loop {
            if self.pos == self.len {
                self.fill()?;
                if self.pos == self.len {
                    return Err(stream_error(dec.finish().err()));
                }
            }
            let d = dec
                .decode(&self.buf[self.pos..self.len])
                .map_err(|e| stream_error(Some(e)))?;
            self.pos += d.consumed_bytes;
            let Some(r) = d.record else { continue };
            return Ok(match r {
                StreamRecord::Begin(b) => Record::Begin(b.clone()),
                StreamRecord::Data(d) => Record::Data {
                    offset_bytes: d.offset_bytes,
                    compression: d.compression,
                    payload: d.payload.to_vec(),
                },
                StreamRecord::Free {
                    offset_bytes,
                    length_bytes,
                } => Record::Free {
                    offset_bytes,
                    length_bytes,
                },
                StreamRecord::SetSize { volsize_bytes } => Record::SetSize(volsize_bytes),
                StreamRecord::End { .. } => Record::End,
            });
        }
    }
}

fn stream_error(e: Option<oxpool_format::stream::StreamError>) -> EngineError {
    match e {
        Some(e) => EngineError::invalid(format!("cannot receive: {e}")),
        None => EngineError::invalid("cannot receive: the stream ended early"),
    }
}

/// What a stream's BEGIN asks of the target, checked.
struct Plan {
    /// The snapshot name after `@`.
    snapshot: String,
    /// The base snapshot's txg-ordered index and the later snapshots `-F` destroys.
    base: Option<(String, Vec<String>)>,
}

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
        check_name("volume", volume)?;
        let mut input = Input {
            input,
            buf: vec![0; INPUT_CHUNK_BYTES],
            pos: 0,
            len: 0,
            eof: false,
        };
        let mut received = Vec::new();
        // Bounded by the input: each stream consumes at least its BEGIN.
        loop {
            if input.at_end()? {
                break;
            }
            received.push(self.receive_one(volume, &mut input, opts)?);
        }
        if received.is_empty() {
            return Err(EngineError::invalid(
                "cannot receive: no stream on the input",
            ));
        }
        Ok(received)
    }

    fn hidden_name(volume: &str) -> String {
        format!("{volume}%recv")
    }

    /// Checks BEGIN against the target.
    fn receive_plan(
        &self,
        volume: &str,
        begin: &StreamBegin,
        opts: &ReceiveOptions,
    ) -> Result<Plan> {
        let full = format!("{}/{volume}", self.spa.name);
        let snapshot = begin
            .name
            .rsplit_once('@')
            .map(|(_, s)| s.to_string())
            .unwrap_or_default();
        check_name("snapshot", &snapshot)?;
        let target = self.dsl.get(volume);
        let Some(fromguid) = begin.fromguid else {
            if target.is_some() {
                return Err(EngineError::Exists(format!(
                    "{full} (a full stream makes a new volume; destroy it first or receive \
                     into another name)"
                )));
            }
            return Ok(Plan {
                snapshot,
                base: None,
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
        let later: Vec<String> = l.snapshots()[i + 1..]
            .iter()
            .map(|s| s.name.clone())
            .collect();
        if !opts.force && !later.is_empty() {
            return Err(EngineError::Busy(format!(
                "cannot receive incremental stream: its base {full}@{} is not the latest \
                 snapshot (later: {}); use -F to destroy them",
                base.name,
                later.join(", ")
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
        let later_snaps = l.snapshots()[i + 1..].to_vec();
        // Not under the lineage's lock: the clones' lookup takes every dataset's.
        drop(l);
        for s in &later_snaps {
            if !s.holds.is_empty() {
                return Err(EngineError::Busy(format!(
                    "cannot receive: {full}@{} is held ({})",
                    s.name,
                    s.holds.iter().cloned().collect::<Vec<_>>().join(", ")
                )));
            }
            let clones = self.dsl.clone_names(s.guid);
            if !clones.is_empty() {
                return Err(EngineError::Busy(format!(
                    "cannot receive: {full}@{} is the origin of {}",
                    s.name,
                    clones.join(", ")
                )));
            }
        }
        Ok(Plan {
            snapshot,
            base: Some((base.name.clone(), later)),
        })
    }

    /// Receives one stream, from its BEGIN to its END.
    fn receive_one(
        &self,
        volume: &str,
        input: &mut Input<'_>,
        opts: &ReceiveOptions,
    ) -> Result<Received> {
        let mut dec = StreamDecoder::new();
        let Record::Begin(begin) = input.next(&mut dec)? else {
            unreachable!("the decoder hands out BEGIN first");
        };
        let full = format!("{}/{volume}", self.spa.name);
        let hidden_name = Self::hidden_name(volume);
        let saved = self.saved_receive(&hidden_name);
        let resuming = begin.features.contains(StreamFeatures::RESUMING);
        match (&saved, resuming) {
            (Some(saved), true) => check_resume(&full, saved, &begin)?,
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
        let plan = self.receive_plan(volume, &begin, opts)?;
        let (hidden, new_target) = if resuming {
            let hidden = self.hidden_volume(&hidden_name)?;
            let target = match &plan.base {
                Some(_) => None,
                None => Some(self.new_target(volume, &begin)?),
            };
            (hidden, target)
        } else {
            // A hidden dataset left by an interrupted receive (a crash) goes first.
            if self.dsl.get(&hidden_name).is_some() {
                self.destroy_hidden(&hidden_name)?;
            }
            let (hidden, new_target) = match &plan.base {
                Some((base, _)) => (self.hidden_clone(volume, base, &hidden_name)?, None),
                None => {
                    let (hidden, target) = self.hidden_new(volume, &hidden_name, &begin)?;
                    (hidden, Some(target))
                }
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
        let mut ops: Vec<(String, SnapOp)> = Vec::new();
        if let Some((_, later)) = &plan.base {
            // Applied before the swap in the same sync: the target's name sorts before the
            // hidden one's (a prefix of it), and a sync applies ops dataset by dataset in
            // name order.
            ops.extend(
                later
                    .iter()
                    .rev()
                    .map(|s| (volume.to_string(), SnapOp::Destroy { name: s.clone() })),
            );
        }
        let target = match &new_target {
            Some((ds, _)) => ReceiveTarget::New(ds.clone()),
            None => ReceiveTarget::Existing(volume.to_string()),
        };
        ops.push((
            hidden_name.clone(),
            SnapOp::Receive(ReceiveSwap {
                target,
                base_guid: begin.fromguid,
                snapshot: plan.snapshot.clone(),
                guid: begin.toguid,
                creation_s: begin.creation_time_ns / 1_000_000_000,
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
            return Err(EngineError::Busy(format!(
                "cannot receive: {full} changed while the stream was received; nothing was \
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
        Ok(Received {
            snapshot: format!("{full}@{}", plan.snapshot),
            guid: begin.toguid.0,
            incremental: begin.fromguid.is_some(),
            data_records,
            free_records,
        })
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
                ds.name.ends_with("%recv") && ds.lineage.lock().unwrap().receive_resume.is_none()
            })
            .map(|ds| ds.name.clone())
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

    /// Applies the records after BEGIN to `hidden`, through END. On a resumable receive,
    /// notes after each write how far the records are applied; if the input fails, the
    /// verified records gathered but not yet written are written first.
    fn apply_records(
        &self,
        hidden: &Volume,
        begin: &StreamBegin,
        input: &mut Input<'_>,
        dec: &mut StreamDecoder,
    ) -> Result<(u64, u64)> {
        let bs = begin.volblocksize_bytes as usize;
        let mut run: Vec<u8> = Vec::with_capacity(WRITE_RUN_BYTES_MAX);
        let mut run_at = 0u64;
        let mut block = vec![0u8; bs];
        let (mut data_records, mut free_records) = (0, 0);
        let note = |end_bytes: u64| {
            let mut l = hidden.vol.ds.lineage.lock().unwrap();
            if let Some(r) = &mut l.receive_resume {
                // After the write returned: it went into this txg or an earlier one.
                r.note(self.spa.txg.open_txg(), end_bytes);
            }
        };
        let flush_run = |run: &mut Vec<u8>, at: u64| -> Result<()> {
            if !run.is_empty() {
                oxpool_io::rt::block_on(hidden.write(at, run, false))?;
                note(at + run.len() as u64);
                run.clear();
            }
            Ok(())
        };
        // Bounded by the stream: each round consumes a record; END ends it.
        loop {
            let record = match input.next(dec) {
                Ok(r) => r,
                Err(e) => {
                    flush_run(&mut run, run_at)?;
                    return Err(e);
                }
            };
            match record {
                Record::Begin(_) => unreachable!("the decoder refuses a second BEGIN"),
                Record::Data {
                    offset_bytes,
                    compression,
                    payload,
                } => {
                    data_records += 1;
                    let logical: &[u8] = if compression == Compression::Off {
                        &payload
                    } else {
                        if let Err(e) = decompress_block(compression, &payload, &mut block) {
                            flush_run(&mut run, run_at)?;
                            return Err(EngineError::invalid(format!(
                                "cannot receive: the block at {offset_bytes} does not \
                                 decompress: {e}"
                            )));
                        }
                        &block
                    };
                    if run.len() + bs > WRITE_RUN_BYTES_MAX
                        || run_at + run.len() as u64 != offset_bytes
                    {
                        flush_run(&mut run, run_at)?;
                    }
                    if run.is_empty() {
                        run_at = offset_bytes;
                    }
                    run.extend_from_slice(logical);
                }
                Record::Free {
                    offset_bytes,
                    length_bytes,
                } => {
                    free_records += 1;
                    flush_run(&mut run, run_at)?;
                    oxpool_io::rt::block_on(hidden.trim(offset_bytes, length_bytes, false))?;
                    note(offset_bytes + length_bytes);
                }
                Record::SetSize(size) => {
                    let _one = hidden.vol.resizing.lock().unwrap();
                    oxpool_io::rt::block_on(hidden.resize(size))?;
                }
                Record::End => {
                    flush_run(&mut run, run_at)?;
                    if hidden.size_bytes() != begin.volsize_bytes {
                        return Err(EngineError::invalid(format!(
                            "cannot receive: the stream's volume is {} bytes but its records \
                             leave {}",
                            begin.volsize_bytes,
                            hidden.size_bytes()
                        )));
                    }
                    return Ok((data_records, free_records));
                }
            }
        }
    }

    /// A hidden writable clone `hidden` of `volume@snap`, for an incremental stream.
    fn hidden_clone(&self, volume: &str, snap: &str, hidden: &str) -> Result<Volume> {
        let src = self
            .dsl
            .get(volume)
            .ok_or_else(|| EngineError::NotFound(format!("{}/{volume}", self.spa.name)))?;
        let s = {
            let l = src.lineage.lock().unwrap();
            l.find(snap)
                .ok_or_else(|| EngineError::NotFound(format!("{}/{volume}@{snap}", self.spa.name)))?
                .1
                .clone()
        };
        let mut p = src.props.lock().unwrap().clone();
        p.volsize_bytes = s.volsize_bytes;
        p.readonly = false;
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

    /// The new volume `volume` a full stream makes (not registered: the sync that ends the
    /// receive does that, taking the hidden dataset's data).
    fn new_target(&self, volume: &str, begin: &StreamBegin) -> Result<NewTarget> {
        let mut p = VolumeProps::new(begin.volsize_bytes);
        p.set_initial("volblocksize", &begin.volblocksize_bytes.to_string())?;
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
