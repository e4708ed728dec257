//! `oxpool import [-d DIR]... POOL|ID NEWNAME`, as `zpool import pool newpool`: two pools
//! named `tank` in two directories, one imported as `tank`, the other by its id as `tank2`
//! into a running server, which serves both pools' volumes under their names (NBD exports
//! `tank/v` and `tank2/v`, read back whole with nbdcopy); the new name lasts (after the
//! server stops and the pool is exported, `tank2` finds it and `tank` does not); and the
//! refusals, each one line: a bad new name, a name imported already (with the hint to import
//! under another name by id), a new name taken, a rename of a pool imported here, two pools
//! of one name without an id, no such pool.

#[path = "nbd/harness.rs"]
mod harness;

use harness::{exports, random_bytes, tcp_uri, tool, Env};
use std::path::Path;

const DATA_BYTES: usize = 1 << 20;

fn p(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// Pool `tank` on `DIR/t.img`, its volume `v` holding `random_bytes(seed)`, exported.
fn exported_tank(env: &Env, dir: &str, seed: u64) -> Vec<u8> {
    let d = env.path(dir);
    std::fs::create_dir(&d).unwrap();
    let file = d.join("t.img");
    env.ok(&["create", "tank", p(&file), "--size", "64M", "--sparse"]);
    env.ok(&["vol", "create", "tank/v", "--size", "8M"]);
    let data = random_bytes(seed, DATA_BYTES);
    let raw = env.path(&format!("{dir}.raw"));
    std::fs::write(&raw, &data).unwrap();
    env.ok(&["vol", "write", "tank/v", "--offset", "0", p(&raw)]);
    env.ok(&["export", "tank"]);
    data
}

/// The first `DATA_BYTES` of export `name`, read over NBD.
fn read_export(env: &Env, server: &harness::ServerProcess, name: &str) -> Vec<u8> {
    let back = env.path("back.raw");
    let _ = std::fs::remove_file(&back);
    tool("nbdcopy", &[&tcp_uri(server, name), p(&back)]);
    let mut bytes = std::fs::read(&back).unwrap();
    bytes.truncate(DATA_BYTES);
    bytes
}

#[test]
fn a_second_pool_named_tank_is_imported_by_id_as_tank2_and_served_under_that_name() {
    let env = Env::new();
    let first = exported_tank(&env, "a", 1);
    let second = exported_tank(&env, "b", 2);
    let (a, b) = (env.path("a"), env.path("b"));

    // The id of b's pool, as the listing shows it.
    let listed = env.ok(&["import", "-d", p(&b)]);
    let id = listed
        .split("id: ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .unwrap_or_else(|| panic!("no id in: {listed}"))
        .to_string();

    // Refusals before anything is imported.
    let e = env.fails(&["import", "-d", p(&a), "-d", p(&b), "tank"]);
    assert!(
        e.contains("several pools found") && e.contains(&id) && e.contains("id"),
        "{e}"
    );
    let e = env.fails(&["import", "-d", p(&b), "tank", "1tank"]);
    assert!(e.contains("invalid pool name '1tank'"), "{e}");
    let e = env.fails(&["import", "-d", p(&b), "tank", "a/b"]);
    assert!(e.contains("invalid pool name 'a/b'"), "{e}");
    let e = env.fails(&["import", "-d", p(&b), "nosuch", "tank9"]);
    assert!(e.contains("no pool 'nosuch'"), "{e}");

    assert!(env
        .ok(&["import", "-d", p(&a), "tank"])
        .contains("imported pool 'tank'"));
    // The name is taken: the refusal says how to import the other one.
    let e = env.fails(&["import", "-d", p(&b), "tank"]);
    assert!(
        e.contains("a pool named tank is imported already")
            && e.contains(&format!(
                "import it under another name: oxpool import -d {} {id} NEWNAME",
                p(&b)
            )),
        "{e}"
    );

    // Into a running server, by id, under the new name; the server says the same.
    let server = env.serve(&["--listen", "127.0.0.1:0"]);
    let e = env.fails(&["import", "-d", p(&b), "tank"]);
    assert!(
        e.contains("a pool named tank is imported already") && e.contains(&format!("{id} NEWNAME")),
        "{e}"
    );
    let out = env.ok(&["import", "-d", p(&b), &id, "tank2"]);
    assert!(
        out.contains(&format!("imported pool 'tank' (id {id}) as 'tank2'")),
        "{out}"
    );
    let list = env.ok(&["list", "-H"]);
    let names: Vec<&str> = list
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert_eq!(names, ["tank", "tank2"], "{list}");
    let offered = exports(&server);
    assert!(
        offered.contains("tank/v") && offered.contains("tank2/v"),
        "{offered}"
    );
    for export in ["tank/v", "tank2/v"] {
        let info = tool("nbdinfo", &[&tcp_uri(&server, export)]);
        assert!(info.contains("8388608"), "{export}: {info}");
    }
    assert!(read_export(&env, &server, "tank/v") == first);
    assert!(read_export(&env, &server, "tank2/v") == second);

    // Refusals with the server: a new name taken, a pool imported here renamed.
    let e = env.fails(&["import", "-d", p(&b), &id, "tank"]);
    assert!(e.contains("is imported already"), "{e}");
    let e = env.fails(&["import", "-d", p(&a), "tank", "tank2"]);
    assert!(e.contains("pool 'tank2' is imported already"), "{e}");
    // The served pool by its name, with a directory named (its devices are locked): said so,
    // not 'no pool' (review).
    let e = env.fails(&["import", "-d", p(&a), "tank", "tank9"]);
    assert!(
        e.contains("pool 'tank' is imported already (this server serves it)")
            && e.contains("renamed at import only"),
        "{e}"
    );
    let (status, out) = server.stop();
    assert!(status.success(), "{out}");

    // The new name lasts: exported, it is found by it, and the old name finds it no more.
    let e = env.fails(&["import", "tank2", "tank3"]);
    assert!(
        e.contains("it is imported already as 'tank2'") && e.contains("export it first"),
        "{e}"
    );
    env.ok(&["export", "tank2"]);
    let listed = env.ok(&["import", "-d", p(&b)]);
    assert!(
        listed.contains(&format!("pool: tank2  id: {id}")),
        "{listed}"
    );
    env.fails(&["import", "-d", p(&b), "tank"]);
    assert!(env
        .ok(&["import", "-d", p(&b), "tank2"])
        .contains("imported pool 'tank2'"));
    assert!(env.ok(&["vol", "list"]).contains("tank2/v"));
}
