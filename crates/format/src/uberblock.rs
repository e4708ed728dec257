//! The uberblock: the root of the pool at one txg, written round-robin into the label rings.

use crate::bytes::{all_zero, check_reserved, get_u32, get_u64, need, put_u32, put_u64};
use crate::checksum::{put_self_checksum, verify_self_checksum};
use crate::{
    BlockPtr, FormatError, FormatVersion, Guid, Txg, BLOCK_PTR_BYTES, FORMAT_VERSION,
    UBERBLOCK_SLOT_BYTES,
};

/// Magic of an uberblock: the ASCII bytes `oxpUBERB` at offset 0.
pub const UBERBLOCK_MAGIC: u64 = u64::from_le_bytes(*b"oxpUBERB");

const SLOT_BYTES: usize = UBERBLOCK_SLOT_BYTES as usize;
const OFF_MAGIC: usize = 0;
const OFF_VERSION: usize = 8;
const OFF_RESERVED_A: usize = 12;
const OFF_CHECKSUM: usize = 16;
const OFF_TXG: usize = 32;
const OFF_TIMESTAMP: usize = 40;
const OFF_POOL_GUID: usize = 48;
const OFF_RESERVED_B: usize = 56;
const OFF_ROOT: usize = 64;
const OFF_TAIL: usize = OFF_ROOT + BLOCK_PTR_BYTES;

/// The root of the pool at one txg. Import reads every slot of every label and takes the
/// uberblock with the highest txg that decodes (and whose root block verifies).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Uberblock {
    /// The txg this uberblock commits.
    pub txg: Txg,
    /// Wall-clock time of the commit, nanoseconds since the Unix epoch (informational).
    pub timestamp_ns: u64,
    /// The pool this uberblock belongs to (a device reused from another pool may still hold
    /// that pool's uberblocks; import ignores those).
    pub pool_guid: Guid,
    /// The pool's `PoolMeta` block.
    pub root: BlockPtr,
}

impl Uberblock {
    /// Encodes into exactly `UBERBLOCK_SLOT_BYTES` bytes: magic, version, self-checksum
    /// (xxh3-128 of the whole slot with the checksum field read as zeros), fields, zeros.
    ///
    /// # Panics
    /// If `root` is not a valid block pointer (see `BlockPtr::encode`).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![0u8; SLOT_BYTES];
        put_u64(&mut out, OFF_MAGIC, UBERBLOCK_MAGIC);
        put_u32(&mut out, OFF_VERSION, FORMAT_VERSION);
        put_u64(&mut out, OFF_TXG, self.txg.0);
        put_u64(&mut out, OFF_TIMESTAMP, self.timestamp_ns);
        put_u64(&mut out, OFF_POOL_GUID, self.pool_guid.0);
        let root: &mut [u8; BLOCK_PTR_BYTES] = (&mut out[OFF_ROOT..OFF_TAIL])
            .try_into()
            .expect("slice of BLOCK_PTR_BYTES");
        self.root.encode(root);
        put_self_checksum(&mut out, OFF_CHECKSUM);
        out
    }

    /// Decodes the first `UBERBLOCK_SLOT_BYTES` bytes of `bytes` (trailing bytes are ignored).
    /// An all-zero slot (never written) is `Err(FormatError::Empty)`.
    pub fn decode(bytes: &[u8]) -> Result<Uberblock, FormatError> {
        need(bytes, SLOT_BYTES)?;
        let bytes = &bytes[..SLOT_BYTES];
        if all_zero(bytes) {
            return Err(FormatError::Empty);
        }
        let magic = get_u64(bytes, OFF_MAGIC)?;
        if magic != UBERBLOCK_MAGIC {
            return Err(FormatError::BadMagic {
                expected: UBERBLOCK_MAGIC,
                found: magic,
            });
        }
        FormatVersion::try_from(get_u32(bytes, OFF_VERSION)?)?;
        // The checksum comes before any other field: a torn or damaged slot is reported as
        // such, not as whatever field the damage happened to hit.
        verify_self_checksum(bytes, OFF_CHECKSUM)?;
        check_reserved(bytes, OFF_RESERVED_A, OFF_CHECKSUM, "reserved (12..16)")?;
        check_reserved(bytes, OFF_RESERVED_B, OFF_ROOT, "reserved (56..64)")?;
        check_reserved(bytes, OFF_TAIL, SLOT_BYTES, "reserved (192..4096)")?;
        Ok(Uberblock {
            txg: Txg(get_u64(bytes, OFF_TXG)?),
            timestamp_ns: get_u64(bytes, OFF_TIMESTAMP)?,
            pool_guid: Guid(get_u64(bytes, OFF_POOL_GUID)?),
            root: BlockPtr::decode(&bytes[OFF_ROOT..OFF_TAIL])?,
        })
    }
}
