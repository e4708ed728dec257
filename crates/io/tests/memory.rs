//! MemoryBackend: round trips, sparseness, snapshot, corruption, bounds.

use oxpool_io::rt::block_on;
use oxpool_io::{Backend, IoBuf, MemoryBackend};

fn pattern(len: usize, seed: u8) -> IoBuf {
    let data: Vec<u8> = (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect();
    IoBuf::from_slice(&data)
}

#[test]
fn round_trip_across_chunk_boundaries() {
    let dev = MemoryBackend::new("mem0", 1 << 20);
    // Unaligned offset and length spanning three 64 KiB chunks.
    let data = pattern(150_000, 7);
    let offset = 60_000;
    let written = block_on(dev.write(offset, data.clone())).unwrap();
    assert_eq!(written, data);
    let back = block_on(dev.read(offset, IoBuf::zeroed(data.len()))).unwrap();
    assert_eq!(back, data);
    // Bytes around the write are still zero.
    let before = block_on(dev.read(offset - 100, IoBuf::zeroed(100))).unwrap();
    assert!(before.iter().all(|&b| b == 0));
}

#[test]
fn one_gib_device_is_sparse() {
    let dev = MemoryBackend::new("big", 1 << 30);
    assert_eq!(dev.size_bytes(), 1 << 30);
    assert_eq!(dev.name(), "big");
    block_on(dev.write((1 << 30) - 4096, pattern(4096, 1))).unwrap();
    block_on(dev.write(0, pattern(4096, 2))).unwrap();
    assert!(dev.allocated_bytes() <= 2 * 64 * 1024);
    let tail = block_on(dev.read((1 << 30) - 4096, IoBuf::zeroed(4096))).unwrap();
    assert_eq!(tail, pattern(4096, 1));
    let middle = block_on(dev.read(1 << 29, IoBuf::zeroed(8192))).unwrap();
    assert!(middle.iter().all(|&b| b == 0));
}

#[test]
fn out_of_range_is_an_error() {
    let dev = MemoryBackend::new("small", 8192);
    let err = block_on(dev.read(4096, IoBuf::zeroed(8192))).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::UnexpectedEof);
    assert!(err.to_string().contains("small"), "{err}");
    let err = block_on(dev.write(8000, IoBuf::zeroed(4096))).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
    assert!(block_on(dev.read(u64::MAX - 10, IoBuf::zeroed(4096))).is_err());
}

#[test]
fn clone_shares_snapshot_copies() {
    let dev = MemoryBackend::new("m", 1 << 20);
    let shared = dev.clone();
    block_on(dev.write(0, pattern(4096, 3))).unwrap();
    let snap = dev.snapshot();
    block_on(dev.write(0, pattern(4096, 4))).unwrap();
    assert_eq!(
        block_on(shared.read(0, IoBuf::zeroed(4096))).unwrap(),
        pattern(4096, 4)
    );
    assert_eq!(
        block_on(snap.read(0, IoBuf::zeroed(4096))).unwrap(),
        pattern(4096, 3)
    );
}

#[test]
fn corrupt_flips_bits_deterministically() {
    let a = MemoryBackend::new("a", 1 << 20);
    let b = MemoryBackend::new("b", 1 << 20);
    for dev in [&a, &b] {
        block_on(dev.write(4096, pattern(4096, 9))).unwrap();
        dev.corrupt(4096, 4096, 42);
    }
    let ra = block_on(a.read(4096, IoBuf::zeroed(4096))).unwrap();
    let rb = block_on(b.read(4096, IoBuf::zeroed(4096))).unwrap();
    assert_eq!(ra, rb, "same seed, same corruption");
    let original = pattern(4096, 9);
    let flipped: u32 = ra
        .iter()
        .zip(original.iter())
        .map(|(x, y)| (x ^ y).count_ones())
        .sum();
    assert!((1..=8).contains(&flipped), "flipped {flipped} bits");
    // Corrupting a never-written range works too (it reads as zeros first).
    a.corrupt(1 << 19, 512, 1);
    let r = block_on(a.read(1 << 19, IoBuf::zeroed(512))).unwrap();
    assert!(r.iter().any(|&b| b != 0));
}

#[test]
fn discard_zeroes_and_frees() {
    let dev = MemoryBackend::new("d", 1 << 20);
    block_on(dev.write(0, pattern(256 * 1024, 5))).unwrap();
    block_on(dev.discard(1000, 200 * 1024)).unwrap();
    let back = block_on(dev.read(0, IoBuf::zeroed(256 * 1024))).unwrap();
    let want = pattern(256 * 1024, 5);
    assert_eq!(&back[..1000], &want[..1000]);
    assert!(back[1000..1000 + 200 * 1024].iter().all(|&b| b == 0));
    assert_eq!(&back[1000 + 200 * 1024..], &want[1000 + 200 * 1024..]);
    assert!(dev.allocated_bytes() < 256 * 1024);
}

#[test]
fn thread_safety_bounds() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<IoBuf>();
    send_sync::<MemoryBackend>();
    send_sync::<oxpool_io::FileBackend>();
    send_sync::<oxpool_io::FaultBackend>();
    let _: std::sync::Arc<dyn Backend> = std::sync::Arc::new(MemoryBackend::new("x", 1));
}
