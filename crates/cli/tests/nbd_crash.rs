//! Durability across a crash of the server process: kill -9 right after a FLUSH (and FUA
//! writes) was answered, restart, and the data reads back; after the last crash the pool
//! audits clean (`oxpool audit` exits non-zero on any finding: a block that does not
//! verify, a space figure that does not recompute, a leak, a double reference).

#[path = "nbd/harness.rs"]
mod harness;

use harness::{python, script, Env, PYTHON};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

#[test]
fn kill_9_after_flush_loses_nothing_flushed() {
    let env = Env::new();
    env.tank(&[("vol0", "64M", &[])]);
    for (round, seed) in ["5", "6"].iter().enumerate() {
        let server = env.serve(&["--listen", "127.0.0.1:0"]);
        let uri = server.uri("tank/vol0");
        if round > 0 {
            // The previous round's data survived its crash and this restart too.
            python("durable.py", &["verify", &uri, "5"]);
        }
        let out = python("durable.py", &["write", &uri, seed]);
        assert!(out.contains("durable: ok"), "{out}");
        // At once: the answers to the FLUSH and the FUA writes are all that was promised.
        server.kill9();
        let server = env.serve(&["--listen", "127.0.0.1:0"]);
        let out = python("durable.py", &["verify", &server.uri("tank/vol0"), seed]);
        assert!(out.contains("durable: verified"), "{out}");
        server.kill9();
    }
    audited_clean(&env);
}

/// `oxpool audit tank` passes (it fails the command on any finding) and verified blocks.
fn audited_clean(env: &Env) {
    let audit = env.ok(&["audit", "tank"]);
    assert!(
        audit.contains(" 0 problems") && !audit.contains(" 0 blocks verified"),
        "{audit}"
    );
}

/// kill -9 of the server while a real client (libnbd) is doing FUA writes and flushed writes,
/// 20 times in a loop, every other one with `logearly=on`; after each restart, every write
/// the server promised reads back.
#[test]
fn kill_9_under_a_writing_client_twenty_times() {
    let env = Env::new();
    env.tank(&[("vol0", "32M", &[])]);
    let mut promised: Vec<(u64, Vec<String>)> = Vec::new();
    for round in 0..20u64 {
        let seed = 100 + round;
        let server = env.serve(&["--listen", "127.0.0.1:0"]);
        let uri = server.uri("tank/vol0");
        // Every earlier round's promises held through every crash since.
        if let Some((s, slots)) = promised.last() {
            let mut args = vec!["verify".to_string(), uri.clone(), s.to_string()];
            args.extend(slots.iter().cloned());
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let out = python("churn.py", &args);
            assert!(out.contains("verified"), "round {round}: {out}");
        }
        // Odd rounds with early log writes: the flushed writes' blocks are then written as
        // they arrive and only flushed by the FLUSH, so kills land between the two.
        let early = if round % 2 == 1 { "on" } else { "off" };
        env.ok(&["set", &format!("logearly={early}"), "tank"]);
        let mut client = Command::new(PYTHON)
            .arg(script("churn.py"))
            .args(["write", &uri, &seed.to_string()])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start the client");
        let mut lines = BufReader::new(client.stdout.take().unwrap()).lines();
        // Kill after a round-dependent number of promises, mid-stream.
        let kill_after = 3 + (round * 7) % 40;
        let mut slots = Vec::new();
        for line in lines.by_ref() {
            let line = line.unwrap();
            if let Some(s) = line.strip_prefix("durable ") {
                slots.push(s.to_string());
            }
            if slots.len() as u64 >= kill_after || line == "done" {
                break;
            }
        }
        server.kill9();
        // What the client printed before it noticed the death was promised too.
        for line in lines.map_while(Result::ok) {
            if let Some(s) = line.strip_prefix("durable ") {
                slots.push(s.to_string());
            }
        }
        let _ = client.wait();
        assert!(
            !slots.is_empty(),
            "round {round}: the client was promised nothing"
        );
        promised.push((seed, slots));
    }
    // Last round's promises, after its crash.
    let server = env.serve(&["--listen", "127.0.0.1:0"]);
    let (s, slots) = promised.last().unwrap();
    let mut args = vec!["verify".to_string(), server.uri("tank/vol0"), s.to_string()];
    args.extend(slots.iter().cloned());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = python("churn.py", &args);
    assert!(out.contains("verified"), "{out}");
    server.kill9();
    audited_clean(&env);
}
