//! Change-map metadata contexts asked of a real `oxpool serve` by real clients, before the
//! engine offers any: libnbd's python binding (tests/nbd/meta_contexts.py) lists and selects
//! `oxpool:changed-since:*` and gets a clean "not offered" (base:allocation still served),
//! and `nbdinfo --map=oxpool:changed-since:SNAP` fails with its own one-line message, not a
//! protocol error.

#[path = "nbd/harness.rs"]
mod harness;

use harness::{python, run_unchecked, tool, Env};
use std::process::Command;

#[test]
fn change_maps_not_offered_are_refused_cleanly() {
    let env = Env::new();
    env.tank(&[("vol0", "64M", &[])]);
    let server = env.serve(&["--listen", "127.0.0.1:0"]);
    let uri = server.uri("tank/vol0");

    let out = python("meta_contexts.py", &[&uri]);
    assert!(out.contains("meta_contexts: all checks passed"), "{out}");

    // nbdinfo lists the contexts it can select: base:allocation only.
    let info = tool("nbdinfo", &[&uri]);
    let contexts: Vec<&str> = info
        .lines()
        .skip_while(|l| l.trim() != "contexts:")
        .skip(1)
        .take_while(|l| l.starts_with("\t\t"))
        .map(str::trim)
        .collect();
    assert_eq!(contexts, ["base:allocation"], "{info}");

    let mut map = Command::new("nbdinfo");
    map.args(["--map=oxpool:changed-since:monday", &uri]);
    let output = run_unchecked(map, "nbdinfo --map=oxpool:changed-since:monday");
    assert!(!output.status.success(), "a change map was served");
    let err = String::from_utf8_lossy(&output.stderr);
    assert!(
        err.contains("does not support metadata context")
            && err.contains("oxpool:changed-since:monday"),
        "{err}"
    );

    let (status, output) = server.stop();
    assert!(status.success(), "{output}");
}
