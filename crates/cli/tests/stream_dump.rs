//! `oxpool stream dump`: streams written here with the format crate's encoder are printed
//! one record per line with the header's fields and totals, from a file or from standard
//! input; a damaged, truncated or foreign stream is a one-line error naming the byte, with a
//! non-zero exit, after the records that decoded before it.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use oxpool_format::{
    checksum, ChecksumType, Compression, DataRecord, Guid, StreamBegin, StreamEncoder,
    StreamFeatures, Txg, VolumeId,
};

/// The encoded stream and the byte offset of each record.
struct Stream {
    bytes: Vec<u8>,
    offsets: Vec<usize>,
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

fn begin(fromguid: Option<Guid>) -> StreamBegin {
    StreamBegin {
        features: StreamFeatures::COMPRESSED,
        volsize_bytes: 64 * 4096,
        volblocksize_bytes: 4096,
        pool_guid: Guid(0xabc),
        volume_id: VolumeId(7),
        toguid: Guid(0x1234_5678_9abc_def0),
        fromguid,
        creation_txg: Txg(99),
        creation_time_ns: 1_700_000_000_123_456_789,
        resume_offset_bytes: 0,
        name: "tank/vol0@monday".into(),
    }
}

/// BEGIN, [SET_SIZE,] a block at 0 (off, xxh3-128), a block at 8192 (lz4, blake3, 300 stored
/// bytes), FREE of blocks 4..10, END.
fn encode_stream(incremental: bool) -> Stream {
    let begin = begin(incremental.then_some(Guid(0x42)));
    let mut bytes = Vec::new();
    let mut offsets = Vec::new();
    let (mut encoder, header) = StreamEncoder::new(&begin);
    offsets.push(bytes.len());
    bytes.extend_from_slice(&header);
    bytes.extend_from_slice(begin.name.as_bytes());
    if incremental {
        offsets.push(bytes.len());
        bytes.extend_from_slice(&encoder.set_size(begin.volsize_bytes));
    }
    let plain = pattern(1, 4096);
    let packed = pattern(2, 300);
    for (offset, compression, kind, payload) in [
        (0, Compression::Off, ChecksumType::Xxh3_128, &plain),
        (8192, Compression::Lz4, ChecksumType::Blake3, &packed),
    ] {
        let record = DataRecord {
            offset_bytes: offset,
            lsize_bytes: 4096,
            compression,
            checksum_type: kind,
            checksum: checksum(kind, payload),
            payload,
        };
        offsets.push(bytes.len());
        bytes.extend_from_slice(&encoder.data(&record));
        bytes.extend_from_slice(payload);
    }
    offsets.push(bytes.len());
    bytes.extend_from_slice(&encoder.free(4 * 4096, 6 * 4096));
    offsets.push(bytes.len());
    bytes.extend_from_slice(&encoder.end().0);
    Stream { bytes, offsets }
}

fn oxpool(dir: &Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_oxpool"));
    command
        .arg("--cache-file")
        .arg(dir.join("pools.cache"))
        .current_dir(dir);
    command
}

/// `oxpool stream dump FILE` on `bytes` written to a file.
fn dump_file(dir: &Path, bytes: &[u8]) -> Output {
    let path = dir.join("stream.bin");
    std::fs::write(&path, bytes).unwrap();
    oxpool(dir)
        .args(["stream", "dump", "stream.bin"])
        .stdin(Stdio::null())
        .output()
        .expect("run oxpool")
}

/// `oxpool stream dump` (or `dump -`) with `bytes` on standard input.
fn dump_stdin(dir: &Path, bytes: &[u8], dash: bool) -> Output {
    let mut command = oxpool(dir);
    command.args(["stream", "dump"]);
    if dash {
        command.arg("-");
    }
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run oxpool");
    let mut stdin = child.stdin.take().unwrap();
    let input = bytes.to_vec();
    // A thread, so that a dump that stops reading early (an error) cannot block the test.
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(&input);
    });
    let output = child.wait_with_output().expect("wait for oxpool");
    writer.join().unwrap();
    output
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8(bytes.to_vec()).expect("UTF-8 output")
}

/// The one-line error of a failed dump.
fn failure(output: &Output) -> String {
    assert!(!output.status.success(), "dump succeeded on a bad stream");
    assert_eq!(output.status.code(), Some(1));
    let err = text(&output.stderr);
    assert_eq!(err.trim_end().lines().count(), 1, "not one line: {err}");
    err
}

#[test]
fn records_are_printed_one_per_line_with_totals() {
    let dir = tempfile::tempdir().unwrap();
    let stream = encode_stream(true);
    let output = dump_file(dir.path(), &stream.bytes);
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert!(output.stderr.is_empty(), "{}", text(&output.stderr));
    let out = text(&output.stdout);
    let lines: Vec<&str> = out.lines().collect();
    let plain_sum = checksum(ChecksumType::Xxh3_128, &pattern(1, 4096)).to_string();
    let packed_sum = checksum(ChecksumType::Blake3, &pattern(2, 300)).to_string();
    let end_sum: String = stream.bytes[stream.bytes.len() - 16..]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    let expected = [
        "BEGIN name=tank/vol0@monday toguid=123456789abcdef0 fromguid=0000000000000042 \
         (incremental) volsize=262144 volblocksize=4096 features=0x1 (compressed) \
         creation_txg=99 creation_time_ns=1700000000123456789 pool_guid=0000000000000abc \
         volume_id=7 resume_offset=0 version=2"
            .to_string(),
        "SET_SIZE volsize=262144".to_string(),
        format!(
            "DATA offset=0 lsize=4096 psize=4096 compression=off checksum=xxh3-128:{}",
            &plain_sum[..32]
        ),
        format!(
            "DATA offset=8192 lsize=4096 psize=300 compression=lz4 checksum=blake3:{packed_sum}"
        ),
        "FREE offset=16384 length=24576".to_string(),
        format!("END toguid=123456789abcdef0 checksum={end_sum}"),
        format!(
            "totals records=6 stream_bytes={} begin=1 data=2 data_logical_bytes=8192 \
             data_stored_bytes=4396 free=1 free_bytes=24576 set_size=1 end=1",
            stream.bytes.len()
        ),
    ];
    assert_eq!(lines, expected);

    // The same from standard input, with and without `-`.
    for dash in [false, true] {
        let piped = dump_stdin(dir.path(), &stream.bytes, dash);
        assert!(piped.status.success(), "{}", text(&piped.stderr));
        assert_eq!(text(&piped.stdout), out);
    }

    // A full stream says so.
    let full = dump_file(dir.path(), &encode_stream(false).bytes);
    assert!(full.status.success(), "{}", text(&full.stderr));
    let out = text(&full.stdout);
    assert!(out.starts_with("BEGIN name=tank/vol0@monday "), "{out}");
    assert!(out.contains(" fromguid=0 (full) "), "{out}");
    assert!(!out.contains("SET_SIZE"), "{out}");
    assert!(out.contains("totals records=5 "), "{out}");
}

#[test]
fn a_damaged_stream_is_an_error_naming_the_byte() {
    let dir = tempfile::tempdir().unwrap();
    let good = encode_stream(true);
    let header_bytes = 128;

    // A byte of the compressed block: its payload checksum; the records before it print.
    let packed_at = good.offsets[3] + header_bytes;
    let mut bytes = good.bytes.clone();
    bytes[packed_at + 10] ^= 0x40;
    for output in [
        dump_file(dir.path(), &bytes),
        dump_stdin(dir.path(), &bytes, false),
    ] {
        let err = failure(&output);
        assert_eq!(
            err.trim_end(),
            format!(
                "oxpool: bad stream: byte {packed_at}: payload checksum mismatch (the stream \
                 is damaged)"
            )
        );
        let out = text(&output.stdout);
        assert_eq!(out.lines().count(), 3, "{out}");
        assert!(out.lines().nth(2).unwrap().starts_with("DATA offset=0 "));
        assert!(!out.contains("totals"), "{out}");
    }

    // A byte of a header: the running checksum, at that record.
    let mut bytes = good.bytes.clone();
    bytes[good.offsets[4] + 20] ^= 1;
    let err = failure(&dump_file(dir.path(), &bytes));
    assert!(
        err.contains(&format!(
            "byte {}: record header checksum mismatch",
            good.offsets[4]
        )),
        "{err}"
    );

    // Cut inside the last record: truncated, at the end of the input.
    let cut = good.bytes.len() - 5;
    let err = failure(&dump_file(dir.path(), &good.bytes[..cut]));
    assert!(
        err.contains(&format!(
            "byte {cut}: the stream is truncated: it ends in a record header"
        )),
        "{err}"
    );
    // Cut at a record boundary: no END.
    let cut = good.offsets[4];
    let err = failure(&dump_stdin(dir.path(), &good.bytes[..cut], false));
    assert!(err.contains("it ends before its END record"), "{err}");

    // Another version (read before the checksum).
    let mut bytes = good.bytes.clone();
    bytes[16] = 3;
    let err = failure(&dump_file(dir.path(), &bytes));
    assert!(
        err.contains("byte 16: stream format version 3 is not supported"),
        "{err}"
    );

    // Bytes after END.
    let mut bytes = good.bytes.clone();
    bytes.extend_from_slice(b"junk");
    let output = dump_file(dir.path(), &bytes);
    let err = failure(&output);
    assert!(
        err.contains(&format!(
            "byte {}: bytes after the END record",
            good.bytes.len()
        )),
        "{err}"
    );
    assert!(text(&output.stdout).contains("END toguid="));

    // Not a stream at all, and nothing at all.
    let err = failure(&dump_file(dir.path(), b"#!/bin/sh\necho hello\n"));
    assert!(err.contains("byte 0: not an oxpool send stream"), "{err}");
    let err = failure(&dump_stdin(dir.path(), b"", false));
    assert!(err.contains("it ends before its BEGIN record"), "{err}");

    // A file that is not there.
    let output = oxpool(dir.path())
        .args(["stream", "dump", "missing.bin"])
        .output()
        .unwrap();
    let err = failure(&output);
    assert!(err.contains("cannot open"), "{err}");
}
