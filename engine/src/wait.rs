//! Parked steps: timers, named events, callbacks and child runs.
//!
//! A step that waits does not hold a task: its attempt ends with a *park* (a [`StepError`]
//! carrying a [`WaitRequest`]), the completion write moves the step to
//! [`StepState::Waiting`](crate::StepState::Waiting) with what it waits for in its `wait`
//! column and its timeout as its due time, and the step's next attempt, once it is woken,
//! reads what woke it from the same column:
//!
//! | waits for | woken by | the resumed attempt |
//! |---|---|---|
//! | a timer | the leader's timer pass, at its time | completes with `{"fired": true}` |
//! | a named event | [`deliver::send_event`](crate::deliver::send_event), or its timeout | completes with the payload, or takes the [`OnTimeout`] path |
//! | a callback | the token's HTTP call ([`deliver::complete_callback`](crate::deliver::complete_callback)), or its timeout | completes or fails as the callback said, or fails retryably (the remote never answered) |
//! | a child run | the child's end, in the child's last evaluation | completes with the child's output, or fails when the child was compensated |
//!
//! Events (and callbacks, which are events named after their token) that arrive before their
//! step waits are kept in `sagaflow_events` and consumed by the step when it parks.

use std::time::Duration;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::definition::{StepAction, StepContext};
use crate::{RunState, StepError};

/// The code of the error a wait's timeout fails its step with.
pub const WAIT_TIMED_OUT: &str = "wait_timed_out";
/// The code of the error a child step fails with when its child run was compensated.
pub const CHILD_COMPENSATED: &str = "child_compensated";
/// The prefix of the event a callback token's call is delivered as.
pub(crate) const CALLBACK_EVENT: &str = "callback:";

/// What a parked step waits for, as stored in its `wait` column.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "for", rename_all = "snake_case")]
#[non_exhaustive]
pub enum WaitFor {
    /// Its time: the step's due time.
    Timer,
    /// A named event sent to its run (a callback is the event `callback:<token hash>`).
    Event {
        /// The event's name.
        name: String,
    },
    /// The end of a child run it started.
    Child {
        /// The child run.
        run_id: Uuid,
        /// The child's workflow.
        workflow: String,
    },
}

impl WaitFor {
    /// Short description for operators: `timer`, `event manager_approval`, `callback`,
    /// `child <id>`.
    pub fn describe(&self) -> String {
        match self {
            Self::Timer => "timer".to_owned(),
            Self::Event { name } if name.starts_with(CALLBACK_EVENT) => "callback".to_owned(),
            Self::Event { name } => format!("event {name}"),
            Self::Child { run_id, workflow } => format!("child {workflow} {run_id}"),
        }
    }
}

/// What woke a waiting step, stored with its wait for the resumed attempt.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "by", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Woken {
    /// The event it waited for, with its payload.
    Event {
        /// The payload sent.
        payload: serde_json::Value,
    },
    /// Its child run ended.
    Child {
        /// The child's state: `completed`, `compensated`.
        state: RunState,
        /// The child's output (its steps' outputs by name), when it completed.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        output: Option<serde_json::Value>,
    },
}

/// A step's stored wait: what for, for how long at most, and (once woken) by what. A wait
/// without `woken` whose step runs again was woken by its time.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WaitState {
    /// What it waits for.
    #[serde(flatten)]
    pub on: WaitFor,
    /// Its timeout, in milliseconds from when it parked.
    pub timeout_ms: u64,
    /// What woke it, if not its time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub woken: Option<Woken>,
}

impl WaitState {
    /// The stored JSON.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// A step attempt's request to park, carried by the [`StepError`] it ends with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WaitRequest {
    /// What to wait for.
    #[serde(flatten)]
    pub on: WaitFor,
    /// How long at most, in milliseconds (the timer's delay, for a timer).
    pub timeout_ms: u64,
    /// The child run to start with the park (a child step), as `(workflow, input)`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_child: Option<(String, serde_json::Value)>,
}

/// What a wait for an event does when its timeout passes first.
#[derive(Debug, Clone, PartialEq, Default)]
#[non_exhaustive]
pub enum OnTimeout {
    /// The step fails, and the run stops in `Error` with an alert for an operator (who can
    /// retry the step, which waits again, or compensate). The default.
    #[default]
    Fail,
    /// The step fails and the run compensates, whatever its workflow's failure policy.
    Compensate,
    /// The step completes with this value as its output, as if the event had carried it.
    Default(serde_json::Value),
}

impl OnTimeout {
    /// The published spelling: `fail`, `compensate`, `default`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Self::Fail => "fail",
            Self::Compensate => "compensate",
            Self::Default(_) => "default",
        }
    }
}

/// A step that waits for a named event sent to its run.
///
/// ```
/// use std::time::Duration;
/// use sagaflow_engine::wait::{EventWait, OnTimeout};
///
/// let approval = EventWait::named("manager_approval")
///     .within(Duration::from_secs(48 * 3600))
///     .on_timeout(OnTimeout::Compensate);
/// assert_eq!(approval.name(), "manager_approval");
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct EventWait {
    pub(crate) name: String,
    pub(crate) within: Duration,
    pub(crate) on_timeout: OnTimeout,
}

/// The longest a step may wait: about ten years.
pub const WAIT_MAX: Duration = Duration::from_secs(10 * 366 * 24 * 3600);

impl EventWait {
    /// Waits for the event `name`, at most [`WAIT_MAX`] unless told [`within`](Self::within).
    pub fn named(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            within: WAIT_MAX,
            on_timeout: OnTimeout::Fail,
        }
    }

    /// Waits at most `timeout`.
    #[must_use]
    pub fn within(mut self, timeout: Duration) -> Self {
        self.within = timeout;
        self
    }

    /// What happens when the timeout passes first (default [`OnTimeout::Fail`]).
    #[must_use]
    pub fn on_timeout(mut self, on_timeout: OnTimeout) -> Self {
        self.on_timeout = on_timeout;
        self
    }

    /// The event's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The timeout.
    pub fn timeout(&self) -> Duration {
        self.within
    }

    /// The timeout's outcome.
    pub fn timeout_outcome(&self) -> &OnTimeout {
        &self.on_timeout
    }
}

/// What a built-in step of a workflow waits for, as its definition declares it.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum StepWait {
    /// A timer of this length, from when the step becomes due.
    Timer(Duration),
    /// A named event.
    Event(EventWait),
    /// A child run of this workflow.
    Child {
        /// The child's workflow name.
        workflow: String,
    },
}

impl StepWait {
    /// Short description: `timer 30m`, `event manager_approval (48h, on timeout fail)`,
    /// `child return`.
    pub fn describe(&self) -> String {
        match self {
            Self::Timer(d) => format!("timer {}", humantime_short(*d)),
            Self::Event(e) => format!(
                "event {} (within {}, on timeout {})",
                e.name,
                humantime_short(e.within),
                e.on_timeout.as_str()
            ),
            Self::Child { workflow } => format!("child {workflow}"),
        }
    }
}

/// `90s` → `1m30s`, whole units only.
fn humantime_short(d: Duration) -> String {
    let mut s = d.as_secs();
    if s == 0 {
        return format!("{}ms", d.as_millis());
    }
    let mut out = String::new();
    for (unit, len) in [("d", 86_400), ("h", 3600), ("m", 60), ("s", 1)] {
        if s >= len {
            out.push_str(&format!("{}{unit}", s / len));
            s %= len;
        }
    }
    out
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The park that asks for `request`.
pub(crate) fn park(request: WaitRequest) -> StepError {
    StepError {
        wait: Some(Box::new(request)),
        ..StepError::retryable("waiting", "the step waits").not_applied()
    }
}

/// The body of a timer step: parks for its delay, completes once woken.
pub(crate) struct TimerAction(pub(crate) Duration);

#[async_trait::async_trait]
impl StepAction for TimerAction {
    async fn run(&self, ctx: StepContext) -> Result<serde_json::Value, StepError> {
        if ctx.wait.is_some() {
            return Ok(serde_json::json!({ "fired": true }));
        }
        Err(park(WaitRequest {
            on: WaitFor::Timer,
            timeout_ms: millis(self.0),
            start_child: None,
        }))
    }
}

/// The body of a step waiting for a named event.
pub(crate) struct EventAction(pub(crate) EventWait);

#[async_trait::async_trait]
impl StepAction for EventAction {
    async fn run(&self, ctx: StepContext) -> Result<serde_json::Value, StepError> {
        match ctx.wait.as_deref() {
            None => Err(park(WaitRequest {
                on: WaitFor::Event {
                    name: self.0.name.clone(),
                },
                timeout_ms: millis(self.0.within),
                start_child: None,
            })),
            Some(WaitState {
                woken: Some(Woken::Event { payload }),
                ..
            }) => Ok(payload.clone()),
            Some(_) => timed_out(&self.0),
        }
    }
}

/// The outcome of an event wait whose timeout passed first.
fn timed_out(wait: &EventWait) -> Result<serde_json::Value, StepError> {
    match &wait.on_timeout {
        OnTimeout::Default(v) => Ok(v.clone()),
        OnTimeout::Fail | OnTimeout::Compensate => Err(StepError::terminal_unknown(
            WAIT_TIMED_OUT,
            format!(
                "event `{}` did not arrive within {}",
                wait.name,
                humantime_short(wait.within)
            ),
        )
        .not_applied()),
    }
}

/// The input a child step gives its child run, computed from the step's context.
pub(crate) type ChildInput =
    std::sync::Arc<dyn Fn(&StepContext) -> Result<serde_json::Value, StepError> + Send + Sync>;

/// The body of a child step: starts the child (with the park, in the same transaction) and
/// completes with its output.
pub(crate) struct ChildAction {
    pub(crate) workflow: String,
    pub(crate) input: ChildInput,
}

#[async_trait::async_trait]
impl StepAction for ChildAction {
    async fn run(&self, ctx: StepContext) -> Result<serde_json::Value, StepError> {
        match ctx.wait.as_deref() {
            None => {
                let input = (self.input)(&ctx)?;
                let mut e = park(WaitRequest {
                    on: WaitFor::Child {
                        run_id: Uuid::nil(),
                        workflow: self.workflow.clone(),
                    },
                    timeout_ms: millis(WAIT_MAX),
                    start_child: Some((self.workflow.clone(), input)),
                });
                // The child runs: the step has acted, and its compensation undoes the child.
                e.outcome = crate::Outcome::Unknown;
                Err(e)
            }
            Some(WaitState {
                woken: Some(Woken::Child { state, output }),
                ..
            }) => match state {
                RunState::Completed => Ok(output.clone().unwrap_or(serde_json::Value::Null)),
                _ => Err(StepError::terminal_unknown(
                    CHILD_COMPENSATED,
                    format!("child run of `{}` ended {state}", self.workflow),
                )
                .not_applied()),
            },
            // Woken by its time (ten years) or an interrupted resume without its news:
            // wait again; the child's end wakes it.
            Some(WaitState { on, .. }) => Err(park(WaitRequest {
                on: on.clone(),
                timeout_ms: millis(WAIT_MAX),
                start_child: None,
            })),
        }
    }
}

/// The compensation of a child step: undoes the child run (compensates a completed child,
/// cancels an unfinished one) and completes once the child is compensated. Until then it
/// asks to be tried again; the child's end makes it due at once.
pub(crate) struct ChildCompensation;

/// How long a child step's compensation waits between looks at its child (the child's end
/// wakes it sooner).
const CHILD_UNDO_RECHECK: Duration = Duration::from_secs(10);

#[async_trait::async_trait]
impl StepAction for ChildCompensation {
    async fn run(&self, ctx: StepContext) -> Result<serde_json::Value, StepError> {
        let hook = ctx.hook.as_ref().ok_or_else(|| {
            StepError::terminal_unknown("child_undo", "a child step is compensated by an engine")
        })?;
        let undone = hook
            .services
            .undo_child(
                hook.step_id,
                format!("parent:{}", ctx.run_id),
                format!("the parent compensates step `{}`", ctx.step),
            )
            .await;
        match undone {
            Ok(true) => Ok(serde_json::json!({ "child": "compensated" })),
            Ok(false) => Err(StepError::try_again_after(
                "child_compensating",
                "the child run is being undone",
                CHILD_UNDO_RECHECK,
            )),
            Err(e) => Err(StepError::retryable("child_undo", e.to_string()).not_applied()),
        }
    }
}

/// The body of a step resumed after its callback (or the callback's timeout): what the
/// callback said, without calling the step's code again.
pub(crate) struct CallbackResume;

/// What a callback's call carries.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CallbackResult {
    /// The remote finished: the step completes with this output.
    Ok(serde_json::Value),
    /// The remote failed: the step fails with this error (retried if retryable).
    Error(StepError),
}

#[async_trait::async_trait]
impl StepAction for CallbackResume {
    async fn run(&self, ctx: StepContext) -> Result<serde_json::Value, StepError> {
        match ctx.wait.as_deref() {
            Some(WaitState {
                woken: Some(Woken::Event { payload }),
                ..
            }) => match serde_json::from_value::<CallbackResult>(payload.clone()) {
                Ok(CallbackResult::Ok(v)) => Ok(v),
                Ok(CallbackResult::Error(mut e)) => {
                    e.wait = None;
                    Err(e)
                }
                Err(e) => Err(StepError::terminal_unknown(
                    "callback_unreadable",
                    format!("the callback's payload is not a result: {e}"),
                )),
            },
            Some(w) => Err(StepError::retryable(
                "callback_timed_out",
                format!(
                    "no callback within {}: the remote may or may not have acted",
                    humantime_short(Duration::from_millis(w.timeout_ms))
                ),
            )),
            None => Err(StepError::terminal_unknown(
                "callback_missing",
                "nothing to resume",
            )),
        }
    }
}

/// The key that signs callback tokens, shared by every engine of a database (the row
/// `callback_mac` of `sagaflow_secrets`, created by the first engine that needs it).
///
/// A token is `<run>.<nonce>.<mac>`: the run id, 128 random bits, and the first 128 bits of
/// HMAC-SHA256 over the run and the nonce, all in hex. The engine checks the MAC itself, so a
/// forged token is refused without a database read; a token with a valid MAC is then looked
/// up (by its SHA-256, the only form stored) to learn whether its step still waits for it.
#[derive(Clone)]
pub(crate) struct CallbackKey([u8; 32]);

impl std::fmt::Debug for CallbackKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CallbackKey(..)")
    }
}

/// Hex digits of a token's nonce and of its MAC (128 bits each).
const NONCE_HEX: usize = 32;
const MAC_HEX: usize = 32;

type HmacSha256 = hmac::Hmac<sha2::Sha256>;

impl CallbackKey {
    /// A new random key.
    pub(crate) fn generate() -> Self {
        Self(rand::random())
    }

    /// The key stored as `hex`, if it is 64 hex digits.
    pub(crate) fn from_hex(hex: &str) -> Option<Self> {
        let mut key = [0u8; 32];
        hex::decode_to_slice(hex.trim(), &mut key).ok()?;
        Some(Self(key))
    }

    /// The stored form.
    pub(crate) fn to_hex(&self) -> String {
        hex::encode(self.0)
    }

    fn mac(&self, run: &str, nonce: &str) -> HmacSha256 {
        use hmac::{KeyInit, Mac};
        let mut m = <HmacSha256 as KeyInit>::new_from_slice(&self.0)
            .unwrap_or_else(|_| unreachable!("HMAC accepts keys of any length"));
        m.update(b"sagaflow callback v1\0");
        m.update(run.as_bytes());
        m.update(b".");
        m.update(nonce.as_bytes());
        m
    }

    /// A new callback token for `run_id`.
    pub(crate) fn issue(&self, run_id: Uuid) -> String {
        use hmac::Mac;
        let run = run_id.simple().to_string();
        let nonce = hex::encode(rand::random::<[u8; NONCE_HEX / 2]>());
        let tag = self.mac(&run, &nonce).finalize().into_bytes();
        format!("{run}.{nonce}.{}", hex::encode(&tag[..MAC_HEX / 2]))
    }

    /// The run a token names, when this key signed it; `None` for anything else (malformed,
    /// forged, or signed with another key). The comparison takes constant time.
    pub(crate) fn verify(&self, token: &str) -> Option<Uuid> {
        use hmac::Mac;
        let mut parts = token.split('.');
        let (run, nonce, tag) = (parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some() || nonce.len() != NONCE_HEX || tag.len() != MAC_HEX {
            return None;
        }
        let mut given = [0u8; MAC_HEX / 2];
        hex::decode_to_slice(tag, &mut given).ok()?;
        if !nonce.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        let run_id = Uuid::try_parse(run).ok()?;
        self.mac(run, nonce).verify_truncated_left(&given).ok()?;
        Some(run_id)
    }
}

/// The stored form of a token (SHA-256, hex).
pub fn token_hash(token: &str) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(token.as_bytes()))
}

/// The event name a callback with this token hash is delivered as.
pub(crate) fn callback_event(hash: &str) -> String {
    format!("{CALLBACK_EVENT}{hash}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_name_their_run_and_only_their_key_accepts_them() {
        let key = CallbackKey::generate();
        let run = Uuid::now_v7();
        let t = key.issue(run);
        assert_eq!(key.verify(&t), Some(run));
        assert_ne!(key.issue(run), t);
        assert_eq!(token_hash(&t).len(), 64);
        // Another database's key, or any change to the token, is refused.
        assert_eq!(CallbackKey::generate().verify(&t), None);
        let (head, tag) = t.rsplit_once('.').expect("three parts");
        let flipped = if tag.starts_with('0') { "1" } else { "0" };
        assert_eq!(key.verify(&format!("{head}.{flipped}{}", &tag[1..])), None);
        let other_run = t.replacen(
            &run.simple().to_string(),
            &Uuid::now_v7().simple().to_string(),
            1,
        );
        assert_eq!(key.verify(&other_run), None);
        for junk in [
            "nope",
            "",
            "..",
            &format!("{t}.00"),
            &format!("{}.{}", run.simple(), "ab".repeat(32)),
        ] {
            assert_eq!(key.verify(junk), None, "{junk}");
        }
        // The stored form round-trips.
        let again = CallbackKey::from_hex(&key.to_hex()).expect("hex");
        assert_eq!(again.verify(&t), Some(run));
        assert!(CallbackKey::from_hex("xyz").is_none());
        assert!(!format!("{key:?}").contains(&key.to_hex()[..8]));
    }

    #[test]
    fn waits_round_trip_through_their_stored_json() {
        let w = WaitState {
            on: WaitFor::Event {
                name: "approval".into(),
            },
            timeout_ms: 5,
            woken: Some(Woken::Event {
                payload: serde_json::json!({"ok": true}),
            }),
        };
        let back: WaitState = serde_json::from_str(&w.to_json()).expect("json");
        assert_eq!(back, w);
        assert_eq!(humantime_short(Duration::from_secs(90)), "1m30s");
        assert_eq!(humantime_short(Duration::from_secs(48 * 3600)), "2d");
    }
}
