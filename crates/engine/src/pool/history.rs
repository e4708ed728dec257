//! The pool's command history, as the administrator's commands see it (spa/history.rs).

use super::Pool;
use crate::spa::history::{self, HistoryListing, HistoryRecord};
use oxpool_format::Txg;

impl Pool {
    /// Records a command that changed the pool (`line`, run by user `uid` on `host`, ending
    /// at `time_s`) in its history. The next txg sync writes it: a command that syncs
    /// before it returns, as every change does, has its record durable with its change.
    pub fn record_history(&self, line: &str, uid: u32, host: &str, time_s: u64) {
        self.spa.history.lock().unwrap().record(HistoryRecord {
            time_s,
            txg: Txg(0),
            uid,
            host: host.to_string(),
            line: line.to_string(),
        });
        self.spa.txg.mark_dirty();
    }

    /// The pool's history (`oxpool history`), oldest first: what is stored, then what waits
    /// for the next sync. A chunk no copy of which can be read is named in `unreadable`; the
    /// rest is listed.
    pub fn history(&self) -> HistoryListing {
        oxpool_io::rt::block_on(history::list(&self.spa))
    }
}
