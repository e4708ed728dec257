//! Snapshot create time against volume size and snapshot count (issue 16's first benchmark):
//! `cargo bench -p oxpool-engine --bench snapshots [-- --quick]`.
//!
//! A pool on a sparse file (io_uring, O_DIRECT), one volume of 1 GiB and one of 32 GiB, each
//! written whole in 128 KiB blocks. The data is compressible (lz4 stores each block in one
//! sector), so the 32 GiB volume has the block tree of 32 GiB written (262,144 data blocks
//! and their indirect blocks) without writing 32 GiB to this machine's disk: a snapshot's
//! cost depends on the tree and the metadata, never on the bytes in the blocks. Then, for
//! each volume, snapshot create is timed with 0 existing snapshots and after 1,000 (each
//! after a small overwrite, so that each has a deadlist of its own). Every create is one txg
//! sync; the figure is the median of several creates. Each volume is in a pool of its own.

use oxpool_engine::{Pool, PoolProps, TopSpec, Volume};
use oxpool_format::TopVdevKind;
use oxpool_io::rt::block_on;
use oxpool_io::{Backend, FileBackend};
use std::sync::Arc;
use std::time::{Duration, Instant};

const BLOCK_BYTES: usize = 128 << 10;

fn fill(vol: &Volume, bytes: u64) {
    let mut block = vec![0u8; 8 << 20];
    // Compressible, never all-zero (zero blocks would be holes).
    for (i, b) in block.iter_mut().enumerate() {
        *b = (i % 251) as u8 | 1;
    }
    let mut off = 0;
    // Bounded by the volume's size.
    while off < bytes {
        block_on(vol.write(off, &block, false)).unwrap();
        off += block.len() as u64;
    }
}

fn median_create(pool: &Pool, vol: &str, tag: &str, n: usize) -> Duration {
    let mut times: Vec<Duration> = (0..n)
        .map(|i| {
            let start = Instant::now();
            pool.snapshot(&[format!("{vol}@{tag}{i}")]).unwrap();
            start.elapsed()
        })
        .collect();
    times.sort();
    times[n / 2]
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let dir = tempfile::tempdir_in(std::env::var("OXPOOL_BENCH_DIR").unwrap_or("/var/tmp".into()))
        .expect("a directory for the pool file");
    // OXPOOL_BENCH_LARGE_GIB: the large volume's size (profiling).
    let large_gib: u64 = std::env::var("OXPOOL_BENCH_LARGE_GIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(32);
    let sizes: Vec<(&str, u64)> = if quick {
        vec![("small", 64 << 20), ("large", 1 << 30)]
    } else {
        vec![("1g", 1 << 30), ("large", large_gib << 30)]
    };
    let existing = if quick { 50 } else { 1000 };
    // OXPOOL_BENCH_CREATES: creates per median (profiling: many).
    let creates: usize = std::env::var("OXPOOL_BENCH_CREATES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    println!("volume  written  existing  create_ms_median");
    let mut rows = Vec::new();
    for (name, bytes) in &sizes {
        // A pool of its own per volume: the other's snapshots would be in its metadata.
        let path = dir.path().join(format!("snapbench-{name}.img"));
        let dev: Arc<dyn Backend> = Arc::new(FileBackend::open(&path, Some(8 << 30)).unwrap());
        let mut props = PoolProps::default();
        props.set("txg_timeout", "3600").unwrap();
        let tops = vec![TopSpec {
            log: false,
            kind: TopVdevKind::Single,
            devices: vec![dev],
        }];
        let pool = Pool::create("snapbench", tops, props, false).unwrap();
        let vol = pool
            .create_volume(
                name,
                *bytes,
                &[
                    ("volblocksize".into(), BLOCK_BYTES.to_string()),
                    ("compression".into(), "lz4".into()),
                ],
            )
            .unwrap();
        let start = Instant::now();
        fill(&vol, *bytes);
        pool.sync().unwrap();
        eprintln!("{name}: written in {:.1} s", start.elapsed().as_secs_f64());
        let t0 = median_create(&pool, name, "first", creates);
        rows.push((name.to_string(), *bytes, 0, t0));
        // `existing` snapshots, each after a small overwrite.
        for i in 0..existing {
            let off = (i as u64 * 7919 * BLOCK_BYTES as u64) % (*bytes - BLOCK_BYTES as u64);
            block_on(vol.write(off, &[(i % 200) as u8 + 1; 4096], false)).unwrap();
            pool.snapshot(&[format!("{name}@n{i}")]).unwrap();
        }
        let t1 = median_create(&pool, name, "after", creates);
        rows.push((name.to_string(), *bytes, existing + creates, t1));
        drop(vol);
        pool.destroy().unwrap();
        std::fs::remove_file(&path).unwrap();
    }
    let smallest = rows.iter().map(|r| r.3).min().unwrap();
    for (name, bytes, n, t) in &rows {
        println!(
            "{name:<7} {:>6} GiB  {n:>8}  {:>8.2}  ({:.2}x the smallest)",
            *bytes as f64 / (1u64 << 30) as f64,
            t.as_secs_f64() * 1e3,
            t.as_secs_f64() / smallest.as_secs_f64()
        );
    }
}
