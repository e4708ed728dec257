//! A progress bar on a terminal, redrawn in place:
//! `scrub tank [#########           ]  45%  1.2G / 2.6G  120M/s  00:00:12 left`.

use crate::human;
use std::io::Write;
use std::time::Instant;

/// Cells of the bar.
const BAR_CELLS: u64 = 20;

/// A bar drawn on standard error when it is a terminal (nothing otherwise).
pub struct Bar {
    terminal: bool,
    drawn: bool,
    started: Option<Instant>,
}

impl Bar {
    /// A bar that draws only if `terminal`.
    pub fn new(terminal: bool) -> Bar {
        Bar {
            terminal,
            drawn: false,
            started: None,
        }
    }

    /// Redraws the bar at `done` of `total` units (bytes).
    pub fn draw(&mut self, w: &mut dyn Write, label: &str, done: u64, total: u64) {
        if !self.terminal {
            return;
        }
        let started = *self.started.get_or_insert_with(Instant::now);
        let _ = write!(
            w,
            "\r\x1b[2K{}",
            line(label, done, total, started.elapsed().as_secs_f64())
        );
        let _ = w.flush();
        self.drawn = true;
    }

    /// Erases the bar.
    pub fn clear(&mut self, w: &mut dyn Write) {
        if self.drawn {
            let _ = write!(w, "\r\x1b[2K");
            let _ = w.flush();
            self.drawn = false;
        }
        self.started = None;
    }
}

/// The bar's text for `done` of `total` after `elapsed_s` seconds.
pub fn line(label: &str, done: u64, total: u64, elapsed_s: f64) -> String {
    let total = total.max(done).max(1);
    let filled = (done * BAR_CELLS / total) as usize;
    let percent = done as f64 * 100.0 / total as f64;
    let rate = if elapsed_s > 0.0 {
        done as f64 / elapsed_s
    } else {
        0.0
    };
    let left = if rate > 0.0 {
        hms(((total - done) as f64 / rate) as u64)
    } else {
        "--:--:--".into()
    };
    format!(
        "{label} [{}{}] {percent:3.0}%  {} / {}  {}/s  {left} left",
        "#".repeat(filled),
        " ".repeat(BAR_CELLS as usize - filled),
        human(done),
        human(total),
        human(rate as u64),
    )
}

/// Seconds as HH:MM:SS.
pub fn hms(seconds: u64) -> String {
    format!(
        "{:02}:{:02}:{:02}",
        seconds / 3600,
        seconds / 60 % 60,
        seconds % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bar_fills_with_progress_and_says_what_is_left() {
        let half = line("scrub tank", 512 << 20, 1 << 30, 4.0);
        assert!(
            half.starts_with("scrub tank [##########          ]  50%"),
            "{half}"
        );
        assert!(
            half.contains("512M / 1G") && half.contains("128M/s"),
            "{half}"
        );
        assert!(half.ends_with("00:00:04 left"), "{half}");
        let over = line("x", 10, 5, 1.0);
        assert!(over.contains("[####################] 100%"), "{over}");
        assert_eq!(hms(3725), "01:02:05");
        let mut out = Vec::new();
        let mut bar = Bar::new(false);
        bar.draw(&mut out, "x", 1, 2);
        bar.clear(&mut out);
        assert!(out.is_empty(), "drew on a non-terminal");
    }
}
