//! Send and receive between pools: full streams and chains of incrementals (`-i` and `-I`)
//! with overwrites, trims, write-zeroes, refills of trimmed ranges and resizes; every received
//! snapshot equals its source byte for byte and keeps its guid. Wrong bases, modified targets,
//! and damaged or cut streams are refused with the target unchanged and the audit clean. An
//! incremental after changing 1% of a volume sends and reads about 1% (birth-txg pruning), and
//! `send_estimate` is the stream's exact size.

mod common;

use common::*;
use oxpool_engine::TopSpec;
use oxpool_engine::{
    Pool, ReceiveOptions, SendOptions, SEND_PREFETCH_BYTES_DEFAULT, SEND_READS_IN_FLIGHT_BYTES_MAX,
};
use oxpool_format::TopVdevKind;
use oxpool_io::FaultBackend;
use std::sync::Arc;

const MIB: u64 = 1 << 20;

fn snap(pool: &Pool, name: &str) {
    pool.snapshot(&[name.to_string()]).unwrap();
}

fn send(pool: &Pool, vol: &str, snap: &str, base: Option<&str>, all: bool) -> Vec<u8> {
    let opts = SendOptions {
        base: base.map(str::to_string),
        intermediates: all,
        prefetch_bytes_max: 256 << 10,
    };
    let mut out = Vec::new();
    let stats = pool.send(vol, snap, &opts, &mut out).unwrap();
    let estimate = pool.send_estimate(vol, snap, &opts).unwrap();
    // The estimate walks the same tree without reading data: exact.
    assert_eq!(
        estimate.stream_bytes,
        out.len() as u64,
        "estimate of {vol}@{snap}"
    );
    assert_eq!(estimate.stream_bytes, stats.stream_bytes);
    assert_eq!(estimate.data_records, stats.data_records);
    assert_eq!(estimate.free_records, stats.free_records);
    // Each stream's own size, as `send -nvp` lists them: the same sent as estimated, one per
    // stream, summing to the whole.
    assert_eq!(estimate.legs, stats.legs);
    assert_eq!(estimate.legs.len() as u64, stats.streams);
    assert_eq!(
        estimate.legs.iter().map(|l| l.stream_bytes).sum::<u64>(),
        out.len() as u64
    );
    assert_eq!(
        estimate.legs.last().map(|l| l.snapshot.as_str()),
        Some(snap)
    );
    out
}

fn recv(pool: &Pool, vol: &str, stream: &[u8], force: bool) -> oxpool_engine::Result<()> {
    let mut input = stream;
    let opts = ReceiveOptions {
        force,
        resumable: false,
        dry_run: false,
        snapshot: None,
    };
    pool.receive(vol, &mut input, &opts).map(|_| ())
}

fn guids(pool: &Pool, vol: &str) -> Vec<(String, u64)> {
    pool.snapshots(vol)
        .unwrap()
        .into_iter()
        .map(|s| (s.name, s.guid))
        .collect()
}

/// A source volume with four snapshots: @a full of mixed data; @b overwrites, trims and
/// write-zeroes; @c refills part of the trimmed range and grows the volume; @d shrinks it
/// and overwrites the end.
fn source() -> (Pool, Vec<oxpool_io::MemoryBackend>) {
    let (pool, mems) = mem_pool(TopVdevKind::Single, 1);
    let vol = pool
        .create_volume("src", 4 * MIB, &[("compression".into(), "lz4".into())])
        .unwrap();
    let bs = vol.block_size_bytes() as u64;
    write(&vol, 0, &content(Fill::Mixed, 1, (4 * MIB) as usize));
    snap(&pool, "src@a");
    write(&vol, 5 * bs, &content(Fill::Random, 2, (3 * bs) as usize));
    write(
        &vol,
        MIB + 100 * 512,
        &content(Fill::Compressible, 3, 20_000),
    );
    oxpool_io::rt::block_on(vol.trim(2 * MIB, 64 * bs, false)).unwrap();
    oxpool_io::rt::block_on(vol.write_zeroes(3 * MIB, 10 * bs, false)).unwrap();
    write(&vol, 3 * MIB + 20 * bs, &vec![0u8; (4 * bs) as usize]);
    snap(&pool, "src@b");
    write(
        &vol,
        2 * MIB + 10 * bs,
        &content(Fill::Random, 4, (5 * bs) as usize),
    );
    pool.set_volume_prop("src", "volsize", "6M").unwrap();
    write(&vol, 5 * MIB, &content(Fill::Random, 5, (2 * bs) as usize));
    snap(&pool, "src@c");
    pool.set_volume_prop("src", "volsize", "3M").unwrap();
    write(
        &vol,
        3 * MIB - 2 * bs,
        &content(Fill::Compressible, 6, (2 * bs) as usize),
    );
    snap(&pool, "src@d");
    // The head moves on after @d (not sent).
    write(&vol, 0, &content(Fill::Random, 7, bs as usize));
    (pool, mems)
}

#[test]
fn full_and_incremental_chains_arrive_byte_for_byte() {
    let (src, _m1) = source();
    let (dst, _m2) = mem_pool(TopVdevKind::Single, 1);
    // -i, one step at a time.
    recv(&dst, "copy", &send(&src, "src", "a", None, false), false).unwrap();
    assert_eq!(snap_bytes(&dst, "copy", "a"), snap_bytes(&src, "src", "a"));
    assert_eq!(
        read_all(&dst.volume("copy").unwrap()),
        snap_bytes(&src, "src", "a")
    );
    audit_clean(&dst, "after the full receive");
    for (base, s) in [("a", "b"), ("b", "c"), ("c", "d")] {
        let stream = send(&src, "src", s, Some(base), false);
        recv(&dst, "copy", &stream, false).unwrap();
        assert_eq!(
            snap_bytes(&dst, "copy", s),
            snap_bytes(&src, "src", s),
            "@{s}"
        );
        assert_eq!(
            read_all(&dst.volume("copy").unwrap()),
            snap_bytes(&src, "src", s),
            "head after @{s}"
        );
        audit_clean(&dst, &format!("after @{s}"));
    }
    let want: Vec<_> = guids(&src, "src");
    assert_eq!(
        guids(&dst, "copy"),
        want,
        "snapshots keep the sender's guids"
    );
    // Every snapshot still reads as sent (the later receives freed nothing they hold).
    for s in ["a", "b", "c", "d"] {
        assert_eq!(
            snap_bytes(&dst, "copy", s),
            snap_bytes(&src, "src", s),
            "@{s} at the end"
        );
    }

    // -I: the same chain in one go, onto a full receive of @a; and -i a..d skips the middle.
    let (dst2, _m3) = mem_pool(TopVdevKind::Single, 1);
    recv(&dst2, "copy", &send(&src, "src", "a", None, false), false).unwrap();
    recv(
        &dst2,
        "copy",
        &send(&src, "src", "d", Some("a"), true),
        false,
    )
    .unwrap();
    assert_eq!(guids(&dst2, "copy"), want, "-I carries every snapshot");
    for s in ["a", "b", "c", "d"] {
        assert_eq!(
            snap_bytes(&dst2, "copy", s),
            snap_bytes(&dst, "copy", s),
            "-I @{s}"
        );
    }
    recv(&dst2, "skip", &send(&src, "src", "a", None, false), false).unwrap();
    recv(
        &dst2,
        "skip",
        &send(&src, "src", "d", Some("a"), false),
        false,
    )
    .unwrap();
    assert_eq!(snap_bytes(&dst2, "skip", "d"), snap_bytes(&src, "src", "d"));
    assert_eq!(guids(&dst2, "skip").len(), 2);
    audit_clean(&dst2, "after -I");
    audit_clean(&src, "the source");
    // Across export and import the received volumes are as received.
    let mems = _m3;
    dst2.export().unwrap();
    let again = reimport(&mems);
    for s in ["a", "b", "c", "d"] {
        assert_eq!(
            snap_bytes(&again, "copy", s),
            snap_bytes(&src, "src", s),
            "imported @{s}"
        );
    }
    audit_clean(&again, "after import");
}

#[test]
fn wrong_base_and_modified_target_are_refused_unchanged() {
    let (src, _m1) = source();
    let (dst, _m2) = mem_pool(TopVdevKind::Single, 1);
    recv(&dst, "copy", &send(&src, "src", "a", None, false), false).unwrap();
    let before = read_all(&dst.volume("copy").unwrap());
    let snaps = guids(&dst, "copy");
    // b..c onto a volume whose latest snapshot is @a.
    let err = recv(
        &dst,
        "copy",
        &send(&src, "src", "c", Some("b"), false),
        false,
    )
    .unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("base guid") && !msg.contains('\n'), "{msg}");
    // A full stream onto an existing volume.
    let err = recv(&dst, "copy", &send(&src, "src", "b", None, false), false).unwrap_err();
    assert!(
        err.to_string()
            .contains("copy exists: a full stream makes a new volume"),
        "{err}"
    );
    assert_eq!(read_all(&dst.volume("copy").unwrap()), before);
    assert_eq!(guids(&dst, "copy"), snaps);
    assert_eq!(dst.volumes().len(), 1, "no hidden volume left");
    audit_clean(&dst, "after the refusals");

    // A target written since its base: refused without -F, received with it.
    let vol = dst.volume("copy").unwrap();
    write(&vol, 0, &content(Fill::Random, 99, 8192));
    dst.sync().unwrap();
    let modified = read_all(&vol);
    let ab = send(&src, "src", "b", Some("a"), false);
    let err = recv(&dst, "copy", &ab, false).unwrap_err();
    assert!(err.to_string().contains("modified since @a"), "{err}");
    assert_eq!(read_all(&vol), modified);
    audit_clean(&dst, "after the refused modified target");
    recv(&dst, "copy", &ab, true).unwrap();
    assert_eq!(
        read_all(&dst.volume("copy").unwrap()),
        snap_bytes(&src, "src", "b")
    );
    audit_clean(&dst, "after -F");

    // A later snapshot on the target: refused without -F; -F destroys it.
    snap(&dst, "copy@local");
    let bc = send(&src, "src", "c", Some("b"), false);
    let ad = send(&src, "src", "d", Some("a"), false);
    let err = recv(&dst, "copy", &bc, false).unwrap_err();
    assert!(
        err.to_string().contains("modified") || err.to_string().contains("later"),
        "{err}"
    );
    let err = recv(&dst, "copy", &ad, false).unwrap_err();
    assert!(err.to_string().contains("not the latest"), "{err}");
    assert!(guids(&dst, "copy").iter().any(|(n, _)| n == "local"));
    recv(&dst, "copy", &ad, true).unwrap();
    let names: Vec<_> = guids(&dst, "copy").into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["a", "d"]);
    assert_eq!(snap_bytes(&dst, "copy", "d"), snap_bytes(&src, "src", "d"));
    audit_clean(&dst, "after -F over later snapshots");
}

/// A stream reader that, once `at` bytes of the stream have been read, makes a durable write
/// to the target (as an NBD client or `vol write` may while a receive runs on a served pool).
struct WriteMidway<'a> {
    stream: &'a [u8],
    read: usize,
    at: usize,
    write: Option<Box<dyn FnOnce() + 'a>>,
}

impl std::io::Read for WriteMidway<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if self.read >= self.at {
            if let Some(w) = self.write.take() {
                w();
            }
        }
        // Small reads, so that the write comes while records are still arriving.
        let n = buf.len().min(4096).min(self.stream.len() - self.read);
        buf[..n].copy_from_slice(&self.stream[self.read..self.read + n]);
        self.read += n;
        Ok(n)
    }
}

/// Receives `stream` into `copy` of `dst` (`-F` if `force`), calling `change` halfway
/// through the stream, after the receive's own checks of the target.
fn receive_changing_midway<'a>(
    dst: &Pool,
    stream: &'a [u8],
    force: bool,
    change: Box<dyn FnOnce() + 'a>,
) -> oxpool_engine::Result<()> {
    let mut input = WriteMidway {
        stream,
        read: 0,
        at: stream.len() / 2,
        write: Some(change),
    };
    let opts = ReceiveOptions {
        force,
        resumable: false,
        dry_run: false,
        snapshot: None,
    };
    let got = dst.receive("copy", &mut input, &opts).map(|_| ());
    assert!(
        input.write.is_none(),
        "the change was made during the receive"
    );
    got
}

#[test]
fn a_write_to_the_target_during_an_incremental_receive_is_never_discarded_without_force() {
    let (src, _m1) = source();
    let (dst, _m2) = mem_pool(TopVdevKind::Single, 1);
    recv(&dst, "copy", &send(&src, "src", "a", None, false), false).unwrap();
    let ab = send(&src, "src", "b", Some("a"), false);
    let vol = dst.volume("copy").unwrap();
    let written = content(Fill::Random, 77, 8192);
    let receive = |force: bool| {
        receive_changing_midway(
            &dst,
            &ab,
            force,
            Box::new(|| {
                // Acknowledged durable (FUA), after the receive's own check of the target.
                oxpool_io::rt::block_on(vol.write(0, &written, true)).unwrap();
            }),
        )
    };
    // Without -F: the receive is refused at its end and the write stays.
    let err = receive(false).unwrap_err().to_string();
    assert!(
        err.contains("was written to") && err.contains("nothing was applied"),
        "{err}"
    );
    assert!(!err.contains('\n'), "{err}");
    let now = read_all(&vol);
    assert_eq!(
        &now[..written.len()],
        &written[..],
        "the acknowledged write"
    );
    assert_eq!(
        &now[written.len()..],
        &snap_bytes(&src, "src", "a")[written.len()..],
        "the rest as at @a"
    );
    assert_eq!(
        guids(&dst, "copy")
            .into_iter()
            .map(|(n, _)| n)
            .collect::<Vec<_>>(),
        ["a"]
    );
    assert_eq!(dst.volumes().len(), 1, "no hidden volume left");
    audit_clean(&dst, "after the refused receive");
    // With -F the target's changes are discarded, as asked: the volume is @b.
    receive(true).unwrap();
    assert_eq!(
        read_all(&dst.volume("copy").unwrap()),
        snap_bytes(&src, "src", "b")
    );
    audit_clean(&dst, "after the forced receive");
}

#[test]
fn damaged_and_cut_streams_change_nothing() {
    let (src, _m1) = source();
    let (dst, _m2) = mem_pool(TopVdevKind::Single, 1);
    let full = send(&src, "src", "a", None, false);
    let inc = send(&src, "src", "c", Some("a"), false);
    let mut rng = 0x5eed_u64;
    let mut next = |n: usize| {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        (rng % n as u64) as usize
    };
    // Full streams into a new volume: nothing may be left.
    for round in 0..12 {
        let mut s = full.clone();
        if round % 2 == 0 {
            let at = next(s.len());
            s[at] ^= 1 << next(8);
        } else {
            s.truncate(next(s.len()));
        }
        assert!(
            recv(&dst, "copy", &s, false).is_err(),
            "round {round} accepted"
        );
        assert!(dst.volumes().is_empty(), "round {round} left a volume");
        assert!(
            !dst.receive_datasets().iter().any(|n| n == "copy%recv"),
            "round {round} left the hidden dataset"
        );
    }
    audit_clean(&dst, "after the damaged full streams");
    recv(&dst, "copy", &full, false).unwrap();
    let before = read_all(&dst.volume("copy").unwrap());
    let snaps = guids(&dst, "copy");
    for round in 0..16 {
        let mut s = inc.clone();
        if round % 2 == 0 {
            let at = next(s.len());
            s[at] ^= 1 << next(8);
        } else {
            s.truncate(next(s.len()));
        }
        let err = recv(&dst, "copy", &s, false).unwrap_err();
        assert!(!err.to_string().contains('\n'), "{err}");
        assert_eq!(
            read_all(&dst.volume("copy").unwrap()),
            before,
            "round {round}"
        );
        assert_eq!(guids(&dst, "copy"), snaps, "round {round}");
        assert!(
            !dst.receive_datasets().iter().any(|n| n == "copy%recv"),
            "round {round}: the hidden dataset is left"
        );
    }
    audit_clean(&dst, "after the damaged incrementals");
    recv(&dst, "copy", &inc, false).unwrap();
    assert_eq!(snap_bytes(&dst, "copy", "c"), snap_bytes(&src, "src", "c"));
    audit_clean(&dst, "after the good incremental");
}

#[test]
fn an_incremental_after_one_percent_sends_one_percent() {
    let (pool, _m) = mem_pool(TopVdevKind::Single, 1);
    let size = 32 * MIB;
    let vol = pool
        .create_volume("big", size, &[("volblocksize".into(), "4K".into())])
        .unwrap();
    let bs = vol.block_size_bytes() as u64;
    let nblocks = size / bs;
    for i in 0..(size / MIB) {
        write(&vol, i * MIB, &pattern(i + 1, MIB as usize));
    }
    snap(&pool, "big@a");
    // 1% of the blocks, spread over the volume (every 100th).
    let changed: Vec<u64> = (0..nblocks).step_by(100).collect();
    for (k, b) in changed.iter().enumerate() {
        write(&vol, b * bs, &pattern(1000 + k as u64, bs as usize));
    }
    snap(&pool, "big@b");
    let opts = |base: Option<&str>| SendOptions {
        base: base.map(str::to_string),
        ..Default::default()
    };
    let full = pool.send_estimate("big", "b", &opts(None)).unwrap();
    assert_eq!(full.data_records, nblocks);
    let mut out = Vec::new();
    let inc = pool.send("big", "b", &opts(Some("a")), &mut out).unwrap();
    assert_eq!(
        inc.data_records,
        changed.len() as u64,
        "exactly the changed blocks"
    );
    assert_eq!(inc.free_records, 0);
    // Every 100th block touches every level-1 block: the walk reads
    // those and their parents, never the unchanged data blocks; the full walk reads the
    // same indirect blocks and every data block.
    assert!(inc.data_bytes * 90 < full.data_bytes, "{inc:?} vs {full:?}");
    assert!(
        out.len() as u64 * 50 < full.stream_bytes,
        "{} vs {full:?}",
        out.len()
    );
    audit_clean(&pool, "after the sends");
    // Fewer changes in fewer places: the walk skips unchanged subtrees whole.
    let (pool, _m) = mem_pool(TopVdevKind::Single, 1);
    let vol2 = pool
        .create_volume("few", size, &[("volblocksize".into(), "4K".into())])
        .unwrap();
    for i in 0..(size / MIB) {
        write(&vol2, i * MIB, &pattern(i + 7, MIB as usize));
    }
    snap(&pool, "few@a");
    write(&vol2, 17 * MIB, &pattern(3, (8 * bs) as usize));
    snap(&pool, "few@b");
    let few = pool.send_estimate("few", "b", &opts(Some("a"))).unwrap();
    let few_full = pool.send_estimate("few", "b", &opts(None)).unwrap();
    assert_eq!(few.data_records, 8);
    assert!(
        few.indirect_reads * 10 < few_full.indirect_reads,
        "pruned walk read {} indirect blocks, the full walk {}",
        few.indirect_reads,
        few_full.indirect_reads
    );
    audit_clean(&pool, "after the sends");
}

/// A bookmark is an incremental base that holds no space: the sender bookmarks what it
/// replicated, destroys the snapshot, and still sends incrementals from the bookmark that
/// arrive byte for byte (across a resize: the bookmark keeps the size). Bookmarks survive
/// export and import; bad requests say why and change nothing.
#[test]
fn incrementals_from_a_bookmark_after_its_snapshot_is_gone() {
    let (mut src, src_mems) = source();
    let (dst, _dst_mems) = mem_pool(TopVdevKind::Single, 1);
    recv(&dst, "copy", &send(&src, "src", "a", None, false), false).unwrap();
    recv(
        &dst,
        "copy",
        &send(&src, "src", "b", Some("a"), false),
        false,
    )
    .unwrap();
    src.bookmark("src@b", "src#b").unwrap();
    src.bookmark("src#b", "src#b2").unwrap();
    let held_before = src.dataset_space("src").unwrap();
    src.destroy_snapshots("src", &["a".to_string(), "b".to_string()])
        .unwrap();
    let marks = src.bookmarks("src").unwrap();
    assert_eq!(
        marks.iter().map(|b| b.name.as_str()).collect::<Vec<_>>(),
        ["b", "b2"]
    );
    assert_eq!(
        marks[0].guid,
        guids(&dst, "copy")[1].1,
        "the bookmark keeps @b's guid"
    );
    assert!(
        src.dataset_space("src").unwrap().used_by_snapshots_bytes
            <= held_before.used_by_snapshots_bytes
    );
    audit_clean(&src, "after destroying the bookmarked snapshots");

    // Bookmarks live in the pool, not in memory.
    src.export().unwrap();
    src = reimport(&src_mems);
    assert_eq!(src.bookmarks("src").unwrap(), marks);

    // @c grew the volume since @b: the bookmark's size says so.
    let stream = send(&src, "src", "c", Some("#b"), false);
    recv(&dst, "copy", &stream, false).unwrap();
    assert_eq!(snap_bytes(&dst, "copy", "c"), snap_bytes(&src, "src", "c"));
    let stream = send(&src, "src", "d", Some("#b2"), false);
    // From @b to @d: refused onto @c (the base must be the target's latest snapshot)...
    assert!(recv(&dst, "copy", &stream, false).is_err());
    // ...and accepted after rolling back to @b with -F.
    recv(&dst, "copy", &stream, true).unwrap();
    assert_eq!(snap_bytes(&dst, "copy", "d"), snap_bytes(&src, "src", "d"));
    audit_clean(&dst, "after receiving from bookmarks");

    // Refusals: each says why, nothing changes.
    let refusals: [(&str, &str); 5] = [
        ("src@nope", "src#x"),
        ("src@c", "src#b"),
        ("src@c", "other#x"),
        ("src@c", "src#bad name"),
        ("src#nope", "src#x"),
    ];
    for (from, to) in refusals {
        let err = src.bookmark(from, to).unwrap_err().to_string();
        assert!(
            !err.is_empty() && !err.contains('\n'),
            "{from} -> {to}: {err}"
        );
    }
    assert!(src.destroy_bookmark("src", "nope").is_err());
    let opts = SendOptions {
        base: Some("#b".into()),
        intermediates: true,
        prefetch_bytes_max: 0,
    };
    let err = src.send("src", "d", &opts, &mut Vec::new()).unwrap_err();
    assert!(err.to_string().contains("-I"), "{err}");
    assert_eq!(src.bookmarks("src").unwrap(), marks);

    src.destroy_bookmark("src", "b").unwrap();
    assert_eq!(src.bookmarks("src").unwrap().len(), 1);
    audit_clean(&src, "after destroying a bookmark");
}

/// A send reads blocks side by side as one device request (`zio/read_run.rs`), and still
/// gets every block right when one side of a mirror returns garbage: each block is verified
/// alone, and one that fails is read again from the other side and healed.
#[test]
fn a_send_aggregates_its_reads_and_survives_a_bad_mirror_side() {
    let (pool, mems) = mem_pool(TopVdevKind::Mirror, 2);
    let vol = pool
        .create_volume("src", 4 * MIB, &[("compression".into(), "off".into())])
        .unwrap();
    let data = content(Fill::Random, 11, (4 * MIB) as usize);
    write(&vol, 0, &data);
    snap(&pool, "src@a");
    let blocks = 4 * MIB / vol.block_size_bytes() as u64;
    let reads = |pool: &Pool| -> u64 {
        let c = pool.counters();
        c.device_stats().iter().map(|d| d.io.read.ops).sum()
    };

    // The default read-ahead (32 MiB): runs of up to 1 MiB.
    let full = |pool: &Pool| {
        let mut out = Vec::new();
        pool.send("src", "a", &SendOptions::default(), &mut out)
            .unwrap();
        out
    };
    let before = reads(&pool);
    let clean = full(&pool);
    let ops = reads(&pool) - before;
    assert!(
        ops * 8 <= blocks,
        "{ops} device reads for {blocks} blocks: the reads were not aggregated"
    );

    // Side 0's data area gets bits flipped in every 16 KiB (its labels stay).
    let start = oxpool_format::DATA_START_BYTES;
    for (i, at) in (start..DEVICE_BYTES - start).step_by(16 << 10).enumerate() {
        mems[0].corrupt(at, 16 << 10, i as u64);
    }
    let again = full(&pool);
    assert!(
        again == clean,
        "the stream changed after side 0 was damaged"
    );
    let side0 = &pool.status().vdevs[0].children[0];
    assert!(side0.checksum_errors > 0, "{side0:?}");
    assert!(side0.repaired_bytes > 0, "{side0:?}");
    let (dst, _d) = mem_pool(TopVdevKind::Single, 1);
    recv(&dst, "copy", &again, false).unwrap();
    assert!(snap_bytes(&dst, "copy", "a") == data);
    audit_clean(&pool, "after healing side 0");
}

// Blocks stored as sent, stream format versions, and blocks a sender got wrong
// (docs/send.md, "Blocks stored as sent"; docs/format.md, "Send streams").

/// Each record of a stream: (header offset, payload length).
fn records_of(stream: &[u8]) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut at = 0;
    while at + 128 <= stream.len() {
        let payload = u32::from_le_bytes(stream[at + 12..at + 16].try_into().unwrap()) as usize;
        out.push((at, payload));
        at += 128 + payload;
    }
    out
}

/// Recomputes the running checksums of a version 2 stream the test edited: each header's
/// bytes 112..128 are the xxh3-128 of every header before it and its own bytes 0..112.
fn reseal_v2(stream: &mut [u8]) {
    let mut headers: Vec<u8> = Vec::new();
    for (at, _) in records_of(stream) {
        headers.extend_from_slice(&stream[at..at + 112]);
        let running = oxpool_format::checksum(oxpool_format::ChecksumType::Xxh3_128, &headers);
        stream[at + 112..at + 128].copy_from_slice(&running.0[..16]);
        headers.extend_from_slice(&stream[at + 112..at + 128]);
    }
}

/// The same records written in stream format version 1 (streams one after the other too).
fn to_version_1(stream: &[u8]) -> Vec<u8> {
    let out = reencode(stream, 1, |_| {});
    assert_eq!(&out[16..20], &1u32.to_le_bytes());
    out
}

/// Every data block's pointer of `vol` (its stored form), block by block.
fn stored_forms(vol: &oxpool_engine::Volume) -> Vec<(oxpool_format::Compression, u32, u32, u64)> {
    let bs = u64::from(vol.block_size_bytes());
    (0..vol.size_bytes() / bs)
        .map(|b| {
            let bp = oxpool_io::rt::block_on(vol.block_pointer(b)).unwrap();
            let sum = u64::from_le_bytes(bp.checksum.0[..8].try_into().unwrap());
            (bp.compression, bp.psize_bytes, bp.lsize_bytes, sum)
        })
        .collect()
}

#[test]
fn received_blocks_keep_the_form_they_were_sent_in() {
    let (src, _m1) = mem_pool(TopVdevKind::Single, 1);
    // zstd at the sender, where the receiver's new volume would use its default (lz4); and
    // compressible blocks stored uncompressed, which the receiver would compress.
    let packed = src
        .create_volume("packed", 2 * MIB, &[("compression".into(), "zstd".into())])
        .unwrap();
    write(&packed, 0, &content(Fill::Compressible, 1, MIB as usize));
    write(&packed, MIB, &content(Fill::Random, 2, MIB as usize));
    let plain = src
        .create_volume("plain", MIB, &[("compression".into(), "off".into())])
        .unwrap();
    write(&plain, 0, &content(Fill::Compressible, 3, MIB as usize));
    snap(&src, "packed@s");
    snap(&src, "plain@s");
    let (dst, _m2) = mem_pool(TopVdevKind::Single, 1);
    for name in ["packed", "plain"] {
        recv(&dst, name, &send(&src, name, "s", None, false), false).unwrap();
        let sent = src.snapshot_volume(name, "s").unwrap();
        let got = dst.volume(name).unwrap();
        assert_eq!(read_all(&got), read_all(&sent), "{name}");
        let forms = stored_forms(&got);
        assert_eq!(forms, stored_forms(&sent), "{name}: stored as sent");
        // The head has not changed since @s: its stored bytes are the snapshot's.
        let head = src.volume(name).unwrap();
        assert_eq!(got.compressed_bytes(), head.compressed_bytes(), "{name}");
        let zstd = forms
            .iter()
            .filter(|f| f.0 == oxpool_format::Compression::Zstd)
            .count();
        match name {
            "packed" => assert!(zstd > 0, "no zstd block received"),
            _ => assert!(
                forms.iter().all(|f| f.0 == oxpool_format::Compression::Off),
                "a block sent uncompressed was compressed"
            ),
        }
        // The received volume's own writes follow its own property (lz4 by default).
        assert_eq!(got.get_prop("compression").unwrap(), "lz4");
    }
    // A sender whose checksum is blake3, a target whose is xxh3-128 (the default): the
    // blocks keep their compression and stored size, and get the target's checksum of the
    // same stored bytes (read back after an import below, where every read verifies it).
    let strong = src
        .create_volume(
            "strong",
            MIB,
            &[
                ("compression".into(), "lz4".into()),
                ("checksum".into(), "blake3".into()),
            ],
        )
        .unwrap();
    write(&strong, 0, &content(Fill::Compressible, 4, MIB as usize));
    snap(&src, "strong@s");
    recv(
        &dst,
        "strong",
        &send(&src, "strong", "s", None, false),
        false,
    )
    .unwrap();
    let sent = src.snapshot_volume("strong", "s").unwrap();
    let got = dst.volume("strong").unwrap();
    let bs = u64::from(got.block_size_bytes());
    let mut compressed = 0;
    for b in 0..MIB / bs {
        let want = oxpool_io::rt::block_on(sent.block_pointer(b)).unwrap();
        let have = oxpool_io::rt::block_on(got.block_pointer(b)).unwrap();
        assert_eq!(want.checksum_type, oxpool_format::ChecksumType::Blake3);
        assert_eq!(have.checksum_type, oxpool_format::ChecksumType::Xxh3_128);
        assert_eq!(
            (have.compression, have.psize_bytes),
            (want.compression, want.psize_bytes),
            "block {b}"
        );
        compressed += usize::from(have.compression != oxpool_format::Compression::Off);
    }
    assert!(compressed > 0);
    audit_clean(&dst, "after receiving stored blocks");
    dst.export().unwrap();
    let again = reimport(&_m2);
    for name in ["packed", "plain", "strong"] {
        assert_eq!(
            read_all(&again.volume(name).unwrap()),
            snap_bytes(&src, name, "s"),
            "{name} after import"
        );
    }
    audit_clean(&again, "after import");
}

#[test]
fn version_1_streams_are_received() {
    let (src, _m1) = source();
    let (dst, _m2) = mem_pool(TopVdevKind::Single, 1);
    let full = to_version_1(&send(&src, "src", "a", None, false));
    recv(&dst, "copy", &full, false).unwrap();
    assert_eq!(snap_bytes(&dst, "copy", "a"), snap_bytes(&src, "src", "a"));
    // Several version 1 streams one after the other (-I).
    let all = send(&src, "src", "d", Some("a"), true);
    let mut v1 = Vec::new();
    let mut at = 0;
    for (h, payload) in records_of(&all) {
        // Split at each END (type 5): each stream converted alone.
        if u32::from_le_bytes(all[h + 8..h + 12].try_into().unwrap()) == 5 {
            let end = h + 128 + payload;
            v1.extend_from_slice(&to_version_1(&all[at..end]));
            at = end;
        }
    }
    assert_eq!(at, all.len());
    recv(&dst, "copy", &v1, false).unwrap();
    for s in ["a", "b", "c", "d"] {
        assert_eq!(
            snap_bytes(&dst, "copy", s),
            snap_bytes(&src, "src", s),
            "@{s}"
        );
    }
    // Damage is refused in version 1 too.
    let mut damaged = full.clone();
    let last_data = records_of(&full)
        .into_iter()
        .rfind(|(h, _)| full[h + 8] == 2)
        .unwrap();
    damaged[last_data.0 + 128 + 5] ^= 0x10;
    assert!(recv(&dst, "other", &damaged, false).is_err());
    assert!(!dst.receive_datasets().iter().any(|n| n == "other%recv"));
    audit_clean(&dst, "after the version 1 streams");
}

#[test]
fn blocks_a_sender_got_wrong_are_refused() {
    let (src, _m1) = mem_pool(TopVdevKind::Single, 1);
    let vol = src
        .create_volume("v", MIB, &[("compression".into(), "lz4".into())])
        .unwrap();
    write(&vol, 0, &content(Fill::Compressible, 1, (MIB / 2) as usize));
    write(&vol, MIB / 2, &content(Fill::Random, 2, (MIB / 2) as usize));
    snap(&src, "v@s");
    let stream = send(&src, "v", "s", None, false);
    let data: Vec<(usize, usize)> = records_of(&stream)
        .into_iter()
        .filter(|(h, _)| stream[h + 8] == 2)
        .collect();
    let compressed = *data.iter().find(|(h, _)| stream[h + 28] != 0).unwrap();
    let plain = *data.iter().find(|(h, _)| stream[h + 28] == 0).unwrap();
    let (dst, _m2) = mem_pool(TopVdevKind::Single, 1);
    let refused = |bytes: &[u8], what: &str, says: &str| {
        let err = recv(&dst, "copy", bytes, false).unwrap_err().to_string();
        assert!(err.contains(says), "{what}: {err}");
        assert!(!err.contains('\n'), "{err}");
        assert!(dst.volumes().is_empty(), "{what}: a volume is left");
        assert!(
            !dst.receive_datasets().iter().any(|n| n == "copy%recv"),
            "{what}"
        );
        audit_clean(&dst, what);
    };
    // The payload intact and its payload checksum right, the block checksum wrong (one
    // hash in the decoder checks both, so this must still be caught).
    for (h, _) in [plain, compressed] {
        let mut s = stream.clone();
        s[h + 32 + 3] ^= 1;
        reseal_v2(&mut s);
        refused(&s, "a wrong block checksum", "block checksum mismatch");
    }
    // A payload changed with both of its checksums made to match: it verifies, but it is
    // not what lz4 writes. Refused before it is stored (never a panic, never stored).
    let (h, len) = compressed;
    let mut s = stream.clone();
    s[h + 128..h + 128 + len].fill(0xff);
    let sum = oxpool_format::checksum(
        oxpool_format::ChecksumType::Xxh3_128,
        &s[h + 128..h + 128 + len],
    );
    s[h + 32..h + 64].copy_from_slice(&sum.0);
    s[h + 96..h + 112].copy_from_slice(&sum.0[..16]);
    reseal_v2(&mut s);
    refused(
        &s,
        "a block that does not decompress",
        "does not decompress",
    );
    // The stream as sent is received.
    recv(&dst, "copy", &stream, false).unwrap();
    assert_eq!(
        read_all(&dst.volume("copy").unwrap()),
        snap_bytes(&src, "v", "s")
    );
    audit_clean(&dst, "after the good stream");
}

#[test]
fn blocks_written_as_stored_read_back_before_and_after_the_sync() {
    use oxpool_engine::{StoredBlock, StoredForm};
    use oxpool_format::{checksum, compress_block, ChecksumType, Compression, CompressionSetting};
    use oxpool_io::IoBuf;
    let (pool, mems) = mem_pool(TopVdevKind::Single, 1);
    let vol = pool
        .create_volume(
            "v",
            MIB,
            &[
                ("sync".into(), "disabled".into()),
                ("compression".into(), "off".into()),
            ],
        )
        .unwrap();
    let bs = vol.block_size_bytes() as usize;
    let stored = |logical: &[u8], compress: bool| -> StoredBlock {
        let mut packed = vec![0u8; bs];
        let n = if compress {
            compress_block(CompressionSetting::default(), logical, &mut packed).unwrap()
        } else {
            packed.copy_from_slice(logical);
            bs
        };
        let mut buf = IoBuf::zeroed(n.next_multiple_of(4096));
        buf[..n].copy_from_slice(&packed[..n]);
        StoredBlock {
            form: StoredForm {
                compression: if compress {
                    Compression::Lz4
                } else {
                    Compression::Off
                },
                lsize_bytes: bs as u32,
                psize_bytes: n as u32,
                checksum_type: ChecksumType::Xxh3_128,
                checksum: checksum(ChecksumType::Xxh3_128, &buf[..n]),
            },
            buf,
        }
    };
    let b0 = content(Fill::Compressible, 1, bs);
    let b1 = content(Fill::Random, 2, bs);
    let b2 = content(Fill::Compressible, 3, bs);
    let first = stored(&b0, true);
    let packed_form = first.form;
    assert!(packed_form.psize_bytes < bs as u32);
    oxpool_io::rt::block_on(
        vol.write_stored(0, vec![first, stored(&b1, false), stored(&b2, true)]),
    )
    .unwrap();
    // Read before any sync: the content, decompressed from the dirty stored block.
    let mut expect = [b0.clone(), b1.clone(), b2.clone()].concat();
    let mut got = vec![0u8; 3 * bs];
    oxpool_io::rt::block_on(vol.read(0, &mut got)).unwrap();
    assert_eq!(got, expect, "dirty stored blocks read as their content");
    // A partial, unaligned overwrite of a dirty stored block in the same txg.
    write(&vol, 1000, &[7u8; 100]);
    expect[1000..1100].fill(7);
    oxpool_io::rt::block_on(vol.read(0, &mut got)).unwrap();
    assert_eq!(got, expect, "after a partial overwrite");
    // A block that does not decompress is refused, nothing changed.
    let mut bad = stored(&b2, true);
    let n = bad.form.psize_bytes as usize;
    bad.buf[..n].fill(0xff);
    bad.form.checksum = checksum(ChecksumType::Xxh3_128, &bad.buf[..n]);
    let bs64 = bs as u64;
    assert!(oxpool_io::rt::block_on(vol.write_stored(3 * bs64, vec![bad])).is_err());
    pool.sync().unwrap();
    let mut all = vec![0u8; 4 * bs];
    oxpool_io::rt::block_on(vol.read(0, &mut all)).unwrap();
    assert_eq!(&all[..3 * bs], &expect[..]);
    assert!(
        all[3 * bs..].iter().all(|&x| x == 0),
        "the refused block was stored"
    );
    // Synced: block 0 was rewritten (by the volume's property: off), 1 and 2 as given.
    let bp = |b: u64| oxpool_io::rt::block_on(vol.block_pointer(b)).unwrap();
    assert_eq!(bp(0).compression, Compression::Off);
    assert_eq!(bp(1).compression, Compression::Off);
    assert_eq!(bp(2).compression, Compression::Lz4);
    assert_eq!(bp(2).psize_bytes, stored(&b2, true).form.psize_bytes);
    assert_eq!(bp(2).checksum, stored(&b2, true).form.checksum);
    // A logged volume does not take stored blocks (its log would need their content).
    let logged = pool.create_volume("logged", MIB, &[]).unwrap();
    assert!(oxpool_io::rt::block_on(logged.write_stored(0, vec![stored(&b0, true)])).is_err());
    audit_clean(&pool, "after stored writes");
    pool.export().unwrap();
    let again = reimport(&mems);
    let mut after = vec![0u8; 3 * bs];
    oxpool_io::rt::block_on(again.volume("v").unwrap().read(0, &mut after)).unwrap();
    assert_eq!(after, expect, "after import");
}

/// The send reads through a sliding window of runs: several runs in flight at once (on a
/// device whose reads take a while, so they are still in flight while the walk goes on),
/// never more bytes in flight than its bound, never more read ahead of the writer than the
/// read-ahead bound, and the same stream whatever the bounds.
#[test]
fn a_send_keeps_its_window_within_its_bounds() {
    let mem = oxpool_io::MemoryBackend::new("mem0", DEVICE_BYTES);
    let dev = Arc::new(FaultBackend::new(Arc::new(mem), 1));
    let top = TopSpec {
        log: false,
        kind: TopVdevKind::Single,
        devices: vec![dev.clone() as Arc<dyn oxpool_io::Backend>],
    };
    let pool = Pool::create("tank", vec![top], test_props(), false).unwrap();
    let vol = pool
        .create_volume("src", 8 * MIB, &[("compression".into(), "off".into())])
        .unwrap();
    let data = content(Fill::Random, 12, (8 * MIB) as usize);
    write(&vol, 0, &data);
    snap(&pool, "src@a");
    let bs = vol.block_size_bytes() as u64;
    let mut streams = Vec::new();
    // The last one reads a block at a time: without the latency, or it takes 512 of them.
    for prefetch in [0, 3 * MIB, 256 << 10, bs] {
        let latency_ms = if prefetch == bs { 0 } else { 20 };
        dev.set_read_latency(std::time::Duration::from_millis(latency_ms));
        let opts = SendOptions {
            base: None,
            intermediates: false,
            prefetch_bytes_max: prefetch,
        };
        let mut out = Vec::new();
        let stats = pool.send("src", "a", &opts, &mut out).unwrap();
        let bound = match prefetch {
            0 => SEND_PREFETCH_BYTES_DEFAULT,
            n => n,
        };
        let in_flight_bound = bound.min(SEND_READS_IN_FLIGHT_BYTES_MAX);
        assert!(
            stats.read_ahead_bytes_peak <= bound,
            "read-ahead {prefetch}: {} bytes read ahead at once",
            stats.read_ahead_bytes_peak
        );
        assert!(
            stats.reads_in_flight_bytes_peak <= in_flight_bound,
            "read-ahead {prefetch}: {} bytes in flight at once",
            stats.reads_in_flight_bytes_peak
        );
        if latency_ms > 0 {
            // The window fills: several runs in flight at once (a run is at most 1 MiB, and
            // at most a quarter of the bound), not one after the other.
            assert!(
                stats.reads_in_flight_bytes_peak >= in_flight_bound.min(2 * MIB),
                "read-ahead {prefetch}: at most {} bytes in flight of {in_flight_bound}",
                stats.reads_in_flight_bytes_peak
            );
        }
        assert_eq!(stats.data_records, 8 * MIB / bs);
        streams.push(out);
    }
    assert!(streams.iter().all(|s| *s == streams[0]), "streams differ");
    let (dst, _d) = mem_pool(TopVdevKind::Single, 1);
    recv(&dst, "copy", &streams[0], false).unwrap();
    assert!(snap_bytes(&dst, "copy", "a") == data);
}

/// A data block that does not verify in the middle of a run, on a device with no other
/// copy: the send fails with a checksum error (never sends the block, never skips it), and
/// the device's checksum errors count it.
#[test]
fn a_send_reports_a_damaged_block_in_a_run() {
    let (pool, mems) = mem_pool(TopVdevKind::Single, 1);
    let vol = pool
        .create_volume("src", 8 * MIB, &[("compression".into(), "off".into())])
        .unwrap();
    write(&vol, 0, &content(Fill::Random, 13, (8 * MIB) as usize));
    snap(&pool, "src@a");
    let mut clean = Vec::new();
    pool.send("src", "a", &SendOptions::default(), &mut clean)
        .unwrap();
    // A few bytes in the middle of the data written: a data block, as the estimate (which
    // reads the indirect blocks only) still succeeds below.
    mems[0].corrupt(oxpool_format::DATA_START_BYTES + 4 * MIB + 4096, 64, 7);
    let opts = SendOptions::default();
    pool.send_estimate("src", "a", &opts)
        .expect("the damage hit an indirect block: move it");
    let errors = |pool: &Pool| pool.status().vdevs[0].checksum_errors;
    let before = errors(&pool);
    let mut out = Vec::new();
    let err = pool.send("src", "a", &opts, &mut out).unwrap_err();
    assert!(
        matches!(err, oxpool_engine::EngineError::Checksum { .. }),
        "{err}"
    );
    assert!(errors(&pool) > before, "the bad block was not counted");
    assert!(out.len() < clean.len());
}

/// A sink that takes the stream's first bytes only when told to: the send stays in progress
/// until then.
struct GatedSink {
    started: std::sync::mpsc::Sender<()>,
    go: std::sync::mpsc::Receiver<()>,
    waited: bool,
    bytes: Vec<u8>,
}

impl std::io::Write for GatedSink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if !self.waited {
            self.waited = true;
            self.started.send(()).unwrap();
            self.go.recv().unwrap();
        }
        self.bytes.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[test]
fn a_snapshot_being_sent_cannot_be_destroyed_until_the_send_ends() {
    let (src, _mems) = source();
    let (started_tx, started) = std::sync::mpsc::channel();
    let (go, go_rx) = std::sync::mpsc::channel();
    let stream = std::thread::scope(|scope| {
        let sender = scope.spawn(|| {
            let mut sink = GatedSink {
                started: started_tx,
                go: go_rx,
                waited: false,
                bytes: Vec::new(),
            };
            // -I: every snapshot from @a to @d is read, so each is held.
            let opts = SendOptions {
                base: Some("a".into()),
                intermediates: true,
                prefetch_bytes_max: 256 << 10,
            };
            src.send("src", "d", &opts, &mut sink).map(|_| sink.bytes)
        });
        started.recv().unwrap();
        // While the stream is being written: refused, and nothing changes.
        for s in ["b", "c", "d"] {
            let err = src.destroy_snapshots("src", &[s.to_string()]).unwrap_err();
            assert!(err.to_string().contains("is being sent"), "@{s}: {err}");
            // What `destroy -R` checks before it destroys any clone.
            let why = src.destroy_refusal_besides_clones("src", s).unwrap();
            assert!(why.is_some_and(|w| w.contains("is being sent")), "@{s}");
        }
        // `destroy -d` marks it, to go when the send lets it go.
        let (now, later) = src
            .destroy_snapshots_deferred("src", &["c".to_string()])
            .unwrap();
        assert!(
            now.is_empty() && later == ["c".to_string()],
            "{now:?} {later:?}"
        );
        go.send(()).unwrap();
        sender.join().unwrap().unwrap()
    });
    // The stream is whole: a pool that has @a takes it.
    let dst = mem_pool(TopVdevKind::Single, 1).0;
    recv(&dst, "copy", &send(&src, "src", "a", None, false), false).unwrap();
    recv(&dst, "copy", &stream, false).unwrap();
    assert_eq!(
        guids(&dst, "copy").len(),
        4,
        "@a and the three snapshots of the -I stream"
    );
    // After the send: the deferred destroy happened, and the others can go.
    let names: Vec<String> = guids(&src, "src").into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["a", "b", "d"]);
    src.destroy_snapshots("src", &["b".to_string()]).unwrap();
    audit_clean(&src, "after the held send");
}

/// An `-I` input is several streams back to back: an error in a later one says where it is
/// in the input, not only in its own stream (a new user's finding: the offset given was the
/// stream's, which no tool could find in the file).
#[test]
fn an_error_in_a_later_stream_of_the_input_is_placed_in_the_input() {
    let (src, _mems) = source();
    let dst = mem_pool(TopVdevKind::Single, 1).0;
    recv(&dst, "copy", &send(&src, "src", "a", None, false), false).unwrap();
    // @b, @c and @d, one stream each.
    let all = send(&src, "src", "d", Some("a"), true);
    let cut_at = all.len() - 10;
    let err = recv(&dst, "copy", &all[..cut_at], false)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains(&format!("byte {cut_at} of the input")) && err.contains("its stream 3"),
        "{err}"
    );
    assert!(!err.contains('\n'), "{err}");
    // The two whole streams before it were received, each whole, and the error says so.
    assert!(
        err.contains("stream 3 of the input; 2 received before it, up to "),
        "{err}"
    );
    assert!(err.contains("copy@c"), "{err}");
    assert_eq!(guids(&dst, "copy").len(), 3, "@a, @b and @c");
    // A refusal of a later stream's BEGIN (not the decoder's) says which stream too: @c to
    // @d, then @b to @c, whose base is no longer the latest.
    let mut again = send(&src, "src", "d", Some("c"), false);
    again.extend(send(&src, "src", "c", Some("b"), false));
    let err = recv(&dst, "copy", &again, false).unwrap_err().to_string();
    assert!(
        err.contains("stream 2 of the input; 1 received before it, up to ")
            && err.contains("copy@d"),
        "{err}"
    );
    assert_eq!(guids(&dst, "copy").len(), 4, "@a to @d");
    // A few bytes of junk after a stream are no stream, not a cut one.
    let other = mem_pool(TopVdevKind::Single, 1).0;
    let mut junk = send(&src, "src", "a", None, false);
    junk.extend_from_slice(b"xyz");
    let err = recv(&other, "copy", &junk, false).unwrap_err().to_string();
    assert!(
        err.contains("not an oxpool send stream") && err.contains("1 received before it"),
        "{err}"
    );
}

/// A volume received from another volume of the same pool keeps its snapshots' guids, as
/// ZFS's `send pool/a@s | recv pool/b` does: a guid names a snapshot within its volume,
/// not within the pool. Destroying the copy's snapshot leaves the original's readers and
/// clones alone (before: the original's views stopped reading, and the destroy was refused
/// as "the origin of" the original's clone). A promote moves its snapshots' views with them.
#[test]
fn a_copy_within_the_pool_shares_its_guids_but_not_its_readers_or_clones() {
    let (pool, _mems) = mem_pool(TopVdevKind::Single, 1);
    let vol = pool.create_volume("v", 4 * MIB, &[]).unwrap();
    write(&vol, 0, &content(Fill::Random, 1, (4 * MIB) as usize));
    snap(&pool, "v@a");
    write(&vol, 0, &content(Fill::Random, 2, MIB as usize));
    snap(&pool, "v@s");
    recv(&pool, "x", &send(&pool, "v", "s", None, false), false).unwrap();
    assert_eq!(guids(&pool, "x")[0].1, guids(&pool, "v")[1].1, "x@s is v@s");
    pool.clone_snapshot("v", "s", "c", &[]).unwrap();
    let view_s = pool.snapshot_volume("v", "s").unwrap();
    let view_a = pool.snapshot_volume("v", "a").unwrap();
    let s_bytes = read_all(&view_s);

    pool.destroy_snapshots("x", &["s".to_string()]).unwrap();
    let mut again = vec![0u8; s_bytes.len()];
    oxpool_io::rt::block_on(view_s.read(0, &mut again))
        .expect("a reader of v@s reads on after x@s is destroyed");
    assert!(again == s_bytes, "v@s read back changed");
    let v_snaps = pool.snapshots("v").unwrap();
    assert_eq!(v_snaps[1].clones, [format!("{}/c", pool.name())]);

    // c takes v@a and v@s; destroying c@a ends the views of v@a made before.
    pool.promote("c").unwrap();
    pool.destroy_snapshots("c", &["a".to_string()]).unwrap();
    let mut buf = vec![0u8; 4096];
    assert!(
        oxpool_io::rt::block_on(view_a.read(0, &mut buf)).is_err(),
        "a view of a snapshot destroyed after it moved with a promote still reads"
    );
    assert!(oxpool_io::rt::block_on(view_s.read(0, &mut buf)).is_ok());
    audit_clean(
        &pool,
        "after the copy's snapshot and a promoted one were destroyed",
    );
}

/// An incremental stream whose snapshot guid the target already has for another of its
/// snapshots is refused, unchanged: a guid names one snapshot of a volume.
#[test]
fn an_incremental_repeating_a_guid_of_the_target_is_refused() {
    let (src, _mems) = source();
    let (dst, _dmems) = mem_pool(TopVdevKind::Single, 1);
    recv(&dst, "copy", &send(&src, "src", "a", None, false), false).unwrap();
    recv(
        &dst,
        "copy",
        &send(&src, "src", "b", Some("a"), false),
        false,
    )
    .unwrap();
    let a_guid = oxpool_format::Guid(guids(&dst, "copy")[0].1);
    let inc = send(&src, "src", "c", Some("b"), false);
    let crafted = with_begin(&inc, |b| b.toguid = a_guid);
    let err = recv(&dst, "copy", &crafted, false).unwrap_err();
    assert!(
        err.to_string()
            .contains("copy@a already has the stream's snapshot guid"),
        "{err}"
    );
    let names: Vec<String> = guids(&dst, "copy").into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["a", "b"]);
    // The stream as sent is taken.
    recv(&dst, "copy", &inc, false).unwrap();
    audit_clean(&dst, "after the refused stream");
}

/// The same incremental received twice is refused as the destination existing (not with a
/// hint to destroy it with -F), and so is one whose snapshot name the target took since its
/// base; unchanged either way. With -F, the later snapshots go and the stream is taken.
#[test]
fn an_incremental_whose_snapshot_is_there_already_says_so() {
    let (src, _mems) = source();
    let (dst, _dmems) = mem_pool(TopVdevKind::Single, 1);
    recv(&dst, "copy", &send(&src, "src", "a", None, false), false).unwrap();
    let inc = send(&src, "src", "b", Some("a"), false);
    recv(&dst, "copy", &inc, false).unwrap();
    let before = guids(&dst, "copy");
    let err = recv(&dst, "copy", &inc, false).unwrap_err().to_string();
    assert!(
        err.contains("destination") && err.contains("copy@b is the stream's snapshot"),
        "{err}"
    );
    assert!(
        err.contains("received already") && !err.contains("-F"),
        "{err}"
    );
    assert_eq!(guids(&dst, "copy"), before);
    // Renamed, it is still found by its guid.
    dst.rename("copy@b", "copy@b2").unwrap();
    let err = recv(&dst, "copy", &inc, false).unwrap_err().to_string();
    assert!(err.contains("copy@b2 is the stream's snapshot"), "{err}");
    // A snapshot of the stream's name taken here since the base.
    dst.rollback("copy", "a", true).unwrap();
    snap(&dst, "copy@b");
    let err = recv(&dst, "copy", &inc, false).unwrap_err().to_string();
    assert!(
        err.contains("destination") && err.contains("copy@b exists"),
        "{err}"
    );
    // -F destroys the later snapshot and receives the stream.
    recv(&dst, "copy", &inc, true).unwrap();
    let (_, src_guids): (Vec<String>, Vec<u64>) = guids(&src, "src").into_iter().take(2).unzip();
    let (_, dst_guids): (Vec<String>, Vec<u64>) = guids(&dst, "copy").into_iter().unzip();
    assert_eq!(dst_guids, src_guids);
    audit_clean(&dst, "after the refused streams");
}

/// A send holds its snapshots by guid, so a copy's snapshot within the pool waits for it
/// too: `destroy -d` of the copy's snapshot during the send marks it, and the end of the
/// send destroys it. Before, only the sent volume's marked snapshots were looked at: the
/// copy's stayed marked, and its space held, until something else released it.
#[test]
fn a_copy_s_snapshot_marked_during_a_send_of_the_original_goes_when_the_send_ends() {
    let (pool, _mems) = mem_pool(TopVdevKind::Single, 1);
    let vol = pool.create_volume("v", 4 * MIB, &[]).unwrap();
    write(&vol, 0, &content(Fill::Random, 1, (4 * MIB) as usize));
    snap(&pool, "v@s");
    recv(&pool, "x", &send(&pool, "v", "s", None, false), false).unwrap();
    let (started_tx, started) = std::sync::mpsc::channel();
    let (go, go_rx) = std::sync::mpsc::channel();
    std::thread::scope(|scope| {
        let sender = scope.spawn(|| {
            let mut sink = GatedSink {
                started: started_tx,
                go: go_rx,
                waited: false,
                bytes: Vec::new(),
            };
            pool.send("v", "s", &SendOptions::default(), &mut sink)
        });
        started.recv().unwrap();
        let (now, later) = pool
            .destroy_snapshots_deferred("x", &["s".to_string()])
            .unwrap();
        assert!(
            now.is_empty() && later == ["s".to_string()],
            "{now:?} {later:?}"
        );
        go.send(()).unwrap();
        sender.join().unwrap().unwrap();
    });
    assert!(guids(&pool, "x").is_empty(), "x@s is still there");
    assert_eq!(guids(&pool, "v").len(), 1);
    audit_clean(&pool, "after the deferred destroy");
}

/// A promote that would move a snapshot beside one of the clone's with the same guid (a
/// crafted stream gave the clone a snapshot with the guid of its origin volume's older
/// one) is refused, unchanged: a guid names one snapshot of a volume.
#[test]
fn a_promote_that_would_repeat_a_guid_in_the_clone_is_refused() {
    let (pool, _mems) = mem_pool(TopVdevKind::Single, 1);
    let vol = pool.create_volume("v", 4 * MIB, &[]).unwrap();
    write(&vol, 0, &content(Fill::Random, 1, MIB as usize));
    snap(&pool, "v@a");
    snap(&pool, "v@b");
    let c = pool.clone_snapshot("v", "b", "c", &[]).unwrap();
    snap(&pool, "c@x");
    write(&c, 0, &content(Fill::Random, 2, MIB as usize));
    snap(&pool, "c@y");
    let a_guid = oxpool_format::Guid(guids(&pool, "v")[0].1);
    let inc = send(&pool, "c", "y", Some("x"), false);
    pool.destroy_snapshots("c", &["y".to_string()]).unwrap();
    recv(&pool, "c", &with_begin(&inc, |b| b.toguid = a_guid), true).unwrap();
    let err = pool.promote("c").unwrap_err();
    assert!(err.to_string().contains("has the guid of"), "{err}");
    assert_eq!(guids(&pool, "v").len(), 2, "nothing moved");
    audit_clean(&pool, "after the refused promote");
}

/// `recv -F` of a full stream onto an existing volume, as `zfs recv -F`: refused without -F,
/// with snapshots, for a clone and for another block size, each with the volume unchanged;
/// with -F onto a volume without snapshots the volume becomes the stream's snapshot (data,
/// size, guid), all it held is freed (the audit finds no leak), its bookmarks go, and
/// incrementals continue from it.
#[test]
fn a_full_stream_replaces_a_volume_without_snapshots_only_with_force() {
    let (src, _m1) = source();
    let (dst, mems) = mem_pool(TopVdevKind::Single, 1);
    let vol = dst.create_volume("copy", 8 * MIB, &[]).unwrap();
    write(&vol, 0, &content(Fill::Random, 11, (8 * MIB) as usize));
    dst.sync().unwrap();
    let old = read_all(&vol);
    let full_b = send(&src, "src", "b", None, false);
    let unchanged = |when: &str| {
        assert_eq!(read_all(&dst.volume("copy").unwrap()), old, "{when}");
        assert!(
            dst.receive_datasets().is_empty(),
            "{when}: a hidden dataset left"
        );
        audit_clean(&dst, when);
    };

    let err = recv(&dst, "copy", &full_b, false).unwrap_err().to_string();
    assert!(
        err.contains("exists") && err.contains("use -F to replace it"),
        "{err}"
    );
    unchanged("refused without -F");

    snap(&dst, "copy@keep");
    dst.bookmark("copy@keep", "copy#mark").unwrap();
    let err = recv(&dst, "copy", &full_b, true).unwrap_err().to_string();
    assert!(
        err.contains("it has snapshots (e.g. ") && err.contains("copy@keep"),
        "{err}"
    );
    assert_eq!(guids(&dst, "copy").len(), 1);
    unchanged("refused with a snapshot");

    dst.clone_snapshot("copy", "keep", "clone", &[]).unwrap();
    let err = recv(&dst, "clone", &full_b, true).unwrap_err().to_string();
    assert!(err.contains("it is a clone"), "{err}");
    assert_eq!(read_all(&dst.volume("clone").unwrap()), old);
    dst.destroy_volume("clone").unwrap();
    dst.destroy_snapshots("copy", &["keep".to_string()])
        .unwrap();
    assert!(guids(&dst, "copy").is_empty());
    assert_eq!(dst.bookmarks("copy").unwrap().len(), 1);

    let small = dst
        .create_volume("small", MIB, &[("volblocksize".into(), "4K".into())])
        .unwrap();
    write(&small, 0, &content(Fill::Random, 12, MIB as usize));
    let err = recv(&dst, "small", &full_b, true).unwrap_err().to_string();
    assert!(err.contains("volblocksize"), "{err}");
    dst.destroy_volume("small").unwrap();
    unchanged("refused for another block size");

    recv(&dst, "copy", &full_b, true).unwrap();
    let copy = dst.volume("copy").unwrap();
    assert_eq!(
        read_all(&copy),
        snap_bytes(&src, "src", "b"),
        "the head is @b"
    );
    assert_eq!(copy.size_bytes(), 4 * MIB, "the stream's size");
    assert_eq!(snap_bytes(&dst, "copy", "b"), snap_bytes(&src, "src", "b"));
    assert_eq!(guids(&dst, "copy"), guids(&src, "src")[1..2].to_vec());
    assert!(
        dst.bookmarks("copy").unwrap().is_empty(),
        "its bookmarks go"
    );
    assert!(dst.receive_datasets().is_empty());
    // Nothing of the 8 MiB of random data it held is left: the pool holds what a full
    // receive into a new volume holds, give or take metadata.
    let (fresh, _m3) = mem_pool(TopVdevKind::Single, 1);
    recv(&fresh, "copy", &full_b, false).unwrap();
    fresh.sync().unwrap();
    dst.sync().unwrap();
    let (held, fresh_held) = (dst.status().allocated_bytes, fresh.status().allocated_bytes);
    assert!(
        held < fresh_held + MIB,
        "{held} bytes allocated after the replace, {fresh_held} after a fresh receive"
    );
    audit_clean(&dst, "after the replace");

    recv(
        &dst,
        "copy",
        &send(&src, "src", "d", Some("b"), true),
        false,
    )
    .unwrap();
    for s in ["b", "c", "d"] {
        assert_eq!(
            snap_bytes(&dst, "copy", s),
            snap_bytes(&src, "src", s),
            "@{s}"
        );
    }
    audit_clean(&dst, "after the incrementals");
    dst.export().unwrap();
    let again = reimport(&mems);
    assert_eq!(
        snap_bytes(&again, "copy", "d"),
        snap_bytes(&src, "src", "d")
    );
    audit_clean(&again, "after import");
}

/// A full stream replacing a volume is checked again when it ends: if the volume was
/// snapshotted, or its name given to a clone, while the stream arrived, nothing is applied
/// (the clone shares its origin's blocks, which the replace would free).
#[test]
fn a_replace_whose_target_changed_while_the_stream_arrived_applies_nothing() {
    let (src, _m1) = source();
    let (dst, _m2) = mem_pool(TopVdevKind::Single, 1);
    let full_b = send(&src, "src", "b", None, false);
    let other = dst.create_volume("other", 2 * MIB, &[]).unwrap();
    write(&other, 0, &content(Fill::Random, 21, (2 * MIB) as usize));
    snap(&dst, "other@o");
    let origin = snap_bytes(&dst, "other", "o");
    let receive =
        |change: Box<dyn FnOnce() + '_>| receive_changing_midway(&dst, &full_b, true, change);
    let vol = dst.create_volume("copy", MIB, &[]).unwrap();
    write(&vol, 0, &content(Fill::Random, 22, MIB as usize));
    let old = read_all(&vol);
    let err = receive(Box::new(|| snap(&dst, "copy@late")))
        .unwrap_err()
        .to_string();
    assert!(err.contains("nothing was applied"), "{err}");
    assert_eq!(read_all(&dst.volume("copy").unwrap()), old);
    assert_eq!(guids(&dst, "copy").len(), 1, "@late stays");
    audit_clean(&dst, "after a snapshot during the replace");

    dst.destroy_snapshots("copy", &["late".to_string()])
        .unwrap();
    let err = receive(Box::new(|| {
        dst.destroy_volume("copy").unwrap();
        dst.clone_snapshot("other", "o", "copy", &[]).unwrap();
    }))
    .unwrap_err()
    .to_string();
    assert!(err.contains("nothing was applied"), "{err}");
    assert_eq!(
        read_all(&dst.volume("copy").unwrap()),
        origin,
        "the clone as made"
    );
    assert_eq!(snap_bytes(&dst, "other", "o"), origin, "its origin");
    assert!(dst.receive_datasets().is_empty());
    audit_clean(&dst, "after a clone took the name during the replace");

    // Another volume under the name, of the stream's block size or not: not the volume
    // checked, so not replaced.
    dst.destroy_volume("copy").unwrap();
    dst.create_volume("copy", MIB, &[]).unwrap();
    for blocks in ["16K", "4K"] {
        let made = content(Fill::Random, 23, MIB as usize);
        let err = receive(Box::new(|| {
            dst.destroy_volume("copy").unwrap();
            let vol = dst
                .create_volume("copy", MIB, &[("volblocksize".into(), blocks.into())])
                .unwrap();
            write(&vol, 0, &made);
        }))
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("destroyed or replaced") && err.contains("nothing was applied"),
            "{err}"
        );
        assert_eq!(read_all(&dst.volume("copy").unwrap()), made, "{blocks}");
        assert!(guids(&dst, "copy").is_empty());
        audit_clean(&dst, &format!("after a {blocks} volume took the name"));
    }
}
