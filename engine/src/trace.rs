//! Tracing of runs: the W3C trace context a run keeps from its start, and the spans of step
//! attempts and run evaluations.
//!
//! A run's trace context is stored on its row when it is started (`trace_parent`,
//! `trace_state`) and read back with the claim of each of its steps, so every attempt, on
//! whatever instance and after whatever crash, belongs to the run's trace. Each attempt gets
//! a span id of its own: [`StepContext::trace_parent`](crate::StepContext::trace_parent) is
//! the `traceparent` header a step sends downstream.

use std::fmt;

use tracing::Span;
use uuid::Uuid;

use crate::{Error, Result, StartOption};

/// Name of the span of one step attempt (forward or compensation).
pub const ATTEMPT_SPAN: &str = "sagaflow.step";

/// Name of the span of one run evaluation.
pub const EVALUATE_SPAN: &str = "sagaflow.evaluate";

/// The longest `tracestate` kept, in bytes: what W3C asks every participant to propagate.
pub const TRACE_STATE_MAX: usize = 512;

/// Trace flag: the caller may have recorded its span (`sampled`).
const SAMPLED: u8 = 0x01;

/// A W3C trace context: a `traceparent` (trace id, parent span id, flags) and an optional
/// `tracestate`.
///
/// # Examples
///
/// ```
/// use sagaflow_engine::trace::TraceContext;
///
/// let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
/// let ctx = TraceContext::parse(tp, Some("vendor=abc")).expect("a valid traceparent");
/// assert_eq!(ctx.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
/// assert_eq!(ctx.traceparent(), tp);
/// assert!(TraceContext::parse("00-nothex", None).is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceContext {
    trace_id: u128,
    span_id: u64,
    flags: u8,
    state: Option<String>,
}

impl TraceContext {
    /// Reads a `traceparent` header value (`00-<32 hex>-<16 hex>-<2 hex>`, lowercase) and an
    /// optional `tracestate`.
    ///
    /// A version other than `00` (but not the invalid `ff`) is read as far as version `00`
    /// goes, as W3C asks of a receiver; it is written back as version `00`.
    ///
    /// # Errors
    /// [`Error::InvalidStartOption`] naming [`StartOption::TraceParent`] or
    /// [`StartOption::TraceState`], with the reason.
    pub fn parse(traceparent: &str, tracestate: Option<&str>) -> Result<Self> {
        let invalid = |reason: &str| Error::InvalidStartOption {
            option: StartOption::TraceParent,
            reason: format!(
                "{reason}; expected `00-<32 hex digits>-<16 hex digits>-<2 hex digits>`, in lowercase"
            ),
        };
        let tp = traceparent.trim();
        if !tp.is_ascii() || tp.len() < 55 {
            return Err(invalid("too short or not ASCII"));
        }
        let (head, rest) = tp.split_at(55);
        let version = &head[0..2];
        if !is_hex(version) || version == "ff" {
            return Err(invalid("not a valid version"));
        }
        if (version == "00" && !rest.is_empty()) || (!rest.is_empty() && !rest.starts_with('-')) {
            return Err(invalid("unexpected characters after the flags"));
        }
        let b = head.as_bytes();
        if b[2] != b'-' || b[35] != b'-' || b[52] != b'-' {
            return Err(invalid("fields not separated by `-`"));
        }
        let (trace, span, flags) = (&head[3..35], &head[36..52], &head[53..55]);
        if !(is_hex(trace) && is_hex(span) && is_hex(flags)) {
            return Err(invalid("a field is not lowercase hexadecimal"));
        }
        let trace_id = u128::from_str_radix(trace, 16).map_err(|_| invalid("bad trace id"))?;
        let span_id = u64::from_str_radix(span, 16).map_err(|_| invalid("bad parent id"))?;
        let flags = u8::from_str_radix(flags, 16).map_err(|_| invalid("bad flags"))?;
        if trace_id == 0 {
            return Err(invalid("the trace id is all zeros"));
        }
        if span_id == 0 {
            return Err(invalid("the parent id is all zeros"));
        }
        let state = tracestate.map(check_state).transpose()?.flatten();
        Ok(Self {
            trace_id,
            span_id,
            flags,
            state,
        })
    }

    /// A new trace: a random trace id, a random span id standing for the run's start, and the
    /// `sampled` flag.
    pub fn generate() -> Self {
        Self {
            trace_id: nonzero_u128(),
            span_id: nonzero_u64(),
            flags: SAMPLED,
            state: None,
        }
    }

    /// The context of a run stored without one (started before the engine kept trace
    /// contexts): the run id read as the trace id, so all its attempts still share a trace.
    pub fn of_run(run_id: Uuid) -> Self {
        Self {
            trace_id: run_id.as_u128().max(1),
            span_id: nonzero_u64(),
            flags: SAMPLED,
            state: None,
        }
    }

    /// A context in the same trace, with a new span id (for one attempt).
    #[must_use]
    pub fn child(&self) -> Self {
        Self {
            span_id: nonzero_u64(),
            ..self.clone()
        }
    }

    /// The same context with another span id, as an OpenTelemetry span assigned it.
    #[must_use]
    pub fn with_span_id(mut self, span_id: u64) -> Self {
        if span_id != 0 {
            self.span_id = span_id;
        }
        self
    }

    /// From ids and flags (an OpenTelemetry span context); `None` when an id is zero.
    pub fn from_parts(
        trace_id: u128,
        span_id: u64,
        flags: u8,
        state: Option<String>,
    ) -> Option<Self> {
        (trace_id != 0 && span_id != 0).then_some(Self {
            trace_id,
            span_id,
            flags,
            state: state.filter(|s| !s.is_empty()),
        })
    }

    /// The trace id, 32 lowercase hex digits.
    pub fn trace_id(&self) -> String {
        format!("{:032x}", self.trace_id)
    }

    /// The trace id as a number.
    pub fn trace_id_u128(&self) -> u128 {
        self.trace_id
    }

    /// The span id (the parent id of a `traceparent`), 16 lowercase hex digits.
    pub fn span_id(&self) -> String {
        format!("{:016x}", self.span_id)
    }

    /// The span id as a number.
    pub fn span_id_u64(&self) -> u64 {
        self.span_id
    }

    /// The trace flags (bit 0: sampled).
    pub fn flags(&self) -> u8 {
        self.flags
    }

    /// The `tracestate`, if any.
    pub fn trace_state(&self) -> Option<&str> {
        self.state.as_deref()
    }

    /// The `traceparent` header value: `00-<trace id>-<span id>-<flags>`.
    pub fn traceparent(&self) -> String {
        format!(
            "00-{:032x}-{:016x}-{:02x}",
            self.trace_id, self.span_id, self.flags
        )
    }

    /// The trace id, formatted only when displayed (for span fields).
    pub fn display_trace_id(&self) -> impl fmt::Display + use<> {
        TraceId(self.trace_id)
    }
}

/// Checks a `tracestate`: at most [`TRACE_STATE_MAX`] bytes of printable ASCII, at most 32
/// `key=value` members. An empty one is none.
fn check_state(state: &str) -> Result<Option<String>> {
    let invalid = |reason: String| Error::InvalidStartOption {
        option: StartOption::TraceState,
        reason,
    };
    let state = state.trim();
    if state.is_empty() {
        return Ok(None);
    }
    if state.len() > TRACE_STATE_MAX {
        return Err(invalid(format!(
            "{} bytes, more than {TRACE_STATE_MAX}",
            state.len()
        )));
    }
    if !state.bytes().all(|c| (0x20..=0x7e).contains(&c)) {
        return Err(invalid(
            "holds characters other than printable ASCII".into(),
        ));
    }
    let members: Vec<&str> = state
        .split(',')
        .map(str::trim)
        .filter(|m| !m.is_empty())
        .collect();
    if members.len() > 32 {
        return Err(invalid(format!("{} members, more than 32", members.len())));
    }
    for m in &members {
        match m.split_once('=') {
            Some((k, v)) if !k.is_empty() && !v.is_empty() && !k.contains(' ') => {}
            _ => return Err(invalid(format!("member `{m}` is not `key=value`"))),
        }
    }
    Ok(Some(state.to_owned()))
}

fn is_hex(s: &str) -> bool {
    s.bytes()
        .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c))
}

fn nonzero_u128() -> u128 {
    rand::random::<u128>().max(1)
}

fn nonzero_u64() -> u64 {
    rand::random::<u64>().max(1)
}

/// A trace id, displayed as 32 lowercase hex digits.
#[derive(Debug, Clone, Copy)]
struct TraceId(u128);

impl fmt::Display for TraceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

/// The trace id of a stored `traceparent`, displayed lazily (empty when there is none).
#[derive(Debug, Clone, Copy)]
pub struct StoredTraceId<'a>(pub Option<&'a str>);

impl fmt::Display for StoredTraceId<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.0.and_then(|tp| tp.get(3..35)).unwrap_or(""))
    }
}

/// The span of one attempt (the scheduler opens one per attempt): the user's step code runs
/// inside it, so its own events carry these fields. Its trace is the run's; with the `otel` feature its OpenTelemetry parent is
/// the run's stored context. Returns the span and the attempt's context (the run's trace, the
/// attempt's span id).
pub fn attempt_span(
    run: &TraceContext,
    run_id: Uuid,
    workflow: &str,
    step: &str,
    compensation: bool,
    attempt: u32,
    idempotency_key: &str,
) -> (Span, TraceContext) {
    let attempt_ctx = run.child();
    let span = tracing::info_span!(
        ATTEMPT_SPAN,
        run_id = %run_id,
        workflow = %workflow,
        step = %step,
        phase = if compensation { "compensation" } else { "forward" },
        attempt,
        idempotency_key = %idempotency_key,
        trace_id = %attempt_ctx.display_trace_id(),
    );
    #[cfg(feature = "otel")]
    let attempt_ctx = otel::adopt(&span, run, attempt_ctx);
    (span, attempt_ctx)
}

/// What an evaluation's span names of its run: the run, its workflow and state, and the
/// trace context stored with it (`traceparent`, `tracestate`).
pub(crate) struct EvaluatedRun<'a> {
    pub(crate) id: uuid::Uuid,
    pub(crate) workflow: &'a str,
    pub(crate) state: &'a str,
    pub(crate) trace_parent: Option<&'a str>,
    /// Read only to adopt the stored context as the span's OpenTelemetry parent.
    #[cfg_attr(not(feature = "otel"), allow(dead_code))]
    pub(crate) trace_state: Option<&'a str>,
}

/// The span of one evaluation of a run (where the engine decides how the run moves).
pub(crate) fn evaluate_span(run: &EvaluatedRun<'_>) -> Span {
    let span = tracing::debug_span!(
        EVALUATE_SPAN,
        run_id = %run.id,
        workflow = %run.workflow,
        state = %run.state,
        trace_id = %StoredTraceId(run.trace_parent),
    );
    #[cfg(feature = "otel")]
    if !span.is_disabled()
        && let Some(tp) = run.trace_parent
        && let Ok(ctx) = TraceContext::parse(tp, run.trace_state)
    {
        otel::adopt(&span, &ctx, ctx.clone());
    }
    span
}

#[cfg(feature = "otel")]
pub mod otel {
    //! The bridge to OpenTelemetry (feature `otel`): spans of attempts and evaluations get
    //! the run's stored context as their OpenTelemetry parent, and a start captures the
    //! caller's current OpenTelemetry context.

    use opentelemetry::trace::{
        SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState,
    };
    use tracing::Span;
    use tracing_opentelemetry::OpenTelemetrySpanExt;

    use super::TraceContext;

    /// Sets `span`'s OpenTelemetry parent to the remote context `parent`, and answers `ours`
    /// with the span id OpenTelemetry gave the span (unchanged when no OpenTelemetry layer
    /// records it).
    pub(crate) fn adopt(span: &Span, parent: &TraceContext, ours: TraceContext) -> TraceContext {
        if span.is_disabled() {
            return ours;
        }
        let _ = span.set_parent(context_of(parent));
        let cx = span.context();
        let sc = cx.span().span_context().clone();
        if sc.is_valid() && sc.trace_id() == TraceId::from(parent.trace_id_u128()) {
            ours.with_span_id(u64::from_be_bytes(sc.span_id().to_bytes()))
        } else {
            ours
        }
    }

    /// An OpenTelemetry context whose (remote) span is `ctx`.
    pub fn context_of(ctx: &TraceContext) -> opentelemetry::Context {
        let state = ctx
            .trace_state()
            .and_then(|s| s.parse::<TraceState>().ok())
            .unwrap_or_default();
        let sc = SpanContext::new(
            TraceId::from(ctx.trace_id_u128()),
            SpanId::from(ctx.span_id_u64()),
            TraceFlags::new(ctx.flags()),
            true,
            state,
        );
        opentelemetry::Context::new().with_remote_span_context(sc)
    }

    /// The OpenTelemetry context of the current `tracing` span, if it has a valid one.
    pub fn current() -> Option<TraceContext> {
        let cx = Span::current().context();
        let span = cx.span();
        let sc = span.span_context();
        if !sc.is_valid() {
            return None;
        }
        let state = sc.trace_state().header();
        TraceContext::from_parts(
            u128::from_be_bytes(sc.trace_id().to_bytes()),
            u64::from_be_bytes(sc.span_id().to_bytes()),
            sc.trace_flags().to_u8(),
            Some(state),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn a_traceparent_round_trips_and_children_keep_the_trace() {
        let ctx = TraceContext::parse(TP, Some("a=1, b=2")).expect("valid");
        assert_eq!(ctx.traceparent(), TP);
        assert_eq!(ctx.trace_state(), Some("a=1, b=2"));
        let child = ctx.child();
        assert_eq!(child.trace_id(), ctx.trace_id());
        assert_ne!(child.span_id(), ctx.span_id());
        assert_eq!(child.trace_state(), ctx.trace_state());
        // A later version is read as far as version 00 goes.
        let later = format!("cc{}-more", &TP[2..]);
        assert_eq!(
            TraceContext::parse(&later, None)
                .expect("v cc")
                .traceparent(),
            TP
        );
    }

    #[test]
    fn malformed_contexts_are_refused_naming_the_option() {
        let zeros_trace = "00-00000000000000000000000000000000-00f067aa0ba902b7-01";
        let zeros_span = "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01";
        let upper = "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01";
        let ff = "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let extra = format!("{TP}-x");
        for bad in ["", "00-abc", zeros_trace, zeros_span, upper, ff, &extra] {
            match TraceContext::parse(bad, None) {
                Err(Error::InvalidStartOption {
                    option: StartOption::TraceParent,
                    ..
                }) => {}
                other => panic!("{bad:?}: {other:?}"),
            }
        }
        for bad in ["novalue", "a=1,=2", "a=\u{e9}"] {
            match TraceContext::parse(TP, Some(bad)) {
                Err(Error::InvalidStartOption {
                    option: StartOption::TraceState,
                    ..
                }) => {}
                other => panic!("{bad:?}: {other:?}"),
            }
        }
        assert_eq!(
            TraceContext::parse(TP, Some(" "))
                .expect("empty")
                .trace_state(),
            None
        );
    }

    #[test]
    fn generated_contexts_are_valid_and_distinct() {
        let (a, b) = (TraceContext::generate(), TraceContext::generate());
        assert_ne!(a.trace_id(), b.trace_id());
        let reread = TraceContext::parse(&a.traceparent(), None).expect("valid");
        assert_eq!(reread, a);
        let run = Uuid::now_v7();
        assert_eq!(
            TraceContext::of_run(run).trace_id(),
            run.simple().to_string()
        );
        assert_eq!(StoredTraceId(Some(TP)).to_string(), &TP[3..35]);
        assert_eq!(StoredTraceId(None).to_string(), "");
    }
}
