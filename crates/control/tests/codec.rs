//! The control codec: every message round-trips; truncated, flipped, oversized and arbitrary
//! bytes give `None` (more needed) or an error, never a panic or a wrong message.

use oxpool_control::{
    decode, encode, read_message, DecodeError, Message, ReadError, Request, ARGS_MAX,
    FRAME_HEADER_BYTES, PAYLOAD_BYTES_MAX,
};
use proptest::prelude::*;

fn message() -> impl Strategy<Value = Message> {
    prop_oneof![
        (
            proptest::collection::vec(".{0,40}", 0..8),
            ".{0,60}",
            any::<bool>()
        )
            .prop_map(|(args, cwd, t)| Message::Request(Request {
                args,
                cwd,
                stderr_is_terminal: t
            })),
        proptest::collection::vec(any::<u8>(), 0..300).prop_map(Message::Stdin),
        proptest::collection::vec(any::<u8>(), 0..300).prop_map(Message::Stdout),
        proptest::collection::vec(any::<u8>(), 0..300).prop_map(Message::Stderr),
        Just(Message::StdinEnd),
        Just(Message::StdinWanted),
        (".{0,30}", any::<u64>(), any::<u64>())
            .prop_map(|(label, done, total)| Message::Progress { label, done, total }),
        (any::<i32>(), ".{0,80}").prop_map(|(code, error)| Message::Exit { code, error }),
    ]
}

proptest! {
    #[test]
    fn messages_round_trip_whole_and_streamed(m in message(), extra in 0usize..3) {
        let mut buf = Vec::new();
        encode(&m, &mut buf).unwrap();
        let frame_len = buf.len();
        for _ in 0..extra {
            encode(&Message::StdinEnd, &mut buf).unwrap();
        }
        let (back, used) = decode(&buf).unwrap().unwrap();
        prop_assert_eq!(&back, &m);
        prop_assert_eq!(used, frame_len);
        // Every prefix asks for more (or, for the first bytes, already rejects nothing).
        for cut in 0..frame_len {
            prop_assert_eq!(decode(&buf[..cut]), Ok(None));
        }
        let mut cursor = std::io::Cursor::new(&buf[..]);
        prop_assert_eq!(read_message(&mut cursor).unwrap(), Some(m));
    }

    #[test]
    fn any_flipped_byte_is_rejected(m in message(), pos in any::<prop::sample::Index>(), bit in 0u8..8) {
        let mut buf = Vec::new();
        encode(&m, &mut buf).unwrap();
        let i = pos.index(buf.len());
        buf[i] ^= 1 << bit;
        // A flip in the length may make the frame look incomplete; otherwise it is an error.
        match decode(&buf) {
            Ok(None) => prop_assert!((8..12).contains(&i), "flip at {} read as incomplete", i),
            Ok(Some((back, _))) => prop_assert!(false, "flip at {} decoded as {:?}", i, back),
            Err(_) => {}
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        let _ = decode(&bytes);
        let _ = read_message(&mut std::io::Cursor::new(&bytes[..]));
        let mut framed = b"OXCT\x01\x00".to_vec();
        framed.extend_from_slice(&bytes);
        let _ = decode(&framed);
    }
}

/// A frame with a valid header and checksum around `payload` of `kind`.
fn frame(kind: u16, payload: &[u8]) -> Vec<u8> {
    let mut out = b"OXCT".to_vec();
    out.extend_from_slice(&1u16.to_le_bytes());
    out.extend_from_slice(&kind.to_le_bytes());
    out.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    out.extend_from_slice(payload);
    let crc = crc32c(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// CRC-32C, bit by bit (a reference independent of the crate the codec uses).
fn crc32c(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0x82F6_3B78
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

#[test]
fn bad_headers_are_named() {
    assert_eq!(decode(b"GET / HTTP/1.1\r\n"), Err(DecodeError::BadMagic));
    assert_eq!(decode(b"OXC"), Ok(None));
    assert_eq!(decode(b"OXD"), Err(DecodeError::BadMagic));
    let mut v2 = frame(20, &[0; 8]);
    v2[4] = 2;
    assert_eq!(decode(&v2), Err(DecodeError::UnsupportedVersion(2)));
    assert_eq!(decode(&frame(99, &[])), Err(DecodeError::UnknownKind(99)));
    // A huge length is refused from the header alone, with nothing more received.
    let mut huge = frame(16, &[]);
    huge[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
    assert_eq!(
        decode(&huge[..FRAME_HEADER_BYTES]),
        Err(DecodeError::TooLarge(u32::MAX))
    );
    let e = read_message(&mut std::io::Cursor::new(&huge[..FRAME_HEADER_BYTES])).unwrap_err();
    assert!(
        matches!(e, ReadError::Decode(DecodeError::TooLarge(_))),
        "{e}"
    );
    let mut just_over = frame(16, &[]);
    just_over[8..12].copy_from_slice(&(PAYLOAD_BYTES_MAX as u32 + 1).to_le_bytes());
    assert!(matches!(decode(&just_over), Err(DecodeError::TooLarge(_))));
}

#[test]
fn a_message_too_large_for_a_frame_is_an_error_and_writes_nothing() {
    let mut out = b"before".to_vec();
    let big = Message::Exit {
        code: 1,
        error: "x".repeat(PAYLOAD_BYTES_MAX),
    };
    assert!(encode(&big, &mut out).is_err());
    assert_eq!(out, b"before");
    let fits = Message::Stdout(vec![7; PAYLOAD_BYTES_MAX - 4]);
    encode(&fits, &mut out).unwrap();
    assert_eq!(decode(&out[6..]).unwrap().unwrap().0, fits);
}

#[test]
fn lying_payloads_are_malformed() {
    // A request announcing more arguments than it holds, or more than the limit.
    let mut p = 3u32.to_le_bytes().to_vec();
    p.extend_from_slice(&1u32.to_le_bytes());
    p.push(b'x');
    assert!(matches!(
        decode(&frame(1, &p)),
        Err(DecodeError::Malformed(_))
    ));
    let p = (ARGS_MAX as u32 + 1).to_le_bytes();
    assert!(matches!(
        decode(&frame(1, &p)),
        Err(DecodeError::Malformed(_))
    ));
    // A string length past the payload; a non-UTF-8 string; trailing bytes; a bad flag.
    assert!(matches!(
        decode(&frame(16, &100u32.to_le_bytes())),
        Err(DecodeError::Malformed(_))
    ));
    let mut p = 0u32.to_le_bytes().to_vec();
    p.extend_from_slice(&2u32.to_le_bytes());
    p.extend_from_slice(&[0xff, 0xfe]);
    p.push(0);
    assert!(matches!(
        decode(&frame(1, &p)),
        Err(DecodeError::Malformed(_))
    ));
    assert!(matches!(
        decode(&frame(3, &[0])),
        Err(DecodeError::Malformed(_))
    ));
    let mut p = 0u32.to_le_bytes().to_vec();
    p.extend_from_slice(&0u32.to_le_bytes());
    p.push(7);
    assert!(matches!(
        decode(&frame(1, &p)),
        Err(DecodeError::Malformed(_))
    ));
    // A frame cut short on the stream.
    let whole = frame(17, &[1, 0, 0, 0, b'!']);
    let e = read_message(&mut std::io::Cursor::new(&whole[..whole.len() - 1])).unwrap_err();
    assert!(matches!(e, ReadError::Truncated), "{e}");
    assert_eq!(
        decode(&whole).unwrap().unwrap().0,
        Message::Stderr(b"!".to_vec())
    );
}
