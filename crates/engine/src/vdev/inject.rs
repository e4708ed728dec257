//! Fault injection into leaf I/O, for tests and benchmarks (`oxpool inject`, as ZFS's
//! `zinject`): read or write errors, corruption of the data a read returns, added latency,
//! each on one leaf, for reads, writes, flushes or all, with a frequency.
//!
//! It lives in the leaf I/O layer (`leaf_io.rs`), so everything above sees what a failing
//! device would show it: the pipeline counts the errors, falls back to other copies or
//! parity, repairs, and the fault rule (`health.rs`) faults the leaf. Label and uberblock I/O
//! and the intent log's import-time chain walk go to the device directly and are not
//! affected.
//!
//! - **Cost when unused**: every leaf I/O loads one flag (relaxed); nothing else. With a rule
//!   on the leaf, its I/Os take a lock to draw their fate, and the injected path is boxed.
//! - **Errors** fail the I/O without issuing it: the device never sees a failed write
//!   (its old bytes stay, as on a device that dropped it).
//! - **Corruption** issues the read and then flips bytes of what it returns (the first byte
//!   and one at random), which every checksum catches.
//! - **Latency** delays the I/O's completion by a timer on the calling thread's ring after
//!   the device answered and the vdev queue released its slot: no thread blocks, so a
//!   client with 64 requests in flight still has 64 at the device, each delayed. The delay
//!   models a slow path to the device rather than a slow device: the queue's `auto` rule and
//!   `oxpool iostat`'s device latencies do not see it.

use oxpool_format::Guid;
use oxpool_io::IoResult;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Duration;

/// What a rule does to the I/Os it hits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InjectKind {
    /// Fail with an I/O error (EIO).
    Io,
    /// Flip bytes of the data a read returns (reads only).
    Corrupt,
    /// Complete the I/O this much later.
    Delay {
        /// The added latency, milliseconds.
        delay_ms: u32,
    },
}

/// Which I/Os a rule applies to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InjectOps {
    /// Reads.
    Read,
    /// Writes.
    Write,
    /// Cache flushes.
    Flush,
    /// Reads, writes and flushes.
    All,
}

impl InjectOps {
    /// Parses `read`, `write`, `flush` or `all`.
    pub fn parse(v: &str) -> Option<InjectOps> {
        match v {
            "read" => Some(InjectOps::Read),
            "write" => Some(InjectOps::Write),
            "flush" => Some(InjectOps::Flush),
            "all" => Some(InjectOps::All),
            _ => None,
        }
    }

    /// The name `oxpool inject` takes and shows.
    pub fn as_str(self) -> &'static str {
        match self {
            InjectOps::Read => "read",
            InjectOps::Write => "write",
            InjectOps::Flush => "flush",
            InjectOps::All => "all",
        }
    }

    fn covers(self, op: IoOp) -> bool {
        matches!(
            (self, op),
            (InjectOps::All, _)
                | (InjectOps::Read, IoOp::Read)
                | (InjectOps::Write, IoOp::Write)
                | (InjectOps::Flush, IoOp::Flush)
        )
    }
}

impl InjectKind {
    /// `io`, `corrupt` or `delay:MS`.
    pub fn as_string(self) -> String {
        match self {
            InjectKind::Io => "io".into(),
            InjectKind::Corrupt => "corrupt".into(),
            InjectKind::Delay { delay_ms } => format!("delay:{delay_ms}"),
        }
    }

    /// Parses [`InjectKind::as_string`]'s form.
    pub fn parse(v: &str) -> Option<InjectKind> {
        match v {
            "io" => Some(InjectKind::Io),
            "corrupt" => Some(InjectKind::Corrupt),
            _ => {
                let ms = v.strip_prefix("delay:")?.parse().ok()?;
                Some(InjectKind::Delay { delay_ms: ms })
            }
        }
    }
}

/// One in a million: the unit of a rule's frequency.
pub const FREQUENCY_PPM_ALL: u32 = 1_000_000;

/// Longest delay a rule may add (a minute: a test that wants more wants a hung device).
pub const INJECT_DELAY_MS_MAX: u32 = 60_000;

/// An injection rule on one leaf.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InjectRule {
    /// Its number (`oxpool inject -c ID` clears it); given by whoever keeps the rules.
    pub id: u64,
    /// The leaf, by guid.
    pub device: Guid,
    /// What it does.
    pub kind: InjectKind,
    /// To which I/Os.
    pub ops: InjectOps,
    /// How often: parts per million of the I/Os it applies to (1 to 1,000,000).
    pub frequency_ppm: u32,
}

impl InjectRule {
    /// Checks the rule's fields: corruption of reads only, a frequency of 1 ppm to 100 %,
    /// a delay of 1 ms to [`INJECT_DELAY_MS_MAX`].
    pub fn validate(&self) -> Result<(), String> {
        if self.kind == InjectKind::Corrupt && self.ops != InjectOps::Read {
            return Err("corruption applies to reads only (-T read)".into());
        }
        if !(1..=FREQUENCY_PPM_ALL).contains(&self.frequency_ppm) {
            return Err("the frequency is a percentage above 0 and at most 100".into());
        }
        if let InjectKind::Delay { delay_ms } = self.kind {
            if !(1..=INJECT_DELAY_MS_MAX).contains(&delay_ms) {
                return Err(format!(
                    "a delay is 1 to {INJECT_DELAY_MS_MAX} milliseconds"
                ));
            }
        }
        Ok(())
    }
}

/// A rule with how many I/Os it hit since it was set on the open pool.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InjectRuleStatus {
    /// The rule.
    pub rule: InjectRule,
    /// I/Os it hit.
    pub hits: u64,
}

/// The kind of leaf I/O, as rules see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum IoOp {
    Read,
    Write,
    Flush,
}

/// What happens to one I/O.
#[derive(Clone, Copy, Debug, Default)]
struct Fate {
    error: bool,
    corrupt: bool,
    delay: Duration,
}

#[derive(Debug)]
struct Rules {
    rules: Vec<InjectRuleStatus>,
    rng: SmallRng,
}

/// A leaf's injection rules.
#[derive(Debug)]
pub struct LeafInject {
    /// Whether any rule is set: the one load every leaf I/O pays.
    armed: AtomicBool,
    rules: Mutex<Rules>,
}

impl Default for LeafInject {
    fn default() -> Self {
        LeafInject {
            armed: AtomicBool::new(false),
            rules: Mutex::new(Rules {
                rules: Vec::new(),
                rng: SmallRng::seed_from_u64(crate::vdev::seed()),
            }),
        }
    }
}

impl LeafInject {
    /// Whether any rule is set.
    #[inline]
    pub(crate) fn armed(&self) -> bool {
        self.armed.load(Ordering::Relaxed)
    }

    /// Adds a rule.
    pub(crate) fn add(&self, rule: InjectRule) {
        let mut r = self.rules.lock().unwrap();
        r.rules.push(InjectRuleStatus { rule, hits: 0 });
        self.armed.store(true, Ordering::Relaxed);
    }

    /// Removes the rule `id` (every rule with None); returns how many went.
    pub(crate) fn remove(&self, id: Option<u64>) -> usize {
        let mut r = self.rules.lock().unwrap();
        let before = r.rules.len();
        r.rules.retain(|s| id.is_some_and(|id| s.rule.id != id));
        self.armed.store(!r.rules.is_empty(), Ordering::Relaxed);
        before - r.rules.len()
    }

    /// The rules, with their hits.
    pub(crate) fn list(&self) -> Vec<InjectRuleStatus> {
        self.rules.lock().unwrap().rules.clone()
    }

    /// Draws what happens to one I/O of kind `op`: each rule that covers it hits with its
    /// frequency.
    fn fate(&self, op: IoOp) -> Fate {
        let mut fate = Fate::default();
        let mut guard = self.rules.lock().unwrap();
        let Rules { rules, rng } = &mut *guard;
        for s in rules.iter_mut().filter(|s| s.rule.ops.covers(op)) {
            let hit = s.rule.frequency_ppm >= FREQUENCY_PPM_ALL
                || rng.random_range(0..FREQUENCY_PPM_ALL) < s.rule.frequency_ppm;
            if !hit {
                continue;
            }
            s.hits += 1;
            match s.rule.kind {
                InjectKind::Io => fate.error = true,
                InjectKind::Corrupt => fate.corrupt |= op == IoOp::Read,
                InjectKind::Delay { delay_ms } => {
                    fate.delay = fate.delay.max(Duration::from_millis(u64::from(delay_ms)))
                }
            }
        }
        fate
    }

    /// Flips the first byte of `buf` and one more at random.
    fn corrupt(&self, buf: &mut [u8]) {
        if buf.is_empty() {
            return;
        }
        buf[0] ^= 0xff;
        let at = self.rules.lock().unwrap().rng.random_range(0..buf.len());
        if at != 0 {
            buf[at] ^= 0x5a;
        }
    }

    /// Runs `io` (not started yet) under the rules for `op` on the leaf `device`; `bytes`
    /// gives the buffer a corrupted read returns in.
    pub(crate) async fn apply<T>(
        &self,
        device: &str,
        op: IoOp,
        io: impl Future<Output = IoResult<T>>,
        bytes: impl FnOnce(&mut T) -> Option<&mut [u8]>,
    ) -> IoResult<T> {
        let fate = self.fate(op);
        if fate.error {
            // Not issued: the device never sees it.
            drop(io);
            if !fate.delay.is_zero() {
                oxpool_io::rt::sleep(fate.delay).await;
            }
            return Err(std::io::Error::other(format!(
                "{device}: injected {} error",
                match op {
                    IoOp::Read => "read",
                    IoOp::Write => "write",
                    IoOp::Flush => "flush",
                }
            )));
        }
        let mut result = io.await;
        if !fate.delay.is_zero() {
            oxpool_io::rt::sleep(fate.delay).await;
        }
        if fate.corrupt {
            if let Ok(value) = result.as_mut() {
                if let Some(buf) = bytes(value) {
                    self.corrupt(buf);
                }
            }
        }
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_and_ops_parse_back() {
        for k in [
            InjectKind::Io,
            InjectKind::Corrupt,
            InjectKind::Delay { delay_ms: 4 },
        ] {
            assert_eq!(InjectKind::parse(&k.as_string()), Some(k));
        }
        assert_eq!(InjectKind::parse("delay:x"), None);
        for o in [
            InjectOps::Read,
            InjectOps::Write,
            InjectOps::Flush,
            InjectOps::All,
        ] {
            assert_eq!(InjectOps::parse(o.as_str()), Some(o));
        }
    }

    #[test]
    fn a_rule_hits_about_its_frequency_and_only_its_ops() {
        let inj = LeafInject::default();
        assert!(!inj.armed());
        inj.add(InjectRule {
            id: 1,
            device: Guid(1),
            kind: InjectKind::Io,
            ops: InjectOps::Write,
            frequency_ppm: 250_000,
        });
        assert!(inj.armed());
        let errors = (0..4000).filter(|_| inj.fate(IoOp::Write).error).count();
        assert!((700..1300).contains(&errors), "{errors} of 4000 at 25 %");
        assert!((0..100).all(|_| !inj.fate(IoOp::Read).error));
        assert_eq!(inj.list()[0].hits, errors as u64);
        assert_eq!(inj.remove(Some(2)), 0);
        assert_eq!(inj.remove(Some(1)), 1);
        assert!(!inj.armed());
    }
}
