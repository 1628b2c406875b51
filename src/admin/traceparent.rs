//! The W3C trace context of a REST start: the request's `traceparent` and `tracestate`
//! headers.
//!
//! As W3C Trace Context asks of a receiver, a malformed `traceparent` is ignored (the run
//! then starts a new trace) and so is a malformed `tracestate` alone (the run keeps the
//! trace parent without it). Neither refuses the start: tracing never costs a business
//! request. What was ignored is logged at debug level.

use axum::http::HeaderMap;
use sagaflow_engine::trace::TraceContext;

use crate::StartOptions;

/// `options` with the trace context of `headers`, when they carry a valid one.
pub(super) fn with_trace_headers(options: StartOptions, headers: &HeaderMap) -> StartOptions {
    let Some(parent) = one_header(headers, "traceparent") else {
        return options;
    };
    if let Err(e) = TraceContext::parse(parent, None) {
        tracing::debug!(error = %e, "ignored a malformed traceparent header; the run starts a new trace");
        return options;
    }
    let options = options.trace_parent(parent);
    match one_header(headers, "tracestate") {
        Some(state) => match TraceContext::parse(parent, Some(state)) {
            Ok(_) => options.trace_state(state),
            Err(e) => {
                tracing::debug!(error = %e, "ignored a malformed tracestate header");
                options
            }
        },
        None => options,
    }
}

/// The value of a header sent once, as text. W3C allows `tracestate` in several header
/// lines; only the first is kept.
fn one_header<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, v.parse().expect("header value"));
        }
        h
    }

    #[test]
    fn valid_headers_are_kept_and_malformed_ones_ignored() {
        let o = with_trace_headers(
            StartOptions::default(),
            &headers(&[("traceparent", TP), ("tracestate", "a=1")]),
        );
        assert_eq!(
            (o.trace_parent.as_deref(), o.trace_state.as_deref()),
            (Some(TP), Some("a=1"))
        );
        let o = with_trace_headers(
            StartOptions::default(),
            &headers(&[("traceparent", "00-zz"), ("tracestate", "a=1")]),
        );
        assert_eq!((o.trace_parent, o.trace_state), (None, None));
        let o = with_trace_headers(
            StartOptions::default(),
            &headers(&[("traceparent", TP), ("tracestate", "novalue")]),
        );
        assert_eq!((o.trace_parent.as_deref(), o.trace_state), (Some(TP), None));
    }
}
