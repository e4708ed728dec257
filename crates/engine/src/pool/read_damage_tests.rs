//! Unit tests of what a volume read records as damaged (`oxpool status -v`) when no copy of a
//! block gives it back: a lost level-1 block names exactly the blocks below it, a lost data
//! block names itself. They need a whole pool (the pool layer is above the volume's).

use crate::props::PoolProps;
use crate::spa::errlog::DamagedRange;
use crate::{Pool, TopSpec};
use oxpool_format::{BlockPtr, DATA_START_BYTES};
use oxpool_io::rt::block_on;
use oxpool_io::{Backend, MemoryBackend};
use std::sync::Arc;

const BS: u64 = 16 << 10;
const FANOUT: u64 = oxpool_format::INDIRECT_FANOUT as u64;

/// Damages every copy of the block `bp` points to on `mem`.
fn damage(mem: &MemoryBackend, bp: &BlockPtr) {
    for dva in &bp.dvas[..usize::from(bp.ndvas)] {
        mem.corrupt(DATA_START_BYTES + dva.offset_bytes, 64, 7);
    }
}

#[test]
fn a_read_that_loses_a_level_1_block_names_exactly_the_blocks_below_it() {
    let mut props = PoolProps::default();
    props.set("txg_timeout", "3600").unwrap();
    props.set("data_cache_max", "0").unwrap();
    let mem = MemoryBackend::new("d0", 64 << 20);
    let dev: Arc<dyn Backend> = Arc::new(mem.clone());
    let pool = Pool::create("tank", vec![TopSpec::single(dev)], props, false).unwrap();
    // Three level-1 blocks: 0-254, 255-509, 510-511.
    let blocks = 2 * FANOUT + 2;
    let vol = pool
        .create_volume(
            "v",
            blocks * BS,
            &[
                ("compression".to_string(), "off".to_string()),
                ("volblocksize".to_string(), "16K".to_string()),
            ],
        )
        .unwrap();
    let data: Vec<u8> = (0..blocks * BS).map(|i| (i * 7 + i / 4096) as u8).collect();
    block_on(vol.write(0, &data, false)).unwrap();
    pool.sync().unwrap();
    let tree = &vol.vol.data().tree;
    let l1 = tree.lock().unwrap().pointer_to_block(1, 1).unwrap();
    assert_eq!(l1.level, 1);
    damage(&mem, &l1);
    // Read from the device, not from the tree's cache.
    tree.lock().unwrap().evict(0);
    let mut buf = vec![0u8; BS as usize];
    assert!(block_on(vol.read((FANOUT + 45) * BS, &mut buf)).is_err());
    let record = pool.error_record();
    let (ranges, unnamed) = (record.damaged, record.damaged_unnamed);
    assert_eq!(unnamed, 0);
    assert_eq!(
        ranges,
        vec![DamagedRange {
            dataset: "tank/v".into(),
            offset_bytes: FANOUT * BS,
            length_bytes: FANOUT * BS,
        }]
    );
    // A data block under a level-1 block that reads: that block alone.
    let data_bp = block_on(vol.block_pointer(3)).unwrap();
    damage(&mem, &data_bp);
    assert!(block_on(vol.read(3 * BS, &mut buf)).is_err());
    let ranges = pool.error_record().damaged;
    assert_eq!(
        ranges[0],
        DamagedRange {
            dataset: "tank/v".into(),
            offset_bytes: 3 * BS,
            length_bytes: BS,
        }
    );
}
