//! Change-map metadata contexts in the handshake: `oxpool:changed-since:SNAP` and
//! `oxpool:changed-since:#BOOKMARK`, listed and selected per export through a catalog, beside
//! `base:allocation`; the protocol's list queries (none, a namespace, the change maps' prefix,
//! a full name); ids; the selection bound; and a catalog that offers nothing.
//!
//! The client side is written here from the protocol text, as in `codec_handshake.rs`.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use oxpool_nbd::proto::wire::*;
use oxpool_nbd::proto::{
    validate, BasePin, ChangeBase, ChangeMapCatalog, Command, CommandFlags, Cookie, Errno,
    ExportCaps, ExportInfo, Handshake, HandshakeProgress, HandshakeStatus, MetaContext,
    MetaContextId, Negotiated, ProtocolError, Request, SelectedContext, CHANGE_MAPS_LISTED_MAX,
    CHANGE_MAPS_SELECTED_MAX,
};

fn exports() -> Vec<ExportInfo> {
    ["vol0", "vol1"]
        .iter()
        .map(|name| ExportInfo {
            name: (*name).into(),
            description: String::new(),
            size_bytes: 1 << 30,
            preferred_block_bytes: 16384,
            read_only: false,
            caps: ExportCaps::default(),
        })
        .collect()
}

/// vol0 offers `monday`, `tuesday` and `#weekly`; vol1 offers `many` maps `m0`, `m1`, ...;
/// counts the calls.
#[derive(Debug)]
struct Catalog {
    many: usize,
    calls: Arc<AtomicUsize>,
}

impl Catalog {
    fn of(export_index: usize, many: usize) -> Vec<ChangeBase> {
        match export_index {
            0 => vec![
                ChangeBase::Snapshot("monday".into()),
                ChangeBase::Snapshot("tuesday".into()),
                ChangeBase::Bookmark("weekly".into()),
            ],
            1 => (0..many)
                .map(|i| ChangeBase::Snapshot(format!("m{i}")))
                .collect(),
            _ => Vec::new(),
        }
    }
}

impl ChangeMapCatalog for Catalog {
    /// The base's place in the export's list, and the export: what the selection must
    /// carry back.
    fn pin(&self, export_index: usize, base: &ChangeBase) -> Option<BasePin> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        let at = Catalog::of(export_index, self.many)
            .iter()
            .position(|b| b == base)?;
        Some(BasePin(at as u64, export_index as u64))
    }

    fn offered(&self, export_index: usize, limit: usize) -> Vec<ChangeBase> {
        self.calls.fetch_add(1, Ordering::Relaxed);
        let mut all = Catalog::of(export_index, self.many);
        all.truncate(limit);
        all
    }
}

fn option(option: u32, data: &[u8]) -> Vec<u8> {
    let mut bytes = IHAVEOPT.to_be_bytes().to_vec();
    bytes.extend_from_slice(&option.to_be_bytes());
    bytes.extend_from_slice(&(data.len() as u32).to_be_bytes());
    bytes.extend_from_slice(data);
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

fn go(name: &str) -> Vec<u8> {
    let mut data = (name.len() as u32).to_be_bytes().to_vec();
    data.extend_from_slice(name.as_bytes());
    data.extend_from_slice(&0u16.to_be_bytes());
    option(OPT_GO, &data)
}

/// One option reply: (option, type, data).
type Reply = (u32, u32, Vec<u8>);

fn parse_replies(mut bytes: &[u8]) -> Vec<Reply> {
    let mut replies = Vec::new();
    while !bytes.is_empty() {
        assert!(bytes.len() >= 20, "truncated reply header");
        assert_eq!(
            u64::from_be_bytes(bytes[0..8].try_into().unwrap()),
            OPTION_REPLY_MAGIC
        );
        let option = u32::from_be_bytes(bytes[8..12].try_into().unwrap());
        let kind = u32::from_be_bytes(bytes[12..16].try_into().unwrap());
        let length = u32::from_be_bytes(bytes[16..20].try_into().unwrap()) as usize;
        replies.push((option, kind, bytes[20..20 + length].to_vec()));
        bytes = &bytes[20 + length..];
    }
    replies
}

/// The (id, name) of each META_CONTEXT reply to `option`, and whether the option ended in
/// ACK (else the error reply type).
fn contexts(replies: &[Reply], option: u32) -> (Vec<(u32, String)>, Result<(), u32>) {
    let mut named = Vec::new();
    for (opt, kind, data) in replies.iter().filter(|r| r.0 == option) {
        assert_eq!(*opt, option);
        match *kind {
            REP_META_CONTEXT => named.push((
                u32::from_be_bytes(data[..4].try_into().unwrap()),
                String::from_utf8(data[4..].to_vec()).unwrap(),
            )),
            REP_ACK => return (named, Ok(())),
            error => return (named, Err(error)),
        }
    }
    panic!("no final reply to option {option}: {replies:?}");
}

/// Runs a conversation (structured replies first, then `options`) against a handshake with
/// the test catalog; returns the replies and the outcome.
fn converse(
    options: &[Vec<u8>],
    many: usize,
) -> (
    Vec<Reply>,
    Result<HandshakeProgress, ProtocolError>,
    Arc<AtomicUsize>,
) {
    let calls = Arc::new(AtomicUsize::new(0));
    let mut handshake = Handshake::new(exports());
    handshake.set_change_maps(Box::new(Catalog {
        many,
        calls: calls.clone(),
    }));
    let mut input = (CLIENT_FLAG_FIXED_NEWSTYLE | CLIENT_FLAG_NO_ZEROES)
        .to_be_bytes()
        .to_vec();
    input.extend_from_slice(&option(OPT_STRUCTURED_REPLY, &[]));
    for option in options {
        input.extend_from_slice(option);
    }
    let mut out = Vec::new();
    let result = handshake.receive(&input, &mut out);
    (parse_replies(&out), result, calls)
}

fn list(export: &str, queries: &[&str]) -> Vec<String> {
    let (replies, _, _) = converse(
        &[option(OPT_LIST_META_CONTEXT, &meta_data(export, queries))],
        3,
    );
    let (named, end) = contexts(&replies, OPT_LIST_META_CONTEXT);
    assert_eq!(end, Ok(()), "{queries:?}");
    assert!(named.iter().all(|(id, _)| *id == 0), "list ids are 0");
    named.into_iter().map(|(_, name)| name).collect()
}

fn done(result: Result<HandshakeProgress, ProtocolError>) -> Negotiated {
    match result.expect("handshake ok").status {
        HandshakeStatus::Done(negotiated) => negotiated,
        other => panic!("expected Done, got {other:?}"),
    }
}

#[test]
fn list_answers_each_kind_of_query() {
    let all = [
        "base:allocation",
        "oxpool:changed-since:monday",
        "oxpool:changed-since:tuesday",
        "oxpool:changed-since:#weekly",
    ];
    assert_eq!(list("vol0", &[]), all, "no query: everything");
    assert_eq!(list("vol0", &["oxpool:"]), all[1..], "the namespace");
    assert_eq!(
        list("vol0", &["oxpool:changed-since:"]),
        all[1..],
        "the change maps' prefix"
    );
    assert_eq!(
        list("vol0", &["base:", "oxpool:changed-since:"]),
        all,
        "both namespaces"
    );
    assert_eq!(
        list(
            "vol0",
            &[
                "oxpool:changed-since:#weekly",
                "oxpool:changed-since:nope",
                "oxpool:changed-since:#weekly",
                "oxpool:changed-since:monday",
            ]
        ),
        [
            "oxpool:changed-since:#weekly",
            "oxpool:changed-since:monday"
        ],
        "full names, each once, offered ones only"
    );
    // Not offered, malformed leaves, other namespaces: nothing, and still an ACK.
    for queries in [
        &["oxpool:changed-since:nope"][..],
        &["oxpool:changed-since:#"][..],
        &["oxpool:changed-since:a/b"][..],
        &["oxpool:changed-since:monday@x"][..],
        &["oxpool:other"][..],
        &["qemu:dirty-bitmap:monday"][..],
    ] {
        assert_eq!(list("vol0", queries), Vec::<String>::new(), "{queries:?}");
    }
    // Another export has its own.
    assert_eq!(
        list("vol1", &[]),
        [
            "base:allocation",
            "oxpool:changed-since:m0",
            "oxpool:changed-since:m1",
            "oxpool:changed-since:m2"
        ]
    );
}

#[test]
fn a_long_list_is_cut_at_its_bound() {
    let (replies, _, _) = converse(
        &[option(
            OPT_LIST_META_CONTEXT,
            &meta_data("vol1", &["oxpool:"]),
        )],
        CHANGE_MAPS_LISTED_MAX + 50,
    );
    let (named, end) = contexts(&replies, OPT_LIST_META_CONTEXT);
    assert_eq!(end, Ok(()));
    assert_eq!(named.len(), CHANGE_MAPS_LISTED_MAX);
}

#[test]
fn set_selects_base_allocation_and_offered_change_maps_with_distinct_ids() {
    let (replies, result, _) = converse(
        &[
            option(
                OPT_SET_META_CONTEXT,
                &meta_data(
                    "vol0",
                    &[
                        "oxpool:changed-since:#weekly",
                        "oxpool:changed-since:nope",
                        "base:allocation",
                        "oxpool:changed-since:monday",
                        "oxpool:changed-since:#weekly",
                        "oxpool:changed-since:",
                        "oxpool:",
                    ],
                ),
            ),
            go("vol0"),
        ],
        3,
    );
    let (named, end) = contexts(&replies, OPT_SET_META_CONTEXT);
    assert_eq!(end, Ok(()));
    assert_eq!(
        named,
        [
            (1, "base:allocation".to_string()),
            (2, "oxpool:changed-since:#weekly".to_string()),
            (3, "oxpool:changed-since:monday".to_string()),
        ]
    );
    let negotiated = done(result);
    assert_eq!(
        negotiated.meta_contexts,
        [
            SelectedContext::base_allocation(),
            SelectedContext {
                id: MetaContextId(2),
                context: MetaContext::ChangedSince(
                    ChangeBase::Bookmark("weekly".into()),
                    BasePin(2, 0)
                ),
            },
            SelectedContext {
                id: MetaContextId(3),
                context: MetaContext::ChangedSince(
                    ChangeBase::Snapshot("monday".into()),
                    BasePin(0, 0)
                ),
            },
        ]
    );
    assert_eq!(negotiated.base_allocation(), Some(MetaContextId(1)));
}

#[test]
fn a_change_map_alone_allows_block_status() {
    let (_, result, _) = converse(
        &[
            option(
                OPT_SET_META_CONTEXT,
                &meta_data("vol0", &["oxpool:changed-since:tuesday"]),
            ),
            go("vol0"),
        ],
        3,
    );
    let negotiated = done(result);
    assert_eq!(negotiated.base_allocation(), None);
    assert_eq!(negotiated.meta_contexts.len(), 1);
    let request = Request {
        cookie: Cookie(1),
        command: Command::BlockStatus,
        flags: CommandFlags::NONE,
        offset_bytes: 0,
        length_bytes: 4096,
    };
    assert_eq!(validate(&request, &exports()[0], &negotiated), Ok(()));

    // Not offered: nothing selected, and BLOCK_STATUS is refused.
    let (replies, result, _) = converse(
        &[
            option(
                OPT_SET_META_CONTEXT,
                &meta_data("vol0", &["oxpool:changed-since:friday"]),
            ),
            go("vol0"),
        ],
        3,
    );
    assert_eq!(contexts(&replies, OPT_SET_META_CONTEXT), (vec![], Ok(())));
    let negotiated = done(result);
    assert!(negotiated.meta_contexts.is_empty());
    assert_eq!(
        validate(&request, &exports()[0], &negotiated),
        Err(Errno::Inval)
    );
}

#[test]
fn a_selection_applies_only_to_its_export() {
    let (_, result, _) = converse(
        &[
            option(
                OPT_SET_META_CONTEXT,
                &meta_data("vol0", &["oxpool:changed-since:monday"]),
            ),
            go("vol1"),
        ],
        3,
    );
    assert!(done(result).meta_contexts.is_empty());
    // vol1 does not offer vol0's maps.
    let (replies, _, _) = converse(
        &[option(
            OPT_SET_META_CONTEXT,
            &meta_data("vol1", &["oxpool:changed-since:monday"]),
        )],
        3,
    );
    assert_eq!(contexts(&replies, OPT_SET_META_CONTEXT), (vec![], Ok(())));
}

#[test]
fn too_many_change_maps_are_refused_and_select_nothing() {
    let names: Vec<String> = (0..=CHANGE_MAPS_SELECTED_MAX)
        .map(|i| format!("oxpool:changed-since:m{i}"))
        .collect();
    let mut queries: Vec<&str> = names.iter().map(String::as_str).collect();
    queries.push("base:allocation");
    let (replies, result, _) = converse(
        &[
            option(OPT_SET_META_CONTEXT, &meta_data("vol1", &queries)),
            go("vol1"),
        ],
        100,
    );
    let (named, end) = contexts(&replies, OPT_SET_META_CONTEXT);
    assert!(named.is_empty());
    assert_eq!(end, Err(REP_ERR_TOO_BIG));
    assert!(done(result).meta_contexts.is_empty());
    // Exactly the bound is fine.
    let (replies, result, _) = converse(
        &[
            option(
                OPT_SET_META_CONTEXT,
                &meta_data("vol1", &queries[..CHANGE_MAPS_SELECTED_MAX]),
            ),
            go("vol1"),
        ],
        100,
    );
    let (named, end) = contexts(&replies, OPT_SET_META_CONTEXT);
    assert_eq!(end, Ok(()));
    assert_eq!(named.len(), CHANGE_MAPS_SELECTED_MAX);
    let ids: Vec<u32> = named.iter().map(|(id, _)| *id).collect();
    assert_eq!(
        ids,
        (2..2 + CHANGE_MAPS_SELECTED_MAX as u32).collect::<Vec<_>>()
    );
    assert_eq!(done(result).meta_contexts.len(), CHANGE_MAPS_SELECTED_MAX);
}

#[test]
fn the_catalog_is_asked_only_for_meta_context_options() {
    let (_, result, calls) = converse(&[go("vol0")], 3);
    done(result);
    assert_eq!(calls.load(Ordering::Relaxed), 0);
}

#[test]
fn without_a_catalog_only_base_allocation_is_served() {
    let mut handshake = Handshake::new(exports());
    let mut input = (CLIENT_FLAG_FIXED_NEWSTYLE | CLIENT_FLAG_NO_ZEROES)
        .to_be_bytes()
        .to_vec();
    input.extend_from_slice(&option(OPT_STRUCTURED_REPLY, &[]));
    input.extend_from_slice(&option(
        OPT_LIST_META_CONTEXT,
        &meta_data("vol0", &["oxpool:", "base:"]),
    ));
    input.extend_from_slice(&option(
        OPT_SET_META_CONTEXT,
        &meta_data("vol0", &["oxpool:changed-since:monday", "base:allocation"]),
    ));
    input.extend_from_slice(&go("vol0"));
    let mut out = Vec::new();
    let result = handshake.receive(&input, &mut out);
    let replies = parse_replies(&out);
    assert_eq!(
        contexts(&replies, OPT_LIST_META_CONTEXT),
        (vec![(0, "base:allocation".to_string())], Ok(()))
    );
    assert_eq!(
        contexts(&replies, OPT_SET_META_CONTEXT),
        (vec![(1, "base:allocation".to_string())], Ok(()))
    );
    assert_eq!(
        done(result).meta_contexts,
        [SelectedContext::base_allocation()]
    );
}

#[test]
fn base_names_parse_as_documented() {
    let parse = |leaf: &str| ChangeBase::parse(leaf.as_bytes());
    assert_eq!(parse("snap"), Some(ChangeBase::Snapshot("snap".into())));
    assert_eq!(parse("#bm"), Some(ChangeBase::Bookmark("bm".into())));
    assert_eq!(
        parse("#bm").unwrap().context_name(),
        "oxpool:changed-since:#bm"
    );
    let long = "x".repeat(256);
    assert!(parse(&long).is_some());
    for bad in [
        "",
        "#",
        "##x",
        "a@b",
        "a/b",
        "a#b",
        "a\nb",
        "a\0b",
        &"x".repeat(257),
    ] {
        assert_eq!(parse(bad), None, "{bad:?}");
    }
    assert_eq!(ChangeBase::parse(&[0xff, 0xfe]), None);
}

#[test]
fn tls_forgets_the_plain_text_selection() {
    // The selection is part of what STARTTLS discards (the CVE-2021-3716 rule).
    let mut handshake = Handshake::with_tls(exports(), oxpool_nbd::proto::TlsPolicy::Optional);
    handshake.set_change_maps(Box::new(Catalog {
        many: 3,
        calls: Arc::new(AtomicUsize::new(0)),
    }));
    let mut input = (CLIENT_FLAG_FIXED_NEWSTYLE | CLIENT_FLAG_NO_ZEROES)
        .to_be_bytes()
        .to_vec();
    input.extend_from_slice(&option(OPT_STRUCTURED_REPLY, &[]));
    input.extend_from_slice(&option(
        OPT_SET_META_CONTEXT,
        &meta_data("vol0", &["oxpool:changed-since:monday"]),
    ));
    input.extend_from_slice(&option(OPT_STARTTLS, &[]));
    let mut out = Vec::new();
    let progress = handshake.receive(&input, &mut out).unwrap();
    assert_eq!(progress.status, HandshakeStatus::StartTls);
    handshake
        .tls_established(vec![oxpool_nbd::proto::ExportAccess::Allowed; 2])
        .unwrap();
    let mut out = Vec::new();
    let mut input = option(OPT_STRUCTURED_REPLY, &[]);
    input.extend_from_slice(&go("vol0"));
    let result = handshake.receive(&input, &mut out);
    assert!(done(result).meta_contexts.is_empty());
}
