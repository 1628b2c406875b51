//! The store's rows as the application sees them ([`crate::model`]): JSON columns parsed,
//! times as timestamps. A column that does not parse is a damaged row.

use std::time::Duration;

use crate::Result;
use crate::model::{Attempts, Run, Step, json, json_opt, timestamp};

use super::{RunView, StepRow};

impl RunView {
    /// The run as applications see it.
    ///
    /// # Errors
    /// [`Error::CorruptRow`](crate::Error::CorruptRow) when a JSON column does not hold JSON.
    pub fn into_run(self) -> Result<Run> {
        const T: &str = "sagaflow_runs";
        let (priority, start_at) = (self.priority, self.start_at.map(timestamp));
        let (restarted_from, restarted_as) = (self.restarted_from, self.restarted_as);
        let r = self.run;
        Ok(Run {
            input: json(T, r.id, "input", &r.input)?,
            output: json_opt(T, r.id, "output", r.output.as_deref())?,
            error: json_opt(T, r.id, "error", r.error.as_deref())?,
            id: r.id,
            workflow: r.workflow,
            version: r.version,
            business_key: r.business_key,
            state: r.state,
            created_at: timestamp(r.created_at),
            updated_at: timestamp(r.updated_at),
            finished_at: r.finished_at.map(timestamp),
            failed_attempts: r.failed_attempts.into(),
            priority,
            start_at,
            restarted_from,
            restarted_as,
        })
    }
}

impl StepRow {
    /// The step as applications see it.
    ///
    /// # Errors
    /// [`Error::CorruptRow`](crate::Error::CorruptRow) when a JSON column does not hold JSON.
    pub fn into_step(self) -> Result<Step> {
        const T: &str = "sagaflow_steps";
        let r = self;
        Ok(Step {
            output: json_opt(T, r.id, "output", r.output.as_deref())?,
            error: json_opt(T, r.id, "error", r.error.as_deref())?,
            progress: json_opt(T, r.id, "progress", r.progress.as_deref())?,
            run_id: r.run_id,
            name: r.name,
            state: r.state,
            attempts: Attempts {
                forward: r.forward_attempts,
                compensation: r.compensation_attempts,
                failures: r.failure_count,
                max_failures: r.max_failures,
                interruptions: r.interruptions,
                max_interruptions: r.max_interruptions,
            },
            maybe_applied: r.maybe_applied,
            locked_by: r.locked_by,
            complete_by: r.complete_by.map(timestamp),
            available_at: r.available_at.map(timestamp),
            deadline: Duration::from_millis(u64::try_from(r.deadline_ms).unwrap_or(0)),
            idempotency_key: r.idempotency_key,
        })
    }
}
