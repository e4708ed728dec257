//! The txg sync: the commit protocol of spa/mod.rs, and the thread that runs it.

use crate::spa::block::{META_COPIES, SYNC_WRITES_IN_FLIGHT_MAX};
use crate::spa::meta::write_pool_meta;
use crate::spa::{now_ns, Spa};
use crate::vdev::alloc::DEFER_TXGS;
use crate::vdev::label::write_uberblock;
use crate::vdev::queue::IoClass;
use crate::vdev::{Leaf, TopVdev};
use crate::zio::write_blocks_shared;
use crate::{EngineError, Result};
use oxpool_format::{
    checksum, encode_meta_block, BlockPtr, BlockType, Compression, DeferredFree, Dva, PoolMeta,
    SpaceMapMeta, Txg, Uberblock, VdevId, VolumeMeta, SECTOR_BYTES, SPACEMAP_CHUNK_PAYLOAD_BYTES,
};
use oxpool_io::rt::{block_on, join_all};
use oxpool_io::IoBuf;
use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

/// What the layer above contributes to the pool's metadata each txg.
pub(crate) struct UpperMeta {
    /// Every dataset's record.
    pub volumes: Vec<VolumeMeta>,
    /// Every dataset's lineage (snapshots, origin, deadlist).
    pub datasets: Vec<oxpool_format::DatasetMeta>,
    /// The queue of blocks still to free.
    pub freeing: Vec<oxpool_format::DeadBucketMeta>,
    /// The next dataset id.
    pub next_volume_id: u64,
}

/// What the txg sync asks of the layer above it (the datasets): the pool knows nothing of
/// datasets, and nothing below calls up; this is what is passed down for it to call.
pub(crate) trait SyncClient: Send + Sync {
    /// Writes the changes of txg `txg` into blocks (through `spa`); the places they free go
    /// to `freed`. Every block the txg was charged for (the write throttle's space charges)
    /// is placed before this returns: the sync then lets what follows borrow the slots that
    /// charge held back ([`Spa::charged_placed_txg`]).
    fn sync<'a>(
        &'a self,
        spa: &'a Spa,
        txg: Txg,
        freed: &'a mut Vec<Dva>,
    ) -> Pin<Box<dyn Future<Output = Result<()>> + 'a>>;
    /// Its part of txg `txg`'s pool metadata, once the space maps are placed; places it no
    /// longer needs (intent-log blocks) go to `freed`.
    fn meta(&self, txg: Txg, freed: &mut Vec<Dva>) -> UpperMeta;
    /// Txg `txg` of `spa` is durable; `cache_max_bytes` is what its caches of indirect
    /// blocks may keep in all.
    fn synced(&self, spa: &Spa, txg: Txg, cache_max_bytes: u64);
}

/// Writes txg `txg` out and commits it (see the module comment for the protocol).
pub(crate) async fn sync_txg(inner: &Spa, upper: &dyn SyncClient, txg: Txg) -> Result<()> {
    inner.zio.vdevs.note_sync_started(txg);
    let mut freed: Vec<Dva> = Vec::new();
    inner.log_alloc_bytes_since_sync.store(0, Ordering::Relaxed);
    // Frees old enough are allocatable again from this txg on.
    {
        let mut s = inner.state.lock().unwrap();
        let pin = s.scan_pin;
        let (ready, mut keep): (Vec<_>, Vec<_>) = std::mem::take(&mut s.deferred)
            .into_iter()
            .partition(|d| d.txg.0 + DEFER_TXGS < txg.0 && pin.is_none_or(|p| d.txg <= p));
        // Places a self-heal is rewriting stay deferred, alone (`HealGuard`). Taken under the
        // state lock, the only nesting of the two.
        let healing = inner.zio.healing.held();
        // Bounded by the frees of the txgs released.
        for d in ready {
            let mut held = Vec::new();
            for dva in d.dvas {
                if !healing.is_empty() && healing.contains(&dva) {
                    held.push(dva);
                } else {
                    s.alloc.free(&dva);
                }
            }
            if !held.is_empty() {
                keep.push(DeferredFree {
                    txg: d.txg,
                    dvas: held,
                });
            }
        }
        drop(healing);
        s.deferred = keep;
        // A log device leaving (`oxpool remove`) becomes a hole in the txg that finds nothing
        // left on it: tree, allocator and space-map chunks change together, so this txg's
        // metadata records all of it or, if it does not commit, none.
        if let Some(v) = s.hole_requested {
            if s.alloc.map(v).allocated_bytes() == 0 {
                s.hole_requested = None;
                s.alloc.make_hole(v);
                let chunks = std::mem::take(&mut s.chunk_ptrs[v.0 as usize]);
                freed.extend(chunks.iter().flat_map(|bp| bp.dvas().iter().copied()));
                s.holed = inner.zio.vdevs.make_hole(v);
            }
        }
    }
    // The layer above writes its changes of this txg into blocks.
    upper.sync(inner, txg, &mut freed).await?;
    // Every block this txg was charged for is placed: what follows may borrow what its
    // charge held back (`Spa::keep`). Cleared when the sync ends, however it ends.
    inner.charged_placed_txg.store(txg.0, Ordering::SeqCst);
    let _placed = PlacedGuard(inner);
    // The commands recorded since the last sync: uncharged, like the space maps and the
    // PoolMeta, so after the charged blocks are placed (it may borrow what their charge
    // held back) and before the space maps (it allocates).
    super::history::sync_history(inner, txg, &mut freed).await?;
    // Space maps: give every changed chunk a new place until no allocation changes a chunk
    // that has none yet (each round only allocates for chunks new to the set: bounded by the
    // number of chunks), then write them with their final bits.
    let mut pending: BTreeMap<(u32, u64), Vec<Dva>> = BTreeMap::new();
    {
        let mut s = inner.state.lock().unwrap();
        let nvdevs = s.alloc.maps().len();
        let chunk_total: usize = s.chunk_ptrs.iter().map(|c| c.len()).sum();
        let keep = inner.keep(&s.alloc, &s.alloc.space(), false);
        for _round in 0..=chunk_total + 1 {
            let mut added = false;
            for v in 0..nvdevs {
                let dirty = s.alloc.map_mut(VdevId(v as u32)).take_dirty_chunks();
                for c in dirty {
                    if let std::collections::btree_map::Entry::Vacant(e) =
                        pending.entry((v as u32, c))
                    {
                        let dvas = s
                            .alloc
                            .alloc_with(SECTOR_BYTES, META_COPIES, false, &keep)
                            .ok_or_else(|| EngineError::NoSpace {
                                pool: inner.name.clone(),
                                detail: String::new(),
                            })?;
                        e.insert(dvas);
                        added = true;
                    }
                }
            }
            if !added {
                break;
            }
        }
        debug_assert!(s.alloc.maps().iter().all(|m| m.dirty_chunk_count() == 0));
    }
    let mut chunk_writes = Vec::new();
    {
        let s = inner.state.lock().unwrap();
        for ((v, c), dvas) in &pending {
            let mut bits = vec![0u8; SPACEMAP_CHUNK_PAYLOAD_BYTES];
            s.alloc.map(VdevId(*v)).chunk_bits(*c, &mut bits);
            let block = IoBuf::from_slice(&encode_meta_block(BlockType::SpaceMap, &bits));
            let mut bp = BlockPtr {
                ndvas: dvas.len() as u8,
                lsize_bytes: block.len() as u32,
                psize_bytes: block.len() as u32,
                checksum_type: oxpool_format::ChecksumType::Xxh3_128,
                compression: Compression::Off,
                block_type: BlockType::SpaceMap,
                level: 0,
                birth: txg,
                fill: 0,
                checksum: checksum(oxpool_format::ChecksumType::Xxh3_128, &block),
                ..BlockPtr::HOLE
            };
            bp.dvas[..dvas.len()].copy_from_slice(dvas);
            let old = s.chunk_ptrs[*v as usize][*c as usize];
            chunk_writes.push((*v, *c, bp, Arc::new(block), old));
        }
    }
    for batch in chunk_writes.chunks(SYNC_WRITES_IN_FLIGHT_MAX) {
        let list: Vec<(&[Dva], &Arc<IoBuf>)> = batch
            .iter()
            .map(|(_, _, bp, block, _)| (bp.dvas(), block))
            .collect();
        for r in write_blocks_shared(&inner.zio, IoClass::AsyncWrite, &list).await {
            r?;
        }
    }
    // The layer above's part of the pool metadata, taken after the space maps were encoded
    // (so every log block allocated before then is either still held, and listed, or handed
    // back here to free).
    let datasets = upper.meta(txg, &mut freed);
    // Build the pool metadata.
    let meta_block = {
        let mut s = inner.state.lock().unwrap();
        for (v, c, bp, _, old) in &chunk_writes {
            s.chunk_ptrs[*v as usize][*c as usize] = *bp;
            freed.extend_from_slice(old.dvas());
        }
        freed.extend_from_slice(&s.meta_places);
        let mut deferred = s.deferred.clone();
        if !freed.is_empty() {
            deferred.push(DeferredFree {
                txg,
                dvas: freed.clone(),
            });
        }
        let meta = PoolMeta {
            name: inner.name.clone(),
            guid: inner.guid,
            txg,
            tree: inner.zio.vdevs.config(),
            props: {
                let mut props = s.props.to_pairs();
                props.extend(inner.zio.vdevs.state_records());
                if let Some(r) = &s.scan_record {
                    props.push((super::SCAN_RECORD_KEY.to_string(), r.clone()));
                }
                for (key, logs) in [
                    (super::LOG_DISCARDED_KEY, &s.discarded_logs),
                    (super::LOG_EMPTIED_KEY, &s.emptied_logs),
                ] {
                    let ids: Vec<String> = logs
                        .iter()
                        .filter(|v| inner.zio.vdevs.top(**v).is_some_and(|t| !t.is_hole()))
                        .map(|v| v.0.to_string())
                        .collect();
                    if !ids.is_empty() {
                        props.push((key.to_string(), ids.join(",")));
                    }
                }
                props
            },
            volumes: datasets.volumes,
            spacemaps: s
                .alloc
                .maps()
                .iter()
                .enumerate()
                .map(|(v, m)| SpaceMapMeta {
                    vdev: VdevId(v as u32),
                    allocated_bytes: m.allocated_bytes(),
                    chunks: s.chunk_ptrs[v].clone(),
                })
                .collect(),
            deferred_frees: deferred,
            next_volume_id: datasets.next_volume_id,
            datasets: datasets.datasets,
            freeing: datasets.freeing,
            history: inner.history.lock().unwrap().chunks().to_vec(),
        };
        meta.encode()
    };
    let (meta_ptr, meta_places) = write_pool_meta(inner, txg, &meta_block).await?;
    flush_all(inner).await?;
    let ub = Uberblock {
        txg,
        timestamp_ns: now_ns(),
        pool_guid: inner.guid,
        root: meta_ptr,
    };
    let mut written = 0;
    let mut last_err = None;
    // Not to a leaf out of service: it gets no I/O at all. Only the data vdevs' copies
    // count: a log device's flush is not required (`flush_all`), so its copy alone would not
    // make the txg durable.
    let leaves: Vec<_> = inner
        .zio
        .vdevs
        .tops()
        .flat_map(|t| t.leaves_in_service().map(move |l| (t.log, l)))
        .collect();
    let futs: Vec<_> = leaves
        .iter()
        .map(|(_, l)| {
            let ub = &ub;
            async move { write_uberblock(l.backend.as_ref(), ub).await }
        })
        .collect();
    for ((log, _), r) in leaves.iter().zip(join_all(futs).await) {
        match r {
            Ok(()) if !log => written += 1,
            Ok(()) => {}
            Err(e) => last_err = Some(e),
        }
    }
    if written == 0 {
        return Err(last_err.unwrap_or_else(|| EngineError::invalid("no device to commit to")));
    }
    flush_all(inner).await?;
    // Durable. Publish the new state.
    inner.zio.vdevs.note_synced(txg);
    let cache_max_bytes;
    {
        let mut s = inner.state.lock().unwrap();
        s.meta_ptr = meta_ptr;
        s.meta_places = meta_places;
        if !freed.is_empty() {
            s.deferred.push(DeferredFree { txg, dvas: freed });
        }
        cache_max_bytes = s.props.cache_max_bytes;
    }
    upper.synced(inner, txg, cache_max_bytes);
    Ok(())
}

/// Clears [`Spa::charged_placed_txg`] when the sync that set it ends.
struct PlacedGuard<'a>(&'a Spa);

impl Drop for PlacedGuard<'_> {
    fn drop(&mut self) {
        self.0.charged_placed_txg.store(0, Ordering::SeqCst);
    }
}

async fn flush_all(inner: &Spa) -> Result<()> {
    // One snapshot of the tree: a vdev added meanwhile is not in this txg's configuration.
    let tops: Vec<&TopVdev> = inner.zio.vdevs.tops().collect();
    let ios: Vec<(usize, Arc<Leaf>)> = tops
        .iter()
        .enumerate()
        .flat_map(|(i, t)| t.leaves_in_service().map(move |l| (i, l.clone())))
        .collect();
    let futs: Vec<_> = ios.iter().map(|(_, l)| l.flush()).collect();
    // A log vdev holds none of a txg's blocks (its space map lives on the data vdevs): only
    // the uberblock, which the other devices hold too. It may be missing (imported with
    // `-m`) or be a hole, and the pool commits without it. Its log blocks are flushed by
    // the intent log (zil::flush_log_vdevs).
    let mut flushed: Vec<bool> = tops.iter().map(|t| t.log || t.is_hole()).collect();
    let mut last_err = None;
    for ((top, l), r) in ios.iter().zip(join_all(futs).await) {
        inner
            .log_counters
            .device_flushes
            .fetch_add(1, Ordering::Relaxed);
        match r {
            Ok(()) => flushed[*top] = true,
            Err(e) => {
                inner
                    .zio
                    .vdevs
                    .note_error(l, crate::vdev::ErrorKind::Write, Some(&e));
                last_err = Some(EngineError::io(l.name(), e));
            }
        }
    }
    // Every top-level data vdev must have a child whose writes are now durable: a stripe whose
    // member did not flush cannot commit, since blocks of this txg may live only there. A
    // mirror child that failed is counted and the mirror goes on with the others.
    if flushed.iter().all(|&f| f) {
        Ok(())
    } else {
        Err(last_err.unwrap_or_else(|| EngineError::invalid("a top-level vdev has no device")))
    }
}

/// The sync thread of a pool: syncs each txg as the txg engine hands it over, asking `upper`
/// for its part, until the pool stops (or either is gone).
pub(crate) fn sync_thread(pool: Weak<Spa>, upper: Weak<dyn SyncClient>) {
    // Nobody waits on this thread's I/O completions within microseconds: sleep, don't spin.
    oxpool_io::rt::set_spin(false);
    loop {
        let Some(inner) = pool.upgrade() else { return };
        let Some(txg) = inner.txg.next_to_sync() else {
            return;
        };
        let Some(upper) = upper.upgrade() else { return };
        // A panic here (a bug) must not leave every sync waiter asleep forever: it fails the
        // txg like a write error, which suspends the pool with the reason and wakes them.
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _gate = inner.sync_gate.lock().unwrap_or_else(|p| p.into_inner());
            block_on(sync_txg(&inner, upper.as_ref(), txg))
        }))
        .unwrap_or_else(|panic| {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".into());
            Err(EngineError::invalid(format!(
                "the txg sync panicked: {what}"
            )))
        });
        inner.txg.finish_sync(txg, &r);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::props::PoolProps;
    use crate::spa::TopSpec;
    use oxpool_format::TopVdevKind;
    use oxpool_io::{Backend, MemoryBackend};
    use std::time::Duration;

    /// A sync client with no datasets (to create the pool with; the layer above is not
    /// imported here).
    struct Empty;

    impl SyncClient for Empty {
        fn sync<'a>(
            &'a self,
            _spa: &'a Spa,
            _txg: Txg,
            _freed: &'a mut Vec<Dva>,
        ) -> Pin<Box<dyn Future<Output = Result<()>> + 'a>> {
            Box::pin(async { Ok(()) })
        }
        fn meta(&self, _txg: Txg, _freed: &mut Vec<Dva>) -> UpperMeta {
            UpperMeta {
                volumes: Vec::new(),
                datasets: Vec::new(),
                freeing: Vec::new(),
                next_volume_id: 1,
            }
        }
        fn synced(&self, _spa: &Spa, _txg: Txg, _cache_max_bytes: u64) {}
    }

    /// A sync client whose sync panics, as a bug would.
    struct Panics;

    impl SyncClient for Panics {
        fn sync<'a>(
            &'a self,
            _spa: &'a Spa,
            _txg: Txg,
            _freed: &'a mut Vec<Dva>,
        ) -> Pin<Box<dyn Future<Output = Result<()>> + 'a>> {
            Box::pin(async { panic!("injected by the test") })
        }
        fn meta(&self, _txg: Txg, _freed: &mut Vec<Dva>) -> UpperMeta {
            unreachable!("the sync panicked before")
        }
        fn synced(&self, _spa: &Spa, _txg: Txg, _cache_max_bytes: u64) {}
    }

    #[test]
    fn a_panic_in_the_sync_suspends_the_pool_and_wakes_its_waiters() {
        let mem: Arc<dyn Backend> = Arc::new(MemoryBackend::new("m", 64 << 20));
        let tops = vec![TopSpec {
            kind: TopVdevKind::Single,
            devices: vec![mem],
            log: false,
        }];
        let spa = Spa::create("p", tops, PoolProps::default(), false, &Empty).unwrap();
        let client: Arc<dyn SyncClient> = Arc::new(Panics);
        let (weak, upper) = (Arc::downgrade(&spa), Arc::downgrade(&client));
        let thread = std::thread::spawn(move || sync_thread(weak, upper));
        spa.txg.mark_dirty();
        let (tx, rx) = std::sync::mpsc::channel();
        let waiter = spa.clone();
        std::thread::spawn(move || tx.send(waiter.sync_now()));
        // A hang guard, not a timing assertion: without the fix this waits forever.
        let r = rx
            .recv_timeout(Duration::from_secs(120))
            .expect("sync_now hung after the sync thread panicked");
        let err = r
            .expect_err("a sync that panicked reported success")
            .to_string();
        assert!(err.contains("panicked: injected by the test"), "{err}");
        assert!(spa.txg.check_writable().is_err(), "the pool takes changes");
        thread.join().expect("the sync thread ends on its own");
    }
}
