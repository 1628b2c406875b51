//! A workflow described as data: what an engine publishes to the database on start, so that a
//! console or an HTTP client can draw the step graph, explain its policies and validate an
//! input without the application's Rust code.
//!
//! The description holds everything that decides how a run is executed (steps, dependencies,
//! saga roles, compensations, retry and deadline policies, the business-key policy) and the
//! JSON Schema of the input when the workflow declares an input type. Two engines that build
//! the same workflow describe it with the same JSON text, which is how a changed graph under
//! an unchanged version is detected.

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::policy::millis;
use super::{
    DeadlinePolicy, KeyPolicy, OnFailure, RetryLane, RetryPolicy, StepAction, StepContext,
    StepKind, Workflow,
};
use crate::{Error, StepError};

/// A workflow as published: its graph and policies.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct WorkflowDescription {
    /// The workflow's name.
    pub name: String,
    /// Its version.
    pub version: i32,
    /// How long a run's business key stays taken: `while_active`, `while_retained` or
    /// `allow_after_failure`.
    pub business_keys: String,
    /// What a run does when a step fails for good before the point of no return:
    /// `compensate` or `pause`. Left out of the published text when it is `compensate`, so
    /// definitions published before the policy existed read the same.
    #[serde(default = "compensate", skip_serializing_if = "is_compensate")]
    pub on_failure: String,
    /// Whether runs' finishes are notified by default ([`WorkflowBuilder::notify_on_finish`](super::WorkflowBuilder::notify_on_finish)).
    /// Left out of the published text when false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub notify_on_finish: bool,
    /// The JSON Pointer into the input that gives a run's flow key. Left out of the
    /// published text when there is none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flow_key: Option<String>,
    /// The claim priority of runs started without one
    /// ([`WorkflowBuilder::priority`](super::WorkflowBuilder::priority)). Left out of the
    /// published text when it is 0.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub priority: i32,
    /// Where retried attempts queue relative to new work of the same priority: `same`,
    /// `ahead` or `behind` ([`WorkflowBuilder::retries`](super::WorkflowBuilder::retries)).
    /// Left out of the published text when it is `same`.
    #[serde(default = "same_lane", skip_serializing_if = "is_same_lane")]
    pub retries: String,
    /// The steps, in declaration order.
    pub steps: Vec<StepDescription>,
    /// JSON Schema (draft 2020-12) of the input, when the workflow declares an input type
    /// with [`WorkflowBuilder::input`](super::WorkflowBuilder::input).
    pub input_schema: Option<serde_json::Value>,
}

fn compensate() -> String {
    OnFailure::Compensate.as_str().to_owned()
}

fn is_compensate(s: &str) -> bool {
    s == OnFailure::Compensate.as_str()
}

#[allow(clippy::trivially_copy_pass_by_ref)] // serde's `skip_serializing_if` passes a reference
fn is_zero(n: &i32) -> bool {
    *n == 0
}

fn same_lane() -> String {
    RetryLane::Same.as_str().to_owned()
}

fn is_same_lane(s: &str) -> bool {
    s == RetryLane::Same.as_str()
}

/// One step of a [`WorkflowDescription`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
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
    /// The remote resource it calls, whose limits its attempts obey. Left out of the
    /// published text when it has none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource: Option<String>,
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

/// The body of every step of a workflow rebuilt from its description. It never runs: such a
/// workflow cannot be registered in an engine (see [`Workflow::from_description`]); should it
/// run anyway, it refuses without acting.
struct WithoutCode;

#[async_trait::async_trait]
impl StepAction for WithoutCode {
    async fn run(&self, _ctx: StepContext) -> Result<serde_json::Value, StepError> {
        Err(StepError::refused(
            "no_code",
            "this step was rebuilt from its published description and has no code",
        ))
    }
}

fn duration(ms: i64) -> Duration {
    Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

impl Workflow {
    /// The workflow a published description describes, without its code: enough to start
    /// runs of it (the same run and step rows as the workflow built with its steps, the input
    /// checked against the published JSON Schema), never to execute them. It cannot be
    /// registered in an engine ([`Registry::register`](super::Registry::register) refuses
    /// it); the engines that have the code execute the runs it starts.
    ///
    /// # Errors
    /// [`Error::InvalidDefinition`] when the description names an unknown saga role,
    /// business-key policy or retry lane, or describes an invalid graph or a priority out of
    /// range.
    #[doc(hidden)]
    pub fn from_description(d: &WorkflowDescription) -> Result<Self, Error> {
        let invalid = |reason: String| Error::InvalidDefinition {
            workflow: d.name.clone(),
            reason,
        };
        let key_policy = match d.business_keys.as_str() {
            "while_active" => KeyPolicy::WhileActive,
            "while_retained" => KeyPolicy::WhileRetained,
            "allow_after_failure" => KeyPolicy::AllowAfterFailure,
            other => return Err(invalid(format!("unknown business-key policy `{other}`"))),
        };
        let on_failure = match d.on_failure.as_str() {
            "compensate" => OnFailure::Compensate,
            "pause" => OnFailure::Pause,
            other => return Err(invalid(format!("unknown failure policy `{other}`"))),
        };
        let lane = RetryLane::parse(&d.retries)
            .ok_or_else(|| invalid(format!("unknown retry lane `{}`", d.retries)))?;
        let mut b = Workflow::builder(d.name.clone(), d.version)
            .business_keys(key_policy)
            .on_failure(on_failure)
            .notify_on_finish(d.notify_on_finish)
            .priority(d.priority)
            .retries(lane);
        if let Some(pointer) = &d.flow_key {
            b = b.flow_key(pointer.clone());
        }
        for s in &d.steps {
            b = b.step_with(s.name.clone(), WithoutCode);
            if !s.after.is_empty() {
                b = b.after(s.after.iter().cloned());
            }
            b = match s.kind.as_str() {
                "compensatable" => b,
                "pivot" => b.pivot(),
                "retriable" => b.retriable(),
                other => {
                    return Err(invalid(format!(
                        "step `{}` has unknown role `{other}`",
                        s.name
                    )));
                }
            };
            if s.compensates {
                b = b.compensate_with(WithoutCode);
            }
            let retry = RetryPolicy {
                max_failures: s.max_failures,
                initial_backoff: duration(s.initial_backoff_ms),
                max_backoff: duration(s.max_backoff_ms),
                max_interruptions: s.max_interruptions,
                ..RetryPolicy::default()
            };
            if let Some(r) = &s.resource {
                b = b.resource(r.clone());
            }
            b = b.retry(retry).deadline_policy(DeadlinePolicy::new(
                duration(s.deadline_ms),
                duration(s.deadline_cap_ms),
            ));
        }
        let mut wf = b.build()?;
        if let Some(schema) = &d.input_schema {
            // Checked by `check_input` against the schema: there is no type to read it into.
            wf.input_schema = Some(Arc::new(schema.clone()));
        }
        wf.without_code = true;
        Ok(wf)
    }

    /// Whether this workflow was rebuilt from a published description and has no code
    /// ([`Workflow::from_description`]).
    #[doc(hidden)]
    pub fn is_without_code(&self) -> bool {
        self.without_code
    }

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
                    resource: s.resource.as_deref().map(str::to_owned),
                }
            })
            .collect();
        WorkflowDescription {
            name: self.name.clone(),
            version: self.version,
            business_keys: self.key_policy.as_str().to_owned(),
            on_failure: self.on_failure.as_str().to_owned(),
            notify_on_finish: self.notify_on_finish,
            flow_key: self.flow_key.clone(),
            priority: self.priority,
            retries: self.retry_lane.as_str().to_owned(),
            steps,
            input_schema: self.input_schema.as_deref().cloned(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use serde::Deserialize;

    use crate::{DeadlinePolicy, RetryLane, StepContext, StepError, Workflow};

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
    fn a_workflow_rebuilt_from_its_description_describes_itself_the_same_and_has_no_code() {
        let d = order().describe();
        let rebuilt = Workflow::from_description(&d).expect("rebuilt");
        assert_eq!(rebuilt.describe(), d);
        assert!(rebuilt.is_without_code());
        let e = crate::Registry::new()
            .register(rebuilt.clone())
            .expect_err("refused");
        assert!(e.to_string().contains("no code"), "{e}");
        assert!(
            rebuilt
                .check_input(&serde_json::json!({"order_id": "o-1", "qty": 2}))
                .is_ok()
        );
        let e = rebuilt
            .check_input(&serde_json::json!({"order_id": "o-1"}))
            .expect_err("refused");
        assert!(e.to_string().contains("missing field `qty`"), "{e}");
        let mut bad = d.clone();
        bad.steps[1].kind = "sideways".into();
        assert!(Workflow::from_description(&bad).is_err());
    }

    #[test]
    fn the_default_priority_and_the_retry_lane_are_published_when_set() {
        let text = serde_json::to_string(&order().describe()).expect("json");
        assert!(
            !text.contains("\"priority\"") && !text.contains("\"retries\""),
            "the defaults leave the published text as it was: {text}"
        );
        let urgent = Workflow::builder("urgent", 1)
            .priority(-7)
            .retries(RetryLane::Behind)
            .step("s", |_: StepContext| async { Ok::<_, StepError>(()) })
            .build()
            .expect("valid");
        let d = urgent.describe();
        assert_eq!((d.priority, d.retries.as_str()), (-7, "behind"));
        let rebuilt = Workflow::from_description(&d).expect("rebuilt");
        assert_eq!(
            (rebuilt.priority(), rebuilt.retry_lane()),
            (-7, RetryLane::Behind)
        );
        let mut bad = d.clone();
        bad.retries = "sideways".into();
        let e = Workflow::from_description(&bad).expect_err("unknown lane");
        assert!(e.to_string().contains("`sideways`"), "{e}");
        bad = d;
        bad.priority = 5_000;
        let e = Workflow::from_description(&bad).expect_err("out of range");
        assert!(e.to_string().contains("5000 is outside"), "{e}");
    }

    #[test]
    fn a_default_priority_out_of_range_is_refused_at_build() {
        let e = Workflow::builder("w", 1)
            .priority(1_001)
            .step("s", |_: StepContext| async { Ok::<_, StepError>(()) })
            .build()
            .expect_err("out of range");
        assert_eq!(
            e.to_string(),
            "invalid workflow definition `w`: the default priority is invalid: 1001 is outside -1000..=1000"
        );
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
