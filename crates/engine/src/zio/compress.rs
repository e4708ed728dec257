//! Compression in the pipeline (the `compression` volume property): how a data block is
//! stored, and how a stored one becomes its content again.
//!
//! - Write side ([`store_as`]): the txg sync, and the intent log for the blocks it writes in
//!   place, ask how to store a block's content. An all-zero block becomes a hole that keeps
//!   its birth txg (unless `compression=off`, where it is written like any block, as ZFS does);
//!   otherwise the block is compressed into at most [`compressed_bytes_max`] bytes (an eighth
//!   and a whole sector saved) or stored as is. The codecs are the format crate's.
//! - Read side ([`verify_and_decode`]): after a device read, the stored bytes are verified
//!   against their parent's checksum first, and only then decompressed into a buffer of the
//!   logical size the reader expects (never the size the pointer claims alone): a damaged
//!   block is a checksum error before any decoder sees it, and a block that verifies but does
//!   not decompress to exactly that size counts as a checksum error too. Where this runs (on
//!   the reactor or on a completion thread) is the completion policy's choice
//!   (`completion.rs`): decompression is the CPU-heavy completion `auto` offloads.
//! - The data cache holds blocks decompressed (docs/compression.md has the measurement), so a
//!   hit is a copy, as before.
//!
//! A block's stored form is recorded in its pointer: `compression`, `psize_bytes` (the
//! compressed bytes, checksummed) and `lsize_bytes` (the content); its allocation is `psize`
//! rounded up to a sector (docs/format.md).

use crate::zio::probe_streak::ProbeStreak;
use crate::zio::verify;
use oxpool_format::{
    all_zero, checksum, compress_block, compressed_bytes_max, decompress_block, BlockPtr, Checksum,
    ChecksumType, Compression, CompressionSetting, Txg, SECTOR_BYTES,
};
use oxpool_io::scratch::{Scratch, Stash};
use oxpool_io::IoBuf;
use std::cell::RefCell;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// How a data block's content is stored.
pub(crate) enum StoreAs {
    /// All zeros with compression on: a hole that keeps its birth txg, nothing written.
    Hole,
    /// As is: the content is the stored bytes.
    AsIs,
    /// Compressed.
    Compressed(CompressedBlock),
}

impl StoreAs {
    /// Bytes one copy takes for a block of `logical_bytes` stored this way.
    pub(crate) fn asize_bytes(&self, logical_bytes: usize) -> u64 {
        match self {
            StoreAs::Hole => 0,
            StoreAs::AsIs => (logical_bytes as u64).div_ceil(SECTOR_BYTES) * SECTOR_BYTES,
            StoreAs::Compressed(c) => c.buf.len() as u64,
        }
    }
}

/// A compressed block ready to be written.
pub(crate) struct CompressedBlock {
    /// The stored bytes, zero-padded to whole sectors (its length is the allocation).
    pub buf: IoBuf,
    /// Stored bytes that mean something (and are checksummed): the pointer's `psize_bytes`.
    pub psize_bytes: u32,
    /// The algorithm, for the pointer.
    pub compression: Compression,
}

thread_local! {
    /// Where a block is compressed before its size is known (then copied into a buffer of
    /// whole sectors): grows once to the largest limit seen, no allocation per block after.
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// How to store `logical`, a data block's content, under `setting` (see the module docs).
pub(crate) fn store_as(setting: CompressionSetting, logical: &[u8]) -> StoreAs {
    if setting.algorithm == Compression::Off {
        return StoreAs::AsIs;
    }
    if all_zero(logical) {
        return StoreAs::Hole;
    }
    let max = compressed_bytes_max(logical.len());
    if max == 0 {
        return StoreAs::AsIs;
    }
    SCRATCH.with(|scratch| {
        let mut scratch = scratch.borrow_mut();
        if scratch.len() < max {
            scratch.resize(max, 0);
        }
        match compress_block(setting, logical, &mut scratch[..max]) {
            Some(n) => {
                debug_assert!(n <= max && n < logical.len());
                let sectors = (n as u64).div_ceil(SECTOR_BYTES);
                let mut buf = IoBuf::zeroed((sectors * SECTOR_BYTES) as usize);
                buf[..n].copy_from_slice(&scratch[..n]);
                StoreAs::Compressed(CompressedBlock {
                    buf,
                    psize_bytes: n as u32,
                    compression: setting.algorithm,
                })
            }
            None => StoreAs::AsIs,
        }
    })
}

/// Blocks per thread below which [`store_all`] does not start another thread when it
/// compresses (a thread costs tens of microseconds to start; lz4 compresses a 16 KiB block in
/// 10-40).
const PARALLEL_BLOCKS_MIN: usize = 8;

/// The same when it only checksums (`compression=off`): a 16 KiB block hashes in a few
/// microseconds, so a thread needs more of them to pay for its start.
const PARALLEL_HASH_ONLY_BLOCKS_MIN: usize = 64;

/// A data block's stored form, with the checksum of its stored bytes.
pub(crate) struct Stored {
    /// How it is stored.
    pub form: StoreAs,
    /// The checksum of the stored bytes (`psize_bytes` of them); `None` for a hole.
    pub checksum: Option<Checksum>,
}

/// How to store `logical` and the checksum of what is stored: [`store_as`], then the stored
/// bytes hashed by the thread that just decided on them.
fn store_and_sum(setting: CompressionSetting, kind: ChecksumType, logical: &[u8]) -> Stored {
    let form = store_as(setting, logical);
    let checksum = match &form {
        StoreAs::Hole => None,
        StoreAs::AsIs => Some(checksum(kind, logical)),
        StoreAs::Compressed(c) => Some(checksum(kind, &c.buf[..c.psize_bytes as usize])),
    };
    Stored { form, checksum }
}

/// How a block's bytes are stored (a dirty block in its stored form, `DirtyBlock::Stored`,
/// or a received one): what its block pointer will say.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoredForm {
    /// How the stored bytes are compressed.
    pub compression: Compression,
    /// The block's content size: the volume's block size.
    pub lsize_bytes: u32,
    /// Stored bytes that mean something (and are checksummed); `lsize_bytes` uncompressed.
    pub psize_bytes: u32,
    /// The algorithm of `checksum`.
    pub checksum_type: ChecksumType,
    /// The checksum of the stored bytes, verified by whoever made the block (the stream
    /// decoder, for a received block) or computed from them (the writer, on arrival).
    pub checksum: Checksum,
}

impl StoredForm {
    /// The content of a block stored as `self` in `stored`: `stored` itself when not
    /// compressed (its first `lsize_bytes` bytes), else decompressed into a new buffer.
    ///
    /// Whoever makes a stored dirty block checks first that it decompresses
    /// (`Volume::write_stored`), so this cannot fail; if it ever did, the content would be
    /// zeros and the error logged, never a panic.
    pub(crate) fn content(&self, stored: &Arc<IoBuf>) -> Arc<IoBuf> {
        if self.compression == Compression::Off {
            return Arc::clone(stored);
        }
        // Filled exactly by a successful decode; zeroed below after a failed one.
        let mut out = IoBuf::for_overwrite(self.lsize_bytes as usize);
        let psize = (self.psize_bytes as usize).min(stored.len());
        if let Err(e) = decompress_block(self.compression, &stored[..psize], &mut out) {
            tracing::error!("a stored dirty block does not decompress ({e}): read as zeros");
            out.fill(0);
        }
        Arc::new(out)
    }

    /// Whether `stored` decompresses to exactly `lsize_bytes` (always, uncompressed), using
    /// `scratch` (grown to `lsize_bytes`).
    pub(crate) fn decodes(&self, stored: &[u8], scratch: &mut Vec<u8>) -> bool {
        if self.compression == Compression::Off {
            return self.psize_bytes == self.lsize_bytes
                && stored.len() >= self.psize_bytes as usize;
        }
        let psize = self.psize_bytes as usize;
        if psize > stored.len() {
            return false;
        }
        scratch.resize(self.lsize_bytes as usize, 0);
        decompress_block(self.compression, &stored[..psize], scratch).is_ok()
    }
}

/// The stored form of a whole block a client just wrote, when it can be decided without
/// compressing: as is, with its checksum, if `setting` is `off` or the probe finds the block
/// incompressible (then it is not all zeros either: the probe saw bytes that are not), or
/// `streak` skips its probe (`probe_streak.rs`) and it is not all zeros. `None`
/// when the block may compress or is all zeros: the txg sync decides, as for any block, so
/// that a zero block written under `off` still becomes a hole if `compression` is on when
/// its txg syncs (a zero scan stops at the first nonzero word: nearly free).
///
/// Why at write time: the writer's thread has just received the block and its bytes are in
/// that core's cache, where xxh3 hashes a 16 KiB block in under half a microsecond; the txg
/// sync, hundreds of milliseconds later, reads them from memory (2026-11-27 profile of 128K
/// sequential writes: hashing and probing in the sync were 28 % of the server's CPU, about
/// 25 us per 128 KiB). The sync then writes the block as it is, with this checksum.
pub(crate) fn written_form(
    setting: CompressionSetting,
    kind: ChecksumType,
    logical: &[u8],
    streak: &ProbeStreak,
) -> Option<StoredForm> {
    let decided = if setting.algorithm == Compression::Off || streak.skips() {
        !all_zero(logical)
    } else {
        let incompressible = oxpool_format::probe(logical, setting.algorithm)
            != oxpool_format::ProbeVerdict::Compress;
        streak.note(incompressible);
        incompressible
    };
    if !decided {
        return None;
    }
    let lsize_bytes = u32::try_from(logical.len()).ok()?;
    if !(logical.len() as u64).is_multiple_of(SECTOR_BYTES) {
        return None;
    }
    Some(StoredForm {
        compression: Compression::Off,
        lsize_bytes,
        psize_bytes: lsize_bytes,
        checksum_type: kind,
        checksum: checksum(kind, logical),
    })
}

/// [`written_form`] of each of a write's whole blocks, in order. Its vector is lent by a
/// per-thread stash ([`oxpool_io::scratch`]), so that a reactor's writes allocate none once
/// warm.
pub(crate) struct WrittenForms(Scratch<Vec<Option<StoredForm>>>);

thread_local! {
    static WRITTEN_FORMS: Stash<Vec<Option<StoredForm>>> = const { Stash::new() };
}

impl WrittenForms {
    /// The forms of `blocks` under `setting` and `kind`, written to the volume whose probe
    /// streak is `streak` (see [`written_form`]).
    pub(crate) fn of(
        setting: CompressionSetting,
        kind: ChecksumType,
        blocks: &[IoBuf],
        streak: &ProbeStreak,
    ) -> Self {
        let mut forms = Scratch::take(&WRITTEN_FORMS);
        debug_assert!(forms.is_empty());
        forms.extend(
            blocks
                .iter()
                .map(|b| written_form(setting, kind, b, streak)),
        );
        WrittenForms(forms)
    }

    /// The form of the `i`th block, if decided.
    pub(crate) fn get(&self, i: usize) -> Option<StoredForm> {
        self.0.get(i).copied().flatten()
    }
}

/// [`store_as`] and the stored bytes' checksum (of type `kind`) for many blocks (one batch of
/// a txg sync), in order, on up to every core: the sync thread takes the first share and
/// scoped threads the others. Compression and checksums are the txg sync's CPU-heavy steps
/// (lz4 compresses 0.4-2 GB/s per core, zstd 0.1-0.4: measured in docs/compression.md; xxh3
/// hashes a few GB/s of blocks the writers left out of cache), so one thread would bound a
/// pool's write throughput; ZFS compresses and checksums in its write-issue taskqs on every
/// CPU for the same reason. Each block is hashed right after the probe or the compressor
/// looked at it, by the same core. Threads are per batch (at most `SYNC_WRITES_IN_FLIGHT_MAX`
/// blocks): their start is far below the batch's work, and nothing idles between syncs.
pub(crate) fn store_all(
    setting: CompressionSetting,
    kind: ChecksumType,
    blocks: &[&[u8]],
) -> Vec<Stored> {
    static CORES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let cores = *CORES.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let per_thread_min = if setting.algorithm == Compression::Off {
        PARALLEL_HASH_ONLY_BLOCKS_MIN
    } else {
        PARALLEL_BLOCKS_MIN
    };
    let threads = cores.min(blocks.len() / per_thread_min).max(1);
    if threads == 1 {
        return blocks
            .iter()
            .map(|b| store_and_sum(setting, kind, b))
            .collect();
    }
    let share = blocks.len().div_ceil(threads);
    std::thread::scope(|scope| {
        let others: Vec<_> = blocks[share..]
            .chunks(share)
            .map(|chunk| {
                scope.spawn(move || {
                    chunk
                        .iter()
                        .map(|b| store_and_sum(setting, kind, b))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let mut out: Vec<Stored> = blocks[..share]
            .iter()
            .map(|b| store_and_sum(setting, kind, b))
            .collect();
        for t in others {
            out.extend(t.join().expect("a compression thread panicked"));
        }
        debug_assert_eq!(out.len(), blocks.len());
        out
    })
}

/// The pointer of an all-zero data block stored as a hole in `txg`: no copies, its birth kept
/// (as ZFS's hole birth: a later incremental stream or scan can tell when it became a hole).
pub(crate) fn zero_hole(txg: Txg) -> BlockPtr {
    BlockPtr {
        birth: txg,
        ..BlockPtr::HOLE
    }
}

/// What checking a block read from a device found.
pub enum Verdict {
    /// The stored bytes verify; for a compressed block whose content was asked for, the
    /// content (exactly the logical size asked for).
    Good(Option<IoBuf>),
    /// The stored bytes do not match the pointer's checksum.
    BadChecksum,
    /// The stored bytes verify but do not decompress to the size asked for (a writer's bug or
    /// a forged checksum collision): counted and treated as a checksum error.
    Undecodable,
}

/// Verifies `stored` (a copy read from a device, at least `psize_bytes` long) against `bp`,
/// then, with `decode_to` (the logical size the reader expects) and a compressed `bp`,
/// decompresses it into a new buffer of exactly that size. `decode_to` is the reader's size,
/// not `bp.lsize_bytes`: a pointer that claims another size is refused (compressed or not), so
/// no length read from the pool ever sizes a buffer. An uncompressed block is never copied:
/// its content is `stored` itself (`Good(None)`).
pub fn verify_and_decode(bp: &BlockPtr, stored: &IoBuf, decode_to: Option<usize>) -> Verdict {
    if !verify(bp, stored) {
        return Verdict::BadChecksum;
    }
    decode_verified(bp, stored, decode_to)
}

/// The second half of [`verify_and_decode`], for stored bytes already verified against `bp`
/// (a raidz read verifies while it rebuilds).
pub fn decode_verified(bp: &BlockPtr, stored: &IoBuf, decode_to: Option<usize>) -> Verdict {
    let Some(lsize) = decode_to else {
        return Verdict::Good(None);
    };
    let psize = bp.psize_bytes as usize;
    if bp.lsize_bytes as usize != lsize || psize > stored.len() {
        return Verdict::Undecodable;
    }
    if bp.compression == Compression::Off {
        // The stored bytes are the content (`psize == lsize`, checked by the pointer's
        // decoder; the read buffer is the allocation, at least that long).
        return Verdict::Good(None);
    }
    // Filled exactly by a successful decode; dropped after a failed one.
    let mut out = IoBuf::for_overwrite(lsize);
    match decompress_block(bp.compression, &stored[..psize], &mut out) {
        Ok(()) => {
            COMPRESS_COUNTERS
                .decompressed_bytes
                .fetch_add(lsize as u64, Ordering::Relaxed);
            Verdict::Good(Some(out))
        }
        Err(_) => Verdict::Undecodable,
    }
}

/// A data block the intent log wrote in place (`logbias=throughput`, large sync writes),
/// waiting for the txg sync of its txg to adopt it or free it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct InPlaceBlock {
    /// Its pointer (compressed or not).
    pub bp: BlockPtr,
    /// The checksum of its content (the block before compression), with the pointer's
    /// algorithm: the sync adopts the block only if the block's dirty content has this
    /// checksum (the pointer's own checksum covers the stored bytes, which for a compressed
    /// block are not the content).
    pub content_checksum: Checksum,
}

impl InPlaceBlock {
    /// `bp`, written in place for the content `logical`.
    pub(crate) fn new(bp: BlockPtr, logical: &[u8]) -> InPlaceBlock {
        InPlaceBlock {
            bp,
            content_checksum: checksum(bp.checksum_type, logical),
        }
    }

    /// Whether the block holds exactly `logical`.
    pub(crate) fn holds(&self, logical: &[u8]) -> bool {
        checksum(self.bp.checksum_type, logical) == self.content_checksum
    }
}

/// The stored size of the block `bp` as ZFS counts it for `compressratio` (0 for a hole): its
/// logical size when it is stored as is, else its compressed size rounded up to whole sectors
/// (what compression actually saves; ZFS rounds a compressed block's `psize` the same way).
/// Not its allocated size: raidz parity and the sector a block smaller than one takes are the
/// layout's cost, not compression's, and with them a volume of 512-byte blocks, or any raidz
/// volume, showed a `compressratio` below 1.00x with compression off.
///
/// Never more than the block's allocated size (one copy), which is what the totals persisted
/// before this rule summed (2026-11-28): a block counted under the old rule takes away less
/// than it added when it is freed, so those totals can only stay high, never go below zero
/// (docs/compression.md).
pub(crate) fn stored_bytes(bp: &BlockPtr) -> i64 {
    let Some(dva) = bp.dvas().first() else {
        return 0;
    };
    let stored = if bp.compression == Compression::Off {
        u64::from(bp.psize_bytes)
    } else {
        u64::from(bp.psize_bytes)
            .next_multiple_of(SECTOR_BYTES)
            .min(u64::from(bp.lsize_bytes))
    };
    debug_assert!(stored <= u64::from(dva.asize_bytes), "{bp:?}");
    i64::try_from(stored.min(u64::from(dva.asize_bytes))).expect("a block's size fits i64")
}

/// Process-wide compression counters (for `oxpool iostat`): data blocks the txg syncs and the
/// intent log stored, before and after compression.
#[derive(Debug, Default)]
pub struct CompressCounters {
    /// Content bytes of the data blocks written (their logical size).
    pub logical_bytes: AtomicU64,
    /// Bytes those blocks took as stored, one copy (all-zero blocks stored as holes: 0).
    pub stored_bytes: AtomicU64,
    /// Data blocks stored compressed.
    pub compressed_blocks: AtomicU64,
    /// Data blocks stored as holes (all zeros).
    pub zero_blocks: AtomicU64,
    /// Content bytes decompressed after reads.
    pub decompressed_bytes: AtomicU64,
}

/// A point-in-time copy of [`CompressCounters`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CompressStats {
    /// See [`CompressCounters::logical_bytes`].
    pub logical_bytes: u64,
    /// See [`CompressCounters::stored_bytes`].
    pub stored_bytes: u64,
    /// See [`CompressCounters::compressed_blocks`].
    pub compressed_blocks: u64,
    /// See [`CompressCounters::zero_blocks`].
    pub zero_blocks: u64,
    /// See [`CompressCounters::decompressed_bytes`].
    pub decompressed_bytes: u64,
}

impl CompressCounters {
    /// Counts one data block written: `logical_bytes` of content stored as `stored`.
    pub(crate) fn note_written(&self, logical_bytes: usize, stored: &StoreAs) {
        self.logical_bytes
            .fetch_add(logical_bytes as u64, Ordering::Relaxed);
        self.stored_bytes
            .fetch_add(stored.asize_bytes(logical_bytes), Ordering::Relaxed);
        match stored {
            StoreAs::Hole => self.zero_blocks.fetch_add(1, Ordering::Relaxed),
            StoreAs::Compressed(_) => self.compressed_blocks.fetch_add(1, Ordering::Relaxed),
            StoreAs::AsIs => 0,
        };
    }

    /// Counts one data block written in a form decided before the sync (a received block,
    /// or one a client wrote that `written_form` stored as is).
    pub(crate) fn note_stored(&self, form: &StoredForm) {
        self.logical_bytes
            .fetch_add(u64::from(form.lsize_bytes), Ordering::Relaxed);
        self.stored_bytes.fetch_add(
            u64::from(form.psize_bytes).div_ceil(SECTOR_BYTES) * SECTOR_BYTES,
            Ordering::Relaxed,
        );
        if form.compression != Compression::Off {
            self.compressed_blocks.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A copy.
    pub fn snapshot(&self) -> CompressStats {
        CompressStats {
            logical_bytes: self.logical_bytes.load(Ordering::Relaxed),
            stored_bytes: self.stored_bytes.load(Ordering::Relaxed),
            compressed_blocks: self.compressed_blocks.load(Ordering::Relaxed),
            zero_blocks: self.zero_blocks.load(Ordering::Relaxed),
            decompressed_bytes: self.decompressed_bytes.load(Ordering::Relaxed),
        }
    }
}

/// The process's compression counters (all pools: as the completion counters, they describe
/// the process's work).
pub static COMPRESS_COUNTERS: CompressCounters = CompressCounters {
    logical_bytes: AtomicU64::new(0),
    stored_bytes: AtomicU64::new(0),
    compressed_blocks: AtomicU64::new(0),
    zero_blocks: AtomicU64::new(0),
    decompressed_bytes: AtomicU64::new(0),
};

#[cfg(test)]
mod tests {
    use super::*;
    use oxpool_format::{ChecksumType, Dva, VdevId};

    /// The next value of a xorshift64 sequence (test data: random-looking, reproducible).
    fn xorshift(x: &mut u64) -> u64 {
        *x ^= *x << 13;
        *x ^= *x >> 7;
        *x ^= *x << 17;
        *x
    }

    fn half_zero(len: usize) -> IoBuf {
        let mut buf = IoBuf::zeroed(len);
        let mut x = 5u64;
        for chunk in buf.chunks_mut(512) {
            for b in &mut chunk[..256] {
                *b = xorshift(&mut x) as u8;
            }
        }
        buf
    }

    fn pointer_for(c: &CompressedBlock, lsize: usize) -> BlockPtr {
        let mut bp = BlockPtr {
            ndvas: 1,
            lsize_bytes: lsize as u32,
            psize_bytes: c.psize_bytes,
            compression: c.compression,
            checksum: checksum(ChecksumType::Xxh3_128, &c.buf[..c.psize_bytes as usize]),
            birth: Txg(3),
            fill: 1,
            ..BlockPtr::HOLE
        };
        bp.dvas[0] = Dva {
            vdev: VdevId(0),
            offset_bytes: 0,
            asize_bytes: c.buf.len() as u32,
        };
        bp.validate().unwrap();
        bp
    }

    fn random_block(len: usize, seed: u64) -> IoBuf {
        let mut buf = IoBuf::zeroed(len);
        let mut x = seed | 1;
        for b in buf.iter_mut() {
            *b = (xorshift(&mut x) >> 24) as u8;
        }
        buf
    }

    #[test]
    fn a_streak_of_incompressible_blocks_skips_probes_but_never_zeros_or_the_next_hit() {
        use crate::zio::probe_streak::{STREAK_PROBE_EVERY, STREAK_SKIP_MIN};
        let kind = ChecksumType::Xxh3_128;
        let streak = ProbeStreak::default();
        let lz4 = CompressionSetting::LZ4;
        // Random blocks: every one stored as is, with its checksum, whether probed or not.
        let total = STREAK_SKIP_MIN + 8 * STREAK_PROBE_EVERY;
        for i in 0..total {
            let block = random_block(16384, u64::from(i) + 7);
            let form = written_form(lz4, kind, &block, &streak).expect("random: as is");
            assert_eq!(form.compression, Compression::Off);
            assert_eq!(form.checksum, checksum(kind, &block));
        }
        assert_eq!(streak.skipped(), u64::from(8 * (STREAK_PROBE_EVERY - 1)));
        // The streak stands at a multiple of STREAK_PROBE_EVERY: the next block is probed.
        // Probed, an all-zero block would end the streak (the probe finds zeros
        // compressible), so the zero blocks come after one more random block: all skipped.
        let block = random_block(16384, 1);
        assert!(written_form(lz4, kind, &block, &streak).is_some());
        let skipped = streak.skipped();
        // An all-zero block whose probe is skipped is still left to the sync (a hole).
        let zeros = IoBuf::zeroed(16384);
        for _ in 1..STREAK_PROBE_EVERY {
            assert!(written_form(lz4, kind, &zeros, &streak).is_none());
        }
        assert_eq!(
            streak.skipped(),
            skipped + u64::from(STREAK_PROBE_EVERY - 1),
            "the zero blocks' probes were skipped"
        );
        let block = random_block(16384, 2);
        assert!(written_form(lz4, kind, &block, &streak).is_some(), "probed");
        // Compressible blocks in the streak: the STREAK_PROBE_EVERY - 1 skipped ones are
        // stored as is, then the probe finds one, and every later one is left to the sync.
        let compressible = half_zero(16384);
        let as_is = (0..STREAK_PROBE_EVERY)
            .take_while(|_| written_form(lz4, kind, &compressible, &streak).is_some())
            .count();
        assert_eq!(as_is, STREAK_PROBE_EVERY as usize - 1, "stored as is");
        let skipped = streak.skipped();
        for _ in 0..4 * STREAK_SKIP_MIN {
            assert!(written_form(lz4, kind, &compressible, &streak).is_none());
        }
        assert_eq!(streak.skipped(), skipped, "no probe skipped after a hit");
    }

    #[test]
    fn stored_forms_follow_the_setting() {
        let zeros = IoBuf::zeroed(16384);
        assert!(matches!(
            store_as(CompressionSetting::OFF, &zeros),
            StoreAs::AsIs
        ));
        assert!(matches!(
            store_as(CompressionSetting::LZ4, &zeros),
            StoreAs::Hole
        ));
        // A block of one sector can never save one.
        let small = half_zero(4096);
        assert!(matches!(
            store_as(CompressionSetting::LZ4, &small),
            StoreAs::AsIs
        ));
        let data = half_zero(131072);
        for s in ["lz4", "zstd", "zstd-19", "zle"] {
            let setting: CompressionSetting = s.parse().unwrap();
            let StoreAs::Compressed(c) = store_as(setting, &data) else {
                panic!("{s}: half zeros did not compress");
            };
            assert_eq!(c.buf.len() as u64 % SECTOR_BYTES, 0);
            assert!(c.buf.len() <= compressed_bytes_max(data.len()));
            let bp = pointer_for(&c, data.len());
            let Verdict::Good(Some(back)) = verify_and_decode(&bp, &c.buf, Some(data.len())) else {
                panic!("{s}: did not decode");
            };
            assert_eq!(&back[..], &data[..]);
        }
    }

    #[test]
    fn decoding_checks_the_checksum_first_and_never_trusts_sizes() {
        let data = half_zero(16384);
        let StoreAs::Compressed(c) = store_as(CompressionSetting::LZ4, &data) else {
            panic!("did not compress");
        };
        let bp = pointer_for(&c, data.len());
        // A flipped bit in the stored bytes: a checksum error, nothing decoded.
        let mut flipped = IoBuf::from_slice(&c.buf);
        flipped[10] ^= 4;
        assert!(matches!(
            verify_and_decode(&bp, &flipped, Some(16384)),
            Verdict::BadChecksum
        ));
        // The reader expects another size than the pointer claims: refused.
        assert!(matches!(
            verify_and_decode(&bp, &c.buf, Some(8192)),
            Verdict::Undecodable
        ));
        // A pointer whose logical size lies (with a checksum that still matches): refused.
        let mut lying = bp;
        lying.lsize_bytes = 32768;
        assert!(matches!(
            verify_and_decode(&lying, &c.buf, Some(32768)),
            Verdict::Undecodable
        ));
        // Stored bytes that verify (a collision, a writer's bug) but are not a compressed
        // block of that size: refused, no panic.
        let mut garbage = IoBuf::zeroed(c.buf.len());
        garbage[..4].copy_from_slice(&[0xff, 0xff, 0xff, 0xff]);
        let mut forged = bp;
        forged.checksum = checksum(ChecksumType::Xxh3_128, &garbage[..bp.psize_bytes as usize]);
        assert!(matches!(
            verify_and_decode(&forged, &garbage, Some(16384)),
            Verdict::Undecodable
        ));
        // Without a size to decode to, only the stored bytes are checked.
        assert!(matches!(
            verify_and_decode(&bp, &c.buf, None),
            Verdict::Good(None)
        ));
    }

    #[test]
    fn many_blocks_are_stored_in_order_with_their_stored_bytes_checksums() {
        // 130 blocks: with compression off too, enough for a second thread (on a machine with
        // two cores or more).
        let blocks: Vec<IoBuf> = (0..130)
            .map(|i| match i % 3 {
                0 => IoBuf::zeroed(16384),
                1 => half_zero(16384),
                _ => IoBuf::from_slice(&[i as u8; 16384]),
            })
            .collect();
        let refs: Vec<&[u8]> = blocks.iter().map(|b| &b[..]).collect();
        let kind = ChecksumType::Xxh3_128;
        for setting in [CompressionSetting::LZ4, CompressionSetting::OFF] {
            let all = store_all(setting, kind, &refs);
            assert_eq!(all.len(), blocks.len());
            for (i, (one, block)) in all.iter().zip(&blocks).enumerate() {
                let alone = store_as(setting, block);
                match (&one.form, alone) {
                    (StoreAs::Hole, StoreAs::Hole) => assert_eq!(one.checksum, None),
                    (StoreAs::AsIs, StoreAs::AsIs) => {
                        assert_eq!(one.checksum, Some(checksum(kind, block)), "block {i}")
                    }
                    (StoreAs::Compressed(a), StoreAs::Compressed(b)) => {
                        assert_eq!(&a.buf[..], &b.buf[..], "block {i}");
                        let stored = &a.buf[..a.psize_bytes as usize];
                        assert_eq!(one.checksum, Some(checksum(kind, stored)), "block {i}");
                    }
                    _ => panic!("block {i} stored differently"),
                }
            }
        }
    }

    #[test]
    fn in_place_blocks_are_matched_by_content() {
        let data = half_zero(16384);
        let StoreAs::Compressed(c) = store_as(CompressionSetting::LZ4, &data) else {
            panic!("did not compress");
        };
        let block = InPlaceBlock::new(pointer_for(&c, data.len()), &data);
        assert!(block.holds(&data));
        let mut other = data.to_vec();
        other[100] ^= 1;
        assert!(!block.holds(&other));
    }
}
