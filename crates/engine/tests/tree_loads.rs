//! Concurrent lookups that miss the same indirect block share one read of it: a large read on
//! a cold tree reads each level-1 block from the device once, not once per data block under
//! it (which made a 1 MiB read cost 2.9 device bytes per byte served).

mod common;

use common::{pattern, test_props};
use oxpool_engine::{Pool, TopSpec};
use oxpool_format::TopVdevKind;
use oxpool_io::rt::block_on;
use oxpool_io::{Backend, FileBackend};
use std::sync::Arc;

const DEVICE_BYTES: u64 = 256 << 20;
const VOLUME_BYTES: u64 = 8 << 20;
const BLOCK_BYTES: u64 = 16 * 1024;

fn open_pool(path: &std::path::Path, create: bool) -> Pool {
    // A file device: its reads complete later, so the lookups of one read overlap.
    let device: Arc<dyn Backend> = Arc::new(FileBackend::open(path, Some(DEVICE_BYTES)).unwrap());
    if create {
        let tops = vec![TopSpec {
            log: false,
            kind: TopVdevKind::Single,
            devices: vec![device],
        }];
        Pool::create("tank", tops, test_props(), false).unwrap()
    } else {
        Pool::import(vec![device], Some("tank")).unwrap()
    }
}

#[test]
fn a_cold_read_loads_each_indirect_block_once() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dev0");
    let data = pattern(11, VOLUME_BYTES as usize);
    {
        let pool = open_pool(&path, true);
        let v = pool
            .create_volume("v", VOLUME_BYTES, &[("volblocksize".into(), "16K".into())])
            .unwrap();
        block_on(v.write(0, &data, false)).unwrap();
        drop(v);
        pool.export().unwrap();
    }
    // Imported anew: no indirect block and no data block is cached.
    let pool = open_pool(&path, false);
    let v = pool.volume("v").unwrap();
    let before = pool.counters().device_stats()[0].io.read;
    // 2 MiB reads: 128 data blocks each, looked up at once, all under one level-1 block.
    let mut got = vec![0u8; VOLUME_BYTES as usize];
    for (i, chunk) in got.chunks_mut(2 << 20).enumerate() {
        block_on(v.read(i as u64 * (2 << 20), chunk)).unwrap();
    }
    assert!(got == data, "the read returned wrong bytes");
    let reads = pool.counters().device_stats()[0].io.read.since(&before);
    let blocks = VOLUME_BYTES / BLOCK_BYTES;
    // 512 data blocks, 3 level-1 blocks (255 pointers each) and the top one: a few over 512.
    // With every lookup reading its level-1 block itself, about twice as many.
    assert!(
        reads.ops <= blocks + 16,
        "{} device reads for {blocks} data blocks: indirect blocks read more than once",
        reads.ops
    );
    drop(v);
    pool.export().unwrap();
}
