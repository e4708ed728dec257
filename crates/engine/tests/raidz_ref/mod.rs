//! Shared by the raidz tests: a slow, obviously correct reference for raidz parity (byte by
//! byte, with GF(2^8) log/exp tables built here from the definition, independently of the
//! engine's), a seeded byte generator, and helpers to hold a block's columns.

#![allow(dead_code)] // Each test file uses part of this.

use oxpool_engine::vdev::raidz::RaidzMap;

/// GF(2^8) with polynomial 0x11d, from the definition: carry-less product reduced bit by bit.
pub fn gf_mul_bitwise(a: u8, b: u8) -> u8 {
    let mut product: u16 = 0;
    for bit in 0..8 {
        if b >> bit & 1 != 0 {
            product ^= (a as u16) << bit;
        }
    }
    for bit in (8..16).rev() {
        if product >> bit & 1 != 0 {
            product ^= 0x11d << (bit - 8);
        }
    }
    product as u8
}

/// Log/exp tables built with the bitwise product above.
pub struct RefField {
    exp: [u8; 255],
    log: [u8; 256],
}

impl RefField {
    pub fn new() -> RefField {
        let mut exp = [0u8; 255];
        let mut log = [0u8; 256];
        let mut x = 1u8;
        for (i, e) in exp.iter_mut().enumerate() {
            *e = x;
            log[x as usize] = i as u8;
            x = gf_mul_bitwise(x, 2);
        }
        assert_eq!(x, 1, "2 generates the group");
        RefField { exp, log }
    }

    pub fn mul(&self, a: u8, b: u8) -> u8 {
        if a == 0 || b == 0 {
            0
        } else {
            self.exp[(self.log[a as usize] as usize + self.log[b as usize] as usize) % 255]
        }
    }

    /// `g^e` for a generator g = 2^g_log.
    pub fn pow(&self, g_log: usize, e: usize) -> u8 {
        self.exp[(g_log * e) % 255]
    }

    /// Parity row `row` (0 = P, 1 = Q, 2 = R: generator 1, 2, 4) of `data`, `len` bytes:
    /// byte t is the sum over columns i of g^(n-1-i) * D_i[t], a missing byte (short column)
    /// counting as zero. The definition, with no Horner and no chunking.
    pub fn parity(&self, row: usize, data: &[&[u8]], len: usize) -> Vec<u8> {
        let n = data.len();
        let mut out = vec![0u8; len];
        for (i, column) in data.iter().enumerate() {
            assert!(column.len() <= len);
            let coefficient = self.pow(row, n - 1 - i);
            for (t, &byte) in column.iter().enumerate() {
                out[t] ^= self.mul(coefficient, byte);
            }
        }
        out
    }
}

/// Seeded bytes (splitmix64), so every failure replays from its seed.
pub fn bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut state = seed;
    let mut out = Vec::with_capacity(len);
    while out.len() < len {
        state = state.wrapping_add(0x9e3779b97f4a7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58476d1ce4e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d049bb133111eb);
        z ^= z >> 31;
        out.extend_from_slice(&z.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// The columns of one block (parity first, as in the map), owned.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stripe {
    pub parity_count: usize,
    pub columns: Vec<Vec<u8>>,
}

impl Stripe {
    /// A block's columns with the shape of `map` but `bytes_per_sector` bytes per sector
    /// (the map's structure depends only on sector counts, so a small sector gives every case
    /// at a fraction of the bytes), data from `seed`, parity from the reference.
    pub fn from_map(
        field: &RefField,
        map: &RaidzMap,
        bytes_per_sector: usize,
        seed: u64,
    ) -> Stripe {
        let sector = map.layout().sector_bytes() as usize;
        let lens: Vec<usize> = (0..map.column_count())
            .map(|c| map.column_bytes(c) / sector * bytes_per_sector)
            .collect();
        Stripe::with_lens(field, map.parity_count(), &lens, seed)
    }

    /// Columns of the given lengths (parity first; parity columns as long as the longest).
    pub fn with_lens(field: &RefField, parity_count: usize, lens: &[usize], seed: u64) -> Stripe {
        let len = lens[..parity_count].iter().copied().max().unwrap();
        let mut columns: Vec<Vec<u8>> = vec![Vec::new(); parity_count];
        for (i, &l) in lens[parity_count..].iter().enumerate() {
            columns.push(bytes(seed.wrapping_mul(1000).wrapping_add(i as u64), l));
        }
        let parity: Vec<Vec<u8>> = {
            let data: Vec<&[u8]> = columns[parity_count..].iter().map(|c| &c[..]).collect();
            (0..parity_count)
                .map(|row| field.parity(row, &data, len))
                .collect()
        };
        for (row, p) in parity.into_iter().enumerate() {
            columns[row] = p;
        }
        Stripe {
            parity_count,
            columns,
        }
    }

    /// Mutable views of the columns, as the engine's functions take them.
    pub fn views(&mut self) -> Vec<&mut [u8]> {
        self.columns.iter_mut().map(|c| c.as_mut_slice()).collect()
    }

    /// The data columns concatenated: the block.
    pub fn block(&self) -> Vec<u8> {
        self.columns[self.parity_count..].concat()
    }
}

/// Every subset of `0..n` with 1 to `k_max` elements, as sorted index lists.
pub fn subsets(n: usize, k_max: usize) -> Vec<Vec<usize>> {
    let mut out = Vec::new();
    let mut current = Vec::new();
    fn walk(
        start: usize,
        n: usize,
        k_max: usize,
        current: &mut Vec<usize>,
        out: &mut Vec<Vec<usize>>,
    ) {
        for i in start..n {
            current.push(i);
            out.push(current.clone());
            if current.len() < k_max {
                walk(i + 1, n, k_max, current, out);
            }
            current.pop();
        }
    }
    walk(0, n, k_max, &mut current, &mut out);
    out
}
