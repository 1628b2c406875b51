//! A workflow described as data: what an engine publishes to the database on start, so that a
//! console or an HTTP client can draw the step graph, explain its policies and validate an
//! input without the application's Rust code.
//!
//! The description holds everything that decides how a run is executed (steps, dependencies,
//! saga roles, compensations, retry and deadline policies, the business-key policy) and the
//! JSON Schema of the input when the workflow declares an input type. Two engines that build
//! the same workflow describe it with the same JSON text, which is how a changed graph under
//! an unchanged version is detected.

use serde::{Deserialize, Serialize};

use super::policy::millis;
use super::{KeyPolicy, StepKind, Workflow};

/// A workflow as published: its graph and policies.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkflowDescription {
    /// The workflow's name.
    pub name: String,
    /// Its version.
    pub version: i32,
    /// How long a run's business key stays taken: `while_active`, `while_retained` or
    /// `allow_after_failure`.
    pub business_keys: String,
    /// The steps, in declaration order.
    pub steps: Vec<StepDescription>,
    /// JSON Schema (draft 2020-12) of the input, when the workflow declares an input type
    /// with [`WorkflowBuilder::input`](super::WorkflowBuilder::input).
    pub input_schema: Option<serde_json::Value>,
}

/// One step of a [`WorkflowDescription`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepDescription {
    /// The step's name.
    pub name: String,
    /// Its saga role: `compensatable`, `pivot` or `retriable`.
    pub kind: String,
    /// The steps it waits for.
    pub after: Vec<String>,
    /// Whether it has a compensation, run when a later step fails for good.
    pub compensates: bool,
    /// Failed attempts at which it fails for good; `None`: retried until it succeeds.
    pub max_failures: Option<u32>,
    /// Delay before the first retry, in milliseconds.
    pub initial_backoff_ms: i64,
    /// Ceiling of the retry delay, in milliseconds.
    pub max_backoff_ms: i64,
    /// Interruptions (attempts lost with their engine instance) it may take.
    pub max_interruptions: u32,
    /// The first attempt's deadline, in milliseconds.
    pub deadline_ms: i64,
    /// The cap the deadline is doubled up to after timeouts, in milliseconds.
    pub deadline_cap_ms: i64,
}

impl StepKind {
    /// The stored spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Compensatable => "compensatable",
            Self::Pivot => "pivot",
            Self::Retriable => "retriable",
        }
    }
}

impl KeyPolicy {
    /// The stored spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::WhileActive => "while_active",
            Self::WhileRetained => "while_retained",
            Self::AllowAfterFailure => "allow_after_failure",
        }
    }
}

impl Workflow {
    /// The workflow described as data (see the module documentation).
    pub fn describe(&self) -> WorkflowDescription {
        let steps = self
            .steps
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let (retry, deadline) = (s.settings.retry, s.settings.deadline);
                StepDescription {
                    name: s.name.clone(),
                    kind: s.kind.as_str().to_owned(),
                    after: self.deps_of(i).map(str::to_owned).collect(),
                    compensates: s.compensation.is_some(),
                    max_failures: retry.max_failures,
                    initial_backoff_ms: millis(retry.initial_backoff),
                    max_backoff_ms: millis(retry.max_backoff),
                    max_interruptions: retry.max_interruptions,
                    deadline_ms: millis(deadline.initial),
                    deadline_cap_ms: millis(deadline.cap),
                }
            })
            .collect();
        WorkflowDescription {
            name: self.name.clone(),
            version: self.version,
            business_keys: self.key_policy.as_str().to_owned(),
            steps,
            input_schema: self.input_schema.as_deref().cloned(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde::Deserialize;

    use crate::{DeadlinePolicy, StepContext, StepError, Workflow};

    #[derive(Deserialize, schemars::JsonSchema)]
    #[allow(dead_code)] // read through its schema only
    struct Order {
        /// The order's id.
        order_id: String,
        qty: u32,
    }

    fn order() -> Workflow {
        Workflow::builder("order", 3)
            .input::<Order>()
            .step("reserve", |_: StepContext| async { Ok::<_, StepError>(()) })
            .compensate(|_: StepContext| async { Ok::<_, StepError>(()) })
            .step("charge", |_: StepContext| async { Ok::<_, StepError>(()) })
            .after(["reserve"])
            .pivot()
            .deadline_policy(DeadlinePolicy::new(
                Duration::from_secs(5),
                Duration::from_secs(40),
            ))
            .step("ship", |_: StepContext| async { Ok::<_, StepError>(()) })
            .after(["charge"])
            .retriable()
            .build()
            .expect("valid")
    }

    #[test]
    fn a_description_holds_the_graph_the_roles_and_the_policies() {
        let d = order().describe();
        assert_eq!((d.name.as_str(), d.version), ("order", 3));
        assert_eq!(d.business_keys, "while_retained");
        let names: Vec<_> = d.steps.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["reserve", "charge", "ship"]);
        let (reserve, charge, ship) = (&d.steps[0], &d.steps[1], &d.steps[2]);
        assert_eq!(
            (
                reserve.kind.as_str(),
                reserve.compensates,
                reserve.after.len()
            ),
            ("compensatable", true, 0)
        );
        assert_eq!(
            (
                charge.kind.as_str(),
                charge.compensates,
                charge.after.clone()
            ),
            ("pivot", false, vec!["reserve".to_owned()])
        );
        assert_eq!(
            (charge.deadline_ms, charge.deadline_cap_ms),
            (5_000, 40_000)
        );
        assert_eq!((ship.kind.as_str(), ship.max_failures), ("retriable", None));
    }

    #[test]
    fn the_input_schema_names_the_input_types_fields() {
        let schema = order().describe().input_schema.expect("declared input");
        let props = &schema["properties"];
        assert_eq!(props["order_id"]["type"], "string", "{schema}");
        assert_eq!(props["qty"]["type"], "integer", "{schema}");
        assert_eq!(props["order_id"]["description"], "The order's id.");
        let required: Vec<_> = schema["required"]
            .as_array()
            .expect("required")
            .iter()
            .filter_map(|v| v.as_str())
            .collect();
        assert_eq!(required, ["order_id", "qty"]);
    }

    #[test]
    fn the_same_workflow_is_described_by_the_same_text() {
        let text = |wf: Workflow| serde_json::to_string(&wf.describe()).expect("json");
        assert_eq!(text(order()), text(order()));
        let undeclared = Workflow::builder("order", 3)
            .step("reserve", |_: StepContext| async { Ok::<_, StepError>(()) })
            .build()
            .expect("valid");
        assert_eq!(undeclared.describe().input_schema, None);
    }
}
