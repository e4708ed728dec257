//! fio writing and verifying a range of a volume over NBD, over and over, while a test does
//! other things to the pool (administration, faults): every run checks each block it wrote,
//! as it goes and at the end.

use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

/// One fio run of the verify loop.
pub struct FioRun {
    /// fio exited 0 and its job reports no error.
    pub ok: bool,
    /// Largest completion latency of any I/O, in microseconds.
    #[allow(dead_code)]
    pub clat_us_max: u64,
    /// fio's output, for the failure message.
    pub output: String,
}

/// fio writing and verifying `size_bytes` at `offset_bytes` of one volume over and over
/// (each run writes the range at random in 4 KiB requests, checks every block as it goes
/// and at the end) until stopped.
pub struct FioLoop {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<Vec<FioRun>>,
}

impl FioLoop {
    /// Starts the loop on the volume at `uri`.
    pub fn start(uri: &str, offset_bytes: u64, size_bytes: u64) -> FioLoop {
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (stop, uri) = (stop.clone(), uri.to_string());
            std::thread::spawn(move || {
                let mut runs = Vec::new();
                // Bounded by `stop`, and by a run count far above what the tests take.
                while !stop.load(Ordering::Relaxed) && runs.len() < 10_000 {
                    let seed = runs.len() as u64 + 1;
                    runs.push(fio_once(&uri, offset_bytes, size_bytes, seed));
                }
                runs
            })
        };
        FioLoop { stop, thread }
    }

    /// Stops after the current run; returns every run.
    pub fn finish(self) -> Vec<FioRun> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().expect("the fio loop panicked")
    }
}

fn fio_once(uri: &str, offset_bytes: u64, size_bytes: u64, seed: u64) -> FioRun {
    let mut command = Command::new("fio");
    command.args([
        "--name=verify",
        "--ioengine=nbd",
        &format!("--uri={uri}"),
        "--rw=randwrite",
        "--bs=4k",
        "--iodepth=8",
        &format!("--offset={offset_bytes}"),
        &format!("--size={size_bytes}"),
        "--verify=crc32c",
        "--do_verify=1",
        "--verify_backlog=256",
        "--verify_fatal=1",
        "--verify_state_save=0",
        &format!("--randseed={seed}"),
        "--output-format=json",
    ]);
    let output = super::harness::run_unchecked(command, "fio verify");
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    let json: Option<serde_json::Value> = text
        .find('{')
        .and_then(|start| serde_json::from_str(&text[start..]).ok());
    let job = json.as_ref().map(|j| &j["jobs"][0]);
    let error = job.and_then(|j| j["error"].as_i64()).unwrap_or(-1);
    let clat = |dir: &str| {
        job.and_then(|j| j[dir]["clat_ns"]["max"].as_u64())
            .unwrap_or(0)
    };
    FioRun {
        ok: output.status.success() && error == 0,
        clat_us_max: clat("write").max(clat("read")) / 1000,
        output: format!("{text}{}", String::from_utf8_lossy(&output.stderr)),
    }
}
