//! FaultBackend: injected errors, bit flips, latency, crashes and power loss.

use std::sync::Arc;
use std::time::Duration;

use oxpool_io::rt::{block_on, join_all};
use oxpool_io::{Backend, FaultBackend, FileBackend, IoBuf, MemoryBackend};

const EIO: i32 = 5;

fn pattern(len: usize, seed: u8) -> IoBuf {
    let data: Vec<u8> = (0..len)
        .map(|i| (i as u8).wrapping_mul(13).wrapping_add(seed) | 1)
        .collect();
    IoBuf::from_slice(&data)
}

fn read(dev: &dyn Backend, offset: u64, len: usize) -> IoBuf {
    block_on(dev.read(offset, IoBuf::zeroed(len))).unwrap()
}

fn wrap(size_bytes: u64, seed: u64) -> (MemoryBackend, FaultBackend) {
    let mem = MemoryBackend::new("mem", size_bytes);
    let fault = FaultBackend::new(Arc::new(mem.clone()), seed);
    (mem, fault)
}

#[test]
fn passes_through_without_faults() {
    let (mem, fault) = wrap(1 << 20, 1);
    block_on(fault.write(4096, pattern(8192, 1))).unwrap();
    block_on(fault.flush()).unwrap();
    assert_eq!(read(&fault, 4096, 8192), pattern(8192, 1));
    assert_eq!(read(&mem, 4096, 8192), pattern(8192, 1));
    block_on(fault.discard(4096, 4096)).unwrap();
    assert_eq!(fault.size_bytes(), 1 << 20);
    assert_eq!(fault.name(), "mem");
    let stats = fault.stats();
    assert_eq!(
        (stats.reads, stats.writes, stats.flushes, stats.discards),
        (1, 1, 1, 1)
    );
}

#[test]
fn injected_errors() {
    let (mem, fault) = wrap(1 << 20, 2);
    fault.set_read_error_probability(1.0);
    let err = block_on(fault.read(0, IoBuf::zeroed(512))).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(EIO));
    fault.set_read_error_probability(0.0);
    fault.set_write_error_probability(1.0);
    let err = block_on(fault.write(0, pattern(512, 2))).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(EIO));
    assert!(
        read(&mem, 0, 512).iter().all(|&b| b == 0),
        "failed write left no data"
    );

    fault.set_write_error_probability(0.0);
    fault.set_read_error_probability(0.3);
    let results: Vec<_> = (0..1000)
        .map(|_| block_on(fault.read(0, IoBuf::zeroed(512))))
        .collect();
    let failed = results.iter().filter(|r| r.is_err()).count() as u64;
    assert!(failed > 0 && failed < 1000, "failed {failed}");
    let stats = fault.stats();
    assert_eq!(stats.read_errors_injected, failed + 1);
    assert_eq!(stats.write_errors_injected, 1);
}

#[test]
fn bit_flips_touch_returned_data_only() {
    let (mem, fault) = wrap(1 << 20, 3);
    block_on(fault.write(0, pattern(4096, 3))).unwrap();
    fault.set_read_bit_flip_probability(1.0);
    for _ in 0..50 {
        let back = read(&fault, 0, 4096);
        let flipped: u32 = back
            .iter()
            .zip(pattern(4096, 3).iter())
            .map(|(a, b)| (a ^ b).count_ones())
            .sum();
        assert!((1..=8).contains(&flipped), "flipped {flipped}");
    }
    assert_eq!(read(&mem, 0, 4096), pattern(4096, 3));
    let stats = fault.stats();
    assert_eq!(stats.reads_bit_flipped, 50);
    assert!(stats.bits_flipped >= 50 && stats.bits_flipped <= 400);
}

#[test]
fn latency_is_added_through_the_ring() {
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let file = FileBackend::open(&dir.path().join("slow"), Some(1 << 20)).unwrap();
    let fault = FaultBackend::new(Arc::new(file), 4);
    fault.set_latency(Duration::from_millis(2));
    let writes: Vec<_> = (0..32)
        .map(|i| fault.write(i * 4096, pattern(4096, i as u8)))
        .collect();
    for r in block_on(join_all(writes)) {
        r.unwrap();
    }
    block_on(fault.flush()).unwrap();
    for i in 0..32 {
        assert_eq!(read(&fault, i * 4096, 4096), pattern(4096, i as u8));
    }
}

#[test]
fn crash_after_ops_kills_the_device() {
    let (_mem, fault) = wrap(1 << 20, 5);
    fault.crash_after_ops(3);
    block_on(fault.write(0, pattern(512, 1))).unwrap();
    read(&fault, 0, 512);
    block_on(fault.flush()).unwrap();
    assert!(!fault.is_dead());
    let err = block_on(fault.read(0, IoBuf::zeroed(512))).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(EIO));
    assert!(fault.is_dead());
    assert!(block_on(fault.write(0, pattern(512, 2))).is_err());
    assert!(block_on(fault.flush()).is_err());
    assert!(block_on(fault.discard(0, 512)).is_err());
    assert_eq!(fault.stats().ops_failed_after_power_loss, 4);
    fault.revive();
    read(&fault, 0, 512);
}

#[test]
fn unflushed_writes_are_volatile_and_visible() {
    let (mem, fault) = wrap(1 << 20, 6);
    fault.enable_power_loss();
    block_on(fault.write(0, pattern(4096, 1))).unwrap();
    // Reads see the overlay, the device does not have it yet.
    assert_eq!(read(&fault, 0, 4096), pattern(4096, 1));
    assert!(read(&mem, 0, 4096).iter().all(|&b| b == 0));
    // A partially overlapping read is patched correctly.
    let partial = read(&fault, 2048, 4096);
    assert_eq!(&partial[..2048], &pattern(4096, 1)[2048..]);
    assert!(partial[2048..].iter().all(|&b| b == 0));
    assert_eq!(fault.stats().volatile_writes, 1);
    block_on(fault.flush()).unwrap();
    assert_eq!(read(&mem, 0, 4096), pattern(4096, 1));
    assert_eq!(fault.stats().volatile_writes, 0);
    assert_eq!(fault.stats().flushes_applied, 1);
}

#[test]
fn later_write_wins_in_overlay_and_after_flush() {
    let (mem, fault) = wrap(1 << 20, 7);
    fault.enable_power_loss();
    block_on(fault.write(0, pattern(8192, 1))).unwrap();
    block_on(fault.write(4096, pattern(8192, 2))).unwrap();
    let mut want = pattern(12288, 0).to_vec();
    want[..8192].copy_from_slice(&pattern(8192, 1));
    want[4096..].copy_from_slice(&pattern(8192, 2));
    assert_eq!(&read(&fault, 0, 12288)[..], &want[..]);
    block_on(fault.flush()).unwrap();
    assert_eq!(&read(&mem, 0, 12288)[..], &want[..]);
}

#[test]
fn flush_covers_only_writes_completed_before_it_was_issued() {
    let (mem, fault) = wrap(1 << 20, 8);
    fault.enable_power_loss();
    block_on(fault.write(0, pattern(4096, 1))).unwrap();
    let flush = fault.flush();
    // Completes after the flush was issued: not covered by it.
    block_on(fault.write(8192, pattern(4096, 2))).unwrap();
    block_on(flush).unwrap();
    assert_eq!(read(&mem, 0, 4096), pattern(4096, 1));
    assert!(read(&mem, 8192, 4096).iter().all(|&b| b == 0));
    assert_eq!(fault.stats().volatile_writes, 1);
}

/// Writes one flushed block and several volatile ones, crashes, applies the power loss.
fn crash_scenario(seed: u64) -> (MemoryBackend, oxpool_io::PowerLossReport) {
    let (mem, fault) = wrap(1 << 20, 100);
    fault.enable_power_loss();
    block_on(fault.write(0, pattern(16384, 1))).unwrap();
    block_on(fault.flush()).unwrap();
    for i in 1..=8u64 {
        block_on(fault.write(i * 65536, pattern(16384, i as u8 + 1))).unwrap();
    }
    fault.crash_after_ops(0);
    assert!(block_on(fault.read(0, IoBuf::zeroed(512))).is_err());
    let report = fault.apply_power_loss(seed);
    (mem, report)
}

#[test]
fn power_loss_keeps_flushed_drops_or_tears_the_rest() {
    let mut totals = oxpool_io::PowerLossReport::default();
    for seed in 0..50 {
        let (mem, report) = crash_scenario(seed);
        assert_eq!(report.dropped + report.kept + report.torn, 8);
        totals.dropped += report.dropped;
        totals.kept += report.kept;
        totals.torn += report.torn;
        // The flushed write always survives.
        assert_eq!(read(&mem, 0, 16384), pattern(16384, 1), "seed {seed}");
        let (mut dropped, mut kept, mut torn) = (0, 0, 0);
        for i in 1..=8u64 {
            let got = read(&mem, i * 65536, 16384);
            let want = pattern(16384, i as u8 + 1);
            // Survivors are a sector-aligned prefix of the write (whole, none, or torn).
            let prefix = got
                .iter()
                .zip(want.iter())
                .take_while(|(a, b)| a == b)
                .count();
            let prefix_sectors = prefix / 512 * 512;
            assert!(
                got[prefix_sectors..].iter().all(|&b| b == 0),
                "seed {seed} write {i}"
            );
            match prefix_sectors {
                0 => dropped += 1,
                16384 => kept += 1,
                _ => torn += 1,
            }
        }
        assert_eq!(
            (dropped, kept, torn),
            (report.dropped, report.kept, report.torn)
        );
    }
    assert!(
        totals.dropped > 0 && totals.kept > 0 && totals.torn > 0,
        "{totals:?}"
    );
}

#[test]
fn same_seed_same_outcome() {
    for seed in [1, 2, 3, 99] {
        let (a, ra) = crash_scenario(seed);
        let (b, rb) = crash_scenario(seed);
        assert_eq!(ra, rb);
        assert_eq!(read(&a, 0, 1 << 20), read(&b, 0, 1 << 20), "seed {seed}");
    }
}

#[test]
fn write_in_flight_at_crash_fails_and_may_persist() {
    let (_mem, fault) = wrap(1 << 20, 9);
    fault.enable_power_loss();
    fault.crash_after_ops(1);
    let first = fault.write(0, pattern(4096, 1));
    // The power fails while `first` is outstanding.
    assert!(block_on(fault.read(0, IoBuf::zeroed(512))).is_err());
    assert!(block_on(first).is_err());
    assert_eq!(fault.stats().volatile_writes, 1);
    let report = fault.apply_power_loss(4);
    assert_eq!(report.dropped + report.kept + report.torn, 1);
}

#[test]
fn power_loss_over_a_file_backend() {
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let file = Arc::new(FileBackend::open(&dir.path().join("pl"), Some(1 << 20)).unwrap());
    let fault = FaultBackend::new(file.clone(), 10);
    fault.enable_power_loss();
    let writes: Vec<_> = (0..16)
        .map(|i| fault.write(i * 8192, pattern(8192, i as u8)))
        .collect();
    for r in block_on(join_all(writes)) {
        r.unwrap();
    }
    block_on(fault.flush()).unwrap();
    block_on(fault.write(0, pattern(8192, 200))).unwrap();
    fault.crash_after_ops(0);
    let report = fault.apply_power_loss(11);
    assert_eq!(report.dropped + report.kept + report.torn, 1);
    for i in 1..16 {
        assert_eq!(read(file.as_ref(), i * 8192, 8192), pattern(8192, i as u8));
    }
}

#[test]
fn concurrent_writers_and_flushes_from_many_threads() {
    // Every write that a completed flush (issued after the write completed) covers must
    // survive any power loss; threads write disjoint regions and flush concurrently.
    for seed in 0..5u64 {
        let (mem, fault) = wrap(4 << 20, seed);
        let fault = Arc::new(fault);
        fault.enable_power_loss();
        let threads: Vec<_> = (0..4u64)
            .map(|t| {
                let fault = fault.clone();
                std::thread::spawn(move || {
                    let mut durable = Vec::new();
                    for round in 0..20u64 {
                        let offset = (t * 64 + round) * 4096;
                        let data = pattern(4096, (t * 50 + round) as u8);
                        let writes = vec![fault.write(offset, data.clone())];
                        for r in block_on(join_all(writes)) {
                            r.unwrap();
                        }
                        if round % 3 == 2 {
                            block_on(fault.flush()).unwrap();
                            durable.push(offset);
                            // Earlier unflushed rounds of this thread are covered too.
                            durable.extend(((round - 2)..round).map(|r| (t * 64 + r) * 4096));
                        }
                    }
                    durable
                })
            })
            .collect();
        let durable: Vec<u64> = threads
            .into_iter()
            .flat_map(|t| t.join().unwrap())
            .collect();
        fault.crash_after_ops(0);
        fault.apply_power_loss(seed * 7 + 1);
        for offset in durable {
            let t = offset / 4096 / 64;
            let round = offset / 4096 % 64;
            assert_eq!(
                read(&mem, offset, 4096),
                pattern(4096, (t * 50 + round) as u8),
                "seed {seed} thread {t} round {round}"
            );
        }
    }
}

#[test]
fn durable_write_survives_power_loss_alone() {
    // A completed durable write persists whole under every seed, with no flush; the plain
    // writes around it, on other sectors, stay volatile: FUA makes no other write durable.
    let mut dropped_neighbours = 0;
    for seed in 0..40u64 {
        let (mem, fault) = wrap(1 << 20, seed);
        fault.enable_power_loss();
        block_on(fault.write(0, pattern(8192, 1))).unwrap();
        block_on(fault.write_durable(65536, pattern(8192, 2))).unwrap();
        block_on(fault.write(131072, pattern(8192, 3))).unwrap();
        assert_eq!(fault.stats().volatile_writes, 2, "seed {seed}");
        assert_eq!(fault.stats().durable_writes, 1);
        fault.crash_after_ops(0);
        fault.apply_power_loss(seed);
        assert_eq!(read(&mem, 65536, 8192), pattern(8192, 2), "seed {seed}");
        dropped_neighbours += [0u64, 131072]
            .iter()
            .filter(|&&o| read(&mem, o, 8192).iter().all(|&b| b == 0))
            .count();
    }
    assert!(dropped_neighbours > 0, "plain writes became durable too");
}

#[test]
fn older_volatile_write_never_lands_over_a_durable_one() {
    // The same sectors: a plain write, then a durable one. Whatever the seed keeps of the
    // plain write, the durable write's bytes are what the device holds after the crash.
    for seed in 0..40u64 {
        let (mem, fault) = wrap(1 << 20, seed);
        fault.enable_power_loss();
        block_on(fault.write(4096, pattern(16384, 7))).unwrap();
        block_on(fault.write_durable(8192, pattern(4096, 8))).unwrap();
        fault.crash_after_ops(0);
        fault.apply_power_loss(seed);
        assert_eq!(read(&mem, 8192, 4096), pattern(4096, 8), "seed {seed}");
    }
}

#[test]
fn durable_write_in_flight_at_crash_is_not_durable() {
    let mut lost = 0;
    for seed in 0..20u64 {
        let (mem, fault) = wrap(1 << 20, seed);
        fault.enable_power_loss();
        fault.crash_after_ops(1);
        let write = fault.write_durable(0, pattern(4096, 5));
        assert!(block_on(fault.read(0, IoBuf::zeroed(512))).is_err());
        assert!(block_on(write).is_err());
        fault.apply_power_loss(seed);
        lost += usize::from(read(&mem, 0, 4096) != pattern(4096, 5));
    }
    assert!(lost > 0, "an unacknowledged durable write always persisted");
}

#[test]
fn file_backend_durable_write_reads_back() {
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let file = FileBackend::open(&dir.path().join("fua"), Some(1 << 20)).unwrap();
    // Aligned (O_DIRECT) and unaligned (buffered) descriptors both take RWF_DSYNC.
    let back = block_on(file.write_durable(8192, pattern(8192, 3))).unwrap();
    assert_eq!(back, pattern(8192, 3));
    block_on(file.write_durable(100, pattern(300, 4))).unwrap();
    assert_eq!(read(&file, 8192, 8192), pattern(8192, 3));
    assert_eq!(read(&file, 100, 300), pattern(300, 4));
}
