//! Unit test of the places a self-heal rewrites (`HealGuard`): while the heal lives, the sync
//! does not release their deferred frees, however many txgs pass, so the place cannot be
//! reused under the rewrite. It needs a whole pool (the guard is the pool's, the block a
//! volume's).

use crate::props::PoolProps;
use crate::vdev::alloc::DEFER_TXGS;
use crate::zio::HealGuard;
use crate::{Pool, TopSpec};
use oxpool_io::rt::block_on;
use oxpool_io::{Backend, MemoryBackend};
use std::sync::Arc;

#[test]
fn a_place_being_healed_is_not_released_until_the_heal_ends() {
    let mut props = PoolProps::default();
    props.set("txg_timeout", "3600").unwrap();
    let dev: Arc<dyn Backend> = Arc::new(MemoryBackend::new("d0", 64 << 20));
    let pool = Pool::create("tank", vec![TopSpec::single(dev)], props, false).unwrap();
    let vol = pool
        .create_volume("v", 1 << 20, &[("compression".into(), "off".into())])
        .unwrap();
    let bs = vol.block_size_bytes() as usize;
    block_on(vol.write(0, &vec![1u8; bs], false)).unwrap();
    pool.sync().unwrap();
    let old = block_on(vol.block_pointer(0)).unwrap();
    let dva = old.dvas()[0];
    // The level-1 block above it, freed in the same txg when the block is replaced.
    let old_l1 = vol
        .vol
        .data()
        .tree
        .lock()
        .unwrap()
        .pointer_to_block(1, 0)
        .unwrap();
    let is_allocated = |d: &oxpool_format::Dva| {
        let s = pool.spa.state.lock().unwrap();
        s.alloc.map(d.vdev).is_allocated(d)
    };
    let allocated = || is_allocated(&dva);
    let guard = HealGuard::new(&pool.spa.zio, old.dvas()).unwrap();
    // The block is replaced: its old place is freed, deferred, and past the deferral.
    block_on(vol.write(0, &vec![2u8; bs], false)).unwrap();
    for _ in 0..DEFER_TXGS + 3 {
        pool.sync().unwrap();
    }
    assert!(allocated(), "a place being healed was released");
    // Only that place waits: the other frees of its txg are released.
    assert!(
        old_l1.dvas().iter().all(|d| !is_allocated(d)),
        "a heal held back the other frees of its txg"
    );
    drop(guard);
    for _ in 0..DEFER_TXGS + 2 {
        pool.sync().unwrap();
    }
    assert!(!allocated(), "the place stayed allocated after the heal");
    assert!(pool.audit().unwrap().is_clean());
    drop(vol);
    pool.export().unwrap();
}
