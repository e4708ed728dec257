//! `oxpool send | oxpool recv` for real: two processes joined by a pipe, between two pools
//! opened by the commands themselves, then with both pools served (the streams go through
//! the control socket), where the received volume and its snapshots are exported at once and
//! `qemu-img compare` reads them over NBD. `send -n -v -p` is the stream's exact size; a
//! wrong base is refused with one line; the pools audit clean.

#[path = "nbd/harness.rs"]
mod harness;

use harness::{exports, hold_reading, put, random_bytes, release, tcp_uri, Env, ServerProcess};
use std::process::{Command, Stdio};

/// Runs `oxpool SEND_ARGS | oxpool RECV_ARGS`; returns (send ok, recv ok, recv stderr).
fn pipe(env: &Env, send: &[&str], recv: &[&str]) -> (bool, bool, String) {
    let (sent, got, _, err) = pipe_out(env, send, recv);
    (sent, got, err)
}

/// As [`pipe`], with the receiver's standard output before its standard error.
fn pipe_out(env: &Env, send: &[&str], recv: &[&str]) -> (bool, bool, String, String) {
    let mut sender = env.oxpool_command();
    sender
        .args(send)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut sender = sender.spawn().expect("run oxpool send");
    let receiver = {
        // The command holds the pipe's read end until dropped: a receiver that stops early
        // must leave the sender a broken pipe, not a reader that never reads.
        let mut command = env.oxpool_command();
        command
            .args(recv)
            .stdin(Stdio::from(sender.stdout.take().unwrap()))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        command.spawn().expect("run oxpool recv")
    };
    let got = receiver.wait_with_output().unwrap();
    let sent = sender.wait_with_output().unwrap();
    (
        sent.status.success(),
        got.status.success(),
        String::from_utf8_lossy(&got.stdout).into_owned(),
        String::from_utf8_lossy(&got.stderr).into_owned(),
    )
}

/// `qemu-img compare` of `server`'s export `export` with the raw file `file`: identical bytes.
fn same_bytes(server: &ServerProcess, export: &str, file: &std::path::Path) -> bool {
    Command::new("qemu-img")
        .args(["compare", "-f", "raw", "-F", "raw"])
        .arg(tcp_uri(server, export))
        .arg(file)
        .status()
        .expect("run qemu-img compare")
        .success()
}

fn write(env: &Env, vol: &str, at: u64, seed: u64, len: usize) {
    let path = env.path(&format!("w{seed}.raw"));
    std::fs::write(&path, random_bytes(seed, len)).unwrap();
    env.ok(&[
        "vol",
        "write",
        vol,
        "--offset",
        &at.to_string(),
        path.to_str().unwrap(),
    ]);
}

fn read(env: &Env, vol: &str) -> Vec<u8> {
    let path = env.path("read.raw");
    env.ok(&["vol", "read", vol, path.to_str().unwrap()]);
    std::fs::read(&path).unwrap()
}

fn second_pool(env: &Env) {
    let file = env.path("dest.img");
    env.ok(&[
        "create",
        "dest",
        file.to_str().unwrap(),
        "--size",
        "1G",
        "--sparse",
    ]);
}

#[test]
fn send_piped_into_recv_between_pools() {
    let env = Env::new();
    env.tank(&[("vol0", "8M", &["compression=lz4"])]);
    second_pool(&env);
    write(&env, "tank/vol0", 0, 1, 8 << 20);
    env.ok(&["snapshot", "tank/vol0@one"]);
    let one = read(&env, "tank/vol0");
    let (s, r, err) = pipe(&env, &["send", "tank/vol0@one"], &["recv", "dest/copy"]);
    assert!(s && r, "full send | recv failed: {err}");
    assert_eq!(read(&env, "dest/copy"), one);
    // An incremental: overwrites and a trim.
    write(&env, "tank/vol0", 3 << 20, 2, 100_000);
    env.ok(&["snapshot", "tank/vol0@two"]);
    write(&env, "tank/vol0", 5 << 20, 3, 1 << 20);
    env.ok(&["snapshot", "tank/vol0@three"]);
    let three = read(&env, "tank/vol0");
    // -n -v -p: the exact size of what send writes.
    let estimate = env.ok(&["send", "-n", "-v", "-p", "-I", "@one", "tank/vol0@three"]);
    let stream = env.path("stream");
    let mut cmd = env.oxpool_command();
    cmd.args(["send", "-I", "@one", "tank/vol0@three"])
        .stdout(std::fs::File::create(&stream).unwrap());
    assert!(cmd.status().unwrap().success());
    let bytes = std::fs::metadata(&stream).unwrap().len();
    // In `zfs send -nvP`'s form: a line a stream, each from the one before, then the total.
    let lines: Vec<Vec<&str>> = estimate.lines().map(|l| l.split('\t').collect()).collect();
    assert_eq!(lines.len(), 3, "{estimate}");
    assert_eq!(
        lines[0][..3],
        ["incremental", "one", "tank/vol0@two"],
        "{estimate}"
    );
    assert_eq!(
        lines[1][..3],
        ["incremental", "two", "tank/vol0@three"],
        "{estimate}"
    );
    assert_eq!(lines[2], ["size", bytes.to_string().as_str()], "{estimate}");
    let legs: u64 = lines[..2]
        .iter()
        .map(|l| l[3].parse::<u64>().unwrap())
        .sum();
    assert_eq!(legs, bytes, "{estimate}");
    // A full stream's line, with -P as zfs spells the flag.
    let full = env.ok(&["send", "-n", "-v", "-P", "tank/vol0@one"]);
    let mut cmd = env.oxpool_command();
    cmd.args(["send", "tank/vol0@one"])
        .stdout(std::fs::File::create(&stream).unwrap());
    assert!(cmd.status().unwrap().success());
    let full_bytes = std::fs::metadata(&stream).unwrap().len();
    assert_eq!(
        full,
        format!("full\ttank/vol0@one\t{full_bytes}\nsize\t{full_bytes}\n"),
    );
    // -P alone, sending: the lines on standard error (standard output carries the stream).
    let out = env.run(&["send", "-P", "tank/vol0@one"]);
    assert!(out.status.success());
    assert_eq!(out.stdout.len() as u64, full_bytes);
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        format!("full\ttank/vol0@one\t{full_bytes}\nsize\t{full_bytes}\n")
    );
    // -i's base by its whole name, as zfs gives it; -n -P implies -v.
    let inc = env.ok(&["send", "-n", "-P", "-i", "@one", "tank/vol0@two"]);
    assert!(
        inc.starts_with("incremental\ttank/vol0@one\ttank/vol0@two\t") && inc.contains("\nsize\t"),
        "{inc}"
    );
    let mut cmd = env.oxpool_command();
    cmd.args(["send", "-I", "@one", "tank/vol0@three"])
        .stdout(std::fs::File::create(&stream).unwrap());
    assert!(cmd.status().unwrap().success());
    let dump = env.ok(&["stream", "dump", stream.to_str().unwrap()]);
    assert!(dump.contains("tank/vol0@two"), "{dump}");
    // Human sizes under 1K carry their unit, as `zfs send -nv` prints them.
    env.ok(&["snapshot", "tank/vol0@same"]);
    let estimate = env.ok(&["send", "-n", "-v", "-i", "@three", "tank/vol0@same"]);
    let total = estimate
        .lines()
        .find_map(|l| l.strip_prefix("total estimated size is "))
        .unwrap_or_else(|| panic!("{estimate}"));
    assert!(
        total.ends_with('B') && total[..total.len() - 1].parse::<u64>().is_ok(),
        "{estimate}"
    );
    env.ok(&["destroy", "tank/vol0@same"]);
    // The wrong base: @two..@three onto a copy whose latest is @one.
    let (_, r, err) = pipe(
        &env,
        &["send", "-i", "@two", "tank/vol0@three"],
        &["recv", "dest/copy"],
    );
    assert!(!r, "a stream for the wrong base was received");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(err.contains("base guid"), "{err}");
    assert_eq!(
        read(&env, "dest/copy"),
        one,
        "the refused stream changed it"
    );
    let (s, r, said, err) = pipe_out(
        &env,
        &["send", "-I", "@one", "tank/vol0@three"],
        &["recv", "-v", "dest/copy"],
    );
    assert!(s && r, "send -I | recv failed: {err}");
    // On standard output, as `zfs recv -v` says it.
    assert!(said.contains("received dest/copy@three"), "{said}");
    assert_eq!(read(&env, "dest/copy"), three);
    let list = env.ok(&["list", "-t", "snapshot", "-H"]);
    for s in ["one", "two", "three"] {
        assert!(list.contains(&format!("dest/copy@{s}")), "{list}");
    }
    // POOL/VOL@SNAP names the snapshot a stream makes, as `zfs recv` takes it.
    let (s, r, err) = pipe(
        &env,
        &["send", "tank/vol0@one"],
        &["recv", "dest/named@first"],
    );
    assert!(s && r, "recv into POOL/VOL@SNAP failed: {err}");
    assert_eq!(read(&env, "dest/named"), one);
    let (s, r, said, err) = pipe_out(
        &env,
        &["send", "-i", "@one", "tank/vol0@two"],
        &["recv", "-v", "dest/named@second"],
    );
    assert!(s && r, "{err}");
    assert!(
        said.contains("received dest/named@second (incremental stream of tank/vol0@two"),
        "{said}"
    );
    let names = env.ok(&[
        "list",
        "-t",
        "snapshot",
        "-H",
        "-o",
        "name",
        "-r",
        "dest/named",
    ]);
    assert_eq!(names, "dest/named@first\ndest/named@second\n");
    // An input of two streams: the first is received under the name, the second refused.
    let (s, r, err) = pipe(&env, &["send", "tank/vol0@one"], &["recv", "dest/m"]);
    assert!(s && r, "{err}");
    let (_, r, err) = pipe(
        &env,
        &["send", "-I", "@one", "tank/vol0@three"],
        &["recv", "dest/m@again"],
    );
    assert!(!r, "two streams received under one name");
    assert!(err.contains("more than one stream"), "{err}");
    assert!(
        err.contains("1 received before it, up to dest/m@again")
            && err.contains(
                "the first was received as @again; send the rest as an incremental from \
                 tank/vol0@two"
            ),
        "{err}"
    );
    let names = env.ok(&["list", "-t", "snapshot", "-H", "-o", "name", "-r", "dest/m"]);
    assert_eq!(names, "dest/m@one\ndest/m@again\n");
    // What the error says to do works.
    let (s, r, err) = pipe(
        &env,
        &["send", "-i", "@two", "tank/vol0@three"],
        &["recv", "dest/m"],
    );
    assert!(s && r, "{err}");
    assert_eq!(read(&env, "dest/m"), three);
    let e = env.fails(&["recv", "dest/named@"]);
    assert!(e.contains("POOL/VOL@SNAP"), "{e}");
    for pool in ["tank", "dest"] {
        env.ok(&["audit", pool]);
    }
}

#[test]
fn recv_into_a_served_pool_exports_what_it_received() {
    let env = Env::new();
    env.tank(&[("vol0", "8M", &[])]);
    second_pool(&env);
    let server = env.serve(&["--listen", "127.0.0.1:0"]);
    let first = env.path("first.raw");
    std::fs::write(&first, random_bytes(7, 8 << 20)).unwrap();
    put(&first, &tcp_uri(&server, "tank/vol0"));
    env.ok(&["snapshot", "tank/vol0@one"]);
    // Both pools are served: each command runs in the server, the stream through its
    // control socket.
    let (s, r, err) = pipe(&env, &["send", "tank/vol0@one"], &["recv", "dest/copy"]);
    assert!(s && r, "send | recv on served pools failed: {err}");
    let listed = exports(&server);
    assert!(
        listed.contains("dest/copy") && listed.contains("dest/copy@one"),
        "{listed}"
    );
    let same = |export: &str, file: &std::path::Path| same_bytes(&server, export, file);
    assert!(same("dest/copy", &first), "the received volume differs");
    // A stream is refused a terminal on a served pool too (the server writes to its control
    // socket, so only the client can tell): run on a pseudo-terminal by `script`.
    let line = format!(
        "'{}' --cache-file '{}' send tank/vol0@one",
        env!("CARGO_BIN_EXE_oxpool"),
        env.path("pools.cache").display()
    );
    let on_tty = Command::new("script")
        .args(["-qec", &line, "/dev/null"])
        .output()
        .expect("run script (util-linux)");
    let shown = String::from_utf8_lossy(&on_tty.stdout);
    assert!(
        !on_tty.status.success() && shown.contains("cannot be written to a terminal"),
        "{shown}"
    );
    assert!(on_tty.stdout.len() < 1000, "a stream reached the terminal");
    assert!(
        same("dest/copy@one", &first),
        "the received snapshot differs"
    );
    // An incremental onto the served copy (no client has it open).
    let second = env.path("second.raw");
    let mut bytes = std::fs::read(&first).unwrap();
    bytes[1 << 20..3 << 20].copy_from_slice(&random_bytes(8, 2 << 20));
    std::fs::write(&second, &bytes).unwrap();
    put(&second, &tcp_uri(&server, "tank/vol0"));
    env.ok(&["snapshot", "tank/vol0@two"]);
    let (s, r, err) = pipe(
        &env,
        &["send", "-i", "@one", "tank/vol0@two"],
        &["recv", "dest/copy"],
    );
    assert!(s && r, "incremental on served pools failed: {err}");
    assert!(exports(&server).contains("dest/copy@two"));
    assert!(same("dest/copy", &second));
    assert!(same("dest/copy@two", &second));
    assert!(same("dest/copy@one", &first));
    // -F onto a target with a later snapshot that a client has open: refused in one line,
    // as `destroy` of that snapshot would be; the exports stay. Once the client is gone, -F
    // destroys it, and the snapshots it keeps are exported again.
    env.ok(&["snapshot", "dest/copy@local"]);
    let third = env.path("third.raw");
    bytes[5 << 20..6 << 20].copy_from_slice(&random_bytes(9, 1 << 20));
    std::fs::write(&third, &bytes).unwrap();
    put(&third, &tcp_uri(&server, "tank/vol0"));
    env.ok(&["snapshot", "tank/vol0@three"]);
    let client = hold_reading(&tcp_uri(&server, "dest/copy@local"));
    let incremental = ["send", "-i", "@two", "tank/vol0@three"];
    // (The send may fail too: its pipe closes when the receive refuses.)
    let (_, r, err) = pipe(&env, &incremental, &["recv", "-F", "dest/copy"]);
    assert!(!r, "recv -F destroyed a snapshot a client had open");
    assert!(
        err.contains("dest/copy@local") && err.contains("open by 1 NBD client"),
        "{err}"
    );
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    let listed = exports(&server);
    for export in [
        "dest/copy",
        "dest/copy@one",
        "dest/copy@two",
        "dest/copy@local",
    ] {
        assert!(
            listed.contains(&format!("export=\"{export}\"")),
            "{export}: {listed}"
        );
    }
    assert!(same("dest/copy", &second));
    let said = release(client);
    assert!(!said.starts_with("disconnected"), "{said}");
    // A client on the base, which -F keeps, neither blocks it nor is disconnected.
    let on_base = hold_reading(&tcp_uri(&server, "dest/copy@two"));
    let (s, r, err) = pipe(&env, &incremental, &["recv", "-F", "dest/copy"]);
    assert!(s && r, "recv -F failed: {err}");
    let said = release(on_base);
    assert!(!said.starts_with("disconnected"), "{said}");
    let listed = exports(&server);
    for export in [
        "dest/copy",
        "dest/copy@one",
        "dest/copy@two",
        "dest/copy@three",
    ] {
        assert!(
            listed.contains(&format!("export=\"{export}\"")),
            "{export}: {listed}"
        );
    }
    assert!(!listed.contains("dest/copy@local"), "{listed}");
    assert!(same("dest/copy@three", &third));
    assert!(same("dest/copy@one", &first));
    // -u: a new volume received but not exported.
    let (s, r, err) = pipe(
        &env,
        &["send", "tank/vol0@one"],
        &["recv", "-u", "dest/quiet"],
    );
    assert!(s && r, "recv -u failed: {err}");
    let listed = exports(&server);
    assert!(
        !listed.contains("dest/quiet\n") && !listed.contains("export=\"dest/quiet\""),
        "{listed}"
    );
    // An incremental into it leaves it as it was: not exported, nor its new snapshot.
    let (s, r, err) = pipe(
        &env,
        &["send", "-i", "@one", "tank/vol0@two"],
        &["recv", "dest/quiet"],
    );
    assert!(
        s && r,
        "incremental into the unexported volume failed: {err}"
    );
    let listed = exports(&server);
    assert!(!listed.contains("\"dest/quiet"), "{listed}");
    let snapshots = env.ok(&["list", "-t", "snapshot", "-H", "-o", "name"]);
    assert!(snapshots.contains("dest/quiet@two\n"), "{snapshots}");
    // Its own snapshots and a rollback leave it so too.
    env.ok(&["snapshot", "dest/quiet@mine"]);
    env.ok(&["rollback", "dest/quiet@mine"]);
    let listed = exports(&server);
    assert!(!listed.contains("\"dest/quiet"), "{listed}");
    // `share` offers it (and one of its snapshots) by hand, with its data, as `zfs share`.
    env.ok(&["share", "dest/quiet"]);
    env.ok(&["share", "dest/quiet@two"]);
    let listed = exports(&server);
    assert!(
        listed.contains("export=\"dest/quiet\"") && listed.contains("export=\"dest/quiet@two\""),
        "{listed}"
    );
    assert!(!listed.contains("\"dest/quiet@mine"), "{listed}");
    assert!(same("dest/quiet", &second) && same("dest/quiet@two", &second));
    let e = env.fails(&["share", "dest/quiet"]);
    assert!(e.contains("shared already"), "{e}");
    let e = env.fails(&["share", "dest/nosuch"]);
    assert!(e.contains("not found"), "{e}");
    // `unshare` is refused while a client has it open, `-f` disconnects the client; the
    // volume's data and snapshots stay.
    let client = hold_reading(&tcp_uri(&server, "dest/quiet"));
    let e = env.fails(&["unshare", "dest/quiet"]);
    assert!(e.contains("unshare -f"), "{e}");
    assert!(exports(&server).contains("export=\"dest/quiet\""));
    env.ok(&["unshare", "-f", "dest/quiet"]);
    let said = release(client);
    assert!(said.starts_with("disconnected"), "{said}");
    env.ok(&["unshare", "dest/quiet@two"]);
    let listed = exports(&server);
    assert!(!listed.contains("\"dest/quiet"), "{listed}");
    let e = env.fails(&["unshare", "dest/quiet"]);
    assert!(e.contains("not shared"), "{e}");
    let snapshots = env.ok(&["list", "-t", "snapshot", "-H", "-o", "name"]);
    assert!(snapshots.contains("dest/quiet@two\n"), "{snapshots}");
    let (ok, out) = server.stop();
    assert!(ok.success(), "{out}");
    for pool in ["tank", "dest"] {
        env.ok(&["audit", pool]);
    }
}

/// Bookmarks from the command line: `oxpool bookmark`, `list -t bookmark`, an incremental
/// `send -i #BOOKMARK` after the bookmarked snapshot is destroyed, `destroy POOL/VOL#NAME`;
/// bad requests get one line and change nothing.
#[test]
fn bookmarks_replace_replicated_snapshots_as_incremental_bases() {
    let env = Env::new();
    env.tank(&[("vol0", "8M", &[])]);
    second_pool(&env);
    write(&env, "tank/vol0", 0, 1, 4 << 20);
    env.ok(&["snapshot", "tank/vol0@one"]);
    let (s, r, err) = pipe(&env, &["send", "tank/vol0@one"], &["recv", "dest/copy"]);
    assert!(s && r, "full send | recv failed: {err}");
    env.ok(&["bookmark", "tank/vol0@one", "tank/vol0#one"]);
    env.ok(&["bookmark", "tank/vol0#one", "#copied"]);
    let list = env.ok(&["list", "-t", "bookmark", "-H", "-o", "name,type,guid"]);
    let snaps = env.ok(&["list", "-t", "snapshot", "-H", "-o", "name,guid"]);
    let guid = snaps.split_whitespace().nth(1).unwrap().to_string();
    // Both of @one's txg: by name within it. Each has @one's guid.
    assert_eq!(
        list,
        format!("tank/vol0#copied\tbookmark\t{guid}\ntank/vol0#one\tbookmark\t{guid}\n"),
    );
    // The replicated snapshot goes; the bookmark is the base from now on.
    env.ok(&["destroy", "tank/vol0@one"]);
    write(&env, "tank/vol0", 6 << 20, 2, 1 << 20);
    env.ok(&["snapshot", "tank/vol0@two"]);
    let two = read(&env, "tank/vol0");
    let estimate = env.ok(&["send", "-n", "-v", "-i", "#one", "tank/vol0@two"]);
    assert!(estimate.contains("incremental from #one"), "{estimate}");
    let (s, r, err) = pipe(
        &env,
        &["send", "-i", "tank/vol0#one", "tank/vol0@two"],
        &["recv", "dest/copy"],
    );
    assert!(s && r, "send -i #one | recv failed: {err}");
    assert_eq!(read(&env, "dest/copy"), two);
    // Refusals, one line each.
    for args in [
        &["bookmark", "tank/vol0@nope", "tank/vol0#x"][..],
        &["bookmark", "tank/vol0@two", "tank/vol0#one"],
        &["bookmark", "tank/vol0@two", "dest/copy#x"],
        &["destroy", "tank/vol0#nope"],
        &["send", "-I", "#one", "tank/vol0@two"],
    ] {
        let err = env.fails(args);
        assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: {err}");
    }
    env.ok(&["destroy", "tank/vol0#one"]);
    let list = env.ok(&["list", "-t", "bookmark", "-H", "-o", "name"]);
    assert_eq!(list, "tank/vol0#copied\n");
    for pool in ["tank", "dest"] {
        env.ok(&["audit", pool]);
    }
}

/// `send -t TOKEN` without a pool, as `zfs send -t`: of several pools known, the one holding
/// the token's snapshot sends, read here or asked of the server serving it; when several or
/// none hold it, one line says so.
#[test]
fn send_t_finds_the_pool_holding_the_tokens_snapshot() {
    let env = Env::new();
    env.tank(&[("vol0", "8M", &[])]);
    second_pool(&env);
    write(&env, "tank/vol0", 0, 5, 8 << 20);
    env.ok(&["snapshot", "tank/vol0@one"]);
    // A cut stream received with -s into the other pool: its token.
    let cut_into_copy = |send: &[&str]| -> String {
        let out = env.run(send);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let cut = env.path("cut.stream");
        std::fs::write(&cut, &out.stdout[..out.stdout.len() / 2]).unwrap();
        let mut recv = env.oxpool_command();
        recv.args(["recv", "-s", "dest/copy"])
            .stdin(std::fs::File::open(&cut).unwrap());
        assert!(!recv.output().unwrap().status.success());
        let args = [
            "get",
            "-H",
            "-o",
            "value",
            "receive_resume_token",
            "dest/copy",
        ];
        let token = env.ok(&args).trim().to_string();
        assert!(token.starts_with("oxp1-"), "{token}");
        token
    };
    // The rest, sent with `from` named after the token (none: no pool named), received
    // into the copy.
    let resume = |token: &str, from: &[&str]| {
        let rest = env.run(&[&["send", "-t", token], from].concat());
        assert!(
            rest.status.success(),
            "{}",
            String::from_utf8_lossy(&rest.stderr)
        );
        let file = env.path("rest.stream");
        std::fs::write(&file, &rest.stdout).unwrap();
        let mut recv = env.oxpool_command();
        recv.args(["recv", "-s", "dest/copy"])
            .stdin(std::fs::File::open(&file).unwrap());
        let done = recv.output().unwrap();
        assert!(
            done.status.success(),
            "{}",
            String::from_utf8_lossy(&done.stderr)
        );
    };
    // Neither pool served: each is read here, while the receiving end of the pipeline opens
    // one of them (it waits for the search to let go of it).
    let token = cut_into_copy(&["send", "tank/vol0@one"]);
    let (s, r, err) = pipe(&env, &["send", "-t", &token], &["recv", "-s", "dest/copy"]);
    assert!(s && r, "send -t | recv -s failed: {err}");
    assert!(read(&env, "dest/copy") == read(&env, "tank/vol0"));
    let e = env.fails(&["send", "-t", &token, "tank/vol0@one"]);
    assert!(e.contains("name only the pool or volume"), "{e}");
    // Now both pools hold @one (a received snapshot keeps its guid): the pool must be named.
    let e = env.fails(&["send", "-t", &token]);
    assert!(
        e.contains("several pools hold") && e.contains("dest, tank"),
        "{e}"
    );
    // Both served: each server is asked, and the one holding @two sends.
    let server = env.serve(&["--listen", "127.0.0.1:0"]);
    write(&env, "tank/vol0", 1 << 20, 6, 2 << 20);
    env.ok(&["snapshot", "tank/vol0@two"]);
    let token = cut_into_copy(&["send", "-i", "@one", "tank/vol0@two"]);
    resume(&token, &[]);
    assert!(read(&env, "dest/copy") == read(&env, "tank/vol0"));
    // A token whose snapshot no pool holds any more.
    env.ok(&["destroy", "tank/vol0@two"]);
    env.ok(&["destroy", "dest/copy@two"]);
    let e = env.fails(&["send", "-t", &token]);
    assert!(
        e.contains("no pool known here (dest, tank) holds the token's snapshot"),
        "{e}"
    );
    // A copy of vol0 within tank keeps @one's guid: a token for @one then needs the volume
    // named, which the served pool takes as it takes the pool.
    let (s, r, err) = pipe(&env, &["send", "tank/vol0@one"], &["recv", "tank/dup"]);
    assert!(s && r, "send | recv within tank failed: {err}");
    env.ok(&["vol", "destroy", "-r", "dest/copy"]);
    let token = cut_into_copy(&["send", "tank/vol0@one"]);
    let e = env.fails(&["send", "-t", &token]);
    assert!(
        e.contains("volumes tank/dup, tank/vol0 each hold a snapshot with the token's guid")
            && e.contains("oxpool send -t TOKEN tank/dup"),
        "{e}"
    );
    let e = env.fails(&["send", "-t", &token, "tank/vol0@one"]);
    assert!(e.contains("name only the pool or volume"), "{e}");
    resume(&token, &["tank/vol0"]);
    // vol0 has changed since @one; dup is @one.
    assert!(read(&env, "dest/copy") == read(&env, "tank/dup"));
    let (ok, out) = server.stop();
    assert!(ok.success(), "{out}");
    for pool in ["tank", "dest"] {
        env.ok(&["audit", pool]);
    }
}

/// `recv -s` of a cut stream saves a partial receive: `get receive_resume_token` shows it,
/// a plain `recv` is refused while it is there, `send -t` continues it (the pool found
/// without being named), `recv -A` discards one; a damaged token is refused in one line.
#[test]
fn recv_s_send_t_and_recv_a_on_the_command_line() {
    let env = Env::new();
    env.tank(&[("vol0", "8M", &[])]);
    write(&env, "tank/vol0", 0, 5, 8 << 20);
    env.ok(&["snapshot", "tank/vol0@one"]);
    let image = read(&env, "tank/vol0");
    let stream_file = env.path("full.stream");
    let out = env.run(&["send", "tank/vol0@one"]);
    assert!(out.status.success());
    let stream = out.stdout;
    std::fs::write(&stream_file, &stream[..stream.len() / 2]).unwrap();
    let recv_from = |file: &std::path::Path, args: &[&str]| {
        let mut command = env.oxpool_command();
        command
            .args(["recv"])
            .args(args)
            .stdin(std::fs::File::open(file).unwrap());
        command.output().unwrap()
    };
    let cut = recv_from(&stream_file, &["-s", "tank/copy"]);
    assert!(!cut.status.success());
    let err = String::from_utf8_lossy(&cut.stderr);
    assert!(err.contains("partially received state saved"), "{err}");
    let token_of = || {
        let got = env.ok(&["get", "receive_resume_token", "tank/copy"]);
        got.split_whitespace()
            .find(|w| w.starts_with("oxp1-"))
            .map(str::to_string)
    };
    let token = token_of().expect("a token after recv -s");
    // A plain receive does not overwrite it.
    std::fs::write(&stream_file, &stream).unwrap();
    let refused = recv_from(&stream_file, &["tank/copy"]);
    assert!(!refused.status.success());
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(err.contains("recv -A") && err.lines().count() == 1, "{err}");
    // A damaged token.
    let mut bad = token.clone();
    bad.pop();
    bad.push('x');
    let err = env.fails(&["send", "-t", &bad]);
    assert!(
        err.contains("cannot resume send") && err.lines().count() == 1,
        "{err}"
    );
    // send -t without a pool: the only pool known.
    let rest = env.run(&["send", "-t", &token]);
    assert!(
        rest.status.success(),
        "{}",
        String::from_utf8_lossy(&rest.stderr)
    );
    assert!(rest.stdout.len() < stream.len());
    std::fs::write(&stream_file, &rest.stdout).unwrap();
    let done = recv_from(&stream_file, &["-s", "-v", "tank/copy"]);
    let said = String::from_utf8_lossy(&done.stdout);
    let err = String::from_utf8_lossy(&done.stderr);
    assert!(done.status.success(), "{err}");
    // -v says the counts are the resumed part's, and where it resumed.
    let at: u64 = said
        .split(", resumed at volume offset ")
        .nth(1)
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{said}"));
    assert!(at > 0 && at < 8 << 20, "{said}");
    assert!(said.contains("(full stream of "), "{said}");
    assert!(read(&env, "tank/copy") == image, "resumed copy differs");
    assert_eq!(token_of(), None);
    // recv -A discards a saved partial receive, and then there is none to discard.
    std::fs::write(&stream_file, &stream[..stream.len() / 3]).unwrap();
    assert!(!recv_from(&stream_file, &["-s", "tank/other"])
        .status
        .success());
    env.ok(&["recv", "-A", "tank/other"]);
    let err = env.fails(&["recv", "-A", "tank/other"]);
    assert!(err.contains("no partially received stream"), "{err}");
    let audit = env.ok(&["audit", "tank"]);
    assert!(audit.contains(" 0 leaked, 0 problems"), "{audit}");
}

/// `recv -n` (as `zfs recv -n`) reads and verifies the whole input, the first stream against
/// the target and each later one against the stream before it, and changes nothing; with -v
/// it says what it would receive. A damaged or cut stream fails it with one line. The same
/// on a served pool, where nothing is exported either.
#[test]
fn recv_n_checks_the_whole_input_and_changes_nothing() {
    let env = Env::new();
    env.tank(&[("vol0", "8M", &[])]);
    second_pool(&env);
    write(&env, "tank/vol0", 0, 11, 4 << 20);
    env.ok(&["snapshot", "tank/vol0@one"]);
    write(&env, "tank/vol0", 1 << 20, 12, 1 << 20);
    env.ok(&["snapshot", "tank/vol0@two"]);
    let full = env.run(&["send", "tank/vol0@one"]).stdout;
    let incremental = env.run(&["send", "-i", "@one", "tank/vol0@two"]).stdout;
    let both = env.path("both.stream");
    std::fs::write(&both, [full.clone(), incremental.clone()].concat()).unwrap();
    let full_file = env.path("full.stream");
    std::fs::write(&full_file, &full).unwrap();
    let mut damaged = full.clone();
    let middle = damaged.len() / 2;
    damaged[middle] ^= 0x40;
    let damaged_file = env.path("damaged.stream");
    std::fs::write(&damaged_file, &damaged).unwrap();
    let cut_file = env.path("cut.stream");
    std::fs::write(&cut_file, &full[..full.len() - 1000]).unwrap();
    let wrong_order = env.path("wrong-order.stream");
    std::fs::write(&wrong_order, [incremental.clone(), full.clone()].concat()).unwrap();
    let recv_n = |file: &std::path::Path, target: &str| {
        let mut command = env.oxpool_command();
        command
            .args(["recv", "-n", "-v", target])
            .stdin(std::fs::File::open(file).unwrap());
        let out = command.output().unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let datasets = || env.ok(&["list", "-t", "all", "-H", "-o", "name", "-r", "dest"]);
    let check = |served: &str| {
        let (ok, said, err) = recv_n(&both, "dest/copy");
        assert!(ok, "{served}: {err}");
        assert!(
            said.contains("would receive dest/copy@one (full")
                && said.contains("would receive dest/copy@two (incremental")
                && said.contains("(full stream of tank/vol0@one, ")
                && said.contains("(incremental stream of tank/vol0@two, "),
            "{served}: {said}"
        );
        assert_eq!(datasets(), "", "{served}: a dry run made something");
        // Under a name: one stream says it; two are refused at the second.
        let (ok, said, err) = recv_n(&full_file, "dest/copy@named");
        assert!(ok, "{served}: {err}");
        assert!(
            said.contains("would receive dest/copy@named (full"),
            "{served}: {said}"
        );
        let (ok, _, err) = recv_n(&both, "dest/copy@named");
        assert!(
            !ok && err.contains("the first would be received as @named"),
            "{served}: {err}"
        );
        assert_eq!(datasets(), "", "{served}: a dry run made something");
        // Nor a hidden receive dataset (`list` does not show those): nothing to abort.
        let e = env.fails(&["recv", "-A", "dest/copy"]);
        assert!(e.contains("no partially received"), "{served}: {e}");
        for (file, why) in [
            (&damaged_file, "damaged"),
            (&cut_file, "truncated"),
            (&wrong_order, "does not exist"),
        ] {
            let (ok, _, err) = recv_n(file, "dest/copy");
            assert!(!ok, "{served}: {file:?} passed: {err}");
            assert_eq!(err.trim_end().lines().count(), 1, "{served}: {err}");
            assert!(err.contains(why), "{served}: {file:?}: {err}");
        }
        // Against the target: a full stream onto a volume that exists is refused, as a
        // receive would refuse it.
        let (ok, _, err) = recv_n(&both, "tank/vol0");
        assert!(!ok && err.contains("tank/vol0 exists"), "{served}: {err}");
        assert_eq!(datasets(), "", "{served}");
    };
    check("unserved");
    let server = env.serve(&["--listen", "127.0.0.1:0"]);
    check("served");
    let listed = exports(&server);
    assert!(!listed.contains("dest/copy"), "{listed}");
    let (status, _) = server.stop();
    assert!(status.success());
    // A real receive of an input whose third part is no stream keeps the two streams before
    // it (as ZFS keeps a package's snapshots received before an error), fails, and the
    // pool's history has the command that changed it; -v says what it kept.
    let tail_junk = env.path("junk-tail.stream");
    std::fs::write(&tail_junk, [full, incremental, vec![0x5a; 4096]].concat()).unwrap();
    let mut command = env.oxpool_command();
    command
        .args(["recv", "-v", "dest/kept"])
        .stdin(std::fs::File::open(&tail_junk).unwrap());
    let out = command.output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        !out.status.success() && err.contains("2 received before it"),
        "{err}"
    );
    assert!(
        said.contains("received dest/kept@one (full stream of tank/vol0@one, ")
            && said.contains("received dest/kept@two (incremental stream of tank/vol0@two, "),
        "{said}"
    );
    assert_eq!(datasets(), "dest/kept\ndest/kept@one\ndest/kept@two\n");
    let history = env.ok(&["history", "dest"]);
    assert!(history.contains(" oxpool recv -v dest/kept\n"), "{history}");
    env.ok(&["audit", "dest"]);
}

/// `recv -F` of a full stream onto a served volume without snapshots, as `zfs recv -F`:
/// refused in one line without -F, then the volume is replaced and its export serves the
/// stream's data at once (qemu-img compare over NBD), its received snapshot exported too.
#[test]
fn recv_f_replaces_a_served_volume_without_snapshots() {
    let env = Env::new();
    env.tank(&[("vol0", "8M", &[])]);
    second_pool(&env);
    env.ok(&["vol", "create", "dest/other", "--size", "4M"]);
    let server = env.serve(&["--listen", "127.0.0.1:0"]);
    let first = env.path("first.raw");
    std::fs::write(&first, random_bytes(17, 8 << 20)).unwrap();
    put(&first, &tcp_uri(&server, "tank/vol0"));
    env.ok(&["snapshot", "tank/vol0@one"]);
    let old = env.path("old.raw");
    std::fs::write(&old, random_bytes(18, 4 << 20)).unwrap();
    put(&old, &tcp_uri(&server, "dest/other"));
    let same = |export: &str, file: &std::path::Path| same_bytes(&server, export, file);
    // The sender may see the pipe closed: the receiver refuses at the stream's BEGIN.
    let (_, r, err) = pipe(&env, &["send", "tank/vol0@one"], &["recv", "dest/other"]);
    assert!(
        !r,
        "a full stream onto an existing volume without -F was received"
    );
    assert!(
        err.contains("dest/other exists") && err.contains("-F") && err.trim().lines().count() == 1,
        "{err}"
    );
    assert!(
        same("dest/other", &old),
        "the refused receive changed the volume"
    );
    let (s, r, err) = pipe(
        &env,
        &["send", "tank/vol0@one"],
        &["recv", "-F", "dest/other"],
    );
    assert!(
        s && r,
        "recv -F onto a volume without snapshots failed: {err}"
    );
    assert!(same("dest/other", &first), "the replaced volume's export");
    assert!(exports(&server).contains("dest/other@one"));
    assert!(same("dest/other@one", &first));
    let size = env.ok(&["get", "-H", "-p", "-o", "value", "volsize", "dest/other"]);
    assert_eq!(size.trim(), (8u64 << 20).to_string(), "the stream's size");
    // Nothing of the old data or of the hidden dataset is left.
    let (ok, out) = server.stop();
    assert!(ok.success(), "{out}");
    env.ok(&["audit", "dest"]);
}
