//! Wire constants of the NBD protocol (values from the NetworkBlockDevice `proto.md`).
//!
//! Every multi-byte field on the wire is big-endian ("network byte order"). The constants are
//! public so that test clients, fuzz targets and the server can speak about the same numbers;
//! the typed API (`Command`, `CommandFlags`, `TransmissionFlags`, ...) is what the rest of the
//! code should use.

/// First 8 bytes of the server greeting: ASCII `NBDMAGIC`.
pub const NBDMAGIC: u64 = 0x4e42_444d_4147_4943;
/// Second 8 bytes of the newstyle greeting, and the prefix of every client option: `IHAVEOPT`.
pub const IHAVEOPT: u64 = 0x4948_4156_454f_5054;
/// Prefix of every option reply sent by the server during fixed newstyle haggling.
pub const OPTION_REPLY_MAGIC: u64 = 0x0003_e889_0455_65a9;
/// Prefix of every transmission request (`NBD_REQUEST_MAGIC`).
pub const REQUEST_MAGIC: u32 = 0x2560_9513;
/// Prefix of a simple reply (`NBD_SIMPLE_REPLY_MAGIC`).
pub const SIMPLE_REPLY_MAGIC: u32 = 0x6744_6698;
/// Prefix of a structured reply chunk (`NBD_STRUCTURED_REPLY_MAGIC`).
pub const STRUCTURED_REPLY_MAGIC: u32 = 0x668e_33ef;

/// Handshake flag (server -> client): the server speaks fixed newstyle.
pub const HANDSHAKE_FLAG_FIXED_NEWSTYLE: u16 = 1 << 0;
/// Handshake flag (server -> client): the server can omit the 124 zero bytes after EXPORT_NAME.
pub const HANDSHAKE_FLAG_NO_ZEROES: u16 = 1 << 1;

/// Client flag: the client speaks fixed newstyle.
pub const CLIENT_FLAG_FIXED_NEWSTYLE: u32 = 1 << 0;
/// Client flag: the client does not want the 124 zero bytes after EXPORT_NAME.
pub const CLIENT_FLAG_NO_ZEROES: u32 = 1 << 1;

/// `NBD_OPT_EXPORT_NAME`: choose an export and enter transmission (no error path).
pub const OPT_EXPORT_NAME: u32 = 1;
/// `NBD_OPT_ABORT`: end the session softly.
pub const OPT_ABORT: u32 = 2;
/// `NBD_OPT_LIST`: list exports.
pub const OPT_LIST: u32 = 3;
/// `NBD_OPT_STARTTLS`: upgrade the connection to TLS (answered `NBD_REP_ERR_UNSUP` when the
/// server has no TLS).
pub const OPT_STARTTLS: u32 = 5;
/// `NBD_OPT_INFO`: describe an export without entering transmission.
pub const OPT_INFO: u32 = 6;
/// `NBD_OPT_GO`: describe an export and enter transmission.
pub const OPT_GO: u32 = 7;
/// `NBD_OPT_STRUCTURED_REPLY`: enable structured replies.
pub const OPT_STRUCTURED_REPLY: u32 = 8;
/// `NBD_OPT_LIST_META_CONTEXT`: list metadata contexts.
pub const OPT_LIST_META_CONTEXT: u32 = 9;
/// `NBD_OPT_SET_META_CONTEXT`: select metadata contexts for BLOCK_STATUS.
pub const OPT_SET_META_CONTEXT: u32 = 10;
/// `NBD_OPT_EXTENDED_HEADERS` (not supported: answered with `NBD_REP_ERR_UNSUP`).
pub const OPT_EXTENDED_HEADERS: u32 = 11;

/// Option reply: success, no more data for this option.
pub const REP_ACK: u32 = 1;
/// Option reply: one export of an `NBD_OPT_LIST`.
pub const REP_SERVER: u32 = 2;
/// Option reply: one information item of `NBD_OPT_INFO`/`NBD_OPT_GO`.
pub const REP_INFO: u32 = 3;
/// Option reply: one metadata context.
pub const REP_META_CONTEXT: u32 = 4;
/// Bit 31 marks an option reply as an error.
pub const REP_FLAG_ERROR: u32 = 1 << 31;
/// Option error: the option is not supported.
pub const REP_ERR_UNSUP: u32 = REP_FLAG_ERROR | 1;
/// Option error: forbidden by server policy.
pub const REP_ERR_POLICY: u32 = REP_FLAG_ERROR | 2;
/// Option error: syntactically or semantically invalid.
pub const REP_ERR_INVALID: u32 = REP_FLAG_ERROR | 3;
/// Option error: not supported on this platform.
pub const REP_ERR_PLATFORM: u32 = REP_FLAG_ERROR | 4;
/// Option error: TLS required.
pub const REP_ERR_TLS_REQD: u32 = REP_FLAG_ERROR | 5;
/// Option error: no such export.
pub const REP_ERR_UNKNOWN: u32 = REP_FLAG_ERROR | 6;
/// Option error: the server is shutting down.
pub const REP_ERR_SHUTDOWN: u32 = REP_FLAG_ERROR | 7;
/// Option error: the client must request block sizes first.
pub const REP_ERR_BLOCK_SIZE_REQD: u32 = REP_FLAG_ERROR | 8;
/// Option error: the request or the reply is too large.
pub const REP_ERR_TOO_BIG: u32 = REP_FLAG_ERROR | 9;

/// Information item: export size and transmission flags (mandatory before ACK).
pub const INFO_EXPORT: u16 = 0;
/// Information item: canonical export name.
pub const INFO_NAME: u16 = 1;
/// Information item: human-readable description.
pub const INFO_DESCRIPTION: u16 = 2;
/// Information item: minimum, preferred and maximum block sizes.
pub const INFO_BLOCK_SIZE: u16 = 3;

/// Transmission flag: always set.
pub const TFLAG_HAS_FLAGS: u16 = 1 << 0;
/// Transmission flag: the export is read-only.
pub const TFLAG_READ_ONLY: u16 = 1 << 1;
/// Transmission flag: `NBD_CMD_FLUSH` is supported.
pub const TFLAG_SEND_FLUSH: u16 = 1 << 2;
/// Transmission flag: `NBD_CMD_FLAG_FUA` is supported.
pub const TFLAG_SEND_FUA: u16 = 1 << 3;
/// Transmission flag: the export behaves like a rotational medium.
pub const TFLAG_ROTATIONAL: u16 = 1 << 4;
/// Transmission flag: `NBD_CMD_TRIM` is supported.
pub const TFLAG_SEND_TRIM: u16 = 1 << 5;
/// Transmission flag: `NBD_CMD_WRITE_ZEROES` (and `NO_HOLE`) is supported.
pub const TFLAG_SEND_WRITE_ZEROES: u16 = 1 << 6;
/// Transmission flag: `NBD_CMD_FLAG_DF` is supported (only with structured replies).
pub const TFLAG_SEND_DF: u16 = 1 << 7;
/// Transmission flag: flush and FUA are visible across connections.
pub const TFLAG_CAN_MULTI_CONN: u16 = 1 << 8;
/// Transmission flag: `NBD_CMD_RESIZE` (experimental; never set here).
pub const TFLAG_SEND_RESIZE: u16 = 1 << 9;
/// Transmission flag: `NBD_CMD_CACHE` is supported.
pub const TFLAG_SEND_CACHE: u16 = 1 << 10;
/// Transmission flag: `NBD_CMD_FLAG_FAST_ZERO` is supported.
pub const TFLAG_SEND_FAST_ZERO: u16 = 1 << 11;

/// Command type `NBD_CMD_READ`.
pub const CMD_READ: u16 = 0;
/// Command type `NBD_CMD_WRITE`.
pub const CMD_WRITE: u16 = 1;
/// Command type `NBD_CMD_DISC`.
pub const CMD_DISC: u16 = 2;
/// Command type `NBD_CMD_FLUSH`.
pub const CMD_FLUSH: u16 = 3;
/// Command type `NBD_CMD_TRIM`.
pub const CMD_TRIM: u16 = 4;
/// Command type `NBD_CMD_CACHE`.
pub const CMD_CACHE: u16 = 5;
/// Command type `NBD_CMD_WRITE_ZEROES`.
pub const CMD_WRITE_ZEROES: u16 = 6;
/// Command type `NBD_CMD_BLOCK_STATUS`.
pub const CMD_BLOCK_STATUS: u16 = 7;

/// Command flag: force unit access.
pub const CMD_FLAG_FUA: u16 = 1 << 0;
/// Command flag (WRITE_ZEROES): do not punch a hole.
pub const CMD_FLAG_NO_HOLE: u16 = 1 << 1;
/// Command flag (READ): do not fragment the structured reply.
pub const CMD_FLAG_DF: u16 = 1 << 2;
/// Command flag (BLOCK_STATUS): one extent only.
pub const CMD_FLAG_REQ_ONE: u16 = 1 << 3;
/// Command flag (WRITE_ZEROES): fail fast with ENOTSUP unless zeroing is fast.
pub const CMD_FLAG_FAST_ZERO: u16 = 1 << 4;

/// Structured reply flag: this is the last chunk of the reply.
pub const REPLY_FLAG_DONE: u16 = 1 << 0;

/// Chunk type: no payload, only valid with `REPLY_FLAG_DONE`.
pub const REPLY_TYPE_NONE: u16 = 0;
/// Chunk type: offset + data.
pub const REPLY_TYPE_OFFSET_DATA: u16 = 1;
/// Chunk type: offset + length of a range that reads as zeros.
pub const REPLY_TYPE_OFFSET_HOLE: u16 = 2;
/// Chunk type: block status descriptors of one metadata context.
pub const REPLY_TYPE_BLOCK_STATUS: u16 = 5;
/// Chunk type: error (bit 15 marks error chunks).
pub const REPLY_TYPE_ERROR: u16 = (1 << 15) | 1;
/// Chunk type: error at an offset.
pub const REPLY_TYPE_ERROR_OFFSET: u16 = (1 << 15) | 2;

/// `base:allocation` status flag: the extent is a hole.
pub const STATE_HOLE: u32 = 1 << 0;
/// `base:allocation` status flag: the extent reads as zeros.
pub const STATE_ZERO: u32 = 1 << 1;

/// The protocol's metadata context (oxpool's change maps are in `proto::meta`).
pub const BASE_ALLOCATION: &str = "base:allocation";

/// `oxpool:changed-since:*` status flag: the extent was written, trimmed or zeroed since the
/// base.
pub const STATE_CHANGED: u32 = 1 << 0;

/// Longest string the protocol allows (export names, messages, context names).
pub const MAX_STRING_BYTES: usize = 4096;
