//! `Volume::block_status` (NBD's `base:allocation`) on what a client can make it walk: a
//! volume of the largest size, whose empty tree spans more than 2^64 bytes, and a range of
//! many small runs, of which a reply carries only so many. Volume sizes over the largest are
//! refused where a volume gets its size.

mod common;

use common::*;
use oxpool_engine::BlockState;
use oxpool_format::{TopVdevKind, VOLSIZE_MAX_BYTES};

fn on<T>(f: impl std::future::Future<Output = T>) -> T {
    oxpool_io::rt::block_on(f)
}

/// The largest volume, of 512-byte blocks: its tree's top subtree spans 255^7 blocks, more
/// than 2^64 bytes. Before, the walk's end of a hole overflowed: debug builds panicked and
/// release builds wrapped and looped forever, holding the connection's reactor.
#[test]
fn the_largest_volume_s_holes_are_walked_to_its_end() {
    let (pool, _mems) = mem_pool(TopVdevKind::Single, 1);
    let vol = pool
        .create_volume(
            "huge",
            VOLSIZE_MAX_BYTES,
            &[("volblocksize".into(), "512".into())],
        )
        .unwrap();
    for offset in [0, VOLSIZE_MAX_BYTES / 2 + 512, VOLSIZE_MAX_BYTES - 4096] {
        let runs = on(vol.block_status(offset, 4096, 16)).unwrap();
        assert_eq!(runs, [(4096, BlockState::Hole)], "at {offset}");
    }
    write(&vol, VOLSIZE_MAX_BYTES - 1024, &[7u8; 512]);
    let runs = on(vol.block_status(VOLSIZE_MAX_BYTES - 4096, 4096, 16)).unwrap();
    assert_eq!(
        runs,
        [
            (3072, BlockState::Hole),
            (512, BlockState::Data),
            (512, BlockState::Hole)
        ]
    );
    // Larger ones are refused, at creation and as a new size.
    let err = pool
        .create_volume("over", VOLSIZE_MAX_BYTES + 16384, &[])
        .unwrap_err();
    assert!(err.to_string().contains("over the largest"), "{err}");
    let err = pool
        .set_volume_prop("huge", "volsize", &(VOLSIZE_MAX_BYTES + 512).to_string())
        .unwrap_err();
    assert!(err.to_string().contains("over the largest"), "{err}");
}

/// Every other block written: the walk stops once it has the runs asked for, each whole,
/// rather than building one run per block of the range (before: a 1 GiB query of a volume
/// of 512-byte blocks built two million runs for a reply of at most 1024, or of one).
#[test]
fn the_walk_stops_at_the_runs_asked_for() {
    let (pool, _mems) = mem_pool(TopVdevKind::Single, 1);
    let vol = pool
        .create_volume("v", 1 << 20, &[("volblocksize".into(), "4096".into())])
        .unwrap();
    for b in (0..64u64).step_by(2) {
        write(&vol, b * 4096, &[1u8; 4096]);
    }
    let all = on(vol.block_status(0, 1 << 20, usize::MAX)).unwrap();
    // 32 data runs, 31 holes between them, and the hole after the last: 64 in all.
    assert_eq!(all.len(), 64, "{all:?}");
    assert_eq!(all.iter().map(|r| r.0).sum::<u64>(), 1 << 20);
    for max in [1, 2, 5] {
        let runs = on(vol.block_status(0, 1 << 20, max)).unwrap();
        assert_eq!(runs, all[..max], "at most {max}");
    }
    // Synced, the walk goes through the tree instead of the dirty blocks: the same runs.
    pool.sync().unwrap();
    assert_eq!(on(vol.block_status(0, 1 << 20, 3)).unwrap(), all[..3]);
}
