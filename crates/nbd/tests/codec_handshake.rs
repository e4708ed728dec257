//! Handshake state machine: every negotiation path, every error, and input in any split.
//!
//! The client side (option encoders, reply parser) is written here from the protocol text,
//! independently of the server code, so that a symmetric mistake does not hide itself.

use oxpool_nbd::proto::wire::*;
use oxpool_nbd::proto::{
    EnteredBy, ExportCaps, ExportInfo, Handshake, HandshakeProgress, HandshakeStatus,
    MetaContextId, Negotiated, ProtocolError, MAX_OPTIONS_PER_HANDSHAKE, MAX_OPTION_DATA_BYTES,
    REPLIES_PAUSE_BYTES,
};
use proptest::prelude::*;

// ---------------------------------------------------------------------------------------
// Test-side client.

fn exports() -> Vec<ExportInfo> {
    vec![
        ExportInfo {
            name: "vol0".into(),
            description: "first volume".into(),
            size_bytes: 1 << 30,
            preferred_block_bytes: 16384,
            read_only: false,
            caps: ExportCaps::default(),
        },
        ExportInfo {
            name: "ro".into(),
            description: String::new(),
            size_bytes: 40960,
            preferred_block_bytes: 4096,
            read_only: true,
            caps: ExportCaps::default(),
        },
    ]
}

fn client_flags(flags: u32) -> Vec<u8> {
    flags.to_be_bytes().to_vec()
}

fn option(option: u32, data: &[u8]) -> Vec<u8> {
    let mut bytes = IHAVEOPT.to_be_bytes().to_vec();
    bytes.extend_from_slice(&option.to_be_bytes());
    bytes.extend_from_slice(&(data.len() as u32).to_be_bytes());
    bytes.extend_from_slice(data);
    bytes
}

fn info_data(name: &str, items: &[u16]) -> Vec<u8> {
    let mut bytes = (name.len() as u32).to_be_bytes().to_vec();
    bytes.extend_from_slice(name.as_bytes());
    bytes.extend_from_slice(&(items.len() as u16).to_be_bytes());
    for item in items {
        bytes.extend_from_slice(&item.to_be_bytes());
    }
    bytes
}

fn meta_data(name: &str, queries: &[&str]) -> Vec<u8> {
    let mut bytes = (name.len() as u32).to_be_bytes().to_vec();
    bytes.extend_from_slice(name.as_bytes());
    bytes.extend_from_slice(&(queries.len() as u32).to_be_bytes());
    for query in queries {
        bytes.extend_from_slice(&(query.len() as u32).to_be_bytes());
        bytes.extend_from_slice(query.as_bytes());
    }
    bytes
}

const FIXED_NO_ZEROES: u32 = CLIENT_FLAG_FIXED_NEWSTYLE | CLIENT_FLAG_NO_ZEROES;

#[derive(Debug, PartialEq, Eq)]
struct OptionReply {
    option: u32,
    reply_type: u32,
    data: Vec<u8>,
}

/// Splits server output into option replies; panics on anything malformed.
fn parse_replies(mut bytes: &[u8]) -> Vec<OptionReply> {
    let mut replies = Vec::new();
    while !bytes.is_empty() {
        assert!(bytes.len() >= 20, "truncated reply header");
        assert_eq!(
            u64::from_be_bytes(bytes[0..8].try_into().unwrap()),
            OPTION_REPLY_MAGIC
        );
        let option = u32::from_be_bytes(bytes[8..12].try_into().unwrap());
        let reply_type = u32::from_be_bytes(bytes[12..16].try_into().unwrap());
        let length = u32::from_be_bytes(bytes[16..20].try_into().unwrap()) as usize;
        assert!(bytes.len() >= 20 + length, "truncated reply data");
        replies.push(OptionReply {
            option,
            reply_type,
            data: bytes[20..20 + length].to_vec(),
        });
        bytes = &bytes[20 + length..];
    }
    replies
}

fn reply(option: u32, reply_type: u32, data: &[u8]) -> OptionReply {
    OptionReply {
        option,
        reply_type,
        data: data.to_vec(),
    }
}

fn info_export(size_bytes: u64, flags: u16) -> Vec<u8> {
    let mut data = INFO_EXPORT.to_be_bytes().to_vec();
    data.extend_from_slice(&size_bytes.to_be_bytes());
    data.extend_from_slice(&flags.to_be_bytes());
    data
}

fn info_block_size(min: u32, preferred: u32, max: u32) -> Vec<u8> {
    let mut data = INFO_BLOCK_SIZE.to_be_bytes().to_vec();
    for value in [min, preferred, max] {
        data.extend_from_slice(&value.to_be_bytes());
    }
    data
}

fn info_string(kind: u16, text: &str) -> Vec<u8> {
    let mut data = kind.to_be_bytes().to_vec();
    data.extend_from_slice(text.as_bytes());
    data
}

fn meta_context_reply(option: u32, id: u32) -> OptionReply {
    let mut data = id.to_be_bytes().to_vec();
    data.extend_from_slice(b"base:allocation");
    reply(option, REP_META_CONTEXT, &data)
}

/// Flags of "vol0": writable, default caps.
fn vol0_flags(structured: bool) -> u16 {
    let mut flags = TFLAG_HAS_FLAGS
        | TFLAG_SEND_FLUSH
        | TFLAG_SEND_FUA
        | TFLAG_SEND_TRIM
        | TFLAG_SEND_WRITE_ZEROES
        | TFLAG_SEND_FAST_ZERO
        | TFLAG_SEND_CACHE;
    if structured {
        flags |= TFLAG_SEND_DF;
    }
    flags
}

/// Flags of "ro": read-only, so no TRIM, WRITE_ZEROES or FAST_ZERO.
fn ro_flags() -> u16 {
    TFLAG_HAS_FLAGS | TFLAG_READ_ONLY | TFLAG_SEND_FLUSH | TFLAG_SEND_FUA | TFLAG_SEND_CACHE
}

/// Feeds all of `input` at once (the client flags must be part of it).
fn run(
    handshake: &mut Handshake,
    input: &[u8],
) -> (Vec<u8>, Result<HandshakeProgress, ProtocolError>) {
    let mut out = Vec::new();
    let result = handshake.receive(input, &mut out);
    (out, result)
}

/// Feeds all of `input` as a server loop does: what a call leaves (it pauses once its replies
/// pass [`REPLIES_PAUSE_BYTES`]) is given again. Returns the replies of each call and the
/// final result.
fn run_paused(
    handshake: &mut Handshake,
    input: &[u8],
) -> (Vec<Vec<u8>>, Result<HandshakeProgress, ProtocolError>) {
    let mut outs = Vec::new();
    let mut position = 0;
    // Bounded: every call that pauses has consumed an option.
    loop {
        let mut out = Vec::new();
        let result = handshake.receive(&input[position..], &mut out);
        outs.push(out);
        match result {
            Ok(p)
                if p.status == HandshakeStatus::Continue
                    && position + p.consumed_bytes < input.len() =>
            {
                assert!(p.consumed_bytes > 0, "a pause consumed nothing");
                position += p.consumed_bytes;
            }
            result => return (outs, result),
        }
    }
}

/// Feeds `input` in pieces of the given sizes (cycled), as a server loop would; stops at the
/// first non-Continue status or error. Returns output, total consumed, and the final result.
fn run_split(
    handshake: &mut Handshake,
    input: &[u8],
    sizes: &[usize],
) -> (Vec<u8>, usize, Result<HandshakeStatus, ProtocolError>) {
    let mut out = Vec::new();
    let mut position = 0;
    let mut sizes = sizes.iter().cycle();
    while position < input.len() {
        let size = (*sizes.next().unwrap()).clamp(1, input.len() - position);
        let piece = &input[position..position + size];
        match handshake.receive(piece, &mut out) {
            Err(error) => return (out, position, Err(error)),
            Ok(progress) => {
                assert!(progress.consumed_bytes <= piece.len());
                position += progress.consumed_bytes;
                if progress.status != HandshakeStatus::Continue {
                    return (out, position, Ok(progress.status));
                }
                assert_eq!(
                    progress.consumed_bytes,
                    piece.len(),
                    "Continue must consume all"
                );
            }
        }
    }
    (out, position, Ok(HandshakeStatus::Continue))
}

fn done(result: Result<HandshakeProgress, ProtocolError>) -> Negotiated {
    match result.expect("handshake ok").status {
        HandshakeStatus::Done(negotiated) => negotiated,
        other => panic!("expected Done, got {other:?}"),
    }
}

fn go(name: &str, items: &[u16]) -> Vec<u8> {
    option(OPT_GO, &info_data(name, items))
}

fn start() -> (Handshake, Vec<u8>) {
    (Handshake::new(exports()), client_flags(FIXED_NO_ZEROES))
}

/// A handshake offering "vol0" alone: the one an empty export name selects.
fn start_one() -> (Handshake, Vec<u8>) {
    let mut exports = exports();
    exports.truncate(1);
    (Handshake::new(exports), client_flags(FIXED_NO_ZEROES))
}

/// The error reply to an empty export name when several exports are offered.
const SEVERAL_EXPORTS: &[u8] = b"several exports are offered, so an empty export name \
    selects none: name one (nbdinfo --list shows them)";

// ---------------------------------------------------------------------------------------
// Greeting and client flags.

#[test]
fn greeting_is_newstyle_with_fixed_and_no_zeroes() {
    let handshake = Handshake::new(exports());
    let mut expected = b"NBDMAGIC".to_vec();
    expected.extend_from_slice(b"IHAVEOPT");
    expected.extend_from_slice(&[0x00, 0x03]);
    assert_eq!(handshake.greeting().to_vec(), expected);
}

#[test]
fn unknown_client_flags_end_the_connection() {
    let mut handshake = Handshake::new(exports());
    let (out, result) = run(&mut handshake, &client_flags(FIXED_NO_ZEROES | 4));
    assert!(out.is_empty());
    assert_eq!(result, Err(ProtocolError::UnknownClientFlags { flags: 7 }));
    let (_, again) = run(&mut handshake, &[0]);
    assert_eq!(again, Err(ProtocolError::Finished));
}

#[test]
fn client_flags_alone_need_more_input() {
    let mut handshake = Handshake::new(exports());
    let (out, result) = run(&mut handshake, &client_flags(FIXED_NO_ZEROES));
    assert!(out.is_empty());
    let progress = result.unwrap();
    assert_eq!(progress.consumed_bytes, 4);
    assert_eq!(progress.status, HandshakeStatus::Continue);
}

// ---------------------------------------------------------------------------------------
// EXPORT_NAME.

#[test]
fn export_name_with_zeroes() {
    let mut handshake = Handshake::new(exports());
    let mut input = client_flags(CLIENT_FLAG_FIXED_NEWSTYLE);
    input.extend(option(OPT_EXPORT_NAME, b"vol0"));
    let (out, result) = run(&mut handshake, &input);
    let mut expected = (1u64 << 30).to_be_bytes().to_vec();
    expected.extend_from_slice(&vol0_flags(false).to_be_bytes());
    expected.extend_from_slice(&[0u8; 124]);
    assert_eq!(out, expected);
    let negotiated = done(result);
    assert_eq!(negotiated.export_index, 0);
    assert_eq!(negotiated.entered_by, EnteredBy::ExportName);
    assert!(!negotiated.structured_replies);
    assert_eq!(negotiated.base_allocation(), None);
    assert_eq!(negotiated.transmission_flags.bits(), vol0_flags(false));
}

#[test]
fn export_name_with_no_zeroes() {
    let (mut handshake, mut input) = start();
    input.extend(option(OPT_EXPORT_NAME, b"ro"));
    let (out, result) = run(&mut handshake, &input);
    let mut expected = 40960u64.to_be_bytes().to_vec();
    expected.extend_from_slice(&ro_flags().to_be_bytes());
    assert_eq!(out, expected);
    assert_eq!(done(result).export_index, 1);
}

#[test]
fn export_name_without_fixed_newstyle_still_works() {
    let (mut handshake, _) = start_one();
    let mut input = client_flags(0);
    input.extend(option(OPT_EXPORT_NAME, b""));
    let (out, result) = run(&mut handshake, &input);
    assert_eq!(out.len(), 8 + 2 + 124);
    assert_eq!(
        done(result).export_index,
        0,
        "empty name is the only export"
    );
}

/// With several exports an empty name selects none: "the first" would be another disk as
/// soon as an export sorts before it. EXPORT_NAME has no error reply: the session ends.
#[test]
fn export_name_empty_with_several_exports_ends_the_connection() {
    let (mut handshake, mut input) = start();
    input.extend(option(OPT_EXPORT_NAME, b""));
    let (out, result) = run(&mut handshake, &input);
    assert!(out.is_empty());
    assert_eq!(result, Err(ProtocolError::NoDefaultExport));
}

#[test]
fn export_name_unknown_ends_the_connection() {
    let (mut handshake, mut input) = start();
    input.extend(option(OPT_EXPORT_NAME, b"nope"));
    let (out, result) = run(&mut handshake, &input);
    assert!(out.is_empty());
    assert_eq!(result, Err(ProtocolError::UnknownExport));
}

#[test]
fn export_name_too_long_ends_the_connection_before_reading_it() {
    let (mut handshake, mut input) = start();
    // Header only: the server must not wait for (or buffer) 5000 bytes.
    input.extend_from_slice(&IHAVEOPT.to_be_bytes());
    input.extend_from_slice(&OPT_EXPORT_NAME.to_be_bytes());
    input.extend_from_slice(&5000u32.to_be_bytes());
    let (_, result) = run(&mut handshake, &input);
    assert_eq!(
        result,
        Err(ProtocolError::ExportNameTooLong { length_bytes: 5000 })
    );
}

#[test]
fn export_name_after_structured_reply_and_set_meta_context() {
    let (mut handshake, mut input) = start();
    input.extend(option(OPT_STRUCTURED_REPLY, &[]));
    input.extend(option(
        OPT_SET_META_CONTEXT,
        &meta_data("vol0", &["base:allocation"]),
    ));
    input.extend(option(OPT_EXPORT_NAME, b"vol0"));
    let (out, result) = run(&mut handshake, &input);
    let negotiated = done(result);
    assert!(negotiated.structured_replies);
    assert_eq!(negotiated.base_allocation(), Some(MetaContextId(1)));
    assert_eq!(negotiated.transmission_flags.bits(), vol0_flags(true));
    // ACK, META_CONTEXT, ACK, then the 10-byte EXPORT_NAME reply.
    let tail = &out[out.len() - 10..];
    assert_eq!(&tail[..8], &(1u64 << 30).to_be_bytes());
    let replies = parse_replies(&out[..out.len() - 10]);
    assert_eq!(replies.len(), 3);
}

// ---------------------------------------------------------------------------------------
// GO and INFO.

#[test]
fn go_sends_export_and_block_size_then_ack() {
    let (mut handshake, mut input) = start();
    input.extend(go("vol0", &[]));
    let (out, result) = run(&mut handshake, &input);
    assert_eq!(
        parse_replies(&out),
        vec![
            reply(OPT_GO, REP_INFO, &info_export(1 << 30, vol0_flags(false))),
            reply(OPT_GO, REP_INFO, &info_block_size(1, 16384, 32 << 20)),
            reply(OPT_GO, REP_ACK, &[]),
        ]
    );
    let negotiated = done(result);
    assert_eq!(negotiated.entered_by, EnteredBy::Go);
    assert_eq!(negotiated.export_index, 0);
}

#[test]
fn go_with_name_description_and_unknown_items() {
    let (mut handshake, mut input) = start();
    input.extend(go(
        "vol0",
        &[
            INFO_NAME,
            INFO_DESCRIPTION,
            INFO_BLOCK_SIZE,
            INFO_EXPORT,
            77,
        ],
    ));
    let (out, result) = run(&mut handshake, &input);
    assert_eq!(
        parse_replies(&out),
        vec![
            reply(OPT_GO, REP_INFO, &info_export(1 << 30, vol0_flags(false))),
            reply(OPT_GO, REP_INFO, &info_string(INFO_NAME, "vol0")),
            reply(
                OPT_GO,
                REP_INFO,
                &info_string(INFO_DESCRIPTION, "first volume")
            ),
            reply(OPT_GO, REP_INFO, &info_block_size(1, 16384, 32 << 20)),
            reply(OPT_GO, REP_ACK, &[]),
        ]
    );
    done(result);
}

#[test]
fn go_default_export_reports_canonical_name_and_skips_empty_description() {
    let (mut handshake, mut input) = start();
    input.extend(go("ro", &[INFO_DESCRIPTION]));
    let (out, result) = run(&mut handshake, &input);
    assert_eq!(
        parse_replies(&out),
        vec![
            reply(OPT_GO, REP_INFO, &info_export(40960, ro_flags())),
            reply(OPT_GO, REP_INFO, &info_block_size(1, 4096, 32 << 20)),
            reply(OPT_GO, REP_ACK, &[]),
        ]
    );
    assert_eq!(done(result).export_index, 1);

    let (mut handshake, mut input) = start_one();
    input.extend(go("", &[INFO_NAME]));
    let (out, result) = run(&mut handshake, &input);
    let replies = parse_replies(&out);
    assert_eq!(
        replies[1],
        reply(OPT_GO, REP_INFO, &info_string(INFO_NAME, "vol0"))
    );
    assert_eq!(done(result).export_index, 0);
}

#[test]
fn empty_name_with_several_exports_is_unknown_and_says_why() {
    for code in [OPT_INFO, OPT_GO] {
        let (mut handshake, mut input) = start();
        input.extend(option(code, &info_data("", &[INFO_NAME])));
        // Negotiation goes on: the client may name one.
        input.extend(go("ro", &[]));
        let (out, result) = run(&mut handshake, &input);
        let replies = parse_replies(&out);
        assert_eq!(replies[0], reply(code, REP_ERR_UNKNOWN, SEVERAL_EXPORTS));
        assert_eq!(done(result).export_index, 1);
    }
    for code in [OPT_LIST_META_CONTEXT, OPT_SET_META_CONTEXT] {
        let (replies, _) = meta_replies(&[
            option(OPT_STRUCTURED_REPLY, &[]),
            option(code, &meta_data("", &["base:allocation"])),
        ]);
        assert_eq!(replies[1], reply(code, REP_ERR_UNKNOWN, SEVERAL_EXPORTS));
    }
}

/// A server whose exports change pins its default: an empty name selects that export only
/// while it is the sole one, and none once it is gone, even with another left alone.
#[test]
fn a_pinned_default_export_is_selected_only_while_it_is_the_sole_export() {
    let go_empty = |exports: Vec<ExportInfo>, pinned: Option<usize>| {
        let mut handshake = Handshake::new(exports);
        handshake.set_default_export(pinned);
        let mut input = client_flags(FIXED_NO_ZEROES);
        input.extend(go("", &[]));
        let (out, result) = run(&mut handshake, &input);
        (parse_replies(&out), result)
    };
    let (_, result) = go_empty(exports()[..1].to_vec(), Some(0));
    assert_eq!(done(result).export_index, 0);
    let (replies, _) = go_empty(exports(), Some(0));
    assert_eq!(
        replies,
        vec![reply(OPT_GO, REP_ERR_UNKNOWN, SEVERAL_EXPORTS)]
    );
    let (replies, _) = go_empty(exports()[1..].to_vec(), None);
    assert_eq!(
        replies,
        vec![reply(
            OPT_GO,
            REP_ERR_UNKNOWN,
            b"the export an empty export name selected is no longer offered: \
              name an export (nbdinfo --list shows them)"
        )]
    );
}

#[test]
fn info_then_go_give_the_same_answer() {
    let (mut handshake, mut input) = start();
    input.extend(option(OPT_INFO, &info_data("vol0", &[INFO_BLOCK_SIZE])));
    let (info_out, result) = run(&mut handshake, &input);
    assert_eq!(result.unwrap().status, HandshakeStatus::Continue);
    let (go_out, result) = run(&mut handshake, &go("vol0", &[INFO_BLOCK_SIZE]));
    done(result);
    let info: Vec<_> = parse_replies(&info_out)
        .into_iter()
        .map(|r| (r.reply_type, r.data))
        .collect();
    let go: Vec<_> = parse_replies(&go_out)
        .into_iter()
        .map(|r| (r.reply_type, r.data))
        .collect();
    assert_eq!(info, go);
}

#[test]
fn go_unknown_export_is_an_error_reply_and_negotiation_goes_on() {
    let (mut handshake, mut input) = start();
    input.extend(go("nope", &[]));
    input.extend(go("vol0", &[]));
    let (out, result) = run(&mut handshake, &input);
    let replies = parse_replies(&out);
    assert_eq!(replies[0].option, OPT_GO);
    assert_eq!(replies[0].reply_type, REP_ERR_UNKNOWN);
    assert_eq!(replies.last().unwrap().reply_type, REP_ACK);
    assert_eq!(done(result).export_index, 0);
}

#[test]
fn go_with_no_exports_is_unknown() {
    let mut handshake = Handshake::new(Vec::new());
    let mut input = client_flags(FIXED_NO_ZEROES);
    input.extend(go("", &[]));
    let (out, result) = run(&mut handshake, &input);
    assert_eq!(
        parse_replies(&out),
        vec![reply(OPT_GO, REP_ERR_UNKNOWN, b"unknown export")]
    );
    assert_eq!(result.unwrap().status, HandshakeStatus::Continue);
}

#[test]
fn malformed_info_and_go_are_invalid() {
    let mut too_long_name = info_data("vol0", &[]);
    too_long_name[3] = 200; // name length past the data
    let mut odd_items = info_data("vol0", &[INFO_NAME]);
    odd_items.push(0); // a trailing byte
    let mut count_too_big = info_data("vol0", &[INFO_NAME]);
    count_too_big[9] = 2; // says 2 items, has 1
    for (option_code, data) in [
        (OPT_GO, vec![]),
        (OPT_GO, vec![0, 0, 0, 0, 0]),
        (OPT_INFO, too_long_name),
        (OPT_GO, odd_items),
        (OPT_GO, count_too_big),
    ] {
        let (mut handshake, mut input) = start();
        input.extend(option(option_code, &data));
        let (out, result) = run(&mut handshake, &input);
        let replies = parse_replies(&out);
        assert_eq!(replies.len(), 1, "{data:?}");
        assert_eq!(replies[0].reply_type, REP_ERR_INVALID, "{data:?}");
        assert_eq!(result.unwrap().status, HandshakeStatus::Continue);
    }
}

#[test]
fn bytes_after_go_belong_to_transmission() {
    let (mut handshake, mut input) = start();
    input.extend(go("vol0", &[]));
    let handshake_bytes = input.len();
    input.extend_from_slice(&REQUEST_MAGIC.to_be_bytes());
    input.extend_from_slice(&[0u8; 24]);
    let (_, result) = run(&mut handshake, &input);
    let progress = result.unwrap();
    assert_eq!(progress.consumed_bytes, handshake_bytes);
    assert!(matches!(progress.status, HandshakeStatus::Done(_)));
    let (_, again) = run(&mut handshake, &input[handshake_bytes..]);
    assert_eq!(again, Err(ProtocolError::Finished));
}

#[test]
fn preferred_block_size_is_clamped_to_a_power_of_two() {
    for (configured, advertised) in [
        (0, 512),
        (100, 512),
        (512, 512),
        (16384, 16384),
        (20000, 16384),
        (u32::MAX, 32 << 20),
    ] {
        let mut list = exports();
        list[0].preferred_block_bytes = configured;
        let mut handshake = Handshake::new(list);
        let mut input = client_flags(FIXED_NO_ZEROES);
        input.extend(go("vol0", &[]));
        let (out, _) = run(&mut handshake, &input);
        assert_eq!(
            parse_replies(&out)[1],
            reply(OPT_GO, REP_INFO, &info_block_size(1, advertised, 32 << 20)),
            "configured {configured}"
        );
    }
}

// ---------------------------------------------------------------------------------------
// LIST, ABORT, STRUCTURED_REPLY, unknown options, limits.

#[test]
fn list_sends_one_server_reply_per_export_then_ack() {
    let (mut handshake, mut input) = start();
    input.extend(option(OPT_LIST, &[]));
    let (out, result) = run(&mut handshake, &input);
    let mut vol0 = 4u32.to_be_bytes().to_vec();
    vol0.extend_from_slice(b"vol0first volume");
    let mut ro = 2u32.to_be_bytes().to_vec();
    ro.extend_from_slice(b"ro");
    assert_eq!(
        parse_replies(&out),
        vec![
            reply(OPT_LIST, REP_SERVER, &vol0),
            reply(OPT_LIST, REP_SERVER, &ro),
            reply(OPT_LIST, REP_ACK, &[]),
        ]
    );
    assert_eq!(result.unwrap().status, HandshakeStatus::Continue);
}

#[test]
fn list_with_data_is_invalid() {
    let (mut handshake, mut input) = start();
    input.extend(option(OPT_LIST, b"x"));
    let (out, _) = run(&mut handshake, &input);
    let replies = parse_replies(&out);
    assert_eq!(replies.len(), 1);
    assert_eq!(replies[0].reply_type, REP_ERR_INVALID);
}

#[test]
fn abort_is_acknowledged_then_closes() {
    let (mut handshake, mut input) = start();
    input.extend(option(OPT_ABORT, b"ignored"));
    input.extend_from_slice(b"trailing");
    let (out, result) = run(&mut handshake, &input);
    assert_eq!(parse_replies(&out), vec![reply(OPT_ABORT, REP_ACK, &[])]);
    let progress = result.unwrap();
    assert_eq!(progress.status, HandshakeStatus::Abort);
    assert_eq!(progress.consumed_bytes, input.len() - 8);
}

#[test]
fn structured_reply_is_acknowledged_and_enables_df() {
    let (mut handshake, mut input) = start();
    input.extend(option(OPT_STRUCTURED_REPLY, &[]));
    input.extend(option(OPT_STRUCTURED_REPLY, &[]));
    input.extend(go("vol0", &[]));
    let (out, result) = run(&mut handshake, &input);
    let replies = parse_replies(&out);
    assert_eq!(replies[0], reply(OPT_STRUCTURED_REPLY, REP_ACK, &[]));
    assert_eq!(replies[1], reply(OPT_STRUCTURED_REPLY, REP_ACK, &[]));
    assert_eq!(
        replies[2],
        reply(OPT_GO, REP_INFO, &info_export(1 << 30, vol0_flags(true)))
    );
    let negotiated = done(result);
    assert!(negotiated.structured_replies);
    assert_eq!(negotiated.base_allocation(), None);
}

#[test]
fn structured_reply_with_data_is_invalid() {
    let (mut handshake, mut input) = start();
    input.extend(option(OPT_STRUCTURED_REPLY, b"x"));
    input.extend(go("vol0", &[]));
    let (out, result) = run(&mut handshake, &input);
    assert_eq!(parse_replies(&out)[0].reply_type, REP_ERR_INVALID);
    assert!(!done(result).structured_replies);
}

#[test]
fn unsupported_options_get_err_unsup_and_negotiation_goes_on() {
    for code in [OPT_STARTTLS, OPT_EXTENDED_HEADERS, 4, 0, 12, 0xffff_ffff] {
        let (mut handshake, mut input) = start();
        input.extend(option(code, b"some data"));
        input.extend(go("vol0", &[]));
        let (out, result) = run(&mut handshake, &input);
        let replies = parse_replies(&out);
        assert_eq!(replies[0].option, code);
        assert_eq!(replies[0].reply_type, REP_ERR_UNSUP);
        done(result);
    }
}

#[test]
fn oversized_option_is_skipped_and_answered_too_big() {
    let length = MAX_OPTION_DATA_BYTES as usize + 1;
    let (mut handshake, mut input) = start();
    input.extend(option(OPT_GO, &vec![0xab; length]));
    input.extend(go("vol0", &[]));
    // One byte at a time too: the skip must not need the whole option in memory.
    for sizes in [vec![input.len()], vec![1], vec![7, 4096, 1]] {
        let mut handshake_copy = Handshake::new(exports());
        let (out, consumed, status) = run_split(&mut handshake_copy, &input, &sizes);
        let replies = parse_replies(&out);
        assert_eq!(replies[0].reply_type, REP_ERR_TOO_BIG);
        assert!(matches!(status, Ok(HandshakeStatus::Done(_))));
        assert_eq!(consumed, input.len());
    }
    let (_, result) = run(&mut handshake, &input);
    done(result);
}

#[test]
fn bad_option_magic_ends_the_connection() {
    let (mut handshake, mut input) = start();
    let mut bad = option(OPT_LIST, &[]);
    bad[0] ^= 1;
    input.extend(bad);
    let (_, result) = run(&mut handshake, &input);
    assert!(matches!(result, Err(ProtocolError::BadOptionMagic { .. })));
}

#[test]
fn too_many_options_end_the_connection() {
    let (mut handshake, mut input) = start();
    for _ in 0..MAX_OPTIONS_PER_HANDSHAKE {
        input.extend(option(OPT_STRUCTURED_REPLY, &[]));
    }
    let (outs, result) = run_paused(&mut handshake, &input);
    assert_eq!(
        parse_replies(&outs.concat()).len(),
        MAX_OPTIONS_PER_HANDSHAKE as usize
    );
    assert_eq!(result.unwrap().status, HandshakeStatus::Continue);
    let (_, result) = run(&mut handshake, &option(OPT_STRUCTURED_REPLY, &[]));
    assert_eq!(
        result,
        Err(ProtocolError::TooManyOptions {
            limit: MAX_OPTIONS_PER_HANDSHAKE
        })
    );
}

// ---------------------------------------------------------------------------------------
// Meta contexts.

fn meta_replies(
    options: &[Vec<u8>],
) -> (Vec<OptionReply>, Result<HandshakeProgress, ProtocolError>) {
    let (mut handshake, mut input) = start();
    for option in options {
        input.extend_from_slice(option);
    }
    let (out, result) = run(&mut handshake, &input);
    (parse_replies(&out), result)
}

#[test]
fn list_meta_context_lists_base_allocation() {
    for queries in [
        &[][..],
        &["base:"][..],
        &["base:allocation"][..],
        &["x-foo:bar", "base:", "base:allocation"][..],
    ] {
        let (replies, _) =
            meta_replies(&[option(OPT_LIST_META_CONTEXT, &meta_data("vol0", queries))]);
        assert_eq!(
            replies,
            vec![
                meta_context_reply(OPT_LIST_META_CONTEXT, 0),
                reply(OPT_LIST_META_CONTEXT, REP_ACK, &[]),
            ],
            "{queries:?}"
        );
    }
}

#[test]
fn list_meta_context_ignores_unknown_namespaces_and_leaves() {
    for queries in [
        &["qemu:dirty-bitmap:a"][..],
        &["base:other"][..],
        &["nocolon"][..],
        &[""][..],
    ] {
        let (replies, _) =
            meta_replies(&[option(OPT_LIST_META_CONTEXT, &meta_data("vol0", queries))]);
        assert_eq!(
            replies,
            vec![reply(OPT_LIST_META_CONTEXT, REP_ACK, &[])],
            "{queries:?}"
        );
    }
}

#[test]
fn meta_context_errors() {
    // Unknown export.
    let (replies, _) = meta_replies(&[option(OPT_LIST_META_CONTEXT, &meta_data("nope", &[]))]);
    assert_eq!(replies[0].reply_type, REP_ERR_UNKNOWN);
    // Query count larger than the data could hold.
    let mut data = meta_data("vol0", &["base:allocation"]);
    data[8..12].copy_from_slice(&1000u32.to_be_bytes());
    let (replies, _) = meta_replies(&[option(OPT_LIST_META_CONTEXT, &data)]);
    assert_eq!(replies.len(), 1);
    assert_eq!(replies[0].reply_type, REP_ERR_INVALID);
    // Query length past the end.
    let mut data = meta_data("vol0", &["base:allocation"]);
    data[15] = 99;
    let (replies, _) = meta_replies(&[option(OPT_LIST_META_CONTEXT, &data)]);
    assert_eq!(replies[0].reply_type, REP_ERR_INVALID);
    // Trailing garbage.
    let mut data = meta_data("vol0", &[]);
    data.push(1);
    let (replies, _) = meta_replies(&[option(OPT_LIST_META_CONTEXT, &data)]);
    assert_eq!(replies[0].reply_type, REP_ERR_INVALID);
    // Truncated header.
    let (replies, _) = meta_replies(&[option(OPT_LIST_META_CONTEXT, &[0, 0, 0])]);
    assert_eq!(replies[0].reply_type, REP_ERR_INVALID);
}

#[test]
fn set_meta_context_requires_structured_replies() {
    let (replies, result) = meta_replies(&[
        option(
            OPT_SET_META_CONTEXT,
            &meta_data("vol0", &["base:allocation"]),
        ),
        go("vol0", &[]),
    ]);
    assert_eq!(replies[0].reply_type, REP_ERR_INVALID);
    assert_eq!(done(result).base_allocation(), None);
}

#[test]
fn set_meta_context_selects_base_allocation_for_that_export() {
    let (replies, result) = meta_replies(&[
        option(OPT_STRUCTURED_REPLY, &[]),
        option(
            OPT_SET_META_CONTEXT,
            &meta_data("vol0", &["x-y:z", "base:allocation"]),
        ),
        go("vol0", &[]),
    ]);
    assert_eq!(replies[1], meta_context_reply(OPT_SET_META_CONTEXT, 1));
    assert_eq!(replies[2], reply(OPT_SET_META_CONTEXT, REP_ACK, &[]));
    let negotiated = done(result);
    assert_eq!(
        negotiated.base_allocation(),
        Some(MetaContextId::BASE_ALLOCATION)
    );
    assert!(negotiated.structured_replies);
}

#[test]
fn set_meta_context_for_another_export_does_not_carry_over() {
    let (_, result) = meta_replies(&[
        option(OPT_STRUCTURED_REPLY, &[]),
        option(OPT_SET_META_CONTEXT, &meta_data("ro", &["base:allocation"])),
        go("vol0", &[]),
    ]);
    assert_eq!(done(result).base_allocation(), None);
    // The default name and the canonical name are the same export (with "vol0" alone).
    let (mut handshake, mut input) = start_one();
    input.extend(option(OPT_STRUCTURED_REPLY, &[]));
    input.extend(option(
        OPT_SET_META_CONTEXT,
        &meta_data("", &["base:allocation"]),
    ));
    input.extend(go("vol0", &[]));
    let (_, result) = run(&mut handshake, &input);
    assert_eq!(done(result).base_allocation(), Some(MetaContextId(1)));
}

#[test]
fn set_meta_context_replaces_the_selection_even_when_it_fails() {
    for second in [
        meta_data("vol0", &[]),
        meta_data("vol0", &["base:"]),
        meta_data("nope", &["base:allocation"]),
        vec![1, 2, 3],
    ] {
        let (replies, result) = meta_replies(&[
            option(OPT_STRUCTURED_REPLY, &[]),
            option(
                OPT_SET_META_CONTEXT,
                &meta_data("vol0", &["base:allocation"]),
            ),
            option(OPT_SET_META_CONTEXT, &second),
            go("vol0", &[]),
        ]);
        assert_ne!(replies[3].reply_type, REP_META_CONTEXT, "{second:?}");
        assert_eq!(done(result).base_allocation(), None, "{second:?}");
    }
}

#[test]
fn list_meta_context_does_not_change_the_selection() {
    let (_, result) = meta_replies(&[
        option(OPT_STRUCTURED_REPLY, &[]),
        option(
            OPT_SET_META_CONTEXT,
            &meta_data("vol0", &["base:allocation"]),
        ),
        option(OPT_LIST_META_CONTEXT, &meta_data("vol0", &[])),
        go("vol0", &[]),
    ]);
    assert_eq!(done(result).base_allocation(), Some(MetaContextId(1)));
}

// ---------------------------------------------------------------------------------------
// Properties.

/// A random but well-formed client conversation, ending (usually) with GO.
fn arb_options() -> impl Strategy<Value = Vec<Vec<u8>>> {
    let one = prop_oneof![
        Just(option(OPT_STRUCTURED_REPLY, &[])),
        Just(option(OPT_LIST, &[])),
        Just(option(OPT_LIST_META_CONTEXT, &meta_data("vol0", &[]))),
        Just(option(
            OPT_SET_META_CONTEXT,
            &meta_data("vol0", &["base:allocation"])
        )),
        Just(option(
            OPT_INFO,
            &info_data("ro", &[INFO_NAME, INFO_DESCRIPTION])
        )),
        Just(go("nope", &[])),
        // Any option but EXPORT_NAME, whose reply is not an option reply.
        (0u32..20, proptest::collection::vec(any::<u8>(), 0..40)).prop_map(|(code, data)| option(
            if code == OPT_EXPORT_NAME { 100 } else { code },
            &data
        )),
    ];
    (proptest::collection::vec(one, 0..8), any::<bool>()).prop_map(|(mut options, with_go)| {
        if with_go {
            options.push(go("vol0", &[INFO_BLOCK_SIZE]));
        }
        options
    })
}

proptest! {
    /// Any split of the same conversation gives the same bytes and the same outcome.
    #[test]
    fn any_split_gives_the_same_result(
        options in arb_options(),
        sizes in proptest::collection::vec(1usize..64, 1..16),
    ) {
        let mut input = client_flags(FIXED_NO_ZEROES);
        for option in &options {
            input.extend_from_slice(option);
        }
        let mut whole = Handshake::new(exports());
        let (whole_out, whole_consumed, whole_status) =
            run_split(&mut whole, &input, &[input.len()]);
        let mut split = Handshake::new(exports());
        let (split_out, split_consumed, split_status) = run_split(&mut split, &input, &sizes);
        prop_assert_eq!(&whole_out, &split_out);
        prop_assert_eq!(&whole_status, &split_status);
        if whole_status.is_ok() {
            prop_assert_eq!(whole_consumed, split_consumed);
        }
        // Server output is always a well-formed sequence of option replies (no
        // EXPORT_NAME in this conversation).
        parse_replies(&whole_out);
    }

    /// Random bytes never panic, whether they start at the client flags or after a valid
    /// prefix, and in any split.
    #[test]
    fn random_bytes_never_panic(
        prefix in any::<bool>(),
        bytes in proptest::collection::vec(any::<u8>(), 0..512),
        sizes in proptest::collection::vec(1usize..64, 1..8),
    ) {
        let mut input = Vec::new();
        if prefix {
            input.extend(client_flags(FIXED_NO_ZEROES));
            input.extend_from_slice(&IHAVEOPT.to_be_bytes());
        }
        input.extend_from_slice(&bytes);
        let mut handshake = Handshake::new(exports());
        let _ = run_split(&mut handshake, &input, &sizes);
    }

    /// Random option codes and data never panic and always get exactly one final reply
    /// (or end the handshake).
    #[test]
    fn random_options_get_replies(
        code in 0u32..16,
        data in proptest::collection::vec(any::<u8>(), 0..64),
    ) {
        let (mut handshake, mut input) = start();
        input.extend(option(code, &data));
        let (out, result) = run(&mut handshake, &input);
        match result {
            Ok(HandshakeProgress { status: HandshakeStatus::Continue, .. }) => {
                let replies = parse_replies(&out);
                let last = replies.last().expect("a reply");
                prop_assert!(last.reply_type == REP_ACK || last.reply_type & REP_FLAG_ERROR != 0);
            }
            Ok(_) => prop_assert!(code == OPT_GO || code == OPT_ABORT || code == OPT_EXPORT_NAME),
            Err(error) => prop_assert!(
                error == ProtocolError::UnknownExport || error == ProtocolError::NoDefaultExport,
                "{error:?}"
            ),
        }
    }
}

/// A packet of many LIST options is answered a part at a time: a call stops after the option
/// whose replies pass REPLIES_PAUSE_BYTES, and the rest, given again, gets the same replies
/// as options sent one by one. Before, one call answered them all in memory (20 MB for 4096
/// LISTs of 100 exports) before the first byte was sent.
#[test]
fn a_packet_of_options_is_answered_a_part_at_a_time() {
    let (mut handshake, mut input) = start();
    let one_list = option(OPT_LIST, &[]);
    for _ in 0..MAX_OPTIONS_PER_HANDSHAKE {
        input.extend_from_slice(&one_list);
    }
    let (outs, result) = run_paused(&mut handshake, &input);
    assert_eq!(result.unwrap().status, HandshakeStatus::Continue);
    let (mut alone, flags) = start();
    let (one_reply, _) = run(&mut alone, &[flags, one_list].concat());
    assert!(outs.len() > 2, "{} calls", outs.len());
    for out in &outs[..outs.len() - 1] {
        assert!(
            (REPLIES_PAUSE_BYTES..REPLIES_PAUSE_BYTES + one_reply.len()).contains(&out.len()),
            "a call's replies: {} bytes",
            out.len()
        );
    }
    assert_eq!(
        outs.concat(),
        one_reply.repeat(MAX_OPTIONS_PER_HANDSHAKE as usize)
    );
}
