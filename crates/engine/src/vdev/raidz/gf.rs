//! GF(2^8), the field of raidz parity: polynomial x^8 + x^4 + x^3 + x^2 + 1 (0x11d) and
//! generator 2, as ZFS (and Linux md's RAID-6) use. Addition is XOR.
//!
//! These scalar operations serve the small matrices of reconstruction (a few dozen products per
//! block, never per byte); the bulk loops multiply by 2 and 4 with [`mul2`] and [`mul4`], which
//! compile to a handful of vector instructions.

/// The field's reduction polynomial, with the x^8 bit.
pub const POLY: u16 = 0x11d;

/// `EXP[i] = 2^i` for i in 0..510 (twice the period, so a sum of two logs needs no modulo) and
/// `LOG[x] = log2(x)` for x != 0. Built at compile time by repeated doubling.
const TABLES: ([u8; 510], [u8; 256]) = build_tables();
const EXP: [u8; 510] = TABLES.0;
const LOG: [u8; 256] = TABLES.1;

const fn build_tables() -> ([u8; 510], [u8; 256]) {
    let mut exp = [0u8; 510];
    let mut log = [0u8; 256];
    let mut x: u16 = 1;
    let mut i = 0;
    // Bounded: 255 steps, the order of the multiplicative group.
    while i < 255 {
        exp[i] = x as u8;
        exp[i + 255] = x as u8;
        log[x as usize] = i as u8;
        x <<= 1;
        if x & 0x100 != 0 {
            x ^= POLY;
        }
        i += 1;
    }
    (exp, log)
}

/// `x * 2`: shift left, and reduce by the polynomial when the top bit falls out. Branch-free
/// (the arithmetic shift makes 0xff or 0x00), so a loop of these vectorizes.
#[inline(always)]
pub fn mul2(x: u8) -> u8 {
    (x << 1) ^ ((((x as i8) >> 7) as u8) & 0x1d)
}

/// `x * 4`, in one step: bit 7 of x reduces to 0x1d * 2 = 0x3a, bit 6 to 0x1d.
#[inline(always)]
pub fn mul4(x: u8) -> u8 {
    (x << 2) ^ ((((x as i8) >> 7) as u8) & 0x3a) ^ (((((x << 1) as i8) >> 7) as u8) & 0x1d)
}

/// `a * b`.
pub fn mul(a: u8, b: u8) -> u8 {
    if a == 0 || b == 0 {
        return 0;
    }
    EXP[LOG[a as usize] as usize + LOG[b as usize] as usize]
}

/// `1 / a`. Panics on zero, which has no inverse (a caller's logic error: the raidz matrices
/// are invertible by construction).
pub fn inv(a: u8) -> u8 {
    assert!(a != 0, "zero has no inverse in GF(2^8)");
    EXP[255 - LOG[a as usize] as usize]
}

/// `2^e`.
pub fn pow2(e: u64) -> u8 {
    EXP[(e % 255) as usize]
}

/// The coefficient of data column `data_index` (of `data_count`) in parity row `row` (0 = P,
/// 1 = Q, 2 = R): `(2^row)^(data_count - 1 - data_index)`. The **first** data column gets the
/// highest power, because parity is computed by Horner's rule from the first column on (one of
/// the two traps: `gf256::raid` uses the reverse order and its bytes differ).
pub fn coefficient(row: usize, data_index: usize, data_count: usize) -> u8 {
    debug_assert!(row < 3 && data_index < data_count);
    pow2(row as u64 * (data_count - 1 - data_index) as u64)
}

/// Inverts the `k`x`k` matrix `m` (k <= 3) in place by Gauss-Jordan elimination. Returns false
/// if it is singular (never for raidz's matrices; the callers assert it).
pub fn invert(m: &mut [[u8; 3]; 3], k: usize) -> bool {
    debug_assert!(k <= 3);
    let mut inverse = [[0u8; 3]; 3];
    for (i, row) in inverse.iter_mut().enumerate().take(k) {
        row[i] = 1;
    }
    for col in 0..k {
        let Some(pivot) = (col..k).find(|&r| m[r][col] != 0) else {
            return false;
        };
        m.swap(col, pivot);
        inverse.swap(col, pivot);
        let scale = inv(m[col][col]);
        for j in 0..k {
            m[col][j] = mul(m[col][j], scale);
            inverse[col][j] = mul(inverse[col][j], scale);
        }
        for r in 0..k {
            let factor = m[r][col];
            if r != col && factor != 0 {
                for j in 0..k {
                    m[r][j] ^= mul(factor, m[col][j]);
                    inverse[r][j] ^= mul(factor, inverse[col][j]);
                }
            }
        }
    }
    *m = inverse;
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Carry-less multiplication reduced bit by bit: the definition, independent of the tables.
    fn mul_slow(a: u8, b: u8) -> u8 {
        let mut product: u16 = 0;
        for bit in 0..8 {
            if b >> bit & 1 != 0 {
                product ^= (a as u16) << bit;
            }
        }
        for bit in (8..16).rev() {
            if product >> bit & 1 != 0 {
                product ^= POLY << (bit - 8);
            }
        }
        product as u8
    }

    #[test]
    fn products_match_the_definition() {
        for a in 0..=255u8 {
            assert_eq!(mul2(a), mul_slow(a, 2));
            assert_eq!(mul4(a), mul_slow(a, 4));
            for b in 0..=255u8 {
                assert_eq!(mul(a, b), mul_slow(a, b), "{a} * {b}");
            }
            if a != 0 {
                assert_eq!(mul(a, inv(a)), 1);
            }
        }
    }

    #[test]
    fn two_generates_the_group() {
        let mut seen = [false; 256];
        for e in 0..255 {
            let x = pow2(e);
            assert!(!seen[x as usize], "2^{e} repeats");
            seen[x as usize] = true;
        }
        assert!(!seen[0]);
    }

    #[test]
    #[allow(clippy::needless_range_loop)] // Matrix products read best with indices.
    fn inverts_vandermonde_matrices() {
        for k in 1..=3 {
            for (x, y, z) in [(0, 1, 2), (3, 9, 30), (0, 62, 61)] {
                let cols = [x, y, z];
                let mut m = [[0u8; 3]; 3];
                for (row, m_row) in m.iter_mut().enumerate().take(k) {
                    for b in 0..k {
                        m_row[b] = coefficient(row, cols[b], 63);
                    }
                }
                let original = m;
                assert!(invert(&mut m, k));
                for (i, row) in original.iter().enumerate().take(k) {
                    for j in 0..k {
                        let dot = (0..k).fold(0, |acc, t| acc ^ mul(row[t], m[t][j]));
                        assert_eq!(dot, u8::from(i == j));
                    }
                }
            }
        }
        let mut singular = [[1, 1, 0], [1, 1, 0], [0, 0, 0]];
        assert!(!invert(&mut singular, 2));
    }
}
