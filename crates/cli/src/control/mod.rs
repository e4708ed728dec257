//! The control channel between `oxpool` commands and a running `oxpool serve`: where servers
//! are found (`runtime`), the server's socket (`server`) and the client's side (`client`).
//! The protocol itself is the `oxpool-control` crate; `docs/control.md` describes both.

pub mod client;
pub mod runtime;
pub mod server;
