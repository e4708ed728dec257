//! Errors of the codec.
//!
//! Two kinds, kept apart on purpose:
//! - [`ProtocolError`]: the peer broke the protocol in a way that ends the connection. The
//!   caller sends what the error says it may (see each variant), then closes the socket.
//! - Per-request failures are not errors of the codec: [`super::validate`] returns an
//!   [`super::Errno`] to put in the reply, and the connection goes on.

use super::types::{Cookie, Errno};

/// A violation that ends the connection (a "hard disconnect" in the protocol's words).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    /// The client set flags the server did not advertise; the protocol says the server MUST
    /// drop the connection.
    #[error("client sent unknown handshake flags {flags:#x}")]
    UnknownClientFlags {
        /// The client flags as received.
        flags: u32,
    },
    /// An option did not start with `IHAVEOPT`: the stream is out of sync.
    #[error("option header has bad magic {found:#018x}")]
    BadOptionMagic {
        /// The 64 bits found where the magic should be.
        found: u64,
    },
    /// `NBD_OPT_EXPORT_NAME` named an export that does not exist. That option has no error
    /// reply, so the protocol requires terminating the session.
    #[error("NBD_OPT_EXPORT_NAME asked for an unknown export")]
    UnknownExport,
    /// `NBD_OPT_EXPORT_NAME` gave an empty name, which selects no export when the client may
    /// open several (it cannot be told so: the session ends as for an unknown export).
    #[error("NBD_OPT_EXPORT_NAME gave an empty name, and several exports are offered (name one)")]
    NoDefaultExport,
    /// `NBD_OPT_EXPORT_NAME` carried more than a protocol string may hold; it cannot be
    /// answered with an error, and reading it would buffer untrusted data.
    #[error("NBD_OPT_EXPORT_NAME data of {length_bytes} bytes exceeds the string limit")]
    ExportNameTooLong {
        /// The option length claimed by the client.
        length_bytes: u32,
    },
    /// The client sent more options than a handshake may take; treated as a denial of
    /// service, which the protocol allows a server to end.
    #[error("more than {limit} options in one handshake")]
    TooManyOptions {
        /// The limit that was exceeded.
        limit: u32,
    },
    /// A request did not start with `NBD_REQUEST_MAGIC`: the stream is out of sync and no
    /// later byte can be trusted.
    #[error("request header has bad magic {found:#010x}")]
    BadRequestMagic {
        /// The 32 bits found where the magic should be.
        found: u32,
    },
    /// A WRITE announced a payload larger than the maximum block size. Its length is not
    /// trusted enough to read (or skip) that many bytes, so the connection ends. The caller
    /// MAY first send an error reply with [`ProtocolError::reply_errno`] for `cookie`, as a
    /// courtesy to the client, then close.
    #[error("write of {length_bytes} bytes exceeds the maximum payload")]
    WriteTooLarge {
        /// Cookie of the offending request.
        cookie: Cookie,
        /// The length the client claimed.
        length_bytes: u32,
    },
    /// `NBD_OPT_EXPORT_NAME` before `NBD_OPT_STARTTLS` while TLS is required: that option
    /// cannot carry an error, so the protocol says drop the connection.
    #[error("NBD_OPT_EXPORT_NAME before NBD_OPT_STARTTLS while TLS is required")]
    TlsRequired,
    /// Bytes arrived after `NBD_OPT_STARTTLS` before the TLS handshake: plain text injected
    /// ahead of TLS (nbdkit CVE-2021-3716), never to be taken as options.
    #[error("plain-text bytes after NBD_OPT_STARTTLS")]
    DataAfterStartTls,
    /// `NBD_OPT_EXPORT_NAME` named an export this client may not open; that option has no
    /// error reply.
    #[error("NBD_OPT_EXPORT_NAME asked for an export this client may not open")]
    ExportRefused,
    /// `NBD_OPT_EXPORT_NAME` named an export that was renamed or removed after the handshake
    /// listed it (the name may now mean another volume); that option has no error reply.
    #[error("NBD_OPT_EXPORT_NAME asked for an export renamed or removed during the handshake")]
    ExportChanged,
    /// The state machine already finished (after GO, EXPORT_NAME, ABORT or an earlier error)
    /// and was fed again: a bug in the caller, reported rather than panicking.
    #[error("the state machine already finished")]
    Finished,
}

impl ProtocolError {
    /// The error to put in a best-effort reply before closing, for errors tied to a request.
    pub fn reply_errno(&self) -> Option<(Cookie, Errno)> {
        match *self {
            // EINVAL, not EOVERFLOW: the protocol reserves EOVERFLOW for READ with DF, and
            // says requests over the maximum block size get EINVAL.
            ProtocolError::WriteTooLarge { cookie, .. } => Some((cookie, Errno::Inval)),
            _ => None,
        }
    }
}

/// A reply could not be encoded: the caller passed arguments the protocol forbids, or a
/// buffer too small. These are bugs in the caller, reported as values so the server can log
/// and drop the connection instead of sending a malformed reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EncodeError {
    /// The output buffer is shorter than the encoded reply.
    #[error("output buffer holds {available_bytes} bytes, reply needs {needed_bytes}")]
    BufferTooSmall {
        /// Bytes the reply needs.
        needed_bytes: usize,
        /// Bytes the buffer has.
        available_bytes: usize,
    },
    /// A chunk would describe zero bytes (OFFSET_DATA, OFFSET_HOLE and block status
    /// descriptors must be nonzero).
    #[error("chunk or descriptor of zero length")]
    ZeroLength,
    /// A BLOCK_STATUS chunk needs at least one descriptor.
    #[error("block status chunk without descriptors")]
    NoDescriptors,
    /// The payload does not fit the 32-bit length field of a chunk.
    #[error("chunk payload too large for the length field")]
    PayloadTooLarge,
}
