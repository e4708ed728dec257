//! Deadlists: the blocks a dataset's previous snapshot references and the dataset does not
//! (it freed them while a snapshot still held them).
//!
//! # Buckets by birth
//!
//! Entries are kept in **buckets keyed by a snapshot txg**: when a dataset kills a block born
//! in txg `b`, the block goes to the bucket whose key is the smallest snapshot txg of the
//! dataset's chain that is `>= b` (its chain: its previous snapshot, that one's previous, and
//! on through a clone's origin). So a bucket with key `k` holds blocks born after the chain's
//! snapshot before `k` and at most at `k`.
//!
//! Invariant: for every snapshot txg `T` that exists in the chain, every entry of a bucket
//! with key `k` has `birth <= T` exactly when `k <= T`. It holds when an entry is added (keys
//! come from the chain), snapshots created later have larger txgs than every entry, and a
//! destroyed snapshot's key left behind in a bucket never becomes wrong, because no snapshot
//! remains strictly between the bucket's entries and its key.
//!
//! That is what makes snapshot operations cheap, with no block read:
//! - creating a snapshot hands the head's deadlist to the snapshot whole and gives the head an
//!   empty one (O(1));
//! - destroying a snapshot splits its successor's deadlist at the previous snapshot's txg
//!   (the part above is freed, whole buckets), then merges the destroyed one's into it
//!   (bucket lists joined by key);
//! - "bytes killed that were born in (a, b]" (the space figures) is a sum of bucket totals.
//!
//! This avoids ZFS's one cost per snapshot create (copying every key of the head's deadlist,
//! O(N) per create and O(N^2) over N snapshots): keys are made when an entry needs them.
//!
//! This file is the structure; the dataset sync writes pending entries into blocks.

use oxpool_format::{BlockPtr, Txg};
use std::collections::BTreeMap;

/// Allocated bytes of a block, every copy (what freeing it gives back).
use crate::dmu::sync::asize_all as asize_bytes;

/// The bucket key for a block born in `birth`: the smallest of `chain` (sorted snapshot txgs)
/// at or above it. `None` if the block is newer than every snapshot of the chain (no snapshot
/// holds it: it is not a deadlist entry but a free).
pub fn bucket_key(chain: &[Txg], birth: Txg) -> Option<Txg> {
    debug_assert!(chain.windows(2).all(|w| w[0] < w[1]), "chain not sorted");
    let i = chain.partition_point(|&t| t < birth);
    chain.get(i).copied()
}

/// One bucket: where its entries are, and how many and how large they are.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Bucket {
    /// Entries held in memory (added this txg; written by the next sync).
    pub pending: Vec<BlockPtr>,
    /// The blocks on disk holding the other entries.
    pub stored: Vec<BlockPtr>,
    /// Entries, pending and stored.
    pub count: u64,
    /// Allocated bytes of the entries (every copy).
    pub bytes: u64,
}

impl Bucket {
    fn absorb(&mut self, other: Bucket) {
        self.pending.extend(other.pending);
        self.stored.extend(other.stored);
        self.count += other.count;
        self.bytes += other.bytes;
    }
}

/// A deadlist: buckets by key (see the module docs).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Deadlist {
    buckets: BTreeMap<Txg, Bucket>,
}

impl Deadlist {
    /// An empty deadlist.
    pub fn new() -> Deadlist {
        Deadlist::default()
    }

    /// A deadlist of these buckets (loaded from disk).
    pub fn from_buckets(buckets: impl IntoIterator<Item = (Txg, Bucket)>) -> Deadlist {
        Deadlist {
            buckets: buckets.into_iter().collect(),
        }
    }

    /// Adds a killed block to bucket `key` (see [`bucket_key`]).
    pub fn insert(&mut self, key: Txg, bp: BlockPtr) {
        debug_assert!(!bp.is_hole());
        debug_assert!(bp.birth <= key, "entry born after its bucket's key");
        let b = self.buckets.entry(key).or_default();
        b.count += 1;
        b.bytes += asize_bytes(&bp);
        b.pending.push(bp);
    }

    /// Records that bucket `key`'s pending entries taken out earlier (with those of its block
    /// `rewritten`, if given) are now stored in blocks `chunks` (counts unchanged: they were
    /// counted when inserted).
    pub fn add_stored(&mut self, key: Txg, rewritten: Option<&BlockPtr>, chunks: Vec<BlockPtr>) {
        let b = self.buckets.entry(key).or_default();
        if let Some(old) = rewritten {
            let i = b.stored.iter().position(|c| c == old);
            debug_assert!(i.is_some(), "rewritten deadlist chunk not in its bucket");
            if let Some(i) = i {
                b.stored.remove(i);
            }
        }
        b.stored.extend(chunks);
    }

    /// Whether entries wait to be written.
    pub fn has_pending(&self) -> bool {
        self.buckets.values().any(|b| !b.pending.is_empty())
    }

    /// Entries in all.
    pub fn count(&self) -> u64 {
        self.buckets.values().map(|b| b.count).sum()
    }

    /// Allocated bytes of all entries.
    pub fn bytes(&self) -> u64 {
        self.buckets.values().map(|b| b.bytes).sum()
    }

    /// Allocated bytes of the entries born in `(after, upto]`, both snapshot txgs of the
    /// chain (or 0 and a txg at least the largest key: everything).
    pub fn bytes_born_in(&self, after: Txg, upto: Txg) -> u64 {
        if after >= upto {
            return 0;
        }
        self.buckets
            .range((
                std::ops::Bound::Excluded(after),
                std::ops::Bound::Included(upto),
            ))
            .map(|(_, b)| b.bytes)
            .sum()
    }

    /// Takes out the buckets whose key is above `t` (the entries born after snapshot txg
    /// `t`) and returns them.
    pub fn split_above(&mut self, t: Txg) -> Deadlist {
        let above = self.buckets.split_off(&Txg(t.0.saturating_add(1)));
        Deadlist { buckets: above }
    }

    /// Adds every entry of `other` (bucket by bucket, by key).
    pub fn merge(&mut self, other: Deadlist) {
        for (key, bucket) in other.buckets {
            self.buckets.entry(key).or_default().absorb(bucket);
        }
    }

    /// The buckets, by key.
    pub fn buckets(&self) -> impl Iterator<Item = (&Txg, &Bucket)> {
        self.buckets.iter()
    }

    /// Its buckets, by key, taken.
    pub fn into_buckets(self) -> impl Iterator<Item = (Txg, Bucket)> {
        self.buckets.into_iter()
    }

    /// The buckets, by key, to change (the store writes pending entries out).
    pub fn buckets_mut(&mut self) -> impl Iterator<Item = (&Txg, &mut Bucket)> {
        self.buckets.iter_mut()
    }

    /// Whether it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.buckets.values().all(|b| b.count == 0)
    }

    /// Empties it, returning what it held.
    pub fn take(&mut self) -> Deadlist {
        std::mem::take(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use oxpool_format::{Dva, VdevId};
    use proptest::prelude::*;

    fn bp(birth: u64, offset: u64) -> BlockPtr {
        let mut p = BlockPtr {
            ndvas: 1,
            birth: Txg(birth),
            ..BlockPtr::HOLE
        };
        p.dvas[0] = Dva {
            vdev: VdevId(0),
            offset_bytes: offset * 4096,
            asize_bytes: 4096,
        };
        p
    }

    #[test]
    fn keys_are_the_next_snapshot_at_or_above_the_birth() {
        let chain = [Txg(10), Txg(20), Txg(30)];
        assert_eq!(bucket_key(&chain, Txg(1)), Some(Txg(10)));
        assert_eq!(bucket_key(&chain, Txg(10)), Some(Txg(10)));
        assert_eq!(bucket_key(&chain, Txg(11)), Some(Txg(20)));
        assert_eq!(bucket_key(&chain, Txg(30)), Some(Txg(30)));
        assert_eq!(bucket_key(&chain, Txg(31)), None);
        assert_eq!(bucket_key(&[], Txg(1)), None);
    }

    /// A model: snapshots of one head as sets of blocks; the head kills blocks and takes
    /// snapshots; destroying a snapshot in the middle uses split and merge. After every step
    /// each deadlist equals "previous snapshot's blocks minus this dataset's", and the range
    /// sums equal the model's.
    #[derive(Debug, Clone)]
    enum Op {
        Write,
        Kill(u8),
        Snapshot,
        Destroy(u8),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => Just(Op::Write),
            4 => any::<u8>().prop_map(Op::Kill),
            2 => Just(Op::Snapshot),
            1 => any::<u8>().prop_map(Op::Destroy),
        ]
    }

    struct Snap {
        txg: Txg,
        blocks: Vec<BlockPtr>,
        dl: Deadlist,
    }

    proptest! {
        #[test]
        fn split_and_merge_keep_deadlists_exact(ops in proptest::collection::vec(op(), 1..120)) {
            let mut txg = 1u64;
            let mut next_offset = 0u64;
            let mut head: Vec<BlockPtr> = Vec::new();
            let mut head_dl = Deadlist::new();
            let mut snaps: Vec<Snap> = Vec::new();
            let mut freed_now = 0u64;
            for op in ops {
                txg += 1;
                match op {
                    Op::Write => {
                        head.push(bp(txg, next_offset));
                        next_offset += 1;
                    }
                    Op::Kill(i) if !head.is_empty() => {
                        let victim = head.remove(i as usize % head.len());
                        let chain: Vec<Txg> = snaps.iter().map(|s| s.txg).collect();
                        match bucket_key(&chain, victim.birth) {
                            Some(key) => head_dl.insert(key, victim),
                            None => freed_now += 1,
                        }
                    }
                    Op::Kill(_) => {}
                    Op::Snapshot => snaps.push(Snap {
                        txg: Txg(txg),
                        blocks: head.clone(),
                        dl: head_dl.take(),
                    }),
                    Op::Destroy(i) if !snaps.is_empty() => {
                        let i = i as usize % snaps.len();
                        let s = snaps.remove(i);
                        let prev_txg = if i > 0 { snaps[i - 1].txg } else { Txg(0) };
                        let next_dl = match snaps.get_mut(i) {
                            Some(n) => &mut n.dl,
                            None => &mut head_dl,
                        };
                        let unique = next_dl.split_above(prev_txg);
                        // Exactly the blocks only s held: in s, in neither neighbour.
                        let next_blocks = snaps.get(i).map_or(&head, |n| &n.blocks);
                        let prev_blocks = if i > 0 { Some(&snaps[i - 1].blocks) } else { None };
                        let only_s: Vec<&BlockPtr> = s.blocks.iter()
                            .filter(|b| !next_blocks.contains(b))
                            .filter(|b| prev_blocks.is_none_or(|p| !p.contains(b)))
                            .collect();
                        prop_assert_eq!(unique.count(), only_s.len() as u64);
                        let next_dl = match snaps.get_mut(i) {
                            Some(n) => &mut n.dl,
                            None => &mut head_dl,
                        };
                        next_dl.merge(s.dl);
                    }
                    Op::Destroy(_) => {}
                }
                // Each deadlist: previous snapshot's blocks minus this one's.
                for k in 0..=snaps.len() {
                    let (mine, dl) = match snaps.get(k) {
                        Some(s) => (&s.blocks, &s.dl),
                        None => (&head, &head_dl),
                    };
                    let expected: Vec<&BlockPtr> = if k == 0 {
                        Vec::new()
                    } else {
                        snaps[k - 1].blocks.iter().filter(|b| !mine.contains(b)).collect()
                    };
                    prop_assert_eq!(dl.count(), expected.len() as u64);
                    // Range sums over consecutive snapshot intervals add up per birth.
                    let mut after = Txg(0);
                    for s in snaps.iter().take(k) {
                        let want: u64 = expected.iter()
                            .filter(|b| b.birth > after && b.birth <= s.txg)
                            .map(|b| asize_bytes(b)).sum();
                        prop_assert_eq!(dl.bytes_born_in(after, s.txg), want);
                        after = s.txg;
                    }
                }
            }
            let _ = freed_now;
        }
    }
}
