//! Server side of the fixed newstyle handshake, as a sans-I/O state machine.
//!
//! The caller owns the socket:
//!
//! 1. send [`Handshake::greeting`];
//! 2. feed every received byte to [`Handshake::receive`], which appends replies to `out` and
//!    says how many input bytes it used;
//! 3. send `out` after each call, whatever the status;
//! 4. on [`HandshakeStatus::Done`] switch to the transmission phase (input bytes after
//!    `consumed_bytes` belong to it); on [`HandshakeStatus::Abort`] close after sending; on
//!    `Err` close (a hard disconnect).
//!
//! TLS (`NBD_OPT_STARTTLS`): with a [`TlsPolicy`] other than `Off`, STARTTLS is answered
//! `NBD_REP_ACK` and `receive` returns [`HandshakeStatus::StartTls`]; the caller sends the ACK,
//! runs the TLS handshake as a server on the same socket, and calls
//! [`Handshake::tls_established`], which forgets everything negotiated in plain text (the
//! protocol's rule since nbdkit's CVE-2021-3716). Bytes that follow the STARTTLS option in the
//! same input are plain text injected before the TLS handshake: an error that ends the
//! connection. Under `TlsPolicy::Required` every option before STARTTLS but ABORT is answered
//! `NBD_REP_ERR_TLS_REQD` (its data read first, so the stream stays in step), and
//! `NBD_OPT_EXPORT_NAME`, which has no error reply, ends the connection.
//!
//! Access: [`Handshake::set_access`] says per export whether this client may open it
//! ([`ExportAccess`]); exports it may not open are not listed, and GO, INFO and the meta
//! context options naming them are refused (`NBD_REP_ERR_POLICY`, or `NBD_REP_ERR_TLS_REQD`
//! when TLS would allow them).
//!
//! Exports that change while a handshake runs: the export list is fixed when the handshake
//! starts, but an administrator may rename or remove exports before the client chooses one.
//! [`Handshake::set_offer_check`] lets the codec ask, at GO and EXPORT_NAME, whether the
//! export chosen is still offered under the name the list gave it; if not (say two volumes
//! swapped names), GO is answered `NBD_REP_ERR_UNKNOWN` and EXPORT_NAME ends the connection,
//! so a client never opens a volume under a name that, by then, means another one.
//!
//! Bounds: an option's data is buffered only up to [`MAX_OPTION_DATA_BYTES`] (larger options
//! are skipped byte by byte and answered `NBD_REP_ERR_TOO_BIG`); a handshake takes at most
//! [`MAX_OPTIONS_PER_HANDSHAKE`] options; the replies to one option are bounded by the size of
//! the export list (LIST), by [`CHANGE_MAPS_LISTED_MAX`] context names (LIST_META_CONTEXT), or
//! by a few hundred bytes (everything else); and one call of [`Handshake::receive`] stops
//! after the option whose replies pass [`REPLIES_PAUSE_BYTES`], so that a packet of options
//! is answered a part at a time, not all at once in memory.

use std::fmt;

use super::error::ProtocolError;
use super::meta::{
    BasePin, ChangeBase, ChangeMapCatalog, EmptyCatalog, MetaContext, SelectedContext,
    CHANGED_SINCE_PREFIX, CHANGE_MAPS_LISTED_MAX, CHANGE_MAPS_SELECTED_MAX, OXPOOL_NAMESPACE,
};
use super::types::{
    EnteredBy, ExportAccess, ExportInfo, MetaContextId, Negotiated, TlsPolicy, TransmissionFlags,
};
use super::types::{MAX_BLOCK_BYTES, MIN_BLOCK_BYTES};
use super::wire;

/// Size of the server greeting.
pub const GREETING_BYTES: usize = 18;

/// Largest option data the server buffers. Real clients send a few hundred bytes at most
/// (an export name and a few meta context queries); anything larger is skipped unread.
pub const MAX_OPTION_DATA_BYTES: u32 = 64 * 1024;

/// Most options one handshake may send before the server hangs up. Generous enough for
/// `nbdinfo --list` over many exports (a few options per export), small enough that a client
/// cannot keep a connection in negotiation forever.
pub const MAX_OPTIONS_PER_HANDSHAKE: u32 = 4096;

/// Replies one call of [`Handshake::receive`] appends before it stops, after the option that
/// passed it, for the caller to send them. Otherwise a packet of 4096 LIST options of 16
/// bytes (64 KiB) against 100 exports built 20 MB of replies before anything was sent.
pub const REPLIES_PAUSE_BYTES: usize = 64 * 1024;

/// Zero bytes that follow the EXPORT_NAME reply unless the client asked for NO_ZEROES.
const EXPORT_NAME_PADDING_BYTES: usize = 124;

/// Size of the client flags field.
const CLIENT_FLAGS_BYTES: usize = 4;
/// Size of an option header: magic (8), option (4), length (4).
const OPTION_HEADER_BYTES: usize = 16;

/// What the caller does after a [`Handshake::receive`] call (always after sending `out`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HandshakeStatus {
    /// Negotiation goes on: read more bytes and call `receive` again.
    Continue,
    /// Negotiation succeeded (GO or EXPORT_NAME): enter the transmission phase.
    Done(Negotiated),
    /// The client sent `NBD_OPT_ABORT`: close the connection after sending `out`.
    Abort,
    /// The client sent `NBD_OPT_STARTTLS` and `out` holds its ACK: send it, run the TLS
    /// handshake (server side) on the connection, then call [`Handshake::tls_established`]
    /// and go on receiving, now through TLS. If the TLS handshake fails, close.
    StartTls,
}

/// Result of one [`Handshake::receive`] call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HandshakeProgress {
    /// Input bytes used. Less than the input only when the status is `Done` or `Abort`; the
    /// rest then belongs to the transmission phase (or is to be dropped).
    pub consumed_bytes: usize,
    /// What to do next.
    pub status: HandshakeStatus,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Waiting for the 32-bit client flags.
    ClientFlags,
    /// Waiting for (the rest of) an option header.
    OptionHeader,
    /// Gathering `length_bytes` of option data into `Handshake::data`.
    OptionData { option: u32, length_bytes: u32 },
    /// Dropping the data of an oversized option; answered with ERR_TOO_BIG at the end.
    SkipOption { option: u32, remaining_bytes: u32 },
    /// STARTTLS was acknowledged: no input is accepted until [`Handshake::tls_established`]
    /// (any byte now would be plain text sent before the TLS handshake).
    AwaitingTls,
    /// GO, EXPORT_NAME, ABORT or an error happened: no more input is accepted.
    Finished,
}

/// Server-side negotiation state machine (fixed newstyle, NO_ZEROES, STARTTLS).
#[derive(Debug)]
pub struct Handshake {
    exports: Vec<ExportInfo>,
    /// Per export (same indices), whether this client may open it; empty: every export.
    access: Vec<ExportAccess>,
    tls_policy: TlsPolicy,
    /// The TLS handshake succeeded: options now arrive through TLS.
    tls_active: bool,
    state: State,
    /// Partial fixed-size field (client flags or option header) split across reads.
    header: [u8; OPTION_HEADER_BYTES],
    header_filled_bytes: usize,
    /// Option data; never longer than `MAX_OPTION_DATA_BYTES`.
    data: Vec<u8>,
    no_zeroes: bool,
    structured_replies: bool,
    /// The export the last SET_META_CONTEXT named and the contexts it selected there, if
    /// any; they apply only if the client then chooses that export.
    meta_selection: Option<(usize, Vec<SelectedContext>)>,
    /// Which change maps each export offers (asked only for the meta context options).
    change_maps: Box<dyn ChangeMapCatalog + Send>,
    options_received: u32,
    /// What an empty export name selects.
    default_export: DefaultExport,
    /// Whether a chosen export is still offered under its listed name.
    offer_check: Box<dyn OfferCheck + Send>,
}

/// Whether the exports a handshake lists are still offered as listed, asked when a client
/// chooses one (GO, EXPORT_NAME).
pub trait OfferCheck: fmt::Debug {
    /// Whether export `export_index` (of the handshake's list) is still offered under the
    /// name the list gives it.
    fn still_offered(&self, export_index: usize) -> bool;
}

/// The export list never changes: every export is still offered.
#[derive(Clone, Copy, Debug, Default)]
pub struct FixedOffer;

impl OfferCheck for FixedOffer {
    fn still_offered(&self, _: usize) -> bool {
        true
    }
}

/// Which export an empty export name (GO, INFO, EXPORT_NAME, the meta context options) may
/// select. In either case it selects one only when it is the sole export this client may open
/// (see [`Handshake::find_export`]); never "the first one" of several, which changes with
/// every export added in front of it and so sends the same client URI to another disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum DefaultExport {
    /// Whichever export is the sole one (a fixed list of exports).
    Sole,
    /// This export only, or none: a server whose exports change pins its default, so that a
    /// client reconnecting without a name never lands on another volume, even one left
    /// alone after the pinned one was removed.
    Fixed(Option<usize>),
}

/// Why an export name selects no export.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum NoExport {
    /// No export has that name.
    Unknown,
    /// The name is empty and this client may open several exports: none is the default.
    Several,
    /// The name is empty, and the export the server pinned as its default was removed.
    DefaultGone,
}

impl NoExport {
    /// The message of the option's error reply (`NBD_REP_ERR_UNKNOWN` in every case: the
    /// client asked for an export that, as named, does not exist).
    fn message(self) -> &'static [u8] {
        match self {
            NoExport::Unknown => b"unknown export",
            NoExport::Several => {
                b"several exports are offered, so an empty export name selects none: \
                  name one (nbdinfo --list shows them)"
            }
            NoExport::DefaultGone => {
                b"the export an empty export name selected is no longer offered: \
                  name an export (nbdinfo --list shows them)"
            }
        }
    }
}

impl Handshake {
    /// A handshake offering `exports`, without TLS (STARTTLS is answered
    /// `NBD_REP_ERR_UNSUP`). An empty name in GO/INFO/EXPORT_NAME selects the only export this
    /// client may open (unless an export is literally named ""); with several, it selects
    /// none (`NBD_REP_ERR_UNKNOWN`, or the connection closes for EXPORT_NAME).
    pub fn new(exports: Vec<ExportInfo>) -> Self {
        Handshake::with_tls(exports, TlsPolicy::Off)
    }

    /// A handshake offering `exports` under `tls_policy`.
    pub fn with_tls(exports: Vec<ExportInfo>, tls_policy: TlsPolicy) -> Self {
        for export in &exports {
            debug_assert!(export.name.len() <= wire::MAX_STRING_BYTES);
            debug_assert!(export.description.len() <= wire::MAX_STRING_BYTES);
        }
        Handshake {
            exports,
            access: Vec::new(),
            tls_policy,
            tls_active: false,
            state: State::ClientFlags,
            header: [0; OPTION_HEADER_BYTES],
            header_filled_bytes: 0,
            data: Vec::new(),
            no_zeroes: false,
            structured_replies: false,
            meta_selection: None,
            change_maps: Box::new(EmptyCatalog),
            options_received: 0,
            default_export: DefaultExport::Sole,
            offer_check: Box::new(FixedOffer),
        }
    }

    /// Pins what an empty export name may select: export `index`, and only while it is the
    /// sole export this client may open (refused with the reason if the client may open no
    /// export at all); with `None`, nothing (`NBD_REP_ERR_UNKNOWN`).
    pub fn set_default_export(&mut self, index: Option<usize>) {
        debug_assert!(index.is_none_or(|i| i < self.exports.len()));
        self.default_export = DefaultExport::Fixed(index.filter(|&i| i < self.exports.len()));
    }

    /// Says which change maps (`oxpool:changed-since:*` contexts) each export offers; without
    /// a catalog, none. Asked only when a client lists or selects meta contexts.
    pub fn set_change_maps(&mut self, catalog: Box<dyn ChangeMapCatalog + Send>) {
        self.change_maps = catalog;
    }

    /// Says how to learn, when a client chooses an export, whether it is still offered under
    /// the name the handshake listed; without a check, the list is taken as fixed.
    pub fn set_offer_check(&mut self, check: Box<dyn OfferCheck + Send>) {
        self.offer_check = check;
    }

    /// The exports this handshake offers (indexed by [`Negotiated::export_index`]).
    pub fn exports(&self) -> &[ExportInfo] {
        &self.exports
    }

    /// Says which exports this client may open, one entry per export (same order); applies
    /// to the options that follow. A list of another length is a caller bug: every export is
    /// then refused (`Denied`), which fails safe.
    pub fn set_access(&mut self, access: Vec<ExportAccess>) {
        debug_assert_eq!(access.len(), self.exports.len());
        self.access = if access.len() == self.exports.len() {
            access
        } else {
            vec![ExportAccess::Denied; self.exports.len()]
        };
    }

    /// Whether the TLS handshake has succeeded on this connection.
    pub fn tls_active(&self) -> bool {
        self.tls_active
    }

    /// The TLS handshake that followed [`HandshakeStatus::StartTls`] succeeded: negotiation
    /// starts over through TLS, with nothing kept from the plain-text options (structured
    /// replies, meta contexts), and with `access` for this client (now that its identity is
    /// known). The client flags and the option count are kept: they are not options, and the
    /// count bounds the whole handshake. Called in any other state, the handshake is over.
    pub fn tls_established(&mut self, access: Vec<ExportAccess>) -> Result<(), ProtocolError> {
        if self.state != State::AwaitingTls {
            self.state = State::Finished;
            return Err(ProtocolError::Finished);
        }
        self.tls_active = true;
        self.structured_replies = false;
        self.meta_selection = None;
        self.data = Vec::new();
        self.header_filled_bytes = 0;
        self.set_access(access);
        self.state = State::OptionHeader;
        Ok(())
    }

    /// The bytes the server sends first: `NBDMAGIC`, `IHAVEOPT`, handshake flags
    /// (FIXED_NEWSTYLE | NO_ZEROES).
    pub fn greeting(&self) -> [u8; GREETING_BYTES] {
        let mut greeting = [0u8; GREETING_BYTES];
        greeting[0..8].copy_from_slice(&wire::NBDMAGIC.to_be_bytes());
        greeting[8..16].copy_from_slice(&wire::IHAVEOPT.to_be_bytes());
        let flags = wire::HANDSHAKE_FLAG_FIXED_NEWSTYLE | wire::HANDSHAKE_FLAG_NO_ZEROES;
        greeting[16..18].copy_from_slice(&flags.to_be_bytes());
        greeting
    }

    /// Feeds received bytes (any split, down to one byte at a time); appends the replies to
    /// `out`.
    ///
    /// Processes every complete option in `input` until the input ends, the handshake
    /// finishes, or this call's replies pass [`REPLIES_PAUSE_BYTES`] (then `Continue` with
    /// less than all of `input` consumed: the caller sends `out` and gives the rest again).
    /// On `Err` the connection must be closed; `out` may hold replies to earlier options of
    /// the same call, which the caller may send or drop.
    pub fn receive(
        &mut self,
        input: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<HandshakeProgress, ProtocolError> {
        let result = self.receive_inner(input, out);
        if result.is_err() {
            self.state = State::Finished;
        }
        result
    }

    fn receive_inner(
        &mut self,
        input: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<HandshakeProgress, ProtocolError> {
        let mut position = 0usize;
        let out_start_bytes = out.len();
        let paused = |position: usize, out: &Vec<u8>| {
            (out.len() - out_start_bytes >= REPLIES_PAUSE_BYTES).then_some(HandshakeProgress {
                consumed_bytes: position,
                status: HandshakeStatus::Continue,
            })
        };
        // Every pass consumes input or moves to a state that needs input (a zero-length
        // option is processed and moves on to the next header), so the loop ends.
        loop {
            match self.state {
                State::Finished => return Err(ProtocolError::Finished),
                State::AwaitingTls => return Err(ProtocolError::DataAfterStartTls),
                State::ClientFlags => {
                    if !self.fill_header(CLIENT_FLAGS_BYTES, input, &mut position) {
                        break;
                    }
                    let flags = read_u32(&self.header, 0);
                    self.header_filled_bytes = 0;
                    let known = wire::CLIENT_FLAG_FIXED_NEWSTYLE | wire::CLIENT_FLAG_NO_ZEROES;
                    if flags & !known != 0 {
                        return Err(ProtocolError::UnknownClientFlags { flags });
                    }
                    // A client without FIXED_NEWSTYLE is served the same way: it only sends
                    // options it knows, and the protocol lets servers honour fixed newstyle
                    // from such clients.
                    self.no_zeroes = flags & wire::CLIENT_FLAG_NO_ZEROES != 0;
                    self.state = State::OptionHeader;
                }
                State::OptionHeader => {
                    if !self.fill_header(OPTION_HEADER_BYTES, input, &mut position) {
                        break;
                    }
                    self.header_filled_bytes = 0;
                    self.start_option()?;
                }
                State::OptionData {
                    option,
                    length_bytes,
                } => {
                    let wanted = length_bytes as usize - self.data.len();
                    let take = wanted.min(input.len() - position);
                    self.data
                        .extend_from_slice(&input[position..position + take]);
                    position += take;
                    if self.data.len() < length_bytes as usize {
                        break;
                    }
                    self.state = State::OptionHeader;
                    let status = self.process_option(option, out)?;
                    if status == HandshakeStatus::StartTls {
                        self.state = State::AwaitingTls;
                        self.data = Vec::new();
                        if position < input.len() {
                            // A correct client sends its ClientHello only after reading the
                            // ACK: bytes already here are plain text slipped in before TLS.
                            self.state = State::Finished;
                            return Err(ProtocolError::DataAfterStartTls);
                        }
                        return Ok(HandshakeProgress {
                            consumed_bytes: position,
                            status,
                        });
                    }
                    if status != HandshakeStatus::Continue {
                        self.state = State::Finished;
                        self.data = Vec::new();
                        return Ok(HandshakeProgress {
                            consumed_bytes: position,
                            status,
                        });
                    }
                    if let Some(progress) = paused(position, out) {
                        return Ok(progress);
                    }
                }
                State::SkipOption {
                    option,
                    remaining_bytes,
                } => {
                    let available = u32::try_from(input.len() - position).unwrap_or(u32::MAX);
                    let take = remaining_bytes.min(available);
                    position += take as usize;
                    let remaining_bytes = remaining_bytes - take;
                    if remaining_bytes > 0 {
                        self.state = State::SkipOption {
                            option,
                            remaining_bytes,
                        };
                        break;
                    }
                    put_option_reply(
                        out,
                        option,
                        wire::REP_ERR_TOO_BIG,
                        &[b"option data too large"],
                    );
                    self.state = State::OptionHeader;
                    if let Some(progress) = paused(position, out) {
                        return Ok(progress);
                    }
                }
            }
        }
        debug_assert_eq!(position, input.len());
        Ok(HandshakeProgress {
            consumed_bytes: position,
            status: HandshakeStatus::Continue,
        })
    }

    /// Copies input into the partial header until it holds `wanted` bytes; false if the input
    /// ran out first.
    fn fill_header(&mut self, wanted: usize, input: &[u8], position: &mut usize) -> bool {
        let take = (wanted - self.header_filled_bytes).min(input.len() - *position);
        self.header[self.header_filled_bytes..self.header_filled_bytes + take]
            .copy_from_slice(&input[*position..*position + take]);
        self.header_filled_bytes += take;
        *position += take;
        self.header_filled_bytes == wanted
    }

    /// Decides what to do with the option whose header is in `self.header`.
    fn start_option(&mut self) -> Result<(), ProtocolError> {
        let magic = u64::from_be_bytes(self.header[0..8].try_into().expect("8 bytes"));
        let option = read_u32(&self.header, 8);
        let length_bytes = read_u32(&self.header, 12);
        if magic != wire::IHAVEOPT {
            return Err(ProtocolError::BadOptionMagic { found: magic });
        }
        self.options_received += 1;
        if self.options_received > MAX_OPTIONS_PER_HANDSHAKE {
            return Err(ProtocolError::TooManyOptions {
                limit: MAX_OPTIONS_PER_HANDSHAKE,
            });
        }
        if option == wire::OPT_EXPORT_NAME && self.tls_still_required() {
            // The protocol: a server that requires TLS must drop a client that sends
            // EXPORT_NAME first, since that option cannot carry an error.
            return Err(ProtocolError::TlsRequired);
        }
        if option == wire::OPT_EXPORT_NAME && length_bytes as usize > wire::MAX_STRING_BYTES {
            // No error reply exists for EXPORT_NAME, and no export has such a name.
            return Err(ProtocolError::ExportNameTooLong { length_bytes });
        }
        if length_bytes > MAX_OPTION_DATA_BYTES {
            self.state = State::SkipOption {
                option,
                remaining_bytes: length_bytes,
            };
        } else {
            self.data.clear();
            // Bounded by the check above.
            self.data.reserve(length_bytes as usize);
            self.state = State::OptionData {
                option,
                length_bytes,
            };
        }
        Ok(())
    }

    /// TLS is required and not yet established.
    fn tls_still_required(&self) -> bool {
        self.tls_policy == TlsPolicy::Required && !self.tls_active
    }

    /// Answers a complete option whose data is in `self.data`.
    fn process_option(
        &mut self,
        option: u32,
        out: &mut Vec<u8>,
    ) -> Result<HandshakeStatus, ProtocolError> {
        if option == wire::OPT_STARTTLS {
            return Ok(self.start_tls(out));
        }
        if self.tls_still_required() && option != wire::OPT_ABORT {
            // Its data was read in full first, so the next option header is in step.
            put_option_reply(
                out,
                option,
                wire::REP_ERR_TLS_REQD,
                &[b"TLS is required: send NBD_OPT_STARTTLS first"],
            );
            return Ok(HandshakeStatus::Continue);
        }
        match option {
            wire::OPT_EXPORT_NAME => self.export_name(out),
            wire::OPT_ABORT => {
                // The protocol asks servers to ignore data sent with ABORT.
                put_option_reply(out, option, wire::REP_ACK, &[]);
                Ok(HandshakeStatus::Abort)
            }
            wire::OPT_LIST => {
                if self.data.is_empty() {
                    for (index, export) in self.exports.iter().enumerate() {
                        if self.access(index) != ExportAccess::Allowed {
                            // Not listed: this client may not open it (here, or yet).
                            continue;
                        }
                        let name = export.name.as_bytes();
                        let name_len = (name.len() as u32).to_be_bytes();
                        let description = export.description.as_bytes();
                        put_option_reply(
                            out,
                            option,
                            wire::REP_SERVER,
                            &[&name_len, name, description],
                        );
                    }
                    put_option_reply(out, option, wire::REP_ACK, &[]);
                } else {
                    put_option_reply(
                        out,
                        option,
                        wire::REP_ERR_INVALID,
                        &[b"NBD_OPT_LIST takes no data"],
                    );
                }
                Ok(HandshakeStatus::Continue)
            }
            wire::OPT_INFO | wire::OPT_GO => Ok(self.info_or_go(option, out)),
            wire::OPT_STRUCTURED_REPLY => {
                if self.data.is_empty() {
                    // Idempotent: a repeated request changes nothing and is acknowledged.
                    self.structured_replies = true;
                    put_option_reply(out, option, wire::REP_ACK, &[]);
                } else {
                    put_option_reply(
                        out,
                        option,
                        wire::REP_ERR_INVALID,
                        &[b"NBD_OPT_STRUCTURED_REPLY takes no data"],
                    );
                }
                Ok(HandshakeStatus::Continue)
            }
            wire::OPT_LIST_META_CONTEXT | wire::OPT_SET_META_CONTEXT => {
                self.meta_context(option, out);
                Ok(HandshakeStatus::Continue)
            }
            // EXTENDED_HEADERS, the withdrawn PEEK_EXPORT and anything unknown: the protocol
            // says reply ERR_UNSUP and go on.
            _ => {
                put_option_reply(out, option, wire::REP_ERR_UNSUP, &[b"unsupported option"]);
                Ok(HandshakeStatus::Continue)
            }
        }
    }

    /// NBD_OPT_STARTTLS: ACK and hand over to the caller's TLS handshake, or refuse.
    fn start_tls(&mut self, out: &mut Vec<u8>) -> HandshakeStatus {
        let option = wire::OPT_STARTTLS;
        if self.tls_policy == TlsPolicy::Off {
            // The protocol's NOTLS mode: ERR_UNSUP (or ERR_POLICY).
            put_option_reply(out, option, wire::REP_ERR_UNSUP, &[b"TLS is not enabled"]);
            return HandshakeStatus::Continue;
        }
        if self.tls_active {
            put_option_reply(out, option, wire::REP_ERR_INVALID, &[b"TLS is already on"]);
            return HandshakeStatus::Continue;
        }
        if !self.data.is_empty() {
            put_option_reply(
                out,
                option,
                wire::REP_ERR_INVALID,
                &[b"NBD_OPT_STARTTLS takes no data"],
            );
            return HandshakeStatus::Continue;
        }
        put_option_reply(out, option, wire::REP_ACK, &[]);
        HandshakeStatus::StartTls
    }

    /// This client's access to export `index`.
    fn access(&self, index: usize) -> ExportAccess {
        self.access
            .get(index)
            .copied()
            .unwrap_or(ExportAccess::Allowed)
    }

    /// For GO/INFO/meta context on export `index`: the refusal to send, if any.
    fn refusal(&self, index: usize) -> Option<(u32, &'static [u8])> {
        match self.access(index) {
            ExportAccess::Allowed => None,
            ExportAccess::TlsRequired => Some((
                wire::REP_ERR_TLS_REQD,
                b"this export needs TLS: send NBD_OPT_STARTTLS first",
            )),
            ExportAccess::Denied => Some((
                wire::REP_ERR_POLICY,
                b"this client may not open this export",
            )),
        }
    }

    fn export_name(&mut self, out: &mut Vec<u8>) -> Result<HandshakeStatus, ProtocolError> {
        let index = self.find_export(&self.data).map_err(|no| match no {
            NoExport::Unknown | NoExport::DefaultGone => ProtocolError::UnknownExport,
            NoExport::Several => ProtocolError::NoDefaultExport,
        })?;
        if self.refusal(index).is_some() {
            // No error reply exists for EXPORT_NAME.
            return Err(ProtocolError::ExportRefused);
        }
        if !self.offer_check.still_offered(index) {
            return Err(ProtocolError::ExportChanged);
        }
        let export = &self.exports[index];
        let flags = TransmissionFlags::for_export(export, self.structured_replies);
        out.extend_from_slice(&export.size_bytes.to_be_bytes());
        out.extend_from_slice(&flags.bits().to_be_bytes());
        if !self.no_zeroes {
            out.extend_from_slice(&[0u8; EXPORT_NAME_PADDING_BYTES]);
        }
        Ok(HandshakeStatus::Done(self.negotiated(
            index,
            flags,
            EnteredBy::ExportName,
        )))
    }

    fn info_or_go(&mut self, option: u32, out: &mut Vec<u8>) -> HandshakeStatus {
        let Some(request) = parse_info_request(&self.data) else {
            put_option_reply(
                out,
                option,
                wire::REP_ERR_INVALID,
                &[b"malformed NBD_OPT_INFO/NBD_OPT_GO"],
            );
            return HandshakeStatus::Continue;
        };
        let index = match self.find_export(request.name) {
            Ok(index) => index,
            Err(no) => {
                put_option_reply(out, option, wire::REP_ERR_UNKNOWN, &[no.message()]);
                return HandshakeStatus::Continue;
            }
        };
        if let Some((reply_type, message)) = self.refusal(index) {
            put_option_reply(out, option, reply_type, &[message]);
            return HandshakeStatus::Continue;
        }
        // INFO too: its answer (the size, the name) must describe what GO would open.
        if !self.offer_check.still_offered(index) {
            put_option_reply(
                out,
                option,
                wire::REP_ERR_UNKNOWN,
                &[b"this export was renamed or removed during the handshake: \
                    reconnect to see the exports as they are now"],
            );
            return HandshakeStatus::Continue;
        }
        let export = &self.exports[index];
        let flags = TransmissionFlags::for_export(export, self.structured_replies);

        let mut export_info = [0u8; 12];
        export_info[0..2].copy_from_slice(&wire::INFO_EXPORT.to_be_bytes());
        export_info[2..10].copy_from_slice(&export.size_bytes.to_be_bytes());
        export_info[10..12].copy_from_slice(&flags.bits().to_be_bytes());
        put_option_reply(out, option, wire::REP_INFO, &[&export_info]);

        let mut wants_name = false;
        let mut wants_description = false;
        for item in request.items.chunks_exact(2) {
            match u16::from_be_bytes([item[0], item[1]]) {
                wire::INFO_NAME => wants_name = true,
                wire::INFO_DESCRIPTION => wants_description = true,
                // EXPORT and BLOCK_SIZE are always sent; unknown items are ignored as the
                // protocol requires.
                _ => {}
            }
        }
        if wants_name {
            let kind = wire::INFO_NAME.to_be_bytes();
            put_option_reply(
                out,
                option,
                wire::REP_INFO,
                &[&kind, export.name.as_bytes()],
            );
        }
        if wants_description && !export.description.is_empty() {
            let kind = wire::INFO_DESCRIPTION.to_be_bytes();
            let description = export.description.as_bytes();
            put_option_reply(out, option, wire::REP_INFO, &[&kind, description]);
        }
        // Sent even when not requested (allowed): min 1 and max 32 MiB are what a portable
        // client assumes anyway, and the preferred size helps it avoid read-modify-write.
        let mut block_size = [0u8; 14];
        block_size[0..2].copy_from_slice(&wire::INFO_BLOCK_SIZE.to_be_bytes());
        block_size[2..6].copy_from_slice(&MIN_BLOCK_BYTES.to_be_bytes());
        block_size[6..10].copy_from_slice(&export.advertised_preferred_block_bytes().to_be_bytes());
        block_size[10..14].copy_from_slice(&MAX_BLOCK_BYTES.to_be_bytes());
        put_option_reply(out, option, wire::REP_INFO, &[&block_size]);

        put_option_reply(out, option, wire::REP_ACK, &[]);
        if option == wire::OPT_GO {
            HandshakeStatus::Done(self.negotiated(index, flags, EnteredBy::Go))
        } else {
            HandshakeStatus::Continue
        }
    }

    fn meta_context(&mut self, option: u32, out: &mut Vec<u8>) {
        let set = option == wire::OPT_SET_META_CONTEXT;
        if set {
            // SET replaces the previous selection even when it fails.
            self.meta_selection = None;
            if !self.structured_replies {
                put_option_reply(
                    out,
                    option,
                    wire::REP_ERR_INVALID,
                    &[b"negotiate structured replies first"],
                );
                return;
            }
        }
        // LIST is served without structured replies too: it is harmless, and the protocol
        // only says a server MAY refuse it.
        let data = std::mem::take(&mut self.data);
        let Some(request) = MetaRequest::parse(&data) else {
            put_option_reply(
                out,
                option,
                wire::REP_ERR_INVALID,
                &[b"malformed meta context request"],
            );
            self.data = data;
            return;
        };
        match self.find_export(request.export_name) {
            Err(no) => put_option_reply(out, option, wire::REP_ERR_UNKNOWN, &[no.message()]),
            Ok(index) => match self.refusal(index) {
                Some((reply_type, message)) => {
                    put_option_reply(out, option, reply_type, &[message])
                }
                None if set => self.set_meta_context(index, &request, out),
                None => self.list_meta_context(index, &request, out),
            },
        }
        // Given back so that its capacity serves the next option.
        self.data = data;
    }

    /// SET_META_CONTEXT on export `index`: selects `base:allocation` and the change maps the
    /// export offers, each named exactly; anything else is ignored (the protocol's rule for
    /// unknown namespaces and leaves). Ids: 1 for `base:allocation`, then 2, 3, ... for the
    /// change maps in query order.
    fn set_meta_context(&mut self, index: usize, request: &MetaRequest<'_>, out: &mut Vec<u8>) {
        let option = wire::OPT_SET_META_CONTEXT;
        let mut base_allocation = false;
        let mut changes: Vec<(ChangeBase, BasePin)> = Vec::new();
        // Bounded by the query count, itself bounded by the option's size.
        for query in request.queries() {
            if query == wire::BASE_ALLOCATION.as_bytes() {
                base_allocation = true;
                continue;
            }
            let Some(leaf) = query.strip_prefix(CHANGED_SINCE_PREFIX.as_bytes()) else {
                continue;
            };
            let Some(base) = ChangeBase::parse(leaf) else {
                continue;
            };
            if changes.iter().any(|(b, _)| *b == base) {
                continue;
            }
            // Resolved now, once: the map stays the one the client chose (module docs of
            // `BasePin`).
            let Some(pin) = self.change_maps.pin(index, &base) else {
                continue;
            };
            if changes.len() == CHANGE_MAPS_SELECTED_MAX {
                put_option_reply(
                    out,
                    option,
                    wire::REP_ERR_TOO_BIG,
                    &[b"at most 8 change maps per connection"],
                );
                return;
            }
            changes.push((base, pin));
        }
        let mut selected = Vec::with_capacity(changes.len() + 1);
        if base_allocation {
            selected.push(SelectedContext::base_allocation());
        }
        for (n, (base, pin)) in changes.into_iter().enumerate() {
            selected.push(SelectedContext {
                // After base:allocation's 1; n < CHANGE_MAPS_SELECTED_MAX.
                id: MetaContextId(MetaContextId::BASE_ALLOCATION.0 + 1 + n as u32),
                context: MetaContext::ChangedSince(base, pin),
            });
        }
        for context in &selected {
            let id = context.id.0.to_be_bytes();
            let name = context.context.name();
            put_option_reply(out, option, wire::REP_META_CONTEXT, &[&id, name.as_bytes()]);
        }
        put_option_reply(out, option, wire::REP_ACK, &[]);
        self.meta_selection = Some((index, selected));
    }

    /// LIST_META_CONTEXT on export `index`. No query lists everything; `base:` and
    /// `base:allocation` list `base:allocation`; `oxpool:` and `oxpool:changed-since:` (the
    /// namespace, and the change maps' prefix as a wildcard) list every change map; a full
    /// change map name lists it if the export offers it. Unknown namespaces and leaves find
    /// nothing. List replies carry the reserved id 0.
    fn list_meta_context(&self, index: usize, request: &MetaRequest<'_>, out: &mut Vec<u8>) {
        let option = wire::OPT_LIST_META_CONTEXT;
        let everything = request.query_count == 0;
        let mut base_allocation = everything;
        let mut all_changes = everything;
        let mut named: Vec<&[u8]> = Vec::new();
        // Bounded by the query count, itself bounded by the option's size.
        for query in request.queries() {
            if query == wire::BASE_ALLOCATION.as_bytes() || query == b"base:" {
                base_allocation = true;
            } else if query == OXPOOL_NAMESPACE.as_bytes()
                || query == CHANGED_SINCE_PREFIX.as_bytes()
            {
                all_changes = true;
            } else if let Some(leaf) = query.strip_prefix(CHANGED_SINCE_PREFIX.as_bytes()) {
                if named.len() < CHANGE_MAPS_LISTED_MAX {
                    named.push(leaf);
                }
            }
        }
        if base_allocation {
            put_option_reply(
                out,
                option,
                wire::REP_META_CONTEXT,
                &[&[0u8; 4], wire::BASE_ALLOCATION.as_bytes()],
            );
        }
        let bases = if all_changes {
            self.change_maps.offered(index, CHANGE_MAPS_LISTED_MAX)
        } else {
            // Each named map once, in a stable order.
            named.sort_unstable();
            named.dedup();
            named
                .into_iter()
                .filter_map(ChangeBase::parse)
                .filter(|base| self.change_maps.pin(index, base).is_some())
                .collect()
        };
        // A catalog that returns more than asked is cut at the bound all the same.
        for base in bases.iter().take(CHANGE_MAPS_LISTED_MAX) {
            let name = base.context_name();
            put_option_reply(
                out,
                option,
                wire::REP_META_CONTEXT,
                &[&[0u8; 4], name.as_bytes()],
            );
        }
        put_option_reply(out, option, wire::REP_ACK, &[]);
    }

    fn negotiated(&self, index: usize, flags: TransmissionFlags, by: EnteredBy) -> Negotiated {
        // BLOCK_STATUS is only valid when the last SET_META_CONTEXT named the export that
        // was finally chosen.
        let meta_contexts = match &self.meta_selection {
            Some((export, selected)) if *export == index => selected.clone(),
            _ => Vec::new(),
        };
        Negotiated {
            export_index: index,
            structured_replies: self.structured_replies,
            meta_contexts,
            transmission_flags: flags,
            entered_by: by,
        }
    }

    /// The export `name` selects: the one of that name, or for an empty name the default
    /// export, if there is one.
    ///
    /// An empty name selects an export only when it is the sole export this client may open.
    /// Every such export counts, snapshot exports included, because the client can name and
    /// open each of them, and they are what `NBD_OPT_LIST` shows it: so the empty name works
    /// exactly when `nbdinfo --list` shows one export, and the refusal's advice (list them)
    /// shows the choice. Exports it may not open do not count: they would be refused anyway
    /// and are not listed to it. If it may open none, the sole export, or the first of
    /// several, is selected only to be refused with its reason (TLS required, or not
    /// allowed), never opened.
    fn find_export(&self, name: &[u8]) -> Result<usize, NoExport> {
        if let Some(index) = self.exports.iter().position(|e| e.name.as_bytes() == name) {
            return Ok(index);
        }
        if !name.is_empty() || self.exports.is_empty() {
            return Err(NoExport::Unknown);
        }
        let mut allowed =
            (0..self.exports.len()).filter(|&i| self.access(i) == ExportAccess::Allowed);
        let sole = match (allowed.next(), allowed.next()) {
            (Some(index), None) => index,
            (Some(_), Some(_)) => return Err(NoExport::Several),
            (None, _) => return Ok(0),
        };
        match self.default_export {
            DefaultExport::Sole => Ok(sole),
            // Another export than `sole` only if this client may not open it: selected to be
            // refused with the reason, as an export named explicitly would be.
            DefaultExport::Fixed(Some(pinned)) => Ok(pinned),
            DefaultExport::Fixed(None) => Err(NoExport::DefaultGone),
        }
    }
}

/// The parsed data of NBD_OPT_INFO / NBD_OPT_GO, borrowing the option data.
struct InfoRequest<'a> {
    name: &'a [u8],
    /// `2 * n` bytes of 16-bit information request codes.
    items: &'a [u8],
}

/// Name length (32), name, item count (16), items (16 each); every length must add up.
fn parse_info_request(data: &[u8]) -> Option<InfoRequest<'_>> {
    let mut reader = Reader::new(data);
    let name_len = reader.u32()? as usize;
    let name = reader.bytes(name_len)?;
    let count = reader.u16()? as usize;
    let items = reader.bytes(count * 2)?;
    reader.is_empty().then_some(InfoRequest { name, items })
}

/// The data of LIST/SET_META_CONTEXT with its framing checked: export name, and the queries
/// (each a 32-bit length and a string), borrowed.
struct MetaRequest<'a> {
    export_name: &'a [u8],
    query_count: u32,
    /// The queries' bytes, every length inside checked to add up exactly.
    queries: &'a [u8],
}

impl<'a> MetaRequest<'a> {
    /// Export name length (32), name, query count (32), queries (length 32 + string each);
    /// `None` unless every length adds up exactly.
    fn parse(data: &'a [u8]) -> Option<MetaRequest<'a>> {
        let mut reader = Reader::new(data);
        let name_len = reader.u32()? as usize;
        let export_name = reader.bytes(name_len)?;
        let query_count = reader.u32()?;
        // Each query needs at least its 4-byte length: reject impossible counts before
        // looping.
        if query_count as usize > reader.remaining() / 4 {
            return None;
        }
        let queries = reader.rest;
        for _ in 0..query_count {
            let query_len = reader.u32()? as usize;
            reader.bytes(query_len)?;
        }
        reader.is_empty().then_some(MetaRequest {
            export_name,
            query_count,
            queries,
        })
    }

    /// The queries, in order (their framing was checked by `parse`).
    fn queries(&self) -> impl Iterator<Item = &'a [u8]> {
        let mut reader = Reader::new(self.queries);
        (0..self.query_count).map_while(move |_| {
            let query_len = reader.u32()? as usize;
            reader.bytes(query_len)
        })
    }
}

/// Appends one option reply: magic, option, reply type, length, then the payload parts.
fn put_option_reply(out: &mut Vec<u8>, option: u32, reply_type: u32, parts: &[&[u8]]) {
    let length: usize = parts.iter().map(|part| part.len()).sum();
    // Every payload here is built from bounded pieces (export names, fixed fields).
    debug_assert!(length <= 2 * wire::MAX_STRING_BYTES + 8);
    out.extend_from_slice(&wire::OPTION_REPLY_MAGIC.to_be_bytes());
    out.extend_from_slice(&option.to_be_bytes());
    out.extend_from_slice(&reply_type.to_be_bytes());
    out.extend_from_slice(&(length as u32).to_be_bytes());
    for part in parts {
        out.extend_from_slice(part);
    }
}

fn read_u32(bytes: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(bytes[at..at + 4].try_into().expect("4 bytes"))
}

/// Bounds-checked big-endian reader over untrusted option data.
struct Reader<'a> {
    rest: &'a [u8],
}

impl<'a> Reader<'a> {
    fn new(data: &'a [u8]) -> Self {
        Reader { rest: data }
    }

    fn remaining(&self) -> usize {
        self.rest.len()
    }

    fn is_empty(&self) -> bool {
        self.rest.is_empty()
    }

    fn bytes(&mut self, count: usize) -> Option<&'a [u8]> {
        if count > self.rest.len() {
            return None;
        }
        let (head, tail) = self.rest.split_at(count);
        self.rest = tail;
        Some(head)
    }

    fn u16(&mut self) -> Option<u16> {
        Some(u16::from_be_bytes(self.bytes(2)?.try_into().ok()?))
    }

    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_be_bytes(self.bytes(4)?.try_into().ok()?))
    }
}
