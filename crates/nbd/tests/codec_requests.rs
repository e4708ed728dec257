//! Request decoding (any split, payload hand-off, fatal errors) and validation (every
//! per-request error).

use oxpool_nbd::proto::wire::*;
use oxpool_nbd::proto::{
    validate, Command, CommandFlags, Cookie, EnteredBy, Errno, ExportCaps, ExportInfo, Negotiated,
    ProtocolError, Request, RequestDecoder, SelectedContext, TransmissionFlags, MAX_BLOCK_BYTES,
    REQUEST_HEADER_BYTES,
};
use proptest::prelude::*;

// ---------------------------------------------------------------------------------------
// Test-side client encoder, written from the protocol text.

fn encode(flags: u16, command: u16, cookie: u64, offset: u64, length: u32) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(28);
    bytes.extend_from_slice(&0x2560_9513u32.to_be_bytes());
    bytes.extend_from_slice(&flags.to_be_bytes());
    bytes.extend_from_slice(&command.to_be_bytes());
    bytes.extend_from_slice(&cookie.to_be_bytes());
    bytes.extend_from_slice(&offset.to_be_bytes());
    bytes.extend_from_slice(&length.to_be_bytes());
    bytes
}

/// One request as the client sends it, with its payload when it is a WRITE.
#[derive(Clone, Debug)]
struct Sent {
    flags: u16,
    command: u16,
    cookie: u64,
    offset: u64,
    length: u32,
    payload: Vec<u8>,
}

fn arb_sent() -> impl Strategy<Value = Sent> {
    let command = prop_oneof![0u16..=8, any::<u16>()];
    (
        command,
        any::<u16>(),
        any::<u64>(),
        any::<u64>(),
        any::<u32>(),
        0u32..300,
        any::<u8>(),
    )
        .prop_map(
            |(command, flags, cookie, offset, length, write_length, fill)| {
                // Writes get a small real payload; other commands keep any length.
                let (length, payload) = if command == CMD_WRITE {
                    (write_length, vec![fill; write_length as usize])
                } else {
                    (length, Vec::new())
                };
                Sent {
                    flags,
                    command,
                    cookie,
                    offset,
                    length,
                    payload,
                }
            },
        )
}

/// What the server loop would do: decode headers; for a WRITE take the payload bytes already
/// in the piece, and receive the rest "directly" (here: straight from the stream, never
/// through the decoder). Returns each request with its payload.
fn server_loop(stream: &[u8], sizes: &[usize]) -> Result<Vec<(Request, Vec<u8>)>, ProtocolError> {
    let mut decoder = RequestDecoder::new();
    let mut received = Vec::new();
    let mut position = 0;
    let mut sizes = sizes.iter().cycle();
    let mut current: Option<(Request, Vec<u8>)> = None;
    while position < stream.len() {
        let size = (*sizes.next().unwrap()).clamp(1, stream.len() - position);
        let piece = &stream[position..position + size];
        let mut used = 0;
        while used < piece.len() {
            if decoder.payload_remaining_bytes() > 0 {
                let (_, payload) = current.as_mut().expect("a write is in progress");
                // Alternate between the two hand-off paths.
                if payload.len() % 2 == 0 {
                    let taken = decoder.take_payload(&piece[used..]);
                    payload.extend_from_slice(taken);
                    used += taken.len();
                } else {
                    let direct = (decoder.payload_remaining_bytes() as usize)
                        .min(piece.len() - used)
                        .min(3);
                    payload.extend_from_slice(&piece[used..used + direct]);
                    decoder.payload_received(direct as u32);
                    used += direct;
                }
            } else {
                let (consumed, request) = decoder.decode(&piece[used..])?;
                assert!(consumed > 0);
                used += consumed;
                if let Some(request) = request {
                    if let Some(done) = current.take() {
                        received.push(done);
                    }
                    current = Some((request, Vec::new()));
                }
            }
            if decoder.payload_remaining_bytes() == 0 {
                if let Some(done) = current.take() {
                    received.push(done);
                }
            }
        }
        position += size;
    }
    if let Some(done) = current.take() {
        received.push(done);
    }
    Ok(received)
}

fn header_of(sent: &Sent) -> Request {
    Request {
        cookie: Cookie(sent.cookie),
        command: Command::from_wire(sent.command),
        flags: CommandFlags(sent.flags),
        offset_bytes: sent.offset,
        length_bytes: sent.length,
    }
}

// ---------------------------------------------------------------------------------------
// Decoding.

#[test]
fn decodes_a_read_in_one_piece() {
    let bytes = encode(CMD_FLAG_FUA, CMD_READ, 0x1122_3344_5566_7788, 4096, 512);
    let mut decoder = RequestDecoder::new();
    let (consumed, request) = decoder.decode(&bytes).unwrap();
    assert_eq!(consumed, REQUEST_HEADER_BYTES);
    assert_eq!(
        request,
        Some(Request {
            cookie: Cookie(0x1122_3344_5566_7788),
            command: Command::Read,
            flags: CommandFlags::FUA,
            offset_bytes: 4096,
            length_bytes: 512,
        })
    );
    assert_eq!(decoder.payload_remaining_bytes(), 0);
}

#[test]
fn decodes_one_byte_at_a_time() {
    let bytes = encode(0, CMD_TRIM, 7, 1 << 40, 1 << 20);
    let mut decoder = RequestDecoder::new();
    for (index, byte) in bytes.iter().enumerate() {
        let (consumed, request) = decoder.decode(std::slice::from_ref(byte)).unwrap();
        assert_eq!(consumed, 1);
        assert_eq!(request.is_some(), index == bytes.len() - 1);
    }
}

#[test]
fn decodes_at_most_one_header_per_call() {
    let mut bytes = encode(0, CMD_FLUSH, 1, 0, 0);
    bytes.extend(encode(0, CMD_FLUSH, 2, 0, 0));
    let mut decoder = RequestDecoder::new();
    let (consumed, first) = decoder.decode(&bytes).unwrap();
    assert_eq!(consumed, 28);
    assert_eq!(first.unwrap().cookie, Cookie(1));
    let (consumed, second) = decoder.decode(&bytes[28..]).unwrap();
    assert_eq!(consumed, 28);
    assert_eq!(second.unwrap().cookie, Cookie(2));
    assert_eq!(decoder.decode(&[]).unwrap(), (0, None));
}

#[test]
fn write_payload_is_left_to_the_caller() {
    let mut bytes = encode(0, CMD_WRITE, 9, 0, 10);
    bytes.extend_from_slice(b"0123456789");
    bytes.extend(encode(0, CMD_READ, 10, 0, 1));
    let mut decoder = RequestDecoder::new();
    let (consumed, request) = decoder.decode(&bytes).unwrap();
    assert_eq!(consumed, 28);
    let request = request.unwrap();
    assert_eq!(request.payload_bytes(), 10);
    assert_eq!(decoder.payload_remaining_bytes(), 10);
    // Four bytes arrived with the header; the caller copies them.
    assert_eq!(decoder.take_payload(&bytes[28..32]), b"0123");
    // The other six are received straight into the caller's buffer.
    decoder.payload_received(6);
    assert_eq!(decoder.payload_remaining_bytes(), 0);
    assert_eq!(decoder.take_payload(&bytes[38..]), b"", "nothing pending");
    let (_, next) = decoder.decode(&bytes[38..]).unwrap();
    assert_eq!(next.unwrap().cookie, Cookie(10));
}

#[test]
fn take_payload_stops_at_the_payload_end() {
    let mut bytes = encode(0, CMD_WRITE, 1, 0, 3);
    bytes.extend_from_slice(b"abc");
    bytes.extend(encode(0, CMD_FLUSH, 2, 0, 0));
    let mut decoder = RequestDecoder::new();
    let (consumed, _) = decoder.decode(&bytes).unwrap();
    assert_eq!(decoder.take_payload(&bytes[consumed..]), b"abc");
    let (_, next) = decoder.decode(&bytes[consumed + 3..]).unwrap();
    assert_eq!(next.unwrap().command, Command::Flush);
}

#[test]
#[should_panic(expected = "payload pending")]
fn decode_with_payload_pending_is_a_caller_bug() {
    let mut decoder = RequestDecoder::new();
    decoder.decode(&encode(0, CMD_WRITE, 1, 0, 3)).unwrap();
    let _ = decoder.decode(&encode(0, CMD_READ, 2, 0, 3));
}

#[test]
#[should_panic(expected = "pending")]
fn receiving_more_payload_than_pending_is_a_caller_bug() {
    let mut decoder = RequestDecoder::new();
    decoder.decode(&encode(0, CMD_WRITE, 1, 0, 3)).unwrap();
    decoder.payload_received(4);
}

#[test]
fn bad_magic_ends_the_connection() {
    let mut bytes = encode(0, CMD_READ, 1, 0, 512);
    bytes[3] ^= 0xff;
    // Split too: the magic is checked once the header is complete.
    for split in [28, 1, 5] {
        let mut decoder = RequestDecoder::new();
        let mut result = Ok((0, None));
        for piece in bytes.chunks(split) {
            result = decoder.decode(piece);
            if result.is_err() {
                break;
            }
        }
        assert_eq!(
            result,
            Err(ProtocolError::BadRequestMagic { found: 0x2560_95ec })
        );
        assert_eq!(
            decoder.decode(&encode(0, CMD_READ, 1, 0, 512)),
            Err(ProtocolError::Finished)
        );
    }
}

#[test]
fn write_over_the_maximum_ends_the_connection() {
    let mut decoder = RequestDecoder::new();
    let error = decoder
        .decode(&encode(0, CMD_WRITE, 77, 0, MAX_BLOCK_BYTES + 1))
        .unwrap_err();
    assert_eq!(
        error,
        ProtocolError::WriteTooLarge {
            cookie: Cookie(77),
            length_bytes: MAX_BLOCK_BYTES + 1
        }
    );
    assert_eq!(error.reply_errno(), Some((Cookie(77), Errno::Inval)));
    assert_eq!(decoder.decode(&[0]), Err(ProtocolError::Finished));
}

#[test]
fn write_at_the_maximum_is_trusted() {
    let mut decoder = RequestDecoder::new();
    let (_, request) = decoder
        .decode(&encode(0, CMD_WRITE, 1, 0, MAX_BLOCK_BYTES))
        .unwrap();
    assert_eq!(request.unwrap().payload_bytes(), MAX_BLOCK_BYTES);
    assert_eq!(decoder.payload_remaining_bytes(), MAX_BLOCK_BYTES);
}

#[test]
fn decoder_with_a_smaller_payload_limit() {
    let mut decoder = RequestDecoder::with_max_payload(4096);
    assert!(decoder.decode(&encode(0, CMD_WRITE, 1, 0, 4096)).is_ok());
    decoder.payload_received(4096);
    assert!(matches!(
        decoder.decode(&encode(0, CMD_WRITE, 2, 0, 4097)),
        Err(ProtocolError::WriteTooLarge { .. })
    ));
}

#[test]
fn huge_lengths_without_payload_are_not_fatal() {
    // READ, TRIM and unknown commands carry no payload: a huge length is a per-request error.
    let mut bytes = encode(0, CMD_READ, 1, 0, u32::MAX);
    bytes.extend(encode(0, 200, 2, 0, u32::MAX));
    bytes.extend(encode(0, CMD_TRIM, 3, 0, u32::MAX));
    let requests = server_loop(&bytes, &[bytes.len()]).unwrap();
    assert_eq!(requests.len(), 3);
    assert_eq!(requests[1].0.command, Command::Unknown(200));
    assert!(requests.iter().all(|(_, payload)| payload.is_empty()));
}

#[test]
fn encode_matches_the_test_client() {
    let request = Request {
        cookie: Cookie(5),
        command: Command::WriteZeroes,
        flags: CommandFlags::NO_HOLE.union(CommandFlags::FUA),
        offset_bytes: 1 << 33,
        length_bytes: 65536,
    };
    let mut bytes = [0u8; REQUEST_HEADER_BYTES];
    request.encode(&mut bytes);
    assert_eq!(
        bytes.to_vec(),
        encode(3, CMD_WRITE_ZEROES, 5, 1 << 33, 65536)
    );
}

proptest! {
    /// A stream of requests (writes with payloads) decodes to the same requests and payloads
    /// in any split, including one byte at a time.
    #[test]
    fn round_trip_in_any_split(
        sent in proptest::collection::vec(arb_sent(), 1..12),
        sizes in proptest::collection::vec(1usize..80, 1..10),
        byte_at_a_time in any::<bool>(),
    ) {
        let mut stream = Vec::new();
        for request in &sent {
            stream.extend(encode(
                request.flags,
                request.command,
                request.cookie,
                request.offset,
                request.length,
            ));
            stream.extend_from_slice(&request.payload);
        }
        let sizes = if byte_at_a_time { vec![1] } else { sizes };
        let received = server_loop(&stream, &sizes).unwrap();
        prop_assert_eq!(received.len(), sent.len());
        for (sent, (request, payload)) in sent.iter().zip(&received) {
            prop_assert_eq!(*request, header_of(sent));
            prop_assert_eq!(payload, &sent.payload);
        }
    }

    /// Random bytes never panic the decoder (a fatal error is fine).
    #[test]
    fn random_bytes_never_panic(
        bytes in proptest::collection::vec(any::<u8>(), 0..600),
        with_magic in any::<bool>(),
        sizes in proptest::collection::vec(1usize..64, 1..8),
    ) {
        let mut stream = Vec::new();
        if with_magic {
            // Make the first header valid-looking so decoding goes past the magic check.
            stream.extend_from_slice(&REQUEST_MAGIC.to_be_bytes());
        }
        stream.extend_from_slice(&bytes);
        let _ = server_loop(&stream, &sizes);
    }

    /// Validation never panics, and never accepts a range outside the export.
    #[test]
    fn validate_never_accepts_out_of_range(
        command in prop_oneof![0u16..=8, any::<u16>()],
        flags in any::<u16>(),
        offset in prop_oneof![0u64..(2 << 20), any::<u64>()],
        length in prop_oneof![0u32..(2 << 20), any::<u32>()],
        structured in any::<bool>(),
        read_only in any::<bool>(),
    ) {
        let export = ExportInfo { read_only, ..export(1 << 20) };
        let negotiated = negotiated(&export, structured, structured);
        let request = Request {
            cookie: Cookie(1),
            command: Command::from_wire(command),
            flags: CommandFlags(flags),
            offset_bytes: offset,
            length_bytes: length,
        };
        if validate(&request, &export, &negotiated).is_ok() {
            match request.command {
                Command::Disconnect => {}
                Command::Flush => prop_assert!(offset == 0 && length == 0),
                Command::Unknown(_) => prop_assert!(false, "unknown accepted"),
                other => {
                    prop_assert!(length > 0);
                    prop_assert!(u128::from(offset) + u128::from(length) <= 1 << 20);
                    prop_assert!(!(other.is_mutating() && read_only));
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// Validation.

const MIB: u64 = 1 << 20;

fn export(size_bytes: u64) -> ExportInfo {
    ExportInfo {
        name: "vol".into(),
        description: String::new(),
        size_bytes,
        preferred_block_bytes: 4096,
        read_only: false,
        caps: ExportCaps::default(),
    }
}

fn negotiated(export: &ExportInfo, structured: bool, meta: bool) -> Negotiated {
    Negotiated {
        export_index: 0,
        structured_replies: structured,
        meta_contexts: if meta {
            vec![SelectedContext::base_allocation()]
        } else {
            Vec::new()
        },
        transmission_flags: TransmissionFlags::for_export(export, structured),
        entered_by: EnteredBy::Go,
    }
}

fn request(command: Command, flags: CommandFlags, offset_bytes: u64, length_bytes: u32) -> Request {
    Request {
        cookie: Cookie(1),
        command,
        flags,
        offset_bytes,
        length_bytes,
    }
}

/// Size of the export `check` validates against: larger than any 32-bit length.
const EXPORT_BYTES: u64 = 1 << 33;

/// Validates against a writable export with structured replies and base:allocation.
fn check(command: Command, flags: CommandFlags, offset: u64, length: u32) -> Result<(), Errno> {
    let export = export(EXPORT_BYTES);
    validate(
        &request(command, flags, offset, length),
        &export,
        &negotiated(&export, true, true),
    )
}

const NONE: CommandFlags = CommandFlags::NONE;

#[test]
fn valid_requests_pass() {
    assert_eq!(check(Command::Read, NONE, 0, 4096), Ok(()));
    assert_eq!(
        check(Command::Read, CommandFlags::FUA, EXPORT_BYTES - 1, 1),
        Ok(())
    );
    assert_eq!(
        check(Command::Read, CommandFlags::DF, 0, MAX_BLOCK_BYTES),
        Ok(())
    );
    assert_eq!(check(Command::Write, CommandFlags::FUA, 512, 512), Ok(()));
    assert_eq!(check(Command::Flush, NONE, 0, 0), Ok(()));
    assert_eq!(check(Command::Trim, CommandFlags::FUA, 0, u32::MAX), Ok(()));
    assert_eq!(check(Command::Cache, NONE, 0, 4096), Ok(()));
    let zero_flags = CommandFlags::NO_HOLE
        .union(CommandFlags::FAST_ZERO)
        .union(CommandFlags::FUA);
    assert_eq!(check(Command::WriteZeroes, zero_flags, 0, u32::MAX), Ok(()));
    assert_eq!(
        check(Command::BlockStatus, CommandFlags::REQ_ONE, 0, u32::MAX),
        Ok(())
    );
    assert_eq!(
        check(Command::Disconnect, CommandFlags(0xffff), 5, 5),
        Ok(())
    );
}

#[test]
fn range_past_the_end() {
    let end = EXPORT_BYTES;
    assert_eq!(check(Command::Read, NONE, end, 1), Err(Errno::Inval));
    assert_eq!(check(Command::Read, NONE, end - 1, 2), Err(Errno::Inval));
    assert_eq!(
        check(Command::Read, NONE, u64::MAX, 1),
        Err(Errno::Inval),
        "overflow"
    );
    assert_eq!(
        check(Command::Write, NONE, end - 511, 512),
        Err(Errno::NoSpc)
    );
    assert_eq!(
        check(Command::Write, NONE, u64::MAX - 10, 512),
        Err(Errno::NoSpc)
    );
    assert_eq!(
        check(Command::WriteZeroes, NONE, end, 512),
        Err(Errno::NoSpc)
    );
    assert_eq!(check(Command::Trim, NONE, end, 512), Err(Errno::Inval));
    assert_eq!(check(Command::Cache, NONE, end, 512), Err(Errno::Inval));
    assert_eq!(
        check(Command::BlockStatus, NONE, end, 512),
        Err(Errno::Inval)
    );
}

#[test]
fn length_over_the_maximum_block_size() {
    let over = MAX_BLOCK_BYTES + 1;
    // The commands with a payload are bounded by it.
    assert_eq!(check(Command::Read, NONE, 0, over), Err(Errno::Inval));
    assert_eq!(check(Command::Write, NONE, 0, over), Err(Errno::Inval));
    assert_eq!(check(Command::Read, NONE, 0, MAX_BLOCK_BYTES), Ok(()));
    // The others are not: nbdcopy zeroes a hole of 56 MiB in one WRITE_ZEROES without
    // FAST_ZERO, and qemu-nbd and nbdkit accept it.
    for flags in [NONE, CommandFlags::FAST_ZERO, CommandFlags::NO_HOLE] {
        assert_eq!(
            check(Command::WriteZeroes, flags, 0, over),
            Ok(()),
            "{flags:?}"
        );
        assert_eq!(
            check(Command::WriteZeroes, flags, 0, 56 << 20),
            Ok(()),
            "{flags:?}"
        );
    }
    assert_eq!(check(Command::Cache, NONE, 0, over), Ok(()));
    assert_eq!(check(Command::Trim, NONE, 0, over), Ok(()));
    assert_eq!(check(Command::BlockStatus, NONE, 0, over), Ok(()));
    // The longest a header can say, still within the export.
    for command in [
        Command::Trim,
        Command::WriteZeroes,
        Command::Cache,
        Command::BlockStatus,
    ] {
        assert_eq!(check(command, NONE, 0, u32::MAX), Ok(()), "{command:?}");
    }
}

#[test]
fn zero_length_is_invalid() {
    for command in [
        Command::Read,
        Command::Write,
        Command::Trim,
        Command::Cache,
        Command::WriteZeroes,
        Command::BlockStatus,
    ] {
        assert_eq!(check(command, NONE, 0, 0), Err(Errno::Inval), "{command:?}");
    }
}

#[test]
fn flush_fields_are_reserved() {
    assert_eq!(check(Command::Flush, NONE, 1, 0), Err(Errno::Inval));
    assert_eq!(check(Command::Flush, NONE, 0, 1), Err(Errno::Inval));
    assert_eq!(check(Command::Flush, CommandFlags::FUA, 0, 0), Ok(()));
}

#[test]
fn unknown_commands_and_flags_are_invalid() {
    assert_eq!(
        check(Command::Unknown(8), NONE, 0, 512),
        Err(Errno::Inval),
        "RESIZE"
    );
    assert_eq!(
        check(Command::Unknown(0xffff), NONE, 0, 512),
        Err(Errno::Inval)
    );
    assert_eq!(
        check(Command::Read, CommandFlags(1 << 5), 0, 512),
        Err(Errno::Inval)
    );
    assert_eq!(
        check(Command::Read, CommandFlags(1 << 15), 0, 512),
        Err(Errno::Inval)
    );
    // Flags defined, but not for this command.
    assert_eq!(
        check(Command::Write, CommandFlags::NO_HOLE, 0, 512),
        Err(Errno::Inval)
    );
    assert_eq!(
        check(Command::Write, CommandFlags::DF, 0, 512),
        Err(Errno::Inval)
    );
    assert_eq!(
        check(Command::Read, CommandFlags::REQ_ONE, 0, 512),
        Err(Errno::Inval)
    );
    assert_eq!(
        check(Command::Read, CommandFlags::FAST_ZERO, 0, 512),
        Err(Errno::Inval)
    );
    assert_eq!(
        check(Command::Trim, CommandFlags::NO_HOLE, 0, 512),
        Err(Errno::Inval)
    );
    assert_eq!(
        check(Command::BlockStatus, CommandFlags::DF, 0, 512),
        Err(Errno::Inval)
    );
    assert_eq!(
        check(Command::Flush, CommandFlags::REQ_ONE, 0, 0),
        Err(Errno::Inval)
    );
}

#[test]
fn read_only_export_refuses_writes_with_eperm() {
    let export = ExportInfo {
        read_only: true,
        ..export(MIB)
    };
    let negotiated = negotiated(&export, true, true);
    for command in [Command::Write, Command::Trim, Command::WriteZeroes] {
        let result = validate(&request(command, NONE, 0, 512), &export, &negotiated);
        assert_eq!(result, Err(Errno::Perm), "{command:?}");
        // EPERM wins over flags that a read-only export does not advertise.
        let fast = request(command, CommandFlags::FAST_ZERO, 0, 512);
        assert_eq!(
            validate(&fast, &export, &negotiated),
            Err(Errno::Perm),
            "{command:?}"
        );
    }
    for command in [Command::Read, Command::Cache, Command::BlockStatus] {
        assert_eq!(
            validate(&request(command, NONE, 0, 512), &export, &negotiated),
            Ok(())
        );
    }
    assert_eq!(
        validate(&request(Command::Flush, NONE, 0, 0), &export, &negotiated),
        Ok(())
    );
}

#[test]
fn features_not_advertised_are_invalid() {
    let export = ExportInfo {
        caps: ExportCaps {
            flush: false,
            fua: false,
            trim: false,
            write_zeroes: true,
            fast_zero: false,
            cache: false,
            df: false,
            multi_conn: false,
            rotational: false,
        },
        ..export(MIB)
    };
    let negotiated = negotiated(&export, true, true);
    let check = |command, flags, offset, length| {
        validate(
            &request(command, flags, offset, length),
            &export,
            &negotiated,
        )
    };
    assert_eq!(check(Command::Flush, NONE, 0, 0), Err(Errno::Inval));
    assert_eq!(check(Command::Trim, NONE, 0, 512), Err(Errno::Inval));
    assert_eq!(check(Command::Cache, NONE, 0, 512), Err(Errno::Inval));
    assert_eq!(
        check(Command::Write, CommandFlags::FUA, 0, 512),
        Err(Errno::Inval)
    );
    assert_eq!(
        check(Command::Read, CommandFlags::DF, 0, 512),
        Err(Errno::Inval)
    );
    assert_eq!(
        check(Command::WriteZeroes, CommandFlags::FAST_ZERO, 0, 512),
        Err(Errno::Inval)
    );
    assert_eq!(
        check(Command::WriteZeroes, CommandFlags::NO_HOLE, 0, 512),
        Ok(())
    );
    let no_zeroes = ExportInfo {
        caps: ExportCaps {
            write_zeroes: false,
            ..ExportCaps::default()
        },
        ..export.clone()
    };
    let negotiated = self::negotiated(&no_zeroes, true, true);
    assert!(!negotiated.transmission_flags.has(TFLAG_SEND_FAST_ZERO));
    let write_zeroes = request(Command::WriteZeroes, NONE, 0, 512);
    assert_eq!(
        validate(&write_zeroes, &no_zeroes, &negotiated),
        Err(Errno::Inval)
    );
}

#[test]
fn df_needs_structured_replies() {
    let export = export(MIB);
    let simple = negotiated(&export, false, false);
    assert!(!simple.transmission_flags.has(TFLAG_SEND_DF));
    let read_df = request(Command::Read, CommandFlags::DF, 0, 512);
    assert_eq!(validate(&read_df, &export, &simple), Err(Errno::Inval));
    assert_eq!(
        validate(&read_df, &export, &negotiated(&export, true, false)),
        Ok(())
    );
}

#[test]
fn block_status_needs_structured_replies_and_a_meta_context() {
    let export = export(MIB);
    let status = request(Command::BlockStatus, NONE, 0, 512);
    assert_eq!(
        validate(&status, &export, &negotiated(&export, false, false)),
        Err(Errno::Inval)
    );
    assert_eq!(
        validate(&status, &export, &negotiated(&export, true, false)),
        Err(Errno::Inval)
    );
    assert_eq!(
        validate(&status, &export, &negotiated(&export, true, true)),
        Ok(())
    );
}

#[test]
fn transmission_flags_for_exports() {
    let writable = export(MIB);
    assert_eq!(
        TransmissionFlags::for_export(&writable, false).bits(),
        TFLAG_HAS_FLAGS
            | TFLAG_SEND_FLUSH
            | TFLAG_SEND_FUA
            | TFLAG_SEND_TRIM
            | TFLAG_SEND_WRITE_ZEROES
            | TFLAG_SEND_FAST_ZERO
            | TFLAG_SEND_CACHE
    );
    let everything = ExportInfo {
        caps: ExportCaps {
            multi_conn: true,
            rotational: true,
            ..ExportCaps::default()
        },
        ..export(MIB)
    };
    let flags = TransmissionFlags::for_export(&everything, true);
    assert!(flags.has(TFLAG_CAN_MULTI_CONN | TFLAG_ROTATIONAL | TFLAG_SEND_DF));
    assert!(!flags.has(TFLAG_READ_ONLY));
    assert!(!flags.has(TFLAG_SEND_RESIZE));
}
