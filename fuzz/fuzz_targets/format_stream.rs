#![no_main]
//! The send stream decoder and the resume token parser on arbitrary bytes: never panics;
//! gives the same records and the same error whether the bytes arrive at once or in pieces;
//! hands out only records the encoder would write (re-encoding them must not panic and must
//! give back the same bytes).
//!
//! Input: byte 0 picks the piece size (bits 0..6, plus one) and the mode (bit 7). Mode 0:
//! the rest is the stream as is (it must get past the magic and the checksums by itself).
//! Mode 1: the rest is stamped with the magic every 128-byte header needs and re-sealed
//! with correct checksums (the documented rule: payload checksum at 96, running checksum at
//! 112 over the headers before it, or every byte before it when BEGIN's version is 1), so
//! the fuzzer reaches the field and order checks behind them. The input is also parsed as a
//! resume token.

use libfuzzer_sys::fuzz_target;
use oxpool_format::stream::{RECORD_HEADER_BYTES, STREAM_MAGIC};
use oxpool_format::{ResumeToken, StreamDecoder, StreamEncoder, StreamError, StreamRecord};
use xxhash_rust::xxh3::{xxh3_128, Xxh3Default};

/// Decodes in pieces of `piece` bytes, re-encoding every record as it comes.
fn drive(bytes: &[u8], piece: usize) -> (Vec<String>, Result<(), StreamError>, Vec<u8>) {
    let mut decoder = StreamDecoder::new();
    let mut records = Vec::new();
    let mut encoder: Option<StreamEncoder> = None;
    let mut rewritten = Vec::new();
    for chunk in bytes.chunks(piece.max(1)) {
        let mut rest = chunk;
        while !rest.is_empty() {
            // Known once BEGIN's header is in, before the BEGIN record is handed out.
            let version = decoder.version();
            let decoded = match decoder.decode(rest) {
                Ok(decoded) => decoded,
                Err(err) => return (records, Err(err), rewritten),
            };
            assert!(decoded.consumed_bytes <= rest.len());
            assert!(decoded.consumed_bytes > 0);
            if let Some(record) = decoded.record {
                // What the decoder accepts, the encoder writes back byte for byte.
                match &record {
                    StreamRecord::Begin(begin) => {
                        let version = version.expect("BEGIN's header read first");
                        let (e, header) = StreamEncoder::with_version(begin, version);
                        rewritten.extend_from_slice(&header);
                        rewritten.extend_from_slice(begin.name.as_bytes());
                        encoder = Some(e);
                    }
                    StreamRecord::Data(d) => {
                        let e = encoder.as_mut().expect("BEGIN first");
                        rewritten.extend_from_slice(&e.data(d));
                        rewritten.extend_from_slice(d.payload);
                    }
                    StreamRecord::Free {
                        offset_bytes,
                        length_bytes,
                    } => {
                        let e = encoder.as_mut().expect("BEGIN first");
                        rewritten.extend_from_slice(&e.free(*offset_bytes, *length_bytes));
                    }
                    StreamRecord::SetSize { volsize_bytes } => {
                        let e = encoder.as_mut().expect("BEGIN first");
                        rewritten.extend_from_slice(&e.set_size(*volsize_bytes));
                    }
                    StreamRecord::End { checksum, .. } => {
                        let e = encoder.take().expect("BEGIN first");
                        let (header, sum) = e.end();
                        assert_eq!(sum, *checksum);
                        rewritten.extend_from_slice(&header);
                    }
                }
                // Debug shows every field and payload byte.
                records.push(format!("{record:?}"));
            }
            rest = &rest[decoded.consumed_bytes..];
        }
    }
    let result = decoder.finish();
    (records, result, rewritten)
}

/// Stamps the magic at every header and re-seals the checksums, walking the records by their
/// payload sizes (clamped to what is there).
fn seal(bytes: &mut [u8]) {
    let v1 = bytes.len() >= 20 && bytes[16..20] == 1u32.to_le_bytes();
    let mut hasher = Xxh3Default::new();
    let mut at = 0usize;
    // Bounded: every pass moves at least one header forward.
    while at + RECORD_HEADER_BYTES <= bytes.len() {
        bytes[at..at + 8].copy_from_slice(&STREAM_MAGIC.to_le_bytes());
        let payload = u32::from_le_bytes(bytes[at + 12..at + 16].try_into().unwrap()) as usize;
        let payload_at = at + RECORD_HEADER_BYTES;
        let end = payload_at.saturating_add(payload).min(bytes.len());
        let sum = xxh3_128(&bytes[payload_at..end]);
        bytes[at + 96..at + 112].copy_from_slice(&sum.to_le_bytes());
        hasher.update(&bytes[at..at + 112]);
        let running = hasher.digest128();
        bytes[at + 112..at + 128].copy_from_slice(&running.to_le_bytes());
        let covered_end = if v1 { end } else { end.min(at + RECORD_HEADER_BYTES) };
        hasher.update(&bytes[at + 112..covered_end]);
        at = end;
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&control, rest)) = data.split_first() else {
        return;
    };
    let piece = usize::from(control & 0x7f) + 1;
    let mut bytes = rest.to_vec();
    if control & 0x80 != 0 {
        seal(&mut bytes);
    }
    let (whole_records, whole_result, whole_rewritten) = drive(&bytes, bytes.len());
    let (split_records, split_result, _) = drive(&bytes, piece);
    assert_eq!(whole_records, split_records);
    assert_eq!(whole_result, split_result);
    if let Err(err) = &whole_result {
        assert_eq!(err.to_string().lines().count(), 1);
        assert!(err.offset_bytes <= bytes.len() as u64);
    } else {
        // A complete stream is canonical: the encoder wrote exactly these bytes.
        assert_eq!(whole_rewritten, bytes);
    }

    if let Ok(text) = std::str::from_utf8(rest) {
        if let Ok(token) = text.parse::<ResumeToken>() {
            assert_eq!(token.to_string().parse::<ResumeToken>(), Ok(token));
        }
    }
});
