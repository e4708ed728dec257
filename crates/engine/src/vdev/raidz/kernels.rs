//! The byte loops of raidz parity, written once in portable Rust. `parity.rs` compiles each
//! twice, for the baseline target and (on x86-64) with AVX2 enabled, and picks one at run time.
//!
//! Every loop walks the columns in chunks of `C` bytes (a few vector registers) and keeps its
//! accumulators for the chunk in registers while it visits each data column in turn: one load
//! per data byte, one store per parity byte ("row-blocked"). The per-byte operations are
//! branch-free (`gf::mul2`, `gf::mul4`), so LLVM turns the fixed-length inner loops into
//! vector instructions (SSE2 on the baseline, AVX2 when enabled).
//!
//! Data columns may be shorter than the parity (ZFS's short columns): past a column's end it
//! counts as zeros, **and the Horner accumulators are still multiplied for its step** (the
//! first trap of raidz parity: skipping the step gives different bytes).

// Index loops over fixed-size chunks are the form LLVM vectorizes reliably, and they read
// like the math; iterator chains over several arrays at once would hide both.
#![allow(clippy::needless_range_loop)]

use super::gf::{mul2, mul4};

/// The Horner step for one data chunk: `P ^= d`, `Q = 2Q ^ d`, `R = 4R ^ d`.
#[inline(always)]
fn step<const NP: usize, const C: usize>(acc: &mut [[u8; C]; NP], d: &[u8; C]) {
    for i in 0..C {
        acc[0][i] ^= d[i];
        if NP > 1 {
            acc[1][i] = mul2(acc[1][i]) ^ d[i];
        }
        if NP > 2 {
            acc[2][i] = mul4(acc[2][i]) ^ d[i];
        }
    }
}

/// The Horner step for a column that is zero here (missing, or past its end).
#[inline(always)]
fn step_zero<const NP: usize, const C: usize>(acc: &mut [[u8; C]; NP]) {
    for i in 0..C {
        if NP > 1 {
            acc[1][i] = mul2(acc[1][i]);
        }
        if NP > 2 {
            acc[2][i] = mul4(acc[2][i]);
        }
    }
}

/// `C` bytes of `column` from `off`, zero-padded past its end; `None` if it ends before `off`.
#[inline(always)]
fn load<const C: usize>(column: &[u8], off: usize) -> Option<[u8; C]> {
    if off + C <= column.len() {
        Some(column[off..off + C].try_into().expect("C bytes"))
    } else if off < column.len() {
        let mut chunk = [0u8; C];
        chunk[..column.len() - off].copy_from_slice(&column[off..]);
        Some(chunk)
    } else {
        None
    }
}

/// The first `NP` parities (P, Q, R) of the chunk at `off` over the data columns, with the
/// columns whose bit is set in `zero_mask` (bit i = data column i) counted as zeros.
#[inline(always)]
pub(super) fn accumulate<const NP: usize, const C: usize, D: AsRef<[u8]>>(
    data: &[D],
    zero_mask: u64,
    off: usize,
) -> [[u8; C]; NP] {
    let mut acc = [[0u8; C]; NP];
    // Bounded: one step per data column (at most RAIDZ_WIDTH_MAX).
    for (i, column) in data.iter().enumerate() {
        let column = column.as_ref();
        if zero_mask >> i & 1 == 0 && off + C <= column.len() {
            // The hot case, kept free of the copy below.
            step(&mut acc, column[off..off + C].try_into().expect("C bytes"));
        } else if let (0, Some(chunk)) = (zero_mask >> i & 1, load::<C>(column, off)) {
            step(&mut acc, &chunk);
        } else {
            step_zero(&mut acc);
        }
    }
    acc
}

/// Writes the parities of `data` into the outputs that are `Some` (row 0 = P, 1 = Q, 2 = R;
/// at most `NP` rows), all `len` bytes long.
#[inline(always)]
pub(super) fn generate<const NP: usize, const C: usize, D: AsRef<[u8]>>(
    data: &[D],
    out: &mut [Option<&mut [u8]>; 3],
    len: usize,
) {
    let mut off = 0;
    // Bounded: len / C + 1 chunks.
    while off < len {
        let n = C.min(len - off);
        let acc = accumulate::<NP, C, D>(data, 0, off);
        for (row, parity) in acc.iter().enumerate() {
            if let Some(o) = out[row].as_deref_mut() {
                o[off..off + n].copy_from_slice(&parity[..n]);
            }
        }
        off += n;
    }
}

/// Which of the stored parities that are `Some` differ from the parity of `data`: bit `row`
/// of the result.
#[inline(always)]
pub(super) fn verify<const NP: usize, const C: usize, D: AsRef<[u8]>>(
    data: &[D],
    stored: &[Option<&[u8]>; 3],
    len: usize,
) -> u8 {
    let mut differ = 0u8;
    let mut off = 0;
    while off < len {
        let n = C.min(len - off);
        let acc = accumulate::<NP, C, D>(data, 0, off);
        for (row, parity) in acc.iter().enumerate() {
            if let Some(s) = stored[row] {
                if s[off..off + n] != parity[..n] {
                    differ |= 1 << row;
                }
            }
        }
        off += n;
    }
    differ
}

/// How to rebuild up to three data columns from as many parity rows (worked out by
/// `reconstruct.rs` from the inverse of the system's matrix).
#[derive(Clone, Copy, Debug)]
pub(super) struct Solve {
    /// Missing data columns (`k` of them).
    pub k: usize,
    /// Data-column indices of the missing columns.
    pub targets: [usize; 3],
    /// Parity rows whose syndromes are used, in order (`k` of them).
    pub rows: [usize; 3],
    /// `D[targets[b]] = sum over a of coef[b][a] * S[a]`, S[a] the syndrome of `rows[a]`.
    pub coef: [[u8; 3]; 3],
    /// Highest bit set in `coef[b][..k]`, per target (the doublings its product needs).
    pub top_bit: [u32; 3],
    /// When row 0 (P, all coefficients 1) is used, the last target is the XOR of the P
    /// syndrome and the other targets: no multiplication.
    pub last_from_p: bool,
    /// Bit i set: data column i is a target (counted as zero when accumulating).
    pub zero_mask: u64,
}

/// Target `b` of `solve` from the syndromes of one chunk: `sum over a of coef[b][a] * S[a]`,
/// where syndrome `a` is `syn[rows[a]]`, with the doublings shared between the terms: Horner
/// over the bits of the coefficients, from the top one down. At most 8 doublings and 8 * k
/// XORs per chunk, all vectorized, no table lookups: the portable way to multiply by a
/// constant. (The AVX2 kernels multiply with nibble tables instead: `parity.rs`.)
#[inline(always)]
pub(super) fn combine_by_doubling<const NP: usize, const C: usize>(
    solve: &Solve,
    b: usize,
    syn: &[[u8; C]; NP],
) -> [u8; C] {
    let coef = &solve.coef[b];
    let mut out = [0u8; C];
    // Bounded: at most 8 bits.
    for bit in (0..=solve.top_bit[b]).rev() {
        for x in out.iter_mut() {
            *x = mul2(*x);
        }
        for a in 0..solve.k {
            if coef[a] >> bit & 1 != 0 {
                let s = &syn[solve.rows[a]];
                for i in 0..C {
                    out[i] ^= s[i];
                }
            }
        }
    }
    out
}

/// Writes `chunk` (the chunk at `off`) into `column`, as many bytes as the column has there: a
/// short column gets only its own bytes.
#[inline(always)]
fn store<const C: usize>(column: &mut [u8], off: usize, chunk: &[u8; C]) {
    if off + C <= column.len() {
        column[off..off + C].copy_from_slice(chunk);
    } else if off < column.len() {
        let m = column.len() - off;
        column[off..].copy_from_slice(&chunk[..m]);
    }
}

/// Rebuilds the target data columns of `solve` in place from the stored `parity` columns (all
/// `len` bytes long; only the rows of `solve` are read) and the other data columns. A short
/// target column gets only the bytes it has. `combine(b, syndromes)` computes target `b` of a
/// chunk from its syndromes (indexed by parity row), e.g. [`combine_by_doubling`].
#[inline(always)]
pub(super) fn reconstruct<const NP: usize, const C: usize, F>(
    parity: &[&mut [u8]],
    data: &mut [&mut [u8]],
    solve: &Solve,
    len: usize,
    combine: F,
) where
    F: Fn(usize, &[[u8; C]; NP]) -> [u8; C],
{
    let k = solve.k;
    let solved = if solve.last_from_p { k - 1 } else { k };
    let mut off = 0;
    // Bounded: len / C + 1 chunks.
    while off < len {
        let mut acc = accumulate::<NP, C, &mut [u8]>(data, solve.zero_mask, off);
        // Syndromes, in place: stored parity XOR the parity of the surviving data, i.e. the
        // parity of the missing columns alone.
        for &row in &solve.rows[..k] {
            let stored = &parity[row][..len];
            if off + C <= len {
                let stored: &[u8; C] = stored[off..off + C].try_into().expect("C bytes");
                for i in 0..C {
                    acc[row][i] ^= stored[i];
                }
            } else {
                for (i, s) in stored[off..].iter().enumerate() {
                    acc[row][i] ^= s;
                }
            }
        }
        // With P among the rows (it is then row 0, the first syndrome), the last target is
        // S_P XOR the others.
        let mut rest = acc[0];
        for b in 0..solved {
            let d = combine(b, &acc);
            store(data[solve.targets[b]], off, &d);
            if solve.last_from_p {
                for i in 0..C {
                    rest[i] ^= d[i];
                }
            }
        }
        if solve.last_from_p {
            store(data[solve.targets[k - 1]], off, &rest);
        }
        off += C;
    }
}
