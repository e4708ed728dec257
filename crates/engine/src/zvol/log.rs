//! The volume's side of its intent log (as ZFS's `zvol_log_write` and `zvol_get_data`): a
//! commit builds the pending records into log blocks, copying small writes' data into them
//! and writing large blocks in place (adopted by the txg sync), issues the blocks, and waits
//! until the records it needs are durable; group commit lets concurrent commits share blocks
//! and flushes. The log's structures, block format and replay are `zil/`.

use crate::vdev::queue::IoClass;
use crate::zil::*;
use crate::zvol::Volume;
use crate::{EngineError, Result};
use oxpool_format::{
    LogBlockHeader, LogBlockWriter, LogRecord, Txg, LOG_RECORD_DATA_BYTES_MAX,
    LOG_RECORD_HEADER_BYTES,
};
use oxpool_io::{DurableWriteMode, IoBuf};
use std::future::poll_fn;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Poll, Waker};
use std::time::{Duration, Instant};

impl Volume {
    /// Test hook: after `ok_count` more log-block allocations of this volume, every one fails
    /// as if the pool were full (`None`: never). A real full pool cannot be arranged to fail
    /// exactly in the middle of a build; this fails the same code path.
    #[doc(hidden)]
    pub fn set_log_alloc_fault(&self, ok_count: Option<u64>) {
        self.vol.zil.state.lock().unwrap().alloc_ok_left = ok_count;
    }

    /// Makes every change of this volume logged up to itx `target` durable.
    pub(crate) async fn zil_commit(&self, target: u64) -> Result<()> {
        let inner = &self.pool;
        let zil = &self.vol.zil;
        // An exported (or suspended) pool writes no log block.
        inner.txg.check_writable()?;
        inner.log_counters.commits.fetch_add(1, Ordering::Relaxed);
        let target_txg = inner.txg.state.lock().unwrap().open;
        {
            let mut s = zil.state.lock().unwrap();
            s.committers += 1;
            s.last_commit = Some(Instant::now());
            s.last_commit_alone = s.committers == 1;
            s.early_since_commit = 0;
        }
        struct Leave<'a>(&'a Zil);
        impl Drop for Leave<'_> {
            fn drop(&mut self) {
                let mut s = self.0.state.lock().unwrap();
                s.committers -= 1;
                // From its end too: a slow device's commit may take longer than the window.
                s.last_commit = Some(Instant::now());
            }
        }
        let _leave = Leave(zil);
        if let Err(e) = self.zil_anchor().await {
            return self.zil_anchor_failed(e, target_txg).await;
        }
        let serial = !inner.state.lock().unwrap().props.log_group_commit;
        if serial {
            return self.zil_commit_serial(target, target_txg).await;
        }
        // Bounded: each round builds, issues, or waits for an event that advances the log.
        loop {
            enum Next {
                Anchor,
                Done,
                Build,
                IssueAt(Instant),
                FallBack,
                FlushEarly(Vec<EarlyBlock>),
            }
            let next = poll_fn(|cx| {
                let mut s = zil.state.lock().unwrap();
                if inner.txg.synced() >= target_txg {
                    return Poll::Ready(Next::Done);
                }
                // A broken log may have lost records: only the txg vouches for them.
                if s.needs_txg(target) {
                    return Poll::Ready(Next::FallBack);
                }
                if s.durable_itx > target {
                    return Poll::Ready(Next::Done);
                }
                // The chain restarted since this commit anchored: anchor again first.
                if (s.next_addr.is_none() && s.open.is_none() && s.chain.is_empty())
                    || inner.txg.synced() < s.anchor_txg
                {
                    return Poll::Ready(Next::Anchor);
                }
                let ours_pending = s.pending.front().is_some_and(|i| i.seq <= target);
                if !s.building && ours_pending {
                    s.building = true;
                    return Poll::Ready(Next::Build);
                }
                // Records waiting in the open block (ours, or that ours may be behind): issue
                // it at its deadline, or decide now if it has none.
                if !s.building {
                    if let Some(o) = &s.open {
                        match o.deadline {
                            Some(d) => return Poll::Ready(Next::IssueAt(d)),
                            None => {
                                s.building = true;
                                return Poll::Ready(Next::Build);
                            }
                        }
                    }
                }
                // Blocks written early (ours may be among them): flush them, unless another
                // committer is; one still being written wakes us when it is.
                if !s.flushing {
                    let early = s.unflushed_blocks();
                    if !early.is_empty() {
                        s.flushing = true;
                        return Poll::Ready(Next::FlushEarly(early));
                    }
                }
                register(&mut s.waiters, cx.waker());
                Poll::Pending
            })
            .await;
            match next {
                Next::Anchor => {
                    if let Err(e) = self.zil_anchor().await {
                        return self.zil_anchor_failed(e, target_txg).await;
                    }
                }
                Next::Done => return Ok(()),
                Next::FallBack => return self.zil_wait_txg(target_txg).await,
                Next::Build => {
                    let (closed, r) = self.zil_build().await;
                    let waiters = {
                        let mut s = zil.state.lock().unwrap();
                        s.building = false;
                        std::mem::take(&mut s.waiters)
                    };
                    waiters.into_iter().for_each(Waker::wake);
                    // Written after the build is given up, so the next committer builds and
                    // issues its own block while these are in flight.
                    self.zil_issue_all(closed).await;
                    if let Err(e) = r {
                        tracing::warn!(
                            volume = self.vol.ds.full_name(),
                            "log commit failed, waiting for the txg: {e}"
                        );
                        zil.state.lock().unwrap().broken = true;
                    }
                }
                Next::FlushEarly(early) => self.zil_flush_early(early).await,
                Next::IssueAt(deadline) => {
                    let now = Instant::now();
                    if deadline > now {
                        oxpool_io::rt::sleep(deadline - now).await;
                    }
                    // Whoever gets here first after the deadline issues the block.
                    let block = {
                        let mut s = zil.state.lock().unwrap();
                        let due = s
                            .open
                            .as_ref()
                            .is_some_and(|o| o.deadline.is_some_and(|d| d <= Instant::now()));
                        if due && !s.building {
                            take_open(&mut s)
                        } else {
                            None
                        }
                    };
                    if let Some(b) = block {
                        self.zil_issue(b).await;
                    }
                }
            }
        }
    }

    /// A commit that the log cannot answer waits for the sync of `txg`, the open txg when it
    /// began. Its records may all belong to an older txg (synced meanwhile), leaving `txg`
    /// empty: it is marked dirty so that it syncs anyway instead of waiting for the timeout.
    pub(crate) async fn zil_wait_txg(&self, txg: Txg) -> Result<()> {
        {
            let mut t = self.pool.txg.state.lock().unwrap();
            if t.open == txg {
                t.open_dirty = true;
            }
        }
        self.pool.txg.wait_synced(txg, true).await
    }

    /// A commit whose chain could not be anchored: with no room for a log block, it waits for
    /// the sync of `txg` instead, as a commit whose log block cannot be allocated does (and
    /// OpenZFS's zil_commit falls back to txg_wait_synced): a flush must not fail for want of
    /// log space while the txg can carry its writes (found by `throttle.rs` on a nearly full
    /// pool under load). Other errors are the commit's.
    async fn zil_anchor_failed(&self, e: EngineError, txg: Txg) -> Result<()> {
        if !matches!(e, EngineError::NoSpace { .. }) {
            return Err(e);
        }
        tracing::debug!(
            volume = self.vol.ds.full_name(),
            "no room for a log block, waiting for the txg"
        );
        self.zil_wait_txg(txg).await
    }

    /// A chain with no place yet gets one, persisted by a txg sync before any block of it is
    /// written (as OpenZFS's zil_create); every committer waits for that sync.
    pub(crate) async fn zil_anchor(&self) -> Result<()> {
        let inner = &self.pool;
        let zil = &self.vol.zil;
        let anchor = {
            let mut s = zil.state.lock().unwrap();
            if s.next_addr.is_none() && s.open.is_none() && s.chain.is_empty() {
                let no_space = || EngineError::NoSpace {
                    pool: inner.name.clone(),
                    detail: String::new(),
                };
                let size = s.predict_block_bytes();
                let addr = s.alloc_block(inner, size).ok_or_else(no_space)?;
                s.next_addr = Some((addr, s.first_seq));
                // A txg whose sync has not begun: its metadata will name this place.
                s.anchor_txg = inner.txg.mark_dirty_open();
            }
            s.anchor_txg
        };
        if inner.txg.synced() < anchor {
            inner.txg.wait_synced(anchor, true).await?;
        }
        Ok(())
    }

    /// `logcommit=serial`: with the volume's serial lock held by the caller (see
    /// [`Volume::serial_guard`]), writes the records up to `target` in blocks of their own.
    pub(crate) async fn zil_commit_serial(&self, target: u64, target_txg: Txg) -> Result<()> {
        let zil = &self.vol.zil;
        let inner = &self.pool;
        let done = |s: &ZilState| s.durable_itx > target || inner.txg.synced() >= target_txg;
        let (is_done, broken) = {
            let s = zil.state.lock().unwrap();
            (done(&s), s.needs_txg(target))
        };
        if is_done {
            return Ok(());
        }
        if broken {
            return self.zil_wait_txg(target_txg).await;
        }
        zil.state.lock().unwrap().building = true;
        let (closed, r) = self.zil_build_upto(Some(target)).await;
        zil.state.lock().unwrap().building = false;
        self.zil_issue_all(closed).await;
        if let Err(e) = r {
            zil.state.lock().unwrap().broken = true;
            tracing::warn!(
                volume = self.vol.ds.full_name(),
                "log commit failed, waiting for the txg: {e}"
            );
        }
        let is_done = done(&zil.state.lock().unwrap());
        if is_done {
            Ok(())
        } else {
            self.zil_wait_txg(target_txg).await
        }
    }

    /// With `logcommit=serial`, a guard that lets one sync operation (a write and its commit, or
    /// a flush) run at a time on this volume; None otherwise.
    pub(crate) async fn serial_guard(&self) -> Option<SerialGuard<'_>> {
        if self.pool.state.lock().unwrap().props.log_group_commit {
            return None;
        }
        let zil = &self.vol.zil;
        poll_fn(|cx| {
            let mut s = zil.state.lock().unwrap();
            if !s.serial_busy {
                s.serial_busy = true;
                return Poll::Ready(());
            }
            register(&mut s.waiters, cx.waker());
            Poll::Pending
        })
        .await;
        Some(SerialGuard(zil))
    }

    /// Moves pending itxs into blocks; returns the blocks to write now, in chain order: the full
    /// ones, and the last one when this committer is alone (others committing too give it a
    /// deadline instead). The caller writes them after it has given up the build, so that
    /// nothing a new committer needs is held across a device write; an error comes with the
    /// blocks closed before it, whose records are sound.
    pub(crate) async fn zil_build(&self) -> (Vec<OpenBlock>, Result<()>) {
        self.zil_build_upto(None).await
    }

    /// Writes closed blocks, in chain order, at most [`BUILD_CLOSED_BLOCKS_MAX`] at a time
    /// (several log blocks may be in flight; each counts as durable only with every block
    /// before it).
    pub(crate) async fn zil_issue_all(&self, closed: Vec<OpenBlock>) {
        let mut closed = closed.into_iter();
        // Bounded: every round writes at least one block.
        loop {
            let window: Vec<OpenBlock> = closed.by_ref().take(BUILD_CLOSED_BLOCKS_MAX).collect();
            match window.len() {
                0 => return,
                1 => self.zil_issue(window.into_iter().next().unwrap()).await,
                _ => {
                    let futs: Vec<_> = window.into_iter().map(|b| self.zil_issue(b)).collect();
                    oxpool_io::rt::join_all(futs).await;
                }
            }
        }
    }

    /// [`Volume::zil_build`]; with `upto`, takes only itxs up to that seq and closes the last
    /// block at once (serial commits).
    pub(crate) async fn zil_build_upto(&self, upto: Option<u64>) -> (Vec<OpenBlock>, Result<()>) {
        let mut closed = Vec::new();
        let r = self.zil_build_into(upto, &mut closed).await;
        (closed, r)
    }

    /// The body of [`Volume::zil_build_upto`]: closed blocks go to `closed`. A group build
    /// stops taking records once [`BUILD_CLOSED_BLOCKS_MAX`] blocks wait to be written (the
    /// rest stays pending for the next builder), so one build holds at most one round of
    /// records (256) beyond that, as the build did before blocks were written after it.
    pub(crate) async fn zil_build_into(
        &self,
        upto: Option<u64>,
        closed: &mut Vec<OpenBlock>,
    ) -> Result<()> {
        let zil = &self.vol.zil;
        let synced = self.pool.txg.synced();
        // Bounded by the pending itxs, which only grow by concurrent writers; each round takes
        // what is there now.
        for _round in 0..64 {
            // A serial commit must place every record up to its target (else it falls back to
            // a txg sync): only group builds stop early, the next builder takes the rest.
            if upto.is_none() && closed.len() >= BUILD_CLOSED_BLOCKS_MAX {
                break;
            }
            let batch: Vec<Itx> = {
                let mut s = zil.state.lock().unwrap();
                let eligible = match upto {
                    Some(t) => s.pending.iter().take_while(|i| i.seq <= t).count(),
                    None => s.pending.len(),
                };
                let n = eligible.min(256);
                let batch: Vec<Itx> = s.pending.drain(..n).collect();
                s.building_first = batch.first().map(|i| i.seq);
                batch
            };
            let (batch_first, batch_max_txg) = {
                let first = batch.first().map(|i| i.seq).unwrap_or(0);
                let max_txg = batch.iter().map(|i| i.txg).max().unwrap_or(Txg(0));
                (first, max_txg)
            };
            if batch.is_empty() {
                break;
            }
            let mut built = Vec::with_capacity(batch.len());
            let props = self.vol.ds.props.lock().unwrap().clone();
            // With a separate log device, logbias=latency copies everything into it (fast,
            // and the pool's devices see no extra random writes), as ZFS with a slog.
            let has_slog = self.pool.state.lock().unwrap().alloc.has_log_device();
            for itx in batch {
                if itx.txg <= synced {
                    built.push((itx.seq, None));
                    continue;
                }
                let rec = match itx.kind {
                    ItxKind::Write {
                        offset_bytes,
                        length_bytes,
                        data,
                    } => {
                        let data = match data {
                            Some(d) => d,
                            None => {
                                // The current content: anything newer that overlaps was
                                // appended after this itx and replays after it.
                                let mut buf = vec![0u8; length_bytes as usize];
                                if let Err(e) =
                                    self.read_uncounted(offset_bytes, &mut buf, None).await
                                {
                                    // The read may have waited (for a shrink that cut the
                                    // range off, say) until the record's txg synced: then it
                                    // is durable already, and what it wrote may be gone.
                                    if itx.txg <= self.pool.txg.synced() {
                                        built.push((itx.seq, None));
                                        continue;
                                    }
                                    zil.state.lock().unwrap().fail_batch(
                                        batch_first,
                                        batch_max_txg,
                                        &[],
                                    );
                                    return Err(e);
                                }
                                Arc::from(buf)
                            }
                        };
                        let indirect = props.logbias_throughput
                            || (length_bytes > props.log_copy_max_bytes && !has_slog);
                        if indirect {
                            match self
                                .write_in_place(itx.txg, offset_bytes, &data, &props)
                                .await
                            {
                                Ok(recs) => {
                                    built.extend(recs.into_iter().map(|r| (itx.seq, Some(r))));
                                    continue;
                                }
                                Err(e) => {
                                    zil.state.lock().unwrap().fail_batch(
                                        batch_first,
                                        batch_max_txg,
                                        &[],
                                    );
                                    return Err(e);
                                }
                            }
                        }
                        Built::Write {
                            txg: itx.txg,
                            offset_bytes,
                            data,
                        }
                    }
                    ItxKind::Free {
                        offset_bytes,
                        length_bytes,
                    } => Built::Free {
                        txg: itx.txg,
                        offset_bytes,
                        length_bytes,
                    },
                    ItxKind::Zero {
                        offset_bytes,
                        length_bytes,
                    } => Built::Zero {
                        txg: itx.txg,
                        offset_bytes,
                        length_bytes,
                    },
                };
                built.push((itx.seq, Some(rec)));
            }
            // Place the records; full blocks are collected and issued after the lock.
            let mut full = Vec::new();
            {
                let mut s = zil.state.lock().unwrap();
                for (seq, rec) in built {
                    // An itx of a synced txg is durable already: it is simply dropped.
                    let Some(rec) = rec else { continue };
                    if let Err(e) = self.place(&mut s, seq, &rec, &mut full) {
                        s.fail_batch(batch_first, batch_max_txg, &full);
                        return Err(e);
                    }
                }
                s.building_first = None;
                s.advance_durable();
            }
            closed.append(&mut full);
        }
        // The last block: now, or after a short window if others are committing too.
        let issue_now = {
            let mut s = zil.state.lock().unwrap();
            let concurrent = s.committers > 1 && upto.is_none();
            let window = Duration::from_nanos(s.latency_ewma_ns / 10)
                .clamp(OPEN_WINDOW_MIN, OPEN_WINDOW_MAX);
            match s.open.as_mut() {
                Some(o) if concurrent => {
                    o.deadline.get_or_insert(Instant::now() + window);
                    None
                }
                Some(_) => take_open(&mut s),
                None => None,
            }
        };
        closed.extend(issue_now);
        Ok(())
    }

    /// Writes the whole volume blocks of a sync write in place now (data written once: the
    /// txg sync adopts them) and returns its records: indirect ones for the whole blocks,
    /// copied ones for the partial head and tail.
    pub(crate) async fn write_in_place(
        &self,
        txg: Txg,
        offset_bytes: u64,
        data: &Arc<[u8]>,
        props: &crate::props::VolumeProps,
    ) -> Result<Vec<Built>> {
        let bs = props.volblocksize_bytes as u64;
        let end = offset_bytes + data.len() as u64;
        let first_b = offset_bytes.div_ceil(bs);
        let end_b = end / bs;
        let mut out = Vec::new();
        if first_b >= end_b {
            out.push(Built::Write {
                txg,
                offset_bytes,
                data: data.clone(),
            });
            return Ok(out);
        }
        let head = (first_b * bs - offset_bytes) as usize;
        if head > 0 {
            out.push(Built::Write {
                txg,
                offset_bytes,
                data: Arc::from(&data[..head]),
            });
        }
        // Before the writes: the flush that makes them durable counts only if no device left
        // service in between (`zil::service_stamp`).
        let service_stamp = service_stamp(&self.pool);
        // How each block is stored (compressed, as is, or a hole) is decided here, on the
        // committer's thread, with the volume's `compression` as it is now: the block is
        // written now, as the txg sync would have written it.
        let futs: Vec<_> = (first_b..end_b)
            .map(|b| {
                let at = (b * bs - offset_bytes) as usize;
                let content = &data[at..at + bs as usize];
                let stored = crate::zio::compress::store_as(props.compression, content);
                async move {
                    crate::zio::compress::COMPRESS_COUNTERS.note_written(content.len(), &stored);
                    let nb = crate::spa::block::NewBlock::data(props, txg);
                    let (block, nb) = match stored {
                        // All zeros with compression on: the sync makes it a hole, so the
                        // log records a zeroing (replayed as write-zeroes: a hole too).
                        crate::zio::compress::StoreAs::Hole => {
                            return Ok::<_, EngineError>(InPlace::Zeros(b));
                        }
                        crate::zio::compress::StoreAs::AsIs => {
                            (Arc::new(crate::spa::block::padded(content)), nb)
                        }
                        crate::zio::compress::StoreAs::Compressed(c) => {
                            let nb = nb.compressed(&c);
                            (Arc::new(c.buf), nb)
                        }
                    };
                    // Held from its allocation on, so every txg sync accounts for it (see
                    // `VolumeInner::inplace_held`).
                    let bp = crate::spa::block::alloc_new_block(
                        &self.pool,
                        &block,
                        nb,
                        Some(&self.vol.data().inplace_held),
                    )?;
                    // A sync write's blocks: the client waits for them.
                    if let Err(e) = crate::zio::write_block_shared(
                        &self.pool.zio,
                        IoClass::SyncWrite,
                        bp.dvas(),
                        &block,
                    )
                    .await
                    {
                        // No record points at it: freed by the sync of its txg, as a
                        // replaced block.
                        self.vol
                            .data()
                            .override_garbage
                            .lock()
                            .unwrap()
                            .push((txg, bp));
                        return Err(e);
                    }
                    self.pool
                        .log_counters
                        .indirect_bytes
                        .fetch_add(block.len() as u64, Ordering::Relaxed);
                    Ok(InPlace::Written(
                        b,
                        crate::zio::compress::InPlaceBlock::new(bp, content),
                    ))
                }
            })
            .collect();
        let mut written = Vec::new();
        let mut err = None;
        for r in oxpool_io::rt::join_all(futs).await {
            match r {
                Ok(x) => written.push(x),
                Err(e) => err = Some(e),
            }
        }
        {
            // Register every block written, even on error: the sync frees what it cannot use.
            let mut o = self.vol.data().overrides.lock().unwrap();
            for w in &written {
                let InPlace::Written(b, block) = w else {
                    continue;
                };
                if let Some(old) = o.insert((txg, *b), *block) {
                    // Freed by the sync of its own txg (so the space maps that sync writes
                    // hold it allocated), never by whichever sync happens to run next.
                    self.vol
                        .data()
                        .override_garbage
                        .lock()
                        .unwrap()
                        .push((txg, old.bp));
                }
            }
        }
        if let Some(e) = err {
            return Err(e);
        }
        // In block order (join_all keeps it), so replay applies them as the write did.
        for w in written {
            out.push(match w {
                InPlace::Written(b, block) => Built::Indirect {
                    txg,
                    offset_bytes: b * bs,
                    length_bytes: bs,
                    bp: block.bp,
                    service_stamp,
                },
                InPlace::Zeros(b) => Built::Zero {
                    txg,
                    offset_bytes: b * bs,
                    length_bytes: bs,
                },
            });
        }
        let tail_at = (end_b * bs - offset_bytes) as usize;
        if tail_at < data.len() {
            out.push(Built::Write {
                txg,
                offset_bytes: end_b * bs,
                data: Arc::from(&data[tail_at..]),
            });
        }
        Ok(out)
    }

    /// Puts one record into the open block (opening blocks as needed; a write larger than a
    /// block's room is split into several records).
    pub(crate) fn place(
        &self,
        s: &mut ZilState,
        seq: u64,
        rec: &Built,
        full: &mut Vec<OpenBlock>,
    ) -> Result<()> {
        let mut done_bytes = 0usize;
        // Bounded: each round places a non-empty piece or closes a block.
        loop {
            if s.open.is_none() {
                s.open = Some(self.open_block(s)?);
            }
            let o = s.open.as_mut().unwrap();
            let room = o.writer.free_bytes();
            let fitted = match rec {
                Built::Write {
                    txg,
                    offset_bytes,
                    data,
                } => {
                    let left = data.len() - done_bytes;
                    let piece = left
                        .min(room.saturating_sub(LOG_RECORD_HEADER_BYTES + 8) / 8 * 8)
                        .min(LOG_RECORD_DATA_BYTES_MAX);
                    if piece == 0 && left > 0 {
                        false
                    } else {
                        let r = LogRecord::Write {
                            txg: *txg,
                            offset_bytes: offset_bytes + done_bytes as u64,
                            data: &data[done_bytes..done_bytes + piece],
                        };
                        let ok = o.writer.push(&mut o.buf, &r);
                        debug_assert!(ok);
                        done_bytes += piece;
                        o.max_txg = o.max_txg.max(*txg);
                        done_bytes == data.len()
                    }
                }
                other => {
                    let r = other.record();
                    let ok = o.writer.push(&mut o.buf, &r);
                    if ok {
                        o.max_txg = o.max_txg.max(r.txg());
                        if let Built::Indirect {
                            txg,
                            offset_bytes,
                            length_bytes,
                            bp,
                            service_stamp,
                        } = other
                        {
                            o.in_place.push(InPlaceRecord {
                                txg: *txg,
                                index: offset_bytes / length_bytes,
                                bp: *bp,
                                service_stamp: *service_stamp,
                            });
                        }
                    }
                    ok
                }
            };
            if fitted || done_bytes > 0 {
                o.itx_first = o.itx_first.min(seq);
                o.itx_last = o.itx_last.max(seq);
            }
            if fitted {
                return Ok(());
            }
            // Full: close it and go on in a new block.
            let o = s.open.take().unwrap();
            full.push(close(s, o));
        }
    }

    pub(crate) fn open_block(&self, s: &mut ZilState) -> Result<OpenBlock> {
        let no_space = || EngineError::NoSpace {
            pool: self.pool.name.clone(),
            detail: String::new(),
        };
        let size = s.predict_block_bytes();
        // Only an anchored place (named by a synced txg) may take a block: else the chain
        // restarted since this commit anchored (possible between a serial commit's checks and
        // its build), and a block there could be answered as durable yet never be found by
        // import. The build fails and its commits wait for the txg.
        let anchored = self.pool.txg.synced() >= s.anchor_txg;
        let Some((addr, seq)) = s.next_addr.filter(|_| anchored) else {
            return Err(EngineError::invalid(
                "the intent log restarted: no anchored place for a block",
            ));
        };
        let next = s.alloc_block(&self.pool, size).ok_or_else(no_space)?;
        s.next_addr = Some((next, seq + 1));
        Ok(OpenBlock {
            seq,
            addr,
            next,
            // The place's size, less the parity on a raidz vdev.
            buf: IoBuf::zeroed(crate::zil::log_block_capacity(&self.pool.zio, &addr)),
            writer: LogBlockWriter::with_capacity(crate::zil::log_block_capacity(
                &self.pool.zio,
                &addr,
            )),
            itx_first: u64::MAX,
            itx_last: 0,
            max_txg: Txg(0),
            deadline: None,
            in_place: Vec::new(),
        })
    }

    /// Writes the header of closed block `b` (its place in the chain and the next one's) and
    /// seals it; returns the bytes to write.
    pub(crate) fn finish_block(&self, b: &mut OpenBlock) -> usize {
        let zil = &self.vol.zil;
        let hdr = LogBlockHeader {
            pool_guid: zil.pool_guid,
            volume: zil.volume,
            seq: b.seq,
            next: b.next,
        };
        b.writer.finish(&hdr, &mut b.buf)
    }

    /// Blocks written in place whose flush does not count (a device left service meanwhile):
    /// their copies may be durable nowhere, so the txg sync must not adopt them but write
    /// their data again, from the txg's dirty blocks. Each goes to the garbage its txg's sync
    /// frees, unless a later write already replaced it there. (A sync of their txg that
    /// already adopted one keeps it: that sync's own flush then has the same gap.)
    fn drop_in_place_blocks(&self, blocks: &[InPlaceRecord]) {
        use std::collections::hash_map::Entry;
        let data = self.vol.data();
        let mut overrides = data.overrides.lock().unwrap();
        let mut garbage = data.override_garbage.lock().unwrap();
        // Bounded by the block's indirect records.
        for r in blocks {
            if let Entry::Occupied(o) = overrides.entry((r.txg, r.index)) {
                if o.get().bp == r.bp {
                    o.remove();
                    garbage.push((r.txg, r.bp));
                }
            }
        }
    }

    /// Writes a closed block and flushes its devices; then marks it done and advances the
    /// durable point through every consecutive done block.
    pub(crate) async fn zil_issue(&self, mut b: OpenBlock) {
        let zil = &self.vol.zil;
        let len = self.finish_block(&mut b);
        let start = Instant::now();
        // Blocks written early before this one are durable only with a flush after them:
        // this block's flush covers them (a durable write would not).
        let early: Vec<EarlyBlock> = {
            let mut s = zil.state.lock().unwrap();
            let mut e = s.unflushed_blocks();
            e.retain(|e| e.seq < b.seq);
            e
        };
        let mut also_flush = b.in_place_vdevs();
        add_vdevs_of(&early, &mut also_flush);
        // Blocks with records pointing at blocks written in place, or covering blocks written
        // early, are always written and flushed; only the others tell how fast each way is.
        let device = device_durable_mode(&self.pool, &b.addr);
        let measured = also_flush.is_empty() && device == DurableWriteMode::Measure;
        let way = if also_flush.is_empty() {
            zil.state.lock().unwrap().choose_durable_way(device, start)
        } else {
            DurableWay::WriteThenFlush
        };
        let data = IoBuf::from_slice(&b.buf[..len]);
        let r = write_durably(&self.pool, &b.addr, &also_flush, data, way)
            .await
            .and_then(|()| match b.in_place_stamp() {
                // Its indirect records' blocks: durable only if no device left service
                // between their writes and this flush.
                Some(stamp) => in_service_since(&self.pool, stamp).inspect_err(|_| {
                    self.drop_in_place_blocks(&b.in_place);
                }),
                None => Ok(()),
            });
        // The earlier blocks this flush covers count only if their devices stayed in service.
        let early_r = match &r {
            Ok(()) => early_blocks_in_service(&self.pool, &early),
            Err(_) => Ok(()),
        };
        let counters = &self.pool.log_counters;
        counters.blocks_written.fetch_add(1, Ordering::Relaxed);
        counters
            .bytes_written
            .fetch_add(len as u64, Ordering::Relaxed);
        let ns = start.elapsed().as_nanos() as u64;
        counters.write_ns_total.fetch_add(ns, Ordering::Relaxed);
        let waiters = {
            let mut s = zil.state.lock().unwrap();
            s.latency_ewma_ns = (s.latency_ewma_ns * 7 + ns) / 8;
            match r {
                Ok(()) => {
                    if measured {
                        s.note_durable(way, ns, Instant::now());
                    }
                    if let Some(c) = s.chain_block_mut(b.seq) {
                        c.done = true;
                    }
                    let seqs: Vec<u64> = early.iter().map(|e| e.seq).collect();
                    if let Err(e) = &early_r {
                        tracing::warn!(
                            volume = self.vol.ds.full_name(),
                            "log flush does not cover blocks written early, waiting for the txg: {e}"
                        );
                    }
                    s.flushed(&seqs, early_r.is_ok());
                }
                Err(e) => {
                    // Replay would stop at this block: nothing after it may count as durable.
                    // Its committers, and all later ones, wait for the txg sync instead.
                    tracing::warn!(
                        volume = self.vol.ds.full_name(),
                        "log block write failed: {e}"
                    );
                    if let Some(c) = s.chain_block_mut(b.seq) {
                        c.failed = true;
                    }
                    s.broken = true;
                }
            }
            std::mem::take(&mut s.waiters)
        };
        waiters.into_iter().for_each(Waker::wake);
    }
}
