//! Raidz parity against a slow reference (`raidz_ref`: byte-by-byte GF(2^8) with its own
//! log/exp tables), and every reconstruction case: every parity count, every width from
//! parity+2 to 12, every block size from one sector to 128 KiB, every set of up to `parity`
//! lost columns (data and parity mixed), on every kernel implementation the CPU runs.
//!
//! The exhaustive loops use the column shapes of the real 4 KiB-sector maps with 64 bytes per
//! sector: the map depends only on sector counts, so every shape is covered at 1/64 of the
//! bytes (the tests run unoptimized-ish, `opt-level = 1`). Property tests then check random
//! cases at the real sector size, and arbitrary byte lengths for the kernels' tail handling.

mod raidz_ref;

use oxpool_engine::vdev::raidz::{ColumnSet, ParityKernels, RaidzError, RaidzLayout};
use proptest::prelude::*;
use raidz_ref::{bytes, subsets, RefField, Stripe};

const SCALED_SECTOR_BYTES: usize = 64;
const SECTORS_MAX: u64 = 32; // 128 KiB of 4 KiB sectors.

/// Every (parity, width, data sectors) the issue asks for.
fn shapes() -> impl Iterator<Item = (usize, usize, u64)> {
    (1..=3).flat_map(|p| (p + 2..=12).flat_map(move |w| (1..=SECTORS_MAX).map(move |s| (p, w, s))))
}

#[test]
fn golden_vectors_fix_the_coefficient_order() {
    // Three data columns: P = D0 ^ D1 ^ D2; Q = 4*D0 ^ 2*D1 ^ D2; R = 16*D0 ^ 4*D1 ^ D2: the
    // FIRST column gets the highest power. 2*0x80 = 0x1d (x^8 reduces by 0x11d), 4*0x80 = 0x3a,
    // 8*0x80 = 0x74, 16*0x80 = 0xe8. So P = 0x81, Q = 0x3a ^ 0x02 = 0x38, R = 0xe8 ^ 0x04 = 0xec.
    // (The reverse order, as in gf256::raid, would give Q = 0x80 ^ 0x02 ^ 0 = 0x82.)
    for kernels in ParityKernels::available() {
        let data = [vec![0x80u8], vec![0x01], vec![0x00]];
        let mut parity = vec![vec![0u8; 1]; 3];
        kernels.generate(&data, &mut parity);
        assert_eq!(
            parity,
            vec![vec![0x81], vec![0x38], vec![0xec]],
            "{}",
            kernels.name()
        );
    }
}

#[test]
fn short_columns_still_take_their_horner_step() {
    // D0 = [1, 1], D1 = [1] (one byte shorter: zero there). Q = 2*D0 ^ D1 = [3, 2]; a kernel
    // that skipped D1's step past its end would give Q[1] = 1. R = 4*D0 ^ D1 = [5, 4].
    for kernels in ParityKernels::available() {
        let data = [vec![1u8, 1], vec![1]];
        let mut parity = vec![vec![0u8; 2]; 3];
        kernels.generate(&data, &mut parity);
        assert_eq!(
            parity,
            vec![vec![0, 1], vec![3, 2], vec![5, 4]],
            "{}",
            kernels.name()
        );
    }
    // The same trap at the kernels' real sizes: a short column ending in the middle of the
    // parity, against the reference.
    let field = RefField::new();
    for kernels in ParityKernels::available() {
        for lens in [
            [8192, 8192, 4096],
            [8192, 4096, 4096],
            [4096 + 64, 4096, 64],
        ] {
            let data: Vec<Vec<u8>> = lens
                .iter()
                .enumerate()
                .map(|(i, &l)| bytes(i as u64, l))
                .collect();
            let refs: Vec<&[u8]> = data.iter().map(|d| &d[..]).collect();
            let mut parity = vec![vec![0u8; lens[0]]; 3];
            kernels.generate(&data, &mut parity);
            for (row, p) in parity.iter().enumerate() {
                assert!(
                    *p == field.parity(row, &refs, lens[0]),
                    "{} row {row} {lens:?}",
                    kernels.name()
                );
            }
        }
    }
}

#[test]
fn generation_matches_the_reference_for_every_shape() {
    let field = RefField::new();
    for kernels in ParityKernels::available() {
        for (p, w, s) in shapes() {
            let map = RaidzLayout::new(w, p).unwrap().map(0, s << 12).unwrap();
            let expected = Stripe::from_map(&field, &map, SCALED_SECTOR_BYTES, s);
            let mut got = expected.clone();
            for c in 0..p {
                got.columns[c].fill(0xee);
            }
            kernels.regenerate_parity(&mut got.views(), p, ColumnSet::range(0, p));
            assert!(got == expected, "{} raidz{p} w={w} s={s}", kernels.name());
            // Checking finds nothing wrong, and finds each parity column changed by one byte.
            let all_parity = ColumnSet::range(0, p);
            assert_eq!(
                kernels.check_parity(&got.columns, p, all_parity),
                ColumnSet::EMPTY
            );
            for c in 0..p {
                let mut bad = expected.clone();
                let at = (s as usize * 7) % bad.columns[c].len();
                bad.columns[c][at] ^= 0x10;
                assert_eq!(
                    kernels.check_parity(&bad.columns, p, all_parity),
                    ColumnSet::single(c),
                    "{} raidz{p} w={w} s={s}",
                    kernels.name()
                );
            }
        }
    }
}

#[test]
fn every_loss_of_up_to_parity_columns_reconstructs() {
    let field = RefField::new();
    let mut cases = 0u64;
    for kernels in ParityKernels::available() {
        for (p, w, s) in shapes() {
            let map = RaidzLayout::new(w, p).unwrap().map(0, s << 12).unwrap();
            let original = Stripe::from_map(&field, &map, SCALED_SECTOR_BYTES, s + 100);
            for lost in subsets(map.column_count(), p) {
                let bad: ColumnSet = lost.iter().copied().collect();
                let mut work = original.clone();
                for &c in &lost {
                    work.columns[c] = bytes(c as u64 + 7, work.columns[c].len());
                }
                let used = kernels
                    .reconstruct(&mut work.views(), p, bad)
                    .unwrap_or_else(|e| {
                        panic!("{} raidz{p} w={w} s={s} {lost:?}: {e}", kernels.name())
                    });
                // The solution used the first surviving parity rows, one per lost data column.
                let lost_data = bad.difference(ColumnSet::range(0, p)).len();
                let good_parity = ColumnSet::range(0, p).difference(bad);
                assert_eq!(used, good_parity.lowest(lost_data));
                kernels.regenerate_parity(
                    &mut work.views(),
                    p,
                    bad.intersection(ColumnSet::range(0, p)),
                );
                assert!(
                    work == original,
                    "{} raidz{p} w={w} s={s} lost {lost:?}",
                    kernels.name()
                );
                cases += 1;
            }
        }
    }
    println!("{cases} reconstructions checked");
}

#[test]
fn more_losses_than_parity_are_refused() {
    let field = RefField::new();
    let kernels = ParityKernels::best();
    let map = RaidzLayout::new(8, 2).unwrap().map(0, 24 << 12).unwrap();
    let original = Stripe::from_map(&field, &map, SCALED_SECTOR_BYTES, 1);
    // Two data columns and P lost on raidz2: one parity column for two data columns.
    let bad: ColumnSet = [0, 3, 5].into_iter().collect();
    let mut work = original.clone();
    let err = kernels.reconstruct(&mut work.views(), 2, bad).unwrap_err();
    assert_eq!(
        err,
        RaidzError::TooManyMissing {
            missing: 2,
            parity: 1
        }
    );
    assert!(work == original, "a refused reconstruction touches nothing");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Arbitrary byte lengths (not sector multiples, not chunk multiples): the kernels' tails.
    #[test]
    fn generation_matches_the_reference_for_any_lengths(
        parity_count in 1usize..=3,
        lens in prop::collection::vec(0usize..700, 1..20),
        extra in 0usize..200,
        seed in any::<u64>(),
    ) {
        let field = RefField::new();
        let len = lens.iter().copied().max().unwrap() + extra;
        let data: Vec<Vec<u8>> =
            lens.iter().enumerate().map(|(i, &l)| bytes(seed ^ i as u64, l)).collect();
        let refs: Vec<&[u8]> = data.iter().map(|d| &d[..]).collect();
        for kernels in ParityKernels::available() {
            let mut parity = vec![vec![0xffu8; len]; parity_count];
            kernels.generate(&data, &mut parity);
            for (row, p) in parity.iter().enumerate() {
                prop_assert!(*p == field.parity(row, &refs, len), "{} row {}", kernels.name(), row);
            }
        }
    }

    /// Arbitrary lengths and losses: reconstruction of short columns with tails.
    #[test]
    fn reconstruction_for_any_lengths(
        parity_count in 1usize..=3,
        lens in prop::collection::vec(1usize..700, 1..16),
        lost_seed in any::<u64>(),
        seed in any::<u64>(),
    ) {
        let field = RefField::new();
        let len = lens.iter().copied().max().unwrap();
        let mut all_lens = vec![len; parity_count];
        all_lens.extend(&lens);
        let original = Stripe::with_lens(&field, parity_count, &all_lens, seed);
        let all = subsets(all_lens.len(), parity_count);
        let lost = &all[(lost_seed % all.len() as u64) as usize];
        let bad: ColumnSet = lost.iter().copied().collect();
        for kernels in ParityKernels::available() {
            let mut work = original.clone();
            for &c in lost {
                work.columns[c].fill(0x5a);
            }
            kernels.reconstruct(&mut work.views(), parity_count, bad).unwrap();
            kernels.regenerate_parity(
                &mut work.views(), parity_count, bad.intersection(ColumnSet::range(0, parity_count)));
            prop_assert!(work == original, "{} lost {:?}", kernels.name(), lost);
        }
    }

    /// The real sector size: blocks up to 128 KiB at 4 KiB sectors, random losses.
    #[test]
    fn reconstruction_at_full_size(
        parity_count in 1usize..=3,
        width_extra in 2usize..=11,
        sectors in 1u64..=SECTORS_MAX,
        offset_sectors in 0u64..1000,
        lost_seed in any::<u64>(),
        seed in any::<u64>(),
    ) {
        let width = (parity_count + width_extra).min(12);
        let field = RefField::new();
        let map = RaidzLayout::new(width, parity_count).unwrap()
            .map(offset_sectors << 12, sectors << 12).unwrap();
        let original = Stripe::from_map(&field, &map, 4096, seed);
        let all = subsets(map.column_count(), parity_count);
        let lost = &all[(lost_seed % all.len() as u64) as usize];
        let bad: ColumnSet = lost.iter().copied().collect();
        for kernels in ParityKernels::available() {
            let mut work = original.clone();
            for &c in lost {
                work.columns[c] = bytes(seed ^ 0xdead, work.columns[c].len());
            }
            kernels.reconstruct(&mut work.views(), parity_count, bad).unwrap();
            kernels.regenerate_parity(
                &mut work.views(), parity_count, bad.intersection(ColumnSet::range(0, parity_count)));
            prop_assert!(work == original, "{} raidz{} w={} s={} lost {:?}",
                kernels.name(), parity_count, width, sectors, lost);
        }
    }
}
