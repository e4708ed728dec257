//! What a txg sync does for one dataset: its objects (with the blocks they kill filed by
//! the birth-txg rule), the snapshot changes due, and its deadlists' new entries.

use crate::dmu::dirty::indirect_copies;
use crate::dmu::sync::{sync_object, Kills};
use crate::dsl::dataset::Dataset;
use crate::dsl::deadlist::Deadlist;
use crate::dsl::snapshot::{SnapOp, Snapshot};
use crate::dsl::Datasets;
use crate::spa::block::write_meta_chunk;
use crate::spa::Spa;
use crate::vdev::queue::IoClass;
use crate::zio::read_block;
use crate::{EngineError, Result};
use oxpool_format::{
    decode_deadlist_chunk, decode_indirect, encode_deadlist_chunk, BlockPtr, BlockType, Dva, Txg,
    DEADLIST_CHUNK_ENTRIES_MAX, INDIRECT_FANOUT,
};
use std::sync::atomic::Ordering;

/// Writes dataset `ds`'s objects for txg `txg` (with `destroy`, frees everything it has),
/// filing the blocks they kill: freed if born after the previous snapshot, else on the
/// head's deadlist.
pub(crate) async fn sync_dataset(
    spa: &Spa,
    ds: &Dataset,
    txg: Txg,
    destroy: bool,
    freed: &mut Vec<Dva>,
) -> Result<()> {
    let props = ds.props.lock().unwrap().clone();
    let prev_snap_txg = ds.lineage.lock().unwrap().prev_snap_txg;
    let mut kills = Kills::new(freed, prev_snap_txg);
    for (_, obj) in ds.objset.objects() {
        sync_object(spa, obj, &ds.full_name(), &props, txg, destroy, &mut kills).await?;
    }
    let Kills {
        dead,
        written_delta,
        ..
    } = kills;
    if destroy {
        // A destroyed head has no snapshots left (refused otherwise); what it killed that is
        // still shared belongs to its origin's snapshots. Its deadlist's own blocks go.
        // Its tables' blocks go too (bookmarks go with their dataset, as in ZFS).
        let (deadlist, tables) = {
            let mut l = ds.lineage.lock().unwrap();
            let tables = [
                std::mem::take(&mut l.snapshot_table),
                std::mem::take(&mut l.bookmark_table),
            ];
            (std::mem::take(&mut l.deadlist), tables)
        };
        for block in tables.iter().flat_map(|t| t.blocks()) {
            freed.extend_from_slice(block.dvas());
        }
        free_deadlist(spa, deadlist, false, freed).await?;
        return Ok(());
    }
    let mut l = ds.lineage.lock().unwrap();
    l.add_dead(dead);
    l.written_bytes = (l.written_bytes as i64 + written_delta).max(0) as u64;
    Ok(())
}

/// Applies one snapshot change to `ds` at the end of txg `txg` (its objects are synced).
/// The change was checked when it was asked; what the syncs before it changed is checked
/// again here, and a change no longer possible is skipped with a warning, never half done.
pub(crate) async fn apply(
    spa: &Spa,
    dsl: &Datasets,
    ds: &Dataset,
    op: &SnapOp,
    txg: Txg,
    freed: &mut Vec<Dva>,
) -> Result<()> {
    match op {
        SnapOp::Create {
            name,
            guid,
            creation_s,
        } => {
            let obj = ds.data();
            let (root, levels) = {
                let t = obj.tree.lock().unwrap();
                debug_assert!(!t.has_dirty(), "snapshot of a tree the sync left dirty");
                (t.root(), t.levels())
            };
            let mut l = ds.lineage.lock().unwrap();
            if l.find(name).is_some() {
                tracing::warn!(dataset = ds.full_name(), snapshot = name, "snapshot exists");
                return Ok(());
            }
            // One snapshot per txg (the table is in txg order, and import refuses it
            // otherwise): queue_ops and take_for_sync keep two apart; a receive's snapshot of
            // this volume in this txg would be the only way left, and is skipped, not written.
            if l.snapshots().last().is_some_and(|s| s.txg >= txg) {
                tracing::warn!(
                    dataset = ds.full_name(),
                    snapshot = name,
                    "a snapshot of this txg exists: not taken"
                );
                return Ok(());
            }
            let deadlist = std::mem::take(&mut l.deadlist);
            let written_bytes = l.written_bytes;
            l.push_snapshot(Snapshot {
                name: name.clone(),
                guid: *guid,
                txg,
                creation_s: *creation_s,
                root,
                levels,
                volsize_bytes: obj.tree_size_bytes.load(Ordering::Relaxed),
                referenced_bytes: obj.used_bytes.load(Ordering::Relaxed),
                written_bytes,
                compressed_bytes: obj.compressed_bytes.load(Ordering::Relaxed),
                deadlist,
                holds: Default::default(),
                defer_destroy: false,
            });
            l.prev_snap_txg = txg;
            l.written_bytes = 0;
            tracing::info!(
                snapshot = format!("{}@{name}", ds.full_name()),
                txg = txg.0,
                "snapshot"
            );
        }
        SnapOp::Destroy { name, guid } => {
            let guid = *guid;
            // Not under this dataset's lock: it looks at every dataset's.
            let cloned = dsl.clones_of(ds.id, guid) > 0;
            let to_free = {
                let mut l = ds.lineage.lock().unwrap();
                // By guid: a rename (which does not wait for this sync) may have given the
                // snapshot another name, or its name to another, since it was asked.
                let Some(i) = l.snapshots().iter().position(|s| s.guid == guid) else {
                    tracing::warn!(
                        dataset = ds.full_name(),
                        snapshot = name,
                        "gone since asked: not destroyed"
                    );
                    return Ok(());
                };
                let s = &l.snapshots()[i];
                // A send takes its long hold under this lock: one that began since the
                // destroy was asked keeps the snapshot.
                if !s.holds.is_empty() || cloned || dsl.is_long_held(guid) {
                    tracing::warn!(
                        dataset = ds.full_name(),
                        snapshot = name,
                        "held or cloned since asked: not destroyed"
                    );
                    return Ok(());
                }
                let prev = l.prev_txg(i);
                let snap = l.snapshots_mut().remove(i);
                // `i` now names the snapshot after it (or the head).
                let next = l.next_deadlist_at(i);
                let to_free = next.split_above(prev);
                next.merge(snap.deadlist);
                // What the next one references of the destroyed one's new blocks is now
                // new to it.
                let gained = snap.written_bytes.saturating_sub(to_free.bytes());
                match l.snapshots_mut().get_mut(i) {
                    Some(n) => n.written_bytes += gained,
                    None => {
                        l.written_bytes += gained;
                        l.prev_snap_txg = prev;
                    }
                }
                to_free
            };
            // Readers of the snapshot stop before its blocks are freed (and those in flight
            // finish: frees are deferred past this txg).
            dsl.end_views(ds.id, guid);
            // Freed in the background, a bounded part per txg (dsl/freeing.rs).
            dsl.queue_frees(to_free, freed);
            tracing::info!(snapshot = format!("{}@{name}", ds.full_name()), "destroyed");
        }
        SnapOp::Rollback { name, guid } => {
            let target = {
                let l = ds.lineage.lock().unwrap();
                match l.snapshots().last() {
                    Some(s) if s.guid == *guid => s.clone(),
                    _ => {
                        tracing::warn!(
                            dataset = ds.full_name(),
                            snapshot = name,
                            "not the latest snapshot: no rollback"
                        );
                        return Ok(());
                    }
                }
            };
            let obj = ds.data();
            let root = obj.tree.lock().unwrap().root();
            // Everything the head wrote since the snapshot is its alone.
            free_born_after(spa, root, target.txg, &ds.full_name(), freed).await?;
            let deadlist = {
                let mut l = ds.lineage.lock().unwrap();
                l.written_bytes = 0;
                drop_bookmarks_after(&mut l, target.txg, &ds.full_name());
                std::mem::take(&mut l.deadlist)
            };
            // Its entries are the head's again: only the deadlist's own blocks go.
            free_deadlist(spa, deadlist, false, freed).await?;
            obj.tree
                .lock()
                .unwrap()
                .reset(target.levels.max(1), target.root);
            // This txg's dirty data is in the tree just replaced: reads must not find it in
            // the dirty sets either (they are retired when the txg is durable, later).
            obj.dirty.lock().unwrap().retire(txg);
            *obj.written_root.lock().unwrap() = (target.root, target.levels.max(1));
            obj.used_bytes
                .store(target.referenced_bytes, Ordering::Relaxed);
            obj.compressed_bytes
                .store(target.compressed_bytes, Ordering::Relaxed);
            obj.tree_size_bytes
                .store(target.volsize_bytes, Ordering::Relaxed);
            ds.props.lock().unwrap().volsize_bytes = target.volsize_bytes;
            tracing::info!(
                snapshot = format!("{}@{name}", ds.full_name()),
                "rolled back"
            );
        }
        SnapOp::Promote => promote(dsl, ds),
        SnapOp::Receive(swap) => super::recv::apply(spa, dsl, ds, swap, txg, freed).await?,
    }
    Ok(())
}

/// `promote` of clone `ds`: the snapshots of its origin's volume up to its origin move to it
/// (their trees, deadlists and figures unchanged: each is still relative to the snapshot
/// before it), it takes the origin volume's own origin, and the origin volume becomes a clone
/// of the moved origin snapshot. Clones of the moved snapshots follow them. No block moves.
fn promote(dsl: &Datasets, ds: &Dataset) {
    let Some(origin) = ds.lineage.lock().unwrap().origin.clone() else {
        tracing::warn!(dataset = ds.full_name(), "not a clone: no promote");
        return;
    };
    let Some(src) = dsl.all().into_iter().find(|d| d.id == origin.volume) else {
        tracing::warn!(dataset = ds.full_name(), "origin's volume gone: no promote");
        return;
    };
    let moved_guids: Vec<oxpool_format::Guid> = {
        // Lock order: the clone, then its origin's volume (nothing else holds two).
        let mut mine = ds.lineage.lock().unwrap();
        let mut theirs = src.lineage.lock().unwrap();
        let Some(i) = theirs
            .snapshots()
            .iter()
            .position(|s| s.guid == origin.snapshot_guid)
        else {
            tracing::warn!(dataset = ds.full_name(), "origin snapshot gone: no promote");
            return;
        };
        if theirs.snapshots()[..=i].iter().any(|s| {
            mine.find(&s.name).is_some() || mine.snapshots().iter().any(|m| m.guid == s.guid)
        }) {
            tracing::warn!(
                dataset = ds.full_name(),
                "snapshot names or guids collide: no promote"
            );
            return;
        }
        let moved: Vec<Snapshot> = theirs.snapshots_mut().drain(..=i).collect();
        let guids: Vec<oxpool_format::Guid> = moved.iter().map(|s| s.guid).collect();
        mine.snapshots_mut().splice(0..0, moved);
        mine.origin = theirs.origin.take();
        // The origin snapshot now lives in the promoted volume.
        theirs.origin = Some(oxpool_format::OriginMeta {
            volume: ds.id,
            ..origin.clone()
        });
        if theirs.snapshots().is_empty() {
            theirs.prev_snap_txg = origin.txg;
        }
        guids
    };
    // Clones of the moved snapshots now name the promoted volume as their origin's.
    for d in dsl.all() {
        if d.id == src.id {
            continue;
        }
        let mut l = d.lineage.lock().unwrap();
        if let Some(o) = l.origin.as_mut() {
            if o.volume == src.id && moved_guids.contains(&o.snapshot_guid) {
                o.volume = ds.id;
            }
        }
    }
    dsl.move_views(src.id, ds.id, &moved_guids);
    dsl.link_origins();
    tracing::info!(dataset = ds.full_name(), "promoted");
}

/// Removes the bookmarks of `l` younger than `txg` (a rollback or a forced receive to a
/// snapshot of that txg, as ZFS's `rollback -r`): the head no longer descends from the
/// snapshots they mark, so a change map or an incremental from one would miss what the
/// rollback undid.
pub(crate) fn drop_bookmarks_after(l: &mut crate::dsl::snapshot::Lineage, txg: Txg, what: &str) {
    if l.bookmarks().iter().any(|b| b.txg > txg) {
        let gone: Vec<String> = l
            .bookmarks()
            .iter()
            .filter(|b| b.txg > txg)
            .map(|b| b.name.clone())
            .collect();
        l.bookmarks_mut().retain(|b| b.txg <= txg);
        tracing::info!(dataset = what, bookmarks = ?gone, "bookmarks after the rollback destroyed");
    }
}

/// Writes the entries added to `ds`'s deadlists (the head's and its snapshots') into
/// deadlist blocks. A bucket whose last block is less than half full gets it rewritten with
/// the new entries (its old block goes to `freed`) rather than one more small block: the head
/// kills a few blocks in most txgs, and a block per txg would make the pool's metadata, which
/// lists the head's blocks, grow by one pointer every txg for as long as a snapshot lives.
/// So every block of a bucket but the last is at least half full.
pub(crate) async fn write_deadlists(
    spa: &Spa,
    ds: &Dataset,
    txg: Txg,
    freed: &mut Vec<Dva>,
) -> Result<()> {
    // (which deadlist: None the head's, Some(i) snapshot i's; bucket key; entries; the
    // bucket's last block if it is to be rewritten with them)
    type Pending = (Option<usize>, Txg, Vec<BlockPtr>, Option<BlockPtr>);
    let pending: Vec<Pending> = {
        let mut l = ds.lineage.lock().unwrap();
        let mut out = Vec::new();
        let mut take = |which: Option<usize>, d: &mut Deadlist| {
            for (k, b) in d.buckets_mut() {
                if !b.pending.is_empty() {
                    let tail = b
                        .stored
                        .last()
                        .filter(|c| (c.fill as usize) < DEADLIST_CHUNK_ENTRIES_MAX / 2)
                        .copied();
                    out.push((which, *k, std::mem::take(&mut b.pending), tail));
                }
            }
        };
        take(None, &mut l.deadlist);
        // Only a destroy adds entries to a snapshot's deadlist: don't mark the snapshot table
        // changed otherwise.
        if l.take_snapshot_deadlists_grew()
            && l.snapshots().iter().any(|s| s.deadlist.has_pending())
        {
            for (i, s) in l.snapshots_mut().iter_mut().enumerate() {
                take(Some(i), &mut s.deadlist);
            }
        }
        out
    };
    if pending.is_empty() {
        return Ok(());
    }
    let copies = indirect_copies(&ds.props.lock().unwrap());
    for (which, key, mut entries, tail) in pending {
        if let Some(tail) = &tail {
            let mut all = read_deadlist_chunk(spa, tail).await?;
            all.append(&mut entries);
            entries = all;
        }
        let mut chunks = Vec::new();
        // Bounded: one block per DEADLIST_CHUNK_ENTRIES_MAX entries.
        for chunk in entries.chunks(DEADLIST_CHUNK_ENTRIES_MAX) {
            let bytes = encode_deadlist_chunk(chunk);
            let records = chunk.len() as u64;
            chunks.push(
                write_meta_chunk(spa, &bytes, BlockType::DeadList, copies, txg, records).await?,
            );
        }
        if let Some(tail) = &tail {
            freed.extend_from_slice(tail.dvas());
        }
        let mut l = ds.lineage.lock().unwrap();
        let d = match which {
            None => &mut l.deadlist,
            Some(i) => &mut l.snapshots_mut()[i].deadlist,
        };
        d.add_stored(key, tail.as_ref(), chunks);
    }
    Ok(())
}

/// Writes `ds`'s snapshot and bookmark tables for txg `txg` if their records changed since
/// they were last written (only the chunks that changed: `dsl/table.rs`).
pub(crate) async fn write_tables(
    spa: &Spa,
    ds: &Dataset,
    txg: Txg,
    freed: &mut Vec<Dva>,
) -> Result<()> {
    let (snap_plan, mark_plan, snapshot_table, bookmark_table) = {
        let mut l = ds.lineage.lock().unwrap();
        let Some((snap_plan, mark_plan)) = l.plan_dirty_tables() else {
            return Ok(());
        };
        (
            snap_plan,
            mark_plan,
            l.snapshot_table.clone(),
            l.bookmark_table.clone(),
        )
    };
    let copies = indirect_copies(&ds.props.lock().unwrap());
    let written = async {
        let mut table_freed = Vec::new();
        let s = snapshot_table
            .write(
                spa,
                txg,
                copies,
                BlockType::SnapshotTable,
                snap_plan,
                &mut table_freed,
            )
            .await?;
        let b = bookmark_table
            .write(
                spa,
                txg,
                copies,
                BlockType::BookmarkTable,
                mark_plan,
                &mut table_freed,
            )
            .await?;
        Ok::<_, EngineError>((s, b, table_freed))
    }
    .await;
    let mut l = ds.lineage.lock().unwrap();
    match written {
        Ok((s, b, table_freed)) => {
            l.snapshot_table = s;
            l.bookmark_table = b;
            freed.extend(table_freed);
            Ok(())
        }
        Err(e) => {
            // Nothing published: the next sync writes them again.
            l.mark_tables_dirty();
            Err(e)
        }
    }
}

/// Frees a deadlist's blocks, and with `entries` the blocks it lists too (reading them).
pub(crate) async fn free_deadlist(
    spa: &Spa,
    deadlist: Deadlist,
    entries: bool,
    freed: &mut Vec<Dva>,
) -> Result<()> {
    for (_, bucket) in deadlist.buckets() {
        if entries {
            for bp in &bucket.pending {
                freed.extend_from_slice(bp.dvas());
            }
        }
        for chunk in &bucket.stored {
            if entries {
                for bp in read_deadlist_chunk(spa, chunk).await? {
                    freed.extend_from_slice(bp.dvas());
                }
            }
            freed.extend_from_slice(chunk.dvas());
        }
    }
    Ok(())
}

/// The entries of one deadlist block.
pub(crate) async fn read_deadlist_chunk(spa: &Spa, chunk: &BlockPtr) -> Result<Vec<BlockPtr>> {
    let buf = read_block(&spa.zio, IoClass::SyncRead, chunk, "deadlist").await?;
    decode_deadlist_chunk(&buf[..chunk.psize_bytes as usize]).map_err(|e| EngineError::Corrupt {
        device: spa.name.clone(),
        what: "deadlist block".into(),
        source: e,
    })
}

/// Frees every block of the tree under `root` born after `after` (a walk that skips every
/// subtree born at or before it: copy-on-write makes a parent at least as new as its
/// children).
pub(crate) async fn free_born_after(
    spa: &Spa,
    root: BlockPtr,
    after: Txg,
    what: &str,
    freed: &mut Vec<Dva>,
) -> Result<()> {
    let mut stack = vec![root];
    // Bounded by the tree's blocks born after `after`.
    while let Some(bp) = stack.pop() {
        if bp.is_hole() || bp.birth <= after {
            continue;
        }
        freed.extend_from_slice(bp.dvas());
        if bp.level > 0 {
            let buf = read_block(&spa.zio, IoClass::SyncRead, &bp, what).await?;
            let mut children = [BlockPtr::HOLE; INDIRECT_FANOUT];
            decode_indirect(&buf, &mut children).map_err(|e| EngineError::Corrupt {
                device: spa.name.clone(),
                what: format!("{what}: indirect block"),
                source: e,
            })?;
            stack.extend(children.iter().filter(|c| !c.is_hole() && c.birth > after));
        }
    }
    Ok(())
}
