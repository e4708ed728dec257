//! How far a resumable receive (`recv -s`) has come, in step with the txgs.
//!
//! The receive applies records in offset order and notes, after each, the end of what it
//! applied and the open txg at that moment. Every write it made up to that point was assigned
//! to that txg or an earlier one, so once that txg is synced the offset is safe to persist:
//! the sync of txg `T` persists the largest offset noted with a txg at or before `T`, in the
//! same metadata as the data below it. A crash then leaves a hidden dataset whose persisted
//! offset never runs ahead of its durable data; data past it is written again by the resumed
//! stream, which sends every record from that offset on.

use oxpool_format::{ReceiveResumeMeta, Txg};
use std::collections::VecDeque;

/// Progress notes kept at most: one per txg, and only the open, quiescing and syncing txgs
/// have notes not yet persisted. Dropping the oldest when full only delays persistence.
const NOTES_MAX: usize = 8;

/// A resumable receive's state in memory.
#[derive(Clone, Debug)]
pub(crate) struct ResumeProgress {
    /// What is persisted (its offset as of the last sync).
    pub meta: ReceiveResumeMeta,
    /// (txg, offset) notes not yet persisted, txgs increasing.
    notes: VecDeque<(Txg, u64)>,
}

impl ResumeProgress {
    /// The state of a receive, persisted as `meta` says.
    pub(crate) fn new(meta: ReceiveResumeMeta) -> ResumeProgress {
        ResumeProgress {
            meta,
            notes: VecDeque::new(),
        }
    }

    /// Every record below `offset_bytes` is applied, in txg `open_txg` or earlier.
    pub(crate) fn note(&mut self, open_txg: Txg, offset_bytes: u64) {
        match self.notes.back_mut() {
            Some((txg, offset)) if *txg == open_txg => *offset = (*offset).max(offset_bytes),
            _ => {
                if self.notes.len() == NOTES_MAX {
                    self.notes.pop_front();
                }
                self.notes.push_back((open_txg, offset_bytes));
            }
        }
        debug_assert!(self
            .notes
            .iter()
            .zip(self.notes.iter().skip(1))
            .all(|(a, b)| a.0 < b.0));
    }

    /// Txg `txg` is being synced: the notes it covers become the persisted offset.
    pub(crate) fn settle(&mut self, txg: Txg) {
        // Bounded by NOTES_MAX.
        while let Some(&(t, offset)) = self.notes.front() {
            if t > txg {
                break;
            }
            self.meta.offset_bytes = self.meta.offset_bytes.max(offset);
            self.notes.pop_front();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use oxpool_format::Guid;

    fn meta() -> ReceiveResumeMeta {
        ReceiveResumeMeta {
            toguid: Guid(1),
            fromguid: None,
            snapshot: "s".into(),
            creation_time_ns: 0,
            volsize_bytes: 1 << 20,
            volblocksize_bytes: 4096,
            features: 1,
            offset_bytes: 0,
        }
    }

    #[test]
    fn an_offset_is_persisted_only_with_the_txg_it_was_noted_in() {
        let mut p = ResumeProgress::new(meta());
        p.note(Txg(5), 4096);
        p.note(Txg(5), 8192);
        p.note(Txg(6), 12288);
        p.settle(Txg(4));
        assert_eq!(p.meta.offset_bytes, 0);
        p.settle(Txg(5));
        assert_eq!(p.meta.offset_bytes, 8192);
        assert_eq!(p.notes.len(), 1);
        p.settle(Txg(6));
        assert_eq!(p.meta.offset_bytes, 12288);
        assert!(p.notes.is_empty());
    }

    #[test]
    fn notes_stay_bounded() {
        let mut p = ResumeProgress::new(meta());
        for t in 0..100 {
            p.note(Txg(t), t * 4096);
        }
        assert!(p.notes.len() <= NOTES_MAX);
        p.settle(Txg(100));
        assert_eq!(p.meta.offset_bytes, 99 * 4096);
    }
}
