//! The end of a receive, in one txg sync: the hidden dataset a stream was written into is
//! swapped into its target, and the target is snapshotted with the sender's guid.
//!
//! A receive writes into a hidden dataset (`VOL%recv`): a clone of the base snapshot for an
//! incremental stream, an empty volume for a full one. Nothing the target holds changes until
//! the stream's END is verified and the hidden dataset's data is synced. Then one change,
//! applied by the sync like every snapshot change, does all of this, so the uberblock makes
//! it atomic (a crash leaves the target as it was, or received whole):
//!
//! - the target's head blocks born after the base are freed (changes since the base are
//!   discarded, as a rollback does: the pool layer refuses a target modified since its base
//!   unless `-F`), and its deadlist's own blocks (its entries are the base's blocks again);
//! - the target's head takes the hidden dataset's tree, sizes, `written` and deadlist. The
//!   hidden dataset is a clone of the base, so its blocks born after the base are its own
//!   (now the head's), and its deadlist holds blocks of the base it killed, keyed by the same
//!   chain of snapshot txgs as the target's;
//! - the hidden dataset leaves the registry without freeing anything (its blocks are the
//!   target's now);
//! - the target is snapshotted, with the sender's guid, name and creation time.
//!
//! For a full stream the target is a new dataset that enters the registry in this sync, or
//! (`recv -F`) an existing volume without snapshots or origin: its base is then txg 0, so the
//! whole of its tree is freed, and its bookmarks are dropped.

use crate::dsl::dataset::Dataset;
use crate::dsl::snapshot::SnapOp;
use crate::dsl::snapshot_sync::{free_born_after, free_deadlist};
use crate::dsl::Datasets;
use crate::spa::Spa;
use crate::Result;
use oxpool_format::{Dva, Guid, Txg, VolumeId};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Where a received stream goes.
#[derive(Clone)]
pub(crate) enum ReceiveTarget {
    /// An existing volume (an incremental stream), by name.
    Existing(String),
    /// A new volume (a full stream), made by the pool layer and registered by the sync.
    New(Arc<Dataset>),
}

/// The change that ends a receive; queued on the hidden dataset's name.
#[derive(Clone)]
pub(crate) struct ReceiveSwap {
    pub target: ReceiveTarget,
    /// The guid the target's latest snapshot must have (the stream's base); None for a full
    /// stream (the target then has no snapshot).
    pub base_guid: Option<Guid>,
    /// The snapshot to take: its name (after `@`), guid and creation time.
    pub snapshot: String,
    pub guid: Guid,
    pub creation_s: u64,
    /// `recv -F`: what the target wrote since its base is discarded. Without it the swap is
    /// skipped if the target was written since its base, even while the stream was being
    /// received (the check when the receive began cannot see those writes, and they were
    /// acknowledged).
    pub force: bool,
    /// A full stream replacing an existing volume: that volume's id, as checked when the
    /// receive began (a volume made under the name since is not replaced).
    pub replaces: Option<VolumeId>,
}

impl std::fmt::Debug for ReceiveSwap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let target = match &self.target {
            ReceiveTarget::Existing(n) => n.clone(),
            ReceiveTarget::New(ds) => format!("{} (new)", ds.name()),
        };
        f.debug_struct("ReceiveSwap")
            .field("target", &target)
            .field("base_guid", &self.base_guid)
            .field("snapshot", &self.snapshot)
            .field("guid", &self.guid)
            .field("force", &self.force)
            .field("replaces", &self.replaces)
            .finish()
    }
}

impl Datasets {
    /// Removes hidden dataset `name` from the registry without freeing its blocks (their
    /// owner is now another dataset); its handles read and write no more.
    fn forget(&self, name: &str) -> Option<Arc<Dataset>> {
        let ds = self.state.lock().unwrap().datasets.remove(name)?;
        ds.mark_destroyed();
        Some(ds)
    }
}

/// The create of the received snapshot, through the ordinary snapshot path (boxed: that path
/// is the one that called this).
fn create_snapshot<'a>(
    spa: &'a Spa,
    dsl: &'a Datasets,
    ds: &'a Dataset,
    op: SnapOp,
    txg: Txg,
    freed: &'a mut Vec<Dva>,
) -> Pin<Box<dyn Future<Output = Result<()>> + 'a>> {
    Box::pin(async move { super::snapshot_sync::apply(spa, dsl, ds, &op, txg, freed).await })
}

/// Applies `swap`, queued on hidden dataset `hidden`, at the end of txg `txg` (whose sync has
/// written the target's and the hidden dataset's objects). A swap no longer possible (the
/// target changed since it was checked) is skipped with a warning, never half done; the pool
/// layer sees the snapshot missing and destroys the hidden dataset.
pub(crate) async fn apply(
    spa: &Spa,
    dsl: &Datasets,
    hidden: &Dataset,
    swap: &ReceiveSwap,
    txg: Txg,
    freed: &mut Vec<Dva>,
) -> Result<()> {
    let target = match &swap.target {
        ReceiveTarget::Existing(name) => match dsl.get(name) {
            Some(ds) => ds,
            None => {
                tracing::warn!(target = name, "receive: the target is gone");
                return Ok(());
            }
        },
        ReceiveTarget::New(ds) => ds.clone(),
    };
    if let Some(id) = swap.replaces {
        // The volume checked, still of the stream's block size (the swap keeps the tree's
        // shape, and the hidden dataset has the stream's).
        let blocks = |ds: &Dataset| ds.props.lock().unwrap().volblocksize_bytes;
        if target.id != id || blocks(&target) != blocks(hidden) {
            tracing::warn!(
                target = target.full_name(),
                "receive: the volume to replace was destroyed or replaced since the receive began"
            );
            return Ok(());
        }
    }
    // Taken before the lineage's lock, not under it.
    let root_birth = target.data().tree.lock().unwrap().root().birth;
    let hidden_base = hidden.lineage.lock().unwrap().prev_snap_txg;
    {
        let l = target.lineage.lock().unwrap();
        let latest = l.snapshots().last().map(|s| s.guid);
        if latest != swap.base_guid || l.find(&swap.snapshot).is_some() {
            tracing::warn!(
                target = target.full_name(),
                "receive: the target's latest snapshot changed since the receive began"
            );
            return Ok(());
        }
        // The hidden dataset must continue the target's lineage where it stands: the same
        // base (for a full stream replacing a volume, none: no snapshot, no origin). The
        // pool layer checked it when the receive began; the name may have gone to another
        // volume since.
        let replaced_clone = swap.base_guid.is_none() && l.origin.is_some();
        if l.prev_snap_txg != hidden_base || replaced_clone {
            tracing::warn!(
                target = target.full_name(),
                "receive: the target's base is not the received stream's"
            );
            return Ok(());
        }
        // Written since its base (the root is born after it): refused without -F, as at the
        // receive's start, since the writes may have come after that check.
        let existing = matches!(swap.target, ReceiveTarget::Existing(_));
        if existing && !swap.force && root_birth > l.prev_snap_txg {
            tracing::warn!(
                target = target.full_name(),
                "receive: the target was written since its base snapshot"
            );
            return Ok(());
        }
    }
    if let ReceiveTarget::New(ds) = &swap.target {
        if let Err(e) = dsl.insert(ds.clone()) {
            tracing::warn!(target = ds.full_name(), "receive: {e}");
            return Ok(());
        }
        ds.lineage.lock().unwrap().createtxg = txg;
    }
    let base_txg = {
        let mut l = target.lineage.lock().unwrap();
        // What the head did since its base is discarded: so are bookmarks made since.
        let base = l.prev_snap_txg;
        super::snapshot_sync::drop_bookmarks_after(&mut l, base, &target.full_name());
        base
    };
    // What the head wrote since its base is discarded (checked or forced by the pool layer).
    let head = target.data();
    let root = head.tree.lock().unwrap().root();
    free_born_after(spa, root, base_txg, &target.full_name(), freed).await?;
    let old_deadlist = std::mem::take(&mut target.lineage.lock().unwrap().deadlist);
    free_deadlist(spa, old_deadlist, false, freed).await?;
    // The hidden dataset's state becomes the head's.
    let from = hidden.data();
    let (root, levels) = {
        let t = from.tree.lock().unwrap();
        assert!(
            !t.has_dirty(),
            "a receive swapped in before its data was synced"
        );
        (t.root(), t.levels())
    };
    let (deadlist, written_bytes) = {
        let mut hl = hidden.lineage.lock().unwrap();
        debug_assert_eq!(hl.prev_snap_txg, base_txg, "the hidden clone's base");
        (std::mem::take(&mut hl.deadlist), hl.written_bytes)
    };
    head.tree.lock().unwrap().reset(levels.max(1), root);
    head.dirty.lock().unwrap().retire(txg);
    *head.written_root.lock().unwrap() = (root, levels.max(1));
    head.used_bytes
        .store(from.used_bytes.load(Ordering::Relaxed), Ordering::Relaxed);
    head.compressed_bytes.store(
        from.compressed_bytes.load(Ordering::Relaxed),
        Ordering::Relaxed,
    );
    let volsize_bytes = from.tree_size_bytes.load(Ordering::Relaxed);
    head.tree_size_bytes.store(volsize_bytes, Ordering::Relaxed);
    target.props.lock().unwrap().volsize_bytes = volsize_bytes;
    {
        let mut l = target.lineage.lock().unwrap();
        l.deadlist = deadlist;
        l.written_bytes = written_bytes;
    }
    dsl.forget(&hidden.name());
    tracing::info!(
        target = target.full_name(),
        snapshot = swap.snapshot,
        "received"
    );
    let create = SnapOp::Create {
        name: swap.snapshot.clone(),
        guid: swap.guid,
        creation_s: swap.creation_s,
    };
    create_snapshot(spa, dsl, &target, create, txg, freed).await
}
