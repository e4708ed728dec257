//! The vdev configuration: checking and preparing new top-level vdevs, and names.

use crate::spa::TopSpec;
use crate::vdev::label::read_label;
use crate::vdev::raidz::RaidzLayout;
use crate::vdev::{raidz_width_min, Leaf, TopVdev};
use crate::{EngineError, Result};
use oxpool_format::{
    data_end_bytes, Guid, LeafConfig, RaidzConfig, RaidzEpoch, TopVdevConfig, TopVdevKind, Txg,
    VdevId, DATA_START_BYTES, RAIDZ_CHILDREN_MAX, SECTOR_BYTES,
};
use oxpool_io::rt::block_on;
use std::sync::Arc;

/// The leaves of a new top-level vdev, with their guids.
pub(crate) type NewLeaves = Vec<(Arc<Leaf>, Guid)>;

/// Checks the devices of one new top-level vdev (layout, size, not another pool's unless
/// `force`) and gives them identities. A raidz vdev's record starts with one epoch from
/// `first_txg`, the first txg that may write to it.
pub(crate) fn prepare_top(
    id: VdevId,
    mut spec: TopSpec,
    force: bool,
    first_txg: Txg,
) -> Result<(TopVdev, TopVdevConfig, NewLeaves)> {
    let n = spec.devices.len();
    match (&mut spec.kind, n) {
        (_, 0) => return Err(EngineError::invalid("a vdev needs a device")),
        (TopVdevKind::Hole, _) => return Err(EngineError::invalid("a hole is not a vdev to add")),
        (TopVdevKind::Single, 1) => {}
        (TopVdevKind::Mirror, n) if n >= 2 => {}
        (TopVdevKind::Single, _) => {
            return Err(EngineError::invalid("a single vdev has exactly one device"))
        }
        (TopVdevKind::Mirror, _) => {
            return Err(EngineError::invalid("a mirror needs at least two devices"))
        }
        (TopVdevKind::Raidz(r), n) => {
            let parity = usize::from(r.parity);
            if !(1..=3).contains(&parity) {
                return Err(EngineError::invalid(format!(
                    "raidz{parity}: raidz has 1 to 3 parity devices"
                )));
            }
            let min = raidz_width_min(parity);
            if n < min {
                return Err(EngineError::invalid(format!(
                    "raidz{parity} needs at least {min} devices, got {n}"
                )));
            }
            if n > RAIDZ_CHILDREN_MAX {
                return Err(EngineError::invalid(format!(
                    "raidz{parity} has at most {RAIDZ_CHILDREN_MAX} devices, got {n}"
                )));
            }
            *r = RaidzConfig {
                parity: r.parity,
                sector_shift: SECTOR_BYTES.trailing_zeros() as u8,
                epochs: vec![RaidzEpoch {
                    first_txg,
                    width: n as u16,
                }],
            };
        }
    }
    let mut asize = u64::MAX;
    let mut children = Vec::new();
    let mut child_cfg = Vec::new();
    let mut leaves = Vec::new();
    for dev in spec.devices {
        let size = dev.size_bytes();
        if size < oxpool_format::MIN_DEVICE_BYTES {
            return Err(EngineError::invalid(format!(
                "{}: {size} bytes is smaller than the minimum {} bytes",
                dev.name(),
                oxpool_format::MIN_DEVICE_BYTES
            )));
        }
        if !force {
            if let Ok(cfg) = block_on(read_label(dev.as_ref())) {
                return Err(EngineError::invalid(format!(
                    "{} belongs to pool '{}' (guid {:x}); use -f to overwrite it",
                    dev.name(),
                    cfg.pool_name,
                    cfg.pool_guid.0
                )));
            }
        }
        asize = asize.min((data_end_bytes(size) - DATA_START_BYTES) / SECTOR_BYTES * SECTOR_BYTES);
        let guid = super::random_guid();
        child_cfg.push(LeafConfig {
            guid,
            path: dev.name().to_string(),
            size_bytes: size,
        });
        let leaf = Arc::new(Leaf::new(guid, dev));
        leaves.push((leaf.clone(), guid));
        children.push(Some(leaf));
    }
    if let TopVdevKind::Raidz(r) = &spec.kind {
        if spec.log {
            return Err(EngineError::invalid(
                "a log device is a single device or a mirror, not raidz",
            ));
        }
        // Sector b of the vdev is sector b / width of child b % width.
        let layout = RaidzLayout::new(n, usize::from(r.parity))
            .map_err(|e| EngineError::invalid(e.to_string()))?;
        asize = layout.vdev_bytes(asize);
    }
    let cfg = TopVdevConfig {
        id,
        kind: spec.kind.clone(),
        children: child_cfg,
        asize_bytes: asize,
        log: spec.log,
        pairs: Vec::new(),
    };
    Ok((TopVdev::new(&cfg, children)?, cfg, leaves))
}

/// Checks a pool or volume name: 1 to 64 characters of [A-Za-z0-9_.-], not starting with `-`.
pub fn check_name(kind: &str, name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && !name.starts_with('-')
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c));
    if ok {
        Ok(())
    } else {
        Err(EngineError::invalid(format!(
            "invalid {kind} name '{name}': use 1-64 of A-Z a-z 0-9 _ . -"
        )))
    }
}

/// The words a device list uses for its vdev kinds: a pool named so would read as one
/// (`oxpool create mirror a b` is a pool named `mirror`, or a mirror with no name).
const POOL_NAME_RESERVED_PREFIXES: &[&str] = &["mirror", "raidz", "draid", "spare"];
const POOL_NAME_RESERVED: &[&str] = &["log", "cache", "special", "dedup"];

/// A new pool's name, beyond [`check_name`]: as `zpool create`, it starts with a letter
/// and is not a vdev kind's word. Checked at create only: a pool made before keeps its name.
pub fn check_new_pool_name(name: &str) -> Result<()> {
    let refuse = |why: &str| {
        Err(EngineError::invalid(format!(
            "invalid pool name '{name}': {why}"
        )))
    };
    if !name.starts_with(|c: char| c.is_ascii_alphabetic()) {
        return refuse("it must start with a letter");
    }
    let lower = name.to_ascii_lowercase();
    if POOL_NAME_RESERVED.contains(&lower.as_str())
        || POOL_NAME_RESERVED_PREFIXES
            .iter()
            .any(|p| lower.starts_with(p))
    {
        return refuse("names that are, or start with, a vdev kind's word (mirror, raidz, draid, spare, log, cache, special, dedup) are reserved");
    }
    Ok(())
}
