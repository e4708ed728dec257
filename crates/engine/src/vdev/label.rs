//! Labels and uberblocks on a leaf device.
//!
//! Each device carries four labels (two at its start, two at its end). A label's first half
//! is the configuration (which pool, which leaf, the vdev tree), written when the pool is
//! created; its second half is a ring of uberblocks, one slot per txg (`txg % slots`), so the
//! uberblock of txg N never overwrites that of txg N-1: a torn uberblock write loses only the
//! new txg, and import falls back to the previous one.

use crate::{EngineError, Result};
use oxpool_format::{
    label_offsets, uberblock_slot_offset, FormatError, Guid, LabelConfig, Uberblock, LABEL_BYTES,
    LABEL_CONFIG_BYTES, LABEL_COUNT, MIN_DEVICE_BYTES, UBERBLOCK_SLOTS, UBERBLOCK_SLOT_BYTES,
};
use oxpool_io::rt::join_all;
use oxpool_io::{Backend, IoBuf};

/// Writes the configuration half of all four labels and clears their uberblock rings, and
/// flushes them: the caller then records the device in a txg (create, add, attach,
/// replace), and a txg durable with the device's labels lost in a power cut names a device
/// no import can find (a crash test found it: the txg's flush of the new device may come
/// after the power cut, its uberblock already durable on another device).
pub async fn write_labels(dev: &dyn Backend, cfg: &LabelConfig) -> Result<()> {
    let encoded = IoBuf::from_slice(&cfg.encode());
    debug_assert_eq!(encoded.len() as u64, LABEL_CONFIG_BYTES);
    let zeros = IoBuf::zeroed((LABEL_BYTES - LABEL_CONFIG_BYTES) as usize);
    let mut futs = Vec::new();
    for off in label_offsets(dev.size_bytes()) {
        futs.push(dev.write(off, encoded.clone()));
        futs.push(dev.write(off + LABEL_CONFIG_BYTES, zeros.clone()));
    }
    for r in join_all(futs).await {
        r.map_err(|e| EngineError::io(dev.name(), e))?;
    }
    dev.flush()
        .await
        .map_err(|e| EngineError::io(dev.name(), e))
}

/// Rewrites only the configuration half of the labels (the vdev tree changed), the even
/// labels first and flushed, then the odd ones: a crash leaves at least two readable labels,
/// and the uberblock rings are never touched.
pub async fn update_label_config(dev: &dyn Backend, cfg: &LabelConfig) -> Result<()> {
    let encoded = IoBuf::from_slice(&cfg.encode());
    let offs = label_offsets(dev.size_bytes());
    for half in [[offs[0], offs[2]], [offs[1], offs[3]]] {
        write_then_flush(dev, &encoded, &half).await?;
    }
    Ok(())
}

/// Writes `buf` at every offset of `offs` at once, then flushes the device: durable
/// together when this returns.
async fn write_then_flush(dev: &dyn Backend, buf: &IoBuf, offs: &[u64]) -> Result<()> {
    let writes: Vec<_> = offs
        .iter()
        .map(|&off| dev.write(off, buf.clone()))
        .collect();
    for r in join_all(writes).await {
        r.map_err(|e| EngineError::io(dev.name(), e))?;
    }
    dev.flush()
        .await
        .map_err(|e| EngineError::io(dev.name(), e))
}

/// Which of the device's labels need writing, by index: `damaged`, those that do not hold a
/// configuration of leaf `leaf_guid` of pool `pool_guid` (unreadable, damaged, overwritten,
/// another pool's); `misnamed`, those that do but name the pool other than `pool_name` (a
/// rename a crash interrupted). The four are read at once.
pub async fn labels_to_mend(
    dev: &dyn Backend,
    pool_guid: Guid,
    leaf_guid: Guid,
    pool_name: &str,
) -> LabelsToMend {
    let reads: Vec<_> = label_offsets(dev.size_bytes())
        .into_iter()
        .map(|off| dev.read(off, IoBuf::zeroed(LABEL_CONFIG_BYTES as usize)))
        .collect();
    let mut out = LabelsToMend::default();
    for (i, read) in join_all(reads).await.into_iter().enumerate() {
        let cfg = read
            .ok()
            .and_then(|buf| LabelConfig::decode(&buf).ok())
            .filter(|c| c.pool_guid == pool_guid && c.leaf_guid == leaf_guid);
        match cfg {
            None => out.damaged.push(i),
            Some(c) if c.pool_name != pool_name => out.misnamed.push(i),
            Some(_) => {}
        }
    }
    out
}

/// What [`labels_to_mend`] found, by label index.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LabelsToMend {
    /// Labels that do not find the device for this pool.
    pub damaged: Vec<usize>,
    /// Labels of this pool and device that carry another name.
    pub misnamed: Vec<usize>,
}

impl LabelsToMend {
    /// Nothing to write.
    pub fn is_empty(&self) -> bool {
        self.damaged.is_empty() && self.misnamed.is_empty()
    }

    /// Every label to write.
    pub fn all(&self) -> Vec<usize> {
        let mut all = [self.damaged.as_slice(), self.misnamed.as_slice()].concat();
        all.sort_unstable();
        all
    }
}

/// Writes `cfg` into the labels `to` names, in an order that keeps the device findable at
/// every instant: the damaged ones first, all at once (they find nothing now), then the
/// misnamed even ones, then the misnamed odd ones, each group flushed before the next. A
/// misnamed label still finds the device, so a crash while one group is written leaves the
/// other group (or the freshly written damaged ones) readable.
pub async fn mend_labels(dev: &dyn Backend, cfg: &LabelConfig, to: &LabelsToMend) -> Result<()> {
    let even: Vec<usize> = to.misnamed.iter().copied().filter(|i| i % 2 == 0).collect();
    let odd: Vec<usize> = to.misnamed.iter().copied().filter(|i| i % 2 == 1).collect();
    for group in [&to.damaged, &even, &odd] {
        if !group.is_empty() {
            rewrite_labels(dev, cfg, group).await?;
        }
    }
    Ok(())
}

/// Rewrites the configuration half of the labels `which` only, and flushes: the others,
/// good, are not touched, so a crash meanwhile leaves them as they were (rewriting all four,
/// even ones first, could tear the only good ones).
pub async fn rewrite_labels(dev: &dyn Backend, cfg: &LabelConfig, which: &[usize]) -> Result<()> {
    let encoded = IoBuf::from_slice(&cfg.encode());
    let offs = label_offsets(dev.size_bytes());
    let picked: Vec<u64> = which.iter().filter_map(|&i| offs.get(i).copied()).collect();
    write_then_flush(dev, &encoded, &picked).await
}

/// Zeroes all four labels (pool destroy): the device no longer belongs to any pool.
pub async fn clear_labels(dev: &dyn Backend) -> Result<()> {
    let zeros = IoBuf::zeroed(LABEL_BYTES as usize);
    write_then_flush(dev, &zeros, &label_offsets(dev.size_bytes())).await
}

/// Reads the labels' configuration. Returns the first label that verifies; if none does, the
/// error names the device and what was wrong with its first label, or with the first damaged
/// or unreadable one if any is: a label that is all zeros or lacks the magic beside a damaged
/// one does not make the device one that never held a pool ([`holds_no_label`]).
pub async fn read_label(dev: &dyn Backend) -> Result<LabelConfig> {
    read_label_of(dev, false).await
}

/// [`read_label`] of the two labels at the device's start only. For a decision to clear a
/// device's labels (a destroy of a pool that cannot be opened): a tool that reused the device
/// (a filesystem, an LVM header) rewrote its start and left the end labels as they were.
pub async fn read_front_label(dev: &dyn Backend) -> Result<LabelConfig> {
    read_label_of(dev, true).await
}

async fn read_label_of(dev: &dyn Backend, front_only: bool) -> Result<LabelConfig> {
    let size = dev.size_bytes();
    if size < MIN_DEVICE_BYTES {
        return Err(EngineError::Corrupt {
            device: dev.name().to_string(),
            what: format!("device is {size} bytes, smaller than the minimum {MIN_DEVICE_BYTES}"),
            source: FormatError::Truncated {
                needed: MIN_DEVICE_BYTES as usize,
                got: size as usize,
            },
        });
    }
    let mut first_err = None;
    let offsets = label_offsets(size);
    let count = if front_only { 2 } else { offsets.len() };
    for (i, off) in offsets.into_iter().take(count).enumerate() {
        let buf = match dev
            .read(off, IoBuf::zeroed(LABEL_CONFIG_BYTES as usize))
            .await
        {
            Ok(b) => b,
            Err(e) => {
                keep_first_damage(&mut first_err, EngineError::io(dev.name(), e));
                continue;
            }
        };
        match LabelConfig::decode(&buf) {
            Ok(cfg) => return Ok(cfg),
            Err(e) => {
                let err = EngineError::Corrupt {
                    device: dev.name().to_string(),
                    what: format!("label {i} (offset {off})"),
                    source: e,
                };
                keep_first_damage(&mut first_err, err);
            }
        }
    }
    Err(first_err.expect("LABEL_COUNT > 0"))
}

/// Keeps in `kept` the first label error, or the first that says more than "no label here".
fn keep_first_damage(kept: &mut Option<EngineError>, err: EngineError) {
    if kept
        .as_ref()
        .is_none_or(|k| holds_no_label(k) && !holds_no_label(&err))
    {
        *kept = Some(err);
    }
}

/// Whether a device's label error ([`read_label`]) says it never held a pool (too small, all
/// zeros, no magic), not that a label is damaged or unreadable.
pub fn holds_no_label(e: &EngineError) -> bool {
    use oxpool_format::FormatError;
    matches!(
        e,
        EngineError::Corrupt {
            source: FormatError::Truncated { .. }
                | FormatError::BadMagic { .. }
                | FormatError::Empty,
            ..
        }
    )
}

/// Writes `ub` into its slot (`txg % UBERBLOCK_SLOTS`) of all four labels.
pub async fn write_uberblock(dev: &dyn Backend, ub: &Uberblock) -> Result<()> {
    let encoded = IoBuf::from_slice(&ub.encode());
    debug_assert_eq!(encoded.len() as u64, UBERBLOCK_SLOT_BYTES);
    let slot = ub.txg.0 % UBERBLOCK_SLOTS;
    let futs: Vec<_> = label_offsets(dev.size_bytes())
        .into_iter()
        .map(|off| dev.write(uberblock_slot_offset(off, slot), encoded.clone()))
        .collect();
    let mut written = 0;
    let mut last_err = None;
    for r in join_all(futs).await {
        match r {
            Ok(_) => written += 1,
            Err(e) => last_err = Some(EngineError::io(dev.name(), e)),
        }
    }
    // One good copy of the uberblock is enough to find the txg; fail only if none was written.
    match (written, last_err) {
        (0, Some(e)) => Err(e),
        _ => Ok(()),
    }
}

/// Every uberblock that verifies, from every label of the device, newest first.
pub async fn read_uberblocks(dev: &dyn Backend) -> Vec<Uberblock> {
    let ring_bytes = (UBERBLOCK_SLOTS * UBERBLOCK_SLOT_BYTES) as usize;
    let mut out = Vec::new();
    for off in label_offsets(dev.size_bytes())
        .into_iter()
        .take(LABEL_COUNT)
    {
        let ring = match dev
            .read(uberblock_slot_offset(off, 0), IoBuf::zeroed(ring_bytes))
            .await
        {
            Ok(b) => b,
            Err(_) => continue,
        };
        for slot in ring.chunks_exact(UBERBLOCK_SLOT_BYTES as usize) {
            if let Ok(ub) = Uberblock::decode(slot) {
                out.push(ub);
            }
        }
    }
    out.sort_by(|a, b| b.txg.cmp(&a.txg).then(b.timestamp_ns.cmp(&a.timestamp_ns)));
    out.dedup_by(|a, b| a == b);
    out
}
