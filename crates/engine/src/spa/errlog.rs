//! The pool's log of damaged data: which ranges of which volumes had a block that no copy
//! could give back, for `oxpool status -v` (ZFS's "Permanent errors have been detected in the
//! following files").
//!
//! A read that fails on every copy (a volume read, a send, a scrub) records the block here.
//! The log lives while the pool is open, and a scrub that finishes with no block lost empties
//! it (the scrub read every block the pool references, so nothing listed is still damaged:
//! an overwrite or a destroy took it away). ZFS also keeps its log across exports and
//! imports; this one starts empty at import, and the host puts back what a command before
//! found while the pool stays imported on that host ([`ErrorLog::restore`]; `oxpool` keeps
//! it beside its pool cache file until the pool's export).

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// Most blocks the log names; beyond it, only a count (a pool that lost that much has
/// bigger problems than the listing's length).
pub const ERROR_LOG_BLOCKS_MAX: usize = 4096;

/// One damaged range of a dataset, as `oxpool status -v` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DamagedRange {
    /// The dataset (`pool/vol`, or `pool/vol@snap`).
    pub dataset: String,
    /// First byte of the range.
    pub offset_bytes: u64,
    /// Length of the range (whole blocks).
    pub length_bytes: u64,
}

/// The log (see the module documentation).
#[derive(Debug, Default)]
pub struct ErrorLog {
    /// (dataset, first byte, block bytes) of each damaged block.
    blocks: Mutex<BTreeSet<(String, u64, u64)>>,
    /// Damaged blocks not named because the log was full.
    unnamed: AtomicU64,
}

impl ErrorLog {
    /// Records that block `block` (of `block_bytes`) of `dataset` could not be read.
    pub fn record(&self, dataset: &str, block: u64, block_bytes: u64) {
        self.insert(dataset, block * block_bytes, block_bytes, "a block");
    }

    /// Records that `length_bytes` from `offset_bytes` of `dataset` could not be read (the
    /// range below a lost indirect block), as one entry.
    pub fn record_range(&self, dataset: &str, offset_bytes: u64, length_bytes: u64) {
        self.insert(dataset, offset_bytes, length_bytes, "an indirect block");
    }

    /// One entry, once; only a count beyond [`ERROR_LOG_BLOCKS_MAX`]. `what` was lost.
    fn insert(&self, dataset: &str, offset_bytes: u64, length_bytes: u64, what: &str) {
        let mut blocks = self.blocks.lock().unwrap();
        let entry = (dataset.to_string(), offset_bytes, length_bytes);
        if blocks.contains(&entry) {
            return;
        }
        if blocks.len() >= ERROR_LOG_BLOCKS_MAX {
            self.unnamed.fetch_add(1, Ordering::Relaxed);
            return;
        }
        crate::zio::warn_limit::io_warn!(
            dataset,
            offset_bytes,
            length_bytes,
            "damaged data: no copy of {what} could be read"
        );
        blocks.insert(entry);
    }

    /// The damaged ranges, adjacent blocks of a dataset merged, in dataset and offset order;
    /// and how many damaged blocks are not named.
    pub fn ranges(&self) -> (Vec<DamagedRange>, u64) {
        let blocks = self.blocks.lock().unwrap();
        let mut out: Vec<DamagedRange> = Vec::new();
        for (dataset, offset_bytes, length_bytes) in blocks.iter() {
            if let Some(last) = out.last_mut() {
                // Adjacent or overlapping (a lost indirect block's range holds blocks a read
                // named before).
                let last_end = last.offset_bytes + last.length_bytes;
                if last.dataset == *dataset && *offset_bytes <= last_end {
                    last.length_bytes =
                        last_end.max(offset_bytes + length_bytes) - last.offset_bytes;
                    continue;
                }
            }
            out.push(DamagedRange {
                dataset: dataset.clone(),
                offset_bytes: *offset_bytes,
                length_bytes: *length_bytes,
            });
        }
        (out, self.unnamed.load(Ordering::Relaxed))
    }

    /// Puts back ranges [`ErrorLog::ranges`] gave (of a command before this import, kept by
    /// the host): no warning, since they were said when first found.
    pub fn restore(&self, ranges: &[DamagedRange], unnamed: u64) {
        let mut blocks = self.blocks.lock().unwrap();
        for r in ranges {
            if blocks.len() >= ERROR_LOG_BLOCKS_MAX {
                self.unnamed.fetch_add(1, Ordering::Relaxed);
                continue;
            }
            blocks.insert((r.dataset.clone(), r.offset_bytes, r.length_bytes));
        }
        self.unnamed.fetch_add(unnamed, Ordering::Relaxed);
    }

    /// Dataset `from` (`pool/vol` or `pool/vol@snap`) is now `to`: its entries, and for a
    /// volume its snapshots' (`from@...`), take the new name, as ZFS's log (by object id)
    /// shows the names of now.
    pub fn rename(&self, from: &str, to: &str) {
        let mut blocks = self.blocks.lock().unwrap();
        let renamed = |dataset: &str| -> Option<String> {
            if dataset == from {
                return Some(to.to_string());
            }
            let snap = dataset.strip_prefix(from)?.strip_prefix('@')?;
            (!from.contains('@')).then(|| format!("{to}@{snap}"))
        };
        let moved: Vec<_> = blocks
            .iter()
            .filter_map(|e| renamed(&e.0).map(|name| (e.clone(), name)))
            .collect();
        for ((dataset, offset_bytes, length_bytes), name) in moved {
            blocks.remove(&(dataset, offset_bytes, length_bytes));
            blocks.insert((name, offset_bytes, length_bytes));
        }
    }

    /// Empties the log (a scrub found nothing lost).
    pub fn clear(&self) {
        self.blocks.lock().unwrap().clear();
        self.unnamed.store(0, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A rename moves a volume's entries and its snapshots' to the new name, a snapshot's
    /// its own only; others stay.
    #[test]
    fn a_rename_moves_the_entries_of_what_it_renames() {
        let log = ErrorLog::default();
        for d in ["tank/a", "tank/a@s", "tank/ab", "tank/b@s"] {
            log.record(d, 1, 4096);
        }
        log.rename("tank/a", "tank/z");
        log.rename("tank/b@s", "tank/b@t");
        let (ranges, _) = log.ranges();
        let names: Vec<&str> = ranges.iter().map(|r| r.dataset.as_str()).collect();
        assert_eq!(names, ["tank/ab", "tank/b@t", "tank/z", "tank/z@s"]);
        log.rename("tank/z@s", "tank/z@u");
        let (ranges, _) = log.ranges();
        assert!(ranges.iter().any(|r| r.dataset == "tank/z@u"));
        assert!(ranges.iter().any(|r| r.dataset == "tank/z"));
    }

    /// A lost indirect block's range over blocks a read named before: one range, not two.
    #[test]
    fn an_indirect_blocks_range_merges_with_the_blocks_inside_it() {
        let log = ErrorLog::default();
        log.record("tank/b", 5, 16384);
        log.record_range("tank/b", 4 * 16384, 8 * 16384);
        log.record("tank/b", 12, 16384);
        let (ranges, unnamed) = log.ranges();
        assert_eq!(unnamed, 0);
        assert_eq!(
            ranges,
            vec![DamagedRange {
                dataset: "tank/b".into(),
                offset_bytes: 4 * 16384,
                length_bytes: 9 * 16384,
            }]
        );
    }

    #[test]
    fn adjacent_blocks_merge_per_dataset_and_the_log_is_bounded() {
        let log = ErrorLog::default();
        log.record("tank/a", 3, 16384);
        log.record("tank/a", 4, 16384);
        log.record("tank/a", 4, 16384);
        log.record("tank/a", 9, 16384);
        log.record("tank/b", 5, 16384);
        let (ranges, unnamed) = log.ranges();
        assert_eq!(unnamed, 0);
        let r = |d: &str, o: u64, l: u64| DamagedRange {
            dataset: d.into(),
            offset_bytes: o,
            length_bytes: l,
        };
        assert_eq!(
            ranges,
            vec![
                r("tank/a", 3 * 16384, 2 * 16384),
                r("tank/a", 9 * 16384, 16384),
                r("tank/b", 5 * 16384, 16384)
            ]
        );

        for b in 0..ERROR_LOG_BLOCKS_MAX as u64 + 10 {
            log.record("tank/c", 100 + b, 4096);
        }
        let (ranges, unnamed) = log.ranges();
        assert!(unnamed >= 10);
        assert_eq!(
            ranges
                .iter()
                .map(|r| r.length_bytes / if r.dataset == "tank/c" { 4096 } else { 16384 })
                .sum::<u64>(),
            ERROR_LOG_BLOCKS_MAX as u64
        );
        log.clear();
        assert_eq!(log.ranges(), (vec![], 0));
    }
}
