//! Showing progress while the runs execute: a bar on a terminal, a line every ~10% otherwise.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressStyle};

use super::logging::LogWriter;
use super::text::secs;
use super::tracker::Tracker;

/// The progress display of one batch of runs.
#[derive(Debug)]
pub(crate) struct Progress {
    bar: Option<ProgressBar>,
    total: usize,
    next_decile: usize,
    started: Instant,
}

impl Progress {
    /// Starts showing progress towards `total` runs; log lines go above the bar.
    pub(crate) fn new(total: usize, logs: &LogWriter) -> Self {
        let bar = std::io::stderr().is_terminal().then(|| {
            let bar = ProgressBar::new(total as u64);
            let style = ProgressStyle::with_template(
                "  {spinner:.green} [{bar:16.cyan/blue}] {pos:>4}/{len} {wide_msg}",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("█▉▊▋▌▍▎▏ ");
            bar.set_style(style);
            bar.enable_steady_tick(Duration::from_millis(120));
            bar
        });
        logs.set_bar(bar.clone());
        Self {
            bar,
            total,
            next_decile: 1,
            started: Instant::now(),
        }
    }

    /// Shows what `t` knows now.
    pub(crate) fn update(&mut self, t: &Tracker) {
        let tally = t.tally();
        let done = tally.done();
        match &self.bar {
            Some(bar) => {
                bar.set_position(done as u64);
                let waiting = if t.submitted_all {
                    String::new()
                } else {
                    format!(
                        "  · submitted {}/{}",
                        t.runs.len() + t.earlier.len() + t.rejected.len(),
                        self.total
                    )
                };
                bar.set_message(format!("{}{waiting}", tally.compact()));
            }
            None => {
                while self.next_decile <= 10 && done * 10 >= self.next_decile * self.total {
                    println!(
                        "  {:>4}  {:>6}/{} finished   {}   ({})",
                        format!("{}%", self.next_decile * 10),
                        done,
                        self.total,
                        tally.line(),
                        secs(self.started.elapsed())
                    );
                    self.next_decile += 1;
                }
            }
        }
    }

    /// Prints a line above the bar (or plainly).
    pub(crate) fn println(&self, line: &str) {
        match &self.bar {
            Some(bar) => bar.println(line),
            None => println!("{line}"),
        }
    }

    /// Removes the bar; log lines go straight to stderr again.
    pub(crate) fn finish(&self, logs: &LogWriter) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
        logs.set_bar(None);
    }
}
