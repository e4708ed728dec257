//! Rebuilding missing data columns from parity: every case of up to three missing data
//! columns with any surviving parity rows (ZFS's rec_p, rec_q, rec_r, rec_pq, rec_pr, rec_qr,
//! rec_pqr, in one general form).
//!
//! With data columns D_0..D_{n-1} and parity row j's coefficients g_j^(n-1-i) (g = 1, 2, 4),
//! the syndrome of row j, S_j = stored parity XOR the parity of the surviving data, equals the
//! parity of the missing columns alone: S_j = sum over missing x of g_j^(n-1-x) D_x. That is a
//! k x k system (k <= 3 missing columns, the first k surviving rows); it is always solvable:
//! the powers 2^(n-1-x) are distinct for n < 255, so the PQ, PQR systems are Vandermonde, PR
//! is (a ^ b)^2 != 0 and QR is ab(a ^ b) != 0. The inverse is computed once per block (a few
//! dozen field operations), and the kernel applies it byte-wise, in the same pass that
//! computes the syndromes: one read of every surviving column, one write of each rebuilt one.

use super::error::RaidzError;
use super::gf;
use super::kernels::{self, Solve};
use super::parity::{check_data_lens, check_shape, common_len, Isa, PORTABLE_CHUNK};
use super::{ColumnSet, ParityKernels};

impl ParityKernels {
    /// Rebuilds, in place, the data columns of `bad` in a block's columns (`cols`:
    /// `parity_count` parity columns, then the data columns, as in the map) from the other
    /// data columns and the first surviving parity rows (P before Q before R, as ZFS picks
    /// them). Parity columns in `bad` are neither read nor written (regenerate them with
    /// [`ParityKernels::regenerate_parity`] once the data is whole).
    ///
    /// Returns the parity columns the solution used: over the bytes of the rebuilt columns,
    /// regenerating one of them gives back its stored bytes by construction (only past the end
    /// of a short rebuilt column can it still disagree).
    /// Fails if fewer parity columns survive than data columns are bad.
    pub fn reconstruct(
        self,
        cols: &mut [&mut [u8]],
        parity_count: usize,
        bad: ColumnSet,
    ) -> Result<ColumnSet, RaidzError> {
        check_shape(cols.len(), parity_count);
        let data_count = cols.len() - parity_count;
        let bad_data = bad.intersection(ColumnSet::range(parity_count, cols.len()));
        if bad_data.is_empty() {
            return Ok(ColumnSet::EMPTY);
        }
        let good_parity = ColumnSet::range(0, parity_count).difference(bad);
        let k = bad_data.len();
        if k > good_parity.len() {
            return Err(RaidzError::TooManyMissing {
                missing: k,
                parity: good_parity.len(),
            });
        }
        let rows_used = good_parity.lowest(k);
        let mut solve = Solve {
            k,
            targets: [0; 3],
            rows: [0; 3],
            coef: [[0; 3]; 3],
            top_bit: [0; 3],
            last_from_p: rows_used.contains(0),
            zero_mask: 0,
        };
        for (b, column) in bad_data.iter().enumerate() {
            solve.targets[b] = column - parity_count;
            solve.zero_mask |= 1 << (column - parity_count);
        }
        for (a, row) in rows_used.iter().enumerate() {
            solve.rows[a] = row;
        }
        // m[a][b]: coefficient of missing column b in syndrome a; its inverse maps the
        // syndromes back to the columns.
        let mut m = [[0u8; 3]; 3];
        for (a, m_row) in m.iter_mut().enumerate().take(k) {
            for (b, entry) in m_row.iter_mut().enumerate().take(k) {
                *entry = gf::coefficient(solve.rows[a], solve.targets[b], data_count);
            }
        }
        assert!(gf::invert(&mut m, k), "raidz systems are invertible");
        solve.coef = m;
        for b in 0..k {
            let bits = solve.coef[b][..k].iter().fold(0u8, |acc, &c| acc | c);
            debug_assert!(bits != 0, "an invertible matrix has no zero row");
            solve.top_bit[b] = 7 - bits.leading_zeros().min(7);
        }

        let len = common_len(rows_used.iter().map(|row| cols[row].len()));
        let (parity, data) = cols.split_at_mut(parity_count);
        check_data_lens(data, len);
        let np = solve.rows[k - 1] + 1;
        match (self.isa, np) {
            (Isa::Portable, 1) => {
                kernels::reconstruct::<1, PORTABLE_CHUNK, _>(parity, data, &solve, len, |b, syn| {
                    kernels::combine_by_doubling(&solve, b, syn)
                })
            }
            (Isa::Portable, 2) => {
                kernels::reconstruct::<2, PORTABLE_CHUNK, _>(parity, data, &solve, len, |b, syn| {
                    kernels::combine_by_doubling(&solve, b, syn)
                })
            }
            (Isa::Portable, _) => {
                kernels::reconstruct::<3, PORTABLE_CHUNK, _>(parity, data, &solve, len, |b, syn| {
                    kernels::combine_by_doubling(&solve, b, syn)
                })
            }
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Isa::Avx2` exists only when the CPU has AVX2 (see `available`).
            (Isa::Avx2, np) => unsafe {
                super::parity::avx2::reconstruct(np, parity, data, &solve, len)
            },
        }
        Ok(rows_used)
    }
}
