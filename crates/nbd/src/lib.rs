//! NBD export for oxpool.
//!
//! [`proto`] is the protocol codec, free of I/O: the server loop owns the sockets and drives
//! it. The most used items are re-exported at the crate root.
//!
//! [`server`] (feature `server`, on by default) serves the engine's volumes with it: reactor
//! threads, each running its connections on its own io_uring ring. Without the feature the
//! crate is the codec alone (what the fuzz targets build).

#![warn(missing_docs)]

pub mod proto;
#[cfg(feature = "server")]
pub mod server;

pub use proto::{
    validate, Command, CommandFlags, Cookie, Errno, ExportAccess, ExportCaps, ExportInfo,
    Handshake, HandshakeProgress, HandshakeStatus, MetaContextId, Negotiated, ProtocolError,
    Request, RequestDecoder, TlsPolicy,
};
#[cfg(feature = "server")]
pub use server::{Server, ServerConfig, ServerExport, ShutdownHandle};
