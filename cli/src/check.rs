//! `sagaflow check`: reads every run and reports those whose rows break the engine's
//! invariants (see `sagaflow::check`).

use sagaflow::Engine;
use sagaflow::check::CheckReport;

use crate::exit::{Failure, Outcome, VIOLATIONS};
use crate::output;

pub(crate) async fn check(engine: &Engine, json: bool) -> Outcome {
    let report: CheckReport = sagaflow::check::check(engine.connection()).await?;
    if json {
        output::json(&report)?;
    } else {
        output::line(&report);
    }
    if report.is_clean() {
        Ok(())
    } else {
        Err(Failure::new(VIOLATIONS, report.summary()))
    }
}
