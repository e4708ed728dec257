//! The raidz map against ZFS's algorithm and its invariants: columns cover the block exactly,
//! the allocation is contiguous in the interleaved address space, no two columns of a block on
//! one child, the rounding is ZFS's, asize is monotone and its inverse is exact.

use oxpool_engine::vdev::raidz::{ChildIndex, ColumnRole, RaidzLayout, RaidzMap};
use proptest::prelude::*;
use std::collections::BTreeSet;

/// ZFS's `vdev_raidz_asize`, written from its description: sectors, plus `nparity` per row of
/// `cols - nparity` data sectors, rounded up to a multiple of `nparity + 1`.
fn zfs_asize(psize: u64, ashift: u32, cols: u64, nparity: u64) -> u64 {
    let mut asize = ((psize - 1) >> ashift) + 1;
    asize += nparity * ((asize + cols - nparity - 1) / (cols - nparity));
    asize = asize.div_ceil(nparity + 1) * (nparity + 1);
    asize << ashift
}

/// One column of ZFS's `vdev_raidz_map_alloc`: (child, byte offset, byte size).
type ZfsColumn = (u64, u64, u64);

/// ZFS's `vdev_raidz_map_alloc` for one row, written from its description with its variable
/// names: the columns that hold data or parity (`acols`), and `nskip`.
fn zfs_map(offset: u64, size: u64, ashift: u32, dcols: u64, nparity: u64) -> (Vec<ZfsColumn>, u64) {
    let b = offset >> ashift;
    let s = size.div_ceil(1 << ashift);
    let f = b % dcols;
    let o = (b / dcols) << ashift;
    let q = s / (dcols - nparity);
    let r = s - q * (dcols - nparity);
    let bc = if r == 0 { 0 } else { r + nparity };
    let tot = s + nparity * (q + u64::from(r != 0));
    let acols = if q == 0 { bc } else { dcols };
    let mut cols = Vec::new();
    for c in 0..acols {
        let mut col = f + c;
        let mut coff = o;
        if col >= dcols {
            col -= dcols;
            coff += 1 << ashift;
        }
        let size = if c < bc {
            (q + 1) << ashift
        } else {
            q << ashift
        };
        cols.push((col, coff, size));
    }
    let nskip = tot.div_ceil(nparity + 1) * (nparity + 1) - tot;
    (cols, nskip)
}

/// Checks every invariant of `map` (made from `layout`, `offset`, `psize`).
fn check_map(layout: RaidzLayout, offset: u64, psize: u64, map: &RaidzMap) {
    let (w, p) = (layout.width() as u64, layout.parity() as u64);
    let shift = layout.sector_shift();
    let sector = layout.sector_bytes();
    let what = format!("raidz{p} w={w} shift={shift} offset={offset} psize={psize}");

    // ZFS's map, column by column, and its rounding.
    let (zfs_cols, zfs_nskip) = zfs_map(offset, psize, shift, w, p);
    let ours: Vec<_> = map
        .columns()
        .map(|c| (c.child.0 as u64, c.child_offset_bytes, c.size_bytes as u64))
        .collect();
    assert_eq!(ours, zfs_cols, "{what}");
    assert_eq!(map.skip_sector_count(), zfs_nskip, "{what}");
    assert_eq!(map.asize_bytes(), zfs_asize(psize, shift, w, p), "{what}");
    assert_eq!(map.asize_bytes(), layout.asize_bytes(psize), "{what}");
    assert!(map.asize_sectors().is_multiple_of(p + 1), "{what}");
    assert!(map.skip_sector_count() < p + 1, "{what}");

    // Parity first, as big as the biggest column; data columns big first, then one shorter.
    let sizes: Vec<usize> = map.columns().map(|c| c.size_bytes).collect();
    let big = sizes[0];
    assert!(sizes[..p as usize].iter().all(|&s| s == big), "{what}");
    assert!(
        sizes.windows(2).all(|x| x[0] >= x[1]),
        "{what}: big columns first"
    );
    assert!(
        sizes
            .iter()
            .all(|&s| s == big || s + sector as usize == big),
        "{what}"
    );
    for c in map.columns() {
        let is_parity = (c.index as u64) < p;
        assert_eq!(
            matches!(c.role, ColumnRole::Parity { row } if row == c.index),
            is_parity
        );
    }

    // The data columns tile the block buffer exactly once, in order.
    let mut next = 0;
    for c in map.columns().skip(p as usize) {
        let ColumnRole::Data { block_offset_bytes } = c.role else {
            panic!("{what}: data column {} has a parity role", c.index);
        };
        assert_eq!(block_offset_bytes, next, "{what}");
        assert_eq!(map.data_range(c.index), next..next + c.size_bytes, "{what}");
        next += c.size_bytes;
    }
    assert_eq!(next, map.data_bytes(), "{what}");
    assert_eq!(
        map.data_bytes() as u64,
        psize.div_ceil(sector) * sector,
        "{what}"
    );

    // No two columns of the block on one child.
    let children: BTreeSet<ChildIndex> = map.columns().map(|c| c.child).collect();
    assert_eq!(children.len(), map.column_count(), "{what}");

    // Every sector of the allocation, and nothing else, is a column sector or a skip sector:
    // the block is one contiguous range of the interleaved space (child sector * w + child).
    let vdev_sector =
        |child: ChildIndex, child_offset: u64| (child_offset >> shift) * w + child.0 as u64;
    let mut covered = BTreeSet::new();
    for c in map.columns() {
        for i in 0..c.size_bytes as u64 / sector {
            assert!(
                covered.insert(vdev_sector(c.child, c.child_offset_bytes + i * sector)),
                "{what}"
            );
        }
    }
    for skip in map.skip_sectors() {
        assert!(
            covered.insert(vdev_sector(skip.child, skip.child_offset_bytes)),
            "{what}: skip"
        );
    }
    let b = offset >> shift;
    let expected: BTreeSet<u64> = (b..b + map.asize_sectors()).collect();
    assert_eq!(covered, expected, "{what}: allocation not contiguous");
}

#[test]
fn every_shape_the_issue_names() {
    // Every parity, every width from parity+2 to 12, every size from one sector to 128 KiB, at
    // offsets that start on every child.
    for p in 1..=3 {
        for w in p + 2..=12 {
            let layout = RaidzLayout::new(w, p).unwrap();
            for s in 1..=32u64 {
                for first in 0..w as u64 {
                    let offset = (first + 3 * w as u64) << 12;
                    let map = layout.map(offset, s << 12).unwrap();
                    check_map(layout, offset, s << 12, &map);
                }
            }
        }
    }
}

#[test]
fn asize_is_monotone_and_inverted_exactly() {
    for p in 1..=3 {
        for w in p + 1..=24 {
            let layout = RaidzLayout::new(w, p).unwrap();
            let mut last = 0;
            for s in 1..=600u64 {
                let asize = layout.asize_bytes(s << 12);
                assert!(asize >= last, "raidz{p} w={w} s={s}");
                last = asize;
                let back = layout.psize_bytes_max(asize);
                assert!(back >= s << 12, "raidz{p} w={w} s={s}");
                assert!(layout.asize_bytes(back) <= asize);
                assert!(
                    layout.asize_bytes(back + 4096) > asize,
                    "psize_bytes_max is the largest"
                );
            }
            assert_eq!(layout.psize_bytes_max(0), 0);
        }
    }
}

#[test]
fn small_blocks_cost_what_the_research_table_says() {
    // research/raidz.md 1.4: data / allocated, in percent, at 4 KiB sectors.
    let table: [(usize, usize, [u64; 7]); 5] = [
        (4, 1, [50, 50, 67, 67, 73, 73, 75]),
        (8, 1, [50, 50, 67, 80, 80, 84, 87]),
        (6, 2, [33, 33, 67, 67, 67, 67, 67]),
        (10, 2, [33, 33, 67, 67, 76, 76, 80]),
        (12, 3, [25, 25, 50, 67, 67, 73, 74]),
    ];
    let sizes_kib = [4u64, 8, 16, 32, 64, 128, 1024];
    for (w, p, percents) in table {
        let layout = RaidzLayout::new(w, p).unwrap();
        for (kib, percent) in sizes_kib.iter().zip(percents) {
            let psize = kib << 10;
            let got = (psize * 100) / layout.asize_bytes(psize);
            // The table rounds; floor may be one lower.
            assert!(
                got == percent || got + 1 == percent,
                "raidz{p} w={w} {kib}K: {got}%"
            );
        }
    }
}

#[test]
fn vdev_bytes_are_whole_sectors_of_every_child() {
    let layout = RaidzLayout::new(6, 2).unwrap();
    assert_eq!(layout.vdev_bytes(10 * 4096 + 100), 60 * 4096);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn maps_match_zfs_and_keep_their_invariants(
        parity in 1usize..=3,
        width_extra in 1usize..=30,
        ashift in prop::sample::select(vec![9u32, 12]),
        offset_sectors in 0u64..(1 << 40),
        data_sectors in 1u64..=300,
        tail_bytes in 0u64..4096,
    ) {
        let layout = RaidzLayout::with_sector_shift(parity + width_extra, parity, ashift).unwrap();
        let sector = layout.sector_bytes();
        let offset = offset_sectors << ashift;
        // A psize that is not a whole number of sectors is padded up.
        let psize = (data_sectors - 1) * sector + 1 + tail_bytes % sector;
        let map = layout.map(offset, psize).unwrap();
        check_map(layout, offset, psize, &map);
    }
}
