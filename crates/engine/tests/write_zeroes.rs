//! WRITE_ZEROES of ranges far larger than the pool's free space: whole blocks become holes
//! (they give space back), so such a zero must not be refused for space, nor wait as if it
//! dirtied its whole length. NBD clients send them (nbdcopy zeroes a sparse image's holes in
//! requests of any length).

mod common;

use common::*;
use oxpool_format::TopVdevKind;

const MIB: u64 = 1 << 20;

/// A 1 GiB thin volume on a 64 MiB pool: a zero over all of it (edges inside blocks) is
/// done, frees what was written, reads back as zeros with the data around it intact, and the
/// pool audits clean.
#[test]
fn a_zero_larger_than_the_pool_is_done_and_frees_space() {
    let (pool, _mems) = mem_pool(TopVdevKind::Single, 1);
    let vol = pool.create_volume("v", 1024 * MIB, &[]).unwrap();
    let data = content(Fill::Random, 7, (8 * MIB) as usize);
    write(&vol, 0, &data);
    write(&vol, 1000 * MIB, &data);
    pool.sync().unwrap();
    let used_before = pool.status().allocated_bytes;
    let (from, to) = (1000, 1008 * MIB - 1000);
    oxpool_io::rt::block_on(vol.write_zeroes(from, to - from, false)).unwrap();
    pool.sync().unwrap();
    pool.sync().unwrap();
    let all = read_all(&vol);
    assert_eq!(&all[..from as usize], &data[..from as usize]);
    assert!(all[from as usize..to as usize].iter().all(|&b| b == 0));
    let tail = (to - 1000 * MIB) as usize;
    assert_eq!(&all[to as usize..(1008 * MIB) as usize], &data[tail..]);
    let used_after = pool.status().allocated_bytes;
    assert!(
        used_after < used_before / 2,
        "the zero gave the space back: {used_before} -> {used_after}"
    );
    audit_clean(&pool, "after the large zero");
}

/// Zeros of every edge shape, checked against a model of the bytes: inside one block
/// (sector-aligned or not), across two blocks, whole blocks, and long runs of 512-byte
/// blocks. In debug builds the engine asserts that each zero's space charge stays within
/// what it was admitted for.
#[test]
fn zeros_of_every_edge_shape_match_a_model() {
    let (pool, _mems) = mem_pool(TopVdevKind::Single, 1);
    for bs in [512u64, 16384] {
        let name = format!("v{bs}");
        let size = 2 * MIB;
        let vol = pool
            .create_volume(&name, size, &[("volblocksize".into(), bs.to_string())])
            .unwrap();
        let mut model = content(Fill::Random, bs, size as usize);
        write(&vol, 0, &model);
        let shapes = [
            (bs + 100, 50),                                   // inside one block
            (2 * bs, 512),                                    // one sector, aligned
            (3 * bs + 512, bs.saturating_sub(1024).max(512)), // aligned sectors inside one block
            (5 * bs - 7, 14),                                 // across two blocks
            (8 * bs, 4 * bs),                                 // whole blocks
            (13 * bs + 1, 40 * bs),                           // partial, whole, partial
            (MIB / 4 + 3, MIB), // a long run (2048 blocks of 512 bytes)
        ];
        for (i, (from, len)) in shapes.into_iter().enumerate() {
            oxpool_io::rt::block_on(vol.write_zeroes(from, len, i % 2 == 0)).unwrap();
            model[from as usize..(from + len) as usize].fill(0);
            assert!(
                read_all(&vol) == model,
                "bs {bs}, shape {i}: ({from}, {len})"
            );
        }
        pool.sync().unwrap();
        assert!(read_all(&vol) == model, "bs {bs}: after the sync");
    }
    audit_clean(&pool, "after zeros of every shape");
}
