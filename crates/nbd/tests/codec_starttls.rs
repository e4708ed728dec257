//! STARTTLS and per-export access in the handshake codec: the protocol's TLS rules (FORCEDTLS
//! refuses everything but STARTTLS and ABORT; plain-text state is forgotten after TLS; bytes
//! after STARTTLS end the connection) and export refusal (`ERR_POLICY`, `ERR_TLS_REQD`, hidden
//! from LIST).
//!
//! The client side is written here from the protocol text, independently of the server code.

use oxpool_nbd::proto::wire::*;
use oxpool_nbd::proto::{
    ExportAccess, ExportCaps, ExportInfo, Handshake, HandshakeProgress, HandshakeStatus,
    MetaContextId, Negotiated, ProtocolError, TlsPolicy,
};

fn export(name: &str) -> ExportInfo {
    ExportInfo {
        name: name.into(),
        description: String::new(),
        size_bytes: 1 << 20,
        preferred_block_bytes: 4096,
        read_only: false,
        caps: ExportCaps::default(),
    }
}

fn exports() -> Vec<ExportInfo> {
    vec![export("open"), export("alice-only"), export("bob-only")]
}

fn flags() -> Vec<u8> {
    (CLIENT_FLAG_FIXED_NEWSTYLE | CLIENT_FLAG_NO_ZEROES)
        .to_be_bytes()
        .to_vec()
}

fn option(option: u32, data: &[u8]) -> Vec<u8> {
    let mut bytes = IHAVEOPT.to_be_bytes().to_vec();
    bytes.extend_from_slice(&option.to_be_bytes());
    bytes.extend_from_slice(&(data.len() as u32).to_be_bytes());
    bytes.extend_from_slice(data);
    bytes
}

fn name_data(name: &str, tail: &[u8]) -> Vec<u8> {
    let mut bytes = (name.len() as u32).to_be_bytes().to_vec();
    bytes.extend_from_slice(name.as_bytes());
    bytes.extend_from_slice(tail);
    bytes
}

/// GO/INFO data: name, no information requests.
fn go_data(name: &str) -> Vec<u8> {
    name_data(name, &0u16.to_be_bytes())
}

/// SET/LIST_META_CONTEXT data: name, one query for base:allocation.
fn meta_data(name: &str) -> Vec<u8> {
    let mut tail = 1u32.to_be_bytes().to_vec();
    tail.extend_from_slice(&(BASE_ALLOCATION.len() as u32).to_be_bytes());
    tail.extend_from_slice(BASE_ALLOCATION.as_bytes());
    name_data(name, &tail)
}

/// (option, reply type, data) of each option reply; panics on anything malformed.
fn replies(mut bytes: &[u8]) -> Vec<(u32, u32, Vec<u8>)> {
    let mut out = Vec::new();
    while !bytes.is_empty() {
        assert!(bytes.len() >= 20, "truncated reply");
        assert_eq!(
            u64::from_be_bytes(bytes[0..8].try_into().unwrap()),
            OPTION_REPLY_MAGIC
        );
        let option = u32::from_be_bytes(bytes[8..12].try_into().unwrap());
        let kind = u32::from_be_bytes(bytes[12..16].try_into().unwrap());
        let len = u32::from_be_bytes(bytes[16..20].try_into().unwrap()) as usize;
        out.push((option, kind, bytes[20..20 + len].to_vec()));
        bytes = &bytes[20 + len..];
    }
    out
}

fn kinds(bytes: &[u8]) -> Vec<(u32, u32)> {
    replies(bytes).into_iter().map(|(o, k, _)| (o, k)).collect()
}

/// Export names in LIST's REP_SERVER replies.
fn listed(bytes: &[u8]) -> Vec<String> {
    replies(bytes)
        .into_iter()
        .filter(|(_, kind, _)| *kind == REP_SERVER)
        .map(|(_, _, data)| String::from_utf8(data[4..].to_vec()).unwrap())
        .collect()
}

fn feed(
    handshake: &mut Handshake,
    input: &[u8],
) -> (Vec<u8>, Result<HandshakeProgress, ProtocolError>) {
    let mut out = Vec::new();
    let result = handshake.receive(input, &mut out);
    (out, result)
}

fn done(result: Result<HandshakeProgress, ProtocolError>) -> Negotiated {
    match result.expect("handshake ok").status {
        HandshakeStatus::Done(negotiated) => negotiated,
        other => panic!("expected Done, got {other:?}"),
    }
}

/// A handshake under `policy` that has received STARTTLS (ACKed) and whose TLS handshake
/// "succeeded" with `access`.
fn through_tls(policy: TlsPolicy, before: &[u8], access: Vec<ExportAccess>) -> Handshake {
    let mut handshake = Handshake::with_tls(exports(), policy);
    let mut input = flags();
    input.extend_from_slice(before);
    input.extend(option(OPT_STARTTLS, &[]));
    let (out, result) = feed(&mut handshake, &input);
    let progress = result.expect("STARTTLS accepted");
    assert_eq!(progress.status, HandshakeStatus::StartTls);
    assert_eq!(progress.consumed_bytes, input.len());
    assert_eq!(
        kinds(&out).last(),
        Some(&(OPT_STARTTLS, REP_ACK)),
        "STARTTLS is acknowledged"
    );
    assert!(!handshake.tls_active());
    handshake.tls_established(access).expect("TLS established");
    assert!(handshake.tls_active());
    handshake
}

fn all_allowed() -> Vec<ExportAccess> {
    vec![ExportAccess::Allowed; 3]
}

#[test]
fn required_tls_refuses_every_option_before_starttls_but_abort() {
    let mut handshake = Handshake::with_tls(exports(), TlsPolicy::Required);
    let mut input = flags();
    let refused = [
        (OPT_LIST, Vec::new()),
        (OPT_STRUCTURED_REPLY, Vec::new()),
        (OPT_INFO, go_data("open")),
        (OPT_GO, go_data("open")),
        (OPT_LIST_META_CONTEXT, meta_data("open")),
        (OPT_SET_META_CONTEXT, meta_data("open")),
        (OPT_EXTENDED_HEADERS, Vec::new()),
        (77, b"unknown option with data".to_vec()),
    ];
    for (code, data) in &refused {
        input.extend(option(*code, data));
    }
    input.extend(option(OPT_ABORT, &[]));
    let (out, result) = feed(&mut handshake, &input);
    let mut expected: Vec<(u32, u32)> = refused
        .iter()
        .map(|(code, _)| (*code, REP_ERR_TLS_REQD))
        .collect();
    expected.push((OPT_ABORT, REP_ACK));
    // Every option's data was read before the refusal: the stream stayed in step up to
    // ABORT, which is honoured.
    assert_eq!(kinds(&out), expected);
    assert_eq!(result.unwrap().status, HandshakeStatus::Abort);
}

#[test]
fn required_tls_drops_export_name_before_starttls() {
    let mut handshake = Handshake::with_tls(exports(), TlsPolicy::Required);
    let mut input = flags();
    input.extend(option(OPT_EXPORT_NAME, b"open"));
    let (out, result) = feed(&mut handshake, &input);
    assert!(out.is_empty(), "EXPORT_NAME has no error reply");
    assert_eq!(result, Err(ProtocolError::TlsRequired));
}

#[test]
fn plain_text_after_starttls_ends_the_connection() {
    // In the same input as STARTTLS (an injected option right behind it) ...
    let mut handshake = Handshake::with_tls(exports(), TlsPolicy::Optional);
    let mut input = flags();
    input.extend(option(OPT_STARTTLS, &[]));
    input.extend(option(OPT_STRUCTURED_REPLY, &[]));
    let (_, result) = feed(&mut handshake, &input);
    assert_eq!(result, Err(ProtocolError::DataAfterStartTls));
    let (_, again) = feed(&mut handshake, &option(OPT_LIST, &[]));
    assert_eq!(again, Err(ProtocolError::Finished));

    // ... or fed later, before the caller reports the TLS handshake done.
    let mut handshake = Handshake::with_tls(exports(), TlsPolicy::Required);
    let mut input = flags();
    input.extend(option(OPT_STARTTLS, &[]));
    let (_, result) = feed(&mut handshake, &input);
    assert_eq!(result.unwrap().status, HandshakeStatus::StartTls);
    let (out, result) = feed(&mut handshake, &[0x16]);
    assert!(out.is_empty());
    assert_eq!(result, Err(ProtocolError::DataAfterStartTls));
    assert!(handshake.tls_established(all_allowed()).is_err());
}

#[test]
fn negotiation_in_plain_text_is_forgotten_after_tls() {
    // Structured replies and a meta context negotiated before STARTTLS (what a MITM could
    // inject, CVE-2021-3716) do not survive it.
    let mut before = option(OPT_STRUCTURED_REPLY, &[]);
    before.extend(option(OPT_SET_META_CONTEXT, &meta_data("open")));
    let mut handshake = through_tls(TlsPolicy::Optional, &before, all_allowed());
    let (out, result) = feed(&mut handshake, &option(OPT_GO, &go_data("open")));
    assert_eq!(kinds(&out).last(), Some(&(OPT_GO, REP_ACK)));
    let negotiated = done(result);
    assert!(!negotiated.structured_replies);
    assert_eq!(negotiated.base_allocation(), None);

    // Negotiated again through TLS, they hold.
    let mut handshake = through_tls(TlsPolicy::Required, &[], all_allowed());
    let mut input = option(OPT_STRUCTURED_REPLY, &[]);
    input.extend(option(OPT_SET_META_CONTEXT, &meta_data("open")));
    input.extend(option(OPT_GO, &go_data("open")));
    let (_, result) = feed(&mut handshake, &input);
    let negotiated = done(result);
    assert!(negotiated.structured_replies);
    assert_eq!(
        negotiated.base_allocation(),
        Some(MetaContextId::BASE_ALLOCATION)
    );
}

#[test]
fn starttls_twice_or_with_data_is_invalid_and_off_is_unsupported() {
    let mut handshake = through_tls(TlsPolicy::Required, &[], all_allowed());
    let mut input = option(OPT_STARTTLS, &[]);
    input.extend(option(OPT_GO, &go_data("open")));
    let (out, result) = feed(&mut handshake, &input);
    assert_eq!(kinds(&out)[0], (OPT_STARTTLS, REP_ERR_INVALID));
    done(result);

    let mut handshake = Handshake::with_tls(exports(), TlsPolicy::Required);
    let mut input = flags();
    input.extend(option(OPT_STARTTLS, b"x"));
    input.extend(option(OPT_ABORT, &[]));
    let (out, _) = feed(&mut handshake, &input);
    assert_eq!(kinds(&out)[0], (OPT_STARTTLS, REP_ERR_INVALID));

    let mut handshake = Handshake::with_tls(exports(), TlsPolicy::Off);
    let mut input = flags();
    input.extend(option(OPT_STARTTLS, &[]));
    input.extend(option(OPT_GO, &go_data("open")));
    let (out, result) = feed(&mut handshake, &input);
    assert_eq!(kinds(&out)[0], (OPT_STARTTLS, REP_ERR_UNSUP));
    done(result);
}

#[test]
fn optional_tls_serves_plain_clients_except_tls_only_exports() {
    let mut handshake = Handshake::with_tls(exports(), TlsPolicy::Optional);
    handshake.set_access(vec![
        ExportAccess::Allowed,
        ExportAccess::TlsRequired,
        ExportAccess::TlsRequired,
    ]);
    let mut input = flags();
    input.extend(option(OPT_STRUCTURED_REPLY, &[]));
    input.extend(option(OPT_LIST, &[]));
    input.extend(option(OPT_INFO, &go_data("alice-only")));
    input.extend(option(OPT_SET_META_CONTEXT, &meta_data("alice-only")));
    input.extend(option(OPT_GO, &go_data("")));
    let (out, result) = feed(&mut handshake, &input);
    assert_eq!(listed(&out), vec!["open"]);
    let all = kinds(&out);
    assert!(all.contains(&(OPT_INFO, REP_ERR_TLS_REQD)), "{all:?}");
    assert!(
        all.contains(&(OPT_SET_META_CONTEXT, REP_ERR_TLS_REQD)),
        "{all:?}"
    );
    assert_eq!(
        done(result).export_index,
        0,
        "the default export is the open one"
    );
}

#[test]
fn denied_exports_are_hidden_and_refused_with_policy() {
    let access = vec![
        ExportAccess::Allowed,
        ExportAccess::Allowed,
        ExportAccess::Denied,
    ];
    let mut handshake = through_tls(TlsPolicy::Required, &[], access.clone());
    let mut input = option(OPT_STRUCTURED_REPLY, &[]);
    input.extend(option(OPT_LIST, &[]));
    input.extend(option(OPT_INFO, &go_data("bob-only")));
    input.extend(option(OPT_LIST_META_CONTEXT, &meta_data("bob-only")));
    input.extend(option(OPT_SET_META_CONTEXT, &meta_data("bob-only")));
    input.extend(option(OPT_GO, &go_data("bob-only")));
    input.extend(option(OPT_GO, &go_data("alice-only")));
    let (out, result) = feed(&mut handshake, &input);
    assert_eq!(listed(&out), vec!["open", "alice-only"]);
    let all = kinds(&out);
    for code in [
        OPT_INFO,
        OPT_LIST_META_CONTEXT,
        OPT_SET_META_CONTEXT,
        OPT_GO,
    ] {
        assert!(all.contains(&(code, REP_ERR_POLICY)), "{code}: {all:?}");
    }
    assert_eq!(done(result).export_index, 1);

    // EXPORT_NAME cannot carry the refusal: the connection ends.
    let mut handshake = through_tls(TlsPolicy::Required, &[], access);
    let (_, result) = feed(&mut handshake, &option(OPT_EXPORT_NAME, b"bob-only"));
    assert_eq!(result, Err(ProtocolError::ExportRefused));

    // The default export is the first one the client may open.
    let access = vec![
        ExportAccess::Denied,
        ExportAccess::Denied,
        ExportAccess::Allowed,
    ];
    let mut handshake = through_tls(TlsPolicy::Optional, &[], access);
    let (_, result) = feed(&mut handshake, &option(OPT_GO, &go_data("")));
    assert_eq!(done(result).export_index, 2);
}

#[test]
fn starttls_splits_anywhere_the_same_way() {
    // The STARTTLS option fed a byte at a time reaches StartTls at its last byte, having
    // consumed exactly the option.
    let mut handshake = Handshake::with_tls(exports(), TlsPolicy::Required);
    let mut input = flags();
    input.extend(option(OPT_STARTTLS, &[]));
    let mut out = Vec::new();
    for (index, byte) in input.iter().enumerate() {
        let progress = handshake.receive(&[*byte], &mut out).unwrap();
        assert_eq!(progress.consumed_bytes, 1);
        let expected = if index + 1 == input.len() {
            HandshakeStatus::StartTls
        } else {
            HandshakeStatus::Continue
        };
        assert_eq!(progress.status, expected);
    }
    assert_eq!(kinds(&out), vec![(OPT_STARTTLS, REP_ACK)]);
}
