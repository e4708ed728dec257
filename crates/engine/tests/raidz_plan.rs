//! The raidz write and read plans driven against in-memory children: a healthy read touches
//! only data columns; up to `parity` unreadable, failing, stale or silently corrupt children
//! still give the right bytes; repairs put every column back, so that a second scrub finds
//! nothing; more failures than parity fail cleanly.

mod raidz_ref;

use oxpool_engine::vdev::raidz::{
    generate_parity, plan_write, write_outcome, ChildIndex, ColumnSet, DataColumns, ParityKernels,
    RaidzLayout, RaidzMap, ReadFailure, ReadMode, ReadOutcome, ReadPlan, ReadStep, WriteOutcome,
    WriteSource,
};
use oxpool_format::{checksum, Checksum, ChecksumType};
use proptest::prelude::*;
use raidz_ref::bytes;
use std::collections::BTreeSet;

/// The children of one raidz vdev, as byte vectors, and what goes wrong with them.
#[derive(Clone, PartialEq, Eq, Debug)]
struct Vdev {
    children: Vec<Vec<u8>>,
}

/// How the children misbehave during one read.
#[derive(Default, Clone)]
struct Faults {
    unreadable: BTreeSet<usize>,
    stale: BTreeSet<usize>,
    read_errors: BTreeSet<usize>,
}

/// What one read did.
struct ReadResult {
    block: Result<Vec<u8>, ReadFailure>,
    outcome: Option<ReadOutcome>,
    /// The Read steps, in order.
    reads: Vec<ColumnSet>,
}

impl Vdev {
    fn new(map: &RaidzMap) -> Vdev {
        let sector = map.layout().sector_bytes();
        let end = map
            .columns()
            .map(|c| c.child_offset_bytes + c.size_bytes as u64)
            .chain(map.skip_sectors().map(|s| s.child_offset_bytes + sector))
            .max()
            .unwrap();
        Vdev {
            children: vec![vec![0u8; end as usize]; map.layout().width()],
        }
    }

    fn region(&mut self, child: ChildIndex, offset: u64, len: usize) -> &mut [u8] {
        &mut self.children[child.0][offset as usize..offset as usize + len]
    }

    /// Executes the write plan of `block`.
    fn write(&mut self, kernels: ParityKernels, map: &RaidzMap, block: &[u8]) {
        let mut parity = vec![vec![0u8; map.parity_column_bytes()]; map.parity_count()];
        if !map.parity_is_data() {
            generate_parity(kernels, map, block, &mut parity);
        }
        for w in plan_write(map) {
            let bytes: Vec<u8> = match &w.source {
                WriteSource::Block(range) => block[range.clone()].to_vec(),
                WriteSource::Parity(row) => {
                    assert!(
                        !map.parity_is_data(),
                        "no parity buffer when parity is the data"
                    );
                    parity[*row].clone()
                }
                WriteSource::Zeros => vec![0; w.size_bytes],
            };
            assert_eq!(bytes.len(), w.size_bytes);
            self.region(w.child, w.child_offset_bytes, w.size_bytes)
                .copy_from_slice(&bytes);
        }
    }

    /// Drives a read plan to its end, then writes the repairs back.
    fn read(
        &mut self,
        map: &RaidzMap,
        mode: ReadMode,
        faults: &Faults,
        expected: Checksum,
    ) -> ReadResult {
        let kernels = ParityKernels::best();
        let unreadable = map.columns_on(|c| faults.unreadable.contains(&c.0));
        let stale = map.columns_on(|c| faults.stale.contains(&c.0));
        let mut plan = ReadPlan::new(map, mode, unreadable, stale);
        let mut block = vec![0xccu8; map.data_bytes()];
        let mut parity = vec![vec![0xccu8; map.parity_column_bytes()]; map.parity_count()];
        let mut reads = Vec::new();
        let mut steps = 0;
        loop {
            steps += 1;
            assert!(steps < 10, "a read plan takes a few steps");
            let mut cols: Vec<&mut [u8]> = parity.iter_mut().map(|p| p.as_mut_slice()).collect();
            cols.extend(map.split_block_mut(&mut block));
            let step = plan.next(kernels, &mut cols, |data: &DataColumns<'_>| {
                let mut b = vec![0u8; data.len_bytes()];
                data.copy_to(&mut b);
                checksum(ChecksumType::Xxh3_128, &b) == expected
            });
            match step {
                ReadStep::Read(columns) => {
                    assert!(!columns.is_empty());
                    reads.push(columns);
                    for c in columns.iter() {
                        let column = map.column(c);
                        assert!(!unreadable.contains(c) && !stale.contains(c), "read of {c}");
                        if faults.read_errors.contains(&column.child.0) {
                            cols[c].fill(0x99);
                            plan.read_done(c, false);
                        } else {
                            let off = column.child_offset_bytes as usize;
                            cols[c].copy_from_slice(
                                &self.children[column.child.0][off..off + column.size_bytes],
                            );
                            plan.read_done(c, true);
                        }
                    }
                }
                ReadStep::Done(outcome) => {
                    for c in outcome.repair.iter() {
                        let column = map.column(c);
                        assert!(!unreadable.contains(c), "repair of an unreadable column");
                        self.region(column.child, column.child_offset_bytes, column.size_bytes)
                            .copy_from_slice(cols[c]);
                    }
                    return ReadResult {
                        block: Ok(block),
                        outcome: Some(outcome),
                        reads,
                    };
                }
                ReadStep::Failed(failure) => {
                    return ReadResult {
                        block: Err(failure),
                        outcome: None,
                        reads,
                    };
                }
            }
        }
    }
}

/// A written block: the map, its bytes, their checksum, the clean image of the children.
struct Written {
    map: RaidzMap,
    block: Vec<u8>,
    sum: Checksum,
    vdev: Vdev,
}

fn written(parity: usize, width: usize, sectors: u64, offset_sectors: u64, seed: u64) -> Written {
    // 512-byte sectors: the same maps as at 4 KiB, with an eighth of the bytes.
    let layout = RaidzLayout::with_sector_shift(width, parity, 9).unwrap();
    let map = layout.map(offset_sectors << 9, sectors << 9).unwrap();
    let block = bytes(seed, map.data_bytes());
    let mut vdev = Vdev::new(&map);
    vdev.write(ParityKernels::best(), &map, &block);
    let sum = checksum(ChecksumType::Xxh3_128, &block);
    Written {
        map,
        block,
        sum,
        vdev,
    }
}

/// `count` distinct children of `width` from `seed`.
fn children(width: usize, count: usize, seed: u64) -> Vec<usize> {
    let order = bytes(seed, width * 8);
    let mut c: Vec<usize> = (0..width).collect();
    c.sort_by_key(|&i| u64::from_le_bytes(order[i * 8..i * 8 + 8].try_into().unwrap()));
    c.truncate(count);
    c
}

fn column_of_child(map: &RaidzMap, child: usize) -> Option<usize> {
    map.columns().find(|c| c.child.0 == child).map(|c| c.index)
}

/// Flips a byte of the column on `child` (if the block has one there) in the vdev.
fn corrupt_child(w: &mut Written, child: usize, seed: u64) -> Option<usize> {
    let c = column_of_child(&w.map, child)?;
    let column = w.map.column(c);
    let at = column.child_offset_bytes as usize + seed as usize % column.size_bytes;
    w.vdev.children[child][at] ^= 0x21;
    Some(c)
}

prop_compose! {
    fn shape()(parity in 1usize..=3, width_extra in 2usize..=9, sectors in 1u64..=32,
               offset_sectors in 0u64..64, seed in any::<u64>())
        -> (usize, usize, u64, u64, u64) {
        (parity, parity + width_extra, sectors, offset_sectors, seed)
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn a_healthy_read_reads_only_the_data_columns((p, w, s, off, seed) in shape()) {
        let mut wr = written(p, w, s, off, seed);
        let clean = wr.vdev.clone();
        let r = wr.vdev.read(&wr.map, ReadMode::Normal, &Faults::default(), wr.sum);
        prop_assert_eq!(r.block.unwrap(), wr.block.clone());
        prop_assert_eq!(r.reads, vec![wr.map.data_columns()]);
        let outcome = r.outcome.unwrap();
        prop_assert_eq!(outcome.repair, ColumnSet::EMPTY);
        prop_assert!(!outcome.reconstructed);
        prop_assert!(wr.vdev == clean);
        // A scrub of a healthy block reads everything and finds nothing.
        let r = wr.vdev.read(&wr.map, ReadMode::Scrub, &Faults::default(), wr.sum);
        prop_assert_eq!(r.reads, vec![wr.map.all_columns()]);
        prop_assert_eq!(r.outcome.unwrap().silent, ColumnSet::EMPTY);
    }

    /// Up to `parity` children down, failing their reads or stale: the data is right; the
    /// failing ones are repaired by the read, the stale ones by a scrub, the unreadable never.
    #[test]
    fn reads_survive_up_to_parity_bad_children((p, w, s, off, seed) in shape(), kinds in any::<u64>()) {
        let mut wr = written(p, w, s, off, seed);
        let clean = wr.vdev.clone();
        let bad = children(w, 1 + (seed % p as u64) as usize, seed ^ 5);
        let mut faults = Faults::default();
        for (i, &child) in bad.iter().enumerate() {
            match (kinds >> (2 * i)) % 3 {
                0 => faults.unreadable.insert(child),
                1 => faults.read_errors.insert(child),
                _ => faults.stale.insert(child),
            };
            // A failing or stale child holds garbage where the block is.
            if let Some(c) = column_of_child(&wr.map, child) {
                let col = wr.map.column(c);
                if !faults.unreadable.contains(&child) {
                    wr.vdev.region(col.child, col.child_offset_bytes, col.size_bytes).fill(0x77);
                }
            }
        }
        let r = wr.vdev.read(&wr.map, ReadMode::Normal, &faults, wr.sum);
        prop_assert_eq!(r.block.unwrap(), wr.block.clone());
        let outcome = r.outcome.unwrap();
        let on = |set: &BTreeSet<usize>| wr.map.columns_on(|c| set.contains(&c.0));
        let read: ColumnSet = r.reads.iter().fold(ColumnSet::EMPTY, |a, &b| a.union(b));
        // Failed reads are repaired; a failing child's column that was not needed is not.
        prop_assert_eq!(outcome.repair, on(&faults.read_errors).intersection(read));
        prop_assert_eq!(outcome.silent, ColumnSet::EMPTY);
        let missing_data = on(&faults.unreadable).union(on(&faults.stale)).union(on(&faults.read_errors))
            .intersection(wr.map.data_columns());
        prop_assert_eq!(outcome.reconstructed, !missing_data.is_empty());
        // The read asked for one parity column per missing data column, and one more for each
        // parity read that failed.
        let parity_read = read.intersection(wr.map.parity_columns());
        let parity_failed = parity_read.intersection(on(&faults.read_errors));
        prop_assert!(parity_read.len() <= missing_data.len() + parity_failed.len());
        // The errors pass; a scrub then repairs the stale children, and finds the garbage
        // left on a failing child where the read did not look.
        let unseen = on(&faults.read_errors).difference(read);
        faults.read_errors.clear();
        let r = wr.vdev.read(&wr.map, ReadMode::Scrub, &faults, wr.sum);
        prop_assert_eq!(r.block.unwrap(), wr.block.clone());
        let outcome = r.outcome.unwrap();
        prop_assert_eq!(outcome.repair, on(&faults.stale).union(unseen));
        prop_assert_eq!(outcome.silent, unseen);
        for child in 0..w {
            if !faults.unreadable.contains(&child) {
                prop_assert!(wr.vdev.children[child] == clean.children[child], "child {}", child);
            }
        }
    }

    /// Up to `parity` children return wrong bytes with no error: reads return the right
    /// bytes; a scrub names exactly the damaged columns and repairs them, and a second scrub
    /// finds nothing.
    #[test]
    fn silent_corruption_is_found_and_healed((p, w, s, off, seed) in shape(), normal_first in any::<bool>()) {
        let mut wr = written(p, w, s, off, seed);
        let clean = wr.vdev.clone();
        let damaged: ColumnSet = children(w, 1 + (seed % p as u64) as usize, seed ^ 9)
            .into_iter()
            .filter_map(|child| corrupt_child(&mut wr, child, seed >> 7))
            .collect();
        let mut remaining = damaged;
        if normal_first {
            let r = wr.vdev.read(&wr.map, ReadMode::Normal, &Faults::default(), wr.sum);
            prop_assert_eq!(r.block.unwrap(), wr.block.clone());
            let outcome = r.outcome.unwrap();
            prop_assert!(outcome.silent.is_subset(damaged));
            if !damaged.intersection(wr.map.data_columns()).is_empty() {
                // The data was wrong: everything was read and every damaged column found.
                prop_assert_eq!(outcome.silent, damaged);
            }
            prop_assert_eq!(outcome.repair, outcome.silent);
            remaining = damaged.difference(outcome.silent);
        }
        let r = wr.vdev.read(&wr.map, ReadMode::Scrub, &Faults::default(), wr.sum);
        prop_assert_eq!(r.block.unwrap(), wr.block.clone());
        let outcome = r.outcome.unwrap();
        prop_assert_eq!(outcome.silent, remaining);
        prop_assert_eq!(outcome.repair, remaining);
        prop_assert!(wr.vdev == clean, "every column healed");
        let r = wr.vdev.read(&wr.map, ReadMode::Scrub, &Faults::default(), wr.sum);
        let outcome = r.outcome.unwrap();
        prop_assert_eq!((outcome.silent, outcome.repair), (ColumnSet::EMPTY, ColumnSet::EMPTY));
    }

    /// One child more than the parity: unreadable children fail at once, damaged ones after
    /// the search; either way no bytes are returned.
    #[test]
    fn one_failure_beyond_parity_fails_cleanly((p, w, s, off, seed) in shape(), mode_scrub in any::<bool>()) {
        let mode = if mode_scrub { ReadMode::Scrub } else { ReadMode::Normal };
        let mut wr = written(p, w, s, off, seed);
        prop_assume!(wr.map.column_count() > p + 1);
        let bad: Vec<usize> = wr.map.columns().take(p + 1).map(|c| c.child.0).collect();
        let faults = Faults { unreadable: bad.iter().copied().collect(), ..Faults::default() };
        let r = wr.vdev.read(&wr.map, mode, &faults, wr.sum);
        let missing = wr.map.columns_on(|c| faults.unreadable.contains(&c.0));
        prop_assert_eq!(r.block, Err(ReadFailure::TooManyMissing { missing }));
        // The same children silently damaged at their first byte: unrecoverable, every
        // column that was read named.
        for &child in &bad {
            let c = column_of_child(&wr.map, child).unwrap();
            let col = wr.map.column(c);
            wr.vdev.children[child][col.child_offset_bytes as usize] ^= 1;
        }
        let before = wr.vdev.clone();
        let r = wr.vdev.read(&wr.map, mode, &Faults::default(), wr.sum);
        prop_assert_eq!(r.block, Err(ReadFailure::Unrecoverable { read: wr.map.all_columns() }));
        prop_assert!(wr.vdev == before, "nothing written back");
    }
}

#[test]
fn parity_of_a_one_column_block_is_the_block() {
    // raidz2 of 6, one sector: P, Q and the data column, one sector each, then a skip sector
    // (3 rounded to a multiple of 3 needs none; 1 data + 2 parity = 3).
    let layout = RaidzLayout::new(6, 2).unwrap();
    let map = layout.map(5 << 12, 4096).unwrap();
    assert!(map.parity_is_data());
    let writes: Vec<_> = plan_write(&map).collect();
    assert_eq!(writes.len(), 3);
    for w in &writes {
        assert_eq!(w.source, WriteSource::Block(0..4096));
        assert!(!w.optional);
    }
    // Written without any parity buffer, the block reads back with its data child down.
    let mut wr = written(2, 3, 4, 0, 17);
    assert!(wr.map.parity_is_data());
    let data_child = wr.map.column(2).child.0;
    let faults = Faults {
        unreadable: [data_child].into_iter().collect(),
        ..Faults::default()
    };
    let r = wr.vdev.read(&wr.map, ReadMode::Normal, &faults, wr.sum);
    assert_eq!(r.block.unwrap(), wr.block);
}

#[test]
fn skip_sectors_are_optional_zero_writes() {
    // raidz1 of 5, 8 KiB: P + 2 data = 3 sectors, rounded to 4: one skip sector on child 3.
    let map = RaidzLayout::new(5, 1).unwrap().map(0, 8192).unwrap();
    let writes: Vec<_> = plan_write(&map).collect();
    assert_eq!(writes.len(), 4);
    let skip = &writes[3];
    assert_eq!(
        (skip.column, skip.child, skip.source.clone()),
        (None, ChildIndex(3), WriteSource::Zeros)
    );
    assert!(skip.optional);
    assert_eq!(writes[0].source, WriteSource::Parity(0));
    assert_eq!(writes[2].source, WriteSource::Block(4096..8192));
}

#[test]
fn a_write_succeeds_with_at_most_parity_failed_columns() {
    let map = RaidzLayout::new(6, 2).unwrap().map(0, 64 << 12).unwrap();
    assert_eq!(
        write_outcome(&map, ColumnSet::EMPTY),
        WriteOutcome::Complete
    );
    let two: ColumnSet = [0, 4].into_iter().collect();
    assert_eq!(
        write_outcome(&map, two),
        WriteOutcome::Degraded { missing: two }
    );
    let three: ColumnSet = [0, 4, 5].into_iter().collect();
    assert_eq!(
        write_outcome(&map, three),
        WriteOutcome::Failed { missing: three }
    );
}
