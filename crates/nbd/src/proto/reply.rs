//! Reply encoders: simple replies and structured reply chunks, written into caller buffers.
//!
//! Data never passes through here: for a READ the caller encodes the header into a small
//! buffer and sends its data buffer right after it (e.g. one vectored send or `SendZc`).
//! Fixed-size replies take `&mut [u8; N]`, so a wrong buffer size is a compile error;
//! variable-size ones take `&mut [u8]`, return the bytes written, and refuse a short buffer.

use super::error::EncodeError;
use super::types::{BlockStatusDescriptor, Cookie, Errno, MetaContextId};
use super::wire;

/// Size of a simple reply header (data follows for a successful READ).
pub const SIMPLE_REPLY_BYTES: usize = 16;
/// Size of a structured reply chunk header.
pub const CHUNK_HEADER_BYTES: usize = 20;
/// Size of an OFFSET_DATA chunk up to the data: chunk header plus the 64-bit offset.
pub const OFFSET_DATA_HEADER_BYTES: usize = CHUNK_HEADER_BYTES + 8;
/// Size of an OFFSET_HOLE chunk.
pub const OFFSET_HOLE_CHUNK_BYTES: usize = CHUNK_HEADER_BYTES + 12;
/// Size of a NONE chunk (used as the final chunk).
pub const NONE_CHUNK_BYTES: usize = CHUNK_HEADER_BYTES;
/// Size of an ERROR chunk without a message.
pub const ERROR_CHUNK_BASE_BYTES: usize = CHUNK_HEADER_BYTES + 6;
/// Size of an ERROR_OFFSET chunk without a message.
pub const ERROR_OFFSET_CHUNK_BASE_BYTES: usize = CHUNK_HEADER_BYTES + 14;
/// Size of the buffer [`encode_error_reply`] needs (the larger of its two forms).
pub const ERROR_REPLY_MAX_BYTES: usize = ERROR_CHUNK_BASE_BYTES;
/// Largest payload of an OFFSET_DATA chunk: the 32-bit length also covers the offset.
pub const MAX_OFFSET_DATA_BYTES: u32 = u32::MAX - 8;

/// Chunk flags: whether this is the final chunk of the reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Done {
    /// More chunks follow for the same cookie.
    More,
    /// This is the final chunk (`NBD_REPLY_FLAG_DONE`). The protocol forbids marking a
    /// content chunk final while an error could still be detected while sending it.
    Last,
}

impl Done {
    fn flags(self) -> u16 {
        match self {
            Done::More => 0,
            Done::Last => wire::REPLY_FLAG_DONE,
        }
    }
}

/// Simple reply: magic, error (0 for success), cookie. For a successful READ without
/// structured replies, the data follows; for any error, nothing follows.
pub fn encode_simple_reply(
    cookie: Cookie,
    error: Option<Errno>,
    out: &mut [u8; SIMPLE_REPLY_BYTES],
) {
    out[0..4].copy_from_slice(&wire::SIMPLE_REPLY_MAGIC.to_be_bytes());
    out[4..8].copy_from_slice(&error.map_or(0, Errno::wire_value).to_be_bytes());
    out[8..16].copy_from_slice(&cookie.0.to_be_bytes());
}

/// A structured chunk header: magic, flags, type, cookie, payload length.
pub fn encode_chunk_header(
    cookie: Cookie,
    chunk_type: u16,
    done: Done,
    payload_bytes: u32,
    out: &mut [u8; CHUNK_HEADER_BYTES],
) {
    out[0..4].copy_from_slice(&wire::STRUCTURED_REPLY_MAGIC.to_be_bytes());
    out[4..6].copy_from_slice(&done.flags().to_be_bytes());
    out[6..8].copy_from_slice(&chunk_type.to_be_bytes());
    out[8..16].copy_from_slice(&cookie.0.to_be_bytes());
    out[16..20].copy_from_slice(&payload_bytes.to_be_bytes());
}

/// The first 28 bytes of an OFFSET_DATA chunk (header and offset); the caller sends
/// `data_bytes` of data from its own buffer right after.
pub fn encode_offset_data_header(
    cookie: Cookie,
    offset_bytes: u64,
    data_bytes: u32,
    done: Done,
    out: &mut [u8; OFFSET_DATA_HEADER_BYTES],
) -> Result<(), EncodeError> {
    if data_bytes == 0 {
        return Err(EncodeError::ZeroLength);
    }
    if data_bytes > MAX_OFFSET_DATA_BYTES {
        return Err(EncodeError::PayloadTooLarge);
    }
    let header: &mut [u8; CHUNK_HEADER_BYTES] = (&mut out[..CHUNK_HEADER_BYTES])
        .try_into()
        .expect("20 bytes");
    encode_chunk_header(
        cookie,
        wire::REPLY_TYPE_OFFSET_DATA,
        done,
        data_bytes + 8,
        header,
    );
    out[20..28].copy_from_slice(&offset_bytes.to_be_bytes());
    Ok(())
}

/// An OFFSET_HOLE chunk: `hole_bytes` (nonzero) starting at `offset_bytes` read as zeros.
pub fn encode_offset_hole(
    cookie: Cookie,
    offset_bytes: u64,
    hole_bytes: u32,
    done: Done,
    out: &mut [u8; OFFSET_HOLE_CHUNK_BYTES],
) -> Result<(), EncodeError> {
    if hole_bytes == 0 {
        return Err(EncodeError::ZeroLength);
    }
    let header: &mut [u8; CHUNK_HEADER_BYTES] = (&mut out[..CHUNK_HEADER_BYTES])
        .try_into()
        .expect("20 bytes");
    encode_chunk_header(cookie, wire::REPLY_TYPE_OFFSET_HOLE, done, 12, header);
    out[20..28].copy_from_slice(&offset_bytes.to_be_bytes());
    out[28..32].copy_from_slice(&hole_bytes.to_be_bytes());
    Ok(())
}

/// A NONE chunk with the DONE flag: ends a structured reply (success if no error chunk was
/// sent before it).
pub fn encode_done_chunk(cookie: Cookie, out: &mut [u8; NONE_CHUNK_BYTES]) {
    encode_chunk_header(cookie, wire::REPLY_TYPE_NONE, Done::Last, 0, out);
}

/// Size of a BLOCK_STATUS chunk with `descriptor_count` descriptors.
pub const fn block_status_chunk_bytes(descriptor_count: usize) -> usize {
    CHUNK_HEADER_BYTES + 4 + 8 * descriptor_count
}

/// A BLOCK_STATUS chunk for one metadata context; returns the bytes written.
///
/// Needs at least one descriptor, each with a nonzero length. With REQ_ONE the caller passes
/// exactly one descriptor no longer than the request.
pub fn encode_block_status(
    cookie: Cookie,
    context: MetaContextId,
    descriptors: &[BlockStatusDescriptor],
    done: Done,
    out: &mut [u8],
) -> Result<usize, EncodeError> {
    if descriptors.is_empty() {
        return Err(EncodeError::NoDescriptors);
    }
    if descriptors.iter().any(|d| d.length_bytes == 0) {
        return Err(EncodeError::ZeroLength);
    }
    let total_bytes = block_status_chunk_bytes(descriptors.len());
    let payload_bytes = u32::try_from(total_bytes - CHUNK_HEADER_BYTES)
        .map_err(|_| EncodeError::PayloadTooLarge)?;
    let out = checked_prefix(out, total_bytes)?;
    let (header, rest) = out.split_at_mut(CHUNK_HEADER_BYTES);
    encode_chunk_header(
        cookie,
        wire::REPLY_TYPE_BLOCK_STATUS,
        done,
        payload_bytes,
        header.try_into().expect("20 bytes"),
    );
    rest[0..4].copy_from_slice(&context.0.to_be_bytes());
    for (descriptor, slot) in descriptors.iter().zip(rest[4..].chunks_exact_mut(8)) {
        slot[0..4].copy_from_slice(&descriptor.length_bytes.to_be_bytes());
        slot[4..8].copy_from_slice(&descriptor.flags.0.to_be_bytes());
    }
    Ok(total_bytes)
}

/// Size of an ERROR chunk carrying `message` (after truncation to the string limit).
pub fn error_chunk_bytes(message: &str) -> usize {
    ERROR_CHUNK_BASE_BYTES + truncate_message(message).len()
}

/// Size of an ERROR_OFFSET chunk carrying `message` (after truncation to the string limit).
pub fn error_offset_chunk_bytes(message: &str) -> usize {
    ERROR_OFFSET_CHUNK_BASE_BYTES + truncate_message(message).len()
}

/// An ERROR chunk: errno, message length, message. Returns the bytes written.
///
/// A message longer than the protocol's 4096-byte string limit is cut at a character
/// boundary: it is for humans, and a long message must not cost the client its reply.
pub fn encode_error_chunk(
    cookie: Cookie,
    error: Errno,
    message: &str,
    done: Done,
    out: &mut [u8],
) -> Result<usize, EncodeError> {
    let message = truncate_message(message).as_bytes();
    let total_bytes = ERROR_CHUNK_BASE_BYTES + message.len();
    let out = checked_prefix(out, total_bytes)?;
    let (header, rest) = out.split_at_mut(CHUNK_HEADER_BYTES);
    encode_chunk_header(
        cookie,
        wire::REPLY_TYPE_ERROR,
        done,
        (6 + message.len()) as u32,
        header.try_into().expect("20 bytes"),
    );
    rest[0..4].copy_from_slice(&error.wire_value().to_be_bytes());
    rest[4..6].copy_from_slice(&(message.len() as u16).to_be_bytes());
    rest[6..].copy_from_slice(message);
    Ok(total_bytes)
}

/// An ERROR_OFFSET chunk: errno, message length, message, offset of the failure (inside the
/// request's range). Returns the bytes written. Messages are truncated as for
/// [`encode_error_chunk`].
pub fn encode_error_offset_chunk(
    cookie: Cookie,
    error: Errno,
    message: &str,
    offset_bytes: u64,
    done: Done,
    out: &mut [u8],
) -> Result<usize, EncodeError> {
    let message = truncate_message(message).as_bytes();
    let total_bytes = ERROR_OFFSET_CHUNK_BASE_BYTES + message.len();
    let out = checked_prefix(out, total_bytes)?;
    let (header, rest) = out.split_at_mut(CHUNK_HEADER_BYTES);
    encode_chunk_header(
        cookie,
        wire::REPLY_TYPE_ERROR_OFFSET,
        done,
        (14 + message.len()) as u32,
        header.try_into().expect("20 bytes"),
    );
    rest[0..4].copy_from_slice(&error.wire_value().to_be_bytes());
    rest[4..6].copy_from_slice(&(message.len() as u16).to_be_bytes());
    rest[6..6 + message.len()].copy_from_slice(message);
    rest[6 + message.len()..].copy_from_slice(&offset_bytes.to_be_bytes());
    Ok(total_bytes)
}

/// The complete error reply for a failed request, in the form the negotiation requires: a
/// final ERROR chunk without message when structured replies are on (mandatory for READ,
/// allowed for the rest), else a simple reply. Returns the bytes written.
pub fn encode_error_reply(
    cookie: Cookie,
    error: Errno,
    structured_replies: bool,
    out: &mut [u8; ERROR_REPLY_MAX_BYTES],
) -> usize {
    if structured_replies {
        encode_error_chunk(cookie, error, "", Done::Last, out).expect("buffer sized for it")
    } else {
        let simple: &mut [u8; SIMPLE_REPLY_BYTES] = (&mut out[..SIMPLE_REPLY_BYTES])
            .try_into()
            .expect("16 bytes");
        encode_simple_reply(cookie, Some(error), simple);
        SIMPLE_REPLY_BYTES
    }
}

fn checked_prefix(out: &mut [u8], needed_bytes: usize) -> Result<&mut [u8], EncodeError> {
    let available_bytes = out.len();
    out.get_mut(..needed_bytes)
        .ok_or(EncodeError::BufferTooSmall {
            needed_bytes,
            available_bytes,
        })
}

fn truncate_message(message: &str) -> &str {
    if message.len() <= wire::MAX_STRING_BYTES {
        return message;
    }
    let mut end = wire::MAX_STRING_BYTES;
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    &message[..end]
}
