//! `oxpool`: pools, volumes, properties and the NBD server, in the zpool/zfs manner.
//!
//! Each command opens the pools it needs (through the pool cache file), does its work and
//! exports them again, so the pool is consistent on disk when the command returns. Device
//! files are locked (flock) while a pool is open, so a second process cannot open a pool that
//! `oxpool serve` is serving.

mod devices;
mod iostat;
mod serve;

use anyhow::{anyhow, bail, Context, Result};
use clap::{Parser, Subcommand};
use devices::{default_cache_file, open_device, scan_dir, Devices, NewFiles};
use oxpool_engine::cachefile::{self, CachedPool};
use oxpool_engine::props::{
    parse_size, DEVICE_PROP_NAMES, POOL_PROP_NAMES, VOLUME_PROP_NAMES, VOLUME_STAT_NAMES,
};
use oxpool_engine::{Pool, PoolProps, PoolStatus, TopSpec, VdevStatus};
use oxpool_format::TopVdevKind;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

#[derive(Parser)]
#[command(
    name = "oxpool",
    version,
    about = "A user-space storage pool with ZFS's guarantees, served over NBD"
)]
struct Cli {
    /// Pool cache file: the pools this machine knows.
    #[arg(long, global = true, value_name = "PATH")]
    cache_file: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Create a pool: `oxpool create tank a.img`, `oxpool create tank mirror a.img b.img`.
    Create {
        /// Overwrite devices that belong to another pool.
        #[arg(short, long)]
        force: bool,
        /// Size of device files to create where they do not exist (e.g. 10G). They are
        /// allocated and zero-written at creation (about 1 s per GiB on a fast disk), so that
        /// no write of the pool pays the host filesystem's first-write cost later.
        #[arg(long, value_name = "SIZE")]
        size: Option<String>,
        /// Create missing device files sparse instead: instant and taking no space up front,
        /// but the first write to each region is slower and the host filesystem may run out
        /// of space under the pool.
        #[arg(long)]
        sparse: bool,
        /// Pool property, name=value (repeatable).
        #[arg(short = 'o', value_name = "PROP=VALUE")]
        props: Vec<String>,
        /// Pool name.
        pool: String,
        /// Vdevs: device paths, each group optionally preceded by `mirror`.
        #[arg(required = true, num_args = 1..)]
        vdevs: Vec<String>,
    },
    /// Add devices to a pool: `oxpool add tank log /fast/slog.img` (a separate intent log).
    Add {
        /// Overwrite devices that belong to another pool.
        #[arg(short, long)]
        force: bool,
        /// Size of device files to create where they do not exist (allocated and
        /// zero-written, as for `create`).
        #[arg(long, value_name = "SIZE")]
        size: Option<String>,
        /// Create missing device files sparse instead (see `create --sparse`).
        #[arg(long)]
        sparse: bool,
        /// Pool name.
        pool: String,
        /// `log [mirror] PATH...`.
        #[arg(required = true, num_args = 1..)]
        vdevs: Vec<String>,
    },
    /// Import a pool from its devices.
    Import {
        /// Directory to search for devices (repeatable); default: the cache file's devices.
        #[arg(short = 'd', value_name = "DIR")]
        dirs: Vec<PathBuf>,
        /// Pool to import; without it, list the pools found.
        pool: Option<String>,
    },
    /// Export a pool: write everything and forget it.
    Export {
        /// Pool name.
        pool: String,
    },
    /// Destroy a pool: clear its devices' labels.
    Destroy {
        /// Pool name.
        pool: String,
    },
    /// List pools with their size and health.
    List,
    /// Read and verify every copy of every block, repairing bad copies from good ones.
    Scrub {
        /// Pool name.
        pool: String,
    },
    /// Show a pool's vdev tree with states and error counts.
    Status {
        /// Pool name (default: all).
        pool: Option<String>,
    },
    /// Volumes: create, list, destroy, read, write.
    Vol {
        #[command(subcommand)]
        command: VolCommand,
    },
    /// Read a property: `oxpool get volsize tank/vol0`, `oxpool get all tank`,
    /// `oxpool get scheduler tank /dev/sdb` (a device's).
    Get {
        /// Property name, or `all`.
        prop: String,
        /// POOL or POOL/VOL.
        target: String,
        /// A device of POOL (its path): read the device's property.
        device: Option<String>,
    },
    /// Set a property: `oxpool set sync=always tank/vol0`, `oxpool set scheduler=off tank`
    /// (every device), `oxpool set scheduler=on tank /dev/sdb` (one device; `inherit` to
    /// follow the pool's again).
    Set {
        /// name=value.
        assignment: String,
        /// POOL or POOL/VOL.
        target: String,
        /// A device of POOL (its path): set the device's property.
        device: Option<String>,
    },
    /// I/O statistics of a served pool: operations, bandwidth and latency per pool, device and
    /// volume; CPU time, context switches and completions per I/O; the vdev queues; the
    /// intent log. The first report covers the time since the server started, each later one
    /// the last INTERVAL seconds.
    Iostat {
        /// Average latencies: total (queue included) and disk time per device, call time per
        /// volume.
        #[arg(short = 'l')]
        latency: bool,
        /// Latency histograms per device and volume.
        #[arg(short = 'w')]
        histograms: bool,
        /// Print the raw counters as JSON (one object per report).
        #[arg(long)]
        json: bool,
        /// Pool name.
        pool: String,
        /// Seconds between reports (fractions allowed); without it, one report.
        interval: Option<f64>,
        /// Number of reports (default: until the server stops).
        count: Option<u64>,
    },
    /// Serve volumes over NBD (with no pool known, creates a file-backed default pool).
    Serve(serve::ServeArgs),
}

#[derive(Subcommand)]
enum VolCommand {
    /// Create a volume.
    Create {
        /// POOL/VOL.
        name: String,
        /// Volume size (e.g. 1G).
        #[arg(long, value_name = "SIZE")]
        size: String,
        /// Volume property, name=value (repeatable), e.g. volblocksize=4K.
        #[arg(short = 'o', value_name = "PROP=VALUE")]
        props: Vec<String>,
    },
    /// List volumes.
    List {
        /// Only this pool's.
        pool: Option<String>,
    },
    /// Destroy a volume.
    Destroy {
        /// POOL/VOL.
        name: String,
    },
    /// Write a file (or stdin with `-`) into a volume at an offset.
    Write {
        /// POOL/VOL.
        name: String,
        /// Byte offset.
        #[arg(long, default_value = "0")]
        offset: String,
        /// Input file, or `-` for stdin.
        input: PathBuf,
    },
    /// Read from a volume into a file (or stdout with `-`).
    Read {
        /// POOL/VOL.
        name: String,
        /// Byte offset.
        #[arg(long, default_value = "0")]
        offset: String,
        /// Bytes to read (default: to the end).
        #[arg(long)]
        length: Option<String>,
        /// Output file, or `-` for stdout.
        output: PathBuf,
    },
}

fn main() {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_max_level(tracing::Level::WARN)
        .with_target(false)
        .init();
    if let Err(e) = run(cli) {
        eprintln!("oxpool: {e:#}");
        std::process::exit(1);
    }
}

fn run(cli: Cli) -> Result<()> {
    let cache = cli.cache_file.clone().unwrap_or_else(default_cache_file);
    match cli.command {
        Command::Create {
            force,
            size,
            sparse,
            props,
            pool,
            vdevs,
        } => create(
            &cache,
            &pool,
            &vdevs,
            size.as_deref(),
            sparse,
            &props,
            force,
        ),
        Command::Import { dirs, pool } => import(&cache, &dirs, pool.as_deref()),
        Command::Add {
            force,
            size,
            sparse,
            pool,
            vdevs,
        } => {
            if vdevs.first().map(String::as_str) != Some("log") {
                bail!("only log devices can be added for now: oxpool add {pool} log PATH");
            }
            let create = new_files(size.as_deref(), sparse)?;
            let (p, mut locks) = open_pool(&cache, &pool)?;
            // As in create: until the pool holds the new devices, a failure removes the files
            // this command made.
            let made = parse_vdevs(&vdevs, create, &mut locks)
                .and_then(|tops| Ok(p.add_vdevs(tops, force)?));
            let p = match made {
                Ok(p) => p,
                Err(e) => {
                    locks.remove_created();
                    return Err(e);
                }
            };
            remember(&cache, &p)?;
            p.export()?;
            Ok(())
        }
        Command::Export { pool } => {
            let (p, _locks) = open_pool(&cache, &pool)?;
            p.export()?;
            cachefile::remove(&cache, &pool)?;
            Ok(())
        }
        Command::Destroy { pool } => {
            let (p, _locks) = open_pool(&cache, &pool)?;
            p.destroy()?;
            cachefile::remove(&cache, &pool)?;
            Ok(())
        }
        Command::List => {
            println!(
                "{:<16} {:>10} {:>10} {:>10} {:>9} {:>8}",
                "NAME", "SIZE", "ALLOC", "FREE", "HEALTH", "TXG"
            );
            for_each_pool(&cache, |p| {
                let s = p.status();
                println!(
                    "{:<16} {:>10} {:>10} {:>10} {:>9} {:>8}",
                    s.name,
                    human(s.size_bytes),
                    human(s.allocated_bytes),
                    human(s.size_bytes - s.allocated_bytes),
                    s.state,
                    s.txg
                );
                Ok(())
            })
        }
        Command::Status { pool } => {
            let mut any = false;
            for_each_pool(&cache, |p| {
                if pool.as_deref().is_some_and(|n| n != p.name()) {
                    return Ok(());
                }
                any = true;
                print_status(&p.status());
                Ok(())
            })?;
            if !any {
                match pool {
                    Some(n) => bail!("pool '{n}' not found"),
                    None => println!("no pools"),
                }
            }
            Ok(())
        }
        Command::Scrub { pool } => {
            let (p, _locks) = open_pool(&cache, &pool)?;
            let c = p.scrub()?;
            println!(
                "scrub of {pool}: {} copies checked, {} bad, {} repaired, {} blocks lost",
                c.copies_checked, c.copies_bad, c.copies_repaired, c.blocks_lost
            );
            print_status(&p.status());
            p.export()?;
            if c.blocks_lost > 0 {
                bail!("{} blocks have no good copy", c.blocks_lost);
            }
            Ok(())
        }
        Command::Vol { command } => vol(&cache, command),
        Command::Get {
            prop,
            target,
            device,
        } => get(&cache, &prop, &target, device.as_deref()),
        Command::Set {
            assignment,
            target,
            device,
        } => {
            let (k, v) = split_assignment(&assignment)?;
            let (pool, vol) = split_target(&target);
            let (p, _locks) = open_pool(&cache, pool)?;
            match (vol, device) {
                (Some(_), Some(_)) => bail!("a device belongs to a pool, not to a volume"),
                (Some(v2), None) => p.set_volume_prop(v2, k, v)?,
                (None, Some(d)) => p.set_device_prop(&d, k, v)?,
                (None, None) => p.set_prop(k, v)?,
            }
            p.export()?;
            Ok(())
        }
        Command::Iostat {
            latency,
            histograms,
            json,
            pool,
            interval,
            count,
        } => iostat::print(
            &cache,
            &pool,
            iostat::Options {
                json,
                latency,
                histograms,
                interval_s: interval,
                count,
            },
        ),
        Command::Serve(args) => serve::run(&cache, args),
    }
}

fn split_assignment(a: &str) -> Result<(&str, &str)> {
    a.split_once('=')
        .ok_or_else(|| anyhow!("expected PROP=VALUE, got '{a}'"))
}

fn split_target(t: &str) -> (&str, Option<&str>) {
    match t.split_once('/') {
        Some((p, v)) => (p, Some(v)),
        None => (t, None),
    }
}

/// Opens (imports) a pool the cache file knows; the returned locks keep its devices ours.
pub(crate) fn open_pool(cache: &Path, name: &str) -> Result<(Pool, Devices)> {
    let entry = cachefile::read(cache)?
        .into_iter()
        .find(|p| p.name == name)
        .ok_or_else(|| {
            anyhow!(
                "pool '{name}' not found (not in {}; try `oxpool import`)",
                cache.display()
            )
        })?;
    let mut devs = Devices::default();
    let mut missing = Vec::new();
    for path in &entry.devices {
        // A missing device is tolerated (a mirror can run degraded; import decides whether
        // enough is present); one that exists but cannot be opened or is in use is an error.
        if path.exists() {
            devs.push(open_device(path, None)?);
        } else {
            missing.push(path.display().to_string());
        }
    }
    if devs.backends().is_empty() {
        bail!(
            "pool '{name}': none of its devices exists ({})",
            missing.join(", ")
        );
    }
    // Missing devices show as MISSING in `oxpool status`; import refuses the pool if what is
    // missing is needed, naming it.
    let pool = Pool::import(devs.backends(), Some(name))
        .with_context(|| format!("cannot open pool '{name}'"))?;
    Ok((pool, devs))
}

/// Runs `f` on every pool in the cache file, exporting each afterwards.
fn for_each_pool(cache: &Path, mut f: impl FnMut(&Pool) -> Result<()>) -> Result<()> {
    for entry in cachefile::read(cache)? {
        let (p, _locks) = open_pool(cache, &entry.name)?;
        f(&p)?;
        p.export()?;
    }
    Ok(())
}

fn create(
    cache: &Path,
    name: &str,
    vdevs: &[String],
    size: Option<&str>,
    sparse: bool,
    props: &[String],
    force: bool,
) -> Result<()> {
    if cachefile::read(cache)?.iter().any(|p| p.name == name) {
        bail!("pool '{name}' already exists");
    }
    let create = new_files(size, sparse)?;
    let mut pool_props = PoolProps::default();
    for a in props {
        let (k, v) = split_assignment(a)?;
        pool_props.set(k, v)?;
    }
    let mut devs = Devices::default();
    // Until the pool exists, a failure removes the files this command made (once it exists,
    // they are the pool's: `import` finds it).
    let made = parse_vdevs(vdevs, create, &mut devs)
        .and_then(|tops| Ok(Pool::create(name, tops, pool_props, force)?));
    let pool = match made {
        Ok(pool) => pool,
        Err(e) => {
            devs.remove_created();
            return Err(e);
        }
    };
    remember(cache, &pool)?;
    pool.export()?;
    Ok(())
}

/// How `--size` and `--sparse` say missing device files are made.
fn new_files(size: Option<&str>, sparse: bool) -> Result<Option<NewFiles>> {
    Ok(match size {
        Some(s) => {
            let size_bytes = parse_size("--size", s)?;
            if size_bytes == 0 {
                bail!("--size must be more than 0");
            }
            Some(NewFiles { size_bytes, sparse })
        }
        None if sparse => bail!("--sparse needs --size: it says how missing files are created"),
        None => None,
    })
}

/// Parses `[mirror] PATH... [mirror PATH...] [log [mirror] PATH...]` into top-level vdevs,
/// opening (and with `create`, creating) the devices.
fn parse_vdevs(
    words: &[String],
    create: Option<NewFiles>,
    devs: &mut Devices,
) -> Result<Vec<TopSpec>> {
    let mut tops = Vec::new();
    let mut log = false;
    let mut i = 0;
    // Bounded: every round consumes at least one word.
    while i < words.len() {
        match words[i].as_str() {
            "log" => {
                log = true;
                i += 1;
            }
            "mirror" => {
                let start = i + 1;
                let mut end = start;
                while end < words.len() && words[end] != "mirror" && words[end] != "log" {
                    end += 1;
                }
                if end - start < 2 {
                    bail!("a mirror needs at least two devices");
                }
                let mut group = Vec::new();
                for p in &words[start..end] {
                    let d = open_device(Path::new(p), create)?;
                    group.push(d.backend());
                    devs.push(d);
                }
                tops.push(TopSpec {
                    log,
                    kind: TopVdevKind::Mirror,
                    devices: group,
                });
                i = end;
            }
            path => {
                let d = open_device(Path::new(path), create)?;
                tops.push(TopSpec {
                    log,
                    kind: TopVdevKind::Single,
                    devices: vec![d.backend()],
                });
                devs.push(d);
                i += 1;
            }
        }
    }
    Ok(tops)
}

pub(crate) fn remember(cache: &Path, pool: &Pool) -> Result<()> {
    let devices = pool
        .device_paths()
        .into_iter()
        .map(|p| std::fs::canonicalize(&p).unwrap_or_else(|_| PathBuf::from(p)))
        .collect();
    cachefile::upsert(
        cache,
        CachedPool {
            name: pool.name().to_string(),
            guid: pool.guid().0,
            devices,
        },
    )?;
    Ok(())
}

fn import(cache: &Path, dirs: &[PathBuf], name: Option<&str>) -> Result<()> {
    let mut paths: Vec<PathBuf> = Vec::new();
    if dirs.is_empty() {
        for p in cachefile::read(cache)? {
            paths.extend(p.devices);
        }
    }
    for d in dirs {
        paths.extend(scan_dir(d)?);
    }
    let mut devs = Devices::default();
    for p in &paths {
        if let Ok(d) = open_device(p, None) {
            devs.push(d);
        }
    }
    match name {
        Some(n) => {
            let pool = Pool::import(devs.backends(), Some(n))?;
            remember(cache, &pool)?;
            pool.export()?;
            println!("imported pool '{n}'");
        }
        None => {
            // List what could be imported: one line per pool found in the labels.
            let found = devices::probe_labels(&devs);
            if found.is_empty() {
                println!("no pools available to import");
            }
            for (pool, guid, paths) in found {
                println!("pool: {pool}  id: {guid:x}  devices: {}", paths.join(" "));
            }
        }
    }
    Ok(())
}

fn vol(cache: &Path, cmd: VolCommand) -> Result<()> {
    match cmd {
        VolCommand::Create { name, size, props } => {
            let (pool, v) = split_target(&name);
            let v = v.ok_or_else(|| anyhow!("expected POOL/VOL, got '{name}'"))?;
            let size = parse_size("--size", &size)?;
            let mut pairs = Vec::new();
            for a in &props {
                let (k, val) = split_assignment(a)?;
                pairs.push((k.to_string(), val.to_string()));
            }
            let (p, _locks) = open_pool(cache, pool)?;
            p.create_volume(v, size, &pairs)?;
            p.export()?;
        }
        VolCommand::List { pool } => {
            println!(
                "{:<32} {:>10} {:>10} {:>12}",
                "NAME", "VOLSIZE", "USED", "VOLBLOCKSIZE"
            );
            for_each_pool(cache, |p| {
                if pool.as_deref().is_some_and(|n| n != p.name()) {
                    return Ok(());
                }
                for v in p.volumes() {
                    println!(
                        "{:<32} {:>10} {:>10} {:>12}",
                        v.full_name(),
                        human(v.size_bytes()),
                        human(v.used_bytes()),
                        human(v.block_size_bytes() as u64)
                    );
                }
                Ok(())
            })?;
        }
        VolCommand::Destroy { name } => {
            let (pool, v) = split_target(&name);
            let v = v.ok_or_else(|| anyhow!("expected POOL/VOL, got '{name}'"))?;
            let (p, _locks) = open_pool(cache, pool)?;
            p.destroy_volume(v)?;
            p.export()?;
        }
        VolCommand::Write {
            name,
            offset,
            input,
        } => {
            let (pool, v) = split_target(&name);
            let v = v.ok_or_else(|| anyhow!("expected POOL/VOL, got '{name}'"))?;
            let offset = parse_size("--offset", &offset)?;
            let mut reader: Box<dyn Read> = if input == Path::new("-") {
                Box::new(std::io::stdin().lock())
            } else {
                Box::new(std::fs::File::open(&input).with_context(|| input.display().to_string())?)
            };
            let (p, _locks) = open_pool(cache, pool)?;
            let vol = p.volume(v)?;
            // Streamed 1 MiB at a time: memory stays bounded by the pool's dirty_max.
            let mut buf = vec![0u8; 1 << 20];
            let mut pos = offset;
            loop {
                let mut n = 0;
                while n < buf.len() {
                    match reader.read(&mut buf[n..])? {
                        0 => break,
                        k => n += k,
                    }
                }
                if n == 0 {
                    break;
                }
                oxpool_io::rt::block_on(vol.write(pos, &buf[..n], false))?;
                pos += n as u64;
            }
            drop(vol);
            p.export()?;
        }
        VolCommand::Read {
            name,
            offset,
            length,
            output,
        } => {
            let (pool, v) = split_target(&name);
            let v = v.ok_or_else(|| anyhow!("expected POOL/VOL, got '{name}'"))?;
            let offset = parse_size("--offset", &offset)?;
            let (p, _locks) = open_pool(cache, pool)?;
            let vol = p.volume(v)?;
            let len = match length {
                Some(l) => parse_size("--length", &l)?,
                None => vol.size_bytes().saturating_sub(offset),
            };
            let mut out: Box<dyn Write> = if output == Path::new("-") {
                Box::new(std::io::stdout().lock())
            } else {
                Box::new(
                    std::fs::File::create(&output).with_context(|| output.display().to_string())?,
                )
            };
            // Bounded memory: 1 MiB at a time.
            let mut buf = vec![0u8; 1 << 20];
            let mut pos = offset;
            while pos < offset + len {
                let n = ((offset + len - pos) as usize).min(buf.len());
                oxpool_io::rt::block_on(vol.read(pos, &mut buf[..n]))?;
                out.write_all(&buf[..n])?;
                pos += n as u64;
            }
            out.flush()?;
            drop(out);
            p.export()?;
        }
    }
    Ok(())
}

fn get(cache: &Path, prop: &str, target: &str, device: Option<&str>) -> Result<()> {
    let (pool, vol) = split_target(target);
    let (p, _locks) = open_pool(cache, pool)?;
    if let Some(d) = device {
        if vol.is_some() {
            bail!("a device belongs to a pool, not to a volume");
        }
        println!("{:<32} {:<14} {:<10} SOURCE", "NAME", "PROPERTY", "VALUE");
        let names: Vec<&str> = if prop == "all" {
            DEVICE_PROP_NAMES.to_vec()
        } else {
            vec![prop]
        };
        for n in names {
            let (value, source) = p.get_device_prop(d, n)?;
            println!("{:<32} {:<14} {:<10} {source}", d, n, value);
        }
        p.export()?;
        return Ok(());
    }
    println!("{:<32} {:<14} VALUE", "NAME", "PROPERTY");
    match vol {
        Some(v) => {
            let vol = p.volume(v)?;
            let names: Vec<&str> = if prop == "all" {
                VOLUME_PROP_NAMES
                    .iter()
                    .chain(VOLUME_STAT_NAMES)
                    .copied()
                    .collect()
            } else {
                vec![prop]
            };
            for n in names {
                println!("{:<32} {:<14} {}", target, n, vol.get_prop(n)?);
            }
        }
        None => {
            let names: Vec<&str> = if prop == "all" {
                POOL_PROP_NAMES.to_vec()
            } else {
                vec![prop]
            };
            for n in names {
                println!("{:<32} {:<14} {}", target, n, p.get_prop(n)?);
            }
        }
    }
    p.export()?;
    Ok(())
}

/// Sizes as zfs prints them: 1.5G, 512M, 16K.
pub(crate) fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["", "K", "M", "G", "T"];
    let mut v = bytes as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{bytes}")
    } else if v >= 10.0 {
        format!("{v:.0}{}", UNITS[u])
    } else {
        format!("{v:.1}{}", UNITS[u])
    }
}

pub(crate) fn print_status(s: &PoolStatus) {
    println!("  pool: {}", s.name);
    println!(" state: {}", s.state);
    println!("   txg: {}", s.txg);
    println!("config:\n");
    println!(
        "\t{:<40} {:<9} {:>5} {:>5} {:>5}",
        "NAME", "STATE", "READ", "WRITE", "CKSUM"
    );
    println!("\t{:<40} {:<9} {:>5} {:>5} {:>5}", s.name, s.state, 0, 0, 0);
    fn line(v: &VdevStatus, depth: usize) {
        let name = format!("{}{}", "  ".repeat(depth), v.name);
        println!(
            "\t{:<40} {:<9} {:>5} {:>5} {:>5}",
            name, v.state, v.read_errors, v.write_errors, v.checksum_errors
        );
        if v.repaired_bytes > 0 {
            println!(
                "\t{}  (repaired {} bytes)",
                "  ".repeat(depth),
                v.repaired_bytes
            );
        }
        for c in &v.children {
            line(c, depth + 1);
        }
    }
    for v in &s.vdevs {
        line(v, 1);
    }
    println!();
    println!(
        "errors: {}",
        if s.vdevs.iter().any(has_errors) {
            "see the counts above"
        } else {
            "No known data errors"
        }
    );
}

fn has_errors(v: &VdevStatus) -> bool {
    v.read_errors + v.write_errors + v.checksum_errors > 0 || v.children.iter().any(has_errors)
}
