//! Where `oxpool inject`'s rules are kept: a file next to the pool cache file
//! (`pools.inject` beside `pools.cache`), one rule per line, for every pool of the machine,
//! served or exported. A served pool's rules live in its engine and are written here on
//! every change; any pool's rules are set on it again each time it is opened (imported,
//! served, or opened by a command), so they hold until `oxpool inject -c` clears them.
//!
//! Why a file beside the cache and not the pool's own labels or metadata: a rule is this
//! machine's test setup, not the pool's state. Kept out of the pool, it does not travel with
//! the devices to another machine, needs no txg (so it can be set on an exported pool without
//! opening it), cannot make another build refuse the pool, and `rm` undoes it.
//!
//! Format: `# comment` lines; `#next-id N`, the id the next rule gets (ids are never reused,
//! as zinject's handler numbers within a boot); then one line per rule, tab-separated: pool
//! name, pool guid (hex), rule id, device guid (hex), device path, kind (`io`, `corrupt`,
//! `delay:MS`), ops (`read`, `write`, `flush`, `all`), frequency (parts per million). Written
//! as `beside_cache.rs` says.

use crate::beside_cache;
use anyhow::{anyhow, Result};
use oxpool_engine::vdev::{InjectKind, InjectOps, InjectRule};
use oxpool_engine::Pool;
use oxpool_format::Guid;
use std::io::Write;
use std::path::{Path, PathBuf};

/// One rule as the file keeps it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SavedRule {
    /// The pool's name (for listing).
    pub pool: String,
    /// The pool's guid: the rule is for that pool only.
    pub pool_guid: u64,
    /// The rule (its device by guid).
    pub rule: InjectRule,
    /// The device's path when the rule was set (for listing).
    pub device_path: String,
}

/// The rules of the machine's pools.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Rules {
    /// The rules.
    pub rules: Vec<SavedRule>,
    /// The id the next rule gets.
    next_id: u64,
}

impl Rules {
    /// A new rule's id (never one given before).
    pub fn take_id(&mut self) -> u64 {
        let id = self
            .next_id
            .max(self.rules.iter().map(|s| s.rule.id + 1).max().unwrap_or(1));
        self.next_id = id + 1;
        id
    }
}

/// The rules file beside the cache file `cache`.
pub fn path_of(cache: &Path) -> PathBuf {
    beside_cache::path_of(cache, "inject")
}

const NEXT_ID: &str = "#next-id ";

fn read(path: &Path) -> Result<Rules> {
    let Some(text) = beside_cache::read_text(path)? else {
        return Ok(Rules::default());
    };
    let mut out = Vec::new();
    let mut next_id = 1;
    for (n, line) in text.lines().enumerate() {
        if let Some(id) = line.strip_prefix(NEXT_ID) {
            next_id = id
                .trim()
                .parse()
                .map_err(|_| anyhow!("{}: line {}: bad next id", path.display(), n + 1))?;
            continue;
        }
        if line.trim().is_empty() || line.starts_with('#') {
            continue;
        }
        let bad = || anyhow!("{}: line {}: malformed rule", path.display(), n + 1);
        let f: Vec<&str> = line.split('\t').collect();
        let [pool, pool_guid, id, device, device_path, kind, ops, ppm] = f[..] else {
            return Err(bad());
        };
        let hex = |s: &str| u64::from_str_radix(s, 16).map_err(|_| bad());
        let rule = InjectRule {
            id: id.parse().map_err(|_| bad())?,
            device: Guid(hex(device)?),
            kind: InjectKind::parse(kind).ok_or_else(bad)?,
            ops: InjectOps::parse(ops).ok_or_else(bad)?,
            frequency_ppm: ppm.parse().map_err(|_| bad())?,
        };
        rule.validate()
            .map_err(|e| anyhow!("{}: line {}: {e}", path.display(), n + 1))?;
        out.push(SavedRule {
            pool: pool.to_string(),
            pool_guid: hex(pool_guid)?,
            rule,
            device_path: device_path.to_string(),
        });
    }
    Ok(Rules {
        rules: out,
        next_id,
    })
}

fn write(path: &Path, all: &Rules) -> Result<()> {
    let mut text = String::from(
        "# oxpool inject rules: pool, pool guid, id, device guid, device, kind, ops, \
         frequency (ppm); tab-separated\n",
    );
    text += &format!("{NEXT_ID}{}\n", all.next_id);
    for s in &all.rules {
        text += &format!(
            "{}\t{:x}\t{}\t{:x}\t{}\t{}\t{}\t{}\n",
            s.pool,
            s.pool_guid,
            s.rule.id,
            s.rule.device.0,
            s.device_path,
            s.rule.kind.as_string(),
            s.rule.ops.as_str(),
            s.rule.frequency_ppm
        );
    }
    beside_cache::replace(path, &text)
}

/// Every rule the file beside `cache` holds (no lock: a reader sees the old or the new file).
pub fn rules(cache: &Path) -> Result<Vec<SavedRule>> {
    Ok(read(&path_of(cache))?.rules)
}

/// Runs `f` on the rules beside `cache` under the file's lock, and writes them back if `f`
/// changed them.
pub fn update<T>(cache: &Path, f: impl FnOnce(&mut Rules) -> Result<T>) -> Result<T> {
    let path = path_of(cache);
    beside_cache::locked(&path, || {
        let mut rules = read(&path)?;
        let before = rules.clone();
        let value = f(&mut rules)?;
        if rules != before {
            write(&path, &rules)?;
        }
        Ok(value)
    })
}

/// Sets the saved rules of `pool` (just opened) on it; a rule whose device the pool does not
/// have open is skipped with a warning on `warnings`.
pub fn apply(cache: &Path, pool: &Pool, warnings: &mut dyn Write) -> Result<()> {
    for s in rules(cache)?
        .into_iter()
        .filter(|s| s.pool_guid == pool.guid().0)
    {
        if let Err(e) = pool.inject_add(s.rule.clone()) {
            writeln!(
                warnings,
                "oxpool: injection rule {} on {} not set: {e}",
                s.rule.id, s.device_path
            )?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn saved(id: u64, kind: InjectKind) -> SavedRule {
        SavedRule {
            pool: "tank".into(),
            pool_guid: 0xabc,
            rule: InjectRule {
                id,
                device: Guid(0x123),
                kind,
                ops: InjectOps::Read,
                frequency_ppm: 5000,
            },
            device_path: "/d/b.img".into(),
        }
    }

    #[test]
    fn rules_round_trip_and_ids_are_never_reused() {
        let dir = tempfile::tempdir().unwrap();
        let cache = dir.path().join("pools.cache");
        assert!(rules(&cache).unwrap().is_empty());
        update(&cache, |all| {
            let id = all.take_id();
            all.rules.push(saved(id, InjectKind::Delay { delay_ms: 4 }));
            let id = all.take_id();
            all.rules.push(saved(id, InjectKind::Corrupt));
            Ok(())
        })
        .unwrap();
        let back = rules(&cache).unwrap();
        assert_eq!(
            back,
            vec![
                saved(1, InjectKind::Delay { delay_ms: 4 }),
                saved(2, InjectKind::Corrupt)
            ]
        );
        update(&cache, |all| {
            all.rules.clear();
            Ok(())
        })
        .unwrap();
        let id = update(&cache, |all| Ok(all.take_id())).unwrap();
        assert_eq!(id, 3, "an id is never given twice");
        // A damaged line is an error naming the file and the line.
        std::fs::write(path_of(&cache), "#next-id 4\ntank\tabc\t1\n").unwrap();
        let err = rules(&cache).unwrap_err().to_string();
        assert!(err.contains("line 2: malformed rule"), "{err}");
    }
}
