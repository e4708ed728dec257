//! The property verbs: `oxpool get` and `oxpool set`, on pools, volumes and devices.

use super::{split_assignment, split_target};
use crate::console::Console;
use crate::host::Host;
use anyhow::{bail, Result};
use oxpool_engine::props::{
    DEVICE_PROP_NAMES, POOL_PROP_NAMES, VOLUME_PROP_NAMES, VOLUME_STAT_NAMES,
};

/// `oxpool get PROP|all TARGET [DEVICE]`.
pub fn get(
    host: &Host,
    con: &mut dyn Console,
    prop: &str,
    target: &str,
    device: Option<&str>,
) -> Result<()> {
    let (pool, vol) = split_target(target);
    if device.is_some() && vol.is_some() {
        bail!("a device belongs to a pool, not to a volume");
    }
    // Read first, printed after: a failure prints nothing (no header without lines).
    let lines = host.with_pool(pool, |p| {
        let mut lines = Vec::new();
        let names = |all: &[&'static str]| -> Vec<String> {
            if prop == "all" {
                all.iter().map(|s| s.to_string()).collect()
            } else {
                vec![prop.to_string()]
            }
        };
        if let Some(d) = device {
            lines.push(format!(
                "{:<32} {:<14} {:<10} SOURCE",
                "NAME", "PROPERTY", "VALUE"
            ));
            for n in names(DEVICE_PROP_NAMES) {
                let (value, source) = p.get_device_prop(d, &n)?;
                lines.push(format!("{:<32} {:<14} {:<10} {source}", d, n, value));
            }
            return Ok(lines);
        }
        lines.push(format!("{:<32} {:<14} VALUE", "NAME", "PROPERTY"));
        match vol {
            Some(v) if v.contains('@') => {
                for n in names(oxpool_engine::SNAPSHOT_PROP_NAMES) {
                    let value = p.get_dataset_prop(v, &n)?.unwrap_or_default();
                    lines.push(format!("{:<32} {:<14} {}", target, n, value));
                }
            }
            Some(v) if prop == "receive_resume_token" => {
                // A full stream's partial receive has no volume yet.
                let value = p.get_dataset_prop(v, prop)?.unwrap_or_default();
                lines.push(format!("{:<32} {:<14} {}", target, prop, value));
            }
            Some(v) => {
                let vol = p.volume(v)?;
                let all: Vec<&'static str> = VOLUME_PROP_NAMES
                    .iter()
                    .chain(VOLUME_STAT_NAMES)
                    .copied()
                    .collect();
                let mut all = all;
                all.extend(
                    oxpool_engine::DATASET_STAT_NAMES
                        .iter()
                        .filter(|n| !all.contains(n))
                        .copied()
                        .collect::<Vec<_>>(),
                );
                for n in names(&all) {
                    let value = match p.get_dataset_prop(v, &n)? {
                        Some(value) => value,
                        None => vol.get_prop(&n)?,
                    };
                    lines.push(format!("{:<32} {:<14} {}", target, n, value));
                }
            }
            None => {
                let all: Vec<&'static str> =
                    POOL_PROP_NAMES.iter().copied().chain(["freeing"]).collect();
                for n in names(&all) {
                    lines.push(format!("{:<32} {:<14} {}", target, n, p.get_prop(&n)?));
                }
            }
        }
        Ok(lines)
    })?;
    for line in lines {
        writeln!(con.out(), "{line}")?;
    }
    Ok(())
}

/// `oxpool set PROP=VALUE TARGET [DEVICE]`: takes effect for the next request of a served
/// pool (e.g. `sync=always`: the next write is durable before it is answered).
pub fn set(host: &Host, assignment: &str, target: &str, device: Option<&str>) -> Result<()> {
    let (k, v) = split_assignment(assignment)?;
    let (pool, vol) = split_target(target);
    host.change_pool(pool, |p| {
        match (vol, device) {
            (Some(_), Some(_)) => bail!("a device belongs to a pool, not to a volume"),
            (Some(v2), None) => p.set_volume_prop(v2, k, v)?,
            (None, Some(d)) => p.set_device_prop(d, k, v)?,
            (None, None) => p.set_prop(k, v)?,
        }
        Ok(())
    })
}
