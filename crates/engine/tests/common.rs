//! Shared helpers for the engine's integration tests.
#![allow(dead_code)]

use oxpool_engine::{Pool, PoolProps, TopSpec, Volume};
use oxpool_format::TopVdevKind;
use oxpool_io::{Backend, FaultBackend, IoBuf, IoFuture, MemoryBackend};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::sync::Mutex;

/// Device size used by the tests: small, so each test stays fast.
pub const DEVICE_BYTES: u64 = 64 << 20;

/// Properties for tests: no timed syncs (txgs end only where the test says), a large dirty
/// limit so no threshold sync happens by surprise.
pub fn test_props() -> PoolProps {
    let mut p = PoolProps::default();
    p.set("txg_timeout", "3600").unwrap();
    p.set("dirty_max", "256M").unwrap();
    p
}

/// The kind of a raidz vdev with `parity` parity columns (for [`mem_pool`] and
/// [`oxpool_engine::TopSpec`]; the rest of its record is filled in at creation).
pub fn raidz(parity: u8) -> TopVdevKind {
    TopVdevKind::Raidz(oxpool_format::RaidzConfig {
        parity,
        sector_shift: 12,
        epochs: Vec::new(),
    })
}

/// A pool named `tank` on one device, with `props`.
pub fn single_device_pool(device: Arc<dyn Backend>, props: PoolProps) -> Pool {
    Pool::create("tank", vec![TopSpec::single(device)], props, false).unwrap()
}

/// A pool of one top-level vdev over memory devices.
pub fn mem_pool(kind: TopVdevKind, devices: usize) -> (Pool, Vec<MemoryBackend>) {
    mem_pool_with(kind, devices, test_props())
}

/// [`mem_pool`] with `props`.
pub fn mem_pool_with(
    kind: TopVdevKind,
    devices: usize,
    props: PoolProps,
) -> (Pool, Vec<MemoryBackend>) {
    let mems: Vec<MemoryBackend> = (0..devices)
        .map(|i| MemoryBackend::new(&format!("mem{i}"), DEVICE_BYTES))
        .collect();
    let backends: Vec<Arc<dyn Backend>> = mems
        .iter()
        .map(|m| Arc::new(m.clone()) as Arc<dyn Backend>)
        .collect();
    let tops = match kind {
        TopVdevKind::Mirror => vec![TopSpec {
            log: false,
            kind,
            devices: backends,
        }],
        TopVdevKind::Single => backends
            .into_iter()
            .map(|b| TopSpec {
                log: false,
                kind: TopVdevKind::Single,
                devices: vec![b],
            })
            .collect(),
        TopVdevKind::Raidz(r) => vec![TopSpec::raidz(r.parity, backends)],
        TopVdevKind::Hole => panic!("a pool is not made of holes"),
    };
    let pool = Pool::create("tank", tops, props, false).unwrap();
    (pool, mems)
}

/// Imports the pool from memory devices.
pub fn reimport(mems: &[MemoryBackend]) -> Pool {
    let backends: Vec<Arc<dyn Backend>> = mems
        .iter()
        .map(|m| Arc::new(m.clone()) as Arc<dyn Backend>)
        .collect();
    Pool::import(backends, Some("tank")).unwrap()
}

/// Deterministic pseudo-random bytes.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// What a test writes: data that compresses, data that does not, and zeros.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fill {
    /// Pseudo-random bytes (incompressible: stored as is).
    Random,
    /// Half random, half zeros in 512-byte chunks (fio's `buffer_compress_percentage=50`),
    /// then text-like runs: compresses about 2x with lz4.
    Compressible,
    /// All zeros (written as data: with compression on, whole blocks become holes).
    Zeros,
    /// A mix, 4 KiB at a time: each 4 KiB random, compressible or zeros, by the seed.
    Mixed,
}

impl Fill {
    /// Every kind, to pick from.
    pub const ALL: [Fill; 4] = [Fill::Random, Fill::Compressible, Fill::Zeros, Fill::Mixed];
}

/// `len` bytes of kind `fill`, deterministic from `seed`.
pub fn content(fill: Fill, seed: u64, len: usize) -> Vec<u8> {
    match fill {
        Fill::Random => pattern(seed, len),
        Fill::Zeros => vec![0u8; len],
        Fill::Compressible => {
            let mut out = pattern(seed, len);
            for (i, chunk) in out.chunks_mut(512).enumerate() {
                let half = chunk.len() / 2;
                if i % 4 == 3 {
                    // Text-like: a short phrase repeated, with the chunk's number.
                    let line = format!("block {seed:x} chunk {i}: the quick brown fox ");
                    for (b, c) in chunk.iter_mut().zip(line.bytes().cycle()) {
                        *b = c;
                    }
                } else {
                    chunk[half..].fill(0);
                }
            }
            out
        }
        Fill::Mixed => {
            let mut out = Vec::with_capacity(len);
            let mut k = 0u64;
            while out.len() < len {
                let n = (len - out.len()).min(4096);
                let kind = [Fill::Random, Fill::Compressible, Fill::Zeros]
                    [(seed.wrapping_mul(0x9E37_79B9).wrapping_add(k) % 3) as usize];
                out.extend_from_slice(&content(kind, seed ^ k, n));
                k += 1;
            }
            out
        }
    }
}

/// All devices of a pool lose power at the same instant: a shared countdown over every
/// operation of every device.
pub struct CrashGroup {
    /// Operations left before the power fails.
    pub remaining: AtomicU64,
    /// The devices that lose power together.
    pub members: Mutex<Vec<Arc<FaultBackend>>>,
}

impl CrashGroup {
    /// Counts one operation; the last one cuts the power of every member.
    pub fn tick(&self) {
        let before = self.remaining.fetch_sub(1, Ordering::SeqCst);
        if before == 1 {
            for m in self.members.lock().unwrap().iter() {
                m.crash_after_ops(0);
            }
        }
    }
}

/// A device of a [`CrashGroup`]: every read, write and flush counts down the group's power.
pub struct GroupDevice {
    /// The device.
    pub fault: Arc<FaultBackend>,
    /// Its group.
    pub group: Arc<CrashGroup>,
}

impl Backend for GroupDevice {
    fn name(&self) -> &str {
        self.fault.name()
    }
    fn size_bytes(&self) -> u64 {
        self.fault.size_bytes()
    }
    fn read(&self, offset_bytes: u64, buf: IoBuf) -> IoFuture<IoBuf> {
        self.group.tick();
        self.fault.read(offset_bytes, buf)
    }
    fn write(&self, offset_bytes: u64, buf: IoBuf) -> IoFuture<IoBuf> {
        self.group.tick();
        self.fault.write(offset_bytes, buf)
    }
    fn write_durable(&self, offset_bytes: u64, buf: IoBuf) -> IoFuture<IoBuf> {
        // The fault backend's own FUA model (only this write durable), not the default
        // write-then-flush, which would hide a commit that relies on FUA for other writes.
        self.group.tick();
        self.fault.write_durable(offset_bytes, buf)
    }
    fn flush(&self) -> IoFuture<()> {
        self.group.tick();
        self.fault.flush()
    }
    fn discard(&self, offset_bytes: u64, length_bytes: u64) -> IoFuture<()> {
        self.fault.discard(offset_bytes, length_bytes)
    }
}

/// Memory devices `mems` behind fault backends (seeded by `seed` and the device's index) in
/// one [`CrashGroup`], which starts with the power never failing (set `remaining`).
pub fn crash_devices(
    mems: &[MemoryBackend],
    seed: u64,
) -> (Arc<CrashGroup>, Vec<Arc<dyn Backend>>) {
    let group = Arc::new(CrashGroup {
        remaining: AtomicU64::new(u64::MAX),
        members: Mutex::new(Vec::new()),
    });
    let devices = mems
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let f = Arc::new(FaultBackend::new(
                Arc::new(m.clone()),
                seed ^ (i as u64 + 1),
            ));
            group.members.lock().unwrap().push(f.clone());
            Arc::new(GroupDevice {
                fault: f,
                group: group.clone(),
            }) as Arc<dyn Backend>
        })
        .collect();
    (group, devices)
}

/// The power of `group` fails for good: each member drops, keeps or tears its unflushed
/// writes (seeded by `seed` and its index). Then pool `tank` is imported from `mems`, as a
/// restarted machine would; returns it with what each device lost, for error messages.
/// Cuts the power of every device of `group` (each its own loss, from `seed`); returns what
/// each lost, for a failure's message.
pub fn power_off(group: &CrashGroup, seed: u64) -> String {
    let mut report = String::new();
    for (i, m) in group.members.lock().unwrap().iter().enumerate() {
        let r = m.apply_power_loss(seed.wrapping_mul(31).wrapping_add(i as u64));
        report += &format!(
            "dev{i}: dropped {} kept {} torn {}; ",
            r.dropped, r.kept, r.torn
        );
    }
    report
}

pub fn power_off_and_import(
    group: &CrashGroup,
    mems: &[MemoryBackend],
    seed: u64,
) -> Result<(Pool, String), String> {
    let report = power_off(group, seed);
    let devices = mems
        .iter()
        .map(|m| Arc::new(m.clone()) as Arc<dyn Backend>)
        .collect();
    let pool = Pool::import(devices, Some("tank"))
        .map_err(|e| format!("import after crash failed: {e} ({report})"))?;
    Ok((pool, report))
}

/// Runs the crash cases of test `test` (an engine test target): `OXPOOL_CRASH_SEED=S`
/// replays one seed; otherwise `OXPOOL_CRASH_CASES` seeds (default 2000; see
/// `OXPOOL_CRASH_ONLY` below for a subset) on two threads,
/// every failure printed with how to replay it, and the test fails if any failed.
pub fn run_crash_cases(test: &str, case: fn(u64) -> Result<String, String>) {
    if let Ok(s) = std::env::var("OXPOOL_CRASH_SEED") {
        let seed: u64 = s.parse().expect("OXPOOL_CRASH_SEED is a number");
        match case(seed) {
            Ok(r) => println!("seed {seed}: ok ({r})"),
            Err(e) => panic!("seed {seed}: {e}"),
        }
        return;
    }
    let cases: u64 = std::env::var("OXPOOL_CRASH_CASES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2000);
    // `OXPOOL_CRASH_ONLY=M:R`: only the seeds equal to R modulo M (one layout of a test that
    // picks its layout by `seed % M`), to hunt a rare failure seen in one layout.
    let only: Option<(u64, u64)> = std::env::var("OXPOOL_CRASH_ONLY").ok().map(|s| {
        let (m, r) = s.split_once(':').expect("OXPOOL_CRASH_ONLY is M:R");
        (
            m.parse().expect("M is a number"),
            r.parse().expect("R is a number"),
        )
    });
    let failures = Mutex::new(Vec::new());
    let threads = 2;
    std::thread::scope(|s| {
        for t in 0..threads {
            let failures = &failures;
            s.spawn(move || {
                for seed in (t..cases).step_by(threads as usize) {
                    let seed = match only {
                        Some((m, r)) => seed * m + r,
                        None => seed,
                    };
                    if let Err(e) = case(seed) {
                        failures.lock().unwrap().push((seed, e));
                    }
                }
            });
        }
    });
    let failures = failures.into_inner().unwrap();
    for (seed, e) in &failures {
        eprintln!("seed {seed}: {e}  (replay: OXPOOL_CRASH_SEED={seed} cargo test -p oxpool-engine --test {test})");
    }
    assert!(
        failures.is_empty(),
        "{} of {cases} crash cases failed",
        failures.len()
    );
    println!("{cases} crash cases passed");
}

/// Every byte of `vol` (a volume or a snapshot's view).
pub fn read_all(vol: &Volume) -> Vec<u8> {
    let mut out = vec![0u8; vol.size_bytes() as usize];
    oxpool_io::rt::block_on(vol.read(0, &mut out)).unwrap();
    out
}

/// Every byte of `vol@snap`.
pub fn snap_bytes(pool: &Pool, vol: &str, snap: &str) -> Vec<u8> {
    read_all(&pool.snapshot_volume(vol, snap).unwrap())
}

/// Writes `data` at `at` (not durable until a sync).
pub fn write(vol: &Volume, at: u64, data: &[u8]) {
    oxpool_io::rt::block_on(vol.write(at, data, false)).unwrap();
}

/// The pool's audit as a crash case reports it: an error naming `when` unless it is clean.
/// Returns the blocks it checked.
pub fn audit_result(pool: &Pool, when: &str) -> Result<u64, String> {
    let r = pool.audit().map_err(|e| format!("audit {when}: {e}"))?;
    if !r.is_clean() {
        return Err(format!("audit {when}: {:?}", r.problems));
    }
    Ok(r.blocks_checked)
}

/// Panics with the problems unless the pool's audit is clean.
pub fn audit_clean(pool: &Pool, when: &str) {
    if let Err(e) = audit_result(pool, when) {
        panic!("{e}");
    }
}

/// Every stream of `stream` (one after another) decoded and written again in stream format
/// `version`, each BEGIN changed by `edit` first: the checksums are the encoder's, so only
/// the change is wrong in it.
pub fn reencode(
    stream: &[u8],
    version: u32,
    mut edit: impl FnMut(&mut oxpool_format::StreamBegin),
) -> Vec<u8> {
    use oxpool_format::{StreamDecoder, StreamEncoder, StreamRecord};
    let mut out = Vec::new();
    let mut decoder = StreamDecoder::new();
    let mut encoder: Option<StreamEncoder> = None;
    let mut rest = stream;
    while !rest.is_empty() {
        if decoder.is_done() {
            decoder = StreamDecoder::new();
        }
        let d = decoder.decode(rest).unwrap();
        rest = &rest[d.consumed_bytes..];
        match d.record {
            None => {}
            Some(StreamRecord::Begin(b)) => {
                let mut b = b.clone();
                edit(&mut b);
                let (e, header) = StreamEncoder::with_version(&b, version);
                out.extend_from_slice(&header);
                out.extend_from_slice(b.name.as_bytes());
                encoder = Some(e);
            }
            Some(StreamRecord::Data(r)) => {
                out.extend_from_slice(&encoder.as_mut().unwrap().data(&r));
                out.extend_from_slice(r.payload);
            }
            Some(StreamRecord::Free {
                offset_bytes,
                length_bytes,
            }) => {
                out.extend_from_slice(&encoder.as_mut().unwrap().free(offset_bytes, length_bytes))
            }
            Some(StreamRecord::SetSize { volsize_bytes }) => {
                out.extend_from_slice(&encoder.as_mut().unwrap().set_size(volsize_bytes))
            }
            Some(StreamRecord::End { .. }) => {
                out.extend_from_slice(&encoder.take().unwrap().end().0);
            }
        }
    }
    out
}

/// `stream` (one stream) in the current format with its BEGIN changed by `edit`.
pub fn with_begin(stream: &[u8], edit: impl FnMut(&mut oxpool_format::StreamBegin)) -> Vec<u8> {
    reencode(stream, oxpool_format::stream::STREAM_VERSION, edit)
}
