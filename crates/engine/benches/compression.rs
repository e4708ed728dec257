//! Measurement (not a test) of compression's costs, for docs/compression.md:
//!
//! 1. `codec`: compressor and decompressor throughput per core of each `compression` setting,
//!    through the format crate's codec functions (the code the pipeline runs), on 16 KiB and
//!    128 KiB blocks of four kinds of data: random (fio `buffer_compress_percentage=0`), half
//!    random and half zeros in 512-byte chunks (fio `=50`), text (this repository's sources)
//!    and mostly zeros. `stored` is the share of the logical bytes the blocks take as stored
//!    (compressed blocks rounded up to a sector, blocks that save less than an eighth or a
//!    sector stored as is): what the rule of docs/compression.md keeps.
//! 2. `cache`: the data cache holding blocks decompressed (content) or as stored, with the
//!    same memory: hit rate and CPU time per 4 KiB read of a uniform random read stream over
//!    a working set larger than the cache, and over one that fits.
//!
//! Throughputs are the best of three rounds (the machine is shared; the best is the least
//! noisy estimate of the code's own cost).
//!
//! Run: `cargo bench -p oxpool-engine --bench compression [codec|cache] [--quick]`.

use oxpool_engine::zio::data_cache::{CacheKey, DataCache};
use oxpool_format::{
    checksum, compress_block, compressed_bytes_max, decompress_block, BlockPtr, ChecksumType,
    Compression, CompressionSetting, Dva, Txg, VdevId, SECTOR_BYTES,
};
use oxpool_io::IoBuf;
use std::hint::black_box;
use std::time::{Duration, Instant};

fn xorshift(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

/// fio's `buffer_compress_percentage=pct` (with `buffer_compress_chunk=512`): each 512-byte
/// chunk is (100 - pct) % random bytes, then zeros.
fn fio_data(len: usize, pct: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    let mut out = vec![0u8; len];
    for chunk in out.chunks_mut(512) {
        let random = chunk.len() * (100 - pct) / 100;
        for b in &mut chunk[..random] {
            *b = xorshift(&mut x) as u8;
        }
    }
    out
}

/// This repository's Rust sources and documents, repeated to `len` bytes.
fn text(len: usize) -> Vec<u8> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut files = Vec::new();
    let mut dirs = vec![root.join("crates"), root.join("docs")];
    // Bounded by the files of the repository.
    while let Some(d) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "rs" || x == "md") {
                files.push(p);
            }
        }
    }
    files.sort();
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        for f in &files {
            out.extend_from_slice(&std::fs::read(f).unwrap_or_default());
        }
        assert!(!out.is_empty(), "no sources found under {}", root.display());
    }
    out.truncate(len);
    out
}

/// Mostly zeros: a 64-byte record every 4 KiB (sparse structures, a fresh file system).
fn sparse(len: usize) -> Vec<u8> {
    let mut out = vec![0u8; len];
    let mut x = 3u64;
    for chunk in out.chunks_mut(4096) {
        for b in &mut chunk[..64] {
            *b = xorshift(&mut x) as u8;
        }
    }
    out
}

/// Runs `f` (which processes `bytes` bytes) for about `budget`, three times; the best MB/s.
fn best_mbps(bytes: usize, budget: Duration, mut f: impl FnMut()) -> f64 {
    let mut best = 0f64;
    for _ in 0..3 {
        let start = Instant::now();
        let mut rounds = 0u64;
        // Bounded by the time budget (and at least one round).
        while rounds == 0 || start.elapsed() < budget {
            f();
            rounds += 1;
        }
        let mbps = (bytes as u64 * rounds) as f64 / start.elapsed().as_secs_f64() / 1e6;
        best = best.max(mbps);
    }
    best
}

fn codec(quick: bool) {
    let total = if quick { 4 << 20 } else { 16 << 20 };
    let budget = Duration::from_millis(if quick { 50 } else { 300 });
    let sets: Vec<(&str, Vec<u8>)> = vec![
        ("random (fio 0%)", fio_data(total, 0, 7)),
        ("half zeros (fio 50%)", fio_data(total, 50, 7)),
        ("text", text(total)),
        ("mostly zeros", sparse(total)),
    ];
    let settings = ["lz4", "zstd-1", "zstd", "zstd-9", "zstd-19", "zle"];
    println!(
        "codec: MB/s per core (logical bytes), best of 3; stored = bytes kept / logical bytes"
    );
    println!(
        "{:<22} {:>5} {:<8} {:>7} {:>10} {:>10}",
        "data", "block", "setting", "stored", "compress", "decompress"
    );
    for (name, data) in &sets {
        for bs in [16384usize, 131072] {
            let blocks: Vec<&[u8]> = data.chunks_exact(bs).collect();
            for s in settings {
                // zstd-19 is for archives: 128 KiB blocks of it take seconds per round here.
                if s == "zstd-19" && (bs > 16384 || quick) {
                    continue;
                }
                let setting: CompressionSetting = s.parse().unwrap();
                let max = compressed_bytes_max(bs);
                let mut dst = vec![0u8; max];
                let mut stored: Vec<Option<Vec<u8>>> = Vec::with_capacity(blocks.len());
                let mut kept = 0u64;
                for b in &blocks {
                    match compress_block(setting, b, &mut dst) {
                        Some(n) => {
                            kept += (n as u64).div_ceil(SECTOR_BYTES) * SECTOR_BYTES;
                            stored.push(Some(dst[..n].to_vec()));
                        }
                        None => {
                            kept += bs as u64;
                            stored.push(None);
                        }
                    }
                }
                let c = best_mbps(data.len(), budget, || {
                    for b in &blocks {
                        black_box(compress_block(setting, b, &mut dst));
                    }
                });
                let compressed: Vec<&Vec<u8>> = stored.iter().flatten().collect();
                let mut out = vec![0u8; bs];
                let d = if compressed.is_empty() {
                    None
                } else {
                    Some(best_mbps(compressed.len() * bs, budget, || {
                        for c in &compressed {
                            decompress_block(setting.algorithm, c, &mut out).unwrap();
                            black_box(&out);
                        }
                    }))
                };
                println!(
                    "{:<22} {:>4}K {:<8} {:>6.1}% {:>10.0} {:>10}",
                    name,
                    bs / 1024,
                    s,
                    100.0 * kept as f64 / data.len() as f64,
                    c,
                    d.map_or("-".to_string(), |d| format!("{d:.0}")),
                );
            }
        }
    }
}

fn key(i: u64, psize: usize, bytes: &[u8]) -> CacheKey {
    let mut bp = BlockPtr {
        ndvas: 1,
        lsize_bytes: 16384,
        psize_bytes: psize as u32,
        compression: if psize < 16384 {
            Compression::Lz4
        } else {
            Compression::Off
        },
        checksum: checksum(ChecksumType::Xxh3_128, bytes),
        birth: Txg(1),
        fill: 1,
        ..BlockPtr::HOLE
    };
    bp.dvas[0] = Dva {
        vdev: VdevId(0),
        offset_bytes: i * 16384,
        asize_bytes: 16384,
    };
    CacheKey::of(&bp)
}

/// One cache form over `blocks` (content, stored form): uniform random 4 KiB reads. Returns
/// (hit rate, ns per read served from the cache).
fn cache_run(
    blocks: &[(Vec<u8>, Option<Vec<u8>>)],
    setting: CompressionSetting,
    cache_bytes: u64,
    as_stored: bool,
    reads: usize,
) -> (f64, f64) {
    let cache = DataCache::new(cache_bytes);
    let bs = 16384;
    let keys: Vec<CacheKey> = blocks
        .iter()
        .enumerate()
        .map(|(i, (content, stored))| match (as_stored, stored) {
            (true, Some(s)) => key(i as u64, s.len(), s),
            _ => key(i as u64, bs, content),
        })
        .collect();
    let insert = |i: usize| {
        let (content, stored) = &blocks[i];
        let buf = match (as_stored, stored) {
            // As the device read it: the stored bytes in whole sectors.
            (true, Some(s)) => {
                let mut b = IoBuf::zeroed(s.len().div_ceil(4096) * 4096);
                b[..s.len()].copy_from_slice(s);
                b
            }
            _ => IoBuf::from_slice(content),
        };
        cache.insert(keys[i], buf);
    };
    let mut x = 11u64;
    let mut out = [0u8; 4096];
    let mut block = vec![0u8; bs];
    let mut stored_copy = vec![0u8; bs];
    // Warm up: every block read once (the cache keeps what fits).
    for i in 0..blocks.len() {
        insert(i);
    }
    let (mut hits, mut hit_ns) = (0u64, 0u128);
    for _ in 0..reads {
        let i = (xorshift(&mut x) % blocks.len() as u64) as usize;
        let at = (xorshift(&mut x) % 4) as usize * 4096;
        let start = Instant::now();
        let hit = match (as_stored, &blocks[i].1) {
            (true, Some(s)) => {
                // A hit copies the stored bytes out and decompresses the whole block.
                let stored = &mut stored_copy[..s.len()];
                let hit = cache.read_into(&keys[i], 0, stored);
                if hit {
                    decompress_block(setting.algorithm, stored, &mut block).unwrap();
                    out.copy_from_slice(&block[at..at + 4096]);
                }
                hit
            }
            _ => cache.read_into(&keys[i], at, &mut out),
        };
        if hit {
            hits += 1;
            hit_ns += start.elapsed().as_nanos();
        } else {
            insert(i);
        }
        black_box(&out);
    }
    (
        hits as f64 / reads as f64,
        hit_ns as f64 / hits.max(1) as f64,
    )
}

fn cache(quick: bool) {
    let reads = if quick { 20_000 } else { 400_000 };
    let n_blocks = if quick { 1024 } else { 8192 };
    println!(
        "cache: 16 KiB blocks, uniform random 4 KiB reads; a hit as content is a copy, a hit as \
         stored decompresses the block"
    );
    println!(
        "{:<22} {:<8} {:>7} {:>10} {:>9} {:>12} {:>9} {:>12}",
        "data", "setting", "ratio", "cache/set", "content", "ns/hit", "stored", "ns/hit"
    );
    let total = n_blocks * 16384;
    for (name, data) in [
        ("half zeros (fio 50%)", fio_data(total, 50, 9)),
        ("text", text(total)),
    ] {
        for s in ["lz4", "zstd"] {
            let setting: CompressionSetting = s.parse().unwrap();
            let mut dst = vec![0u8; compressed_bytes_max(16384)];
            let blocks: Vec<(Vec<u8>, Option<Vec<u8>>)> = data
                .chunks_exact(16384)
                .map(|b| {
                    let stored = compress_block(setting, b, &mut dst).map(|n| dst[..n].to_vec());
                    (b.to_vec(), stored)
                })
                .collect();
            let stored_total: usize = blocks
                .iter()
                .map(|(_, s)| s.as_ref().map_or(16384, |s| s.len().div_ceil(4096) * 4096))
                .sum();
            let ratio = total as f64 / stored_total as f64;
            for fraction in [0.25, 0.5, 1.25] {
                // Room for this fraction of the working set's content (16 shards: round up).
                let bytes = (total as f64 * fraction) as u64;
                let (c_rate, c_ns) = cache_run(&blocks, setting, bytes, false, reads);
                let (s_rate, s_ns) = cache_run(&blocks, setting, bytes, true, reads);
                println!(
                    "{:<22} {:<8} {:>6.2}x {:>9.0}% {:>8.1}% {:>12.0} {:>8.1}% {:>12.0}",
                    name,
                    s,
                    ratio,
                    fraction * 100.0,
                    c_rate * 100.0,
                    c_ns,
                    s_rate * 100.0,
                    s_ns
                );
            }
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = args.iter().any(|a| a == "--quick");
    let all = !args.iter().any(|a| a == "codec" || a == "cache");
    if all || args.iter().any(|a| a == "codec") {
        codec(quick);
    }
    if all || args.iter().any(|a| a == "cache") {
        cache(quick);
    }
}
