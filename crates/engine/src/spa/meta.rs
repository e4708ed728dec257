//! The pool's own metadata block (PoolMeta): reading it at import, writing it each txg (as
//! one block, or as pieces named by an index when it outgrows one allocation).

use crate::spa::block::{padded, write_new_block, NewBlock, META_COPIES};
use crate::spa::Spa;
use crate::vdev::queue::IoClass;
use crate::zio::{read_block, Zio};
use crate::{EngineError, Result};
use oxpool_format::{
    decode_meta_index, encode_meta_index, BlockPtr, BlockType, Compression, Dva, PoolMeta, Txg,
    META_INDEX_PIECES_MAX, META_PIECE_BYTES_MAX,
};
use oxpool_io::rt::join_all;
use std::sync::Arc;

/// Reads the pool metadata the uberblock's root points at: one block, or the index of its
/// pieces (see [`write_pool_meta`]). Returns it with every place it occupies.
pub(crate) async fn load_meta(
    zio: &Zio,
    bp: &BlockPtr,
    pool: &str,
) -> Result<(PoolMeta, Vec<Dva>)> {
    let corrupt = |what: &str, e| EngineError::Corrupt {
        device: pool.to_string(),
        what: what.into(),
        source: e,
    };
    let what = format!("{pool} pool metadata");
    let mut places = bp.dvas().to_vec();
    let whole = match (bp.is_hole(), bp.block_type) {
        (false, BlockType::PoolMeta) => {
            let buf = read_block(zio, IoClass::SyncRead, bp, &what).await?;
            buf[..bp.psize_bytes as usize].to_vec()
        }
        (false, BlockType::MetaIndex) => {
            let buf = read_block(zio, IoClass::SyncRead, bp, &what).await?;
            let pieces = decode_meta_index(&buf[..bp.psize_bytes as usize])
                .map_err(|e| corrupt("pool metadata index", e))?;
            let mut whole = Vec::new();
            // Bounded by META_INDEX_PIECES_MAX.
            for p in &pieces {
                if p.block_type != BlockType::PoolMeta {
                    return Err(corrupt(
                        "pool metadata index",
                        oxpool_format::FormatError::BadField {
                            field: "meta index piece type",
                            value: p.block_type as u64,
                        },
                    ));
                }
                let buf = read_block(zio, IoClass::SyncRead, p, &what).await?;
                whole.extend_from_slice(&buf[..p.psize_bytes as usize]);
                places.extend_from_slice(p.dvas());
            }
            whole
        }
        _ => {
            return Err(EngineError::invalid(format!(
                "pool '{pool}': uberblock root is not pool metadata"
            )))
        }
    };
    let meta = PoolMeta::decode(&whole).map_err(|e| corrupt("pool metadata", e))?;
    Ok((meta, places))
}

/// Writes txg `txg`'s encoded PoolMeta block: as one block when it fits in one allocation,
/// else as pieces of at most META_PIECE_BYTES_MAX (less on a pool with raidz vdevs, see
/// [`crate::vdev::alloc::Allocator::block_bytes_max`]) named by a metadata index. Its list of
/// deferred frees grows with what recent txgs freed (hundreds of KiB under random writes), and
/// the allocator places no block larger than a slab: one that size may find no room at all in
/// a pool whose free space is in small holes, while pieces always do (see `alloc`). Returns the
/// uberblock's root pointer and every place written.
pub(crate) async fn write_pool_meta(
    inner: &Spa,
    txg: Txg,
    meta_block: &[u8],
) -> Result<(BlockPtr, Vec<Dva>)> {
    let nb = |psize_bytes: usize, block_type| NewBlock {
        psize_bytes: psize_bytes as u32,
        lsize_bytes: psize_bytes as u32,
        compression: Compression::Off,
        block_type,
        level: 0,
        copies: META_COPIES,
        checksum_type: oxpool_format::ChecksumType::Xxh3_128,
        txg,
        fill: 0,
    };
    // A piece must fit in one slab of whichever vdev takes it: on a raidz vdev its parity
    // comes on top (128 KiB on a raidz1 of two, about 160 KiB on a raidz2 of six).
    let piece_bytes = inner
        .state
        .lock()
        .unwrap()
        .alloc
        .block_bytes_max(META_PIECE_BYTES_MAX as u64) as usize;
    if meta_block.len() <= piece_bytes {
        let block = Arc::new(padded(meta_block));
        let nb = nb(meta_block.len(), BlockType::PoolMeta);
        let bp = write_new_block(inner, IoClass::AsyncWrite, &block, nb).await?;
        return Ok((bp, bp.dvas().to_vec()));
    }
    if meta_block.len().div_ceil(piece_bytes) > META_INDEX_PIECES_MAX {
        return Err(EngineError::invalid(format!(
            "pool '{}': its metadata ({} bytes) exceeds {META_INDEX_PIECES_MAX} pieces of {piece_bytes} bytes",
            inner.name,
            meta_block.len()
        )));
    }
    let futs: Vec<_> = meta_block
        .chunks(piece_bytes)
        .map(|piece| async move {
            let block = Arc::new(padded(piece));
            let nb = nb(piece.len(), BlockType::PoolMeta);
            write_new_block(inner, IoClass::AsyncWrite, &block, nb).await
        })
        .collect();
    let mut pieces = Vec::new();
    let mut places = Vec::new();
    for r in join_all(futs).await {
        let bp = r?;
        places.extend_from_slice(bp.dvas());
        pieces.push(bp);
    }
    let index = encode_meta_index(&pieces);
    let nb = nb(index.len(), BlockType::MetaIndex);
    let bp = write_new_block(inner, IoClass::AsyncWrite, &Arc::new(padded(&index)), nb).await?;
    places.extend_from_slice(bp.dvas());
    Ok((bp, places))
}
