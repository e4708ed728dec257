//! Every path gives exactly the xxhash-rust crate's xxh3-128: every length up to 4 KiB and
//! a stripe, the block sizes of a volume, at every alignment, and random inputs.

use oxpool_xxh3::{xxh3_128, xxh3_128_with, Isa};
use proptest::prelude::*;
use rand::rngs::SmallRng;
use rand::{RngCore, SeedableRng};
use xxhash_rust::xxh3::xxh3_128 as reference;

/// Bytes that are not a pattern a broken lane could get right by luck.
fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut bytes = vec![0u8; len];
    SmallRng::seed_from_u64(seed).fill_bytes(&mut bytes);
    bytes
}

/// The paths this CPU can run, said in the output: a path it cannot run is not tested here,
/// and the output must show that rather than pass in silence.
fn paths() -> Vec<Isa> {
    let paths: Vec<Isa> = Isa::available().collect();
    for isa in Isa::ALL {
        if !paths.contains(&isa) {
            println!("path {} not tested: this CPU cannot run it", isa.name());
        }
    }
    paths
}

#[test]
fn every_length_matches_the_crate_on_every_path() {
    let data = noise(4096 + 64 + 1, 7);
    for isa in paths() {
        for len in 0..=data.len() {
            assert_eq!(
                xxh3_128_with(isa, &data[..len]),
                reference(&data[..len]),
                "{} at {len} bytes",
                isa.name()
            );
        }
    }
}

#[test]
fn block_sizes_at_every_alignment_match_the_crate() {
    let data = noise((1 << 20) + 64, 11);
    for isa in paths() {
        for shift in 0..10 {
            let len = 512usize << shift;
            for align in [0, 1, 7, 8, 31, 63] {
                let input = &data[align..align + len];
                assert_eq!(
                    xxh3_128_with(isa, input),
                    reference(input),
                    "{} {len}+{align}",
                    isa.name()
                );
            }
        }
        let mut zeros = vec![0u8; 128 * 1024];
        assert_eq!(xxh3_128_with(isa, &zeros), reference(&zeros));
        zeros.fill(0xff);
        assert_eq!(xxh3_128_with(isa, &zeros), reference(&zeros));
    }
}

#[test]
fn the_default_path_is_the_fastest_available() {
    let fastest = Isa::available()
        .last()
        .expect("portable is always available");
    assert_eq!(Isa::detected(), fastest);
    println!("xxh3 path on this CPU: {}", fastest.name());
    let data = noise(16384, 3);
    assert_eq!(xxh3_128(&data), reference(&data));
}

#[test]
fn a_changed_byte_changes_the_hash_on_every_path() {
    // Each lane of a stripe must reach the result: flip one byte in every lane position of
    // a stripe in a full block, a partial block and the last stripe.
    let data = noise(3000, 5);
    for isa in paths() {
        let base = xxh3_128_with(isa, &data);
        for at in [0, 8, 16, 24, 32, 40, 48, 56, 63, 1024 + 9, 2100, 2990, 2999] {
            let mut changed = data.clone();
            changed[at] ^= 0x10;
            assert_ne!(
                xxh3_128_with(isa, &changed),
                base,
                "{} byte {at}",
                isa.name()
            );
            assert_eq!(xxh3_128_with(isa, &changed), reference(&changed));
        }
    }
}

proptest! {
    #[test]
    fn random_inputs_match_the_crate(data in proptest::collection::vec(any::<u8>(), 0..20_000)) {
        for isa in Isa::available() {
            prop_assert_eq!(xxh3_128_with(isa, &data), reference(&data));
        }
    }
}
