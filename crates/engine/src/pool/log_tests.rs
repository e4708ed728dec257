//! Unit tests of the intent log that need a whole pool (the pool layer is above the log's).

use crate::props::PoolProps;
use crate::{Pool, TopSpec};
use oxpool_format::Txg;
use oxpool_io::rt::block_on;
use oxpool_io::{Backend, MemoryBackend};
use std::sync::Arc;

/// A build that finds the chain restarted (no place, or one whose anchoring txg has not
/// synced) writes no block: a block there would be answered as durable and never found
/// by import. Its records wait for the txg instead. (A serial commit could reach its
/// build after a restart: its checks and its build take the log's lock separately.)
#[test]
fn a_build_writes_no_block_at_an_unanchored_place() {
    let mut props = PoolProps::default();
    props.set("txg_timeout", "3600").unwrap();
    let dev: Arc<dyn Backend> = Arc::new(MemoryBackend::new("d0", 64 << 20));
    let pool = Pool::create("tank", vec![TopSpec::single(dev)], props, false).unwrap();
    let vol = pool.create_volume("v", 8 << 20, &[]).unwrap();
    block_on(vol.write(0, &[1u8; 4096], true)).unwrap();
    let zil = &vol.vol.zil;
    let blocks_before = vol
        .pool
        .log_counters
        .blocks_written
        .load(std::sync::atomic::Ordering::Relaxed);
    for unanchored in ["restarted", "anchor not synced"] {
        {
            let mut s = zil.state.lock().unwrap();
            match unanchored {
                "restarted" => {
                    // As a restart does: the place goes to the next sync's frees.
                    let (addr, _) = s.next_addr.take().unwrap();
                    s.to_free.push(addr);
                }
                _ => s.anchor_txg = Txg(vol.pool.txg.synced().0 + 1),
            }
        }
        block_on(async {
            // Not through `write`: its commit would see the restart and anchor first.
            let target = zil.append(
                Txg(vol.pool.txg.synced().0 + 1),
                crate::zil::ItxKind::Free {
                    offset_bytes: 0,
                    length_bytes: 4096,
                },
            );
            zil.state.lock().unwrap().building = true;
            let (closed, r) = vol.zil_build_upto(Some(target)).await;
            zil.state.lock().unwrap().building = false;
            assert!(closed.is_empty(), "{unanchored}: a block was closed");
            assert!(r.is_err(), "{unanchored}: the build succeeded");
            let s = zil.state.lock().unwrap();
            assert!(s.needs_txg(target), "{unanchored}: no fallback to the txg");
            assert!(s.durable_itx <= target);
        });
        assert_eq!(
            vol.pool
                .log_counters
                .blocks_written
                .load(std::sync::atomic::Ordering::Relaxed),
            blocks_before
        );
        // The txg makes the records durable and restarts the log; it works again.
        pool.sync().unwrap();
        block_on(vol.write(4096, &[2u8; 4096], true)).unwrap();
        pool.sync().unwrap();
    }
    let mut got = vec![0u8; 8192];
    block_on(vol.read(0, &mut got)).unwrap();
    assert!(got[..4096].iter().all(|&b| b == 1) && got[4096..].iter().all(|&b| b == 2));
    drop(vol);
    let report = pool.audit().unwrap();
    assert!(report.is_clean(), "{:?}", report.problems);
    pool.export().unwrap();
}
