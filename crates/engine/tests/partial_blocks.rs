//! Partial-block writes (sector-aligned writes to part of a block, merged by the txg sync):
//! what happens when the sync cannot read the old block, and readers racing the sync.
//! (Found by review of the change that introduced them.)

mod common;

use common::{pattern, test_props};
use oxpool_engine::{Pool, TopSpec};
use oxpool_format::TopVdevKind;
use oxpool_io::rt::block_on;
use oxpool_io::{Backend, FaultBackend, MemoryBackend};
use std::sync::Arc;

const BS: usize = 16 * 1024;

fn flaky_pool(mem: &MemoryBackend) -> (Pool, Arc<FaultBackend>) {
    let flaky = Arc::new(FaultBackend::new(Arc::new(mem.clone()), 5));
    let pool = common::single_device_pool(flaky.clone(), test_props());
    (pool, flaky)
}

/// A passing fault while the sync reads the old block (bits flipped on the way from the
/// device on half the reads; the media is fine) is retried: every byte the client did not
/// overwrite keeps its value.
#[test]
fn passing_read_fault_during_merge_loses_nothing() {
    let mem = MemoryBackend::new("mem0", common::DEVICE_BYTES);
    let (pool, flaky) = flaky_pool(&mem);
    let v = pool.create_volume("v", 1 << 20, &[]).unwrap();
    // Eight blocks, so that some first reads fail whatever the seed draws.
    let old = pattern(11, 8 * BS);
    block_on(v.write(0, &old, false)).unwrap();
    pool.sync().unwrap();
    // Every read goes to the device.
    pool.set_prop("data_cache_max", "0").unwrap();
    let new = pattern(12, 512);
    for b in 0..8 {
        block_on(v.write((b * BS) as u64, &new, false)).unwrap();
    }
    let flips_before = flaky.stats().reads_bit_flipped;
    flaky.set_read_bit_flip_probability(0.5);
    pool.sync().unwrap();
    flaky.set_read_bit_flip_probability(0.0);
    assert!(
        flaky.stats().reads_bit_flipped > flips_before,
        "no fault was injected"
    );
    let mut got = vec![0u8; 8 * BS];
    block_on(v.read(0, &mut got)).unwrap();
    for b in 0..8 {
        let blk = &got[b * BS..(b + 1) * BS];
        assert_eq!(&blk[..512], &new[..], "block {b}: the written sector");
        assert!(
            blk[512..] == old[b * BS + 512..(b + 1) * BS],
            "block {b}: bytes the client did not write changed"
        );
    }
}

/// A lasting read error on the old block fails the txg sync (the pool suspends, as for any
/// read the sync needs), and nothing acknowledged is lost: the FUA write is in the intent log
/// and an import on the healthy device replays it over the old block.
#[test]
fn lasting_read_error_during_merge_suspends_and_loses_nothing() {
    let mem = MemoryBackend::new("mem0", common::DEVICE_BYTES);
    let (pool, flaky) = flaky_pool(&mem);
    let v = pool.create_volume("v", 1 << 20, &[]).unwrap();
    let old = pattern(1, BS);
    block_on(v.write(0, &old, false)).unwrap();
    // The log's first commit anchors its chain through a txg sync: done here, before.
    block_on(v.write(BS as u64, &old, true)).unwrap();
    pool.sync().unwrap();
    pool.set_prop("data_cache_max", "0").unwrap();
    let new = pattern(2, 512);
    block_on(v.write(0, &new, true)).unwrap(); // FUA: durable through the log
    flaky.set_read_error_probability(1.0);
    let synced = pool.sync();
    assert!(synced.is_err(), "the sync could not read the old block");
    drop(v);
    drop(pool); // as a crash: no export
    let pool = common::reimport(&[mem]);
    let mut got = vec![0u8; BS];
    block_on(pool.volume("v").unwrap().read(0, &mut got)).unwrap();
    assert_eq!(&got[..512], &new[..]);
    assert!(got[512..] == old[512..], "old bytes lost");
    common::audit_clean(&pool, "after the suspended sync, the crash and the replay");
    pool.export().unwrap();
}

/// An old block with no good copy left (every copy damaged on the media): its sectors were
/// lost before the write came. The sync still lands the write (the sectors the client wrote
/// read back, the lost ones read as zeros) and the pool keeps working; failing the sync
/// instead would suspend the pool, and the log replay of every later import would fail again.
#[test]
fn merge_over_a_lost_block_lands_the_write() {
    let mem = MemoryBackend::new("mem0", common::DEVICE_BYTES);
    let (pool, flaky) = flaky_pool(&mem);
    let v = pool.create_volume("v", 1 << 20, &[]).unwrap();
    block_on(v.write(0, &pattern(1, BS), false)).unwrap();
    pool.sync().unwrap();
    pool.set_prop("data_cache_max", "0").unwrap();
    let new = pattern(2, 1024);
    block_on(v.write(BS as u64 - 1024, &new, false)).unwrap();
    flaky.set_read_bit_flip_probability(1.0); // every read of every attempt fails
    pool.sync().unwrap();
    flaky.set_read_bit_flip_probability(0.0);
    let mut got = vec![0u8; BS];
    block_on(v.read(0, &mut got)).unwrap();
    assert!(got[..BS - 1024].iter().all(|&x| x == 0));
    assert_eq!(&got[BS - 1024..], &new[..]);
    block_on(v.write(0, &pattern(3, BS), false)).unwrap();
    pool.sync().unwrap();
    pool.export().unwrap();
}

/// A device whose first read at the armed offset blocks its thread until released.
struct GateDev {
    idx: usize,
    inner: Arc<FaultBackend>,
    gate: Arc<Gate>,
}

#[derive(Default)]
struct Gate {
    /// (armed offset, device that entered, released)
    state: std::sync::Mutex<(Option<u64>, Option<usize>, bool)>,
    cv: std::sync::Condvar,
}

impl Backend for GateDev {
    fn name(&self) -> &str {
        self.inner.name()
    }
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
    fn read(
        &self,
        offset_bytes: u64,
        buf: oxpool_io::IoBuf,
    ) -> oxpool_io::IoFuture<oxpool_io::IoBuf> {
        let mut s = self.gate.state.lock().unwrap();
        if s.0 == Some(offset_bytes) {
            s.0 = None;
            s.1 = Some(self.idx);
            self.gate.cv.notify_all();
            while !s.2 {
                s = self.gate.cv.wait(s).unwrap();
            }
        }
        drop(s);
        self.inner.read(offset_bytes, buf)
    }
    fn write(
        &self,
        offset_bytes: u64,
        buf: oxpool_io::IoBuf,
    ) -> oxpool_io::IoFuture<oxpool_io::IoBuf> {
        self.inner.write(offset_bytes, buf)
    }
    fn write_durable(
        &self,
        offset_bytes: u64,
        buf: oxpool_io::IoBuf,
    ) -> oxpool_io::IoFuture<oxpool_io::IoBuf> {
        self.inner.write_durable(offset_bytes, buf)
    }
    fn flush(&self) -> oxpool_io::IoFuture<()> {
        self.inner.flush()
    }
    fn discard(&self, offset_bytes: u64, length_bytes: u64) -> oxpool_io::IoFuture<()> {
        self.inner.discard(offset_bytes, length_bytes)
    }
}

fn raw(mem: &MemoryBackend, off: u64, len: usize) -> Vec<u8> {
    block_on(mem.read(off, oxpool_io::IoBuf::zeroed(len)))
        .unwrap()
        .to_vec()
}

/// A read of a partial block of a syncing txg reads the rest from the block's old place,
/// which the sync frees (reusable `DEFER_TXGS` txgs later). A reader slower than that reads a
/// place reused by a newer block; when the mirror side it tries first holds the new block and
/// the other side still holds the old one (it missed the new block's write: a degraded
/// mirror), healing the first side with the old block would destroy the only good copy of
/// the new one. Readers heal only a block that is still current.
#[test]
fn stale_reader_heals_old_content_over_a_reused_place() {
    let mems: Vec<MemoryBackend> = (0..2)
        .map(|i| MemoryBackend::new(&format!("mem{i}"), 32 << 20))
        .collect();
    let faults: Vec<Arc<FaultBackend>> = mems
        .iter()
        .enumerate()
        .map(|(i, m)| Arc::new(FaultBackend::new(Arc::new(m.clone()), i as u64 + 1)))
        .collect();
    let gate = Arc::new(Gate::default());
    let devices: Vec<Arc<dyn Backend>> = faults
        .iter()
        .enumerate()
        .map(|(idx, f)| {
            Arc::new(GateDev {
                idx,
                inner: f.clone(),
                gate: gate.clone(),
            }) as Arc<dyn Backend>
        })
        .collect();
    let pool = Pool::create(
        "tank",
        vec![TopSpec {
            log: false,
            kind: TopVdevKind::Mirror,
            devices,
        }],
        test_props(),
        false,
    )
    .unwrap();
    pool.set_prop("data_cache_max", "0").unwrap();
    let v = pool.create_volume("v", 1 << 20, &[]).unwrap();
    let big = pool.create_volume("big", 4 << 20, &[]).unwrap();
    let old = pattern(21, BS);
    block_on(v.write(0, &old, false)).unwrap();
    pool.sync().unwrap();
    // Block 0's place (the same on both sides).
    let size = mems[0].size_bytes();
    let mut places = Vec::new();
    let mut off = 0;
    while off + BS as u64 <= size {
        let len = (1u64 << 20).min(size - off) as usize;
        let chunk = raw(&mems[0], off, len);
        for s in (0..chunk.len() - BS + 1).step_by(512) {
            if chunk[s..s + BS] == old[..] {
                places.push(off + s as u64);
            }
        }
        off += (1 << 20) - BS as u64;
    }
    places.dedup();
    assert_eq!(places.len(), 1, "copies found at {places:?}");
    let x = places[0];

    // A Partial block in the open txg; a reader of another sector of it stalls on X.
    block_on(v.write(0, &pattern(22, 512), false)).unwrap();
    gate.state.lock().unwrap().0 = Some(x);
    let reader = {
        let v = v.clone();
        std::thread::spawn(move || {
            let mut out = vec![0u8; 512];
            let r = block_on(v.read(512, &mut out));
            (r, out)
        })
    };
    let first = {
        let s = gate.state.lock().unwrap();
        let (s, _) = gate
            .cv
            .wait_timeout_while(s, std::time::Duration::from_secs(5), |s| s.1.is_none())
            .unwrap();
        s.1
    };
    let Some(first) = first else {
        // The reader never read the old place (the behaviour before 9d05725).
        let (r, out) = reader.join().unwrap();
        r.unwrap();
        assert_eq!(&out[..], &old[512..1024]);
        return;
    };
    let other = 1 - first;
    pool.sync().unwrap(); // merges block 0 into a new place; X is freed (deferred)

    // Fill most of the pool: while empty slabs are plentiful the sync places blocks in them
    // (adjacent, for aggregated writes) and leaves freed places like X alone; with few left
    // (here about the slop and reserve of this 32 MiB pool, ~6 MiB) it reuses freed places of
    // the block's size, X among them. 20 MiB of filler leaves fewer than that.
    // The other side misses writes from now on (degraded mirror), so that whenever X is
    // reused (while filling, or after) the other side still holds the old block there.
    faults[other].set_write_error_probability(1.0);
    const FILLER_BYTES: u64 = 20 << 20;
    let filler = pool.create_volume("filler", FILLER_BYTES, &[]).unwrap();
    for at in (0..FILLER_BYTES).step_by(1 << 20) {
        block_on(filler.write(at, &pattern(23 + at, 1 << 20), false)).unwrap();
        pool.sync().unwrap();
    }

    // The pool goes on, and syncs until X holds a new, committed block.
    let mut model = vec![0u8; 4 << 20];
    let mut staged = false;
    for round in 0..20_000u64 {
        // Scattered over `big`, so its slabs seldom empty out whole: empty slabs run out,
        // and freed places get reused.
        let at = ((round.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56) * BS as u64) as usize;
        let data = pattern(1000 + round, BS);
        block_on(big.write(at as u64, &data, false)).unwrap();
        model[at..at + data.len()].copy_from_slice(&data);
        pool.sync().unwrap();
        // Until X holds a newer committed block (client data or metadata: the allocator
        // decides; either is what a stale heal must not overwrite).
        let now = raw(&mems[first], x, BS);
        if now != old {
            let client =
                (0..=(data.len() - BS) / 512).any(|k| now[..] == data[k * 512..k * 512 + BS]);
            eprintln!("X reused after {round} rounds (client data: {client})");
            staged = true;
            break;
        }
    }
    assert!(staged, "X never reused");
    assert!(raw(&mems[other], x, BS) == old);
    let before_heal = raw(&mems[first], x, BS);

    gate.state.lock().unwrap().2 = true;
    gate.cv.notify_all();
    let (r, out) = reader.join().unwrap();
    r.unwrap();
    assert_eq!(&out[..], &old[512..1024]);
    let after = raw(&mems[first], x, BS);
    faults[other].set_write_error_probability(0.0);
    let mut got = vec![0u8; 4 << 20];
    let read = block_on(big.read(0, &mut got));
    assert!(
        after == before_heal && read.is_ok() && got == model,
        "the stale reader rewrote X on side {first} with {}; volume 'big' now reads: {}",
        if after == old {
            "the old block"
        } else {
            "something else"
        },
        match &read {
            Err(e) => format!("{e}"),
            Ok(()) if got != model => "wrong data".to_string(),
            Ok(()) => "ok".to_string(),
        }
    );
}

/// The sync merges partial blocks with a window of reads in flight, not a whole batch (256)
/// at once: a device queue that deep holds every other I/O behind it, the intent log's
/// writes included. Every merged block still reads back right.
#[test]
fn merge_reads_stay_within_their_window() {
    // `dmu::sync::MERGE_READS_IN_FLIGHT_MAX`.
    const WINDOW: u64 = 32;
    const BLOCKS: usize = 300;
    let mem = MemoryBackend::new("mem0", common::DEVICE_BYTES);
    let (pool, slow) = flaky_pool(&mem);
    let v = pool.create_volume("v", (BLOCKS * BS) as u64, &[]).unwrap();
    let old = pattern(21, BLOCKS * BS);
    block_on(v.write(0, &old, false)).unwrap();
    pool.sync().unwrap();
    // Every merge reads the device, and each read takes long enough to overlap the others.
    pool.set_prop("data_cache_max", "0").unwrap();
    slow.set_read_latency(std::time::Duration::from_millis(2));
    let new = pattern(22, 512);
    for b in 0..BLOCKS {
        block_on(v.write((b * BS + 1024) as u64, &new, false)).unwrap();
    }
    pool.sync().unwrap();
    let most = slow.stats().reads_in_flight_max;
    assert!(
        (2..=WINDOW).contains(&most),
        "{most} reads in flight at once: want some overlap and at most {WINDOW}"
    );
    slow.set_read_latency(std::time::Duration::ZERO);
    let mut got = vec![0u8; BLOCKS * BS];
    block_on(v.read(0, &mut got)).unwrap();
    let mut want = old;
    for b in 0..BLOCKS {
        want[b * BS + 1024..b * BS + 1536].copy_from_slice(&new);
    }
    assert!(got == want, "a merged block reads back wrong");
}

/// The merge of a partial block takes the old block's cached copy as the new block only if
/// nothing else reads it: a block a snapshot keeps stays cached for the snapshot's readers
/// (a reviewer's finding: the merge took it, and the snapshot's next read went to the disk).
#[test]
fn a_merge_leaves_a_snapshots_block_in_the_cache() {
    let mem = MemoryBackend::new("mem0", common::DEVICE_BYTES);
    let pool = common::single_device_pool(Arc::new(mem), test_props());
    let v = pool
        .create_volume("v", 1 << 20, &[("compression".into(), "off".into())])
        .unwrap();
    let old = pattern(21, 2 * BS);
    block_on(v.write(0, &old, false)).unwrap();
    pool.sync().unwrap();
    pool.snapshot(&["v@s".to_string()]).unwrap();
    // The snapshot read once: its pointers and both blocks are cached.
    let snap = pool.snapshot_volume("v", "s").unwrap();
    let mut got = vec![0u8; 2 * BS];
    block_on(snap.read(0, &mut got)).unwrap();
    // Partial writes into both blocks of the head, then the sync merges them.
    let new = pattern(22, 512);
    block_on(v.write(0, &new, false)).unwrap();
    block_on(v.write(BS as u64, &new, false)).unwrap();
    pool.sync().unwrap();
    let misses = || pool.counters().data_cache_stats().misses;
    let before = misses();
    block_on(snap.read(0, &mut got)).unwrap();
    assert!(got == old, "the snapshot changed");
    assert_eq!(
        misses() - before,
        0,
        "the snapshot's blocks left the cache with the merge"
    );
    // The head has the merged blocks.
    block_on(v.read(0, &mut got)).unwrap();
    for b in 0..2 {
        let blk = &got[b * BS..(b + 1) * BS];
        assert_eq!(&blk[..512], &new[..], "block {b}");
        assert!(blk[512..] == old[b * BS + 512..(b + 1) * BS], "block {b}");
    }
}
