//! Raidz parity per core: generation of P, P+Q, P+Q+R and reconstruction of 1, 2 and 3 lost
//! data columns, over 8 data columns of 128 KiB (one 1 MiB block on a 10- or 11-wide raidz),
//! for each of oxpool's kernel implementations the CPU runs, beside two parity crates from
//! crates.io doing the same work (8+2 and 8+3 codes). Prints one line per case:
//!
//! `raidz <impl> <case>: <GB/s> GB/s`
//!
//! GB/s is data bytes (8 x 128 KiB) per second of this thread's CPU time, 10^9 bytes, best of
//! several runs (the machine is shared: CPU time leaves out the time other processes hold the
//! core, and the best run is the least noisy estimate of the code's own cost). The crates do
//! not compute raidz's coefficients (no crate does), so they are compared for speed only.
//!
//! Run: `cargo bench -p oxpool-engine --bench raidz` (`-- --quick` for a short check run).

use oxpool_engine::vdev::raidz::{ColumnSet, ParityKernels};
use std::hint::black_box;
use std::time::Duration;

const DATA_COLUMNS: usize = 8;
const COLUMN_BYTES: usize = 128 * 1024;
const DATA_BYTES: usize = DATA_COLUMNS * COLUMN_BYTES;

struct Timer {
    runs: usize,
    run_time: Duration,
}

impl Timer {
    /// Measures and prints the case, if it was asked for.
    fn run(&self, implementation: &str, case: &str, op: impl FnMut()) {
        if wanted(implementation, case) {
            print(implementation, case, self.rate(op));
        }
    }

    /// Best data rate of `op` in GB/s.
    fn rate(&self, mut op: impl FnMut()) -> f64 {
        // Calibrate: enough calls to fill one run.
        let start = thread_cpu_time();
        op();
        let one = (thread_cpu_time() - start).max(Duration::from_nanos(1));
        let calls = (self.run_time.as_nanos() / one.as_nanos()).clamp(1, 1_000_000) as usize;
        let mut best = f64::INFINITY;
        for _ in 0..self.runs {
            let start = thread_cpu_time();
            for _ in 0..calls {
                op();
            }
            best = best.min((thread_cpu_time() - start).as_secs_f64() / calls as f64);
        }
        DATA_BYTES as f64 / best / 1e9
    }
}

/// CPU time of the calling thread.
fn thread_cpu_time() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec we pass and reads nothing else.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID)");
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

fn print(implementation: &str, case: &str, gbps: f64) {
    println!("raidz {implementation} {case}: {gbps:.2} GB/s");
}

/// Whether the case `implementation case` was asked for: every case when the command line
/// names none, else those whose name contains one of the words given.
fn wanted(implementation: &str, case: &str) -> bool {
    let filters: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let name = format!("{implementation} {case}");
    filters.is_empty() || filters.iter().any(|f| name.contains(f.as_str()))
}

/// Pseudo-random bytes (xorshift), so the data is not trivially compressible or zero.
fn fill(buf: &mut [u8], mut seed: u64) {
    for b in buf.iter_mut() {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        *b = seed as u8;
    }
}

fn oxpool_cases(kernels: ParityKernels, timer: &Timer) {
    let name = kernels.name();
    let mut original = vec![vec![0u8; COLUMN_BYTES]; 3 + DATA_COLUMNS];
    for (i, c) in original.iter_mut().enumerate().skip(3) {
        fill(c, i as u64 + 1);
    }
    {
        let (parity, data) = original.split_at_mut(3);
        kernels.generate(data, parity);
    }

    for (case, np) in [("gen_p", 1), ("gen_pq", 2), ("gen_pqr", 3)] {
        let (parity, data) = original.split_at_mut(3);
        let parity = &mut parity[..np];
        timer.run(name, case, || {
            kernels.generate(black_box(&*data), black_box(&mut *parity))
        });
    }

    // Reconstruction: which data columns are lost (as block columns, parity first) and which
    // parity columns are unusable, on a raidz with `np` parity.
    let cases: [(&str, usize, &[usize], &[usize]); 6] = [
        ("rec_p (1 data lost)", 1, &[5], &[]),
        ("rec_q (1 data + P lost)", 2, &[5], &[0]),
        ("rec_pq (2 data lost)", 2, &[4, 8], &[]),
        ("rec_pr (2 data + Q lost)", 3, &[4, 8], &[1]),
        ("rec_qr (2 data + P lost)", 3, &[4, 8], &[0]),
        ("rec_pqr (3 data lost)", 3, &[4, 6, 9], &[]),
    ];
    for (case, np, lost, bad_parity) in cases {
        // Columns of a raidz with `np` parity: the first `np` parity buffers, then the data.
        let mut work: Vec<Vec<u8>> = original[..np]
            .iter()
            .chain(&original[3..])
            .cloned()
            .collect();
        let shift = |c: usize| c - 3 + np;
        let bad: ColumnSet = lost
            .iter()
            .map(|&c| shift(c))
            .chain(bad_parity.iter().copied())
            .collect();
        let mut cols: Vec<&mut [u8]> = work.iter_mut().map(|c| c.as_mut_slice()).collect();
        for c in bad.iter() {
            cols[c].fill(0xa5);
        }
        kernels
            .reconstruct(&mut cols, np, bad)
            .expect("reconstructs");
        for &c in lost {
            assert!(cols[shift(c)][..] == original[c][..], "{case}: wrong data");
        }
        timer.run(name, case, || {
            kernels
                .reconstruct(black_box(&mut cols), np, bad)
                .expect("reconstructs");
        });
    }
}

fn reed_solomon_erasure_cases(timer: &Timer) {
    use reed_solomon_erasure::galois_8::ReedSolomon;
    let name = "reed-solomon-erasure";
    for parity_count in [2, 3] {
        let rs = ReedSolomon::new(DATA_COLUMNS, parity_count).expect("codec");
        let mut shards = vec![vec![0u8; COLUMN_BYTES]; DATA_COLUMNS + parity_count];
        for (i, s) in shards.iter_mut().enumerate().take(DATA_COLUMNS) {
            fill(s, i as u64 + 1);
        }
        rs.encode(&mut shards).expect("encodes");
        let original = shards.clone();
        {
            let (data, parity) = shards.split_at_mut(DATA_COLUMNS);
            let case = format!("encode 8+{parity_count}");
            let mut encode = || rs.encode_sep(black_box(&*data), black_box(&mut *parity));
            timer.run(name, &case, || encode().unwrap());
        }
        let lost = [1, 4, 6];
        let lost = &lost[..parity_count];
        let rec = |shards: &mut [Vec<u8>]| {
            let mut slots: Vec<(&mut [u8], bool)> = shards
                .iter_mut()
                .enumerate()
                .map(|(i, s)| (s.as_mut_slice(), !lost.contains(&i)))
                .collect();
            rs.reconstruct_data(black_box(&mut slots)).unwrap();
        };
        for &i in lost {
            shards[i].fill(0xa5);
        }
        rec(&mut shards);
        assert!(shards[..DATA_COLUMNS] == original[..DATA_COLUMNS]);
        let case = format!("reconstruct {parity_count} data lost 8+{parity_count}");
        timer.run(name, &case, || rec(&mut shards));
    }
}

fn reed_solomon_simd_cases(timer: &Timer) {
    use reed_solomon_simd::{ReedSolomonDecoder, ReedSolomonEncoder};
    let name = "reed-solomon-simd";
    for parity_count in [2, 3] {
        let mut data = vec![vec![0u8; COLUMN_BYTES]; DATA_COLUMNS];
        for (i, s) in data.iter_mut().enumerate() {
            fill(s, i as u64 + 1);
        }
        let mut encoder =
            ReedSolomonEncoder::new(DATA_COLUMNS, parity_count, COLUMN_BYTES).unwrap();
        let mut recovery: Vec<Vec<u8>> = Vec::new();
        let mut encode = |keep: bool| {
            for d in &data {
                encoder.add_original_shard(black_box(d)).unwrap();
            }
            let result = encoder.encode().unwrap();
            if keep {
                recovery = result.recovery_iter().map(|r| r.to_vec()).collect();
            }
        };
        encode(true);
        let case = format!("encode 8+{parity_count}");
        timer.run(name, &case, || encode(false));

        let lost = [1, 4, 6];
        let lost = &lost[..parity_count];
        let mut decoder =
            ReedSolomonDecoder::new(DATA_COLUMNS, parity_count, COLUMN_BYTES).unwrap();
        let mut decode = |check: bool| {
            for (i, d) in data.iter().enumerate() {
                if !lost.contains(&i) {
                    decoder.add_original_shard(i, black_box(d)).unwrap();
                }
            }
            for (i, r) in recovery.iter().enumerate() {
                decoder.add_recovery_shard(i, r).unwrap();
            }
            let result = decoder.decode().unwrap();
            if check {
                for &i in lost {
                    assert!(result.restored_original(i).unwrap() == &data[i][..]);
                }
            }
        };
        decode(true);
        let case = format!("decode {parity_count} data lost 8+{parity_count}");
        timer.run(name, &case, || decode(false));
    }
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let timer = if quick {
        Timer {
            runs: 2,
            run_time: Duration::from_millis(20),
        }
    } else {
        Timer {
            runs: 15,
            run_time: Duration::from_millis(100),
        }
    };
    println!(
        "raidz parity, {DATA_COLUMNS} data columns x {} KiB, one thread",
        COLUMN_BYTES / 1024
    );
    for kernels in ParityKernels::available() {
        oxpool_cases(kernels, &timer);
    }
    reed_solomon_erasure_cases(&timer);
    reed_solomon_simd_cases(&timer);
}
