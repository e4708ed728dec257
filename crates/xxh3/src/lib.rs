//! xxh3-128, the pool's block checksum, with the widest vector unit the CPU has.
//!
//! Why a crate of its own: the build targets baseline x86-64 (the binary runs on any x86-64
//! machine), and the xxhash-rust crate chooses its stripe loop when it is compiled, so every
//! block was hashed with SSE2. Measured on this project's machine (an AMD EPYC with AVX-512,
//! 2026-11-28, a 128 KiB block in the CPU's cache, one core): the crate 36 GB/s (3.6 us per
//! block), this crate's AVX2 path 76 GB/s and its AVX-512 path 114 GB/s (1.15 us). Every
//! block a client writes is hashed once on arrival, and every block read from a device once
//! more before it is used, on the reactors (docs/io-scheduling.md).
//!
//! Inputs of up to 240 bytes, and every input on a CPU without AVX2, go to the xxhash-rust
//! crate. Longer inputs take the stripe loop here, with AVX-512 (foundation instructions only)
//! or AVX2, chosen once at run time, and the crate's scalar finish written out. The result is
//! exactly the crate's: `tests/equal.rs` compares every length up to 4 KiB and the block sizes,
//! at every alignment, on every path the CPU can run. The algorithm is xxh3's published one
//! (the default secret, 64-byte stripes, a scramble every 1 KiB): nothing here is a new format.
//!
//! The unsafe code is the vector intrinsics: each path is entered only after the CPU said it
//! has the instructions ([`Isa::is_available`]), and every load is inside the input or the secret
//! (the bounds are argued where the pointers are made).

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

/// Inputs up to this length take the crate's short paths (xxh3's `MID_SIZE_MAX`).
const MID_SIZE_MAX_BYTES: usize = 240;

/// Bytes hashed per accumulation: eight 64-bit lanes.
const STRIPE_BYTES: usize = 64;

/// The secret advances this much per stripe.
const SECRET_CONSUME_BYTES: usize = 8;

/// xxh3's default secret (the published `kSecret`), 192 bytes.
const SECRET: [u8; 192] = [
    0xb8, 0xfe, 0x6c, 0x39, 0x23, 0xa4, 0x4b, 0xbe, 0x7c, 0x01, 0x81, 0x2c, 0xf7, 0x21, 0xad, 0x1c,
    0xde, 0xd4, 0x6d, 0xe9, 0x83, 0x90, 0x97, 0xdb, 0x72, 0x40, 0xa4, 0xa4, 0xb7, 0xb3, 0x67, 0x1f,
    0xcb, 0x79, 0xe6, 0x4e, 0xcc, 0xc0, 0xe5, 0x78, 0x82, 0x5a, 0xd0, 0x7d, 0xcc, 0xff, 0x72, 0x21,
    0xb8, 0x08, 0x46, 0x74, 0xf7, 0x43, 0x24, 0x8e, 0xe0, 0x35, 0x90, 0xe6, 0x81, 0x3a, 0x26, 0x4c,
    0x3c, 0x28, 0x52, 0xbb, 0x91, 0xc3, 0x00, 0xcb, 0x88, 0xd0, 0x65, 0x8b, 0x1b, 0x53, 0x2e, 0xa3,
    0x71, 0x64, 0x48, 0x97, 0xa2, 0x0d, 0xf9, 0x4e, 0x38, 0x19, 0xef, 0x46, 0xa9, 0xde, 0xac, 0xd8,
    0xa8, 0xfa, 0x76, 0x3f, 0xe3, 0x9c, 0x34, 0x3f, 0xf9, 0xdc, 0xbb, 0xc7, 0xc7, 0x0b, 0x4f, 0x1d,
    0x8a, 0x51, 0xe0, 0x4b, 0xcd, 0xb4, 0x59, 0x31, 0xc8, 0x9f, 0x7e, 0xc9, 0xd9, 0x78, 0x73, 0x64,
    0xea, 0xc5, 0xac, 0x83, 0x34, 0xd3, 0xeb, 0xc3, 0xc5, 0x81, 0xa0, 0xff, 0xfa, 0x13, 0x63, 0xeb,
    0x17, 0x0d, 0xdd, 0x51, 0xb7, 0xf0, 0xda, 0x49, 0xd3, 0x16, 0x55, 0x26, 0x29, 0xd4, 0x68, 0x9e,
    0x2b, 0x16, 0xbe, 0x58, 0x7d, 0x47, 0xa1, 0xfc, 0x8f, 0xf8, 0xb8, 0xd1, 0x7a, 0xd0, 0x31, 0xce,
    0x45, 0xcb, 0x3a, 0x8f, 0x95, 0x16, 0x04, 0x28, 0xaf, 0xd7, 0xfb, 0xca, 0xbb, 0x4b, 0x40, 0x7e,
];

/// Stripes per block: a block ends with a scramble of the accumulators.
const STRIPES_PER_BLOCK: usize = (SECRET.len() - STRIPE_BYTES) / SECRET_CONSUME_BYTES;

/// Bytes per block (1 KiB).
const BLOCK_BYTES: usize = STRIPES_PER_BLOCK * STRIPE_BYTES;

/// Where the scramble's key starts in the secret (its last 64 bytes).
const SCRAMBLE_SECRET_AT: usize = SECRET.len() - STRIPE_BYTES;

/// Where the last stripe's key starts (not 8-aligned on purpose, as xxh3 defines it).
const LAST_STRIPE_SECRET_AT: usize = SECRET.len() - STRIPE_BYTES - 7;

/// Where the keys of the low half's merge start.
const MERGE_LOW_SECRET_AT: usize = 11;

/// Where the keys of the high half's merge start.
const MERGE_HIGH_SECRET_AT: usize = SECRET.len() - STRIPE_BYTES - 11;

const PRIME32_1: u64 = 0x9E37_79B1;
const PRIME32_2: u64 = 0x85EB_CA77;
const PRIME32_3: u64 = 0xC2B2_AE3D;
const PRIME64_1: u64 = 0x9E37_79B1_85EB_CA87;
const PRIME64_2: u64 = 0xC2B2_AE3D_27D4_EB4F;
const PRIME64_3: u64 = 0x1656_67B1_9E37_79F9;
const PRIME64_4: u64 = 0x85EB_CA77_C2B2_AE63;
const PRIME64_5: u64 = 0x27D4_EB2F_1656_67C5;

/// The accumulators before the first stripe.
const INITIAL_ACC: [u64; 8] = [
    PRIME32_3, PRIME64_1, PRIME64_2, PRIME64_3, PRIME64_4, PRIME32_2, PRIME64_5, PRIME32_1,
];

/// The xxh3-128 of `data`, as `xxhash_rust::xxh3::xxh3_128` computes it, with the fastest
/// path this CPU has.
pub fn xxh3_128(data: &[u8]) -> u128 {
    // SAFETY: `detected` returns only a path the CPU can run.
    unsafe { hash(Isa::detected(), data) }
}

/// The xxh3-128 of `data` with the path `isa`. Panics if the CPU cannot run it (see
/// [`Isa::available`]): calling an instruction the CPU lacks would be undefined behaviour.
pub fn xxh3_128_with(isa: Isa, data: &[u8]) -> u128 {
    assert!(
        isa.is_available(),
        "this CPU cannot run the {} path",
        isa.name()
    );
    // SAFETY: checked just above.
    unsafe { hash(isa, data) }
}

/// # Safety
///
/// The CPU can run `isa` ([`Isa::is_available`]).
unsafe fn hash(isa: Isa, data: &[u8]) -> u128 {
    if data.len() <= MID_SIZE_MAX_BYTES {
        return xxhash_rust::xxh3::xxh3_128(data);
    }
    match isa {
        Isa::Portable => xxhash_rust::xxh3::xxh3_128(data),
        // SAFETY: the CPU has AVX2 (the caller's contract).
        #[cfg(target_arch = "x86_64")]
        Isa::Avx2 => unsafe { x86::long_avx2(data) },
        // SAFETY: the CPU has AVX-512F (the caller's contract).
        #[cfg(target_arch = "x86_64")]
        Isa::Avx512 => unsafe { x86::long_avx512(data) },
        #[cfg(not(target_arch = "x86_64"))]
        _ => unreachable!("only x86-64 has vector paths here, and only they need a check"),
    }
}

/// A path of the stripe loop.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    /// The xxhash-rust crate as compiled (SSE2 on baseline x86-64).
    Portable = 0,
    /// 256-bit vectors: two per stripe.
    Avx2 = 1,
    /// 512-bit vectors (AVX-512F): one per stripe.
    Avx512 = 2,
}

impl Isa {
    /// Every path, fastest last.
    pub const ALL: [Isa; 3] = [Isa::Portable, Isa::Avx2, Isa::Avx512];

    /// The fastest path this CPU can run. Cheap: std caches the CPU's feature bits, so this
    /// is two loads, not a CPUID.
    pub fn detected() -> Isa {
        Isa::available().last().unwrap_or(Isa::Portable)
    }

    /// Whether this CPU can run the path.
    pub fn is_available(self) -> bool {
        match self {
            Isa::Portable => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => std::arch::is_x86_feature_detected!("avx2"),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => std::arch::is_x86_feature_detected!("avx512f"),
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    /// Every path this CPU can run.
    pub fn available() -> impl Iterator<Item = Isa> {
        Isa::ALL.into_iter().filter(|isa| isa.is_available())
    }

    /// A short name: `portable`, `avx2` or `avx512`.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Portable => "portable",
            Isa::Avx2 => "avx2",
            Isa::Avx512 => "avx512",
        }
    }
}

/// The 128-bit result from the accumulators after the last stripe (xxh3's `mergeAccs`, twice).
fn finish(acc: [u64; 8], len_bytes: usize) -> u128 {
    let len = len_bytes as u64;
    let low = merge(&acc, MERGE_LOW_SECRET_AT, len.wrapping_mul(PRIME64_1));
    let high = merge(&acc, MERGE_HIGH_SECRET_AT, !len.wrapping_mul(PRIME64_2));
    u128::from(low) | u128::from(high) << 64
}

fn merge(acc: &[u64; 8], secret_at: usize, start: u64) -> u64 {
    let key = |i: usize| {
        let at = secret_at + 8 * i;
        u64::from_le_bytes(SECRET[at..at + 8].try_into().expect("8 bytes"))
    };
    let mut result = start;
    for pair in 0..4 {
        let a = acc[2 * pair] ^ key(2 * pair);
        let b = acc[2 * pair + 1] ^ key(2 * pair + 1);
        let product = u128::from(a) * u128::from(b);
        result = result.wrapping_add(product as u64 ^ (product >> 64) as u64);
    }
    avalanche(result)
}

fn avalanche(mut h: u64) -> u64 {
    h ^= h >> 37;
    h = h.wrapping_mul(0x1656_6791_9E37_79F9);
    h ^ (h >> 32)
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::*;
    use std::arch::x86_64::*;

    /// The stripe loop over `input` (longer than 240 bytes), one copy per vector width: the
    /// vector type and its operations differ, the walk is the same.
    ///
    /// A stripe adds to the accumulators (mod 2^64) what depends only on its bytes and its key,
    /// so the stripes of a block are summed in two independent partial sums, even and odd
    /// stripes, added to the accumulators before the block's scramble: the same sums, without
    /// one chain of dependent additions through all sixteen stripes (AVX-512: 56 GB/s with the
    /// one chain, 114 with two).
    macro_rules! long_hash {
        ($name:ident, $feature:literal, $load:ident, $stripe:ident, $add:ident, $scramble:ident, $store:ident) => {
            #[target_feature(enable = $feature)]
            pub(super) unsafe fn $name(input: &[u8]) -> u128 {
                let len = input.len();
                debug_assert!(len > MID_SIZE_MAX_BYTES);
                let data = input.as_ptr();
                let secret = SECRET.as_ptr();
                // SAFETY (all loads below): the CPU has the feature (the caller checked).
                // Input: whole blocks end at `blocks * BLOCK_BYTES <= len - 1`; the partial
                // block's stripes end at `blocks * BLOCK_BYTES + stripes * STRIPE_BYTES <=
                // len - 1`; the last stripe is `len - 64 .. len` (len > 240). Secret: a
                // stripe's key ends at `(STRIPES_PER_BLOCK - 1) * 8 + 64 = 184`, the
                // scramble's at 192, the last stripe's at 185, of 192.
                unsafe {
                    let key = |stripe: usize| secret.add(stripe * SECRET_CONSUME_BYTES);
                    let mut acc = $load(INITIAL_ACC.as_ptr().cast());
                    let blocks = (len - 1) / BLOCK_BYTES;
                    for block in 0..blocks {
                        let at = data.add(block * BLOCK_BYTES);
                        let mut even = $stripe(at, key(0));
                        let mut odd = $stripe(at.add(STRIPE_BYTES), key(1));
                        for pair in 1..STRIPES_PER_BLOCK / 2 {
                            let stripe = 2 * pair;
                            even = $add(even, $stripe(at.add(stripe * STRIPE_BYTES), key(stripe)));
                            odd = $add(
                                odd,
                                $stripe(at.add((stripe + 1) * STRIPE_BYTES), key(stripe + 1)),
                            );
                        }
                        acc = $add(acc, $add(even, odd));
                        acc = $scramble(acc, secret.add(SCRAMBLE_SECRET_AT));
                    }
                    let stripes = ((len - 1) - blocks * BLOCK_BYTES) / STRIPE_BYTES;
                    debug_assert!(stripes < STRIPES_PER_BLOCK);
                    let at = data.add(blocks * BLOCK_BYTES);
                    for stripe in 0..stripes {
                        acc = $add(acc, $stripe(at.add(stripe * STRIPE_BYTES), key(stripe)));
                    }
                    acc = $add(
                        acc,
                        $stripe(
                            data.add(len - STRIPE_BYTES),
                            secret.add(LAST_STRIPE_SECRET_AT),
                        ),
                    );
                    finish($store(acc), len)
                }
            }
        };
    }

    long_hash!(
        long_avx512,
        "avx512f",
        load_512,
        stripe_512,
        add_512,
        scramble_512,
        store_512
    );
    long_hash!(
        long_avx2,
        "avx2",
        load_256,
        stripe_256,
        add_256,
        scramble_256,
        store_256
    );

    // AVX-512: the eight 64-bit lanes in one register.

    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn load_512(at: *const u8) -> __m512i {
        // SAFETY: 64 readable bytes at `at` (the caller's contract).
        unsafe { _mm512_loadu_si512(at.cast()) }
    }

    #[inline]
    #[target_feature(enable = "avx512f")]
    fn store_512(acc: __m512i) -> [u64; 8] {
        let mut out = [0u64; 8];
        // SAFETY: `out` is 64 writable bytes.
        unsafe { _mm512_storeu_si512(out.as_mut_ptr().cast(), acc) };
        out
    }

    /// What one stripe adds: to lane `i`, `lo32(d ^ k) * hi32(d ^ k)` of its own lane and the
    /// data of lane `i ^ 1`.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn stripe_512(input: *const u8, secret: *const u8) -> __m512i {
        // SAFETY: 64 readable bytes at each (the caller's contract).
        let (data, key) = unsafe { (load_512(input), load_512(secret)) };
        let mixed = _mm512_xor_si512(data, key);
        let product = _mm512_mul_epu32(mixed, _mm512_srli_epi64::<32>(mixed));
        let swapped = _mm512_shuffle_epi32::<_MM_PERM_BADC>(data);
        _mm512_add_epi64(product, swapped)
    }

    #[inline]
    #[target_feature(enable = "avx512f")]
    fn add_512(a: __m512i, b: __m512i) -> __m512i {
        _mm512_add_epi64(a, b)
    }

    /// Every block's end: `acc = (acc ^ acc >> 47 ^ key) * PRIME32_1`, the 64-bit product
    /// made of two 32-bit ones (a 64-bit multiply would need AVX-512DQ).
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn scramble_512(acc: __m512i, secret: *const u8) -> __m512i {
        // SAFETY: 64 readable bytes at `secret` (the caller's contract).
        let key = unsafe { load_512(secret) };
        let mixed = _mm512_xor_si512(_mm512_xor_si512(acc, _mm512_srli_epi64::<47>(acc)), key);
        let prime = _mm512_set1_epi64(PRIME32_1 as i64);
        let low = _mm512_mul_epu32(mixed, prime);
        let high = _mm512_mul_epu32(_mm512_srli_epi64::<32>(mixed), prime);
        _mm512_add_epi64(low, _mm512_slli_epi64::<32>(high))
    }

    // AVX2: the eight lanes in two registers.

    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn load_256(at: *const u8) -> [__m256i; 2] {
        // SAFETY: 64 readable bytes at `at` (the caller's contract).
        unsafe {
            [
                _mm256_loadu_si256(at.cast()),
                _mm256_loadu_si256(at.add(32).cast()),
            ]
        }
    }

    #[inline]
    #[target_feature(enable = "avx2")]
    fn store_256(acc: [__m256i; 2]) -> [u64; 8] {
        let mut out = [0u64; 8];
        // SAFETY: `out` is 64 writable bytes.
        unsafe {
            _mm256_storeu_si256(out.as_mut_ptr().cast(), acc[0]);
            _mm256_storeu_si256(out.as_mut_ptr().add(4).cast(), acc[1]);
        }
        out
    }

    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn stripe_256(input: *const u8, secret: *const u8) -> [__m256i; 2] {
        // SAFETY: 64 readable bytes at each (the caller's contract).
        let (data, key) = unsafe { (load_256(input), load_256(secret)) };
        let lane = |i: usize| {
            let mixed = _mm256_xor_si256(data[i], key[i]);
            let product = _mm256_mul_epu32(mixed, _mm256_srli_epi64::<32>(mixed));
            let swapped = _mm256_shuffle_epi32::<0b0100_1110>(data[i]);
            _mm256_add_epi64(product, swapped)
        };
        [lane(0), lane(1)]
    }

    #[inline]
    #[target_feature(enable = "avx2")]
    fn add_256(a: [__m256i; 2], b: [__m256i; 2]) -> [__m256i; 2] {
        [_mm256_add_epi64(a[0], b[0]), _mm256_add_epi64(a[1], b[1])]
    }

    #[inline]
    #[target_feature(enable = "avx2")]
    unsafe fn scramble_256(acc: [__m256i; 2], secret: *const u8) -> [__m256i; 2] {
        // SAFETY: 64 readable bytes at `secret` (the caller's contract).
        let key = unsafe { load_256(secret) };
        let prime = _mm256_set1_epi64x(PRIME32_1 as i64);
        let lane = |i: usize| {
            let a = acc[i];
            let mixed = _mm256_xor_si256(_mm256_xor_si256(a, _mm256_srli_epi64::<47>(a)), key[i]);
            let low = _mm256_mul_epu32(mixed, prime);
            let high = _mm256_mul_epu32(_mm256_srli_epi64::<32>(mixed), prime);
            _mm256_add_epi64(low, _mm256_slli_epi64::<32>(high))
        };
        [lane(0), lane(1)]
    }
}
