//! Transmission phase: request decoding and validation.
//!
//! # Payload hand-off
//!
//! A WRITE header is returned as soon as its 28 bytes are decoded, before any payload byte.
//! The decoder then counts the payload as pending ([`RequestDecoder::payload_remaining_bytes`])
//! and the caller moves those bytes into its own buffer:
//!
//! - bytes already sitting in the caller's receive buffer after the header are claimed with
//!   [`RequestDecoder::take_payload`], which returns the payload prefix of that buffer for the
//!   caller to copy (or drop, for a rejected write);
//! - the rest is received straight into the destination (e.g. an io_uring `Recv` into a
//!   registered buffer) and reported with [`RequestDecoder::payload_received`].
//!
//! Only when nothing is pending may [`RequestDecoder::decode`] be called again. Payload bytes
//! never pass through the codec's own memory.
//!
//! A write that fails validation still has its payload on the wire: the caller must take (and
//! discard) it before the next header, because its length was trusted (it is at most
//! [`MAX_BLOCK_BYTES`](super::MAX_BLOCK_BYTES) or whatever limit the decoder was built with).

use super::error::ProtocolError;
use super::types::MAX_BLOCK_BYTES;
use super::types::{Command, CommandFlags, Cookie, Errno, ExportInfo, Negotiated};
use super::wire;

/// Size of a (compact, non-extended) request header.
pub const REQUEST_HEADER_BYTES: usize = 28;

/// One decoded request header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    /// Echoed in the reply.
    pub cookie: Cookie,
    /// The command type.
    pub command: Command,
    /// Command flags exactly as received (validation checks them).
    pub flags: CommandFlags,
    /// Byte offset into the export.
    pub offset_bytes: u64,
    /// Length of the range (for WRITE: of the payload that follows).
    pub length_bytes: u32,
}

impl Request {
    /// Payload bytes that follow this header on the wire: `length_bytes` for WRITE, else 0.
    pub const fn payload_bytes(&self) -> u32 {
        match self.command {
            Command::Write => self.length_bytes,
            _ => 0,
        }
    }

    /// Encodes the header as a client would send it (for tests, fuzzing and benchmarks).
    pub fn encode(&self, out: &mut [u8; REQUEST_HEADER_BYTES]) {
        out[0..4].copy_from_slice(&wire::REQUEST_MAGIC.to_be_bytes());
        out[4..6].copy_from_slice(&self.flags.bits().to_be_bytes());
        out[6..8].copy_from_slice(&self.command.wire_value().to_be_bytes());
        out[8..16].copy_from_slice(&self.cookie.0.to_be_bytes());
        out[16..24].copy_from_slice(&self.offset_bytes.to_be_bytes());
        out[24..28].copy_from_slice(&self.length_bytes.to_be_bytes());
    }
}

/// Incremental decoder of request headers; input may arrive in any split.
#[derive(Debug)]
pub struct RequestDecoder {
    /// Partial header when input ended mid-header.
    header: [u8; REQUEST_HEADER_BYTES],
    header_filled_bytes: usize,
    payload_remaining_bytes: u32,
    max_payload_bytes: u32,
    failed: bool,
}

impl Default for RequestDecoder {
    fn default() -> Self {
        Self::new()
    }
}

impl RequestDecoder {
    /// A decoder that trusts WRITE payloads up to [`MAX_BLOCK_BYTES`].
    pub fn new() -> Self {
        Self::with_max_payload(MAX_BLOCK_BYTES)
    }

    /// A decoder that trusts WRITE payloads up to `max_payload_bytes`; a WRITE announcing
    /// more ends the connection ([`ProtocolError::WriteTooLarge`]).
    pub fn with_max_payload(max_payload_bytes: u32) -> Self {
        RequestDecoder {
            header: [0; REQUEST_HEADER_BYTES],
            header_filled_bytes: 0,
            payload_remaining_bytes: 0,
            max_payload_bytes,
            failed: false,
        }
    }

    /// Decodes at most one request header from the start of `input`.
    ///
    /// Returns the input bytes consumed and the request once its header is complete. A header
    /// split across calls is kept inside the decoder (28 bytes at most). When the request is a
    /// WRITE, its payload is pending afterwards (see the module documentation).
    ///
    /// Errors end the connection; after one, every call returns [`ProtocolError::Finished`].
    ///
    /// # Panics
    ///
    /// If called while payload is pending: that is a bug in the caller, and decoding payload
    /// as a header would desynchronise the stream silently.
    pub fn decode(&mut self, input: &[u8]) -> Result<(usize, Option<Request>), ProtocolError> {
        assert_eq!(
            self.payload_remaining_bytes, 0,
            "decode called with WRITE payload pending"
        );
        if self.failed {
            return Err(ProtocolError::Finished);
        }
        // Fast path: a whole header in the input and nothing buffered, no copy.
        if self.header_filled_bytes == 0 && input.len() >= REQUEST_HEADER_BYTES {
            let header: &[u8; REQUEST_HEADER_BYTES] = input[..REQUEST_HEADER_BYTES]
                .try_into()
                .expect("length checked");
            let request = self.finish_header(header)?;
            return Ok((REQUEST_HEADER_BYTES, Some(request)));
        }
        let take = (REQUEST_HEADER_BYTES - self.header_filled_bytes).min(input.len());
        self.header[self.header_filled_bytes..self.header_filled_bytes + take]
            .copy_from_slice(&input[..take]);
        self.header_filled_bytes += take;
        if self.header_filled_bytes < REQUEST_HEADER_BYTES {
            return Ok((take, None));
        }
        self.header_filled_bytes = 0;
        let header = self.header;
        let request = self.finish_header(&header)?;
        Ok((take, Some(request)))
    }

    fn finish_header(
        &mut self,
        header: &[u8; REQUEST_HEADER_BYTES],
    ) -> Result<Request, ProtocolError> {
        let magic = u32::from_be_bytes(header[0..4].try_into().expect("4 bytes"));
        if magic != wire::REQUEST_MAGIC {
            self.failed = true;
            return Err(ProtocolError::BadRequestMagic { found: magic });
        }
        let request = Request {
            flags: CommandFlags(u16::from_be_bytes([header[4], header[5]])),
            command: Command::from_wire(u16::from_be_bytes([header[6], header[7]])),
            cookie: Cookie(u64::from_be_bytes(header[8..16].try_into().expect("8"))),
            offset_bytes: u64::from_be_bytes(header[16..24].try_into().expect("8")),
            length_bytes: u32::from_be_bytes(header[24..28].try_into().expect("4")),
        };
        // Only WRITE carries a payload in the compact header format; an unknown command is
        // assumed to have none (the protocol gives no way to know otherwise) and gets EINVAL.
        let payload = request.payload_bytes();
        if payload > self.max_payload_bytes {
            self.failed = true;
            return Err(ProtocolError::WriteTooLarge {
                cookie: request.cookie,
                length_bytes: payload,
            });
        }
        self.payload_remaining_bytes = payload;
        Ok(request)
    }

    /// Payload bytes of the last WRITE not yet taken by the caller.
    pub fn payload_remaining_bytes(&self) -> u32 {
        self.payload_remaining_bytes
    }

    /// Claims the payload bytes at the start of `input` (bytes the caller already received
    /// after a header) and returns them for the caller to copy into its destination buffer.
    /// Returns an empty slice when no payload is pending.
    pub fn take_payload<'a>(&mut self, input: &'a [u8]) -> &'a [u8] {
        let take = (self.payload_remaining_bytes as usize).min(input.len());
        // take <= payload_remaining_bytes, a u32.
        self.payload_remaining_bytes -= take as u32;
        &input[..take]
    }

    /// Records that the caller received `bytes` of payload directly into its own buffer.
    ///
    /// # Panics
    ///
    /// If `bytes` exceeds the pending payload: the caller read part of the next header into
    /// a payload buffer, a bug that would corrupt data.
    pub fn payload_received(&mut self, bytes: u32) {
        assert!(
            bytes <= self.payload_remaining_bytes,
            "payload_received({bytes}) with only {} pending",
            self.payload_remaining_bytes
        );
        self.payload_remaining_bytes -= bytes;
    }
}

/// Checks a request against the export and the negotiated options.
///
/// `Ok` means the server should execute it (DISC: close after in-flight requests, no reply).
/// `Err(errno)` means: reply with that error (for a WRITE, after taking its payload) and keep
/// the connection. Checks, in order, each with the protocol's recommended error:
///
/// 1. unknown command type: EINVAL;
/// 2. WRITE, TRIM or WRITE_ZEROES on a read-only export: EPERM;
/// 3. a flag not defined for the command, or whose transmission flag was not advertised
///    (FUA without SEND_FUA, DF without SEND_DF, FAST_ZERO without SEND_FAST_ZERO): EINVAL;
/// 4. a command whose transmission flag was not advertised (FLUSH, TRIM, WRITE_ZEROES, CACHE),
///    or BLOCK_STATUS without structured replies and a selected meta context: EINVAL;
/// 5. FLUSH with a nonzero offset or length (reserved fields): EINVAL;
/// 6. zero length (unspecified by the protocol; refused rather than passed to the volume
///    layer as a degenerate range, without disconnecting): EINVAL;
/// 7. READ or WRITE longer than the maximum block size: EINVAL. The protocol's maximum block
///    size bounds payloads (the data a READ returns or a WRITE carries); TRIM, WRITE_ZEROES
///    (with or without FAST_ZERO), CACHE and BLOCK_STATUS carry none and need no buffer of
///    their length, and clients such as nbdcopy zero a large hole in one request, as qemu-nbd
///    and nbdkit allow;
/// 8. a range past the end of the export (or overflowing 64 bits): ENOSPC for WRITE and
///    WRITE_ZEROES, EINVAL otherwise.
pub fn validate(
    request: &Request,
    export: &ExportInfo,
    negotiated: &Negotiated,
) -> Result<(), Errno> {
    let advertised = negotiated.transmission_flags;
    let command = request.command;
    if let Command::Unknown(_) = command {
        return Err(Errno::Inval);
    }
    if command == Command::Disconnect {
        // Never answered; the fields are meaningless once the client is leaving.
        return Ok(());
    }
    if command.is_mutating() && export.read_only {
        return Err(Errno::Perm);
    }

    let mut allowed = CommandFlags::NONE;
    if advertised.has(wire::TFLAG_SEND_FUA) {
        // FUA is valid on every command once advertised (clients set it on reads too).
        allowed = allowed.union(CommandFlags::FUA);
    }
    match command {
        Command::Read if advertised.has(wire::TFLAG_SEND_DF) => {
            allowed = allowed.union(CommandFlags::DF);
        }
        Command::WriteZeroes => {
            allowed = allowed.union(CommandFlags::NO_HOLE);
            if advertised.has(wire::TFLAG_SEND_FAST_ZERO) {
                allowed = allowed.union(CommandFlags::FAST_ZERO);
            }
        }
        Command::BlockStatus => allowed = allowed.union(CommandFlags::REQ_ONE),
        _ => {}
    }
    if request.flags.bits() & !allowed.bits() != 0 {
        return Err(Errno::Inval);
    }

    let supported = match command {
        Command::Flush => advertised.has(wire::TFLAG_SEND_FLUSH),
        Command::Trim => advertised.has(wire::TFLAG_SEND_TRIM),
        Command::WriteZeroes => advertised.has(wire::TFLAG_SEND_WRITE_ZEROES),
        Command::Cache => advertised.has(wire::TFLAG_SEND_CACHE),
        Command::BlockStatus => {
            negotiated.structured_replies && !negotiated.meta_contexts.is_empty()
        }
        _ => true,
    };
    if !supported {
        return Err(Errno::Inval);
    }

    if command == Command::Flush {
        return if request.offset_bytes == 0 && request.length_bytes == 0 {
            Ok(())
        } else {
            Err(Errno::Inval)
        };
    }

    if request.length_bytes == 0 {
        return Err(Errno::Inval);
    }
    // Only the commands with a payload: their length sizes a buffer (see rule 7).
    let carries_payload = matches!(command, Command::Read | Command::Write);
    if carries_payload && request.length_bytes > MAX_BLOCK_BYTES {
        return Err(Errno::Inval);
    }

    let end_bytes = request
        .offset_bytes
        .checked_add(u64::from(request.length_bytes));
    if end_bytes.is_none_or(|end| end > export.size_bytes) {
        return Err(match command {
            Command::Write | Command::WriteZeroes => Errno::NoSpc,
            _ => Errno::Inval,
        });
    }
    Ok(())
}
