//! Import of damaged pools: every case gets a clear error naming the device and the reason,
//! never a panic.

mod common;

use common::mem_pool;
use oxpool_engine::Pool;
use oxpool_format::{label_offsets, TopVdevKind, LABEL_BYTES};
use oxpool_io::rt::block_on;
use oxpool_io::{Backend, IoBuf, MemoryBackend};
use std::sync::Arc;

fn import_err(devices: Vec<Arc<dyn Backend>>) -> String {
    match Pool::import(devices, Some("tank")) {
        Ok(_) => panic!("damaged pool imported"),
        Err(e) => e.to_string(),
    }
}

fn healthy() -> MemoryBackend {
    let (pool, mems) = mem_pool(TopVdevKind::Single, 1);
    pool.create_volume("v", 1 << 20, &[]).unwrap();
    pool.export().unwrap();
    mems.into_iter().next().unwrap()
}

fn write(dev: &MemoryBackend, off: u64, data: &[u8]) {
    block_on(dev.write(off, IoBuf::from_slice(data))).unwrap();
}

#[test]
fn zeroed_labels_name_the_device() {
    let dev = healthy();
    for off in label_offsets(dev.size_bytes()) {
        write(&dev, off, &vec![0u8; LABEL_BYTES as usize]);
    }
    let e = import_err(vec![Arc::new(dev)]);
    assert!(e.contains("mem0"), "{e}");
    assert!(
        e.to_lowercase().contains("empty") || e.contains("label"),
        "{e}"
    );
}

#[test]
fn foreign_file_is_not_a_pool() {
    let dev = MemoryBackend::new("/tmp/foreign.bin", common::DEVICE_BYTES);
    write(&dev, 0, &common::pattern(1, 1 << 20));
    let e = import_err(vec![Arc::new(dev)]);
    assert!(e.contains("/tmp/foreign.bin"), "{e}");
    assert!(e.contains("magic"), "{e}");
}

#[test]
fn wrong_version_label_is_reported() {
    let dev = healthy();
    // The version is the u32 after the 8-byte magic, in every label.
    for off in label_offsets(dev.size_bytes()) {
        write(&dev, off + 8, &99u32.to_le_bytes());
    }
    let e = import_err(vec![Arc::new(dev)]);
    assert!(e.contains("mem0") && e.contains("version"), "{e}");
}

#[test]
fn truncated_device_is_reported() {
    let dev = healthy();
    // The same bytes on a device cut to 8 MiB: labels at the end are gone, and it is too small.
    let small = MemoryBackend::new("mem-truncated", 8 << 20);
    let mut buf = IoBuf::zeroed(8 << 20);
    buf = block_on(dev.read(0, buf)).unwrap();
    block_on(small.write(0, buf)).unwrap();
    let e = import_err(vec![Arc::new(small)]);
    assert!(e.contains("mem-truncated"), "{e}");
}

#[test]
fn corrupt_uberblocks_and_metadata_fail_cleanly() {
    let dev = healthy();
    // Destroy every uberblock ring: labels still say which pool this is.
    for off in label_offsets(dev.size_bytes()) {
        write(
            &dev,
            off + LABEL_BYTES / 2,
            &vec![0xA5u8; (LABEL_BYTES / 2) as usize],
        );
    }
    let e = import_err(vec![Arc::new(dev)]);
    assert!(e.contains("uberblock"), "{e}");
}

#[test]
fn random_garbage_over_the_data_area_never_panics() {
    for seed in 0..20u64 {
        let dev = healthy();
        dev.corrupt(oxpool_format::DATA_START_BYTES, 4 << 20, seed);
        // Either it imports (damage missed live blocks) or it fails with an error: no panic.
        if let Ok(p) = Pool::import(vec![Arc::new(dev)], Some("tank")) {
            let v = p.volume("v").unwrap();
            let mut buf = vec![0u8; 1 << 20];
            let _ = block_on(v.read(0, &mut buf));
            drop(v);
            drop(p);
        }
    }
}
