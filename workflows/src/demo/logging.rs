//! Logging that does not tear the progress bar apart.

use std::io::{IsTerminal, Write as _};
use std::sync::{Arc, Mutex, PoisonError};

use indicatif::ProgressBar;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::MakeWriter;

use super::cli::Args;

/// Hands every formatted log line to the progress bar (printed above it) while one is shown.
#[derive(Debug, Clone, Default)]
pub(crate) struct LogWriter {
    bar: Arc<Mutex<Option<ProgressBar>>>,
}

impl LogWriter {
    /// Routes log lines above `bar` from now on, or straight to stderr with `None`.
    pub(crate) fn set_bar(&self, bar: Option<ProgressBar>) {
        *self.bar.lock().unwrap_or_else(PoisonError::into_inner) = bar;
    }
}

impl<'a> MakeWriter<'a> for LogWriter {
    type Writer = LogLine;

    fn make_writer(&'a self) -> LogLine {
        LogLine {
            buf: Vec::new(),
            bar: self
                .bar
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone(),
        }
    }
}

/// One log line, buffered and written to stderr in one piece when dropped.
#[derive(Debug)]
pub(crate) struct LogLine {
    buf: Vec<u8>,
    bar: Option<ProgressBar>,
}

impl std::io::Write for LogLine {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(data);
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for LogLine {
    fn drop(&mut self) {
        let write = || {
            let _ = std::io::stderr().lock().write_all(&self.buf);
        };
        match &self.bar {
            Some(bar) => bar.suspend(write),
            None => write(),
        }
    }
}

/// Installs the global tracing subscriber, writing through `writer`.
pub(crate) fn init_logging(args: &Args, writer: LogWriter) {
    // Alerts are printed by the demo itself (from `subscribe_alerts`), so the tracing alert
    // sink is muted by default; everything else at `warn` and above still shows.
    let filter = if args.quiet_logs {
        EnvFilter::new("off")
    } else {
        EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| EnvFilter::new("warn,sagaflow_engine::signals=off"))
    };
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false)
        .init();
}
