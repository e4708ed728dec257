//! FileBackend: O_DIRECT on ext4, buffered fallback, tmpfs, unaligned requests, bounds,
//! flush, discard, and many reads in flight.

use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::task::{Context, Waker};
use std::time::Duration;

use oxpool_io::rt::{block_on, join_all, sleep};
use oxpool_io::{Backend, DurableWriteMode, FaultBackend, FileBackend, IoBuf};

fn pattern(len: usize, seed: u64) -> IoBuf {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let data: Vec<u8> = (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    IoBuf::from_slice(&data)
}

/// A directory on a disk filesystem (ext4 here), where O_DIRECT works.
fn disk_dir() -> tempfile::TempDir {
    tempfile::tempdir_in("/var/tmp").expect("tempdir in /var/tmp")
}

fn round_trip(dev: &FileBackend) {
    let blocks = [(0u64, 4096usize), (8192, 64 * 1024), (1 << 20, 128 * 1024)];
    for (i, &(offset, len)) in blocks.iter().enumerate() {
        let data = pattern(len, i as u64 + 1);
        let back = block_on(dev.write(offset, data.clone())).unwrap();
        assert_eq!(back, data);
    }
    block_on(dev.flush()).unwrap();
    for (i, &(offset, len)) in blocks.iter().enumerate() {
        let back = block_on(dev.read(offset, IoBuf::zeroed(len))).unwrap();
        assert_eq!(back, pattern(len, i as u64 + 1), "block at {offset}");
    }
}

#[test]
fn direct_io_on_disk_filesystem() {
    let dir = disk_dir();
    let path = dir.path().join("dev0");
    let dev = FileBackend::open(&path, Some(8 << 20)).unwrap();
    assert!(dev.is_direct(), "ext4 supports O_DIRECT");
    assert!(!dev.is_block_device());
    assert_eq!(dev.size_bytes(), 8 << 20);
    assert_eq!(dev.name(), path.display().to_string());
    round_trip(&dev);
    // The file was created sparse.
    let meta = std::fs::metadata(&path).unwrap();
    assert_eq!(meta.len(), 8 << 20);
}

/// A regular file opened O_DIRECT lets its user measure a write then a flush against a
/// `RWF_DSYNC` write (which the filesystem finishes on a kernel worker bound to one CPU); a
/// buffered one keeps the durable write; a fault backend answers as the device it wraps
/// unless a test chose otherwise. The intent log's choice of path rests on these answers.
#[test]
fn durable_write_mode_of_files_and_wrappers() {
    let dir = disk_dir();
    let direct = Arc::new(FileBackend::open(&dir.path().join("direct"), Some(4 << 20)).unwrap());
    assert!(direct.is_direct());
    assert_eq!(direct.durable_write_mode(), DurableWriteMode::Measure);
    let buffered = FileBackend::open_buffered(&dir.path().join("buffered"), Some(4 << 20)).unwrap();
    assert_eq!(buffered.durable_write_mode(), DurableWriteMode::Fua);
    let fault = FaultBackend::new(direct.clone(), 1);
    assert_eq!(fault.durable_write_mode(), DurableWriteMode::Measure);
    fault.set_durable_write_mode(DurableWriteMode::WriteThenFlush);
    assert_eq!(fault.durable_write_mode(), DurableWriteMode::WriteThenFlush);
    // Both ways still write durably when asked to.
    let back = block_on(direct.write_durable(0, pattern(4096, 9))).unwrap();
    assert_eq!(back, pattern(4096, 9));
    assert_eq!(
        block_on(direct.read(0, IoBuf::zeroed(4096))).unwrap(),
        pattern(4096, 9)
    );
}

#[test]
fn reopen_keeps_size_and_data() {
    let dir = disk_dir();
    let path = dir.path().join("dev1");
    {
        let dev = FileBackend::open(&path, Some(4 << 20)).unwrap();
        block_on(dev.write(4096, pattern(4096, 77))).unwrap();
        block_on(dev.flush()).unwrap();
    }
    // A different create size must not resize an existing file.
    let dev = FileBackend::open(&path, Some(1 << 20)).unwrap();
    assert_eq!(dev.size_bytes(), 4 << 20);
    assert_eq!(
        block_on(dev.read(4096, IoBuf::zeroed(4096))).unwrap(),
        pattern(4096, 77)
    );
}

#[test]
fn missing_file_without_create_is_an_error() {
    let dir = disk_dir();
    let err = FileBackend::open(&dir.path().join("nope"), None).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::NotFound);
    assert!(err.to_string().contains("nope"), "{err}");
}

#[test]
fn buffered_fallback_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    let dev = FileBackend::open_buffered(&dir.path().join("buffered"), Some(4 << 20)).unwrap();
    assert!(!dev.is_direct());
    round_trip(&dev);
}

#[test]
fn tmpfs_works_direct_or_not() {
    // tmpfs refuses O_DIRECT on older kernels (then open falls back) and accepts it on newer.
    let shm = Path::new("/dev/shm");
    if !shm.is_dir() {
        return;
    }
    let dir = tempfile::tempdir_in(shm).unwrap();
    let dev = FileBackend::open(&dir.path().join("shm-dev"), Some(4 << 20)).unwrap();
    round_trip(&dev);
}

#[test]
fn tmp_dir_works() {
    let dir = tempfile::tempdir().unwrap();
    let dev = FileBackend::open(&dir.path().join("tmp-dev"), Some(4 << 20)).unwrap();
    round_trip(&dev);
}

#[test]
fn unaligned_requests_on_direct_device() {
    let dir = disk_dir();
    let dev = FileBackend::open(&dir.path().join("unaligned"), Some(1 << 20)).unwrap();
    assert!(dev.is_direct());
    // Aligned background, then unaligned overwrite in the middle.
    block_on(dev.write(0, pattern(16384, 1))).unwrap();
    block_on(dev.write(1000, pattern(3000, 2))).unwrap();
    block_on(dev.write(5000, pattern(512, 3))).unwrap();
    block_on(dev.flush()).unwrap();
    // A direct (aligned) read sees the buffered writes.
    let back = block_on(dev.read(0, IoBuf::zeroed(16384))).unwrap();
    let mut want = pattern(16384, 1).to_vec();
    want[1000..4000].copy_from_slice(&pattern(3000, 2));
    want[5000..5512].copy_from_slice(&pattern(512, 3));
    assert_eq!(&back[..], &want[..]);
    let odd = block_on(dev.read(999, IoBuf::zeroed(3002))).unwrap();
    assert_eq!(&odd[..], &want[999..4001]);
}

#[test]
fn reads_past_the_end_fail() {
    let dir = disk_dir();
    let dev = FileBackend::open(&dir.path().join("eof"), Some(64 * 1024)).unwrap();
    let err = block_on(dev.read(60 * 1024, IoBuf::zeroed(8192))).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::UnexpectedEof);
    let err = block_on(dev.write(64 * 1024, IoBuf::zeroed(4096))).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidInput);
    // Zero-length I/O at the end is fine.
    block_on(dev.read(64 * 1024, IoBuf::zeroed(0))).unwrap();
}

#[test]
fn discard_punches_a_hole() {
    let dir = disk_dir();
    let dev = FileBackend::open(&dir.path().join("trim"), Some(1 << 20)).unwrap();
    block_on(dev.write(0, pattern(256 * 1024, 4))).unwrap();
    block_on(dev.discard(64 * 1024, 128 * 1024)).unwrap();
    let back = block_on(dev.read(0, IoBuf::zeroed(256 * 1024))).unwrap();
    let want = pattern(256 * 1024, 4);
    assert_eq!(&back[..64 * 1024], &want[..64 * 1024]);
    assert!(back[64 * 1024..192 * 1024].iter().all(|&b| b == 0));
    assert_eq!(&back[192 * 1024..], &want[192 * 1024..]);
}

#[test]
fn sixty_four_reads_in_flight() {
    let dir = disk_dir();
    let dev = FileBackend::open(&dir.path().join("qd64"), Some(4 << 20)).unwrap();
    let block_bytes = 16 * 1024;
    let writes: Vec<_> = (0..64)
        .map(|i| dev.write(i * block_bytes as u64, pattern(block_bytes, i)))
        .collect();
    for result in block_on(join_all(writes)) {
        result.unwrap();
    }
    block_on(dev.flush()).unwrap();
    let reads: Vec<_> = (0..64)
        .map(|i| dev.read(i * block_bytes as u64, IoBuf::zeroed(block_bytes)))
        .collect();
    let results = block_on(join_all(reads));
    assert_eq!(results.len(), 64);
    for (i, result) in results.into_iter().enumerate() {
        assert_eq!(result.unwrap(), pattern(block_bytes, i as u64), "block {i}");
    }
}

#[test]
fn more_ops_than_the_op_table_holds() {
    // 5000 > OP_TABLE_CAPACITY: submission waits for completions (back-pressure).
    let dir = disk_dir();
    let dev = FileBackend::open(&dir.path().join("many"), Some(4 << 20)).unwrap();
    block_on(dev.write(0, pattern(4 << 20, 9))).unwrap();
    let want = pattern(4 << 20, 9);
    let count = oxpool_io::rt::OP_TABLE_CAPACITY + 904;
    let reads: Vec<_> = (0..count)
        .map(|i| dev.read((i % 1024) as u64 * 4096, IoBuf::zeroed(4096)))
        .collect();
    for (i, result) in block_on(join_all(reads)).into_iter().enumerate() {
        let offset = (i % 1024) * 4096;
        assert_eq!(&result.unwrap()[..], &want[offset..offset + 4096]);
    }
    assert_eq!(oxpool_io::rt::ops_in_flight(), 0);
}

#[test]
fn backends_are_usable_from_many_threads() {
    let dir = disk_dir();
    let dev =
        std::sync::Arc::new(FileBackend::open(&dir.path().join("mt"), Some(4 << 20)).unwrap());
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let dev = dev.clone();
            std::thread::spawn(move || {
                for i in 0..16u64 {
                    let offset = (t * 16 + i) * 4096;
                    block_on(dev.write(offset, pattern(4096, offset))).unwrap();
                    let back = block_on(dev.read(offset, IoBuf::zeroed(4096))).unwrap();
                    assert_eq!(back, pattern(4096, offset));
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

/// Runs only when `OXPOOL_TEST_BLOCK_DEVICE` names a scratch block device (its contents are
/// destroyed), e.g. a loop device: `losetup -f --show /var/tmp/scratch.img`.
#[test]
fn scratch_block_device() {
    let Ok(path) = std::env::var("OXPOOL_TEST_BLOCK_DEVICE") else {
        return;
    };
    let dev = FileBackend::open(Path::new(&path), None).unwrap();
    assert!(dev.is_block_device());
    assert!(dev.size_bytes() >= 2 << 20, "device too small");
    eprintln!(
        "{path}: {} bytes, direct {}, dio align {}",
        dev.size_bytes(),
        dev.is_direct(),
        dev.dio_align_bytes()
    );
    round_trip(&dev);
    block_on(dev.write(0, pattern(64 * 1024, 5))).unwrap();
    block_on(dev.discard(0, 64 * 1024)).unwrap();
    block_on(dev.write(512, pattern(512, 6))).unwrap();
    let back = block_on(dev.read(512, IoBuf::zeroed(512))).unwrap();
    assert_eq!(back, pattern(512, 6));
    let end = dev.size_bytes();
    block_on(dev.write(end - 4096, pattern(4096, 7))).unwrap();
    assert!(block_on(dev.read(end - 4096, IoBuf::zeroed(8192))).is_err());
}

/// One shared buffer written to many places at once (as the txg sync writes a block's copies
/// and a dirty block readers still see): every place gets the bytes, the buffer stays
/// readable meanwhile, and the writes give their references back when done.
#[test]
fn shared_writes_land_everywhere_and_release_the_buffer() {
    for direct in [true, false] {
        let dir = if direct {
            disk_dir()
        } else {
            tempfile::tempdir().unwrap()
        };
        let dev = FileBackend::open(&dir.path().join("dev"), Some(8 << 20)).unwrap();
        let data = Arc::new(pattern(64 * 1024, 7));
        let offsets: Vec<u64> = (0..16u64).map(|i| i * 128 * 1024).collect();
        let futs: Vec<_> = offsets
            .iter()
            .map(|&o| dev.write_shared(o, Arc::clone(&data)))
            .collect();
        // Readable while the writes are being set up and run (they only read it).
        assert_eq!(data[..], pattern(64 * 1024, 7)[..]);
        for r in block_on(join_all(futs)) {
            r.unwrap();
        }
        assert_eq!(
            Arc::strong_count(&data),
            1,
            "every write gave its reference back"
        );
        // An unaligned shared write takes the buffered path on an O_DIRECT device.
        block_on(dev.write_shared(3 << 20 | 512, Arc::new(pattern(1536, 9)))).unwrap();
        block_on(dev.flush()).unwrap();
        for &o in &offsets {
            let back = block_on(dev.read(o, IoBuf::zeroed(64 * 1024))).unwrap();
            assert_eq!(back[..], data[..], "copy at {o} (direct {direct})");
        }
        let back = block_on(dev.read(3 << 20, IoBuf::zeroed(2048))).unwrap();
        assert_eq!(back[512..], pattern(1536, 9)[..]);
        // Out of range is an error, not a panic.
        assert!(block_on(dev.write_shared(8 << 20, Arc::clone(&data))).is_err());
    }
}

/// A gathered write puts its buffers back to back, on the direct path when every piece is
/// aligned and on the buffered one when one is not; the default (copying) implementation of
/// other backends gives the same bytes.
#[test]
fn gathered_writes_land_back_to_back() {
    use oxpool_io::MemoryBackend;
    let dir = disk_dir();
    let file = FileBackend::open(&dir.path().join("dev"), Some(8 << 20)).unwrap();
    let memory = MemoryBackend::new("mem", 8 << 20);
    let devices: [&dyn Backend; 2] = [&file, &memory];
    for dev in devices {
        for (offset, lens) in [
            (1u64 << 20, vec![16384usize, 4096, 65536, 4096]),
            (2 << 20, vec![4096; 200]),
            (5 << 20, vec![512, 1536, 4096]), // unaligned pieces: buffered
        ] {
            let bufs: Vec<Arc<IoBuf>> = lens
                .iter()
                .enumerate()
                .map(|(i, &len)| Arc::new(pattern(len, offset + i as u64)))
                .collect();
            let whole: Vec<u8> = bufs.iter().flat_map(|b| b.iter().copied()).collect();
            block_on(dev.write_gather(offset, bufs.clone())).unwrap();
            assert!(bufs.iter().all(|b| Arc::strong_count(b) == 1));
            let back = block_on(dev.read(offset, IoBuf::zeroed(whole.len()))).unwrap();
            assert_eq!(back[..], whole[..], "{} at {offset}", dev.name());
        }
        let too_far = vec![Arc::new(pattern(8192, 1))];
        assert!(block_on(dev.write_gather((8 << 20) - 4096, too_far)).is_err());
    }
}

/// A scattered read fills its buffers back to back with the bytes of the range: on the direct
/// path when every piece is aligned, on the buffered one when one is not, in more than one
/// submission when the pieces are more than one `readv` takes; the default (copying)
/// implementation of other backends gives the same bytes. A range past the end is an error.
#[test]
fn scattered_reads_fill_buffers_back_to_back() {
    use oxpool_io::{MemoryBackend, Scatter, SCATTER_IOVECS_MAX};
    let dir = disk_dir();
    let file = FileBackend::open(&dir.path().join("dev"), Some(8 << 20)).unwrap();
    let memory = MemoryBackend::new("mem", 8 << 20);
    let devices: [&dyn Backend; 2] = [&file, &memory];
    for dev in devices {
        let whole = pattern(4 << 20, 77);
        block_on(dev.write(1 << 20, whole.clone())).unwrap();
        for (offset, lens) in [
            (1u64 << 20, vec![16384usize, 4096, 65536, 4096]),
            // More pieces than one submission takes: the read resumes where it stopped.
            ((1 << 20) + 8192, vec![4096; SCATTER_IOVECS_MAX + 44]),
            ((3 << 20) + 512, vec![512, 1536, 4096]), // unaligned: buffered
        ] {
            let mut bufs = Scatter::with_capacity(lens.len());
            for &len in &lens {
                bufs.push(IoBuf::zeroed(len));
            }
            let mut read = block_on(dev.read_scatter(offset, bufs)).unwrap();
            let at = (offset - (1 << 20)) as usize;
            let mut pos = at;
            for (i, buf) in read.bufs_mut().iter().enumerate() {
                assert_eq!(buf.len(), lens[i]);
                assert_eq!(
                    buf[..],
                    whole[pos..pos + buf.len()],
                    "{}: piece {i} of the read at {offset}",
                    dev.name()
                );
                pos += buf.len();
            }
        }
        let mut too_far = Scatter::with_capacity(1);
        too_far.push(IoBuf::zeroed(8192));
        assert!(block_on(dev.read_scatter((8 << 20) - 4096, too_far)).is_err());
    }
}

/// `rt::submit_queued` hands a started write to the kernel at once, without the executor's
/// next turn: the data reaches the file while the task computes without yielding (what the
/// txg sync relies on to keep the device busy while it compresses the next batch). Without
/// the call the write would sit in the ring's submission queue and never land here.
#[test]
fn submit_queued_starts_io_before_the_next_turn() {
    use std::future::Future;
    use std::os::unix::fs::FileExt;
    use std::task::Poll;
    let dir = disk_dir();
    let path = dir.path().join("dev0");
    let dev = FileBackend::open(&path, Some(1 << 20)).unwrap();
    let data = pattern(64 * 1024, 7);
    let expected = data.to_vec();
    let back = block_on(async {
        let mut write = std::pin::pin!(dev.write(0, data));
        // Poll once: the write is queued on this thread's ring.
        let first = std::future::poll_fn(|cx| Poll::Ready(write.as_mut().poll(cx))).await;
        assert!(
            first.is_pending(),
            "a file write completes in the kernel, not at once"
        );
        oxpool_io::rt::submit_queued();
        // Computing without yielding (no turn of the executor): the data lands all the same.
        let file = std::fs::File::open(&path).unwrap();
        let mut seen = vec![0u8; expected.len()];
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        loop {
            file.read_exact_at(&mut seen, 0).unwrap();
            if seen == expected {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the write did not reach the file without a turn of the executor"
            );
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        write.await
    })
    .unwrap();
    assert_eq!(back.to_vec(), expected);
}

/// A shared write whose future is dropped once the driver has it: the buffer stays referenced
/// until the write has ended, then is let go, and the bytes land. A self-heal's places stay
/// held exactly that long (`HealGuard` in the engine tracks the buffer).
fn a_dropped_shared_write_holds_its_buffer_until_it_ends(dev: &dyn Backend) {
    let data = pattern(64 << 10, 9);
    let buf = Arc::new(data.clone());
    let weak = Arc::downgrade(&buf);
    let mut write = Box::pin(dev.write_shared(0, buf));
    let mut cx = Context::from_waker(Waker::noop());
    // The first poll starts the write (its submission waits for the driver's next turn).
    assert!(write.as_mut().poll(&mut cx).is_pending());
    drop(write);
    assert!(
        weak.strong_count() > 0,
        "{}: the buffer went with the future while the write was in flight",
        dev.name()
    );
    // The driver's turns submit the write and reap its completion; bounded at 10 s.
    for _ in 0..1000 {
        if weak.strong_count() == 0 {
            break;
        }
        block_on(sleep(Duration::from_millis(10)));
    }
    assert_eq!(
        weak.strong_count(),
        0,
        "{}: the buffer outlived its write",
        dev.name()
    );
    let back = block_on(dev.read(0, IoBuf::zeroed(data.len()))).unwrap();
    assert!(
        back == data,
        "{}: the dropped write did not land",
        dev.name()
    );
}

#[test]
fn a_dropped_shared_write_holds_its_buffer_on_a_file_and_through_a_fault_backend() {
    let dir = disk_dir();
    let file = Arc::new(FileBackend::open(&dir.path().join("dev0"), Some(8 << 20)).unwrap());
    a_dropped_shared_write_holds_its_buffer_until_it_ends(file.as_ref());
    let faulty = FaultBackend::new(file, 1);
    a_dropped_shared_write_holds_its_buffer_until_it_ends(&faulty);
}
