//! The NBD protocol as a sans-I/O codec: bytes in, events and bytes out; no sockets here.
//!
//! - [`Handshake`]: server side of fixed newstyle negotiation (EXPORT_NAME, GO, INFO, LIST,
//!   ABORT, STRUCTURED_REPLY, LIST/SET_META_CONTEXT for `base:allocation` and, through a
//!   [`ChangeMapCatalog`], oxpool's change maps `oxpool:changed-since:SNAP|#BOOKMARK`).
//! - [`RequestDecoder`] and [`validate`]: transmission-phase request headers; WRITE payloads
//!   are handed to the caller's buffers, never copied through the codec.
//! - [`reply`]: simple replies and structured reply chunks encoded into caller buffers.
//!
//! Errors come in two kinds: a [`ProtocolError`] ends the connection; an [`Errno`] from
//! [`validate`] goes into the reply of one request and the connection goes on.
//!
//! TLS: the codec does STARTTLS's negotiation rules ([`TlsPolicy`], [`ExportAccess`]); the
//! TLS session itself is the server's (`server::tls`).
//!
//! Not supported: extended headers (ERR_UNSUP), the oldstyle handshake, and meta contexts
//! other than `base:allocation` and `oxpool:changed-since:*` ([`meta`]).
//!
//! # Driving the codec
//!
//! A server loop, with the socket replaced by byte slices:
//!
//! ```
//! use oxpool_nbd::proto::reply::{encode_error_reply, ERROR_REPLY_MAX_BYTES};
//! use oxpool_nbd::proto::*;
//!
//! let export = ExportInfo {
//!     name: "vol0".into(),
//!     description: String::new(),
//!     size_bytes: 1 << 20,
//!     preferred_block_bytes: 16384,
//!     read_only: false,
//!     caps: ExportCaps::default(),
//! };
//! let mut handshake = Handshake::new(vec![export.clone()]);
//! let _send_first = handshake.greeting();
//!
//! // What a client sends: flags, NBD_OPT_GO for "vol0" with no info requests, then a
//! // WRITE of 4 bytes past the end of the export.
//! let mut input = 3u32.to_be_bytes().to_vec();
//! input.extend_from_slice(&wire::IHAVEOPT.to_be_bytes());
//! input.extend_from_slice(&wire::OPT_GO.to_be_bytes());
//! input.extend_from_slice(&10u32.to_be_bytes());
//! input.extend_from_slice(&4u32.to_be_bytes());
//! input.extend_from_slice(b"vol0");
//! input.extend_from_slice(&0u16.to_be_bytes());
//! let write = Request {
//!     cookie: Cookie(7),
//!     command: Command::Write,
//!     flags: CommandFlags::NONE,
//!     offset_bytes: 1 << 20,
//!     length_bytes: 4,
//! };
//! let mut header = [0u8; REQUEST_HEADER_BYTES];
//! write.encode(&mut header);
//! input.extend_from_slice(&header);
//! input.extend_from_slice(b"data");
//!
//! let mut out = Vec::new();
//! let progress = handshake.receive(&input, &mut out).unwrap();
//! // ... send `out` ...
//! let HandshakeStatus::Done(negotiated) = progress.status else { panic!() };
//! let mut rest = &input[progress.consumed_bytes..];
//!
//! let mut decoder = RequestDecoder::new();
//! let (used, request) = decoder.decode(rest).unwrap();
//! rest = &rest[used..];
//! let request = request.unwrap();
//! // The payload goes to the caller's buffer (here dropped: the write is refused).
//! let payload = decoder.take_payload(rest);
//! assert_eq!(payload, b"data");
//! assert_eq!(decoder.payload_remaining_bytes(), 0);
//!
//! let errno = validate(&request, &export, &negotiated).unwrap_err();
//! assert_eq!(errno, Errno::NoSpc);
//! let mut reply = [0u8; ERROR_REPLY_MAX_BYTES];
//! let structured = negotiated.structured_replies;
//! let reply_bytes = encode_error_reply(request.cookie, errno, structured, &mut reply);
//! assert_eq!(reply_bytes, 16); // a simple reply: structured replies were not negotiated
//! ```

mod error;
mod handshake;
pub mod meta;
pub mod reply;
mod request;
mod types;
pub mod wire;

pub use error::{EncodeError, ProtocolError};
pub use handshake::{
    FixedOffer, Handshake, HandshakeProgress, HandshakeStatus, OfferCheck, GREETING_BYTES,
    MAX_OPTIONS_PER_HANDSHAKE, MAX_OPTION_DATA_BYTES, REPLIES_PAUSE_BYTES,
};
pub use meta::{
    BasePin, ChangeBase, ChangeMapCatalog, EmptyCatalog, MetaContext, SelectedContext,
    CHANGED_SINCE_PREFIX, CHANGE_MAPS_LISTED_MAX, CHANGE_MAPS_SELECTED_MAX,
};
pub use request::{validate, Request, RequestDecoder, REQUEST_HEADER_BYTES};
pub use types::{
    BlockStatusDescriptor, BlockStatusFlags, Command, CommandFlags, Cookie, EnteredBy, Errno,
    ExportAccess, ExportCaps, ExportInfo, MetaContextId, Negotiated, TlsPolicy, TransmissionFlags,
    MAX_BLOCK_BYTES, MIN_BLOCK_BYTES,
};
