//! `oxpool share` and `oxpool unshare`: offer a volume or snapshot of a served pool over NBD,
//! or stop offering it, without touching its data. As `zfs share`/`zfs mount` bring back a
//! dataset `zfs recv -u` left unmounted; `unshare` is the other way. Not kept: a server
//! offers every volume when it starts or imports the pool, as `recv -u` is not kept either.
//!
//! Unlike `zfs share`, a snapshot can be named too: here each snapshot is an export of its
//! own. A volume's snapshots keep their own state (sharing a volume does not share them), and
//! `-f` disconnects clients as `destroy -f` does.

use super::volume_target;
use crate::host::Host;
use crate::served::{Served, Unexport};
use anyhow::{bail, Result};
use oxpool_engine::{Pool, Volume};

/// `oxpool share POOL/VOL[@SNAP]`.
pub fn share(host: &Host, name: &str) -> Result<()> {
    on_served(host, name, "share", |served, pool, v| {
        let volume = named(pool, v)?;
        if served.is_exported(name) {
            bail!("cannot share {name}: it is shared already");
        }
        served.export_volume(volume)
    })
}

/// `oxpool unshare [-f] POOL/VOL[@SNAP]`: refused while a client has it open, unless `force`
/// (its clients are disconnected after their requests in flight are answered).
pub fn unshare(host: &Host, name: &str, force: bool) -> Result<()> {
    on_served(host, name, "unshare", |served, pool, v| {
        // Looked up first, so a typo says "not found", not "not shared".
        drop(named(pool, v)?);
        if !served.unexport_volume(name, force, Unexport::Unshare)? {
            bail!("cannot unshare {name}: it is not shared");
        }
        Ok(())
    })
}

/// Runs `f` on the served pool of `name` under the pool's admin lock (so no destroy,
/// rollback or receive runs beside it), with `name`'s part after the pool. Nothing on disk
/// changes, so no txg is synced after it.
fn on_served(
    host: &Host,
    name: &str,
    verb: &str,
    f: impl FnOnce(&Served, &Pool, &str) -> Result<()>,
) -> Result<()> {
    let (pool, v) = volume_target(name)?;
    let Host::Live(served) = host else {
        if !host.known_pools()?.iter().any(|p| p == pool) {
            bail!("cannot {verb} {name}: no pool '{pool}' is known here");
        }
        bail!("cannot {verb} {name}: its pool is not served (oxpool serve offers every volume)");
    };
    let pool = served.pool(pool)?;
    let _one_change = pool.admin();
    f(served, &pool.pool, v)
}

/// The volume or snapshot `v` (`VOL` or `VOL@SNAP`) of `pool`.
fn named(pool: &Pool, v: &str) -> Result<Volume> {
    Ok(match v.split_once('@') {
        Some((head, snap)) => pool.snapshot_volume(head, snap)?,
        None => pool.volume(v)?,
    })
}
