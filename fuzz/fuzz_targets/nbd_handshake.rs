#![no_main]
//! The NBD server handshake on arbitrary client bytes: never panics, and gives the same
//! replies and outcome whether the bytes arrive at once or in pieces. With TLS: the plain-text
//! phase obeys the TLS policy, nothing negotiated in plain text survives STARTTLS, bytes
//! after STARTTLS in plain text end the connection, and refused exports are never listed.
//!
//! Input: byte 0 picks the piece size (1..=64), whether to prepend valid client flags (so the
//! fuzzer starts in option haggling) and whether TLS is in play. With TLS, byte 1 picks the
//! policy (off, optional, required) and each export's access before and after TLS, and bytes
//! 2..4 say how many of the rest are plain text; the bytes after them are what the client
//! sends through TLS (the server hands them to the codec decrypted, after
//! `tls_established`).
//!
//! Change maps: export "vol0" offers `oxpool:changed-since:snap` and `...:#bm` (a fixed
//! catalog), "ro" none. Every context a reply names is one of those or `base:allocation`;
//! listed ids are 0, selected ids are distinct and non-zero; what transmission gets is
//! bounded by `CHANGE_MAPS_SELECTED_MAX` and is what the last SET answered.

use libfuzzer_sys::fuzz_target;
use oxpool_nbd::proto::wire::{
    CLIENT_FLAG_FIXED_NEWSTYLE, CLIENT_FLAG_NO_ZEROES, OPTION_REPLY_MAGIC, OPT_ABORT,
    OPT_LIST_META_CONTEXT, OPT_SET_META_CONTEXT, OPT_STARTTLS, OPT_STRUCTURED_REPLY, REP_ACK,
    REP_ERR_INVALID, REP_ERR_TLS_REQD, REP_ERR_TOO_BIG, REP_META_CONTEXT, REP_SERVER,
};
use oxpool_nbd::proto::{
    BasePin, ChangeBase, ChangeMapCatalog, ExportAccess, ExportCaps, ExportInfo, Handshake,
    HandshakeStatus, ProtocolError, TlsPolicy, CHANGE_MAPS_SELECTED_MAX, REPLIES_PAUSE_BYTES,
};

/// "vol0" offers two change maps, "ro" none.
#[derive(Debug)]
struct Catalog;

impl Catalog {
    fn of(export_index: usize) -> Vec<ChangeBase> {
        if export_index == 0 {
            vec![
                ChangeBase::Snapshot("snap".into()),
                ChangeBase::Bookmark("bm".into()),
            ]
        } else {
            Vec::new()
        }
    }
}

impl ChangeMapCatalog for Catalog {
    fn pin(&self, export_index: usize, base: &ChangeBase) -> Option<BasePin> {
        let at = Catalog::of(export_index).iter().position(|b| b == base)?;
        Some(BasePin(at as u64, export_index as u64))
    }

    fn offered(&self, export_index: usize, limit: usize) -> Vec<ChangeBase> {
        let mut all = Catalog::of(export_index);
        all.truncate(limit);
        all
    }
}

/// Every context name a reply may carry.
const NAMES: [&[u8]; 3] = [
    b"base:allocation",
    b"oxpool:changed-since:snap",
    b"oxpool:changed-since:#bm",
];

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

fn access(bits: u8) -> Vec<ExportAccess> {
    (0..2)
        .map(|i| match (bits >> (2 * i)) & 3 {
            0 | 3 => ExportAccess::Allowed,
            1 => ExportAccess::TlsRequired,
            _ => ExportAccess::Denied,
        })
        .collect()
}

/// The TLS part of a run: policy, access before and after TLS.
#[derive(Clone, Copy)]
struct Tls {
    policy: TlsPolicy,
    before: u8,
    after: u8,
}

/// What a run produced.
#[derive(Debug, PartialEq)]
struct Outcome {
    /// Replies sent in plain text, then through TLS.
    plain_out: Vec<u8>,
    tls_out: Vec<u8>,
    consumed: usize,
    result: Result<HandshakeStatus, ProtocolError>,
    tls_started: bool,
}

/// Feeds `plain` then (if STARTTLS succeeded exactly at its end) `secure`, in pieces of
/// `piece` bytes, as the server loop does.
fn drive(plain: &[u8], secure: &[u8], piece: usize, tls: Option<Tls>) -> Outcome {
    let mut handshake = match tls {
        Some(tls) => {
            let mut handshake = Handshake::with_tls(exports(), tls.policy);
            handshake.set_access(access(tls.before));
            handshake
        }
        None => Handshake::new(exports()),
    };
    handshake.set_change_maps(Box::new(Catalog));
    let mut outcome = Outcome {
        plain_out: Vec::new(),
        tls_out: Vec::new(),
        consumed: 0,
        result: Ok(HandshakeStatus::Continue),
        tls_started: false,
    };
    let mut awaiting_tls = false;
    for (phase, input) in [plain, secure].into_iter().enumerate() {
        if phase == 1 {
            if !awaiting_tls {
                break;
            }
            // The TLS handshake "succeeded": the rest arrives through TLS.
            let after = tls.map_or(0, |t| t.after);
            handshake
                .tls_established(access(after))
                .expect("tls_established after StartTls");
            outcome.tls_started = true;
            awaiting_tls = false;
        }
        let mut position = 0;
        while position < input.len() {
            let end = (position + piece).min(input.len());
            let out = if phase == 0 {
                &mut outcome.plain_out
            } else {
                &mut outcome.tls_out
            };
            let out_before = out.len();
            match handshake.receive(&input[position..end], out) {
                Err(error) => {
                    // A finished machine stays finished.
                    assert_eq!(
                        handshake.receive(&[0], &mut Vec::new()),
                        Err(ProtocolError::Finished)
                    );
                    outcome.consumed += position;
                    outcome.result = Err(error);
                    return outcome;
                }
                Ok(progress) => {
                    assert!(progress.consumed_bytes <= end - position);
                    position += progress.consumed_bytes;
                    match progress.status {
                        HandshakeStatus::Continue => {
                            // All of it, or it paused after an option that passed the bound.
                            assert!(
                                position == end
                                    || (progress.consumed_bytes > 0
                                        && out.len() - out_before >= REPLIES_PAUSE_BYTES),
                                "Continue consumes all input unless its replies pass the bound"
                            );
                        }
                        HandshakeStatus::StartTls => {
                            assert_eq!(position, end, "StartTls only at the end of input");
                            assert!(tls.is_some_and(|t| t.policy != TlsPolicy::Off));
                            awaiting_tls = true;
                        }
                        status => {
                            outcome.consumed += position;
                            outcome.result = Ok(status);
                            return outcome;
                        }
                    }
                }
            }
        }
        outcome.consumed += position;
    }
    if awaiting_tls {
        outcome.result = Ok(HandshakeStatus::StartTls);
    }
    outcome
}

/// Option replies at the start of `out`: (option, type, data); stops at anything else (the
/// EXPORT_NAME reply, which is not an option reply).
fn replies(mut out: &[u8]) -> Vec<(u32, u32, Vec<u8>)> {
    let mut replies = Vec::new();
    while out.len() >= 20 && out[..8] == OPTION_REPLY_MAGIC.to_be_bytes() {
        let option = u32::from_be_bytes(out[8..12].try_into().unwrap());
        let kind = u32::from_be_bytes(out[12..16].try_into().unwrap());
        let len = u32::from_be_bytes(out[16..20].try_into().unwrap()) as usize;
        assert!(out.len() >= 20 + len, "truncated option reply");
        replies.push((option, kind, out[20..20 + len].to_vec()));
        out = &out[20 + len..];
    }
    replies
}

/// The protocol's TLS rules, on one run.
fn check_tls_rules(outcome: &Outcome, tls: Tls) {
    let names = ["vol0", "ro"];
    // Refused exports are never listed.
    for (out, bits) in [
        (&outcome.plain_out, tls.before),
        (&outcome.tls_out, tls.after),
    ] {
        let access = access(bits);
        for (_, kind, data) in replies(out) {
            if kind != REP_SERVER || data.len() < 4 {
                continue;
            }
            let name_len = u32::from_be_bytes(data[..4].try_into().unwrap()) as usize;
            let Some(name) = data.get(4..4 + name_len) else {
                continue;
            };
            if let Some(index) = names.iter().position(|n| n.as_bytes() == name) {
                assert_eq!(
                    access[index],
                    ExportAccess::Allowed,
                    "listed a refused export"
                );
            }
        }
    }
    // Required: nothing but refusals, ABORT's and STARTTLS's answers before TLS.
    if tls.policy == TlsPolicy::Required {
        for (option, kind, _) in replies(&outcome.plain_out) {
            let allowed = kind == REP_ERR_TLS_REQD
                || kind == REP_ERR_TOO_BIG
                || (option == OPT_ABORT && kind == REP_ACK)
                || (option == OPT_STARTTLS && (kind == REP_ACK || kind == REP_ERR_INVALID));
            assert!(allowed, "option {option} answered {kind:#x} before TLS");
        }
        if let Ok(HandshakeStatus::Done(_)) = outcome.result {
            assert!(
                outcome.tls_started,
                "transmission without TLS in required mode"
            );
        }
    }
    // Nothing negotiated in plain text survives: structured replies after TLS were
    // acknowledged through TLS.
    if outcome.tls_started {
        if let Ok(HandshakeStatus::Done(negotiated)) = &outcome.result {
            if negotiated.structured_replies {
                let acked = replies(&outcome.tls_out)
                    .iter()
                    .any(|(option, kind, _)| *option == OPT_STRUCTURED_REPLY && *kind == REP_ACK);
                assert!(acked, "structured replies kept from plain text");
            }
        }
    }
}

/// The meta context rules, on one run.
fn check_meta_rules(outcome: &Outcome) {
    let mut last_set: Option<Vec<(u32, Vec<u8>)>> = None;
    let mut current: Vec<(u32, Vec<u8>)> = Vec::new();
    for (phase, out) in [&outcome.plain_out, &outcome.tls_out]
        .into_iter()
        .enumerate()
    {
        for (option, kind, data) in replies(out) {
            if option != OPT_LIST_META_CONTEXT && option != OPT_SET_META_CONTEXT {
                continue;
            }
            if kind == REP_META_CONTEXT {
                assert!(data.len() >= 4);
                let id = u32::from_be_bytes(data[..4].try_into().unwrap());
                let name = data[4..].to_vec();
                assert!(NAMES.contains(&name.as_slice()), "unexpected context");
                if option == OPT_LIST_META_CONTEXT {
                    assert_eq!(id, 0, "a listed context with an id");
                } else {
                    assert_ne!(id, 0, "a selected context with id 0");
                    assert!(
                        current.iter().all(|(other, _)| *other != id),
                        "two contexts with one id"
                    );
                    current.push((id, name));
                }
                continue;
            }
            if option == OPT_SET_META_CONTEXT {
                // The final reply to a SET: an ACK selects what it named, an error nothing.
                let selected = std::mem::take(&mut current);
                last_set = Some(if kind == REP_ACK {
                    selected
                } else {
                    Vec::new()
                });
            }
        }
        // STARTTLS forgets the selection made in plain text.
        if phase == 0 && outcome.tls_started {
            last_set = None;
        }
    }
    if let Ok(HandshakeStatus::Done(negotiated)) = &outcome.result {
        assert!(negotiated.meta_contexts.len() <= 1 + CHANGE_MAPS_SELECTED_MAX);
        // What transmission gets is what the last SET answered (or nothing, if that SET
        // named another export than the one chosen).
        if !negotiated.meta_contexts.is_empty() {
            let answered = last_set.clone().unwrap_or_default();
            let got: Vec<(u32, Vec<u8>)> = negotiated
                .meta_contexts
                .iter()
                .map(|c| (c.id.0, c.context.name().into_bytes()))
                .collect();
            assert_eq!(got, answered, "transmission got another selection");
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&control, rest)) = data.split_first() else {
        return;
    };
    let piece = usize::from(control & 0x3f) + 1;
    let (tls, stream, secure) = if control & 0x80 != 0 {
        let [mode, len_hi, len_lo, rest @ ..] = rest else {
            return;
        };
        let policy = match mode % 3 {
            0 => TlsPolicy::Off,
            1 => TlsPolicy::Optional,
            _ => TlsPolicy::Required,
        };
        let tls = Tls {
            policy,
            before: (mode >> 2) & 0xf,
            after: mode >> 6 | ((mode >> 4) & 0xc),
        };
        let plain_len = (usize::from(*len_hi) << 8 | usize::from(*len_lo)).min(rest.len());
        let (plain, secure) = rest.split_at(plain_len);
        (Some(tls), plain, secure)
    } else {
        (None, rest, &[][..])
    };
    let mut input = Vec::with_capacity(stream.len() + 4);
    if control & 0x40 != 0 {
        input
            .extend_from_slice(&(CLIENT_FLAG_FIXED_NEWSTYLE | CLIENT_FLAG_NO_ZEROES).to_be_bytes());
    }
    input.extend_from_slice(stream);

    let whole = drive(&input, secure, input.len().max(secure.len()).max(1), tls);
    let split = drive(&input, secure, piece, tls);
    assert_eq!(whole.result, split.result);
    assert_eq!(whole.tls_started, split.tls_started);
    if whole.result.is_ok() {
        assert_eq!(whole.plain_out, split.plain_out);
        assert_eq!(whole.tls_out, split.tls_out);
        assert_eq!(whole.consumed, split.consumed);
    }
    if let Some(tls) = tls {
        check_tls_rules(&whole, tls);
        check_tls_rules(&split, tls);
    }
    check_meta_rules(&whole);
});
