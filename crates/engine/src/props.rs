//! Typed, persisted properties of pools and volumes, read and written by name as in ZFS
//! (`oxpool get/set`). A tunable is a property with a documented default, never an environment
//! variable. On disk they are stored as (name, value) string pairs inside the pool's metadata,
//! so a later version can add properties without a format change.

use crate::vdev::health::{FAULT_ERRORS_DEFAULT, FAULT_ERRORS_MAX, FAULT_WINDOW_S_DEFAULT};
use crate::vdev::queue::SchedulerMode;
use crate::zio::completion::CompletionPolicy;
use crate::{EngineError, Result};
use oxpool_format::{ChecksumType, CompressionSetting, Guid};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Smallest `volblocksize`.
pub const VOLBLOCKSIZE_MIN_BYTES: u32 = 512;
/// Largest `volblocksize`.
pub const VOLBLOCKSIZE_MAX_BYTES: u32 = 128 * 1024;
/// Default `volblocksize` (as ZFS: small enough for 4 KiB random I/O, large enough to keep
/// the block tree small).
pub const VOLBLOCKSIZE_DEFAULT_BYTES: u32 = 16 * 1024;

/// `sync` property: when writes must be durable before they are acknowledged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SyncMode {
    /// FLUSH and FUA make writes durable; other writes become durable at the next txg.
    Standard,
    /// Every write is treated as FUA.
    Always,
    /// FLUSH and FUA are ignored; data is durable at the next txg sync (unsafe for clients
    /// that rely on flushes).
    Disabled,
}

impl SyncMode {
    fn parse(v: &str) -> Result<SyncMode> {
        match v {
            "standard" => Ok(SyncMode::Standard),
            "always" => Ok(SyncMode::Always),
            "disabled" => Ok(SyncMode::Disabled),
            _ => Err(EngineError::invalid(format!(
                "bad value '{v}' for sync: expected standard, always or disabled"
            ))),
        }
    }
    fn as_str(self) -> &'static str {
        match self {
            SyncMode::Standard => "standard",
            SyncMode::Always => "always",
            SyncMode::Disabled => "disabled",
        }
    }
}

/// Pool properties.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolProps {
    /// `txg_timeout`: seconds between transaction-group syncs when nothing else triggers one
    /// (default 5, as ZFS: bounds the data a crash can lose without FLUSH).
    pub txg_timeout_s: u64,
    /// `dirty_max`: bytes of dirty data the pool holds before writers stop (default
    /// min(10 % of RAM, 4 GiB), as ZFS's `zfs_dirty_data_max`). A sync starts at 20 % of it
    /// and writers are delayed from 60 %.
    pub dirty_max_bytes: u64,
    /// `cache_max`: bytes of indirect blocks kept in memory (default 256 MiB).
    pub cache_max_bytes: u64,
    /// `logcommit`: `group` (default) lets concurrent commits share log blocks and flushes;
    /// `serial` runs one commit at a time, each with its own block and flush (the behaviour
    /// before OpenZFS PR 10163, kept to measure what group commit gains).
    pub log_group_commit: bool,
    /// `logearly`: `off` (default) writes log blocks at commits only, as ZFS does; `on` writes
    /// a volume's log block as soon as a write arrives while its log is idle, without a flush,
    /// so that the FLUSH which follows (a database's commit, `fsync` after each write) only
    /// has to flush. Off by default since 2026-11-30: on the 2-vCPU guest the project is
    /// measured on, the early write's extra completion and separate flush cost more than they
    /// saved (docs/durability.md, "Early writes"). See `zvol/log_early.rs`.
    pub log_early: bool,
    /// `scheduler`: the vdev queue mode of every device without its own setting: `auto`
    /// (default) bypasses the queue while the device keeps up, `on` always queues, `off`
    /// never does (see `vdev_queue.rs` for the rule).
    pub scheduler: SchedulerMode,
    /// Per-device `scheduler` settings, by device guid; persisted as `scheduler@<guid>`.
    pub scheduler_by_device: BTreeMap<Guid, SchedulerMode>,
    /// `data_cache_max`: bytes of data blocks kept in memory after reads (default 1/8 of RAM,
    /// at most 16 GiB; 0 turns the cache off). Like ZFS's ARC for data: a read of a cached
    /// block is a copy, not a device I/O.
    pub data_cache_max_bytes: u64,
    /// `completion`: where device completions are finished (`auto`, `inline`, `worker`,
    /// `batched`; see the `completion` module). Default `auto`.
    pub completion: CompletionPolicy,
    /// `fault_errors`: I/O errors of one device within `fault_window` that fault it (take it
    /// out of service, if its vdev's redundancy covers it); as many checksum errors make it
    /// DEGRADED. Default 10 (ZED's); 0 never faults. See `vdev/health.rs`.
    pub fault_errors: u32,
    /// `fault_window`: the seconds `fault_errors` counts over (default 600, ZED's).
    pub fault_window_s: u64,
}

/// Prefix of a per-device property's persisted name: `scheduler@<guid in hex>`.
const SCHEDULER_DEVICE_PREFIX: &str = "scheduler@";

impl Default for PoolProps {
    fn default() -> Self {
        PoolProps {
            txg_timeout_s: 5,
            dirty_max_bytes: default_dirty_max_bytes(),
            cache_max_bytes: 256 << 20,
            log_group_commit: true,
            log_early: false,
            data_cache_max_bytes: default_data_cache_max_bytes(),
            completion: CompletionPolicy::Auto,
            scheduler: SchedulerMode::Auto,
            scheduler_by_device: BTreeMap::new(),
            fault_errors: FAULT_ERRORS_DEFAULT,
            fault_window_s: FAULT_WINDOW_S_DEFAULT,
        }
    }
}

/// The memory the defaults are fractions of: the machine's, or the control group's limit
/// where lower.
fn ram_bytes() -> u64 {
    oxpool_io::machine::memory_bytes()
}

fn default_dirty_max_bytes() -> u64 {
    (ram_bytes() / 10).clamp(64 << 20, 4 << 30)
}

fn default_data_cache_max_bytes() -> u64 {
    (ram_bytes() / 8).clamp(64 << 20, 16 << 30)
}

/// Names of the pool properties, for listing.
pub const POOL_PROP_NAMES: &[&str] = &[
    "txg_timeout",
    "dirty_max",
    "cache_max",
    "logcommit",
    "logearly",
    "completion",
    "data_cache_max",
    "scheduler",
    "fault_errors",
    "fault_window",
];

/// Properties persisted only when they differ from their default: a pool that never set
/// them stays readable by a build that does not know them.
const POOL_PROPS_PERSISTED_IF_SET: &[&str] = &["fault_errors", "fault_window", "logearly"];

/// Names of the per-device properties, for listing.
pub const DEVICE_PROP_NAMES: &[&str] = &["scheduler"];

fn parse_scheduler(value: &str) -> Result<SchedulerMode> {
    SchedulerMode::parse(value).ok_or_else(|| {
        EngineError::invalid(format!(
            "bad value '{value}' for scheduler: expected auto, on or off"
        ))
    })
}

impl PoolProps {
    /// Reads a property by name.
    pub fn get(&self, name: &str) -> Result<String> {
        Ok(match name {
            "txg_timeout" => self.txg_timeout_s.to_string(),
            "dirty_max" => self.dirty_max_bytes.to_string(),
            "cache_max" => self.cache_max_bytes.to_string(),
            "completion" => self.completion.as_str().to_string(),
            "data_cache_max" => self.data_cache_max_bytes.to_string(),
            "logcommit" => if self.log_group_commit {
                "group"
            } else {
                "serial"
            }
            .to_string(),
            "logearly" => if self.log_early { "on" } else { "off" }.to_string(),
            "scheduler" => self.scheduler.as_str().to_string(),
            "fault_errors" => self.fault_errors.to_string(),
            "fault_window" => self.fault_window_s.to_string(),
            _ => {
                return Err(EngineError::invalid(format!(
                    "unknown pool property '{name}'"
                )))
            }
        })
    }

    /// The `scheduler` mode of the device `guid`: its own setting, else the pool's.
    pub fn device_scheduler(&self, guid: Guid) -> SchedulerMode {
        self.scheduler_by_device
            .get(&guid)
            .copied()
            .unwrap_or(self.scheduler)
    }

    /// Sets a per-device property (only `scheduler`); the value `inherit` removes the
    /// device's own setting so it follows the pool's again.
    pub fn set_device(&mut self, guid: Guid, name: &str, value: &str) -> Result<()> {
        if name != "scheduler" {
            return Err(EngineError::invalid(format!(
                "unknown device property '{name}' (device properties: scheduler)"
            )));
        }
        if value == "inherit" {
            self.scheduler_by_device.remove(&guid);
        } else {
            self.scheduler_by_device
                .insert(guid, parse_scheduler(value)?);
        }
        Ok(())
    }

    /// Sets a property by name, validating the value.
    pub fn set(&mut self, name: &str, value: &str) -> Result<()> {
        match name {
            "txg_timeout" => {
                let v = parse_u64(name, value)?;
                if !(1..=3600).contains(&v) {
                    return Err(EngineError::invalid("txg_timeout must be 1..=3600 seconds"));
                }
                self.txg_timeout_s = v;
            }
            "dirty_max" => {
                let v = parse_size(name, value)?;
                if v < (1 << 20) {
                    return Err(EngineError::invalid("dirty_max must be at least 1M"));
                }
                self.dirty_max_bytes = v;
            }
            "logcommit" => {
                self.log_group_commit = match value {
                    "group" => true,
                    "serial" => false,
                    _ => return Err(EngineError::invalid("logcommit must be group or serial")),
                }
            }
            "logearly" => {
                self.log_early = match value {
                    "on" => true,
                    "off" => false,
                    _ => return Err(EngineError::invalid("logearly must be on or off")),
                }
            }
            "data_cache_max" => {
                self.data_cache_max_bytes = parse_size(name, value)?;
            }
            "completion" => {
                self.completion = CompletionPolicy::parse(value).ok_or_else(|| {
                    EngineError::invalid(format!(
                        "bad value '{value}' for completion: expected auto, inline, worker or batched"
                    ))
                })?;
            }
            "cache_max" => {
                let v = parse_size(name, value)?;
                if v < (1 << 20) {
                    return Err(EngineError::invalid("cache_max must be at least 1M"));
                }
                self.cache_max_bytes = v;
            }
            "scheduler" => self.scheduler = parse_scheduler(value)?,
            "fault_errors" => {
                let v = parse_u64(name, value)?;
                if v > u64::from(FAULT_ERRORS_MAX) {
                    return Err(EngineError::invalid(format!(
                        "fault_errors must be 0 (never fault) to {FAULT_ERRORS_MAX}"
                    )));
                }
                self.fault_errors = v as u32;
            }
            "fault_window" => {
                let v = parse_u64(name, value)?;
                if !(1..=86_400).contains(&v) {
                    return Err(EngineError::invalid(
                        "fault_window must be 1 to 86400 seconds",
                    ));
                }
                self.fault_window_s = v;
            }
            _ if name.starts_with(SCHEDULER_DEVICE_PREFIX) => {
                let hex = &name[SCHEDULER_DEVICE_PREFIX.len()..];
                let guid = u64::from_str_radix(hex, 16).map_err(|_| {
                    EngineError::invalid(format!("bad device guid in property '{name}'"))
                })?;
                self.set_device(Guid(guid), "scheduler", value)?;
            }
            _ => {
                return Err(EngineError::invalid(format!(
                    "unknown pool property '{name}'"
                )))
            }
        }
        Ok(())
    }

    /// The persisted form.
    pub fn to_pairs(&self) -> Vec<(String, String)> {
        let default = PoolProps::default();
        let mut pairs: Vec<(String, String)> = POOL_PROP_NAMES
            .iter()
            .filter(|n| {
                !POOL_PROPS_PERSISTED_IF_SET.contains(n) || self.get(n).ok() != default.get(n).ok()
            })
            .map(|n| (n.to_string(), self.get(n).expect("known name")))
            .collect();
        for (guid, mode) in &self.scheduler_by_device {
            pairs.push((
                format!("{SCHEDULER_DEVICE_PREFIX}{:x}", guid.0),
                mode.as_str().to_string(),
            ));
        }
        pairs
    }

    /// Rebuilds from the persisted form; unknown names are an error (a newer writer).
    pub fn from_pairs(pairs: &[(String, String)]) -> Result<PoolProps> {
        let mut p = PoolProps::default();
        for (k, v) in pairs {
            p.set(k, v)?;
        }
        Ok(p)
    }
}

/// Volume properties.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VolumeProps {
    /// `volsize`: the volume's size in bytes (a multiple of `volblocksize`).
    pub volsize_bytes: u64,
    /// `volblocksize`: the block size, a power of two from 512 B to 128 KiB, fixed at creation.
    pub volblocksize_bytes: u32,
    /// `checksum`: algorithm for new blocks (default xxh3-128).
    pub checksum: ChecksumType,
    /// `sync`: see [`SyncMode`].
    pub sync: SyncMode,
    /// `copies`: copies of each data block, 1 to 3 (metadata always gets one more, up to 3).
    pub copies: u8,
    /// `readonly`: the volume refuses writes.
    pub readonly: bool,
    /// `logbias`: `latency` (default) copies small sync writes into the intent log;
    /// `throughput` writes every whole block of a sync write in place and logs only its
    /// pointer, so data is written once.
    pub logbias_throughput: bool,
    /// `log_copy_max`: largest sync write copied into the intent log under `logbias=latency`
    /// when the pool has no log device (default 32K, as ZFS's zvol_immediate_write_sz). Up to
    /// it, one sequential log write beats a block allocation and a random write; above it,
    /// copying would write the data twice, so whole blocks are written in place once and the
    /// txg sync adopts them.
    pub log_copy_max_bytes: u64,
    /// `nbd_allow`: who may open the volume over NBD: `*` (default) is every client that can
    /// connect; otherwise a comma-separated list of client identities, each the common name
    /// of a verified client certificate or a PSK identity (only clients that came in over
    /// TLS have one). Others get `NBD_REP_ERR_POLICY` and do not see the export listed.
    pub nbd_allow: Option<Vec<String>>,
    /// `compression`: how data blocks written from now on are stored: `off`, `lz4`
    /// (default, as ZFS), `zstd` (level 3), `zstd-1` .. `zstd-19`, `zle`. A block is stored
    /// compressed only if that saves an eighth of it and a whole sector; an all-zero block
    /// becomes a hole unless this is `off`. Blocks already written keep their form.
    pub compression: CompressionSetting,
    /// `refreservation`: bytes of the pool kept for this volume, which other volumes' writes
    /// may not fill (0: `none`, the default here; `create -V` without `-s` sets `auto`, what
    /// writing every block once takes). See `dsl/reservation.rs`.
    pub refreservation_bytes: u64,
    /// User properties (`com.example:backup=daily`), as ZFS's: names with a colon, values
    /// without control characters, kept and shown, meaning nothing to the pool. Bounded by
    /// [`USER_PROPS_MAX`] and [`USER_PROPS_BYTES_MAX`], so private: changed only through
    /// [`VolumeProps::set`] and [`VolumeProps::unset_user`], which check them. Shared: the
    /// properties are copied on the sync-write path, the user properties never there.
    user: Arc<BTreeMap<String, String>>,
}

/// Most user properties one volume holds.
pub const USER_PROPS_MAX: usize = 64;
/// Longest user property name, in bytes (ZFS's: its ZAP names are under 256).
pub const USER_PROP_NAME_MAX_BYTES: usize = 255;
/// Most bytes of one volume's user properties, names and values together (as ZFS's limit on
/// one value). ZFS keeps them in a ZAP of their own; here they are stored with the volume in
/// the pool's metadata, which every sync that changes a volume rewrites whole, so they are
/// bounded per volume and per pool ([`USER_PROPS_POOL_BYTES_MAX`]).
pub const USER_PROPS_BYTES_MAX: usize = 8 << 10;
/// Most bytes of user properties in one pool, every volume's together: the metadata they
/// add to a sync stays at 1 MiB, far inside `META_PAYLOAD_BYTES_MAX`.
pub const USER_PROPS_POOL_BYTES_MAX: usize = 1 << 20;

/// Whether `name` is a user property's (it has a colon, as in ZFS).
pub fn is_user_prop(name: &str) -> bool {
    name.contains(':')
}

/// Checks a user property's name as ZFS does: lowercase letters, digits, and `: - . _`,
/// with a colon, not starting with `-`, at most [`USER_PROP_NAME_MAX_BYTES`].
pub fn check_user_prop_name(name: &str) -> Result<()> {
    let ok_char = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || ":-._".contains(c);
    if !is_user_prop(name)
        || name.starts_with('-')
        || name.len() > USER_PROP_NAME_MAX_BYTES
        || !name.chars().all(ok_char)
    {
        return Err(EngineError::invalid(format!(
            "bad user property name '{}': lowercase letters, digits and : - . _ with a colon \
             (module:property), at most {USER_PROP_NAME_MAX_BYTES} bytes",
            name.escape_debug()
        )));
    }
    Ok(())
}

/// Longest identity in `nbd_allow` (OpenSSL's PSK identity limit; a certificate's common
/// name is at most 64 characters).
pub const NBD_ALLOW_NAME_MAX_BYTES: usize = 255;
/// Most identities in one `nbd_allow` list (the property is stored in the pool's metadata).
pub const NBD_ALLOW_NAMES_MAX: usize = 64;

/// Parses `nbd_allow`: `*`, or comma-separated identities (spaces around them ignored).
fn parse_nbd_allow(value: &str) -> Result<Option<Vec<String>>> {
    if value.trim() == "*" {
        return Ok(None);
    }
    let names: Vec<String> = value.split(',').map(|n| n.trim().to_string()).collect();
    if names.iter().any(|n| n.is_empty()) {
        return Err(EngineError::invalid(
            "nbd_allow: expected * or a comma-separated list of identities, none empty",
        ));
    }
    if names.len() > NBD_ALLOW_NAMES_MAX {
        return Err(EngineError::invalid(format!(
            "nbd_allow: at most {NBD_ALLOW_NAMES_MAX} identities"
        )));
    }
    if let Some(long) = names.iter().find(|n| n.len() > NBD_ALLOW_NAME_MAX_BYTES) {
        return Err(EngineError::invalid(format!(
            "nbd_allow: identity '{long}' is longer than {NBD_ALLOW_NAME_MAX_BYTES} bytes"
        )));
    }
    if names.iter().any(|n| n == "*") {
        return Err(EngineError::invalid(
            "nbd_allow: * stands alone (everyone); it cannot be part of a list",
        ));
    }
    Ok(Some(names))
}

/// Names of the volume properties, for listing.
pub const VOLUME_PROP_NAMES: &[&str] = &[
    "volsize",
    "volblocksize",
    "checksum",
    "sync",
    "copies",
    "readonly",
    "logbias",
    "log_copy_max",
    "nbd_allow",
    "compression",
    "refreservation",
];

/// Names of the volumes' read-only properties (statistics, as of the last txg sync), for
/// listing: `used` (bytes allocated, every copy, indirect blocks included), `logicalused` and
/// `logicalreferenced` (the data blocks' logical size: what they hold before compression,
/// one copy; the same for a volume without snapshots), `compressratio` (`logicalused` over
/// what the data blocks take as stored, one copy, as `1.53x`).
pub const VOLUME_STAT_NAMES: &[&str] =
    &["used", "logicalused", "logicalreferenced", "compressratio"];

impl VolumeProps {
    /// Defaults for a volume of `volsize_bytes`.
    pub fn new(volsize_bytes: u64) -> VolumeProps {
        VolumeProps {
            volsize_bytes,
            volblocksize_bytes: VOLBLOCKSIZE_DEFAULT_BYTES,
            checksum: ChecksumType::Xxh3_128,
            sync: SyncMode::Standard,
            copies: 1,
            readonly: false,
            logbias_throughput: false,
            log_copy_max_bytes: 32 << 10,
            nbd_allow: None,
            compression: CompressionSetting::default(),
            refreservation_bytes: 0,
            user: Arc::default(),
        }
    }

    /// The user properties, by name.
    pub fn user_props(&self) -> &BTreeMap<String, String> {
        &self.user
    }

    /// Bytes of the user properties, names and values together (what the bounds count).
    pub fn user_props_bytes(&self) -> usize {
        self.user.iter().map(|(k, v)| k.len() + v.len()).sum()
    }

    /// Drops every user property (a clone starts without its origin's, as in ZFS, where a
    /// clone inherits from its parent, not from its origin).
    pub fn clear_user(&mut self) {
        self.user = Arc::default();
    }

    /// Removes user property `name` (`oxpool inherit`); not set is not an error, as in ZFS.
    /// Returns whether it was set.
    pub fn unset_user(&mut self, name: &str) -> Result<bool> {
        check_user_prop_name(name)?;
        if !self.user.contains_key(name) {
            return Ok(false);
        }
        Arc::make_mut(&mut self.user).remove(name);
        Ok(true)
    }

    fn set_user(&mut self, name: &str, value: &str) -> Result<()> {
        check_user_prop_name(name)?;
        if value.chars().any(char::is_control) {
            return Err(EngineError::invalid(format!(
                "user property {name}: control characters are not allowed in a value"
            )));
        }
        let others: usize = self
            .user
            .iter()
            .filter(|(k, _)| *k != name)
            .map(|(k, v)| k.len() + v.len())
            .sum();
        if others + name.len() + value.len() > USER_PROPS_BYTES_MAX {
            return Err(EngineError::invalid(format!(
                "user property {name}: a volume's user properties hold at most \
                 {USER_PROPS_BYTES_MAX} bytes, names and values together"
            )));
        }
        if !self.user.contains_key(name) && self.user.len() >= USER_PROPS_MAX {
            return Err(EngineError::invalid(format!(
                "user property {name}: a volume holds at most {USER_PROPS_MAX}"
            )));
        }
        Arc::make_mut(&mut self.user).insert(name.to_string(), value.to_string());
        Ok(())
    }

    /// Reads a property by name.
    pub fn get(&self, name: &str) -> Result<String> {
        if is_user_prop(name) {
            // Not set reads `-`, as `zfs get` shows it.
            check_user_prop_name(name)?;
            return Ok(self.user.get(name).cloned().unwrap_or_else(|| "-".into()));
        }
        Ok(match name {
            "volsize" => self.volsize_bytes.to_string(),
            "volblocksize" => self.volblocksize_bytes.to_string(),
            "checksum" => self.checksum.to_string(),
            "sync" => self.sync.as_str().to_string(),
            "copies" => self.copies.to_string(),
            "readonly" => if self.readonly { "on" } else { "off" }.to_string(),
            "logbias" => if self.logbias_throughput {
                "throughput"
            } else {
                "latency"
            }
            .to_string(),
            "log_copy_max" => self.log_copy_max_bytes.to_string(),
            "nbd_allow" => match &self.nbd_allow {
                None => "*".to_string(),
                Some(names) => names.join(","),
            },
            "compression" => self.compression.to_string(),
            "refreservation" => match self.refreservation_bytes {
                0 => "none".to_string(),
                b => b.to_string(),
            },
            _ => {
                return Err(EngineError::invalid(format!(
                    "unknown volume property '{name}'"
                )))
            }
        })
    }

    /// Sets a property by name at creation time (everything may be set).
    pub fn set_initial(&mut self, name: &str, value: &str) -> Result<()> {
        match name {
            "volblocksize" => {
                let v = parse_size(name, value)?;
                let ok = v.is_power_of_two()
                    && (VOLBLOCKSIZE_MIN_BYTES as u64..=VOLBLOCKSIZE_MAX_BYTES as u64).contains(&v);
                if !ok {
                    return Err(EngineError::invalid(
                        "volblocksize must be a power of two from 512 to 128K",
                    ));
                }
                self.volblocksize_bytes = v as u32;
                Ok(())
            }
            _ => self.set(name, value),
        }
    }

    /// Sets a property on an existing volume (`volblocksize` is fixed at creation).
    pub fn set(&mut self, name: &str, value: &str) -> Result<()> {
        if is_user_prop(name) {
            return self.set_user(name, value);
        }
        match name {
            "volsize" => self.volsize_bytes = parse_size(name, value)?,
            "volblocksize" => {
                return Err(EngineError::invalid(
                    "volblocksize is fixed when the volume is created",
                ))
            }
            "checksum" => {
                self.checksum = value.parse().map_err(|_| {
                    EngineError::invalid(format!(
                        "bad value '{value}' for checksum: expected xxh3-128 or blake3"
                    ))
                })?
            }
            "sync" => self.sync = SyncMode::parse(value)?,
            "copies" => {
                let v = parse_u64(name, value)?;
                if !(1..=3).contains(&v) {
                    return Err(EngineError::invalid("copies must be 1, 2 or 3"));
                }
                self.copies = v as u8;
            }
            "readonly" => {
                self.readonly = match value {
                    "on" => true,
                    "off" => false,
                    _ => return Err(EngineError::invalid("readonly must be on or off")),
                }
            }
            "logbias" => {
                self.logbias_throughput = match value {
                    "latency" => false,
                    "throughput" => true,
                    _ => {
                        return Err(EngineError::invalid(
                            "logbias must be latency or throughput",
                        ))
                    }
                }
            }
            "log_copy_max" => {
                let v = parse_size(name, value)?;
                if v > 1 << 20 {
                    return Err(EngineError::invalid("log_copy_max must be at most 1M"));
                }
                self.log_copy_max_bytes = v;
            }
            "nbd_allow" => self.nbd_allow = parse_nbd_allow(value)?,
            "refreservation" => {
                self.refreservation_bytes = match value {
                    "none" => 0,
                    // The pool resolves `auto` (it depends on the pool's layout) before a
                    // value reaches here: `Pool::resolve_refreservation`.
                    "auto" => {
                        return Err(EngineError::invalid(
                            "refreservation=auto is resolved by the pool; give a size or none",
                        ))
                    }
                    v => parse_size(name, v)?,
                }
            }
            "compression" => {
                self.compression = value.parse().map_err(|_| {
                    EngineError::invalid(format!(
                        "bad value '{value}' for compression: expected off, on (lz4), lz4, \
                         zstd, zstd-1 .. zstd-19 or zle"
                    ))
                })?
            }
            _ if VOLUME_STAT_NAMES.contains(&name) => {
                return Err(EngineError::invalid(format!(
                    "property '{name}' is read-only"
                )))
            }
            _ => {
                return Err(EngineError::invalid(format!(
                    "unknown volume property '{name}'"
                )))
            }
        }
        Ok(())
    }

    /// Checks a size a volume is being given (created, resized, received) against
    /// [`oxpool_format::VOLSIZE_MAX_BYTES`]. Not part of [`VolumeProps::validate`], which
    /// every property change runs: a volume made larger before the limit existed keeps its
    /// other properties settable.
    pub fn check_new_volsize(volsize_bytes: u64) -> Result<()> {
        if volsize_bytes > oxpool_format::VOLSIZE_MAX_BYTES {
            return Err(EngineError::invalid(format!(
                "volsize {volsize_bytes} is over the largest, {} (4E)",
                oxpool_format::VOLSIZE_MAX_BYTES
            )));
        }
        Ok(())
    }

    /// Checks the cross-property rules (volsize is a non-zero multiple of volblocksize).
    pub fn validate(&self) -> Result<()> {
        let bs = self.volblocksize_bytes as u64;
        if self.volsize_bytes == 0 || !self.volsize_bytes.is_multiple_of(bs) {
            return Err(EngineError::invalid(format!(
                "volsize {} must be a non-zero multiple of volblocksize {bs}",
                self.volsize_bytes
            )));
        }
        Ok(())
    }

    /// The persisted form (volsize and volblocksize are stored in their own fields).
    /// `nbd_allow` only when set, so that a pool that does not use it stays readable by a
    /// version without it; the user properties last, each as its name and value
    /// (docs/format.md).
    pub fn to_pairs(&self) -> Vec<(String, String)> {
        let mut names = vec![
            "checksum",
            "sync",
            "copies",
            "readonly",
            "logbias",
            "log_copy_max",
            "compression",
        ];
        if self.nbd_allow.is_some() {
            names.push("nbd_allow");
        }
        // Only when set, as nbd_allow: a pool without reservations stays readable by a
        // version that does not know them.
        if self.refreservation_bytes != 0 {
            names.push("refreservation");
        }
        names
            .iter()
            .map(|n| (n.to_string(), self.get(n).expect("known name")))
            .chain(self.user.iter().map(|(k, v)| (k.clone(), v.clone())))
            .collect()
    }

    /// Rebuilds from the persisted form.
    pub fn from_parts(
        volsize_bytes: u64,
        volblocksize_bytes: u32,
        pairs: &[(String, String)],
    ) -> Result<VolumeProps> {
        let mut p = VolumeProps::new(volsize_bytes);
        p.volblocksize_bytes = volblocksize_bytes;
        for (k, v) in pairs {
            p.set(k, v)?;
        }
        Ok(p)
    }
}

fn parse_u64(name: &str, value: &str) -> Result<u64> {
    value
        .parse()
        .map_err(|_| EngineError::invalid(format!("bad value '{value}' for {name}: not a number")))
}

/// Parses a size as `zfs` does: a number of bytes, or a number (a fraction allowed) with a
/// binary suffix, any case, optionally followed by `B` or `iB`: `512`, `16K`, `64M`, `1.5G`,
/// `10GB`, `1TiB`, `2P`, `1E`. A size that is not a whole number of bytes is refused.
pub fn parse_size(name: &str, value: &str) -> Result<u64> {
    let bad = || {
        EngineError::invalid(format!(
            "bad size '{value}' for {name}: expected bytes, or a number with K, M, G, T, P or E \
             (binary: 16K, 1.5G, 10GiB)"
        ))
    };
    let v = value.trim();
    let number_end = v
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(v.len());
    let (number, suffix) = v.split_at(number_end);
    let shift: u32 = match suffix.to_ascii_uppercase().as_str() {
        "" | "B" => 0,
        "K" | "KB" | "KIB" => 10,
        "M" | "MB" | "MIB" => 20,
        "G" | "GB" | "GIB" => 30,
        "T" | "TB" | "TIB" => 40,
        "P" | "PB" | "PIB" => 50,
        "E" | "EB" | "EIB" => 60,
        _ => return Err(bad()),
    };
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && fraction.is_empty() || !fraction.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    // Zeros that change nothing go before the bounds: a u64 has 20 digits, and a fraction's
    // digits past 19 can make no whole byte of at most 2^60 per unit.
    let (whole, fraction) = (
        whole.trim_start_matches('0'),
        fraction.trim_end_matches('0'),
    );
    if whole.len() > 20 {
        return Err(EngineError::invalid(format!(
            "size '{value}' for {name} is too large"
        )));
    }
    if fraction.len() > 19 {
        return Err(EngineError::invalid(format!(
            "size '{value}' for {name} is not a whole number of bytes"
        )));
    }
    let whole: u128 = if whole.is_empty() {
        0
    } else {
        whole.parse().map_err(|_| bad())?
    };
    let scaled_fraction: u128 = if fraction.is_empty() {
        0
    } else {
        let digits: u128 = fraction.parse().map_err(|_| bad())?;
        let denominator = 10u128.pow(fraction.len() as u32);
        let scaled = digits << shift;
        if !scaled.is_multiple_of(denominator) {
            return Err(EngineError::invalid(format!(
                "size '{value}' for {name} is not a whole number of bytes"
            )));
        }
        scaled / denominator
    };
    let bytes = (whole << shift) + scaled_fraction;
    u64::try_from(bytes)
        .map_err(|_| EngineError::invalid(format!("size '{value}' for {name} is too large")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_suffixes() {
        assert_eq!(parse_size("x", "512").unwrap(), 512);
        assert_eq!(parse_size("x", "16K").unwrap(), 16384);
        assert_eq!(parse_size("x", "64m").unwrap(), 64 << 20);
        assert!(parse_size("x", "12Q").is_err());
        assert!(parse_size("x", "99999999999T").is_err());
        // As zfs: fractions, P and E, and B or iB after the unit.
        assert_eq!(parse_size("x", "1.5G").unwrap(), 3 << 29);
        assert_eq!(parse_size("x", "0.5k").unwrap(), 512);
        assert_eq!(parse_size("x", ".25M").unwrap(), 1 << 18);
        assert_eq!(parse_size("x", "100MB").unwrap(), 100 << 20);
        assert_eq!(parse_size("x", "100MiB").unwrap(), 100 << 20);
        assert_eq!(parse_size("x", "1P").unwrap(), 1 << 50);
        assert_eq!(parse_size("x", "8E").unwrap(), 8 << 60);
        assert_eq!(parse_size("x", "4096B").unwrap(), 4096);
        let e = parse_size("x", "16E").unwrap_err().to_string();
        assert!(e.contains("too large"), "{e}");
        let e = parse_size("x", "1.5").unwrap_err().to_string();
        assert!(e.contains("not a whole number of bytes"), "{e}");
        let e = parse_size("x", "1.1K").unwrap_err().to_string();
        assert!(e.contains("not a whole number of bytes"), "{e}");
        for bad in [
            "", ".", "1..5G", "1.5.G", "-1", "1 G", "G", "1GG", "1KiBB", "1e3",
        ] {
            let e = parse_size("x", bad).unwrap_err().to_string();
            assert!(e.contains("bad size") && e.contains("1.5G"), "{bad}: {e}");
        }
        assert_eq!(
            parse_size("x", "18446744073709551615").unwrap(),
            u64::MAX,
            "the largest"
        );
        assert!(parse_size("x", "18446744073709551616").is_err());
        assert!(parse_size("x", "99999999999999999999999E").is_err());
        assert_eq!(
            parse_size("x", "1.50000000000000000000000G").unwrap(),
            3 << 29
        );
        assert_eq!(
            parse_size("x", "0000000000000000000000016K").unwrap(),
            16384
        );
        assert_eq!(parse_size("x", "0.0").unwrap(), 0);
    }

    #[test]
    fn volume_props_round_trip_and_validate() {
        let mut p = VolumeProps::new(1 << 20);
        p.set_initial("volblocksize", "4K").unwrap();
        p.set("sync", "always").unwrap();
        p.set("checksum", "blake3").unwrap();
        p.set("nbd_allow", " client1 , alice").unwrap();
        assert_eq!(p.get("nbd_allow").unwrap(), "client1,alice");
        assert_eq!(p.get("compression").unwrap(), "lz4", "the default");
        p.set("compression", "zstd-7").unwrap();
        assert!(p.set("compression", "zstd-20").is_err());
        assert!(p.set("compressratio", "2").is_err(), "read-only");
        let q =
            VolumeProps::from_parts(p.volsize_bytes, p.volblocksize_bytes, &p.to_pairs()).unwrap();
        assert_eq!(p, q);
        assert_eq!(q.get("compression").unwrap(), "zstd-7");
        assert!(p.set("volblocksize", "8K").is_err());
        assert!(p.set_initial("volblocksize", "3000").is_err());
        p.volsize_bytes = 1000;
        assert!(p.validate().is_err());
    }

    /// User properties round-trip through the persisted pairs; their names are checked as
    /// ZFS checks them, and the bounds hold when they are decoded too (a damaged or crafted
    /// metadata block gets an error, not a volume over the limits).
    #[test]
    fn user_properties_round_trip_and_are_bounded() {
        let mut p = VolumeProps::new(1 << 20);
        p.set("com.example:backup", "daily at 02:00").unwrap();
        p.set("org:x", "").unwrap();
        assert_eq!(p.get("com.example:backup").unwrap(), "daily at 02:00");
        assert_eq!(p.get("com.example:unset").unwrap(), "-");
        let back = VolumeProps::from_parts(1 << 20, p.volblocksize_bytes, &p.to_pairs()).unwrap();
        assert_eq!(back, p);
        for bad in [
            "Com:x",
            "-a:b",
            "a:b c",
            "a:b\u{e9}",
            &format!("a:{}", "b".repeat(256)),
        ] {
            assert!(p.set(bad, "v").is_err(), "{bad}");
        }
        assert!(p.set("a:b", "line\nbreak").is_err());
        p.unset_user("org:x").unwrap();
        assert_eq!(p.get("org:x").unwrap(), "-");
        // Too many, and too many bytes: refused when set and when decoded.
        let mut many: Vec<(String, String)> = (0..=USER_PROPS_MAX)
            .map(|i| (format!("m:p{i}"), "v".to_string()))
            .collect();
        let mut q = VolumeProps::new(1 << 20);
        for (k, v) in &many[..USER_PROPS_MAX] {
            q.set(k, v).unwrap();
        }
        assert!(q.set(&many[USER_PROPS_MAX].0, "v").is_err());
        assert!(VolumeProps::from_parts(1 << 20, q.volblocksize_bytes, &many).is_err());
        many.truncate(2);
        many[1].1 = "x".repeat(USER_PROPS_BYTES_MAX);
        assert!(VolumeProps::from_parts(1 << 20, q.volblocksize_bytes, &many).is_err());
    }

    #[test]
    fn nbd_allow_parses_lists_and_refuses_empty_names() {
        let mut p = VolumeProps::new(1 << 20);
        assert_eq!(p.get("nbd_allow").unwrap(), "*");
        assert!(!p.to_pairs().iter().any(|(k, _)| k == "nbd_allow"));
        p.set("nbd_allow", "alice").unwrap();
        assert_eq!(p.nbd_allow, Some(vec!["alice".to_string()]));
        for bad in ["", "a,,b", "a,*", " , "] {
            assert!(p.set("nbd_allow", bad).is_err(), "{bad:?}");
        }
        assert_eq!(
            p.nbd_allow,
            Some(vec!["alice".to_string()]),
            "a refused value changes nothing"
        );
        p.set("nbd_allow", "*").unwrap();
        assert_eq!(p.nbd_allow, None);
    }

    #[test]
    fn pool_props_round_trip() {
        let mut p = PoolProps::default();
        p.set("txg_timeout", "2").unwrap();
        p.set("dirty_max", "64M").unwrap();
        p.set("scheduler", "on").unwrap();
        p.set_device(Guid(0xabc), "scheduler", "off").unwrap();
        assert_eq!(PoolProps::from_pairs(&p.to_pairs()).unwrap(), p);
        // The fault rule is persisted only when set.
        assert!(!p.to_pairs().iter().any(|(k, _)| k.starts_with("fault")));
        p.set("fault_errors", "3").unwrap();
        assert!(p.set("fault_window", "0").is_err());
        assert!(p.set("fault_errors", "1001").is_err());
        assert_eq!(PoolProps::from_pairs(&p.to_pairs()).unwrap(), p);
        assert_eq!(
            p.to_pairs()
                .iter()
                .filter(|(k, _)| k.starts_with("fault"))
                .count(),
            1
        );
        // logearly: off by default and then not persisted; on is, and comes back.
        assert!(!p.to_pairs().iter().any(|(k, _)| k == "logearly"));
        p.set("logearly", "on").unwrap();
        assert!(p
            .to_pairs()
            .contains(&("logearly".to_string(), "on".to_string())));
        assert_eq!(PoolProps::from_pairs(&p.to_pairs()).unwrap(), p);
        assert_eq!(p.device_scheduler(Guid(0xabc)), SchedulerMode::Off);
        assert_eq!(p.device_scheduler(Guid(1)), SchedulerMode::On);
        p.set_device(Guid(0xabc), "scheduler", "inherit").unwrap();
        assert_eq!(p.device_scheduler(Guid(0xabc)), SchedulerMode::On);
        assert!(p.set("scheduler", "fast").is_err());
        assert!(p.set_device(Guid(1), "sync", "on").is_err());
        assert!(p.set("bogus", "1").is_err());
    }
}
