//! Reply encoders, checked byte for byte and against a test-side parser written from the
//! protocol text.

use oxpool_nbd::proto::reply::*;
use oxpool_nbd::proto::{
    BlockStatusDescriptor, BlockStatusFlags, Cookie, EncodeError, Errno, MetaContextId,
};
use proptest::prelude::*;

fn be16(value: u16) -> Vec<u8> {
    value.to_be_bytes().to_vec()
}
fn be32(value: u32) -> Vec<u8> {
    value.to_be_bytes().to_vec()
}
fn be64(value: u64) -> Vec<u8> {
    value.to_be_bytes().to_vec()
}

/// Expected chunk header, built field by field.
fn chunk_header(flags: u16, chunk_type: u16, cookie: u64, length: u32) -> Vec<u8> {
    [
        be32(0x668e_33ef),
        be16(flags),
        be16(chunk_type),
        be64(cookie),
        be32(length),
    ]
    .concat()
}

#[test]
fn simple_reply_success_and_error() {
    let mut out = [0u8; SIMPLE_REPLY_BYTES];
    encode_simple_reply(Cookie(0x0102_0304_0506_0708), None, &mut out);
    assert_eq!(
        out.to_vec(),
        [be32(0x6744_6698), be32(0), be64(0x0102_0304_0506_0708)].concat()
    );
    encode_simple_reply(Cookie(9), Some(Errno::NoSpc), &mut out);
    assert_eq!(
        out.to_vec(),
        [be32(0x6744_6698), be32(28), be64(9)].concat()
    );
}

#[test]
fn errno_wire_values() {
    let table = [
        (Errno::Perm, 1),
        (Errno::Io, 5),
        (Errno::NoMem, 12),
        (Errno::Inval, 22),
        (Errno::NoSpc, 28),
        (Errno::Overflow, 75),
        (Errno::NotSup, 95),
        (Errno::Shutdown, 108),
    ];
    for (errno, value) in table {
        assert_eq!(errno.wire_value(), value);
        assert_eq!(Errno::from_wire(value), Some(errno));
    }
    assert_eq!(Errno::from_wire(0), None);
    assert_eq!(Errno::from_wire(38), None);
}

#[test]
fn offset_data_header() {
    let mut out = [0u8; OFFSET_DATA_HEADER_BYTES];
    encode_offset_data_header(Cookie(5), 1 << 32, 4096, Done::Last, &mut out).unwrap();
    assert_eq!(
        out.to_vec(),
        [chunk_header(1, 1, 5, 4104), be64(1 << 32)].concat()
    );
    encode_offset_data_header(Cookie(5), 0, 1, Done::More, &mut out).unwrap();
    assert_eq!(out.to_vec(), [chunk_header(0, 1, 5, 9), be64(0)].concat());
    assert_eq!(
        encode_offset_data_header(Cookie(5), 0, 0, Done::Last, &mut out),
        Err(EncodeError::ZeroLength)
    );
    assert_eq!(
        encode_offset_data_header(Cookie(5), 0, u32::MAX - 7, Done::Last, &mut out),
        Err(EncodeError::PayloadTooLarge)
    );
    encode_offset_data_header(Cookie(5), 0, MAX_OFFSET_DATA_BYTES, Done::Last, &mut out).unwrap();
    assert_eq!(out[16..20].to_vec(), be32(u32::MAX));
}

#[test]
fn offset_hole() {
    let mut out = [0u8; OFFSET_HOLE_CHUNK_BYTES];
    encode_offset_hole(Cookie(6), 8192, 65536, Done::More, &mut out).unwrap();
    assert_eq!(
        out.to_vec(),
        [chunk_header(0, 2, 6, 12), be64(8192), be32(65536)].concat()
    );
    assert_eq!(
        encode_offset_hole(Cookie(6), 0, 0, Done::Last, &mut out),
        Err(EncodeError::ZeroLength)
    );
}

#[test]
fn done_chunk() {
    let mut out = [0u8; NONE_CHUNK_BYTES];
    encode_done_chunk(Cookie(7), &mut out);
    assert_eq!(out.to_vec(), chunk_header(1, 0, 7, 0));
}

#[test]
fn block_status_chunk() {
    let descriptors = [
        BlockStatusDescriptor {
            length_bytes: 65536,
            flags: BlockStatusFlags::DATA,
        },
        BlockStatusDescriptor {
            length_bytes: 1 << 20,
            flags: BlockStatusFlags::HOLE_ZERO,
        },
    ];
    let mut out = [0xeeu8; 64];
    let written = encode_block_status(
        Cookie(8),
        MetaContextId(1),
        &descriptors,
        Done::Last,
        &mut out,
    )
    .unwrap();
    assert_eq!(written, block_status_chunk_bytes(2));
    assert_eq!(written, 20 + 4 + 16);
    assert_eq!(
        out[..written].to_vec(),
        [
            chunk_header(1, 5, 8, 20),
            be32(1),
            be32(65536),
            be32(0),
            be32(1 << 20),
            be32(3)
        ]
        .concat()
    );
    assert!(
        out[written..].iter().all(|&b| b == 0xee),
        "nothing written past the chunk"
    );

    let mut small = [0u8; 39];
    assert_eq!(
        encode_block_status(
            Cookie(8),
            MetaContextId(1),
            &descriptors,
            Done::Last,
            &mut small
        ),
        Err(EncodeError::BufferTooSmall {
            needed_bytes: 40,
            available_bytes: 39
        })
    );
    assert_eq!(
        encode_block_status(Cookie(8), MetaContextId(1), &[], Done::Last, &mut out),
        Err(EncodeError::NoDescriptors)
    );
    let zero = [BlockStatusDescriptor {
        length_bytes: 0,
        flags: BlockStatusFlags::HOLE,
    }];
    assert_eq!(
        encode_block_status(Cookie(8), MetaContextId(1), &zero, Done::Last, &mut out),
        Err(EncodeError::ZeroLength)
    );
}

#[test]
fn error_chunks() {
    let mut out = [0u8; 64];
    let written = encode_error_chunk(Cookie(3), Errno::Io, "disk", Done::Last, &mut out).unwrap();
    assert_eq!(written, error_chunk_bytes("disk"));
    assert_eq!(
        out[..written].to_vec(),
        [
            chunk_header(1, 0x8001, 3, 10),
            be32(5),
            be16(4),
            b"disk".to_vec()
        ]
        .concat()
    );
    let written =
        encode_error_offset_chunk(Cookie(3), Errno::Io, "x", 4096, Done::More, &mut out).unwrap();
    assert_eq!(written, error_offset_chunk_bytes("x"));
    assert_eq!(
        out[..written].to_vec(),
        [
            chunk_header(0, 0x8002, 3, 15),
            be32(5),
            be16(1),
            b"x".to_vec(),
            be64(4096)
        ]
        .concat()
    );
    let mut small = [0u8; 26];
    assert!(matches!(
        encode_error_chunk(Cookie(3), Errno::Io, "disk", Done::Last, &mut small),
        Err(EncodeError::BufferTooSmall { .. })
    ));
}

#[test]
fn long_error_messages_are_cut_at_a_character_boundary() {
    // 4095 ASCII bytes then a 3-byte character: 4098 bytes, cut before the character.
    let message = format!("{}€", "a".repeat(4095));
    assert_eq!(error_chunk_bytes(&message), 26 + 4095);
    let mut out = vec![0u8; 8192];
    let written = encode_error_chunk(Cookie(1), Errno::Io, &message, Done::Last, &mut out).unwrap();
    assert_eq!(written, 26 + 4095);
    assert_eq!(out[24..26].to_vec(), be16(4095));
    assert!(std::str::from_utf8(&out[26..written]).is_ok());
}

#[test]
fn error_reply_follows_the_negotiation() {
    let mut out = [0u8; ERROR_REPLY_MAX_BYTES];
    let written = encode_error_reply(Cookie(4), Errno::Inval, false, &mut out);
    assert_eq!(
        out[..written].to_vec(),
        [be32(0x6744_6698), be32(22), be64(4)].concat()
    );
    let written = encode_error_reply(Cookie(4), Errno::Inval, true, &mut out);
    assert_eq!(
        out[..written].to_vec(),
        [chunk_header(1, 0x8001, 4, 6), be32(22), be16(0)].concat()
    );
}

// ---------------------------------------------------------------------------------------
// Round trip against a test-side parser.

#[derive(Clone, Debug, PartialEq)]
enum Chunk {
    Data {
        offset: u64,
        length: u32,
    },
    Hole {
        offset: u64,
        length: u32,
    },
    Status {
        context: u32,
        extents: Vec<(u32, u32)>,
    },
    Error {
        errno: u32,
        message: String,
    },
    None,
}

/// Parses one chunk (its header and everything except OFFSET_DATA's data) from `bytes`;
/// returns (cookie, done, chunk, bytes used).
fn parse_chunk(bytes: &[u8]) -> (u64, bool, Chunk, usize) {
    let u16_at = |at: usize| u16::from_be_bytes(bytes[at..at + 2].try_into().unwrap());
    let u32_at = |at: usize| u32::from_be_bytes(bytes[at..at + 4].try_into().unwrap());
    let u64_at = |at: usize| u64::from_be_bytes(bytes[at..at + 8].try_into().unwrap());
    assert_eq!(u32_at(0), 0x668e_33ef);
    let flags = u16_at(4);
    let chunk_type = u16_at(6);
    let cookie = u64_at(8);
    let length = u32_at(16) as usize;
    let (chunk, used) = match chunk_type {
        0 => {
            assert_eq!(length, 0);
            (Chunk::None, 20)
        }
        1 => (
            Chunk::Data {
                offset: u64_at(20),
                length: (length - 8) as u32,
            },
            28,
        ),
        2 => {
            assert_eq!(length, 12);
            (
                Chunk::Hole {
                    offset: u64_at(20),
                    length: u32_at(28),
                },
                32,
            )
        }
        5 => {
            assert!(length >= 12 && (length - 4).is_multiple_of(8));
            let extents = (0..(length - 4) / 8)
                .map(|i| (u32_at(24 + 8 * i), u32_at(28 + 8 * i)))
                .collect();
            (
                Chunk::Status {
                    context: u32_at(20),
                    extents,
                },
                20 + length,
            )
        }
        0x8001 => {
            let message_len = u16_at(24) as usize;
            assert_eq!(length, 6 + message_len);
            let message = String::from_utf8(bytes[26..26 + message_len].to_vec()).unwrap();
            (
                Chunk::Error {
                    errno: u32_at(20),
                    message,
                },
                20 + length,
            )
        }
        other => panic!("unexpected chunk type {other}"),
    };
    (cookie, flags & 1 != 0, chunk, used)
}

fn arb_chunk() -> impl Strategy<Value = Chunk> {
    prop_oneof![
        (any::<u64>(), 1..=MAX_OFFSET_DATA_BYTES)
            .prop_map(|(offset, length)| Chunk::Data { offset, length }),
        (any::<u64>(), 1..=u32::MAX).prop_map(|(offset, length)| Chunk::Hole { offset, length }),
        (
            any::<u32>(),
            proptest::collection::vec((1..=u32::MAX, 0u32..4), 1..20)
        )
            .prop_map(|(context, extents)| Chunk::Status { context, extents }),
        (
            prop_oneof![Just(Errno::Io), Just(Errno::Inval), Just(Errno::NoSpc)],
            "[a-z€]{0,40}"
        )
            .prop_map(|(errno, message)| Chunk::Error {
                errno: errno.wire_value(),
                message
            }),
        // NONE is always final, so the test appends it rather than drawing it.
    ]
}

fn encode_chunk(cookie: Cookie, chunk: &Chunk, done: Done, out: &mut Vec<u8>) {
    let mut buffer = vec![0u8; 512];
    let written = match chunk {
        Chunk::Data { offset, length } => {
            let header = (&mut buffer[..OFFSET_DATA_HEADER_BYTES])
                .try_into()
                .unwrap();
            encode_offset_data_header(cookie, *offset, *length, done, header).unwrap();
            OFFSET_DATA_HEADER_BYTES
        }
        Chunk::Hole { offset, length } => {
            let chunk = (&mut buffer[..OFFSET_HOLE_CHUNK_BYTES]).try_into().unwrap();
            encode_offset_hole(cookie, *offset, *length, done, chunk).unwrap();
            OFFSET_HOLE_CHUNK_BYTES
        }
        Chunk::Status { context, extents } => {
            let descriptors: Vec<_> = extents
                .iter()
                .map(|&(length_bytes, flags)| BlockStatusDescriptor {
                    length_bytes,
                    flags: BlockStatusFlags(flags),
                })
                .collect();
            encode_block_status(
                cookie,
                MetaContextId(*context),
                &descriptors,
                done,
                &mut buffer,
            )
            .unwrap()
        }
        Chunk::Error { errno, message } => {
            let errno = Errno::from_wire(*errno).unwrap();
            encode_error_chunk(cookie, errno, message, done, &mut buffer).unwrap()
        }
        Chunk::None => {
            let chunk = (&mut buffer[..NONE_CHUNK_BYTES]).try_into().unwrap();
            encode_done_chunk(cookie, chunk);
            NONE_CHUNK_BYTES
        }
    };
    out.extend_from_slice(&buffer[..written]);
}

proptest! {
    /// A reply made of random chunks parses back to the same chunks; only the last is DONE.
    #[test]
    fn chunks_round_trip(
        cookie in any::<u64>(),
        mut chunks in proptest::collection::vec(arb_chunk(), 0..6),
    ) {
        chunks.push(Chunk::None);
        let mut stream = Vec::new();
        for (index, chunk) in chunks.iter().enumerate() {
            let done = if index + 1 == chunks.len() { Done::Last } else { Done::More };
            encode_chunk(Cookie(cookie), chunk, done, &mut stream);
        }
        let mut rest = &stream[..];
        for (index, expected) in chunks.iter().enumerate() {
            let (parsed_cookie, done, chunk, used) = parse_chunk(rest);
            prop_assert_eq!(parsed_cookie, cookie);
            prop_assert_eq!(done, index + 1 == chunks.len());
            prop_assert_eq!(&chunk, expected);
            rest = &rest[used..];
        }
        prop_assert!(rest.is_empty());
    }
}
