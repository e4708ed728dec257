//! `oxpool rename FROM TO`, as `zfs rename`: a volume, a snapshot or a bookmark takes
//! another name in its pool (`Pool::rename` says why it is atomic and what follows it). On a
//! served pool the exports follow: their clients stay connected, and the new names are
//! offered from then on (`Served::rename_exports`).
//!
//! Not here: `-r` (a snapshot of every volume), `-p` and `-u` (no parents to create, no
//! mounts: a volume has neither), `-f`; and a pool, which takes a new name at import.

use super::{pool_part, volume_target};
use crate::host::Host;
use anyhow::{anyhow, bail, Result};

/// `oxpool rename FROM TO`.
pub fn rename(host: &Host, from: &str, to: &str) -> Result<()> {
    let (pool, from_in, to_in) = names(from, to)?;
    host.change_pool(pool, |p| {
        p.rename(from_in, &to_in)?;
        if let Host::Live(served) = host {
            served.rename_exports(pool, from_in, &to_in)?;
        }
        Ok(())
    })
}

/// The pool, and `from` and `to` as names inside it (`VOL`, `VOL@SNAP`, `VOL#BOOKMARK`): a
/// snapshot's or a bookmark's `to` may be short (`@NEW`, `NEW`), as zfs takes it.
fn names<'a>(from: &'a str, to: &str) -> Result<(&'a str, &'a str, String)> {
    if !from.contains('/') {
        bail!(
            "cannot rename '{from}': a pool takes a new name when it is imported \
             (oxpool import POOL NEWNAME), not by rename"
        );
    }
    let (pool, from_in) = volume_target(from)?;
    let sep = from_in.find(['@', '#']).map(|i| (i, &from_in[i..=i]));
    let to_in = match sep {
        // A snapshot or a bookmark: `@NEW` / `#NEW`, `NEW`, or in full.
        Some((i, mark)) if !to.contains('/') => {
            let name = to.strip_prefix(mark).unwrap_or(to);
            if name.contains(['@', '#']) {
                bail!(
                    "cannot rename {from} to '{to}': name it POOL/VOL{mark}NEW, {mark}NEW or NEW"
                );
            }
            format!("{}{mark}{name}", &from_in[..i])
        }
        _ => {
            let (to_pool, rest) = volume_target(to)
                .map_err(|_| anyhow!("cannot rename {from} to '{to}': name it POOL/NEWVOL"))?;
            if to_pool != pool {
                bail!(
                    "cannot rename {from} to {to}: rename does not move between pools \
                     ({pool} to {to_pool}; send and recv copy across)"
                );
            }
            rest.to_string()
        }
    };
    debug_assert_eq!(pool_part(from), pool);
    Ok((pool, from_in, to_in))
}

#[cfg(test)]
mod tests {
    use super::names;

    #[test]
    fn short_forms_name_the_same_volume() {
        for to in ["tank/v@b", "@b", "b"] {
            assert_eq!(names("tank/v@a", to).unwrap().2, "v@b");
        }
        for to in ["tank/v#b", "#b", "b"] {
            assert_eq!(names("tank/v#a", to).unwrap().2, "v#b");
        }
        assert_eq!(
            names("tank/v", "tank/w").unwrap(),
            ("tank", "v", "w".into())
        );
    }

    #[test]
    fn refusals_say_why() {
        let e = names("tank", "other").unwrap_err().to_string();
        assert!(e.contains("import"), "{e}");
        let e = names("tank/v", "other/v").unwrap_err().to_string();
        assert!(e.contains("does not move between pools"), "{e}");
        let e = names("tank/v@a", "other/v@b").unwrap_err().to_string();
        assert!(e.contains("does not move between pools"), "{e}");
        assert!(names("tank/v", "w").is_err());
        assert!(names("tank/v@a", "@b@c").is_err());
    }
}
