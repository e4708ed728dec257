//! The README's first command: `oxpool serve` with no pool known, in an empty directory,
//! creates the embedded default pool there and serves a volume that `qemu-img info` opens
//! with the URI it printed.

#[path = "nbd/harness.rs"]
mod harness;

use harness::{tool, Env};
use std::os::unix::fs::MetadataExt;

#[test]
fn readme_first_command_serves_a_volume_qemu_img_opens() {
    let env = Env::new();
    // Exactly the README command when the default port is free; otherwise (another server
    // on this machine) the same with a free port.
    let default_port_free = std::net::TcpListener::bind("127.0.0.1:10809").is_ok();
    let args: &[&str] = if default_port_free {
        &[]
    } else {
        &["--listen", "127.0.0.1:0"]
    };
    let server = env.serve(args);
    let out = server.output();
    assert!(out.contains("created pool 'oxpool'"), "{out}");
    assert!(out.contains("sparse file of 8G"), "{out}");
    let uri = server.uri("oxpool/vol0");
    if default_port_free {
        assert_eq!(uri, "nbd://127.0.0.1:10809/oxpool/vol0");
    }
    let info = tool("qemu-img", &["info", &uri]);
    assert!(info.contains("virtual size: 4 GiB"), "{info}");
    let file = env.path("oxpool-data/oxpool-pool0.img");
    let meta = std::fs::metadata(&file).expect("the pool file in ./oxpool-data");
    assert_eq!(meta.len(), 8 << 30);
    assert!(meta.blocks() * 512 < 1 << 30, "the pool file is not sparse");
    // Ctrl-C: a clean stop and export.
    let (status, output) = server.stop_with(libc::SIGINT);
    assert!(status.success(), "{output}");
    assert!(output.contains("exported oxpool"), "{output}");

    // The second run serves the same pool instead of creating one.
    let server = env.serve(args);
    assert!(
        !server.output().contains("created pool"),
        "{}",
        server.output()
    );
    let info = tool("qemu-img", &["info", &server.uri("oxpool/vol0")]);
    assert!(info.contains("virtual size: 4 GiB"), "{info}");
    let (status, output) = server.stop();
    assert!(status.success(), "{output}");
}
