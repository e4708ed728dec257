//! The control protocol between the `oxpool` command and a running `oxpool serve`.
//!
//! A server owns its pools (their devices are locked), so a command that names a served pool
//! does not open it: it sends its command line to the server over a unix socket, and the
//! server runs the same code the command would have run on an exported pool and sends back
//! what it would have printed. See `docs/control.md` for the protocol and why the request is
//! a command line rather than one message per verb.
//!
//! This crate is the codec alone (no sockets, no threads): [`encode`] writes one frame,
//! [`decode`] reads one from bytes received so far, [`read_message`] and [`write_message`]
//! do the same over any `std::io` stream. Decoding never panics and never trusts a length: a
//! frame announcing more than [`PAYLOAD_BYTES_MAX`] is refused before its payload is awaited.

mod codec;
mod message;

pub use codec::{
    decode, encode, read_message, write_message, DecodeError, ReadError, TooLarge,
    FRAME_HEADER_BYTES, FRAME_TRAILER_BYTES, MAGIC, PAYLOAD_BYTES_MAX,
};
pub use message::{Message, ProtocolVersion, Request, ARGS_MAX};
