//! OpenTelemetry export of the engine's spans (feature `otel`).
//!
//! With the feature on, the span of every step attempt (`sagaflow.step`) and of every run
//! evaluation (`sagaflow.evaluate`) has the run's stored W3C trace context as its
//! OpenTelemetry parent, so a run's attempts, on any instance and after any restart, land
//! in the trace its start belonged to. A start without
//! [`StartOptions::trace_parent`](crate::StartOptions::trace_parent) continues the caller's
//! current OpenTelemetry span, when there is one.
//!
//! This module builds an exporter for an application: spans go over OTLP, HTTP with
//! protobuf bodies, to a collector (port 4318 by convention), in batches from a background
//! thread.
//!
//! # Examples
//!
//! ```no_run
//! use tracing_subscriber::layer::SubscriberExt;
//! use tracing_subscriber::util::SubscriberInitExt;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let provider = sagaflow::otel::otlp_provider("http://127.0.0.1:4318/v1/traces", "orders")?;
//! tracing_subscriber::registry()
//!     .with(tracing_subscriber::fmt::layer())
//!     .with(sagaflow::otel::layer(&provider))
//!     .init();
//! // … run the engine …
//! provider.shutdown()?; // exports what is left
//! # Ok(())
//! # }
//! ```

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::SdkTracer;
use tracing::Subscriber;
use tracing_opentelemetry::OpenTelemetryLayer;
use tracing_subscriber::registry::LookupSpan;

use crate::{Error, Result};

pub use opentelemetry_sdk::trace::SdkTracerProvider;

/// The instrumentation scope the engine's spans are recorded under.
pub const TRACER_NAME: &str = "sagaflow";

/// A tracer provider that exports spans over OTLP/HTTP (protobuf) to `endpoint` (the full
/// URL of the collector's traces path, e.g. `http://127.0.0.1:4318/v1/traces`), in
/// batches, as service `service_name`. Call
/// [`SdkTracerProvider::shutdown`] before the application exits, to export the last batch.
///
/// # Errors
/// [`Error::Config`] when the exporter cannot be built (an endpoint that is not a URL).
pub fn otlp_provider(endpoint: &str, service_name: &str) -> Result<SdkTracerProvider> {
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpBinary)
        .with_endpoint(endpoint)
        .build()
        .map_err(|e| Error::Config(format!("cannot build the OTLP exporter: {e}")))?;
    let resource = Resource::builder()
        .with_service_name(service_name.to_owned())
        .build();
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource)
        .build())
}

/// A `tracing` layer that records spans, the engine's and the application's, into
/// `provider`.
pub fn layer<S>(provider: &SdkTracerProvider) -> OpenTelemetryLayer<S, SdkTracer>
where
    S: Subscriber + for<'span> LookupSpan<'span>,
{
    tracing_opentelemetry::layer().with_tracer(provider.tracer(TRACER_NAME))
}

#[cfg(test)]
mod tests {
    use opentelemetry::trace::TraceContextExt;
    use sagaflow_engine::trace::{TraceContext, attempt_span};
    use tracing_opentelemetry::OpenTelemetrySpanExt;
    use tracing_subscriber::layer::SubscriberExt;

    use super::*;

    const TP: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn attempt_spans_continue_the_stored_trace_and_a_start_captures_the_caller() {
        let provider = SdkTracerProvider::builder().build();
        let subscriber = tracing_subscriber::registry().with(layer(&provider));
        tracing::subscriber::with_default(subscriber, || {
            let run = TraceContext::parse(TP, None).expect("valid");
            let (span, attempt) = attempt_span(&run, uuid::Uuid::nil(), "w@1", "s", false, 1, "k");
            let cx = span.context();
            let otel = cx.span().span_context().clone();
            assert!(otel.is_valid());
            assert_eq!(otel.trace_id().to_string(), run.trace_id());
            assert_eq!(attempt.trace_id(), run.trace_id());
            assert_eq!(attempt.span_id(), otel.span_id().to_string());
            assert_ne!(attempt.span_id(), run.span_id());

            let caller = tracing::info_span!("caller");
            let _entered = caller.enter();
            let captured = crate::start::caller_trace();
            let cx = caller.context();
            let expected = cx.span().span_context().clone();
            assert_eq!(captured.trace_id(), expected.trace_id().to_string());
            assert_eq!(captured.span_id(), expected.span_id().to_string());
        });
    }
}
