//! `oxpool share` and `oxpool unshare`: offer a volume or snapshot of a served pool over NBD,
//! or stop offering it, without touching its data. As `zfs share`/`zfs mount` bring back a
//! dataset `zfs recv -u` left unmounted; `unshare` is the other way. Not kept across a server
//! restart, as `recv -u` is not: a server offers every volume when it starts.

use super::volume_target;
use crate::host::Host;
use crate::served::Unexport;
use anyhow::{bail, Result};

/// `oxpool share POOL/VOL[@SNAP]`.
pub fn share(host: &Host, name: &str) -> Result<()> {
    let Host::Live(served) = host else {
        bail!("cannot share {name}: its pool is not served (oxpool serve offers every volume)");
    };
    let (pool, v) = volume_target(name)?;
    host.change_pool(pool, |p| {
        let volume = match v.split_once('@') {
            Some((head, snap)) => p.snapshot_volume(head, snap)?,
            None => p.volume(v)?,
        };
        if served.is_exported(name) {
            bail!("cannot share {name}: it is shared already");
        }
        served.export_volume(volume)
    })
}

/// `oxpool unshare [-f] POOL/VOL[@SNAP]`: refused while a client has it open, unless `force`
/// (its clients are disconnected after their requests in flight are answered).
pub fn unshare(host: &Host, name: &str, force: bool) -> Result<()> {
    let Host::Live(served) = host else {
        bail!("cannot unshare {name}: its pool is not served");
    };
    let (pool, v) = volume_target(name)?;
    host.change_pool(pool, |p| {
        // Named as it exists, so a typo says "not found", not "not shared".
        match v.split_once('@') {
            Some((head, snap)) => drop(p.snapshot_volume(head, snap)?),
            None => drop(p.volume(v)?),
        }
        if !served.unexport_volume(name, force, Unexport::Unshare)? {
            bail!("cannot unshare {name}: it is not shared");
        }
        Ok(())
    })
}
