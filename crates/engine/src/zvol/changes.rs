//! Change maps of a volume or a snapshot view: which ranges were written, trimmed or zeroed
//! since a base snapshot (docs/snapshots.md, "Change maps"; the NBD contexts
//! `oxpool:changed-since:SNAP`).
//!
//! Two sources make the answer, and a change the client was told about is in one of them:
//!
//! - **The synced tree** (`written_root`: the tree as the last txg sync left it), walked by
//!   birth txg ([`crate::dsl::change_map::changed_in_tree`]): cost follows the changed blocks.
//! - **The dirty sets** of the txgs not yet synced (the open one, and the one quiescing or
//!   syncing): every write, trim, write-zeroes and shrink lands there before it is answered
//!   (`Volume::modify`, `free_blocks`, `resize`), and reads find the newest data there first.
//!   Each dirty block and freed range in the query is flagged whole, without looking at its
//!   content. A write that only the intent log holds yet (answered after a FLUSH or with FUA)
//!   is still in its txg's dirty set until that txg syncs: the log is a copy for crashes, not
//!   a place reads go. After a crash, import replays the log into the tree before anything
//!   is served, so those writes are born after the base and flagged by the walk.
//!
//! The order of the two reads matters: the sync of txg N first writes N's blocks, then
//! publishes the new root (`written_root`, at the end of `dmu::sync::sync_object`), and only
//! after the txg is durable drops N's dirty set (`retire`). So the dirty sets are read
//! first: a change missing from them was retired before, so its root was published before
//! the root is read. (The other order could miss a txg that syncs between the two reads.)
//!
//! The tree read may be one a sync replaces while the walk runs; its places are freed only
//! some txgs later (deferred), and a read of a reused place fails its checksum: then the
//! walk starts over with the new root. The base's tree (a snapshot) is immutable while the
//! snapshot exists; a base destroyed meanwhile fails the request with "not found".

use super::Volume;
use crate::dsl::change_map::{changed_in_tree, ChangeBase, PinnedBase};
use crate::{EngineError, Result};

/// Most changed ranges one [`Volume::changed_extents`] reports from the tree; past it the
/// answer is a prefix of the range (a client asks again from where it ends). NBD sends at
/// most 1,024 extents a reply, so twice that covers any reply and bounds the memory of a
/// query over a gigabyte of scattered changes.
pub const CHANGED_RANGES_MAX: usize = 2048;

/// Walks of one query at most: a walk starts over when the tree it walked was replaced
/// under it (a sync between two reads of a block) and a read failed.
const WALK_ATTEMPTS_MAX: u32 = 4;

/// One extent of a change map, in offset order from the start of the query.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChangedExtent {
    /// Its length in bytes (non-zero).
    pub length_bytes: u64,
    /// Written, trimmed or zeroed since the base: may also be set on a range whose bytes
    /// happen to be the same (rewritten with the same data, a whole block of which only a
    /// part was written), never clear on a range whose bytes differ.
    pub changed: bool,
}

impl Volume {
    /// The change maps this volume offers now: its lineage's snapshots (for a snapshot
    /// view, those before it; for a clone, its origin's chain too), oldest first, at most
    /// `limit` (the newest ones).
    pub fn change_bases(&self, limit: usize) -> Vec<ChangeBase> {
        self.dsl.change_bases(&self.vol.ds, limit)
    }

    /// Whether this volume offers a change map since `base` now.
    pub fn offers_change_map(&self, base: &ChangeBase) -> bool {
        self.pin_change_base(base).is_some()
    }

    /// The snapshot `base` names now, pinned: [`Volume::changed_extents_since`] answers
    /// since that snapshot for as long as it exists, whatever it is renamed (a client's
    /// choice of a base is resolved once, when it chooses). None if this volume offers no
    /// change map since `base`.
    pub fn pin_change_base(&self, base: &ChangeBase) -> Option<PinnedBase> {
        self.dsl.pin_base(&self.vol.ds, base)
    }

    /// The change map since `base` as it names a snapshot now: see
    /// [`Volume::changed_extents_since`].
    pub async fn changed_extents(
        &self,
        base: &ChangeBase,
        offset_bytes: u64,
        length_bytes: u64,
    ) -> Result<Vec<ChangedExtent>> {
        let pin = self.pin_change_base(base).ok_or_else(|| {
            EngineError::NotFound(format!(
                "{}: no change map since {base} (no such snapshot in its lineage)",
                self.vol.ds.names
            ))
        })?;
        self.changed_extents_since(&pin, offset_bytes, length_bytes)
            .await
    }

    /// The change map since the pinned base `pin` over `[offset_bytes, offset_bytes +
    /// length_bytes)`: extents in order from `offset_bytes`, covering the range or a prefix
    /// of it (when it holds more than [`CHANGED_RANGES_MAX`] changed ranges), in whole
    /// volume blocks clipped to the range. Every byte that differs from the base lies in a
    /// changed extent; past the base's end the base counts as zeros (as a grown volume
    /// reads). Changes the volume answered before this call are included, synced or not.
    /// "Not found" once the base is gone (destroyed, or rolled back past).
    pub async fn changed_extents_since(
        &self,
        pin: &PinnedBase,
        offset_bytes: u64,
        length_bytes: u64,
    ) -> Result<Vec<ChangedExtent>> {
        let bs = u64::from(self.check_range(offset_bytes, length_bytes, false)?);
        if length_bytes == 0 {
            return Ok(Vec::new());
        }
        let end_bytes = offset_bytes + length_bytes;
        let (first, end) = (offset_bytes / bs, end_bytes.div_ceil(bs));
        let ds = &self.vol.ds;
        let obj = ds.data();
        let not_offered = || {
            EngineError::NotFound(format!(
                "{}: no change map since the base chosen (snapshot guid {:016x}, txg {}): \
                 destroyed or rolled back past",
                ds.names, pin.guid.0, pin.txg.0
            ))
        };
        let mut attempt = 0;
        // Bounded: WALK_ATTEMPTS_MAX walks.
        let (tree, dirty) = loop {
            attempt += 1;
            let point = self.dsl.pinned_point(ds, pin).ok_or_else(not_offered)?;
            // Dirty sets first, then the root: see the module docs.
            let dirty = dirty_ranges(&obj.dirty.lock().unwrap(), first, end);
            let root = *obj.written_root.lock().unwrap();
            let walked = changed_in_tree(
                &self.pool,
                &ds.names,
                root,
                &point,
                (first, end),
                CHANGED_RANGES_MAX,
            )
            .await;
            match walked {
                Ok(tree) => break (tree, dirty),
                Err(e) => {
                    let moved = *obj.written_root.lock().unwrap() != root;
                    let again = self.dsl.pinned_point(ds, pin);
                    if again.is_none() || ds.destroyed.load(std::sync::atomic::Ordering::Acquire) {
                        return Err(not_offered());
                    }
                    if attempt >= WALK_ATTEMPTS_MAX || (!moved && again == Some(point)) {
                        return Err(e);
                    }
                }
            }
        };
        // Exact up to where the walk stopped; the dirty ranges beyond it wait for the next
        // query (the client asks again from the end of this answer).
        let stop = tree.exact_end.min(end);
        let changed = union(&tree.ranges, &dirty, stop);
        Ok(extents(
            &changed,
            bs,
            offset_bytes,
            end_bytes.min(stop * bs),
        ))
    }
}

/// Blocks in `[first, end)` that the dirty sets change (written, partly written, freed), as
/// merged ranges in order.
fn dirty_ranges(d: &crate::dmu::dirty::ObjectDirty, first: u64, end: u64) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    // Bounded: at most three txgs, each with its dirty blocks and freed ranges.
    for (_, t) in &d.txgs {
        out.extend(
            t.blocks
                .keys()
                .filter(|&&b| b >= first && b < end)
                .map(|&b| (b, b + 1)),
        );
        out.extend(
            t.frees
                .range(..end)
                .map(|(&s, &e)| (s.max(first), e.min(end)))
                .filter(|(s, e)| s < e),
        );
    }
    out.sort_unstable();
    merge(out)
}

/// Sorted ranges with overlapping and adjacent ones joined.
fn merge(sorted: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(sorted.len());
    for (s, e) in sorted {
        match out.last_mut() {
            Some(last) if s <= last.1 => last.1 = last.1.max(e),
            _ => out.push((s, e)),
        }
    }
    out
}

/// The union of two sorted range lists, cut at block `stop`.
fn union(a: &[(u64, u64)], b: &[(u64, u64)], stop: u64) -> Vec<(u64, u64)> {
    let mut all: Vec<(u64, u64)> = a
        .iter()
        .chain(b)
        .map(|&(s, e)| (s, e.min(stop)))
        .filter(|(s, e)| s < e)
        .collect();
    all.sort_unstable();
    merge(all)
}

/// Extents over bytes `[from, to)` from changed block ranges (blocks of `bs` bytes).
fn extents(changed: &[(u64, u64)], bs: u64, from: u64, to: u64) -> Vec<ChangedExtent> {
    let mut out = Vec::new();
    let mut pos = from;
    let mut push = |len: u64, changed: bool| {
        if len > 0 {
            out.push(ChangedExtent {
                length_bytes: len,
                changed,
            });
        }
    };
    for &(s, e) in changed {
        let lo = (s * bs).clamp(from, to);
        let hi = (e * bs).clamp(from, to);
        if lo >= hi {
            continue;
        }
        push(lo - pos, false);
        push(hi - lo, true);
        pos = hi;
    }
    push(to - pos, false);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extents_cover_the_range_in_order() {
        let bs = 4096;
        // Blocks 1..3 and 5 changed; the query starts inside block 0 and ends inside block 5.
        let got = extents(&[(1, 3), (5, 6)], bs, 100, 5 * bs + 10);
        let lens: Vec<(u64, bool)> = got.iter().map(|e| (e.length_bytes, e.changed)).collect();
        assert_eq!(
            lens,
            [
                (bs - 100, false),
                (2 * bs, true),
                (2 * bs, false),
                (10, true)
            ]
        );
        assert_eq!(
            got.iter().map(|e| e.length_bytes).sum::<u64>(),
            5 * bs + 10 - 100
        );
        assert_eq!(
            extents(&[], bs, 0, bs),
            [ChangedExtent {
                length_bytes: bs,
                changed: false
            }]
        );
    }

    #[test]
    fn union_joins_and_cuts() {
        assert_eq!(
            union(&[(0, 2), (10, 12)], &[(2, 3), (5, 6), (11, 20)], 15),
            [(0, 3), (5, 6), (10, 15)]
        );
        assert_eq!(union(&[(4, 8)], &[], 4), []);
    }
}
