//! The pipeline's raidz path: it executes the plans of `vdev/raidz/` ("the vdev tree plans, the
//! pipeline drives") on a raidz vdev's children.
//!
//! - **Write** ([`write_raidz`]): parity generated on the calling thread before anything is
//!   issued, then one leaf write per column, all in flight at once (the fan-out never waits
//!   on a child). Skip sectors are not written: nothing reads them, and nothing here merges
//!   neighbouring writes. The write succeeds when at most `parity` columns failed (ZFS's
//!   rule): the block reads back, rebuilt from parity, and a scrub rewrites the columns.
//! - **Read** ([`read_raidz`]): a [`ReadPlan`] driven to its end. A normal read reads the
//!   data columns only; a column on a missing child, or whose read fails, brings in one
//!   parity column more; a block that fails its checksum brings in every column and the
//!   combinatorial search for the silently bad ones. A scrub reads every column and checks
//!   the parity too. The columns found bad come back as [`Repair`]s, with their right bytes.
//!
//! Each column is read into, or written from, a buffer of its own (the backend reads and
//! writes whole buffers): a copy of the block's bytes on the way in and out, which a
//! scatter/gather leaf I/O would save.

use super::{count_write_failure, Repair, Repairs, Zio};
use crate::vdev::queue::IoClass;
use crate::vdev::raidz::{
    generate_parity, plan_write, write_outcome, ColumnSet, DataColumns, ParityKernels, RaidzMap,
    ReadFailure, ReadMode, ReadPlan, ReadStep, WriteOutcome, WriteSource,
};
use crate::vdev::{ErrorKind, Leaf, LeafIo, TopVdev};
use crate::zio::warn_limit::io_warn;
use crate::{EngineError, Result};
use oxpool_format::{checksum_parts, BlockPtr, Dva, Txg, DATA_START_BYTES};
use oxpool_io::rt::join_all;
use oxpool_io::IoBuf;
use std::fmt::Display;
use std::sync::Arc;

/// The map of the block at `dva` on the raidz vdev `top` with `psize_bytes` physical bytes,
/// checked against the DVA: its allocated size must be the one the layout gives (a pointer
/// that disagrees is damaged, and reading it by another map would return other bytes).
fn block_map(top: &TopVdev, dva: &Dva, psize_bytes: u64) -> Result<RaidzMap> {
    let layout = top
        .raidz_layout()
        .ok_or_else(|| EngineError::invalid("raidz I/O on a vdev that is not raidz"))?;
    let map = layout
        .map(dva.offset_bytes, psize_bytes)
        .map_err(|e| EngineError::invalid(format!("vdev {}: {e}", top.id.0)))?;
    if map.asize_bytes() != u64::from(dva.asize_bytes) {
        return Err(EngineError::invalid(format!(
            "vdev {}: block of {psize_bytes} bytes at {} has allocated size {}, its layout {}",
            top.id.0,
            dva.offset_bytes,
            dva.asize_bytes,
            map.asize_bytes()
        )));
    }
    Ok(map)
}

/// The name errors give a raidz vdev.
fn vdev_name(top: &TopVdev) -> String {
    top.group_name()
        .unwrap_or_else(|| format!("vdev {}", top.id.0))
}

/// Writes `data` (the block, padded to whole sectors: its length is the block's data size)
/// to the raidz vdev `top` at `dva`, as I/Os of `class`; with `durable`, every column write is
/// a durable (FUA) write. Succeeds if at most `parity` columns failed (those children are
/// counted a write error each); fails if more did, and then the block is not readable there.
pub(crate) async fn write_raidz(
    zio: &Zio,
    class: IoClass,
    top: &TopVdev,
    dva: &Dva,
    data: &[u8],
    durable: bool,
) -> Result<()> {
    let map = block_map(top, dva, data.len() as u64)?;
    if data.len() != map.data_bytes() {
        return Err(EngineError::invalid(format!(
            "raidz write of {} bytes: not whole sectors",
            data.len()
        )));
    }
    let kernels = ParityKernels::best();
    let mut parity: Vec<Option<IoBuf>> = Vec::new();
    if !map.parity_is_data() {
        let mut rows: Vec<IoBuf> = (0..map.parity_count())
            .map(|_| IoBuf::zeroed(map.parity_column_bytes()))
            .collect();
        let mut refs: Vec<&mut [u8]> = rows.iter_mut().map(|b| &mut b[..]).collect();
        generate_parity(kernels, &map, data, &mut refs);
        parity = rows.into_iter().map(Some).collect();
    }
    // One shape for the whole block (its members outlive the writes below).
    let shape = top.shape();
    let mut failed = ColumnSet::EMPTY;
    let mut failed_io = false;
    let mut ios: Vec<(usize, LeafIo)> = Vec::with_capacity(map.column_count());
    let mut futs = Vec::with_capacity(map.column_count());
    // Columns with a member written well (a pair's column is there if either member took it).
    let mut written = ColumnSet::EMPTY;
    for w in plan_write(&map) {
        // Skip sectors hold nothing and are never read.
        let Some(column) = w.column else { continue };
        let child = &shape.children[w.child.0];
        // A member out of service lacks the column (and notes it); a child with no member in
        // service lacks it.
        let members = child.leaves().filter(|l| l.health.in_service()).count();
        let mut any = 0;
        for leaf in child.leaves() {
            if !leaf.health.in_service() {
                leaf.health.note_skipped();
                continue;
            }
            any += 1;
            let buf = match w.source {
                WriteSource::Block(ref range) => IoBuf::from_slice(&data[range.clone()]),
                // The last member takes the row; a pair's first gets a copy.
                WriteSource::Parity(row) if any == members => {
                    parity[row].take().expect("each parity row written once")
                }
                WriteSource::Parity(row) => {
                    parity[row].clone().expect("each parity row written once")
                }
                WriteSource::Zeros => IoBuf::zeroed(w.size_bytes),
            };
            let offset_bytes = DATA_START_BYTES + w.child_offset_bytes;
            ios.push((
                column,
                LeafIo {
                    leaf: leaf.clone(),
                    offset_bytes,
                },
            ));
            let leaf = &**leaf;
            futs.push(async move {
                if durable {
                    leaf.write_durable(class, offset_bytes, buf).await
                } else {
                    leaf.write(class, offset_bytes, buf).await
                }
            });
        }
        if any == 0 {
            failed.insert(column);
        }
    }
    let batch = zio.completion.batch_guard();
    let results = join_all(futs).await;
    drop(batch);
    let mut last_err = None;
    let mut failed_writes = ColumnSet::EMPTY;
    for ((column, io), r) in ios.iter().zip(results) {
        match r {
            Ok(_) => written.insert(*column),
            Err(e) => {
                count_write_failure(zio, io, 1, &e);
                failed_writes.insert(*column);
                failed_io = true;
                last_err = Some(EngineError::io(io.leaf.name(), e));
            }
        }
    }
    for column in failed_writes.iter() {
        if !written.contains(column) {
            failed.insert(column);
        }
    }
    match write_outcome(&map, failed) {
        WriteOutcome::Complete => Ok(()),
        // Without the children known to be out: nothing to say for every block.
        WriteOutcome::Degraded { .. } if !failed_io => Ok(()),
        WriteOutcome::Degraded { missing } => {
            io_warn!(
                vdev = vdev_name(top),
                offset = dva.offset_bytes,
                "raidz block written without {} of its columns",
                missing.len()
            );
            Ok(())
        }
        WriteOutcome::Failed { missing } => Err(last_err.unwrap_or_else(|| {
            EngineError::io(
                &vdev_name(top),
                std::io::Error::other(format!(
                    "{} columns of a block could not be written, more than its parity {}",
                    missing.len(),
                    map.parity_count()
                )),
            )
        })),
    }
}

/// What [`read_raidz`] found, beside the block.
#[derive(Debug, Default)]
pub(crate) struct RaidzReadCounts {
    /// Columns read.
    pub columns_read: u64,
    /// Columns that failed to read or held wrong bytes.
    pub columns_bad: u64,
    /// Whether the data was rebuilt from parity.
    pub reconstructed: bool,
}

/// Reads the block `bp` describes from its copy `dva` on the raidz vdev `top`, as I/Os of
/// `class` in `mode`, and verifies it against `bp`'s checksum. Returns the block's stored
/// bytes (its data size: `psize` rounded up to whole sectors), the columns to rewrite, and
/// the counts. Counts every read error and every silently bad column on its device.
///
/// Errors: more columns unreadable than parity (an I/O error naming the vdev), or no choice
/// of up to `parity` bad columns that verifies (a checksum error; every column read is
/// charged one, as ZFS blames every child of a block it cannot rebuild).
pub(crate) async fn read_raidz(
    zio: &Zio,
    class: IoClass,
    top: &TopVdev,
    dva: &Dva,
    bp: &BlockPtr,
    mode: ReadMode,
    what: &(impl Display + ?Sized),
) -> Result<(IoBuf, Repairs, RaidzReadCounts)> {
    let psize = bp.psize_bytes as usize;
    let verify = |data: &DataColumns<'_>| {
        let mut left = psize;
        let parts = data.iter().map(|col| {
            let take = left.min(col.len());
            left -= take;
            &col[..take]
        });
        checksum_parts(bp.checksum_type, parts) == bp.checksum
    };
    read_raidz_with(
        zio,
        class,
        top,
        dva,
        u64::from(bp.psize_bytes),
        Some(bp.birth),
        verify,
        mode,
        true,
        what,
    )
    .await
}

/// [`read_raidz`] of a block of `psize_bytes` that `verify` recognizes (for a block without
/// a parent pointer: an intent-log block, which checks itself). With `blame` false, a block
/// that no choice of columns makes verify is not charged to the devices (the end of a log
/// chain is a place that holds no block of it: nothing is damaged). `birth`, if known, is
/// the block's txg: a child that missed it is stale for it (not read, repaired by a scrub).
#[allow(clippy::too_many_arguments)]
pub(crate) async fn read_raidz_with<V>(
    zio: &Zio,
    class: IoClass,
    top: &TopVdev,
    dva: &Dva,
    psize_bytes: u64,
    birth: Option<Txg>,
    verify: V,
    mode: ReadMode,
    blame: bool,
    what: &(impl Display + ?Sized),
) -> Result<(IoBuf, Repairs, RaidzReadCounts)>
where
    V: Fn(&DataColumns<'_>) -> bool,
{
    let map = block_map(top, dva, psize_bytes)?;
    let kernels = ParityKernels::best();
    // One shape for the whole block: a device attached or detached meanwhile changes the
    // next block's plan, not this one's.
    let shape = top.shape();
    // A pair's column is read from the member that lacks nothing for the block. Chosen once
    // for the whole read: the fault rule may take a device out of service between two steps
    // of the plan (or while a read of it runs), and the plan must keep the leaves it counted
    // on (an error of one is then charged to it; a later step does not read it again).
    let leaves: Vec<Option<&Arc<Leaf>>> = shape
        .children
        .iter()
        .map(|child| child.for_read(birth))
        .collect();
    let child = |c: usize| leaves[map.column(c).child.0];
    let unreadable = map.columns_on(|ch| leaves[ch.0].is_none());
    let mut stale = match birth {
        Some(b) => map.columns_on(|ch| leaves[ch.0].is_some_and(|l| l.health.missed_covers(b))),
        None => ColumnSet::EMPTY,
    };
    // More columns out than parity when the stale ones are left out: read them after all
    // (their ranges are conservative; the checksum says whether they hold the block).
    if unreadable.union(stale).len() > map.parity_count() {
        stale = ColumnSet::EMPTY;
    }
    let mut plan = ReadPlan::new(&map, mode, unreadable, stale);
    let mut bufs: Vec<IoBuf> = (0..map.column_count())
        .map(|c| IoBuf::zeroed(map.column_bytes(c)))
        .collect();
    let mut counts = RaidzReadCounts::default();
    // Bounded: each step reads columns not read before, or ends the plan.
    for _ in 0..=2 * map.column_count() + 2 {
        let step = {
            let mut cols: Vec<&mut [u8]> = bufs.iter_mut().map(|b| &mut b[..]).collect();
            plan.next(kernels, &mut cols, &verify)
        };
        match step {
            ReadStep::Read(set) => {
                let futs: Vec<_> = set
                    .iter()
                    .map(|c| {
                        let leaf = child(c).expect("the plan reads present children only");
                        let buf = std::mem::replace(&mut bufs[c], IoBuf::zeroed(0));
                        let offset_bytes = DATA_START_BYTES + map.column(c).child_offset_bytes;
                        async move { (c, leaf, leaf.read(class, offset_bytes, buf).await) }
                    })
                    .collect();
                let batch = zio.completion.batch_guard();
                let results = join_all(futs).await;
                drop(batch);
                for (c, leaf, r) in results {
                    counts.columns_read += 1;
                    match r {
                        Ok(buf) => {
                            bufs[c] = buf;
                            plan.read_done(c, true);
                        }
                        Err(e) => {
                            // The leaf the read went to: the fault rule may have taken it
                            // out of service while the read ran (this very error can).
                            zio.vdevs.note_error(leaf, ErrorKind::Read, Some(&e));
                            io_warn!(device = leaf.name(), %what, "read failed: {e}");
                            bufs[c] = IoBuf::zeroed(map.column_bytes(c));
                            counts.columns_bad += 1;
                            plan.read_done(c, false);
                        }
                    }
                }
            }
            ReadStep::Done(outcome) => {
                for c in outcome.silent.iter() {
                    if let Some(leaf) = child(c) {
                        zio.vdevs.note_error(leaf, ErrorKind::Checksum, None);
                        io_warn!(device = leaf.name(), %what, "raidz column checksum mismatch");
                    }
                }
                counts.columns_bad += outcome.silent.len() as u64;
                counts.reconstructed = outcome.reconstructed;
                let mut repairs = Repairs::default();
                for c in outcome.repair.iter() {
                    if let Some(leaf) = child(c) {
                        repairs.push(Repair::Column {
                            io: LeafIo {
                                leaf: leaf.clone(),
                                offset_bytes: DATA_START_BYTES + map.column(c).child_offset_bytes,
                            },
                            data: bufs[c].clone(),
                        });
                    }
                }
                // A scrub (or resilver) read every column and checked them: the other member
                // of a pair that lacks the block (a replacement, a spare being resilvered)
                // gets its column too.
                if let (ReadMode::Scrub, Some(b)) = (mode, birth) {
                    for (c, buf) in bufs.iter().enumerate() {
                        let read_from = child(c);
                        for leaf in shape.children[map.column(c).child.0].leaves() {
                            let other = read_from.is_none_or(|r| !Arc::ptr_eq(r, leaf));
                            if other && leaf.health.in_service() && leaf.health.missed_covers(b) {
                                repairs.push(Repair::Column {
                                    io: LeafIo {
                                        leaf: leaf.clone(),
                                        offset_bytes: DATA_START_BYTES
                                            + map.column(c).child_offset_bytes,
                                    },
                                    data: buf.clone(),
                                });
                            }
                        }
                    }
                }
                let mut block = IoBuf::zeroed(map.data_bytes());
                let mut at = 0;
                for c in map.parity_count()..map.column_count() {
                    block[at..at + bufs[c].len()].copy_from_slice(&bufs[c]);
                    at += bufs[c].len();
                }
                debug_assert_eq!(at, block.len());
                return Ok((block, repairs, counts));
            }
            ReadStep::Failed(ReadFailure::TooManyMissing { missing }) => {
                return Err(EngineError::io(
                    &vdev_name(top),
                    std::io::Error::other(format!(
                        "{what}: {} of its columns unreadable, more than its parity {}",
                        missing.len(),
                        map.parity_count()
                    )),
                ));
            }
            ReadStep::Failed(ReadFailure::Unrecoverable { read }) => {
                for c in read.iter().filter(|_| blame) {
                    if let Some(leaf) = child(c) {
                        zio.vdevs.note_error(leaf, ErrorKind::Checksum, None);
                    }
                }
                if blame {
                    io_warn!(vdev = vdev_name(top), %what, "raidz block damaged beyond its parity");
                }
                return Err(EngineError::Checksum {
                    what: what.to_string(),
                });
            }
        }
    }
    unreachable!("a read plan ends within its columns' reads")
}
