//! The pool's queue of blocks to free (DESIGN.md 5.2: frees are a persistent queue drained in
//! the background under a per-txg budget, visible as `freeing`).
//!
//! Destroying a snapshot frees whole deadlist buckets; their entries are stored in chunks
//! that must be read to learn the places. Reading and freeing them all in the txg that applies
//! the destroy would make that one sync as long as the destroy is large, and every client
//! write waits behind a sync once the dirty limit is reached. Instead the destroy moves the
//! buckets here (no I/O), and each txg sync drains at most [`DRAIN_CHUNKS_PER_TXG`] chunks:
//! reads them, frees their entries and the chunks themselves. The queue is part of the pool's
//! metadata, written by the same txg that frees what it drained, so a crash mid-drain resumes
//! at import exactly where the last committed txg left it: nothing freed twice, nothing lost.

use crate::dmu::sync::asize_all;
use crate::dsl::deadlist::Bucket;
use crate::dsl::snapshot_sync::read_deadlist_chunk;
use crate::spa::Spa;
use crate::Result;
use oxpool_format::{BlockPtr, DeadBucketMeta, Dva, Txg};
use std::collections::VecDeque;

/// Deadlist chunks a txg sync drains at most: 64 chunks of at most 1,024 entries, 64K blocks
/// freed per txg (a few MiB of chunk reads), so a sync stays short while a mass destroy drains
/// within seconds.
pub const DRAIN_CHUNKS_PER_TXG: usize = 64;

/// The queue (under the registry's lock; never held across an await): deadlist chunks
/// whose entries and selves are to be freed, with the entries' count and bytes.
#[derive(Debug, Default)]
pub(crate) struct FreeQueue {
    chunks: VecDeque<BlockPtr>,
    count: u64,
    bytes: u64,
}

impl FreeQueue {
    /// The queue a pool's metadata describes (one bucket, or none).
    pub(crate) fn from_meta(m: &[DeadBucketMeta]) -> FreeQueue {
        FreeQueue {
            chunks: m.iter().flat_map(|b| b.chunks.iter().copied()).collect(),
            count: m.iter().map(|b| b.count).sum(),
            bytes: m.iter().map(|b| b.bytes).sum(),
        }
    }

    /// Its persistent form.
    pub(crate) fn to_meta(&self) -> Vec<DeadBucketMeta> {
        if self.chunks.is_empty() {
            return Vec::new();
        }
        vec![DeadBucketMeta {
            key: Txg(0),
            chunks: self.chunks.iter().copied().collect(),
            count: self.count,
            bytes: self.bytes,
        }]
    }

    /// Queues a bucket's stored chunks; its pending entries (in memory, never written) are
    /// freed at once into `freed`.
    pub(crate) fn push(&mut self, bucket: Bucket, freed: &mut Vec<Dva>) {
        let mut count = bucket.count;
        let mut bytes = bucket.bytes;
        for bp in &bucket.pending {
            count -= 1;
            bytes -= asize_all(bp);
            freed.extend_from_slice(bp.dvas());
        }
        if bucket.stored.is_empty() {
            debug_assert_eq!((count, bytes), (0, 0), "a bucket's counts without chunks");
            return;
        }
        self.chunks.extend(bucket.stored);
        self.count += count;
        self.bytes += bytes;
    }

    /// Bytes still to free (`freeing`).
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Entries still to free.
    pub(crate) fn count(&self) -> u64 {
        self.count
    }

    /// Whether it holds nothing.
    pub(crate) fn is_empty(&self) -> bool {
        self.chunks.is_empty()
    }

    /// Every chunk queued (for the audit and the scrub).
    pub(crate) fn chunks(&self) -> Vec<BlockPtr> {
        self.chunks.iter().copied().collect()
    }
}

/// Drains up to [`DRAIN_CHUNKS_PER_TXG`] chunks of `queue` into `freed` (in the txg sync).
/// Returns whether something is left.
pub(crate) async fn drain(
    spa: &Spa,
    queue: &std::sync::Mutex<FreeQueue>,
    freed: &mut Vec<Dva>,
) -> Result<bool> {
    // Bounded by DRAIN_CHUNKS_PER_TXG.
    for _ in 0..DRAIN_CHUNKS_PER_TXG {
        let Some(chunk) = queue.lock().unwrap().chunks.front().copied() else {
            break;
        };
        // A failed read fails the sync with the chunk still queued: nothing is lost.
        let entries = read_deadlist_chunk(spa, &chunk).await?;
        let bytes: u64 = entries.iter().map(asize_all).sum();
        for bp in &entries {
            freed.extend_from_slice(bp.dvas());
        }
        freed.extend_from_slice(chunk.dvas());
        let mut q = queue.lock().unwrap();
        q.chunks.pop_front();
        q.count = q.count.saturating_sub(entries.len() as u64);
        q.bytes = q.bytes.saturating_sub(bytes);
        if q.chunks.is_empty() {
            debug_assert_eq!((q.count, q.bytes), (0, 0), "freeing counters drifted");
            q.count = 0;
            q.bytes = 0;
        }
    }
    Ok(!queue.lock().unwrap().is_empty())
}
