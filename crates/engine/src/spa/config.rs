//! The vdev configuration: checking and preparing new top-level vdevs, and names.

use crate::spa::TopSpec;
use crate::vdev::label::read_label;
use crate::vdev::{Leaf, TopVdev};
use crate::{EngineError, Result};
use oxpool_format::{
    data_end_bytes, Guid, LeafConfig, TopVdevConfig, TopVdevKind, VdevId, DATA_START_BYTES,
    SECTOR_BYTES,
};
use oxpool_io::rt::block_on;
use std::sync::Arc;

/// The leaves of a new top-level vdev, with their guids.
pub(crate) type NewLeaves = Vec<(Arc<Leaf>, Guid)>;

/// Checks the devices of one new top-level vdev (layout, size, not another pool's unless
/// `force`) and gives them identities.
pub(crate) fn prepare_top(
    id: VdevId,
    spec: TopSpec,
    force: bool,
) -> Result<(TopVdev, TopVdevConfig, NewLeaves)> {
    match (&spec.kind, spec.devices.len()) {
        (_, 0) => return Err(EngineError::invalid("a vdev needs a device")),
        (TopVdevKind::Single, 1) => {}
        (TopVdevKind::Mirror, n) if n >= 2 => {}
        (TopVdevKind::Single, _) => {
            return Err(EngineError::invalid("a single vdev has exactly one device"))
        }
        (TopVdevKind::Mirror, _) => {
            return Err(EngineError::invalid("a mirror needs at least two devices"))
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
    let cfg = TopVdevConfig {
        id,
        kind: spec.kind.clone(),
        children: child_cfg,
        asize_bytes: asize,
        log: spec.log,
    };
    Ok((TopVdev::new(&cfg, children), cfg, leaves))
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
