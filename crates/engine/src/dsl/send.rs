//! What changed in a snapshot's tree after a txg: the walk behind `oxpool send -i` (and a
//! full send, "after txg 0"), pruned by birth txg.
//!
//! Copy-on-write makes a parent at least as new as its children, so a pointer born at or
//! before the base txg roots a subtree the base holds whole: it is skipped without being read.
//! The cost is the changed blocks plus their ancestors, not the volume's size.
//!
//! Holes are the trap (openzfs #4809): trims and write-zeroes leave **canonical holes**
//! (birth 0), which do not say when they appeared. A hole found in an indirect block born
//! after the base may be new, so it is reported as freed (a superset, never a miss), as ZFS
//! does with `send_holes_without_birth_time`. A hole that carries a birth (an all-zero block
//! stored as a hole) is reported only if born after the base. The cost stays proportional to
//! the changed indirect blocks (at most `INDIRECT_FANOUT` holes each).

use crate::dmu::tree::capacity;
use crate::spa::Spa;
use crate::vdev::queue::IoClass;
use crate::zio::read_block;
use crate::{EngineError, Result};
use oxpool_format::{decode_indirect, BlockPtr, Txg, INDIRECT_FANOUT};
use oxpool_io::IoBuf;
use std::collections::VecDeque;
use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

/// Indirect blocks read ahead of the walk at most: the next ones among a block's children
/// that the walk will descend into. Without them the walk stops at every indirect block (one
/// per 255 data blocks) for a read that waits behind the data reads in flight, and a send
/// reads no faster than one indirect block per such wait (measured: the device held about
/// half of the reads the sender allowed in flight).
pub const INDIRECT_READ_AHEAD: usize = 8;

/// An indirect block read ahead: being read, or read.
enum Ahead<'a> {
    Reading(Pin<Box<dyn Future<Output = Result<IoBuf>> + 'a>>),
    Read(Result<IoBuf>),
}

/// One change found by [`ChangeWalker`], in increasing block order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    /// Data block `block` was written after the base: its pointer (never a hole).
    Data {
        /// The data block's index.
        block: u64,
        /// Its pointer in the snapshot's tree.
        bp: BlockPtr,
    },
    /// Blocks `[first, first + count)` read as zeros and may not have at the base.
    Free {
        /// The first block.
        first: u64,
        /// How many (at least 1).
        count: u64,
    },
}

/// One indirect block being walked: its children, and the next one to look at.
struct Frame {
    /// Level of the children (0: data pointers).
    child_level: u8,
    /// The first data block the first child covers.
    first_block: u64,
    children: Box<[BlockPtr; INDIRECT_FANOUT]>,
    next: usize,
    /// Children below this one have been read ahead (or are not to be read).
    ahead_to: usize,
}

/// Walks a tree (a snapshot's root and levels) for the blocks born after `after`, in block
/// order, reading only indirect blocks born after it. Blocks at or past `nblocks` (the
/// volume's size in blocks) are not reported.
pub struct ChangeWalker<'a> {
    spa: &'a Spa,
    what: Arc<str>,
    after: Txg,
    /// Whether to report holes (an incremental stream); a full stream does not need them, as
    /// a new volume reads as zeros.
    holes: bool,
    nblocks: u64,
    /// Blocks below this one are not reported (a resumed send starts here).
    start: u64,
    /// The root, until the first step.
    root: Option<(BlockPtr, u8)>,
    /// Bounded by the tree's levels (at most 15 + 1 frames).
    stack: Vec<Frame>,
    /// Indirect blocks read so far.
    indirect_reads: u64,
    /// Indirect blocks read ahead, in the order the walk reaches them (at most
    /// [`INDIRECT_READ_AHEAD`]).
    ahead: VecDeque<(BlockPtr, Ahead<'a>)>,
}

/// Data blocks one pointer at `level` covers.
fn span(level: u8) -> u64 {
    capacity(level)
}

impl<'a> ChangeWalker<'a> {
    /// A walk of the tree under `root` (with `levels` levels) for what was born after
    /// `after`; with `holes`, holes that may be newer are reported as [`Change::Free`].
    pub(crate) fn new(
        spa: &'a Spa,
        what: &str,
        root: BlockPtr,
        levels: u8,
        after: Txg,
        holes: bool,
        nblocks: u64,
    ) -> ChangeWalker<'a> {
        ChangeWalker {
            spa,
            what: Arc::from(what),
            after,
            holes,
            nblocks,
            start: 0,
            root: Some((root, levels.max(1))),
            stack: Vec::new(),
            indirect_reads: 0,
            ahead: VecDeque::new(),
        }
    }

    /// Reports nothing below block `start` (a resumed send): subtrees wholly below it are
    /// skipped unread, and a freed range across it is cut at it.
    pub(crate) fn starting_at(mut self, start: u64) -> ChangeWalker<'a> {
        self.start = start;
        self
    }

    /// Indirect blocks read so far.
    pub fn indirect_reads(&self) -> u64 {
        self.indirect_reads
    }

    /// The next change, or None at the end of the tree.
    pub async fn next(&mut self) -> Result<Option<Change>> {
        if let Some((root, levels)) = self.root.take() {
            // The root's parent (the pool's metadata) changes with every txg: a hole there
            // may be new.
            if let Some(c) = self.visit(root, levels, 0, true).await? {
                return Ok(Some(c));
            }
        }
        // Bounded: each round moves one child forward or pops a frame; the tree is finite.
        loop {
            let Some(top) = self.stack.last_mut() else {
                return Ok(None);
            };
            if top.next == INDIRECT_FANOUT {
                self.stack.pop();
                continue;
            }
            let i = top.next;
            top.next += 1;
            let bp = top.children[i];
            let level = top.child_level;
            let first = top.first_block + i as u64 * span(level);
            if first >= self.nblocks {
                // Past the volume's end: nothing more in this block.
                top.next = INDIRECT_FANOUT;
                continue;
            }
            if level > 0 {
                self.read_ahead().await;
            }
            if let Some(c) = self.visit(bp, level, first, true).await? {
                return Ok(Some(c));
            }
        }
    }

    /// Whether the walk descends into `bp`, an indirect block at `level` covering blocks from
    /// `first` (as [`ChangeWalker::visit`] decides).
    fn descends(&self, bp: &BlockPtr, level: u8, first: u64) -> bool {
        level > 0
            && bp.level == level
            && !bp.is_hole()
            && bp.birth > self.after
            && first < self.nblocks
            && first.saturating_add(span(level)).min(self.nblocks) > self.start
    }

    /// Starts reading the next [`INDIRECT_READ_AHEAD`] children of the top frame (indirect
    /// blocks) that the walk will descend into, after the one it is at.
    async fn read_ahead(&mut self) {
        let Some(top) = self.stack.last() else {
            return;
        };
        let level = top.child_level;
        let (first_block, children) = (top.first_block, &top.children);
        let mut wanted = Vec::new();
        let mut i = top.ahead_to.max(top.next);
        // Bounded by the block's children.
        while i < INDIRECT_FANOUT && wanted.len() + self.ahead.len() < INDIRECT_READ_AHEAD {
            let bp = children[i];
            let first = first_block + i as u64 * span(level);
            i += 1;
            if first >= self.nblocks {
                i = INDIRECT_FANOUT;
                break;
            }
            if self.descends(&bp, level, first) {
                wanted.push(bp);
            }
        }
        if let Some(top) = self.stack.last_mut() {
            top.ahead_to = i;
        }
        if wanted.is_empty() {
            return;
        }
        let zio = &self.spa.zio;
        for bp in wanted {
            let what = self.what.clone();
            let read: Pin<Box<dyn Future<Output = Result<IoBuf>> + 'a>> =
                Box::pin(async move { read_block(zio, IoClass::AsyncRead, &bp, &*what).await });
            self.ahead.push_back((bp, Ahead::Reading(read)));
        }
        // Polled, so they are issued now.
        poll_fn(|cx| {
            self.poll_ahead(cx);
            Poll::Ready(())
        })
        .await;
    }

    /// Polls every read ahead still in progress. The walk does so whenever it waits for a
    /// read, and whoever holds a walker between steps must too: a read the vdev queue held
    /// and then admitted is issued only when polled, and holds its place in the queue until
    /// then (unpolled, it would hold up every read behind it).
    pub fn poll_ahead(&mut self, cx: &mut Context<'_>) {
        for (_, a) in self.ahead.iter_mut() {
            if let Ahead::Reading(read) = a {
                if let Poll::Ready(r) = read.as_mut().poll(cx) {
                    *a = Ahead::Read(r);
                }
            }
        }
    }

    /// Looks at pointer `bp` (of a block at `level` covering blocks from `first`), found in
    /// a block born after the base (`parent_new`): a change to report, or a frame pushed to
    /// descend into, or nothing.
    async fn visit(
        &mut self,
        bp: BlockPtr,
        level: u8,
        first: u64,
        parent_new: bool,
    ) -> Result<Option<Change>> {
        if first >= self.nblocks {
            return Ok(None);
        }
        let end = first.saturating_add(span(level)).min(self.nblocks);
        if end <= self.start {
            return Ok(None);
        }
        if bp.is_hole() {
            let maybe_new = bp.birth > self.after || (bp.birth == Txg(0) && parent_new);
            if self.holes && maybe_new {
                let from = first.max(self.start);
                return Ok(Some(Change::Free {
                    first: from,
                    count: end - from,
                }));
            }
            return Ok(None);
        }
        if bp.birth <= self.after {
            return Ok(None);
        }
        if level == 0 {
            return Ok(Some(Change::Data { block: first, bp }));
        }
        if bp.level != level {
            return Err(EngineError::Corrupt {
                device: self.spa.name.clone(),
                what: format!(
                    "{}: block pointer of level {} where level {level} belongs",
                    self.what, bp.level
                ),
                source: oxpool_format::FormatError::BadField {
                    field: "level",
                    value: bp.level as u64,
                },
            });
        }
        if !self.ahead.iter().any(|(b, _)| *b == bp) {
            let (zio, what) = (&self.spa.zio, self.what.clone());
            let read: Pin<Box<dyn Future<Output = Result<IoBuf>> + 'a>> =
                Box::pin(async move { read_block(zio, IoClass::AsyncRead, &bp, &*what).await });
            self.ahead.push_front((bp, Ahead::Reading(read)));
        }
        // The reads ahead are polled with this one (see `poll_ahead`).
        let buf = poll_fn(|cx| {
            self.poll_ahead(cx);
            let i = self
                .ahead
                .iter()
                .position(|(b, _)| *b == bp)
                .expect("queued above");
            match self.ahead.remove(i) {
                Some((_, Ahead::Read(r))) => Poll::Ready(r),
                Some(reading) => {
                    self.ahead.insert(i, reading);
                    Poll::Pending
                }
                None => unreachable!("found above"),
            }
        })
        .await?;
        self.indirect_reads += 1;
        let mut children = Box::new([BlockPtr::HOLE; INDIRECT_FANOUT]);
        decode_indirect(&buf, &mut children).map_err(|e| EngineError::Corrupt {
            device: self.spa.name.clone(),
            what: format!("{}: indirect block", self.what),
            source: e,
        })?;
        self.stack.push(Frame {
            child_level: level - 1,
            first_block: first,
            children,
            next: 0,
            ahead_to: 0,
        });
        Ok(None)
    }
}
