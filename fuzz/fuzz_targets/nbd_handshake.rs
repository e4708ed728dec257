#![no_main]
//! The NBD server handshake on arbitrary client bytes: never panics, and gives the same
//! replies and outcome whether the bytes arrive at once or in pieces.
//!
//! Input: byte 0 picks the piece size (1..=64) and whether to prepend valid client flags
//! (so the fuzzer starts in option haggling); the rest is the client's byte stream.

use libfuzzer_sys::fuzz_target;
use oxpool_nbd::proto::wire::{CLIENT_FLAG_FIXED_NEWSTYLE, CLIENT_FLAG_NO_ZEROES};
use oxpool_nbd::proto::{ExportCaps, ExportInfo, Handshake, HandshakeStatus, ProtocolError};

fn exports() -> Vec<ExportInfo> {
    vec![
        ExportInfo {
            name: "vol0".into(),
            description: "first".into(),
            size_bytes: 1 << 30,
            preferred_block_bytes: 16384,
            read_only: false,
            caps: ExportCaps::default(),
        },
        ExportInfo {
            name: "ro".into(),
            description: String::new(),
            size_bytes: 4096,
            preferred_block_bytes: 4096,
            read_only: true,
            caps: ExportCaps::default(),
        },
    ]
}

/// Feeds `input` in pieces of `piece` bytes; returns output, consumed bytes and outcome.
fn drive(input: &[u8], piece: usize) -> (Vec<u8>, usize, Result<HandshakeStatus, ProtocolError>) {
    let mut handshake = Handshake::new(exports());
    let mut out = Vec::new();
    let mut position = 0;
    while position < input.len() {
        let end = (position + piece).min(input.len());
        match handshake.receive(&input[position..end], &mut out) {
            Err(error) => {
                // A finished machine stays finished.
                assert_eq!(
                    handshake.receive(&[0], &mut Vec::new()),
                    Err(ProtocolError::Finished)
                );
                return (out, position, Err(error));
            }
            Ok(progress) => {
                assert!(progress.consumed_bytes <= end - position);
                position += progress.consumed_bytes;
                if progress.status != HandshakeStatus::Continue {
                    return (out, position, Ok(progress.status));
                }
                assert_eq!(position, end, "Continue consumes all input");
            }
        }
    }
    (out, position, Ok(HandshakeStatus::Continue))
}

fuzz_target!(|data: &[u8]| {
    let Some((&control, stream)) = data.split_first() else {
        return;
    };
    let piece = usize::from(control & 0x3f) + 1;
    let mut input = Vec::with_capacity(stream.len() + 4);
    if control & 0x40 != 0 {
        input
            .extend_from_slice(&(CLIENT_FLAG_FIXED_NEWSTYLE | CLIENT_FLAG_NO_ZEROES).to_be_bytes());
    }
    input.extend_from_slice(stream);

    let (whole_out, whole_consumed, whole_result) = drive(&input, input.len().max(1));
    let (split_out, split_consumed, split_result) = drive(&input, piece);
    assert_eq!(whole_result, split_result);
    if whole_result.is_ok() {
        assert_eq!(whole_out, split_out);
        assert_eq!(whole_consumed, split_consumed);
    }
});
