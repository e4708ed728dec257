//! Typed values shared by the handshake, the request decoder and the reply encoders.

use super::meta::{MetaContext, SelectedContext};
use super::wire;

/// Largest request length the server accepts for READ, WRITE, CACHE and WRITE_ZEROES (without
/// FAST_ZERO), and the maximum block size advertised in `NBD_INFO_BLOCK_SIZE`.
///
/// 32 MiB is the size the protocol says no one should call a denial of service, and the size
/// portable clients already limit themselves to; it is also the largest WRITE payload the
/// decoder trusts enough to read.
pub const MAX_BLOCK_BYTES: u32 = 32 * 1024 * 1024;

/// Minimum block size advertised in `NBD_INFO_BLOCK_SIZE`: any byte alignment is served (the
/// volume layer does read-modify-write where it must).
pub const MIN_BLOCK_BYTES: u32 = 1;

/// Opaque value chosen by the client to match replies to requests (`handle` in older texts).
///
/// The server must echo it unchanged; it has no meaning to the server.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Cookie(pub u64);

/// Identifier of a metadata context, chosen by the server in `NBD_REP_META_CONTEXT` and echoed
/// in `NBD_REPLY_TYPE_BLOCK_STATUS` chunks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MetaContextId(pub u32);

impl MetaContextId {
    /// The id this server gives to `base:allocation` after `NBD_OPT_SET_META_CONTEXT`.
    ///
    /// Nonzero on purpose: list replies carry the reserved id 0, so a selected context is
    /// never confused with a listed one when reading a trace.
    pub const BASE_ALLOCATION: MetaContextId = MetaContextId(1);
}

/// Error values of the transmission phase, as defined by the protocol (not the host's errno).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum Errno {
    /// `NBD_EPERM`: operation not permitted (write to a read-only export).
    Perm = 1,
    /// `NBD_EIO`: input/output error.
    Io = 5,
    /// `NBD_ENOMEM`: cannot allocate memory (the protocol asks servers to avoid it).
    NoMem = 12,
    /// `NBD_EINVAL`: invalid argument (bad flags, range, length, unknown command).
    Inval = 22,
    /// `NBD_ENOSPC`: no space left (write beyond the end of the export).
    NoSpc = 28,
    /// `NBD_EOVERFLOW`: value too large (only for READ with DF).
    Overflow = 75,
    /// `NBD_ENOTSUP`: operation not supported (only for WRITE_ZEROES with FAST_ZERO).
    NotSup = 95,
    /// `NBD_ESHUTDOWN`: the server is shutting down.
    Shutdown = 108,
}

impl Errno {
    /// The value sent in the error field of a reply.
    pub const fn wire_value(self) -> u32 {
        self as u32
    }

    /// Parses a wire value; `None` for values the protocol does not define (a client treats
    /// those as EINVAL).
    pub const fn from_wire(value: u32) -> Option<Errno> {
        Some(match value {
            1 => Errno::Perm,
            5 => Errno::Io,
            12 => Errno::NoMem,
            22 => Errno::Inval,
            28 => Errno::NoSpc,
            75 => Errno::Overflow,
            95 => Errno::NotSup,
            108 => Errno::Shutdown,
            _ => return None,
        })
    }
}

/// The command type of a transmission request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Command {
    /// `NBD_CMD_READ`.
    Read,
    /// `NBD_CMD_WRITE`: followed by `length` payload bytes.
    Write,
    /// `NBD_CMD_DISC`: soft disconnect; never answered.
    Disconnect,
    /// `NBD_CMD_FLUSH`.
    Flush,
    /// `NBD_CMD_TRIM`.
    Trim,
    /// `NBD_CMD_CACHE`.
    Cache,
    /// `NBD_CMD_WRITE_ZEROES`.
    WriteZeroes,
    /// `NBD_CMD_BLOCK_STATUS`.
    BlockStatus,
    /// Any other type (including the experimental RESIZE): answered with EINVAL.
    Unknown(u16),
}

impl Command {
    /// Parses the 16-bit type field.
    pub const fn from_wire(value: u16) -> Command {
        match value {
            wire::CMD_READ => Command::Read,
            wire::CMD_WRITE => Command::Write,
            wire::CMD_DISC => Command::Disconnect,
            wire::CMD_FLUSH => Command::Flush,
            wire::CMD_TRIM => Command::Trim,
            wire::CMD_CACHE => Command::Cache,
            wire::CMD_WRITE_ZEROES => Command::WriteZeroes,
            wire::CMD_BLOCK_STATUS => Command::BlockStatus,
            other => Command::Unknown(other),
        }
    }

    /// The 16-bit type field.
    pub const fn wire_value(self) -> u16 {
        match self {
            Command::Read => wire::CMD_READ,
            Command::Write => wire::CMD_WRITE,
            Command::Disconnect => wire::CMD_DISC,
            Command::Flush => wire::CMD_FLUSH,
            Command::Trim => wire::CMD_TRIM,
            Command::Cache => wire::CMD_CACHE,
            Command::WriteZeroes => wire::CMD_WRITE_ZEROES,
            Command::BlockStatus => wire::CMD_BLOCK_STATUS,
            Command::Unknown(other) => other,
        }
    }

    /// Whether the command changes the export's contents (refused with EPERM when read-only).
    pub const fn is_mutating(self) -> bool {
        matches!(self, Command::Write | Command::Trim | Command::WriteZeroes)
    }
}

/// The 16-bit command flags of a request.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct CommandFlags(pub u16);

impl CommandFlags {
    /// No flags.
    pub const NONE: CommandFlags = CommandFlags(0);
    /// Force unit access: reply only once the command's writes are durable.
    pub const FUA: CommandFlags = CommandFlags(wire::CMD_FLAG_FUA);
    /// WRITE_ZEROES: allocate, do not punch a hole.
    pub const NO_HOLE: CommandFlags = CommandFlags(wire::CMD_FLAG_NO_HOLE);
    /// READ: at most one content chunk in the structured reply.
    pub const DF: CommandFlags = CommandFlags(wire::CMD_FLAG_DF);
    /// BLOCK_STATUS: exactly one extent per context.
    pub const REQ_ONE: CommandFlags = CommandFlags(wire::CMD_FLAG_REQ_ONE);
    /// WRITE_ZEROES: fail with ENOTSUP unless zeroing is faster than writing.
    pub const FAST_ZERO: CommandFlags = CommandFlags(wire::CMD_FLAG_FAST_ZERO);

    /// Whether every bit of `other` is set.
    pub const fn contains(self, other: CommandFlags) -> bool {
        self.0 & other.0 == other.0
    }

    /// Union of two flag sets.
    pub const fn union(self, other: CommandFlags) -> CommandFlags {
        CommandFlags(self.0 | other.0)
    }

    /// The raw bits.
    pub const fn bits(self) -> u16 {
        self.0
    }
}

/// The 16-bit transmission flags sent with the export size.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct TransmissionFlags(pub u16);

impl TransmissionFlags {
    /// Whether every bit of `flag` (one of the `wire::TFLAG_*` values) is set.
    pub const fn has(self, flag: u16) -> bool {
        self.0 & flag == flag
    }

    /// The raw bits.
    pub const fn bits(self) -> u16 {
        self.0
    }

    /// The flags advertised for `export`, given whether structured replies were negotiated.
    ///
    /// A read-only export does not advertise TRIM or WRITE_ZEROES: they would only ever fail
    /// with EPERM. DF is advertised only with structured replies, as the protocol requires;
    /// FAST_ZERO only together with WRITE_ZEROES, for the same reason.
    pub fn for_export(export: &ExportInfo, structured_replies: bool) -> TransmissionFlags {
        let caps = &export.caps;
        let mut bits = wire::TFLAG_HAS_FLAGS;
        let mut set = |cond: bool, flag: u16| {
            if cond {
                bits |= flag;
            }
        };
        set(export.read_only, wire::TFLAG_READ_ONLY);
        set(caps.flush, wire::TFLAG_SEND_FLUSH);
        set(caps.fua, wire::TFLAG_SEND_FUA);
        set(caps.rotational, wire::TFLAG_ROTATIONAL);
        let writable = !export.read_only;
        set(writable && caps.trim, wire::TFLAG_SEND_TRIM);
        set(writable && caps.write_zeroes, wire::TFLAG_SEND_WRITE_ZEROES);
        set(
            writable && caps.write_zeroes && caps.fast_zero,
            wire::TFLAG_SEND_FAST_ZERO,
        );
        set(structured_replies && caps.df, wire::TFLAG_SEND_DF);
        set(caps.multi_conn, wire::TFLAG_CAN_MULTI_CONN);
        set(caps.cache, wire::TFLAG_SEND_CACHE);
        TransmissionFlags(bits)
    }
}

/// Optional features of an export; each becomes a transmission flag (see
/// [`TransmissionFlags::for_export`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ExportCaps {
    /// `NBD_CMD_FLUSH` is served.
    pub flush: bool,
    /// `NBD_CMD_FLAG_FUA` is honoured.
    pub fua: bool,
    /// `NBD_CMD_TRIM` is served.
    pub trim: bool,
    /// `NBD_CMD_WRITE_ZEROES` (with NO_HOLE) is served.
    pub write_zeroes: bool,
    /// `NBD_CMD_FLAG_FAST_ZERO` is understood (the server answers ENOTSUP when zeroing would
    /// not be fast).
    pub fast_zero: bool,
    /// `NBD_CMD_CACHE` is served.
    pub cache: bool,
    /// READ with `NBD_CMD_FLAG_DF` is served (one content chunk per read).
    pub df: bool,
    /// Flush and FUA are visible across connections to the same export.
    pub multi_conn: bool,
    /// The export behaves like a rotational medium (a scheduling hint for the client).
    pub rotational: bool,
}

impl Default for ExportCaps {
    /// Everything the codec supports, except the two that are statements about the engine
    /// rather than the protocol: multi-connection consistency and rotational media.
    fn default() -> Self {
        ExportCaps {
            flush: true,
            fua: true,
            trim: true,
            write_zeroes: true,
            fast_zero: true,
            cache: true,
            df: true,
            multi_conn: false,
            rotational: false,
        }
    }
}

/// How a server treats TLS during negotiation: the protocol's NOTLS, SELECTIVETLS and
/// FORCEDTLS modes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum TlsPolicy {
    /// No TLS: `NBD_OPT_STARTTLS` is answered `NBD_REP_ERR_UNSUP`.
    #[default]
    Off,
    /// TLS if the client asks for it; exports marked [`ExportAccess::TlsRequired`] only
    /// through TLS.
    Optional,
    /// Every option before `NBD_OPT_STARTTLS` but ABORT is refused with
    /// `NBD_REP_ERR_TLS_REQD`.
    Required,
}

/// Whether one client may open one export, as the server decides per connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ExportAccess {
    /// Listed, and GO/INFO/meta context succeed.
    Allowed,
    /// Not listed; refused with `NBD_REP_ERR_TLS_REQD` (TLS may allow it: SELECTIVETLS).
    TlsRequired,
    /// Not listed; refused with `NBD_REP_ERR_POLICY`.
    Denied,
}

/// What the server says about one export.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExportInfo {
    /// Name the client asks for (at most [`wire::MAX_STRING_BYTES`], no NUL).
    pub name: String,
    /// Human-readable description; empty means "none" and is not sent.
    pub description: String,
    /// Size of the export.
    pub size_bytes: u64,
    /// Preferred block size (the volume block size). Advertised after clamping to a power of
    /// two in `512..=MAX_BLOCK_BYTES`, as the protocol requires.
    pub preferred_block_bytes: u32,
    /// Refuse writes, trims and write-zeroes with EPERM.
    pub read_only: bool,
    /// Optional features.
    pub caps: ExportCaps,
}

impl ExportInfo {
    /// The preferred block size as advertised: a power of two in `512..=MAX_BLOCK_BYTES`
    /// (rounded down), so that a misconfigured value never produces an invalid
    /// `NBD_INFO_BLOCK_SIZE` that a strict client would reject.
    pub fn advertised_preferred_block_bytes(&self) -> u32 {
        let clamped = self.preferred_block_bytes.clamp(512, MAX_BLOCK_BYTES);
        // Round down to a power of two: keep only the highest set bit.
        1 << (31 - clamped.leading_zeros())
    }
}

/// The outcome of a successful handshake: what the transmission phase must obey.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Negotiated {
    /// Index of the chosen export in the list given to [`super::Handshake::new`].
    pub export_index: usize,
    /// Structured replies were negotiated: READ must be answered with structured chunks.
    pub structured_replies: bool,
    /// The metadata contexts the client selected for the chosen export, in id order (at most
    /// `base:allocation` and [`super::CHANGE_MAPS_SELECTED_MAX`] change maps); empty means
    /// BLOCK_STATUS is refused with EINVAL. BLOCK_STATUS answers one chunk per entry.
    pub meta_contexts: Vec<SelectedContext>,
    /// The transmission flags sent to the client (validation uses exactly these).
    pub transmission_flags: TransmissionFlags,
    /// How the client entered transmission.
    pub entered_by: EnteredBy,
}

impl Negotiated {
    /// The id of `base:allocation`, if the client selected it.
    pub fn base_allocation(&self) -> Option<MetaContextId> {
        self.meta_contexts
            .iter()
            .find(|c| c.context == MetaContext::BaseAllocation)
            .map(|c| c.id)
    }
}

/// The option that ended the handshake.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EnteredBy {
    /// `NBD_OPT_GO`.
    Go,
    /// `NBD_OPT_EXPORT_NAME` (older clients; no block size negotiation).
    ExportName,
}

/// Status flags of one extent: `base:allocation`'s, or a change map's.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct BlockStatusFlags(pub u32);

impl BlockStatusFlags {
    /// Allocated (or unknown) data.
    pub const DATA: BlockStatusFlags = BlockStatusFlags(0);
    /// Not allocated: writes there may need space.
    pub const HOLE: BlockStatusFlags = BlockStatusFlags(wire::STATE_HOLE);
    /// Reads as zeros.
    pub const ZERO: BlockStatusFlags = BlockStatusFlags(wire::STATE_ZERO);
    /// An unallocated range that reads as zeros (the usual state of a never-written block).
    pub const HOLE_ZERO: BlockStatusFlags = BlockStatusFlags(wire::STATE_HOLE | wire::STATE_ZERO);
    /// A change map's extent that is the same as at the base.
    pub const UNCHANGED: BlockStatusFlags = BlockStatusFlags(0);
    /// A change map's extent written, trimmed or zeroed since the base.
    pub const CHANGED: BlockStatusFlags = BlockStatusFlags(wire::STATE_CHANGED);
}

/// One extent of a BLOCK_STATUS reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BlockStatusDescriptor {
    /// Length of the extent; must be nonzero.
    pub length_bytes: u32,
    /// Status of the extent.
    pub flags: BlockStatusFlags,
}
