//! Combinatorial reconstruction: silent corruption of up to `parity` columns (data or parity,
//! with or without columns a device reported failed) is found, named and repaired, in ZFS's
//! order (fewest columns first, by child index); more than the parity allows is refused and
//! leaves the columns as read.

mod raidz_ref;

use oxpool_engine::vdev::raidz::{
    reconstruct_verified, ColumnSet, DataColumns, ParityKernels, RaidzError, RaidzLayout, RaidzMap,
};
use oxpool_format::{checksum, Checksum, ChecksumType};
use proptest::prelude::*;
use raidz_ref::{bytes, RefField, Stripe};

fn block_checksum(data: &DataColumns<'_>) -> Checksum {
    let mut block = vec![0u8; data.len_bytes()];
    data.copy_to(&mut block);
    checksum(ChecksumType::Xxh3_128, &block)
}

/// A block of `map`'s shape at its real sector size, with correct parity.
fn stripe(map: &RaidzMap, seed: u64) -> Stripe {
    Stripe::from_map(
        &RefField::new(),
        map,
        map.layout().sector_bytes() as usize,
        seed,
    )
}

/// Damages column `c` silently: one byte changed (never to itself).
fn corrupt(stripe: &mut Stripe, c: usize, seed: u64) {
    let column = &mut stripe.columns[c];
    let at = (seed as usize) % column.len();
    column[at] ^= 1 + (seed >> 32) as u8 % 255;
}

/// Picks `count` distinct columns of `0..n` from `seed`.
fn pick(n: usize, count: usize, seed: u64) -> Vec<usize> {
    let order = bytes(seed, n * 8);
    let mut columns: Vec<usize> = (0..n).collect();
    columns.sort_by_key(|&c| u64::from_le_bytes(order[c * 8..c * 8 + 8].try_into().unwrap()));
    columns.truncate(count);
    columns
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    /// Up to `parity` bad columns, some reported failed by their device and the others
    /// silently wrong: the block is rebuilt, every column holds its right bytes again, and the
    /// silent ones are named exactly.
    #[test]
    fn silent_corruption_within_parity_is_found_and_repaired(
        parity in 1usize..=3,
        width_extra in 2usize..=9,
        sectors in 1u64..=32,
        bad_count_seed in any::<u64>(),
        failed_share_seed in any::<u64>(),
        seed in any::<u64>(),
    ) {
        // 512-byte sectors keep the search cheap; the structure is the 4 KiB one's.
        let layout = RaidzLayout::with_sector_shift(parity + width_extra, parity, 9).unwrap();
        let map = layout.map((seed % 1000) << 9, sectors << 9).unwrap();
        let original = stripe(&map, seed);
        let expected = checksum(ChecksumType::Xxh3_128, &original.block());
        let bad_count = 1 + (bad_count_seed % parity as u64) as usize;
        let bad = pick(map.column_count(), bad_count.min(map.column_count()), seed ^ 1);
        let failed_count = (failed_share_seed % (bad.len() as u64 + 1)) as usize;
        let failed: ColumnSet = bad[..failed_count].iter().copied().collect();
        let silent: ColumnSet = bad[failed_count..].iter().copied().collect();
        for kernels in ParityKernels::available() {
            let mut work = original.clone();
            for c in failed.iter() {
                work.columns[c].fill(0); // A failed read leaves nothing usable.
            }
            for c in silent.iter() {
                corrupt(&mut work, c, seed.rotate_left(c as u32));
            }
            let found = reconstruct_verified(kernels, &map, &mut work.views(), failed, |data| {
                block_checksum(data) == expected
            });
            let found = found.map_err(|e| TestCaseError::fail(format!("{e}")))?;
            prop_assert!(work == original, "{}: columns not restored", kernels.name());
            prop_assert_eq!(found.silent, silent);
            prop_assert_eq!(found.repaired, failed.union(silent));
        }
    }

    /// One column more than the parity, silently wrong, all at the same byte (so that every
    /// hypothesis rebuilds a byte from a damaged one): no hypothesis verifies, and the read
    /// columns are left as they were read.
    #[test]
    fn corruption_beyond_parity_is_refused(
        parity in 1usize..=3,
        width_extra in 2usize..=9,
        sectors in 1u64..=32,
        seed in any::<u64>(),
    ) {
        let layout = RaidzLayout::with_sector_shift(parity + width_extra, parity, 9).unwrap();
        let map = layout.map(0, sectors << 9).unwrap();
        prop_assume!(map.column_count() > parity + 1);
        let original = stripe(&map, seed);
        let expected = checksum(ChecksumType::Xxh3_128, &original.block());
        let mut damaged = original.clone();
        for c in pick(map.column_count(), parity + 1, seed) {
            damaged.columns[c][0] ^= 0x40;
        }
        let mut work = damaged.clone();
        let kernels = ParityKernels::best();
        let result = reconstruct_verified(kernels, &map, &mut work.views(), ColumnSet::EMPTY, |data| {
            block_checksum(data) == expected
        });
        prop_assert_eq!(result, Err(RaidzError::Unrecoverable { parity }));
        prop_assert!(work == damaged, "columns as read");
    }

    /// One column more than the parity, silently wrong at random bytes: damage that falls
    /// where the short columns end can still leave the data recoverable. Whatever happens, the
    /// result is never wrong: either refused with the columns as read, or the block verified
    /// and every column, named exactly, restored.
    #[test]
    fn corruption_beyond_parity_never_returns_wrong_bytes(
        parity in 1usize..=3,
        width_extra in 2usize..=9,
        sectors in 1u64..=32,
        seed in any::<u64>(),
    ) {
        let layout = RaidzLayout::with_sector_shift(parity + width_extra, parity, 9).unwrap();
        let map = layout.map(0, sectors << 9).unwrap();
        prop_assume!(map.column_count() > parity + 1);
        let original = stripe(&map, seed);
        let expected = checksum(ChecksumType::Xxh3_128, &original.block());
        let mut damaged = original.clone();
        let bad: ColumnSet = pick(map.column_count(), parity + 1, seed).into_iter().collect();
        for c in bad.iter() {
            corrupt(&mut damaged, c, seed.rotate_left(c as u32));
        }
        let mut work = damaged.clone();
        let result = reconstruct_verified(ParityKernels::best(), &map, &mut work.views(), ColumnSet::EMPTY, |data| {
            block_checksum(data) == expected
        });
        match result {
            Ok(found) => {
                prop_assert!(work == original);
                prop_assert_eq!(found.silent, bad);
            }
            Err(e) => {
                prop_assert_eq!(e, RaidzError::Unrecoverable { parity });
                prop_assert!(work == damaged);
            }
        }
    }
}

#[test]
fn hypotheses_are_tried_fewest_first_in_child_order() {
    // raidz2, 6 wide, block starting on child 1: columns 0..6 sit on children 1, 2, 3, 4, 5,
    // 0, so in child order the candidates are columns 5, 0, 1, 2, 3, 4, and the hypotheses
    // that rebuild data come in the order 5, 2, 3, 4 (not the column order 2, 3, 4, 5).
    let layout = RaidzLayout::new(6, 2).unwrap();
    let map = layout.map(1 << 12, 16 << 12).unwrap();
    let child_order: Vec<usize> = {
        let mut c: Vec<usize> = (0..6).collect();
        c.sort_by_key(|&c| map.column(c).child);
        c
    };
    assert_eq!(child_order, vec![5, 0, 1, 2, 3, 4]);
    let original = stripe(&map, 9);
    let expected = checksum(ChecksumType::Xxh3_128, &original.block());
    for (position, &bad) in [5usize, 2, 3, 4].iter().enumerate() {
        let mut work = original.clone();
        corrupt(&mut work, bad, 77);
        let mut tried = Vec::new();
        let found = reconstruct_verified(
            ParityKernels::best(),
            &map,
            &mut work.views(),
            ColumnSet::EMPTY,
            |data| {
                tried.push(block_checksum(data) == expected);
                *tried.last().unwrap()
            },
        )
        .unwrap();
        // The data as read, then one hypothesis per data column before it in child order
        // (parity-only hypotheses leave the data as read and are not verified again).
        assert_eq!(found.verifications, 2 + position, "column {bad}");
        assert_eq!(tried.len(), found.verifications);
        assert_eq!(found.silent, ColumnSet::single(bad));
    }
    // Two bad data columns on raidz2: every single-column hypothesis is tried first.
    let mut work = original.clone();
    corrupt(&mut work, 3, 1);
    corrupt(&mut work, 5, 2);
    let found = reconstruct_verified(
        ParityKernels::best(),
        &map,
        &mut work.views(),
        ColumnSet::EMPTY,
        |data| block_checksum(data) == expected,
    )
    .unwrap();
    assert!(
        found.verifications > 1 + 4,
        "level 1 is exhausted before level 2"
    );
    assert_eq!(found.silent, [3, 5].into_iter().collect());
    assert!(work == original);
}

#[test]
fn more_failed_columns_than_parity_are_refused_at_once() {
    let map = RaidzLayout::new(5, 1).unwrap().map(0, 16 << 12).unwrap();
    let mut work = stripe(&map, 3);
    let failed: ColumnSet = [1, 2].into_iter().collect();
    let mut calls = 0;
    let result = reconstruct_verified(
        ParityKernels::best(),
        &map,
        &mut work.views(),
        failed,
        |_| {
            calls += 1;
            true
        },
    );
    assert_eq!(
        result,
        Err(RaidzError::TooManyMissing {
            missing: 2,
            parity: 1
        })
    );
    assert_eq!(calls, 0);
}
