//! The command line of `oxpool`: verbs and flags, in the zpool/zfs manner.

use crate::serve::ServeArgs;
use clap::{Parser, Subcommand};
use std::path::PathBuf;

#[derive(Parser)]
#[command(
    name = "oxpool",
    version,
    about = "A user-space storage pool with ZFS's guarantees, served over NBD"
)]
pub struct Cli {
    /// Pool cache file: the pools this machine knows.
    #[arg(long, global = true, value_name = "PATH")]
    pub cache_file: Option<PathBuf>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// Create a pool: `oxpool create tank a.img`, `oxpool create tank mirror a.img b.img`,
    /// `oxpool create tank raidz2 a.img b.img c.img d.img e.img f.img`; or, with -V, a
    /// volume: `oxpool create -V 10G tank/vol1` (as `zfs create -V`: it reserves its space,
    /// `refreservation=auto`, unless -s; `vol create` makes it thin).
    Create {
        /// Create volume POOL/VOL of this size instead of a pool, as `zfs create -V`.
        #[arg(short = 'V', value_name = "SIZE", conflicts_with_all = ["force", "size", "sparse"])]
        volume_size: Option<String>,
        /// With -V: the volume's volblocksize (as `zfs create -b`).
        #[arg(short = 'b', value_name = "BLOCKSIZE", requires = "volume_size")]
        blocksize: Option<String>,
        /// With -V: sparse (thin), as `zfs create -s`: no `refreservation`, so the volume
        /// may be larger than the pool's free space, and its writes can find the pool full.
        #[arg(short = 's', requires = "volume_size")]
        thin: bool,
        /// Overwrite devices that belong to another pool (an exported or foreign one: never
        /// a device of a pool imported here).
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
        /// Pool property, name=value (repeatable); with -V, the volume's.
        #[arg(short = 'o', value_name = "PROP=VALUE")]
        props: Vec<String>,
        /// Pool name (with -V, POOL/VOL).
        pool: String,
        /// Vdevs: device paths, each group optionally preceded by `mirror`, `raidz` (`raidz1`),
        /// `raidz2` or `raidz3`; then `log [mirror] PATH...` (separate intent-log devices)
        /// and `spare PATH...` (hot spares), as `zpool create`.
        #[arg(required_unless_present = "volume_size", num_args = 1..)]
        vdevs: Vec<String>,
    },
    /// Add devices to a pool: `oxpool add tank log /fast/slog.img` (a separate intent log),
    /// `oxpool add tank mirror c.img d.img` (more space, striped), `oxpool add tank spare
    /// e.img` (hot spares). Works on a served pool.
    Add {
        /// Overwrite devices that belong to another pool (an exported or foreign one: never
        /// a device of a pool imported here).
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
        /// `[mirror|raidz|raidz2|raidz3] PATH...`, `log [mirror] PATH...`, `spare PATH...`.
        #[arg(required = true, num_args = 1..)]
        vdevs: Vec<String>,
    },
    /// Import a pool from its devices.
    Import {
        /// Directory to search for devices (repeatable); default: the cache file's devices.
        #[arg(short = 'd', value_name = "DIR")]
        dirs: Vec<PathBuf>,
        /// Import even if a separate log device is missing: the intent-log records on it
        /// (sync writes of the last seconds before the pool stopped) are lost. `oxpool
        /// remove POOL LOG` then takes the log vdev out.
        #[arg(short = 'm')]
        missing_log: bool,
        /// Pool to import, by name or by the id that `oxpool import` lists (two pools of
        /// one name are told apart by id); without it, list the pools found.
        pool: Option<String>,
        /// Import the pool under this name (as `zpool import pool newpool`): written to its
        /// metadata and every device's labels, so it is found by it from then on.
        new_name: Option<String>,
    },
    /// Export a pool: write everything and forget it. A served pool is refused while NBD
    /// clients have any of its volumes open (as `zpool export` refuses a busy pool), unless
    /// -f; then the server stops serving it.
    Export {
        /// Disconnect the pool's NBD clients first (their requests in flight are answered).
        #[arg(short = 'f', long)]
        force: bool,
        /// Pool name.
        pool: String,
    },
    /// Destroy a pool (clear its devices' labels; refused while NBD clients use a served
    /// pool, unless -f); a volume, `POOL/VOL` (-r: its snapshots too, as `zfs destroy`;
    /// `vol destroy` the same); or snapshots: `POOL/VOL@SNAP`, a list `@A,B`, a range `@A%C`
    /// (refused, with the reason, for a held snapshot, one open by an NBD client, or the
    /// origin of a clone).
    Destroy {
        /// Disconnect the NBD clients of a served pool first; destroy a pool that cannot be
        /// opened (clearing the labels of those of its devices that are found).
        #[arg(short, long)]
        force: bool,
        /// Snapshots and volumes: print what would be destroyed and freed, and change
        /// nothing.
        #[arg(short = 'n')]
        dry_run: bool,
        /// Snapshots and volumes: print what is destroyed and freed.
        #[arg(short = 'v')]
        verbose: bool,
        /// Machine-parsable lines (implies -v), as `zfs destroy -nvp`: `destroy<TAB>NAME`,
        /// `reclaim<TAB>BYTES` (and `defer<TAB>NAME` for what -d marks).
        #[arg(short = 'p')]
        parsable: bool,
        /// Snapshots: destroy those that can go now, and mark those held or cloned to be
        /// destroyed when their last hold is released and their last clone destroyed.
        #[arg(short = 'd')]
        defer: bool,
        /// Snapshots: `POOL@SNAP[,SNAP|%SNAP]` destroys them in every volume that has them
        /// (as `zfs destroy -r`); a volume: with its snapshots.
        #[arg(short = 'r')]
        recursive: bool,
        /// Every dependent too, as `zfs destroy -R`: the clones of the snapshots destroyed
        /// (of a volume: all its snapshots, which go too), each with its own snapshots and
        /// their clones.
        #[arg(short = 'R')]
        dependents: bool,
        /// A pool name, POOL/VOL (-r or -R), POOL/VOL@SNAP[,SNAP|%SNAP] (-R too), -r POOL@SNAP,
        /// or a bookmark POOL/VOL#NAME.
        pool: String,
    },
    /// Take snapshots, all of them in one txg (atomically): each holds every write
    /// answered before the command started (clients flush their own caches first).
    Snapshot {
        /// Recursive: `POOL@SNAP` names SNAP of every volume in the pool (all in the same
        /// txg). A volume has no descendants, so `-r POOL/VOL@SNAP` is that volume's.
        #[arg(short = 'r')]
        recursive: bool,
        /// POOL/VOL@SNAP, or with -r POOL@SNAP (one or more, of one pool).
        #[arg(required = true)]
        names: Vec<String>,
    },
    /// Roll a volume back to a snapshot: its contents become the snapshot's. Refused while
    /// NBD clients have the volume open, unless -f.
    Rollback {
        /// Destroy the snapshots after it first.
        #[arg(short = 'r')]
        recursive: bool,
        /// Disconnect the volume's NBD clients first.
        #[arg(short, long)]
        force: bool,
        /// POOL/VOL@SNAP.
        snapshot: String,
    },
    /// Write a snapshot as a send stream on standard output: full, or the changes since
    /// an earlier snapshot (-i), or every snapshot since it (-I); or, with -t, the rest of
    /// a stream an interrupted `recv -s` stopped in.
    Send {
        /// Resume: the receiver's receive_resume_token. The token names snapshots by guid:
        /// the pool known here that holds its snapshot sends (name it if several do).
        #[arg(short = 't', value_name = "TOKEN", conflicts_with_all = ["incremental", "intermediates"])]
        token: Option<String>,
        /// Incremental from this earlier snapshot of the volume (@BASE), or from a bookmark
        /// of one (#BOOKMARK).
        #[arg(short = 'i', value_name = "@BASE|#BOOKMARK")]
        incremental: Option<String>,
        /// As -i, sending every snapshot in between too, one stream each.
        #[arg(short = 'I', value_name = "@BASE")]
        intermediates: Option<String>,
        /// Print the stream's size and send nothing.
        #[arg(short = 'n')]
        dry_run: bool,
        /// Print the stream's size (on standard error when sending).
        #[arg(short = 'v')]
        verbose: bool,
        /// Lines to parse, as zfs send -nvP prints them (a line a stream: full or
        /// incremental, its base, the snapshot, its bytes; then size and the total; with -t
        /// the size line only); implies -v. -P as zfs spells it (its -p sends properties,
        /// which a volume's stream does not carry).
        #[arg(short = 'p', short_alias = 'P')]
        parsable: bool,
        /// POOL/VOL@SNAP (with -t: the POOL, optional: found by the token's snapshot; or
        /// POOL/VOL, when several volumes of the pool hold the token's snapshot).
        #[arg(required_unless_present = "token")]
        snapshot: Option<String>,
    },
    /// Receive a send stream from standard input into a volume: a full stream makes a new
    /// volume (or with -F replaces one without snapshots), an incremental one goes onto the
    /// volume whose latest snapshot is its base. Each stream is received whole or not at all.
    #[command(alias = "receive")]
    Recv {
        /// Incremental: destroy the target's snapshots after the base and discard its changes
        /// since it. Full: replace the target if it has no snapshots and is no clone (its data
        /// and bookmarks go), as `zfs recv -F`.
        #[arg(short = 'F')]
        force: bool,
        /// If the stream stops early, keep what was received: the target's
        /// receive_resume_token then lets `oxpool send -t` continue it.
        #[arg(short = 's', conflicts_with = "abort")]
        resumable: bool,
        /// Discard the partially received stream that `recv -s` saved for the target.
        #[arg(short = 'A')]
        abort: bool,
        /// Do not export a received new volume over NBD (on a served pool).
        #[arg(short = 'u')]
        no_export: bool,
        /// Dry run, as `zfs recv -n`: read and verify the whole input (every record's
        /// checksum, the first stream against the target, each later one's base against
        /// the stream before it) and change nothing; with -v, say what would be received.
        #[arg(short = 'n', conflicts_with = "abort")]
        dry_run: bool,
        /// Print what was received, on standard output (as zfs recv -v).
        #[arg(short = 'v')]
        verbose: bool,
        /// POOL/VOL; or POOL/VOL@SNAP, naming the snapshot an input of one stream makes.
        target: String,
    },
    /// Rename a volume, a snapshot or a bookmark within its pool (as `zfs rename`; no -r,
    /// -p, -u, -f). A served volume keeps its NBD clients and is offered under the new name.
    Rename {
        /// POOL/VOL, POOL/VOL@SNAP or POOL/VOL#BOOKMARK.
        from: String,
        /// POOL/NEWVOL; for a snapshot POOL/VOL@NEW, @NEW or NEW; for a bookmark
        /// POOL/VOL#NEW, #NEW or NEW.
        to: String,
    },
    /// Create a writable volume sharing every block of a snapshot.
    Clone {
        /// POOL/VOL@SNAP.
        snapshot: String,
        /// POOL/NEW (in the same pool).
        name: String,
        /// Property of the clone, name=value (repeatable).
        #[arg(short = 'o', value_name = "PROP=VALUE")]
        props: Vec<String>,
    },
    /// Offer a volume or snapshot of a served pool over NBD again: one `recv -u` or
    /// `unshare` left unoffered (as `zfs share`). Until the server restarts, which offers
    /// every volume.
    Share {
        /// POOL/VOL or POOL/VOL@SNAP.
        name: String,
    },
    /// Stop offering a volume or snapshot of a served pool over NBD; its data and its
    /// snapshots stay as they are (as `zfs unshare`).
    Unshare {
        /// Disconnect its NBD clients (their requests in flight are answered first).
        #[arg(short = 'f')]
        force: bool,
        /// POOL/VOL or POOL/VOL@SNAP.
        name: String,
    },
    /// Promote a clone: its origin's snapshots up to its origin become its own, and the
    /// origin's volume becomes a clone of it (so that volume can then be destroyed).
    Promote {
        /// POOL/CLONE.
        name: String,
    },
    /// Bookmark a snapshot: an incremental base (`send -i #NAME`) that holds no space, so
    /// the snapshot can be destroyed once replicated.
    Bookmark {
        /// POOL/VOL@SNAP, or a bookmark POOL/VOL#OTHER to copy.
        source: String,
        /// POOL/VOL#NAME, or #NAME.
        bookmark: String,
    },
    /// Place a hold on snapshots: a held snapshot cannot be destroyed.
    Hold {
        /// Recursive, as `zfs hold -r`: `POOL@SNAP` names SNAP of every volume that has it.
        #[arg(short = 'r')]
        recursive: bool,
        /// The hold's tag.
        tag: String,
        /// POOL/VOL@SNAP (one or more), or with -r POOL@SNAP.
        #[arg(required = true)]
        names: Vec<String>,
    },
    /// Release a hold from snapshots.
    Release {
        /// Recursive, as `zfs release -r`: `POOL@SNAP` names SNAP of every volume that has
        /// it.
        #[arg(short = 'r')]
        recursive: bool,
        /// The hold's tag.
        tag: String,
        /// POOL/VOL@SNAP (one or more), or with -r POOL@SNAP.
        #[arg(required = true)]
        names: Vec<String>,
    },
    /// List the holds on snapshots.
    Holds {
        /// Scripted mode: no header, fields separated by one tab.
        #[arg(short = 'H')]
        scripted: bool,
        /// Recursive, as `zfs holds -r`: `POOL@SNAP` names SNAP of every volume that has it.
        #[arg(short = 'r')]
        recursive: bool,
        /// POOL/VOL@SNAP (one or more), or with -r POOL@SNAP.
        #[arg(required = true)]
        names: Vec<String>,
    },
    /// Walk every dataset and snapshot: verify every block's checksum, recompute every space
    /// figure, compare the referenced sectors with the allocator; print leaks, double
    /// references and wrong counters, and exit non-zero on any.
    Audit {
        /// Pool name.
        pool: String,
    },
    /// List pools with their size and health.
    List {
        /// Without the header (how a listing over several servers is assembled).
        #[arg(long, hide = true)]
        no_header: bool,
        /// Scripted mode: no header, fields separated by one tab.
        #[arg(short = 'H')]
        scripted: bool,
        /// Exact numbers (bytes) instead of human sizes.
        #[arg(short = 'p')]
        parsable: bool,
        /// List datasets instead of pools: volume, snapshot or all (comma-separated).
        #[arg(short = 't', value_name = "TYPE")]
        types: Option<String>,
        /// Recursive, as `zfs list -r`: a pool's volumes (with -t, the types named) rather
        /// than the pool. A volume has no descendants: `-r POOL/VOL` is that volume.
        #[arg(short = 'r')]
        recursive: bool,
        /// The columns, comma-separated. Of pools (as `zpool list -o`): name, size, alloc,
        /// free, cap, health, txg. With -t, -r or a dataset named: name, type, used, available,
        /// referenced, logicalreferenced, written, written@SNAP, usedbysnapshots,
        /// usedbydataset, usedbyrefreservation, refreservation, origin, clones, creation,
        /// createtxg, guid, volsize, userrefs.
        #[arg(short = 'o', value_name = "COLUMNS")]
        columns: Option<String>,
        /// Of datasets: sort by this column, ascending (as `zfs list -s`; repeatable, the
        /// first most important; sizes and times as numbers). Sorted within each pool.
        #[arg(short = 's', value_name = "COLUMN")]
        sort_ascending: Vec<String>,
        /// As -s, descending (after every -s in importance).
        #[arg(short = 'S', value_name = "COLUMN")]
        sort_descending: Vec<String>,
        /// Pools (default: every pool the cache file knows), or datasets: POOL/VOL (the
        /// volume; with -t snapshot its snapshots), POOL/VOL@SNAP, POOL/VOL#BOOKMARK.
        pools: Vec<String>,
    },
    /// Read and verify every copy of every block, repairing bad copies from good ones; or
    /// resume a paused scrub. On a served pool the scrub runs in the server's background
    /// (Ctrl-C of `-w` leaves it running); with no server, it runs while a command has the
    /// pool open and continues at the next import (its position is persisted). Refused
    /// during a resilver.
    Scrub {
        /// Wait until the scrub is done (with a progress bar on a terminal).
        #[arg(short = 'w')]
        wait: bool,
        /// Stop the running or paused scrub.
        #[arg(short = 's', conflicts_with = "wait")]
        stop: bool,
        /// Pause the running scrub (persisted); `oxpool scrub POOL` resumes it.
        #[arg(short = 'p', conflicts_with_all = ["wait", "stop"])]
        pause: bool,
        /// Pool name.
        pool: String,
    },
    /// Take a device out of service: it gets no more reads or writes, and the pool runs from
    /// its redundancy. Refused, with the reason, when its vdev could not give back every
    /// block without it. Persisted across export and import, unless -t.
    Offline {
        /// Temporary: until the pool is exported (only on a served pool).
        #[arg(short = 't')]
        temporary: bool,
        /// Pool name.
        pool: String,
        /// The device: its path, its guid in hex, or a file name unique in the pool.
        device: String,
    },
    /// Attach NEW beside DEVICE: a single device becomes a 2-way mirror, a mirror gains a
    /// side. NEW is resilvered (it lacks everything until then). Refused on a raidz column
    /// (raidz expansion is not supported). See docs/devices.md.
    Attach {
        /// Overwrite NEW if it belongs to another pool (not one imported here).
        #[arg(short, long)]
        force: bool,
        /// Wait until NEW is resilvered (with a progress bar on a terminal).
        #[arg(short = 'w')]
        wait: bool,
        /// Pool name.
        pool: String,
        /// The device to attach to.
        device: String,
        /// The new device (an existing file or block device, at least as large).
        new: String,
    },
    /// Detach a side of a mirror, either member of a replacing pair, or a hot spare in use
    /// (it becomes available again). Refused for the last side of a mirror or a device whose
    /// blocks exist nowhere else.
    Detach {
        /// Pool name.
        pool: String,
        /// The device.
        device: String,
    },
    /// Replace OLD with NEW on any vdev (raidz columns too): both are written until NEW is
    /// resilvered, then OLD is detached and its labels cleared. Without NEW, OLD's path
    /// holds a new device (it was swapped).
    Replace {
        /// Overwrite NEW if it belongs to another pool (not one imported here).
        #[arg(short, long)]
        force: bool,
        /// Wait until NEW is resilvered (with a progress bar on a terminal).
        #[arg(short = 'w')]
        wait: bool,
        /// Pool name.
        pool: String,
        /// The device to replace.
        old: String,
        /// The new device (at least as large as OLD).
        new: Option<String>,
    },
    /// Remove a hot spare that is not in use, or a separate log device (a log mirror by its
    /// name, `mirror-N`): its log blocks are moved off first, and the pool serves
    /// throughout. Data vdevs cannot be removed.
    Remove {
        /// Pool name.
        pool: String,
        /// The spare or the log device.
        device: String,
    },
    /// Return a device to service from OFFLINE, FAULTED or REMOVED. What was written without
    /// it, it lacks (`oxpool status` says so) until the resilver this starts has written it.
    Online {
        /// Wait until the resilver is done (with a progress bar on a terminal).
        #[arg(short = 'w')]
        wait: bool,
        /// Pool name.
        pool: String,
        /// The device.
        device: String,
    },
    /// Forget a pool's device errors: zero the READ, WRITE and CKSUM counts, end DEGRADED,
    /// and return FAULTED and REMOVED devices to service (OFFLINE ones stay offline).
    Clear {
        /// Pool name.
        pool: String,
        /// Only this device.
        device: Option<String>,
    },
    /// Inject faults into a pool's device I/O, for testing (as ZFS's zinject; see
    /// docs/inject.md): `oxpool inject -d DEV -e io -T read POOL` (read errors), `-T write`,
    /// `-e corrupt` (reads return damaged data), `-D MS` (added latency), `-f PERCENT`.
    /// Without -d, lists the rules (of POOL, or of every pool); `-c ID|all` clears. On a
    /// served pool the rule acts at once; an exported pool's rules act when it is next
    /// opened. Rules stay until cleared.
    Inject {
        /// The device: its path, its guid in hex, or a file name unique in the pool.
        #[arg(short = 'd', value_name = "DEVICE")]
        device: Option<String>,
        /// Errors: `io` (the I/O fails, EIO) or `corrupt` (a read returns damaged bytes).
        #[arg(short = 'e', value_name = "io|corrupt", requires = "device")]
        error: Option<String>,
        /// Added latency instead: each I/O completes this many milliseconds later.
        #[arg(
            short = 'D',
            value_name = "MS",
            requires = "device",
            conflicts_with = "error"
        )]
        delay_ms: Option<u32>,
        /// Which I/Os: read, write, flush or all (default: all; read for corrupt).
        #[arg(short = 'T', value_name = "TYPE", requires = "device")]
        ops: Option<String>,
        /// Percentage of those I/Os hit (default 100; fractions allowed, e.g. 0.5).
        #[arg(short = 'f', value_name = "PERCENT", requires = "device")]
        frequency: Option<f64>,
        /// Clear rule ID, or all rules.
        #[arg(short = 'c', value_name = "ID|all", conflicts_with = "device")]
        clear: Option<String>,
        /// Without the header (how a listing over several pools is assembled).
        #[arg(long, hide = true)]
        no_header: bool,
        /// Pool name (required to add a rule).
        pool: Option<String>,
    },
    /// Write what is dirty in pools to their devices now, as `zpool sync`: a txg sync of
    /// each, so every write answered before it is in the pool proper, not only in its intent
    /// log. Works on a served pool. Without POOL, every pool.
    Sync {
        /// Pools (default: all).
        pools: Vec<String>,
    },
    /// Show the commands that changed pools, oldest first, as `zpool history`: each with
    /// when it ended (local time). The pool keeps them (they move with it to another host):
    /// its first records, from its creation, for good, and about the latest 2,000. Without
    /// POOL, every pool. No `-i`: oxpool records no internal events (`-l` shows each
    /// record's txg).
    History {
        /// Long format: also the user, the host and the txg that wrote each record.
        #[arg(short = 'l')]
        long: bool,
        /// Pools (default: all).
        pools: Vec<String>,
    },
    /// Show pools' vdev trees with states and error counts, and their latest scrub.
    Status {
        /// Also list the damaged data: which ranges of which volumes have a block no copy
        /// could give back.
        #[arg(short = 'v')]
        verbose: bool,
        /// Only pools that are not healthy: not ONLINE, with device errors, damaged data, a
        /// resilver or an unavailable spare ("all pools are healthy" if none), as
        /// `zpool status -x`.
        #[arg(short = 'x')]
        unhealthy: bool,
        /// Full device paths, as `zpool status -P`: accepted for scripts written for it;
        /// devices are always shown by their whole path.
        #[arg(short = 'P')]
        full_paths: bool,
        /// Pools (default: all).
        pools: Vec<String>,
    },
    /// Volumes: create, list, destroy, read, write.
    Vol {
        #[command(subcommand)]
        command: VolCommand,
    },
    /// Read properties: `oxpool get volsize tank/vol0 tank/vol1`, `oxpool get all tank`,
    /// `oxpool get scheduler tank /dev/sdb` (a device's), `oxpool get written@monday
    /// tank/vol0` (bytes written since snapshot monday; also of a later snapshot
    /// `tank/vol0@friday`, or since a snapshot of a clone's origin, `written@vol0@monday`).
    Get {
        /// Exact values: sizes in bytes, times in seconds since the epoch (as `zfs get -p`).
        #[arg(short = 'p')]
        parsable: bool,
        /// Scripted: no header, fields separated by one tab.
        #[arg(short = 'H')]
        scripted: bool,
        /// Fields to show, comma-separated, in order: `name`, `property`, `value`, `source`
        /// (`default`, `local`, or `-` for a statistic); or `all` (as `zfs get -o`; `-H -o
        /// value` gives bare values).
        #[arg(short = 'o', value_name = "FIELDS")]
        fields: Option<String>,
        /// Only properties whose SOURCE is one of these, comma-separated: `local`, `default`,
        /// `none` (a statistic's `-`); also `inherited`, `temporary`, `received`, which no
        /// property here has (as `zfs get -s`).
        #[arg(short = 's', value_name = "SOURCES")]
        sources: Option<String>,
        /// A POOL named stands for its volumes (as `zfs get -r` of a pool's datasets; the
        /// pool's own properties are read without -r).
        #[arg(short = 'r')]
        recursive: bool,
        /// Property names, comma-separated (`used,referenced`), or `all`.
        prop: String,
        /// POOL or POOL/VOL.
        target: String,
        /// More volumes or snapshots of the same pool; or, after a POOL, one of its devices
        /// (its path): read the device's property.
        more: Vec<String>,
    },
    /// Return a property to its default: `oxpool inherit compression tank/vol0 tank/vol1`
    /// (as `zfs inherit`: a volume's property then reads `default`), `oxpool inherit -r
    /// compression tank` (every volume of the pool), `oxpool inherit scheduler tank
    /// /dev/sdb` (a device follows its pool's value again). `volsize` and
    /// `volblocksize` are the volume's own and cannot be inherited.
    Inherit {
        /// Recursive, as `zfs inherit -r`: a pool named stands for every volume in it
        /// (a volume has no descendants: `-r POOL/VOL` is that volume).
        #[arg(short = 'r')]
        recursive: bool,
        /// The property.
        prop: String,
        /// POOL/VOL (one or more, of one pool); or POOL and one of its devices (its path).
        #[arg(required = true)]
        targets: Vec<String>,
    },
    /// Set properties: `oxpool set sync=always tank/vol0`, `oxpool set sync=always
    /// compression=zstd tank/vol0` (all or none), `oxpool set scheduler=off tank` (every
    /// device), `oxpool set scheduler=on tank /dev/sdb` (one device; `inherit` to follow the
    /// pool's again).
    Set {
        /// PROP=VALUE... then POOL or POOL/VOL, then (for a device's property) the device of
        /// POOL (its path).
        #[arg(value_name = "PROP=VALUE... TARGET [DEVICE]", num_args = 2.., required = true)]
        words: Vec<String>,
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
    Serve(ServeArgs),
    /// Send streams: `oxpool stream dump < stream` (as `zstream`).
    Stream {
        #[command(subcommand)]
        command: StreamCommand,
    },
}

#[derive(Subcommand)]
pub enum StreamCommand {
    /// Print a send stream's records, one line each, and its totals (as `zstream dump`); a
    /// damaged or truncated stream is an error that says at which byte.
    Dump {
        /// The stream file; standard input without it (or with `-`).
        file: Option<PathBuf>,
    },
}

#[derive(Subcommand)]
pub enum VolCommand {
    /// Create a volume: thin (no `refreservation`) unless `-o refreservation=auto` or a
    /// size; `oxpool create -V` reserves by default, as `zfs create -V`.
    Create {
        /// POOL/VOL.
        name: String,
        /// Volume size (e.g. 1G).
        #[arg(short = 'V', long, value_name = "SIZE")]
        size: String,
        /// The volume's volblocksize (as `zfs create -b`; also `-o volblocksize=`).
        #[arg(short = 'b', value_name = "BLOCKSIZE")]
        blocksize: Option<String>,
        /// Thin, as `zfs create -s`: what `vol create` makes anyway (accepted for a ZFS
        /// user's habit).
        #[arg(short = 's')]
        thin: bool,
        /// Volume property, name=value (repeatable), e.g. volblocksize=4K.
        #[arg(short = 'o', value_name = "PROP=VALUE")]
        props: Vec<String>,
    },
    /// List volumes.
    List {
        /// Without the header (how a listing over several servers is assembled).
        #[arg(long, hide = true)]
        no_header: bool,
        /// Scripted mode: no header, fields separated by one tab.
        #[arg(short = 'H')]
        scripted: bool,
        /// Exact numbers (bytes) instead of human sizes.
        #[arg(short = 'p')]
        parsable: bool,
        /// Only these pools' (default: every pool the cache file knows).
        pools: Vec<String>,
    },
    /// Destroy a volume. Refused while NBD clients have it open, unless -f, and while it
    /// has snapshots, unless -r.
    Destroy {
        /// Disconnect the volume's NBD clients first.
        #[arg(short, long)]
        force: bool,
        /// Destroy its snapshots first.
        #[arg(short = 'r')]
        recursive: bool,
        /// Print what would be destroyed and freed, and change nothing.
        #[arg(short = 'n')]
        dry_run: bool,
        /// Print what is destroyed and freed.
        #[arg(short = 'v')]
        verbose: bool,
        /// Machine-parsable lines (implies -v), as `zfs destroy -nvp`: `destroy<TAB>NAME`,
        /// `reclaim<TAB>BYTES`.
        #[arg(short = 'p')]
        parsable: bool,
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
