//! Device layout: where the labels, the uberblock rings and the data area are on every leaf.
//!
//! ```text
//! 0         256K      512K        1M                                end-512K  end-256K   end
//! | L0       | L1       | reserved  | data area ...                  | L2       | L3       |
//! ```
//! `end` is the device size rounded down to `LABEL_BYTES`. Each label is a `LabelConfig`
//! (first 128 KiB) followed by a ring of `UBERBLOCK_SLOTS` uberblock slots (second 128 KiB).
//! Two labels at each end survive a damaged first or last megabyte (a partition table or a
//! boot loader written over the start of the disk, a truncated image file).

use crate::FormatError;

/// The format version this build writes. It reads every version of [`FormatVersion`].
pub const FORMAT_VERSION: u32 = FormatVersion::V8 as u32;

/// Format versions, oldest first: the variants read as the format's changelog.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(u32)]
pub enum FormatVersion {
    /// First version: labels with uberblock rings, 128-byte block pointers with up to three
    /// copies, 32 KiB indirect blocks, metadata blocks with postcard payloads, bitmap space
    /// maps, intent-log blocks; checksums xxh3-128 and blake3; no compression.
    V1 = 1,
    /// Compression: block pointers of version 2 may carry `compression` lz4 (1), zstd (2) or
    /// zle (3) with `psize_bytes < lsize_bytes`; all-zero data blocks are holes that keep
    /// their birth txg; `VolumeMeta` ends with `compressed_bytes`. A version 1 pool imports
    /// (its volumes' `compressed_bytes` are derived from their trees' fill counts); its next
    /// txg is written as version 2.
    V2 = 2,
    /// Snapshots and clones: `PoolMeta` ends with `datasets`, one `DatasetMeta` per volume
    /// (guid, creation txg, origin, the previous snapshot's txg, snapshots, deadlists);
    /// deadlist entries live in `DeadList` metadata blocks (block type 7). A version 2 pool
    /// imports with no snapshots; its next txg is written as version 3. Also raidz top-level
    /// vdevs (vdev kind variant 2 with parity, sector shift and width epochs; DVAs in the
    /// vdev's interleaved space with ZFS's raidz allocated size).
    V3 = 3,
    /// Tables of their own: a dataset's snapshots live in `SnapshotTable` blocks (type 8) and
    /// its bookmarks in `BookmarkTable` blocks (type 9), chunks of at most
    /// `TABLE_CHUNK_ENTRIES_MAX` records that a txg rewrites only where they changed;
    /// `DatasetMeta` holds the chunks' pointers (`snapshot_table`, `bookmark_table`) instead
    /// of the snapshots themselves, so the pool's metadata block no longer grows with them.
    /// A version 3 pool imports (its snapshots inline); its next txg is written as version 4.
    V4 = 4,
    /// Resumable receives: `DatasetMeta` ends with `receive_resume`, set on the hidden
    /// dataset of an interrupted `recv -s` (the stream's identity and how far it was
    /// received, in the same txg as the data below that offset). A version 4 pool imports
    /// (no receive to resume); its next txg is written as version 5.
    V5 = 5,
    /// Changing devices: a top-level vdev's `TopVdevConfig` ends with `pairs` (a child being
    /// replaced, or stood in for by a hot spare, has a second member) and `VdevTreeConfig`
    /// ends with `spares` (the pool's hot spares), in labels and in `PoolMeta`. A version 5
    /// pool imports (no pairs, no spares); its next txg is written as version 6, and labels
    /// written from then on (a device added, attached, replaced) too.
    V6 = 6,
    /// Removing a log device: `TopVdevKind` gains `Hole` (variant 3), which keeps a removed
    /// top-level vdev's index (so no block pointer's vdev id ever changes) with no children,
    /// no size and no space map. A version 6 pool imports (no holes); its next txg is
    /// written as version 7, and labels written from then on too.
    V7 = 7,
    /// The pool's command history (`oxpool history`, as `zpool history`): `PoolMeta` ends
    /// with `history`, the pointers of its `History` blocks (type 10), chunks of at most
    /// `TABLE_CHUNK_ENTRIES_MAX` records, oldest first. A version 7 pool imports with an
    /// empty history; its next txg is written as version 8.
    V8 = 8,
}

impl TryFrom<u32> for FormatVersion {
    type Error = FormatError;

    fn try_from(found: u32) -> Result<Self, FormatError> {
        match found {
            1 => Ok(FormatVersion::V1),
            2 => Ok(FormatVersion::V2),
            3 => Ok(FormatVersion::V3),
            4 => Ok(FormatVersion::V4),
            5 => Ok(FormatVersion::V5),
            6 => Ok(FormatVersion::V6),
            7 => Ok(FormatVersion::V7),
            8 => Ok(FormatVersion::V8),
            _ => Err(FormatError::UnsupportedVersion { found }),
        }
    }
}

/// Sector size: the allocation unit and the I/O alignment (O_DIRECT needs 4 KiB).
pub const SECTOR_BYTES: u64 = 4096;
/// Size of one label: a config half and an uberblock ring half.
pub const LABEL_BYTES: u64 = 256 * 1024;
/// Labels per device: L0 and L1 at the start, L2 and L3 at the end.
pub const LABEL_COUNT: usize = 4;
/// Size of the config half of a label (a `LabelConfig`, at the label's start).
pub const LABEL_CONFIG_BYTES: u64 = 128 * 1024;
/// Size of one uberblock slot: one sector, so a slot write is a single sector write.
pub const UBERBLOCK_SLOT_BYTES: u64 = 4096;
/// Uberblock slots in the ring of each label (the second half of the label).
pub const UBERBLOCK_SLOTS: u64 = 32;
/// First allocatable byte on every leaf; the gap after L1 up to here is reserved, zero.
pub const DATA_START_BYTES: u64 = 1024 * 1024;
/// Smallest device a pool accepts: 2 MiB of labels and reserved space plus a useful data area.
pub const MIN_DEVICE_BYTES: u64 = 16 * 1024 * 1024;
/// Largest volume size, 4 EiB: every byte offset of a volume, and the end of any block or
/// 4 KiB piece that holds it, stays far below 2^64, so offset arithmetic cannot overflow;
/// and a volume stays below the 2^63 bytes Linux and qemu take as a disk's size.
pub const VOLSIZE_MAX_BYTES: u64 = 1 << 62;

const _: () = assert!(LABEL_CONFIG_BYTES + UBERBLOCK_SLOTS * UBERBLOCK_SLOT_BYTES == LABEL_BYTES);
const _: () = assert!(2 * LABEL_BYTES <= DATA_START_BYTES);
const _: () = assert!(
    DATA_START_BYTES.is_multiple_of(SECTOR_BYTES) && LABEL_BYTES.is_multiple_of(SECTOR_BYTES)
);
const _: () = assert!(MIN_DEVICE_BYTES > DATA_START_BYTES + 2 * LABEL_BYTES);

/// Byte offsets of the 4 labels on a device of `device_bytes`: 0, LABEL_BYTES,
/// end-2*LABEL_BYTES, end-LABEL_BYTES where end = device_bytes rounded down to LABEL_BYTES.
///
/// Never panics. The result is only meaningful for `device_bytes >= MIN_DEVICE_BYTES`
/// (see [`check_device_bytes`]); below that the end labels saturate at 0 and overlap.
pub fn label_offsets(device_bytes: u64) -> [u64; LABEL_COUNT] {
    // Rounding down keeps the end labels aligned even on a device whose size is not a
    // multiple of the label size (a partition, an image file of arbitrary length).
    let end_bytes = device_bytes / LABEL_BYTES * LABEL_BYTES;
    [
        0,
        LABEL_BYTES,
        end_bytes.saturating_sub(2 * LABEL_BYTES),
        end_bytes.saturating_sub(LABEL_BYTES),
    ]
}

/// Byte offset of uberblock slot `slot` (0..UBERBLOCK_SLOTS) inside the label at `label_offset`.
///
/// # Panics
/// If `slot >= UBERBLOCK_SLOTS`: the slot number is chosen by the program (usually
/// `txg % UBERBLOCK_SLOTS`), never read from disk, so an out of range slot is a bug.
pub fn uberblock_slot_offset(label_offset: u64, slot: u64) -> u64 {
    assert!(slot < UBERBLOCK_SLOTS, "uberblock slot {slot} out of range");
    label_offset + LABEL_CONFIG_BYTES + slot * UBERBLOCK_SLOT_BYTES
}

/// End (exclusive) of the allocatable area = label_offsets()[2]. Data area is
/// [DATA_START_BYTES, data_end_bytes).
pub fn data_end_bytes(device_bytes: u64) -> u64 {
    label_offsets(device_bytes)[2]
}

/// Checks that a device of `device_bytes` is large enough to hold a pool
/// (`>= MIN_DEVICE_BYTES`), so that the layout functions above give a non-empty data area.
pub fn check_device_bytes(device_bytes: u64) -> Result<(), FormatError> {
    if device_bytes < MIN_DEVICE_BYTES {
        return Err(FormatError::BadField {
            field: "device_bytes",
            value: device_bytes,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_on_an_aligned_device() {
        let device_bytes = 64 * 1024 * 1024;
        let offsets = label_offsets(device_bytes);
        assert_eq!(
            offsets,
            [
                0,
                LABEL_BYTES,
                device_bytes - 2 * LABEL_BYTES,
                device_bytes - LABEL_BYTES
            ]
        );
        assert_eq!(data_end_bytes(device_bytes), device_bytes - 2 * LABEL_BYTES);
    }

    #[test]
    fn labels_on_an_unaligned_device_round_down() {
        let device_bytes = 64 * 1024 * 1024 + 12345;
        let offsets = label_offsets(device_bytes);
        assert_eq!(offsets[3] + LABEL_BYTES, 64 * 1024 * 1024);
        for offset in offsets {
            assert_eq!(offset % LABEL_BYTES, 0);
            assert!(offset + LABEL_BYTES <= device_bytes);
        }
    }

    #[test]
    fn tiny_devices_do_not_panic() {
        for device_bytes in [0, 1, LABEL_BYTES, 3 * LABEL_BYTES - 1, u64::MAX] {
            let _ = label_offsets(device_bytes);
            let _ = data_end_bytes(device_bytes);
        }
        assert!(check_device_bytes(MIN_DEVICE_BYTES - 1).is_err());
        assert!(check_device_bytes(MIN_DEVICE_BYTES).is_ok());
        assert!(data_end_bytes(MIN_DEVICE_BYTES) > DATA_START_BYTES);
    }

    #[test]
    fn uberblock_slots_fill_the_second_half() {
        assert_eq!(uberblock_slot_offset(0, 0), LABEL_CONFIG_BYTES);
        assert_eq!(
            uberblock_slot_offset(LABEL_BYTES, UBERBLOCK_SLOTS - 1) + UBERBLOCK_SLOT_BYTES,
            2 * LABEL_BYTES
        );
    }

    #[test]
    #[should_panic]
    fn uberblock_slot_out_of_range_panics() {
        uberblock_slot_offset(0, UBERBLOCK_SLOTS);
    }

    #[test]
    fn versions() {
        assert_eq!(FormatVersion::try_from(1), Ok(FormatVersion::V1));
        assert_eq!(FormatVersion::try_from(2), Ok(FormatVersion::V2));
        assert_eq!(FormatVersion::try_from(4), Ok(FormatVersion::V4));
        assert_eq!(FormatVersion::try_from(5), Ok(FormatVersion::V5));
        assert_eq!(FormatVersion::try_from(6), Ok(FormatVersion::V6));
        assert_eq!(FormatVersion::try_from(7), Ok(FormatVersion::V7));
        assert_eq!(FormatVersion::try_from(8), Ok(FormatVersion::V8));
        assert_eq!(FORMAT_VERSION, 8);
        for found in [0, 9, u32::MAX] {
            assert_eq!(
                FormatVersion::try_from(found),
                Err(FormatError::UnsupportedVersion { found })
            );
        }
    }
}
