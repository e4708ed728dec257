//! Frames: encoding, decoding, and reading and writing them over a stream.
//!
//! ```text
//! offset  size  field
//!      0     4  magic "OXCT"
//!      4     2  version (little-endian u16; see ProtocolVersion)
//!      6     2  kind (u16; see Kind)
//!      8     4  payload length in bytes (u32, at most PAYLOAD_BYTES_MAX)
//!     12     n  payload
//!   12+n     4  CRC-32C of bytes 0 .. 12+n
//! ```
//!
//! Payload fields are little-endian; a string or byte string is a u32 length and the bytes;
//! a string is UTF-8. A payload must be consumed exactly: trailing bytes are an error.

use std::io::{Read, Write};

use crate::message::{Kind, Message, ProtocolVersion, Request, ARGS_MAX};

/// The first four bytes of every frame.
pub const MAGIC: [u8; 4] = *b"OXCT";
/// Bytes before the payload.
pub const FRAME_HEADER_BYTES: usize = 12;
/// Bytes after the payload (the checksum).
pub const FRAME_TRAILER_BYTES: usize = 4;
/// Largest payload of one frame. Output and standard input travel in chunks of at most this.
pub const PAYLOAD_BYTES_MAX: usize = 1 << 20;

/// Why bytes are not a valid frame.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The first bytes are not "OXCT".
    #[error("not an oxpool control frame (bad magic)")]
    BadMagic,
    /// A version this build does not speak.
    #[error("control protocol version {0}, but this oxpool speaks version 1")]
    UnsupportedVersion(u16),
    /// A message kind this version does not have.
    #[error("unknown control message kind {0}")]
    UnknownKind(u16),
    /// A payload longer than [`PAYLOAD_BYTES_MAX`].
    #[error("control frame of {0} bytes is larger than the limit of {PAYLOAD_BYTES_MAX}")]
    TooLarge(u32),
    /// The frame's checksum does not match its bytes.
    #[error("control frame checksum mismatch")]
    BadChecksum,
    /// The payload does not hold what its kind says.
    #[error("malformed control message: {0}")]
    Malformed(&'static str),
}

/// A message too large for one frame.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("control message of {0} bytes is larger than the limit of {PAYLOAD_BYTES_MAX}")]
pub struct TooLarge(pub usize);

/// Encodes `message` as one frame appended to `out`; a payload over [`PAYLOAD_BYTES_MAX`]
/// appends nothing and is an error (output and input travel in chunks; a command line or an
/// error text that large is refused).
pub fn encode(message: &Message, out: &mut Vec<u8>) -> Result<(), TooLarge> {
    let start = out.len();
    out.extend_from_slice(&MAGIC);
    out.extend_from_slice(&(ProtocolVersion::CURRENT as u16).to_le_bytes());
    out.extend_from_slice(&(message.kind() as u16).to_le_bytes());
    out.extend_from_slice(&[0; 4]); // length, filled in below
    let payload_start = out.len();
    match message {
        Message::Request(r) => {
            put_u32(out, r.args.len() as u32);
            for a in &r.args {
                put_bytes(out, a.as_bytes());
            }
            put_bytes(out, r.cwd.as_bytes());
            out.push(u8::from(r.stderr_is_terminal));
        }
        Message::Stdin(b) | Message::Stdout(b) | Message::Stderr(b) => put_bytes(out, b),
        Message::StdinEnd | Message::StdinWanted => {}
        Message::Progress { label, done, total } => {
            put_bytes(out, label.as_bytes());
            out.extend_from_slice(&done.to_le_bytes());
            out.extend_from_slice(&total.to_le_bytes());
        }
        Message::Exit { code, error } => {
            out.extend_from_slice(&code.to_le_bytes());
            put_bytes(out, error.as_bytes());
        }
    }
    let payload_bytes = out.len() - payload_start;
    if payload_bytes > PAYLOAD_BYTES_MAX {
        out.truncate(start);
        return Err(TooLarge(payload_bytes));
    }
    out[start + 8..start + 12].copy_from_slice(&(payload_bytes as u32).to_le_bytes());
    let crc = crc32c::crc32c(&out[start..]);
    out.extend_from_slice(&crc.to_le_bytes());
    Ok(())
}

fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

fn put_bytes(out: &mut Vec<u8>, b: &[u8]) {
    put_u32(out, b.len() as u32);
    out.extend_from_slice(b);
}

/// Checks a frame header; returns the kind and the payload length.
fn check_header(header: &[u8; FRAME_HEADER_BYTES]) -> Result<(Kind, usize), DecodeError> {
    if header[..4] != MAGIC {
        return Err(DecodeError::BadMagic);
    }
    let version = u16::from_le_bytes([header[4], header[5]]);
    if version != ProtocolVersion::CURRENT as u16 {
        return Err(DecodeError::UnsupportedVersion(version));
    }
    let kind = u16::from_le_bytes([header[6], header[7]]);
    let kind = Kind::from_u16(kind).ok_or(DecodeError::UnknownKind(kind))?;
    let len = u32::from_le_bytes([header[8], header[9], header[10], header[11]]);
    if len as usize > PAYLOAD_BYTES_MAX {
        return Err(DecodeError::TooLarge(len));
    }
    Ok((kind, len as usize))
}

/// Decodes the frame at the start of `buf`: `Ok(None)` if more bytes are needed, else the
/// message and the bytes it took. A bad header is reported as soon as its 12 bytes are in,
/// before any payload is awaited.
pub fn decode(buf: &[u8]) -> Result<Option<(Message, usize)>, DecodeError> {
    let Some(header) = buf.first_chunk::<FRAME_HEADER_BYTES>() else {
        // Reject a wrong magic early, from what is there.
        let n = buf.len().min(4);
        if buf[..n] != MAGIC[..n] {
            return Err(DecodeError::BadMagic);
        }
        return Ok(None);
    };
    let (kind, len) = check_header(header)?;
    let total = FRAME_HEADER_BYTES + len + FRAME_TRAILER_BYTES;
    if buf.len() < total {
        return Ok(None);
    }
    let body = &buf[..FRAME_HEADER_BYTES + len];
    let crc = u32::from_le_bytes(
        buf[FRAME_HEADER_BYTES + len..total]
            .try_into()
            .expect("4 bytes"),
    );
    if crc32c::crc32c(body) != crc {
        return Err(DecodeError::BadChecksum);
    }
    let message = decode_payload(kind, &body[FRAME_HEADER_BYTES..])?;
    Ok(Some((message, total)))
}

/// A cursor over a payload; every read is checked against what is left.
struct Payload<'a> {
    rest: &'a [u8],
}

impl<'a> Payload<'a> {
    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], DecodeError> {
        if n > self.rest.len() {
            return Err(DecodeError::Malformed(what));
        }
        let (head, tail) = self.rest.split_at(n);
        self.rest = tail;
        Ok(head)
    }

    fn u8(&mut self, what: &'static str) -> Result<u8, DecodeError> {
        Ok(self.take(1, what)?[0])
    }

    fn u32(&mut self, what: &'static str) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(
            self.take(4, what)?.try_into().expect("4 bytes"),
        ))
    }

    fn u64(&mut self, what: &'static str) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(
            self.take(8, what)?.try_into().expect("8 bytes"),
        ))
    }

    fn bytes(&mut self, what: &'static str) -> Result<&'a [u8], DecodeError> {
        let n = self.u32(what)? as usize;
        self.take(n, what)
    }

    fn string(&mut self, what: &'static str) -> Result<String, DecodeError> {
        let b = self.bytes(what)?;
        std::str::from_utf8(b)
            .map(str::to_string)
            .map_err(|_| DecodeError::Malformed("a string is not UTF-8"))
    }

    fn end(self) -> Result<(), DecodeError> {
        if self.rest.is_empty() {
            Ok(())
        } else {
            Err(DecodeError::Malformed("bytes after the message"))
        }
    }
}

fn decode_payload(kind: Kind, payload: &[u8]) -> Result<Message, DecodeError> {
    let mut p = Payload { rest: payload };
    let message = match kind {
        Kind::Request => {
            let argc = p.u32("argument count")? as usize;
            if argc > ARGS_MAX {
                return Err(DecodeError::Malformed("too many arguments"));
            }
            // Bounded by ARGS_MAX, and each argument takes at least its 4-byte length.
            let mut args = Vec::with_capacity(argc.min(payload.len() / 4));
            for _ in 0..argc {
                args.push(p.string("argument")?);
            }
            let cwd = p.string("working directory")?;
            let stderr_is_terminal = match p.u8("terminal flag")? {
                0 => false,
                1 => true,
                _ => return Err(DecodeError::Malformed("terminal flag is not 0 or 1")),
            };
            Message::Request(Request {
                args,
                cwd,
                stderr_is_terminal,
            })
        }
        Kind::Stdin => Message::Stdin(p.bytes("stdin data")?.to_vec()),
        Kind::Stdout => Message::Stdout(p.bytes("stdout data")?.to_vec()),
        Kind::Stderr => Message::Stderr(p.bytes("stderr data")?.to_vec()),
        Kind::StdinEnd => Message::StdinEnd,
        Kind::StdinWanted => Message::StdinWanted,
        Kind::Progress => Message::Progress {
            label: p.string("progress label")?,
            done: p.u64("progress done")?,
            total: p.u64("progress total")?,
        },
        Kind::Exit => {
            let code = p.u32("exit code")? as i32;
            Message::Exit {
                code,
                error: p.string("exit error")?,
            }
        }
    };
    p.end()?;
    Ok(message)
}

/// What reading a message from a stream can fail with.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The stream failed.
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// The bytes are not a valid frame.
    #[error("{0}")]
    Decode(#[from] DecodeError),
    /// The stream ended inside a frame.
    #[error("the connection ended in the middle of a control message")]
    Truncated,
}

/// Reads one message; `Ok(None)` at a clean end of the stream (between frames). The payload
/// buffer is sized from a length already checked against [`PAYLOAD_BYTES_MAX`].
pub fn read_message(stream: &mut impl Read) -> Result<Option<Message>, ReadError> {
    let mut header = [0u8; FRAME_HEADER_BYTES];
    let mut got = 0;
    // Bounded: each pass reads at least one byte or ends.
    while got < header.len() {
        match stream.read(&mut header[got..]) {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => return Err(ReadError::Truncated),
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    let (_, len) = check_header(&header)?;
    let mut frame = Vec::with_capacity(FRAME_HEADER_BYTES + len + FRAME_TRAILER_BYTES);
    frame.extend_from_slice(&header);
    frame.resize(FRAME_HEADER_BYTES + len + FRAME_TRAILER_BYTES, 0);
    stream
        .read_exact(&mut frame[FRAME_HEADER_BYTES..])
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::UnexpectedEof => ReadError::Truncated,
            _ => ReadError::Io(e),
        })?;
    match decode(&frame)? {
        Some((message, used)) => {
            debug_assert_eq!(used, frame.len());
            Ok(Some(message))
        }
        None => Err(ReadError::Truncated),
    }
}

/// Writes one message as one frame (a message too large for one is `InvalidInput`).
pub fn write_message(stream: &mut impl Write, message: &Message) -> std::io::Result<()> {
    let mut out = Vec::new();
    encode(message, &mut out)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
    stream.write_all(&out)
}
