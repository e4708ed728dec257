//! The messages of the control protocol and their payloads.
//!
//! Client to server: one [`Message::Request`], then, only if the server asks for it with
//! [`Message::StdinWanted`], the client's standard input as [`Message::Stdin`] chunks and one
//! [`Message::StdinEnd`]. Server to client: [`Message::Stdout`], [`Message::Stderr`] and
//! [`Message::Progress`] as the command runs, then exactly one [`Message::Exit`], after which
//! the server closes the connection.

/// Versions of the protocol, as a changelog. A peer that receives a frame of a version it
/// does not speak answers (if it is the server) with an [`Message::Exit`] in its own version
/// naming both, and closes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u16)]
pub enum ProtocolVersion {
    /// 2026-11: requests as command lines; output, progress, standard input, exit.
    V1 = 1,
}

impl ProtocolVersion {
    /// The version this build speaks.
    pub const CURRENT: ProtocolVersion = ProtocolVersion::V1;
}

/// Most command-line arguments in one request (a bound on the decoder's loop).
pub const ARGS_MAX: usize = 4096;

/// A command to run in the server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    /// The command line after the program name and the global options, e.g.
    /// `["set", "sync=always", "tank/vol0"]`.
    pub args: Vec<String>,
    /// The client's working directory: relative paths in `args` are relative to it.
    pub cwd: String,
    /// Whether the client's standard error is a terminal (progress bars are drawn there).
    pub stderr_is_terminal: bool,
}

/// One message of the protocol.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Message {
    /// Client: run this command.
    Request(Request),
    /// Client: bytes of its standard input.
    Stdin(Vec<u8>),
    /// Client: its standard input is at its end.
    StdinEnd,
    /// Server: bytes for the client's standard output.
    Stdout(Vec<u8>),
    /// Server: bytes for the client's standard error.
    Stderr(Vec<u8>),
    /// Server: how far a long operation has come (the client draws it on a terminal).
    Progress {
        /// What is in progress, e.g. `scrub tank`.
        label: String,
        /// Units done (bytes).
        done: u64,
        /// Units in all (bytes; an estimate while the operation runs).
        total: u64,
    },
    /// Server: the command reads standard input; send it.
    StdinWanted,
    /// Server: the command ended with this exit status; a non-empty `error` is the one-line
    /// message the client prints (as `oxpool: ERROR`).
    Exit {
        /// Exit status (0: success).
        code: i32,
        /// The error, if the command failed.
        error: String,
    },
}

/// Message kinds as they appear in a frame header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u16)]
pub(crate) enum Kind {
    Request = 1,
    Stdin = 2,
    StdinEnd = 3,
    Stdout = 16,
    Stderr = 17,
    Progress = 18,
    StdinWanted = 19,
    Exit = 20,
}

impl Kind {
    pub(crate) fn from_u16(v: u16) -> Option<Kind> {
        Some(match v {
            1 => Kind::Request,
            2 => Kind::Stdin,
            3 => Kind::StdinEnd,
            16 => Kind::Stdout,
            17 => Kind::Stderr,
            18 => Kind::Progress,
            19 => Kind::StdinWanted,
            20 => Kind::Exit,
            _ => return None,
        })
    }
}

impl Message {
    pub(crate) fn kind(&self) -> Kind {
        match self {
            Message::Request(_) => Kind::Request,
            Message::Stdin(_) => Kind::Stdin,
            Message::StdinEnd => Kind::StdinEnd,
            Message::Stdout(_) => Kind::Stdout,
            Message::Stderr(_) => Kind::Stderr,
            Message::Progress { .. } => Kind::Progress,
            Message::StdinWanted => Kind::StdinWanted,
            Message::Exit { .. } => Kind::Exit,
        }
    }
}
