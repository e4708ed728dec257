//! The config half of a label, and the vdev tree it carries.

use crate::bytes::{all_zero, check_reserved, get_u32, get_u64, need, put_bytes, put_u32, put_u64};
use crate::checksum::{put_self_checksum, verify_self_checksum};
use crate::{
    Dva, FormatError, FormatVersion, Guid, Txg, VdevId, FORMAT_VERSION, LABEL_CONFIG_BYTES,
};
use serde::{Deserialize, Serialize};

/// Magic of a label config: the ASCII bytes `oxpLABEL` at offset 0.
pub const LABEL_CONFIG_MAGIC: u64 = u64::from_le_bytes(*b"oxpLABEL");
/// Size of the fixed header before the postcard payload of a label config.
pub const LABEL_CONFIG_HEADER_BYTES: usize = 64;
/// Largest postcard payload of a label config: the rest of the config half.
pub const LABEL_CONFIG_PAYLOAD_BYTES_MAX: usize =
    LABEL_CONFIG_BYTES as usize - LABEL_CONFIG_HEADER_BYTES;

const CONFIG_BYTES: usize = LABEL_CONFIG_BYTES as usize;
const OFF_MAGIC: usize = 0;
const OFF_VERSION: usize = 8;
const OFF_PAYLOAD_LEN: usize = 12;
const OFF_CHECKSUM: usize = 16;
const OFF_RESERVED: usize = 32;

/// How a top-level vdev stores its blocks on its children.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum TopVdevKind {
    /// One leaf; no redundancy.
    Single,
    /// Every block on every child.
    Mirror,
    /// RAID-Z: each block split into data columns plus 1 to 3 parity columns, one column per
    /// child (`docs/format.md`, "RAID-Z layout"). Added after `Mirror` so that configurations
    /// written before it decode unchanged.
    Raidz(RaidzConfig),
    /// The place of a removed top-level vdev (a log device, `oxpool remove`): no children,
    /// no size, nothing on it. It keeps the index, so the vdev ids in block pointers and
    /// space maps of the vdevs after it never change (ZFS's hole vdev). Since format
    /// version 7.
    Hole,
}

impl TopVdevKind {
    /// The raidz configuration, if this is a raidz vdev.
    pub fn raidz(&self) -> Option<&RaidzConfig> {
        match self {
            TopVdevKind::Raidz(r) => Some(r),
            _ => None,
        }
    }
}

/// Most parity columns of a raidz vdev (raidz3).
pub const RAIDZ_PARITY_MAX: u8 = 3;
/// Most children of a raidz vdev.
pub const RAIDZ_CHILDREN_MAX: usize = 64;

/// The geometry of a raidz top-level vdev over time.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RaidzConfig {
    /// Parity columns of every block: 1, 2 or 3.
    pub parity: u8,
    /// log2 of the sector, the unit of columns and of allocation (12: 4 KiB).
    pub sector_shift: u8,
    /// The widths the vdev has had, oldest first: a block born in txg `t` was written with
    /// the width of the last epoch whose `first_txg <= t`. One epoch today (the vdev's
    /// creation); a future expansion appends a wider one. The last width is the number of
    /// children.
    pub epochs: Vec<RaidzEpoch>,
}

/// One width of a raidz vdev and the first txg whose blocks were written with it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RaidzEpoch {
    /// Blocks born in this txg or later (until the next epoch) have `width` columns at most.
    pub first_txg: Txg,
    /// Children the layout spans.
    pub width: u16,
}

impl RaidzConfig {
    /// Checks the record against a vdev of `children` children: parity 1..=3, a sector of
    /// 512 B to 64 KiB, at least one epoch, txgs and widths strictly increasing, each width
    /// at least `parity + 1` and at most [`RAIDZ_CHILDREN_MAX`], the last one `children`.
    pub fn validate(&self, children: usize) -> Result<(), FormatError> {
        let bad = |field: &'static str, value: u64| Err(FormatError::BadField { field, value });
        if !(1..=RAIDZ_PARITY_MAX).contains(&self.parity) {
            return bad("raidz.parity", u64::from(self.parity));
        }
        if !(9..=16).contains(&self.sector_shift) {
            return bad("raidz.sector_shift", u64::from(self.sector_shift));
        }
        let Some(last) = self.epochs.last() else {
            return bad("raidz.epochs", 0);
        };
        for e in &self.epochs {
            let w = usize::from(e.width);
            if w < usize::from(self.parity) + 1 || w > RAIDZ_CHILDREN_MAX {
                return bad("raidz.width", u64::from(e.width));
            }
        }
        for pair in self.epochs.windows(2) {
            if pair[1].first_txg <= pair[0].first_txg || pair[1].width <= pair[0].width {
                return bad("raidz.epochs", pair[1].first_txg.0);
            }
        }
        if usize::from(last.width) != children {
            return bad("raidz.width", u64::from(last.width));
        }
        Ok(())
    }
}

/// A leaf device of the pool.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeafConfig {
    /// The leaf's guid, also stored as `LabelConfig::leaf_guid` in the leaf's own labels.
    pub guid: Guid,
    /// The path the leaf was last opened at (a hint: import finds leaves by guid).
    pub path: String,
    /// Size of the device when it was added.
    pub size_bytes: u64,
}

/// A top-level vdev: the unit that DVAs address.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopVdevConfig {
    /// Its index in `VdevTreeConfig::top`.
    pub id: VdevId,
    /// Layout over the children.
    pub kind: TopVdevKind,
    /// The leaves.
    pub children: Vec<LeafConfig>,
    /// Allocatable bytes: the size of the space that `Dva::offset_bytes` addresses.
    pub asize_bytes: u64,
    /// A separate intent-log device: it holds log blocks only, never pool data.
    pub log: bool,
    /// The children that are a pair (a device being replaced and its replacement, or a
    /// faulted device and the hot spare standing in), by child index, at most one per
    /// child: `children[child]` is the old member, `leaf` the new one. Since format
    /// version 6.
    pub pairs: Vec<PairConfig>,
}

/// Why a child of a top-level vdev has two members.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum PairKind {
    /// `oxpool replace`: the new member takes the old one's place once it is resilvered,
    /// and the old one is detached then.
    Replacing,
    /// A hot spare stands in for a faulted or removed device until that device is replaced
    /// (the spare is then released) or the spare is detached.
    Spare,
}

/// The second member of a child of a top-level vdev (see [`TopVdevConfig::pairs`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PairConfig {
    /// Index of the child in `TopVdevConfig::children`.
    pub child: u32,
    /// Replacing or spare.
    pub kind: PairKind,
    /// The new member (the replacement, or the spare).
    pub leaf: LeafConfig,
}

/// The pool's vdev tree.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct VdevTreeConfig {
    /// Top-level vdevs, indexed by `VdevId`.
    pub top: Vec<TopVdevConfig>,
    /// Hot spares (`oxpool add POOL spare DEV`): devices that step in for a faulted one. A
    /// spare in use is also the new member of a [`PairKind::Spare`] pair. Since format
    /// version 6.
    pub spares: Vec<LeafConfig>,
}

impl VdevTreeConfig {
    /// Every leaf the tree names: the top-level vdevs' children, the second members of their
    /// pairs, and the hot spares (a spare in use appears twice: as a pair's member and a
    /// spare).
    pub fn leaves(&self) -> impl Iterator<Item = &LeafConfig> {
        self.top
            .iter()
            .flat_map(|t| t.children.iter().chain(t.pairs.iter().map(|p| &p.leaf)))
            .chain(&self.spares)
    }

    /// Checks the holes of a tree decoded from a structure of format `version`: none before
    /// version 7, and each with no children, no pairs, no size and not a log device.
    pub fn check_holes(&self, version: FormatVersion) -> Result<(), FormatError> {
        for t in self.top.iter().filter(|t| t.kind == TopVdevKind::Hole) {
            let bad = |field| {
                Err(FormatError::BadField {
                    field,
                    value: u64::from(t.id.0),
                })
            };
            if version < FormatVersion::V7 {
                return bad("hole vdev before format version 7");
            }
            if !t.children.is_empty() || !t.pairs.is_empty() || t.asize_bytes != 0 || t.log {
                return bad("hole vdev with children, pairs, a size or a log flag");
            }
        }
        Ok(())
    }
}

/// `TopVdevConfig` as format versions 1 to 5 wrote it (no pairs).
#[derive(Deserialize)]
pub(crate) struct TopVdevConfigV5 {
    id: VdevId,
    kind: TopVdevKind,
    children: Vec<LeafConfig>,
    asize_bytes: u64,
    log: bool,
}

/// `VdevTreeConfig` as format versions 1 to 5 wrote it (no spares).
#[derive(Deserialize)]
pub(crate) struct VdevTreeConfigV5 {
    top: Vec<TopVdevConfigV5>,
}

impl From<VdevTreeConfigV5> for VdevTreeConfig {
    fn from(t: VdevTreeConfigV5) -> VdevTreeConfig {
        VdevTreeConfig {
            top: t
                .top
                .into_iter()
                .map(|t| TopVdevConfig {
                    id: t.id,
                    kind: t.kind,
                    children: t.children,
                    asize_bytes: t.asize_bytes,
                    log: t.log,
                    pairs: Vec::new(),
                })
                .collect(),
            spares: Vec::new(),
        }
    }
}

/// `LabelConfig` as format versions 1 to 5 wrote it (its tree without pairs and spares).
#[derive(Deserialize)]
struct LabelConfigV5 {
    pool_guid: Guid,
    pool_name: String,
    leaf_guid: Guid,
    top: VdevId,
    create_txg: Txg,
    tree: VdevTreeConfigV5,
}

impl VdevTreeConfig {
    /// The top-level vdev with id `id`, if the tree has it.
    pub fn top_vdev(&self, id: VdevId) -> Option<&TopVdevConfig> {
        // Ids are indices; the search is the fallback for a tree that breaks that rule.
        match self.top.get(id.0 as usize) {
            Some(top) if top.id == id => Some(top),
            _ => self.top.iter().find(|top| top.id == id),
        }
    }

    /// Checks a DVA against the tree: valid on its own, on an existing top-level vdev, and
    /// inside its allocatable space. Use on every DVA read from disk before issuing I/O.
    pub fn check_dva(&self, dva: &Dva) -> Result<(), FormatError> {
        dva.validate()?;
        let top = self.top_vdev(dva.vdev).ok_or(FormatError::BadField {
            field: "dva.vdev",
            value: u64::from(dva.vdev.0),
        })?;
        if dva.end_bytes() > top.asize_bytes {
            return Err(FormatError::BadField {
                field: "dva.offset_bytes",
                value: dva.offset_bytes,
            });
        }
        Ok(())
    }

    /// Checks the tree's shape: `top[i].id == VdevId(i)`, a `Single` vdev has exactly one
    /// child, a `Mirror` at least one, a `Raidz` a valid record ([`RaidzConfig::validate`]), a `Hole`
    /// none (and no pairs, no size, no log flag). Decoders do not call this (a decoded tree is
    /// returned as written); the engine does, when it builds or imports a pool.
    pub fn validate(&self) -> Result<(), FormatError> {
        for (index, top) in self.top.iter().enumerate() {
            if top.id.0 as usize != index {
                return Err(FormatError::BadField {
                    field: "top.id",
                    value: u64::from(top.id.0),
                });
            }
            let children_ok = match &top.kind {
                TopVdevKind::Single => top.children.len() == 1,
                TopVdevKind::Mirror => !top.children.is_empty(),
                TopVdevKind::Raidz(r) => {
                    r.validate(top.children.len())?;
                    true
                }
                TopVdevKind::Hole => {
                    top.children.is_empty()
                        && top.pairs.is_empty()
                        && top.asize_bytes == 0
                        && !top.log
                }
            };
            if !children_ok {
                return Err(FormatError::BadField {
                    field: "top.children",
                    value: top.children.len() as u64,
                });
            }
            for (i, pair) in top.pairs.iter().enumerate() {
                let child = pair.child as usize;
                if child >= top.children.len()
                    || top.pairs[..i].iter().any(|p| p.child == pair.child)
                {
                    return Err(FormatError::BadField {
                        field: "top.pairs.child",
                        value: u64::from(pair.child),
                    });
                }
            }
        }
        Ok(())
    }
}

/// The `top` of a hot spare's label: it belongs to the pool, not to a top-level vdev.
pub const SPARE_TOP: VdevId = VdevId(u32::MAX);

/// The first half of a label: which pool and which leaf this device is, and the vdev tree, so import can assemble the pool from devices alone.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LabelConfig {
    /// The pool this device belongs to.
    pub pool_guid: Guid,
    /// The pool's name (a hint: the pool is identified by its guid).
    pub pool_name: String,
    /// This device's guid.
    pub leaf_guid: Guid,
    /// The top-level vdev this device is a child of ([`SPARE_TOP`] for a hot spare not in
    /// use).
    pub top: VdevId,
    /// The txg the label was written for: the first not yet durable when it was written (1
    /// at the pool's creation; each rewrite of the labels for a new tree takes the txg then),
    /// so that of two labels the later one names the newer tree. (Named for its first use.)
    pub create_txg: Txg,
    /// The vdev tree when the label was written.
    pub tree: VdevTreeConfig,
}

impl LabelConfig {
    /// Encodes into exactly `LABEL_CONFIG_BYTES` bytes: a 64-byte header (magic, version,
    /// payload length, self-checksum over the whole 128 KiB) and the postcard payload, zero
    /// padded.
    ///
    /// # Panics
    /// If the payload exceeds `LABEL_CONFIG_PAYLOAD_BYTES_MAX` (~128 KiB). Callers keep names
    /// and paths short (a tree of 100 leaves with 200-byte paths is ~25 KiB), so this is a bug.
    pub fn encode(&self) -> Vec<u8> {
        let payload =
            postcard::to_allocvec(self).expect("postcard serializes a LabelConfig into a Vec");
        assert!(
            payload.len() <= LABEL_CONFIG_PAYLOAD_BYTES_MAX,
            "label config payload of {} bytes exceeds {LABEL_CONFIG_PAYLOAD_BYTES_MAX}",
            payload.len()
        );
        let mut out = vec![0u8; CONFIG_BYTES];
        put_u64(&mut out, OFF_MAGIC, LABEL_CONFIG_MAGIC);
        put_u32(&mut out, OFF_VERSION, FORMAT_VERSION);
        put_u32(&mut out, OFF_PAYLOAD_LEN, payload.len() as u32);
        put_bytes(&mut out, LABEL_CONFIG_HEADER_BYTES, &payload);
        put_self_checksum(&mut out, OFF_CHECKSUM);
        out
    }

    /// Decodes the first `LABEL_CONFIG_BYTES` bytes of `bytes` (trailing bytes are ignored).
    /// All-zero -> `Empty`; wrong magic -> `BadMagic`; version != FORMAT_VERSION ->
    /// `UnsupportedVersion`; a version before 6 is read with that version's layout (no pairs,
    /// no spares); checksum mismatch -> `BadChecksum`; a payload that is not
    /// exactly one postcard `LabelConfig` -> `Payload`.
    pub fn decode(bytes: &[u8]) -> Result<LabelConfig, FormatError> {
        need(bytes, CONFIG_BYTES)?;
        let bytes = &bytes[..CONFIG_BYTES];
        if all_zero(bytes) {
            return Err(FormatError::Empty);
        }
        let magic = get_u64(bytes, OFF_MAGIC)?;
        if magic != LABEL_CONFIG_MAGIC {
            return Err(FormatError::BadMagic {
                expected: LABEL_CONFIG_MAGIC,
                found: magic,
            });
        }
        let version = FormatVersion::try_from(get_u32(bytes, OFF_VERSION)?)?;
        verify_self_checksum(bytes, OFF_CHECKSUM)?;
        check_reserved(
            bytes,
            OFF_RESERVED,
            LABEL_CONFIG_HEADER_BYTES,
            "reserved (32..64)",
        )?;
        let payload_bytes = get_u32(bytes, OFF_PAYLOAD_LEN)? as usize;
        if payload_bytes > LABEL_CONFIG_PAYLOAD_BYTES_MAX {
            return Err(FormatError::BadField {
                field: "payload_bytes",
                value: payload_bytes as u64,
            });
        }
        let payload = &bytes[LABEL_CONFIG_HEADER_BYTES..LABEL_CONFIG_HEADER_BYTES + payload_bytes];
        check_reserved(
            bytes,
            LABEL_CONFIG_HEADER_BYTES + payload_bytes,
            CONFIG_BYTES,
            "padding",
        )?;
        if version >= FormatVersion::V6 {
            let label: LabelConfig = crate::meta::postcard_exact(payload)?;
            label.tree.check_holes(version)?;
            return Ok(label);
        }
        let old: LabelConfigV5 = crate::meta::postcard_exact(payload)?;
        Ok(LabelConfig {
            pool_guid: old.pool_guid,
            pool_name: old.pool_name,
            leaf_guid: old.leaf_guid,
            top: old.top,
            create_txg: old.create_txg,
            tree: old.tree.into(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raidz(parity: u8, widths: &[(u64, u16)]) -> TopVdevKind {
        TopVdevKind::Raidz(RaidzConfig {
            parity,
            sector_shift: 12,
            epochs: widths
                .iter()
                .map(|&(t, width)| RaidzEpoch {
                    first_txg: Txg(t),
                    width,
                })
                .collect(),
        })
    }

    /// The raidz variant came after the others: their encodings (postcard's variant index)
    /// are unchanged, so configurations written before it decode as they were.
    #[test]
    fn older_kinds_keep_their_encoding() {
        assert_eq!(postcard::to_allocvec(&TopVdevKind::Single).unwrap(), [0]);
        assert_eq!(postcard::to_allocvec(&TopVdevKind::Mirror).unwrap(), [1]);
        let r = postcard::to_allocvec(&raidz(2, &[(1, 6)])).unwrap();
        // Variant 2, parity 2, shift 12, one epoch: txg 1, width 6.
        assert_eq!(r, [2, 2, 12, 1, 1, 6]);
        let back: TopVdevKind = postcard::from_bytes(&r).unwrap();
        assert_eq!(back, raidz(2, &[(1, 6)]));
        assert_eq!(postcard::to_allocvec(&TopVdevKind::Hole).unwrap(), [3]);
    }

    /// A hole decodes from version 7 on, only empty; a version 6 label with one is refused.
    #[test]
    fn holes_are_checked() {
        let hole = TopVdevConfig {
            id: VdevId(1),
            kind: TopVdevKind::Hole,
            children: vec![],
            asize_bytes: 0,
            log: false,
            pairs: vec![],
        };
        let tree = |t: TopVdevConfig| VdevTreeConfig {
            top: vec![t],
            spares: vec![],
        };
        assert!(tree(hole.clone()).check_holes(FormatVersion::V7).is_ok());
        assert!(tree(hole.clone()).check_holes(FormatVersion::V6).is_err());
        let sized = TopVdevConfig {
            asize_bytes: 4096,
            ..hole.clone()
        };
        assert!(tree(sized).check_holes(FormatVersion::V7).is_err());
        let log = TopVdevConfig { log: true, ..hole };
        assert!(tree(log).check_holes(FormatVersion::V7).is_err());
    }

    #[test]
    fn raidz_records_are_checked() {
        let ok = |k: &TopVdevKind, n: usize| k.raidz().unwrap().validate(n).is_ok();
        assert!(ok(&raidz(1, &[(1, 3)]), 3));
        assert!(ok(&raidz(3, &[(1, 4), (9, 5)]), 5));
        assert!(!ok(&raidz(0, &[(1, 3)]), 3), "parity 0");
        assert!(!ok(&raidz(4, &[(1, 6)]), 6), "parity 4");
        assert!(!ok(&raidz(2, &[(1, 2)]), 2), "narrower than parity + 1");
        assert!(
            !ok(&raidz(1, &[(1, 3)]), 4),
            "last width is not the children"
        );
        assert!(!ok(&raidz(1, &[]), 3), "no epoch");
        assert!(!ok(&raidz(1, &[(5, 3), (5, 4)]), 4), "txgs not increasing");
        assert!(
            !ok(&raidz(1, &[(5, 4), (6, 4)]), 4),
            "widths not increasing"
        );
        assert!(!ok(&raidz(1, &[(1, 65)]), 65), "too wide");
    }

    /// A label written by version 5 (its tree without pairs and spares) decodes, with none;
    /// a version 6 label with a pair and a spare round-trips; garbage never panics.
    #[test]
    fn version_5_labels_decode_and_version_6_round_trips() {
        #[derive(Serialize)]
        struct TopV5 {
            id: VdevId,
            kind: TopVdevKind,
            children: Vec<LeafConfig>,
            asize_bytes: u64,
            log: bool,
        }
        #[derive(Serialize)]
        struct LabelV5 {
            pool_guid: Guid,
            pool_name: String,
            leaf_guid: Guid,
            top: VdevId,
            create_txg: Txg,
            tree: Vec<TopV5>,
        }
        let leaf = |g: u64| LeafConfig {
            guid: Guid(g),
            path: format!("/d/{g}"),
            size_bytes: 1 << 30,
        };
        let v5 = LabelV5 {
            pool_guid: Guid(7),
            pool_name: "tank".into(),
            leaf_guid: Guid(1),
            top: VdevId(0),
            create_txg: Txg(1),
            tree: vec![TopV5 {
                id: VdevId(0),
                kind: TopVdevKind::Mirror,
                children: vec![leaf(1), leaf(2)],
                asize_bytes: 1 << 29,
                log: false,
            }],
        };
        let payload = postcard::to_allocvec(&v5).unwrap();
        let mut bytes = vec![0u8; CONFIG_BYTES];
        put_u64(&mut bytes, OFF_MAGIC, LABEL_CONFIG_MAGIC);
        put_u32(&mut bytes, OFF_VERSION, 5);
        put_u32(&mut bytes, OFF_PAYLOAD_LEN, payload.len() as u32);
        put_bytes(&mut bytes, LABEL_CONFIG_HEADER_BYTES, &payload);
        put_self_checksum(&mut bytes, OFF_CHECKSUM);
        let back = LabelConfig::decode(&bytes).unwrap();
        assert_eq!(back.tree.top[0].children, vec![leaf(1), leaf(2)]);
        assert!(back.tree.top[0].pairs.is_empty() && back.tree.spares.is_empty());

        let mut v6 = back.clone();
        v6.tree.top[0].pairs.push(PairConfig {
            child: 1,
            kind: PairKind::Spare,
            leaf: leaf(3),
        });
        v6.tree.spares.push(leaf(3));
        assert!(v6.tree.validate().is_ok());
        assert_eq!(LabelConfig::decode(&v6.encode()).unwrap(), v6);
        // The same version 6 payload labelled version 5 does not decode (trailing bytes).
        let mut relabelled = v6.encode();
        put_u32(&mut relabelled, OFF_VERSION, 5);
        put_self_checksum(&mut relabelled, OFF_CHECKSUM);
        assert!(LabelConfig::decode(&relabelled).is_err());
        // A pair naming a child out of range, or two pairs on one child, are refused.
        let mut bad = v6.tree.clone();
        bad.top[0].pairs[0].child = 2;
        assert!(bad.validate().is_err());
        let mut bad = v6.tree.clone();
        let twice = bad.top[0].pairs[0].clone();
        bad.top[0].pairs.push(twice);
        assert!(bad.validate().is_err());
    }
}
