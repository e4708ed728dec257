//! Intent-log blocks.
//!
//! A volume's intent log is a chain of log blocks. Each block names the next one, whose place
//! is allocated before this one is written, so the chain can grow without rewriting anything.
//! A block holds records (writes with their data, writes logged by block pointer, frees and
//! zeroings), each tagged with the txg that holds the change in memory.
//!
//! There is no commit record: the chain ends at the first block that does not decode with the
//! expected pool, volume and sequence number (the place after the last block written holds
//! whatever was there before, which can never pass: sequence numbers only grow, and the
//! checksum covers the identity and the sequence).
//!
//! Layout (little-endian): a 128-byte header, then the records.
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 8 | magic `oxpLOGBK` |
//! | 8 | 4 | format version |
//! | 12 | 4 | record count |
//! | 16 | 16 | xxh3-128 of bytes [0, used_bytes) with this field read as zeros |
//! | 32 | 8 | pool guid |
//! | 40 | 8 | volume id |
//! | 48 | 8 | sequence number |
//! | 56 | 16 | next block: offset (8), allocated size (4), vdev (4) |
//! | 72 | 4 | used bytes (header + records) |
//! | 76 | 52 | reserved, zero |
//!
//! A record: kind (1), 7 zero bytes, txg (8), volume offset (8), length (8), then for a write
//! the data (`length` bytes, padded with zeros to a multiple of 8), for an indirect write a
//! 128-byte block pointer, for a free or a zeroing nothing.

use crate::bytes::{
    all_zero, check_reserved, get_u32, get_u64, get_u8, need, put_u32, put_u64, put_u8,
};
use crate::checksum::{put_self_checksum, verify_self_checksum};
use crate::{
    BlockPtr, Dva, FormatError, FormatVersion, Guid, Txg, VdevId, VolumeId, BLOCK_PTR_BYTES,
};

/// Magic of a log block.
pub const LOG_BLOCK_MAGIC: u64 = u64::from_le_bytes(*b"oxpLOGBK");
/// Size of a log block's header.
pub const LOG_HEADER_BYTES: usize = 128;
/// Largest log block (its allocation); what is written is `used_bytes` rounded up to a sector.
pub const LOG_BLOCK_BYTES_MAX: usize = 128 * 1024;
/// Size of a record's fixed part.
pub const LOG_RECORD_HEADER_BYTES: usize = 32;
/// Largest data a write record can carry: what fits in one block.
pub const LOG_RECORD_DATA_BYTES_MAX: usize =
    LOG_BLOCK_BYTES_MAX - LOG_HEADER_BYTES - LOG_RECORD_HEADER_BYTES;

const OFF_MAGIC: usize = 0;
const OFF_VERSION: usize = 8;
const OFF_COUNT: usize = 12;
const OFF_CHECKSUM: usize = 16;
const OFF_POOL: usize = 32;
const OFF_VOLUME: usize = 40;
const OFF_SEQ: usize = 48;
const OFF_NEXT: usize = 56;
const OFF_USED: usize = 72;
const OFF_RESERVED: usize = 76;

const KIND_WRITE: u8 = 1;
const KIND_INDIRECT: u8 = 2;
const KIND_FREE: u8 = 3;
const KIND_ZERO: u8 = 4;

/// Identity and link of a log block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogBlockHeader {
    /// Pool the chain belongs to.
    pub pool_guid: Guid,
    /// Volume the chain belongs to.
    pub volume: VolumeId,
    /// Position in the chain; the next block has `seq + 1`.
    pub seq: u64,
    /// Where the next block will be written (allocated in advance).
    pub next: Dva,
}

/// One change in the log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LogRecord<'a> {
    /// A write whose data is in the record.
    Write {
        /// Txg holding the change in memory.
        txg: Txg,
        /// Volume byte offset.
        offset_bytes: u64,
        /// The data.
        data: &'a [u8],
    },
    /// A write whose data was written in place at `bp` before the record.
    Indirect {
        /// Txg holding the change in memory.
        txg: Txg,
        /// Volume byte offset.
        offset_bytes: u64,
        /// Length of the write (the block's logical size).
        length_bytes: u64,
        /// The block holding the data.
        bp: BlockPtr,
    },
    /// A trim: whole volume blocks inside the range are freed.
    Free {
        /// Txg holding the change in memory.
        txg: Txg,
        /// Volume byte offset.
        offset_bytes: u64,
        /// Length.
        length_bytes: u64,
    },
    /// A write of zeros over the range.
    Zero {
        /// Txg holding the change in memory.
        txg: Txg,
        /// Volume byte offset.
        offset_bytes: u64,
        /// Length.
        length_bytes: u64,
    },
}

impl LogRecord<'_> {
    /// The txg of the change.
    pub fn txg(&self) -> Txg {
        match self {
            LogRecord::Write { txg, .. }
            | LogRecord::Indirect { txg, .. }
            | LogRecord::Free { txg, .. }
            | LogRecord::Zero { txg, .. } => *txg,
        }
    }

    /// Encoded size of this record.
    pub fn encoded_bytes(&self) -> usize {
        LOG_RECORD_HEADER_BYTES
            + match self {
                LogRecord::Write { data, .. } => data.len().next_multiple_of(8),
                LogRecord::Indirect { .. } => BLOCK_PTR_BYTES,
                _ => 0,
            }
    }
}

/// Builds a log block in a caller buffer of at least `capacity` bytes.
pub struct LogBlockWriter {
    used_bytes: usize,
    count: u32,
    capacity_bytes: usize,
}

impl Default for LogBlockWriter {
    fn default() -> Self {
        Self::new()
    }
}

impl LogBlockWriter {
    /// An empty block of the largest size.
    pub fn new() -> Self {
        Self::with_capacity(LOG_BLOCK_BYTES_MAX)
    }

    /// An empty block of `capacity_bytes` (its allocated size; at most `LOG_BLOCK_BYTES_MAX`).
    ///
    /// # Panics
    /// If the capacity cannot hold a header and one record header, or is over the maximum.
    pub fn with_capacity(capacity_bytes: usize) -> Self {
        assert!(
            (LOG_HEADER_BYTES + LOG_RECORD_HEADER_BYTES..=LOG_BLOCK_BYTES_MAX)
                .contains(&capacity_bytes)
        );
        LogBlockWriter {
            used_bytes: LOG_HEADER_BYTES,
            count: 0,
            capacity_bytes,
        }
    }

    /// Bytes used so far (header included).
    pub fn used_bytes(&self) -> usize {
        self.used_bytes
    }

    /// Records added so far.
    pub fn record_count(&self) -> u32 {
        self.count
    }

    /// Room left for records.
    pub fn free_bytes(&self) -> usize {
        self.capacity_bytes - self.used_bytes
    }

    /// Appends `rec` to `buf` if it fits; returns false (and writes nothing) if not.
    ///
    /// # Panics
    /// If `buf` is shorter than the capacity or an indirect record's pointer is a hole.
    pub fn push(&mut self, buf: &mut [u8], rec: &LogRecord<'_>) -> bool {
        assert!(buf.len() >= self.capacity_bytes);
        let n = rec.encoded_bytes();
        if n > self.free_bytes() {
            return false;
        }
        let at = self.used_bytes;
        buf[at..at + n].fill(0);
        let (kind, offset, length) = match rec {
            LogRecord::Write {
                offset_bytes, data, ..
            } => (KIND_WRITE, *offset_bytes, data.len() as u64),
            LogRecord::Indirect {
                offset_bytes,
                length_bytes,
                ..
            } => (KIND_INDIRECT, *offset_bytes, *length_bytes),
            LogRecord::Free {
                offset_bytes,
                length_bytes,
                ..
            } => (KIND_FREE, *offset_bytes, *length_bytes),
            LogRecord::Zero {
                offset_bytes,
                length_bytes,
                ..
            } => (KIND_ZERO, *offset_bytes, *length_bytes),
        };
        put_u8(buf, at, kind);
        put_u64(buf, at + 8, rec.txg().0);
        put_u64(buf, at + 16, offset);
        put_u64(buf, at + 24, length);
        let body = at + LOG_RECORD_HEADER_BYTES;
        match rec {
            LogRecord::Write { data, .. } => buf[body..body + data.len()].copy_from_slice(data),
            LogRecord::Indirect { bp, .. } => {
                assert!(!bp.is_hole(), "indirect log record without a block");
                let mut enc = [0u8; BLOCK_PTR_BYTES];
                bp.encode(&mut enc);
                buf[body..body + BLOCK_PTR_BYTES].copy_from_slice(&enc);
            }
            _ => {}
        }
        self.used_bytes += n;
        self.count += 1;
        true
    }

    /// Writes the header and checksum; returns the bytes to write (used bytes rounded up to
    /// whole sectors; the rest of the sector is zero).
    pub fn finish(&self, hdr: &LogBlockHeader, buf: &mut [u8]) -> usize {
        buf[..LOG_HEADER_BYTES].fill(0);
        put_u64(buf, OFF_MAGIC, LOG_BLOCK_MAGIC);
        put_u32(buf, OFF_VERSION, crate::FORMAT_VERSION);
        put_u32(buf, OFF_COUNT, self.count);
        put_u64(buf, OFF_POOL, hdr.pool_guid.0);
        put_u64(buf, OFF_VOLUME, hdr.volume.0);
        put_u64(buf, OFF_SEQ, hdr.seq);
        put_u64(buf, OFF_NEXT, hdr.next.offset_bytes);
        put_u32(buf, OFF_NEXT + 8, hdr.next.asize_bytes);
        put_u32(buf, OFF_NEXT + 12, hdr.next.vdev.0);
        put_u32(buf, OFF_USED, self.used_bytes as u32);
        put_self_checksum(&mut buf[..self.used_bytes], OFF_CHECKSUM);
        let out = self
            .used_bytes
            .next_multiple_of(crate::SECTOR_BYTES as usize);
        buf[self.used_bytes..out].fill(0);
        out
    }
}

/// Decodes a log block that must be block `seq` of the chain of `volume` in pool `pool_guid`.
/// Returns its header and its records' bytes (walk them with [`log_records`]).
pub fn decode_log_block(
    bytes: &[u8],
    pool_guid: Guid,
    volume: VolumeId,
    seq: u64,
) -> Result<(LogBlockHeader, &[u8]), FormatError> {
    need(bytes, LOG_HEADER_BYTES)?;
    if all_zero(&bytes[..LOG_HEADER_BYTES]) {
        return Err(FormatError::Empty);
    }
    let magic = get_u64(bytes, OFF_MAGIC)?;
    if magic != LOG_BLOCK_MAGIC {
        return Err(FormatError::BadMagic {
            expected: LOG_BLOCK_MAGIC,
            found: magic,
        });
    }
    FormatVersion::try_from(get_u32(bytes, OFF_VERSION)?)?;
    let used = get_u32(bytes, OFF_USED)? as usize;
    if !(LOG_HEADER_BYTES..=LOG_BLOCK_BYTES_MAX).contains(&used) {
        return Err(FormatError::BadField {
            field: "used_bytes",
            value: used as u64,
        });
    }
    need(bytes, used)?;
    let covered = &bytes[..used];
    verify_self_checksum(covered, OFF_CHECKSUM)?;
    check_reserved(
        covered,
        OFF_RESERVED,
        LOG_HEADER_BYTES,
        "reserved (76..128)",
    )?;
    let found = (
        get_u64(covered, OFF_POOL)?,
        get_u64(covered, OFF_VOLUME)?,
        get_u64(covered, OFF_SEQ)?,
    );
    if found.0 != pool_guid.0 || found.1 != volume.0 {
        return Err(FormatError::BadField {
            field: "chain identity",
            value: found.1,
        });
    }
    if found.2 != seq {
        return Err(FormatError::BadField {
            field: "seq",
            value: found.2,
        });
    }
    let next = Dva {
        offset_bytes: get_u64(covered, OFF_NEXT)?,
        asize_bytes: get_u32(covered, OFF_NEXT + 8)?,
        vdev: VdevId(get_u32(covered, OFF_NEXT + 12)?),
    };
    let records = &covered[LOG_HEADER_BYTES..];
    // Every record must parse: a block is valid whole or not at all.
    let count = get_u32(covered, OFF_COUNT)?;
    let mut parsed = 0u32;
    for r in log_records(records) {
        r?;
        parsed += 1;
    }
    if parsed != count {
        return Err(FormatError::BadField {
            field: "record_count",
            value: u64::from(count),
        });
    }
    Ok((
        LogBlockHeader {
            pool_guid,
            volume,
            seq,
            next,
        },
        records,
    ))
}

/// Iterates over the records of a decoded block. Stops after the first error.
pub fn log_records(bytes: &[u8]) -> impl Iterator<Item = Result<LogRecord<'_>, FormatError>> {
    let mut at = 0usize;
    let mut failed = false;
    std::iter::from_fn(move || {
        if failed || at >= bytes.len() {
            return None;
        }
        let r = parse_record(&bytes[at..]);
        match &r {
            Ok((_, n)) => at += n,
            Err(_) => failed = true,
        }
        Some(r.map(|(rec, _)| rec))
    })
}

fn parse_record(b: &[u8]) -> Result<(LogRecord<'_>, usize), FormatError> {
    need(b, LOG_RECORD_HEADER_BYTES)?;
    let kind = get_u8(b, 0)?;
    check_reserved(b, 1, 8, "record reserved (1..8)")?;
    let txg = Txg(get_u64(b, 8)?);
    let offset_bytes = get_u64(b, 16)?;
    let length_bytes = get_u64(b, 24)?;
    if offset_bytes.checked_add(length_bytes).is_none() {
        return Err(FormatError::BadField {
            field: "record range",
            value: offset_bytes,
        });
    }
    let body = &b[LOG_RECORD_HEADER_BYTES..];
    match kind {
        KIND_WRITE => {
            if length_bytes > LOG_RECORD_DATA_BYTES_MAX as u64 {
                return Err(FormatError::BadField {
                    field: "record length",
                    value: length_bytes,
                });
            }
            let len = length_bytes as usize;
            need(body, len.next_multiple_of(8))?;
            Ok((
                LogRecord::Write {
                    txg,
                    offset_bytes,
                    data: &body[..len],
                },
                LOG_RECORD_HEADER_BYTES + len.next_multiple_of(8),
            ))
        }
        KIND_INDIRECT => {
            need(body, BLOCK_PTR_BYTES)?;
            let bp = BlockPtr::decode(&body[..BLOCK_PTR_BYTES])?;
            if bp.is_hole() {
                return Err(FormatError::BadField {
                    field: "indirect record block",
                    value: 0,
                });
            }
            Ok((
                LogRecord::Indirect {
                    txg,
                    offset_bytes,
                    length_bytes,
                    bp,
                },
                LOG_RECORD_HEADER_BYTES + BLOCK_PTR_BYTES,
            ))
        }
        KIND_FREE => Ok((
            LogRecord::Free {
                txg,
                offset_bytes,
                length_bytes,
            },
            LOG_RECORD_HEADER_BYTES,
        )),
        KIND_ZERO => Ok((
            LogRecord::Zero {
                txg,
                offset_bytes,
                length_bytes,
            },
            LOG_RECORD_HEADER_BYTES,
        )),
        other => Err(FormatError::BadField {
            field: "record kind",
            value: u64::from(other),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn header(seq: u64) -> LogBlockHeader {
        LogBlockHeader {
            pool_guid: Guid(7),
            volume: VolumeId(3),
            seq,
            next: Dva {
                vdev: VdevId(0),
                offset_bytes: 4096 * 9,
                asize_bytes: 131072,
            },
        }
    }

    fn build(recs: &[LogRecord<'_>]) -> Vec<u8> {
        let mut buf = vec![0u8; LOG_BLOCK_BYTES_MAX];
        let mut w = LogBlockWriter::new();
        for r in recs {
            assert!(w.push(&mut buf, r));
        }
        let n = w.finish(&header(5), &mut buf);
        buf.truncate(n);
        buf
    }

    #[test]
    fn round_trip_and_chain_checks() {
        let data = vec![0xABu8; 1001];
        let recs = [
            LogRecord::Write {
                txg: Txg(4),
                offset_bytes: 12,
                data: &data,
            },
            LogRecord::Free {
                txg: Txg(4),
                offset_bytes: 0,
                length_bytes: 65536,
            },
            LogRecord::Zero {
                txg: Txg(5),
                offset_bytes: 3,
                length_bytes: 9,
            },
        ];
        let block = build(&recs);
        assert_eq!(block.len() % 4096, 0);
        let (h, body) = decode_log_block(&block, Guid(7), VolumeId(3), 5).unwrap();
        assert_eq!(h, header(5));
        let got: Vec<_> = log_records(body).map(|r| r.unwrap()).collect();
        assert_eq!(got, recs);
        // Wrong sequence, volume or pool: not part of this chain.
        assert!(decode_log_block(&block, Guid(7), VolumeId(3), 6).is_err());
        assert!(decode_log_block(&block, Guid(7), VolumeId(4), 5).is_err());
        assert!(decode_log_block(&block, Guid(8), VolumeId(3), 5).is_err());
        assert_eq!(
            decode_log_block(&vec![0u8; 4096], Guid(7), VolumeId(3), 5),
            Err(FormatError::Empty)
        );
    }

    #[test]
    fn full_block_refuses_more() {
        let data = vec![1u8; LOG_RECORD_DATA_BYTES_MAX];
        let mut buf = vec![0u8; LOG_BLOCK_BYTES_MAX];
        let mut w = LogBlockWriter::new();
        assert!(w.push(
            &mut buf,
            &LogRecord::Write {
                txg: Txg(1),
                offset_bytes: 0,
                data: &data
            }
        ));
        assert!(!w.push(
            &mut buf,
            &LogRecord::Free {
                txg: Txg(1),
                offset_bytes: 0,
                length_bytes: 1
            }
        ));
        assert_eq!(w.free_bytes(), 0);
    }

    proptest! {
        #[test]
        fn any_flip_or_truncation_is_rejected(flip in 0usize..1200, cut in 0usize..1200) {
            let data = vec![0x5Au8; 1000];
            let block = build(&[LogRecord::Write { txg: Txg(2), offset_bytes: 40, data: &data }]);
            let used = LOG_HEADER_BYTES + LOG_RECORD_HEADER_BYTES + 1000;
            let mut b = block.clone();
            b[flip % used] ^= 1;
            prop_assert!(decode_log_block(&b, Guid(7), VolumeId(3), 5).is_err());
            prop_assert!(decode_log_block(&block[..cut.min(used - 1)], Guid(7), VolumeId(3), 5).is_err());
        }

        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..600), seq in 0u64..4) {
            let _ = decode_log_block(&bytes, Guid(7), VolumeId(3), seq);
            for r in log_records(&bytes) { let _ = r; }
        }
    }
}
