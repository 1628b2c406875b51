//! `sagaflow purge`: deletes finished runs past an age, as the retention sweep does.

use std::time::Duration;

use sagaflow::Engine;
use serde::Serialize;

use crate::exit::Outcome;
use crate::output;

/// `purge --json`.
#[derive(Debug, Serialize)]
struct PurgeAnswer {
    dry_run: bool,
    older_than_secs: u64,
    /// Runs deleted, or (dry run) that would be.
    runs: u64,
}

pub(crate) async fn purge(
    engine: &Engine,
    older_than: Duration,
    dry_run: bool,
    json: bool,
) -> Outcome {
    let runs = if dry_run {
        engine.finished_count(older_than).await?
    } else {
        engine.purge_finished(older_than).await?
    };
    if json {
        return output::json(&PurgeAnswer {
            dry_run,
            older_than_secs: older_than.as_secs(),
            runs,
        });
    }
    let age = humantime::format_duration(older_than);
    if dry_run {
        output::line(format!(
            "{runs} finished run(s) older than {age} would be deleted (dry run: nothing was deleted)"
        ));
    } else {
        output::line(format!("deleted {runs} finished run(s) older than {age}"));
    }
    Ok(())
}
