#![no_main]
//! The control-socket decoder on arbitrary bytes: never panics; whatever decodes re-encodes to
//! the very bytes it came from; and with the checksum sealed (byte 0 says so), the fuzzer gets
//! past the CRC to the payload decoders.

use libfuzzer_sys::fuzz_target;
use oxpool_control::{decode, encode, read_message, FRAME_HEADER_BYTES};

fuzz_target!(|data: &[u8]| {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let mut bytes = rest.to_vec();
    if mode & 1 == 1 && bytes.len() >= FRAME_HEADER_BYTES {
        // Seal: a valid magic, version 1, the true payload length and a correct CRC.
        bytes[..4].copy_from_slice(b"OXCT");
        bytes[4..6].copy_from_slice(&1u16.to_le_bytes());
        let len = (bytes.len() - FRAME_HEADER_BYTES) as u32;
        bytes[8..12].copy_from_slice(&len.to_le_bytes());
        let crc = crc32c::crc32c(&bytes);
        bytes.extend_from_slice(&crc.to_le_bytes());
    }
    if let Ok(Some((message, used))) = decode(&bytes) {
        let mut again = Vec::new();
        encode(&message, &mut again).expect("a decoded message fits a frame");
        assert_eq!(again, bytes[..used], "decoded {message:?} re-encodes differently");
    }
    let _ = read_message(&mut std::io::Cursor::new(&bytes[..]));
});
