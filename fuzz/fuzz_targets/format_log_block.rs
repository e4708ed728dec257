#![no_main]
//! decode_log_block and log_records: on raw bytes, and on sealed blocks whose header fields
//! (record count, next place) and record bytes are fuzzed, so that the fuzzer reaches the
//! record parser behind the magic and the checksum. A block that decodes must re-encode, with
//! `LogBlockWriter`, to a block that decodes to the same header and records.
//!
//! The intent log is the one structure read after every crash (import walks the chain and
//! replays its records), so its decoder sees whatever a torn or stale write left.

use libfuzzer_sys::fuzz_target;
use oxpool_format::{
    decode_log_block, log_records, Dva, Guid, LogBlockHeader, LogBlockWriter, LogRecord, VdevId,
    VolumeId, LOG_BLOCK_BYTES_MAX, LOG_BLOCK_MAGIC, LOG_HEADER_BYTES,
};

#[path = "format_common.rs"]
mod format_common;

const POOL: Guid = Guid(7);
const VOLUME: VolumeId = VolumeId(3);
const SEQ: u64 = 5;

fn check(bytes: &[u8]) {
    // The iterator alone, on anything: it must stop (after an error at the latest).
    for r in log_records(bytes).take(LOG_BLOCK_BYTES_MAX) {
        let _ = r;
    }
    let Ok((hdr, records)) = decode_log_block(bytes, POOL, VOLUME, SEQ) else {
        return;
    };
    let parsed: Vec<LogRecord<'_>> = log_records(records)
        .map(|r| r.expect("a decoded block's records all parse"))
        .collect();
    let mut buf = vec![0u8; LOG_BLOCK_BYTES_MAX];
    let mut w = LogBlockWriter::new();
    for r in &parsed {
        assert!(
            w.push(&mut buf, r),
            "a decoded block's records fit a block again"
        );
    }
    let n = w.finish(&hdr, &mut buf);
    let (hdr2, records2) =
        decode_log_block(&buf[..n], POOL, VOLUME, SEQ).expect("a re-encoded block decodes");
    assert_eq!(hdr2, hdr);
    let again: Vec<LogRecord<'_>> = log_records(records2).map(|r| r.unwrap()).collect();
    assert_eq!(again, parsed);
}

fuzz_target!(|data: &[u8]| {
    check(data);
    // First 4 bytes: the record count; next 16: the next place; the rest: the records.
    let field = |at: usize, len: usize| -> Vec<u8> {
        let mut v = data.get(at..).unwrap_or(&[]).to_vec();
        v.resize(len, 0);
        v.truncate(len);
        v
    };
    let body = data.get(20..).unwrap_or(&[]);
    let used = (LOG_HEADER_BYTES + body.len()).min(LOG_BLOCK_BYTES_MAX);
    let mut sealed = format_common::envelope(LOG_BLOCK_MAGIC, LOG_HEADER_BYTES, used, body);
    sealed[12..16].copy_from_slice(&field(0, 4));
    sealed[32..40].copy_from_slice(&POOL.0.to_le_bytes());
    sealed[40..48].copy_from_slice(&VOLUME.0.to_le_bytes());
    sealed[48..56].copy_from_slice(&SEQ.to_le_bytes());
    sealed[56..72].copy_from_slice(&field(4, 16));
    sealed[72..76].copy_from_slice(&(used as u32).to_le_bytes());
    format_common::reseal(&mut sealed);
    check(&sealed);
    // The same block as the writer lays it out, to check the seal matches its rule.
    if data.is_empty() {
        let mut buf = vec![0u8; LOG_BLOCK_BYTES_MAX];
        let hdr = LogBlockHeader {
            pool_guid: POOL,
            volume: VOLUME,
            seq: SEQ,
            next: Dva {
                vdev: VdevId(0),
                offset_bytes: 0,
                asize_bytes: 0,
            },
        };
        let n = LogBlockWriter::new().finish(&hdr, &mut buf);
        assert!(decode_log_block(&buf[..n], POOL, VOLUME, SEQ).is_ok());
    }
});
