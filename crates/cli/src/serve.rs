//! `oxpool serve`: until the NBD server lands, this creates (or opens) the pools to serve and
//! prints their status.

use crate::devices::open_device;
use crate::{open_pool, print_status, remember};
use anyhow::Result;
use clap::Args;
use oxpool_engine::cachefile;
use oxpool_engine::{Pool, PoolProps, TopSpec};
use oxpool_format::TopVdevKind;
use std::path::{Path, PathBuf};

/// Arguments of `oxpool serve`.
#[derive(Args)]
pub struct ServeArgs {
    /// Pools to serve (default: every known pool, or the embedded default).
    pub pools: Vec<String>,
    /// TCP address to listen on.
    #[arg(long, default_value = "127.0.0.1:10809")]
    pub listen: String,
    /// Unix socket to listen on (instead of TCP).
    #[arg(long)]
    pub socket: Option<PathBuf>,
    /// Volumes (POOL/VOL) to export read-only (repeatable).
    #[arg(long = "read-only", value_name = "POOL/VOL")]
    pub read_only: Vec<String>,
    /// Data directory of the embedded default pool.
    #[arg(long, default_value = "oxpool-data")]
    pub data_dir: PathBuf,
}

/// Size of the embedded default pool's sparse file.
pub const DEFAULT_POOL_FILE_BYTES: u64 = 8 << 30;
/// Size of the embedded default pool's volume.
pub const DEFAULT_VOLUME_BYTES: u64 = 4 << 30;

/// Creates the embedded default pool (`oxpool` with volume `vol0`) in `data_dir`, or opens it
/// if it exists there.
pub fn default_pool(cache: &Path, data_dir: &Path) -> Result<()> {
    let file = data_dir.join("oxpool-pool0.img");
    if file.exists() {
        let dev = open_device(&file, None)?;
        let pool = Pool::import(vec![dev.backend()], None)?;
        remember(cache, &pool)?;
        pool.export()?;
        return Ok(());
    }
    std::fs::create_dir_all(data_dir)?;
    let dev = open_device(&file, Some(DEFAULT_POOL_FILE_BYTES))?;
    let pool = Pool::create(
        "oxpool",
        vec![TopSpec {
            kind: TopVdevKind::Single,
            devices: vec![dev.backend()],
        }],
        PoolProps::default(),
        false,
    )?;
    pool.create_volume("vol0", DEFAULT_VOLUME_BYTES, &[])?;
    println!(
        "created pool 'oxpool' on {} (sparse file of {}) with volume 'vol0' of {}",
        file.display(),
        crate::human(DEFAULT_POOL_FILE_BYTES),
        crate::human(DEFAULT_VOLUME_BYTES)
    );
    remember(cache, &pool)?;
    pool.export()?;
    Ok(())
}

/// Runs the command.
pub fn run(cache: &Path, args: ServeArgs) -> Result<()> {
    let mut names = args.pools.clone();
    if names.is_empty() {
        names = cachefile::read(cache)?
            .into_iter()
            .map(|p| p.name)
            .collect();
    }
    if names.is_empty() {
        default_pool(cache, &args.data_dir)?;
        names.push("oxpool".into());
    }
    for n in &names {
        let (p, _locks) = open_pool(cache, n)?;
        print_status(&p.status());
        for v in p.volumes() {
            println!("volume {} ({} bytes)", v.full_name(), v.size_bytes());
        }
        p.export()?;
    }
    println!("(the NBD server is not built yet: issue 4)");
    Ok(())
}
