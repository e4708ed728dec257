//! The txg sync aggregates adjacent block writes: the blocks of a txg get adjacent places
//! (next-fit, in block order), and each batch of them reaches the device as a few vectored
//! writes, not one write per block; the data is the same as block-by-block writes give.

mod common;

use common::{mem_pool, pattern, reimport};
use oxpool_format::TopVdevKind;
use oxpool_io::rt::block_on;

const VOLUME_BYTES: u64 = 8 << 20;
const BLOCK_BYTES: u64 = 16 * 1024;

#[test]
fn a_txg_writes_adjacent_blocks_as_few_large_writes() {
    let (pool, mems) = mem_pool(TopVdevKind::Single, 1);
    let v = pool
        .create_volume("v", VOLUME_BYTES, &[("volblocksize".into(), "16K".into())])
        .unwrap();
    pool.sync().unwrap();
    let before = pool.counters().device_stats()[0].io.write;
    let data = pattern(5, VOLUME_BYTES as usize);
    block_on(v.write(0, &data, false)).unwrap();
    pool.sync().unwrap();
    let writes = pool.counters().device_stats()[0].io.write.since(&before);
    let blocks = VOLUME_BYTES / BLOCK_BYTES;
    assert!(writes.bytes >= VOLUME_BYTES, "{writes:?}");
    // 512 data blocks and their indirect blocks (two copies) and space maps: block by block
    // that is over 512 writes; aggregated (1 MiB each) a few dozen at most.
    assert!(
        writes.ops * 8 < blocks,
        "{} device writes for {blocks} blocks: not aggregated",
        writes.ops
    );
    drop(v);
    pool.export().unwrap();
    let pool = reimport(&mems);
    let v = pool.volume("v").unwrap();
    let mut got = vec![0u8; VOLUME_BYTES as usize];
    block_on(v.read(0, &mut got)).unwrap();
    assert!(got == data, "aggregated writes put wrong bytes somewhere");
}
