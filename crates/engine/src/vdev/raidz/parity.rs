//! Parity generation and checking over a block's columns, and the choice of kernel
//! implementation.
//!
//! The kernels (`kernels.rs`) are portable Rust, compiled twice: for the baseline target (SSE2
//! on x86-64, NEON on aarch64: 16-byte vectors) and, on x86-64, once more with AVX2 enabled
//! (32-byte vectors), chosen at run time when the CPU has it. Generation is the same source in
//! both. Reconstruction differs in one step: multiplying the syndromes by the solution's
//! constants, which the portable code does by shared doublings (about 40 instructions per 32
//! bytes and term) and the AVX2 code with `vpshufb` nibble tables (6), through `std::arch`.
//!
//! Why the second copy: the issue asks for "within about 20 % of OpenZFS's assembly and ahead
//! of the crates". The portable code meets the absolute goals (10 GB/s P+Q, 6 GB/s P+Q+R, 5
//! GB/s for two lost columns) but 16-byte vectors are about half of OpenZFS's AVX2 speed, and
//! the crates multiply with the same tables (docs/raidz.md has the figures of both paths). The
//! only `unsafe` is the call into the AVX2 copies, made only for a [`ParityKernels`] that was
//! built after `is_x86_feature_detected!("avx2")` said yes, and the vector loads and stores
//! inside them. Tests run both paths against the same reference.

use super::kernels;
use super::ColumnSet;
use super::{RAIDZ_PARITY_MAX, RAIDZ_WIDTH_MAX};

/// Chunk of the portable kernels: four 16-byte registers per accumulator, so P, Q and R fit
/// in the 16 SSE2 registers with room for the temporaries.
pub(super) const PORTABLE_CHUNK: usize = 64;
/// Chunk of the AVX2 kernels: four 32-byte registers per accumulator.
pub(super) const AVX2_CHUNK: usize = 128;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Isa {
    Portable,
    #[cfg(target_arch = "x86_64")]
    Avx2,
}

/// A choice of parity kernels: [`ParityKernels::best`] for the machine, or a given one (tests
/// and benchmarks compare them). Every choice computes the same bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ParityKernels {
    /// Only constructed for an instruction set the CPU has (checked at construction), which
    /// is what makes the calls into the AVX2 copies sound.
    pub(super) isa: Isa,
}

#[cfg(target_arch = "x86_64")]
fn avx2_available() -> bool {
    std::arch::is_x86_feature_detected!("avx2")
}

impl ParityKernels {
    /// The fastest kernels this CPU runs. (Cheap: the feature test is cached by std; a pool
    /// still picks once, when it opens.)
    pub fn best() -> ParityKernels {
        #[cfg(target_arch = "x86_64")]
        if avx2_available() {
            return ParityKernels { isa: Isa::Avx2 };
        }
        ParityKernels::portable()
    }

    /// The portable kernels (baseline instruction set).
    pub fn portable() -> ParityKernels {
        ParityKernels { isa: Isa::Portable }
    }

    /// Every implementation this CPU runs, slowest first.
    pub fn available() -> impl Iterator<Item = ParityKernels> {
        let mut all = vec![ParityKernels::portable()];
        #[cfg(target_arch = "x86_64")]
        if avx2_available() {
            all.push(ParityKernels { isa: Isa::Avx2 });
        }
        all.into_iter()
    }

    /// A short name: `portable` or `avx2`.
    pub fn name(self) -> &'static str {
        match self.isa {
            Isa::Portable => "portable",
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => "avx2",
        }
    }

    /// Computes P (one output), P and Q (two) or P, Q and R (three) of `data` into `parity`.
    ///
    /// Every parity buffer has the same length; each data column is at most that long and
    /// counts as zero-padded to it (ZFS's short columns). Panics if these shapes are wrong or
    /// there are more than [`RAIDZ_WIDTH_MAX`] columns (a caller's logic error).
    pub fn generate<D: AsRef<[u8]>, P: AsMut<[u8]>>(self, data: &[D], parity: &mut [P]) {
        assert!(
            (1..=RAIDZ_PARITY_MAX).contains(&parity.len()),
            "{} parity outputs",
            parity.len()
        );
        let mut out: [Option<&mut [u8]>; 3] = [None, None, None];
        for (slot, p) in out.iter_mut().zip(parity.iter_mut()) {
            *slot = Some(p.as_mut());
        }
        self.generate_rows(data, &mut out);
    }

    /// Regenerates, from the data columns, the parity columns of `which` in a block's columns
    /// (`cols`: `parity_count` parity columns, then the data columns, as in the map).
    pub fn regenerate_parity(self, cols: &mut [&mut [u8]], parity_count: usize, which: ColumnSet) {
        check_shape(cols.len(), parity_count);
        assert!(
            which.is_subset(ColumnSet::range(0, parity_count)),
            "{which:?} not parity"
        );
        let (parity, data) = cols.split_at_mut(parity_count);
        let mut out: [Option<&mut [u8]>; 3] = [None, None, None];
        for (row, p) in parity.iter_mut().enumerate() {
            if which.contains(row) {
                out[row] = Some(&mut **p);
            }
        }
        self.generate_rows(&*data, &mut out);
    }

    /// The parity columns of `which` whose stored bytes differ from the parity of the data
    /// columns (`cols` as for [`ParityKernels::regenerate_parity`]). Computes in registers: no
    /// scratch buffer.
    pub fn check_parity<D: AsRef<[u8]>>(
        self,
        cols: &[D],
        parity_count: usize,
        which: ColumnSet,
    ) -> ColumnSet {
        check_shape(cols.len(), parity_count);
        assert!(
            which.is_subset(ColumnSet::range(0, parity_count)),
            "{which:?} not parity"
        );
        let Some(top) = which.iter().last() else {
            return ColumnSet::EMPTY;
        };
        let (parity, data) = cols.split_at(parity_count);
        let mut stored: [Option<&[u8]>; 3] = [None, None, None];
        for row in which.iter() {
            stored[row] = Some(parity[row].as_ref());
        }
        let len = common_len(stored.iter().flatten().map(|s| s.len()));
        check_data_lens(data, len);
        let differ = match (self.isa, top + 1) {
            (Isa::Portable, 1) => kernels::verify::<1, PORTABLE_CHUNK, D>(data, &stored, len),
            (Isa::Portable, 2) => kernels::verify::<2, PORTABLE_CHUNK, D>(data, &stored, len),
            (Isa::Portable, _) => kernels::verify::<3, PORTABLE_CHUNK, D>(data, &stored, len),
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Isa::Avx2` exists only when the CPU has AVX2 (see `available`).
            (Isa::Avx2, np) => unsafe { avx2::verify(np, data, &stored, len) },
        };
        ColumnSet::from_bits(differ as u64)
    }

    /// Writes the parity rows whose output is `Some`.
    fn generate_rows<D: AsRef<[u8]>>(self, data: &[D], out: &mut [Option<&mut [u8]>; 3]) {
        let Some(top) = out.iter().rposition(|o| o.is_some()) else {
            return;
        };
        assert!(
            !data.is_empty() && data.len() < RAIDZ_WIDTH_MAX,
            "{} data columns",
            data.len()
        );
        let len = common_len(out.iter().flatten().map(|o| o.len()));
        check_data_lens(data, len);
        match (self.isa, top + 1) {
            (Isa::Portable, 1) => kernels::generate::<1, PORTABLE_CHUNK, D>(data, out, len),
            (Isa::Portable, 2) => kernels::generate::<2, PORTABLE_CHUNK, D>(data, out, len),
            (Isa::Portable, _) => kernels::generate::<3, PORTABLE_CHUNK, D>(data, out, len),
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Isa::Avx2` exists only when the CPU has AVX2 (see `available`).
            (Isa::Avx2, np) => unsafe { avx2::generate(np, data, out, len) },
        }
    }
}

/// The length all of `lens` share (panics if they differ: parity columns are equally long).
pub(super) fn common_len(mut lens: impl Iterator<Item = usize>) -> usize {
    let first = lens.next().expect("at least one parity column");
    for len in lens {
        assert_eq!(len, first, "parity columns of different lengths");
    }
    first
}

/// Panics unless every data column is at most `len` bytes.
pub(super) fn check_data_lens<D: AsRef<[u8]>>(data: &[D], len: usize) {
    for (i, d) in data.iter().enumerate() {
        let got = d.as_ref().len();
        assert!(got <= len, "data column {i} is {got} bytes, parity {len}");
    }
}

/// Panics unless `cols` columns with `parity_count` parity make a block's columns.
pub(super) fn check_shape(cols: usize, parity_count: usize) {
    assert!(
        (1..=RAIDZ_PARITY_MAX).contains(&parity_count),
        "parity {parity_count}"
    );
    assert!(
        cols > parity_count && cols <= RAIDZ_WIDTH_MAX,
        "{cols} columns with parity {parity_count}"
    );
}

/// The AVX2 copies of the kernels: the same source, compiled with AVX2 enabled. Callers must
/// have checked that the CPU has AVX2.
#[cfg(target_arch = "x86_64")]
pub(super) mod avx2 {
    use super::super::gf;
    use super::super::kernels::{self, Solve};
    use super::AVX2_CHUNK;
    use std::arch::x86_64::{
        __m256i, _mm256_and_si256, _mm256_loadu_si256, _mm256_set1_epi8, _mm256_setzero_si256,
        _mm256_shuffle_epi8, _mm256_srli_epi16, _mm256_storeu_si256, _mm256_xor_si256,
    };

    #[target_feature(enable = "avx2")]
    pub(in super::super) fn generate<D: AsRef<[u8]>>(
        np: usize,
        data: &[D],
        out: &mut [Option<&mut [u8]>; 3],
        len: usize,
    ) {
        match np {
            1 => kernels::generate::<1, AVX2_CHUNK, D>(data, out, len),
            2 => kernels::generate::<2, AVX2_CHUNK, D>(data, out, len),
            _ => kernels::generate::<3, AVX2_CHUNK, D>(data, out, len),
        }
    }

    #[target_feature(enable = "avx2")]
    pub(in super::super) fn verify<D: AsRef<[u8]>>(
        np: usize,
        data: &[D],
        stored: &[Option<&[u8]>; 3],
        len: usize,
    ) -> u8 {
        match np {
            1 => kernels::verify::<1, AVX2_CHUNK, D>(data, stored, len),
            2 => kernels::verify::<2, AVX2_CHUNK, D>(data, stored, len),
            _ => kernels::verify::<3, AVX2_CHUNK, D>(data, stored, len),
        }
    }

    /// The nibble tables of one constant `c`, each 16-byte table twice (one per 128-bit lane,
    /// since `vpshufb` looks up within lanes): `low[i] = c * i` and `high[i] = c * (i << 4)`,
    /// so `c * x = low[x & 15] ^ high[x >> 4]` (multiplication is linear over XOR).
    #[derive(Clone, Copy)]
    struct NibbleTables {
        low: __m256i,
        high: __m256i,
    }

    #[target_feature(enable = "avx2")]
    fn nibble_tables(c: u8) -> NibbleTables {
        let mut low = [0u8; 32];
        let mut high = [0u8; 32];
        for i in 0..16u8 {
            low[i as usize] = gf::mul(c, i);
            high[i as usize] = gf::mul(c, i << 4);
        }
        low.copy_within(0..16, 16);
        high.copy_within(0..16, 16);
        // SAFETY: 32-byte unaligned loads from 32-byte arrays.
        unsafe {
            NibbleTables {
                low: _mm256_loadu_si256(low.as_ptr().cast()),
                high: _mm256_loadu_si256(high.as_ptr().cast()),
            }
        }
    }

    /// Target `b` of a chunk: `sum over a of coef[b][a] * S[a]` by nibble-table lookups,
    /// `vpshufb` being a 32-way 16-entry table lookup: 6 instructions per 32 bytes and term,
    /// where the portable doubling takes about 40.
    #[target_feature(enable = "avx2")]
    fn combine_by_tables<const NP: usize>(
        tables: &[[NibbleTables; 3]; 3],
        solve: &Solve,
        b: usize,
        syn: &[[u8; AVX2_CHUNK]; NP],
    ) -> [u8; AVX2_CHUNK] {
        let nibble = _mm256_set1_epi8(0x0f);
        let mut out = [0u8; AVX2_CHUNK];
        for lane in 0..AVX2_CHUNK / 32 {
            let mut sum = _mm256_setzero_si256();
            for a in 0..solve.k {
                let t = tables[b][a];
                // SAFETY: a 32-byte load inside the chunk array (lane * 32 + 32 <= AVX2_CHUNK).
                let x =
                    unsafe { _mm256_loadu_si256(syn[solve.rows[a]][lane * 32..].as_ptr().cast()) };
                let low = _mm256_and_si256(x, nibble);
                let high = _mm256_and_si256(_mm256_srli_epi16::<4>(x), nibble);
                sum = _mm256_xor_si256(sum, _mm256_shuffle_epi8(t.low, low));
                sum = _mm256_xor_si256(sum, _mm256_shuffle_epi8(t.high, high));
            }
            // SAFETY: a 32-byte store inside the chunk array.
            unsafe { _mm256_storeu_si256(out[lane * 32..].as_mut_ptr().cast(), sum) };
        }
        out
    }

    #[target_feature(enable = "avx2")]
    pub(in super::super) fn reconstruct(
        np: usize,
        parity: &[&mut [u8]],
        data: &mut [&mut [u8]],
        solve: &Solve,
        len: usize,
    ) {
        let zero = nibble_tables(0);
        let mut tables = [[zero; 3]; 3];
        for (row, coefs) in tables.iter_mut().zip(&solve.coef).take(solve.k) {
            for (table, &c) in row.iter_mut().zip(coefs).take(solve.k) {
                *table = nibble_tables(c);
            }
        }
        match np {
            1 => kernels::reconstruct::<1, AVX2_CHUNK, _>(parity, data, solve, len, |b, syn| {
                combine_by_tables(&tables, solve, b, syn)
            }),
            2 => kernels::reconstruct::<2, AVX2_CHUNK, _>(parity, data, solve, len, |b, syn| {
                combine_by_tables(&tables, solve, b, syn)
            }),
            _ => kernels::reconstruct::<3, AVX2_CHUNK, _>(parity, data, solve, len, |b, syn| {
                combine_by_tables(&tables, solve, b, syn)
            }),
        }
    }
}
