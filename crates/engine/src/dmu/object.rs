//! One object: a block tree of its own, the dirty sets of the txgs not yet synced, and the
//! blocks the intent log wrote in place for a txg's sync to adopt. A volume's data is one
//! object; a filesystem's files and directories will be others of the same kind.

use crate::dmu::dirty::ObjectDirty;
use crate::dmu::tree::BlockTree;
use crate::zio::compress::InPlaceBlock;
use oxpool_format::{BlockPtr, Dva, Txg};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::AtomicU64;
use std::sync::Mutex;

/// Identity of an object inside its object set.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectId(pub u64);

impl ObjectId {
    /// A volume's data (as ZFS's zvol object 1).
    pub const VOLUME_DATA: ObjectId = ObjectId(1);
}

/// One object's state.
pub(crate) struct Object {
    /// The dirty sets of the txgs not yet synced.
    pub dirty: Mutex<ObjectDirty>,
    /// The block tree (cached indirect blocks; the sync changes it).
    pub tree: Mutex<BlockTree>,
    /// The size that goes with the tree the txg sync persists: the size as of the txg being
    /// synced, or of the last one synced. The dataset's properties may hold a newer one (a
    /// resize in the open txg, whose frees the tree does not have yet).
    pub tree_size_bytes: AtomicU64,
    /// Blocks the intent log already wrote in place (logbias=throughput, large sync writes),
    /// by (txg, block): the sync of that txg adopts one instead of writing the block again if
    /// the block's dirty content is what was written (compared by the content's checksum: a
    /// compressed block's pointer checksums its stored bytes).
    pub overrides: Mutex<HashMap<(Txg, u64), InPlaceBlock>>,
    /// In-place blocks replaced by a newer one for the same (txg, block): freed by that txg's
    /// sync.
    pub override_garbage: Mutex<Vec<(Txg, BlockPtr)>>,
    /// Places of every in-place block from its allocation until a txg sync adopts or frees it
    /// (in `overrides`, `override_garbage`, or still being written). Each sync lists them in
    /// the dataset's `log_reserved`: the space maps it persists may hold them allocated while
    /// neither its tree nor its deferred frees reach them, and import frees them after the
    /// replay. Inserted under the pool's state lock, with the allocation.
    pub inplace_held: Mutex<HashSet<Dva>>,
    /// Bytes allocated to its blocks as of the last sync.
    pub used_bytes: AtomicU64,
    /// The tree's root and levels as the last sync left them: every block below is written
    /// (though not durable before that txg's uberblock). What a scrub walks; unlike
    /// `tree.root()`, valid while a sync is changing the tree.
    pub written_root: Mutex<(BlockPtr, u8)>,
    /// Bytes its data blocks take as stored, one copy each, as of the last sync.
    pub compressed_bytes: AtomicU64,
}

impl Object {
    /// An object over `tree`, whose size goes with `size_bytes`.
    pub(crate) fn new(tree: BlockTree, size_bytes: u64, used_bytes: u64) -> Object {
        let written_root = Mutex::new((tree.root(), tree.levels()));
        Object {
            dirty: Mutex::new(ObjectDirty::default()),
            tree: Mutex::new(tree),
            tree_size_bytes: AtomicU64::new(size_bytes),
            overrides: Mutex::new(HashMap::new()),
            override_garbage: Mutex::new(Vec::new()),
            inplace_held: Mutex::new(HashSet::new()),
            used_bytes: AtomicU64::new(used_bytes),
            written_root,
            compressed_bytes: AtomicU64::new(0),
        }
    }
}
