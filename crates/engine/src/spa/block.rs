//! New blocks: what one is (size, type, copies, checksum, compression, birth), allocating its
//! places and writing it through the pipeline.

use crate::props::VolumeProps;
use crate::spa::Spa;
use crate::vdev::alloc::ClassBytes;
use crate::vdev::queue::IoClass;
use crate::zio::{write_block_shared, write_blocks_shared};
use crate::{EngineError, Result};
use oxpool_format::{checksum, BlockPtr, BlockType, Compression, Dva, Txg, SECTOR_BYTES};
use oxpool_io::IoBuf;
use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

/// Blocks one sync handles as a batch: merged (their reads in flight together), given
/// adjacent places, written (aggregated into writes of up to 1 MiB, so a few writes in
/// flight) and finished while the next batch is prepared (`dmu::sync`: at most two batches
/// at once). Bounds the memory of merged blocks in flight (4 MiB of 16 KiB blocks per batch)
/// and keeps the device's queue a few large writes deep, as ZFS's async-write limits do with
/// aggregated I/Os.
pub(crate) const SYNC_WRITES_IN_FLIGHT_MAX: usize = 256;
/// Copies of the pool's own metadata (PoolMeta, space maps): as ZFS's MOS, the most.
pub(crate) const META_COPIES: usize = 3;

/// What a new block is, for [`write_new_block`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct NewBlock {
    pub psize_bytes: u32,
    /// The content's size: `psize_bytes` unless compressed.
    pub lsize_bytes: u32,
    /// How the stored bytes are compressed.
    pub compression: Compression,
    pub block_type: BlockType,
    pub level: u8,
    pub copies: usize,
    pub checksum_type: oxpool_format::ChecksumType,
    pub txg: Txg,
    pub fill: u64,
}

impl NewBlock {
    /// A data block of a volume with properties `props`, born in `txg`.
    pub(crate) fn data(props: &VolumeProps, txg: Txg) -> NewBlock {
        NewBlock {
            psize_bytes: props.volblocksize_bytes,
            lsize_bytes: props.volblocksize_bytes,
            compression: Compression::Off,
            block_type: BlockType::Data,
            level: 0,
            copies: props.copies as usize,
            checksum_type: props.checksum,
            txg,
            fill: 1,
        }
    }

    /// This block stored compressed as `c` (its content stays `lsize_bytes`).
    pub(crate) fn compressed(self, c: &crate::zio::compress::CompressedBlock) -> NewBlock {
        debug_assert!(c.psize_bytes < self.lsize_bytes);
        NewBlock {
            psize_bytes: c.psize_bytes,
            compression: c.compression,
            ..self
        }
    }
}

/// Allocates and writes one block as I/Os of `class`; returns its pointer. `data` is padded
/// to whole sectors; every copy is written from it (no copy of the bytes).
pub(crate) async fn write_new_block(
    inner: &Spa,
    class: IoClass,
    data: &Arc<IoBuf>,
    nb: NewBlock,
) -> Result<BlockPtr> {
    let bp = alloc_new_block(inner, data, nb, None)?;
    write_block_shared(&inner.zio, class, bp.dvas(), data).await?;
    Ok(bp)
}

/// Writes `bytes`, an encoded metadata chunk of `records` records (a deadlist's, a table's,
/// the history's), as a new uncompressed block of `block_type` with `copies`, born in `txg`,
/// as an asynchronous write of the txg sync; returns its pointer.
pub(crate) async fn write_meta_chunk(
    inner: &Spa,
    bytes: &[u8],
    block_type: BlockType,
    copies: usize,
    txg: Txg,
    records: u64,
) -> Result<BlockPtr> {
    let nb = NewBlock {
        psize_bytes: bytes.len() as u32,
        lsize_bytes: bytes.len() as u32,
        compression: Compression::Off,
        block_type,
        level: 0,
        copies,
        checksum_type: oxpool_format::ChecksumType::Xxh3_128,
        txg,
        fill: records,
    };
    write_new_block(inner, IoClass::AsyncWrite, &Arc::new(padded(bytes)), nb).await
}

/// Allocates and writes many blocks as I/Os of `class` (see [`write_blocks_shared`]: places
/// taken in order, so adjacent writes aggregate); returns their pointers in order.
pub(crate) async fn write_new_blocks(
    inner: &Spa,
    class: IoClass,
    blocks: &[(&Arc<IoBuf>, NewBlock)],
) -> Result<Vec<BlockPtr>> {
    let mut ptrs = Vec::with_capacity(blocks.len());
    for (data, nb) in blocks {
        ptrs.push(alloc_new_block(inner, data, *nb, None)?);
    }
    let list: Vec<(&[Dva], &Arc<IoBuf>)> = ptrs
        .iter()
        .zip(blocks)
        .map(|(bp, (data, _))| (bp.dvas(), *data))
        .collect();
    for r in write_blocks_shared(&inner.zio, class, &list).await {
        r?;
    }
    Ok(ptrs)
}

/// Allocates the places of a new block of `data` and returns its pointer; nothing is written.
/// With `held` (the intent log's blocks written in place, outside any txg sync), the places
/// are recorded there under the pool's state lock, in the same step as the allocation, so a
/// txg sync whose space maps include the allocation finds them there; and the allocation must
/// leave the pending syncs the space they may need, or it fails with NoSpace (the log then
/// falls back to waiting for the txg).
pub(crate) fn alloc_new_block(
    inner: &Spa,
    data: &IoBuf,
    nb: NewBlock,
    held: Option<&Mutex<HashSet<Dva>>>,
) -> Result<BlockPtr> {
    alloc_new_block_checksummed(inner, data, nb, held, None)
}

/// [`alloc_new_block`] with the checksum of the stored bytes already known (`known`, by
/// `nb.checksum_type`: a received block's, verified by the stream decoder), so that it is not
/// computed again.
pub(crate) fn alloc_new_block_checksummed(
    inner: &Spa,
    data: &IoBuf,
    nb: NewBlock,
    held: Option<&Mutex<HashSet<Dva>>>,
    known: Option<oxpool_format::Checksum>,
) -> Result<BlockPtr> {
    let asize = data.len() as u64;
    debug_assert_eq!(asize % SECTOR_BYTES, 0);
    let no_space = || EngineError::NoSpace {
        pool: inner.name.clone(),
        detail: String::new(),
    };
    let dvas = {
        let mut s = inner.state.lock().unwrap();
        if held.is_some() {
            let mut extra = ClassBytes::default();
            extra.add_blocks(asize, nb.copies as u64, 1);
            if !inner.may_allocate_outside_sync(&mut s.alloc, extra) {
                return Err(no_space());
            }
        }
        // The sync's blocks go to adjacent places (one aggregated write) while empty space is
        // plentiful: while the empty slabs alone hold everything pending syncs may still
        // allocate, with the reserve, spending them cannot make a later block not fit; and
        // only while the block's class does not hold more free slots than there are empty
        // slabs beyond the reserve, or the class would keep the pool's free space as its own
        // holes (`Space::sequential_ok`).
        let space = s.alloc.space();
        let reserve = Spa::sync_reserve(&s.alloc, &space, false);
        // Below the reserve's empty part a block borrows a larger class's spare slot before
        // it takes an empty slab, never a slot the pending blocks need.
        let charged = held.is_none() && inner.charged_placed_txg.load(Ordering::SeqCst) == 0;
        let keep = inner.keep(&s.alloc, &space, charged);
        let sequential = held.is_none()
            && space.sequential_ok(&keep.need, reserve.total_bytes(), asize, nb.copies);
        let dvas = s
            .alloc
            .alloc_with(asize, nb.copies, sequential, &keep)
            .ok_or_else(no_space)?;
        if let Some(h) = held {
            h.lock().unwrap().extend(dvas.iter().copied());
        }
        dvas
    };
    let mut bp = BlockPtr {
        ndvas: dvas.len() as u8,
        lsize_bytes: nb.lsize_bytes,
        psize_bytes: nb.psize_bytes,
        checksum_type: nb.checksum_type,
        compression: nb.compression,
        block_type: nb.block_type,
        level: nb.level,
        birth: nb.txg,
        fill: nb.fill,
        checksum: match known {
            Some(sum) => {
                debug_assert_eq!(
                    sum,
                    checksum(nb.checksum_type, &data[..nb.psize_bytes as usize])
                );
                sum
            }
            None => checksum(nb.checksum_type, &data[..nb.psize_bytes as usize]),
        },
        ..BlockPtr::HOLE
    };
    bp.dvas[..dvas.len()].copy_from_slice(&dvas);
    Ok(bp)
}

pub(crate) fn padded(data: &[u8]) -> IoBuf {
    let len = (data.len() as u64).div_ceil(SECTOR_BYTES) * SECTOR_BYTES;
    let mut b = IoBuf::zeroed(len as usize);
    b[..data.len()].copy_from_slice(data);
    b
}
