//! Durability across a crash of the server process: kill -9 right after a FLUSH (and FUA
//! writes) was answered, restart, and the data reads back.

#[path = "nbd/harness.rs"]
mod harness;

use harness::{python, Env};

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
}
