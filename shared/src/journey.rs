//! One object's journey across both agents, as OpenTelemetry traces: off by default; on with
//! `--otlp-endpoint` or the standard `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` /
//! `OTEL_EXPORTER_OTLP_ENDPOINT` (and off again with `OTEL_SDK_DISABLED=true`).
//!
//! The agents mark each stage of a change with a span of target [`TARGET`] at level TRACE:
//! the local agent's `reflect` (from the reconcile of the watch event, with how long it waited
//! in the queue), `forge`, `outbox` and `send`, then `ack` when the answer arrives; the remote
//! agent's `apply`, `judge` and `write`. The trace context travels in `Upsert.trace_parent`,
//! so the remote agent's spans join the origin's trace. Only these spans are exported, never
//! log lines, and at level TRACE they never reach the log either: with tracing off they cost
//! a disabled callsite.
//!
//! A tenant's `trace_parent` is untrusted input: anything but a well-formed W3C traceparent
//! is ignored and the provider's span starts a trace of its own.

use std::collections::HashMap;
use std::sync::OnceLock;
use std::time::Duration;

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::TraceContextExt;
use opentelemetry_sdk::trace::{SdkTracerProvider, SpanData, SpanExporter};
use opentelemetry_sdk::Resource;
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// The target of every journey span: the only ones exported.
pub const TARGET: &str = "refract::journey";

/// The length of a W3C `traceparent` of version 00.
const TRACEPARENT_LEN: usize = 55;

/// The exporting provider, flushed at exit.
static PROVIDER: OnceLock<SdkTracerProvider> = OnceLock::new();

/// The trace flags both agents take.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct TraceArgs {
    /// Export each reflected change's journey as OpenTelemetry traces to this OTLP/gRPC
    /// endpoint (for example http://otel-collector:4317). Off when neither this nor
    /// OTEL_EXPORTER_OTLP_TRACES_ENDPOINT / OTEL_EXPORTER_OTLP_ENDPOINT is set;
    /// OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES, OTEL_TRACES_SAMPLER(_ARG) and OTEL_BSP_*
    /// are honoured.
    #[arg(long, value_name = "URL")]
    pub otlp_endpoint: Option<String>,
}

impl TraceArgs {
    /// Where traces go, if anywhere: the flag, else the standard variables.
    fn endpoint(&self) -> Option<Option<String>> {
        let env = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        if env("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
            return None;
        }
        if let Some(flag) = &self.otlp_endpoint {
            return Some(Some(flag.clone()));
        }
        // The exporter reads the variables itself.
        (env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").is_some()
            || env("OTEL_EXPORTER_OTLP_ENDPOINT").is_some())
        .then_some(None)
    }
}

/// The layer exporting journey spans for `service`, when tracing is on.
pub fn layer<S>(
    args: &TraceArgs,
    service: &'static str,
) -> anyhow::Result<Option<impl tracing_subscriber::Layer<S>>>
where
    S: tracing::Subscriber + for<'span> tracing_subscriber::registry::LookupSpan<'span>,
{
    use opentelemetry::trace::TracerProvider as _;
    use tracing_subscriber::Layer as _;
    let Some(endpoint) = args.endpoint() else {
        return Ok(None);
    };
    let exporter = OwnRuntime::build(endpoint.as_deref())?;
    let mut resource = Resource::builder();
    if std::env::var_os("OTEL_SERVICE_NAME").is_none() {
        resource = resource.with_service_name(service);
    }
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource.build())
        .build();
    let tracer = provider.tracer("refract");
    let _ = PROVIDER.set(provider);
    let only_journeys =
        tracing_subscriber::filter::Targets::new().with_target(TARGET, tracing::Level::TRACE);
    Ok(Some(
        tracing_opentelemetry::layer()
            .with_tracer(tracer)
            .with_filter(only_journeys),
    ))
}

/// Whole milliseconds since `since`, a span attribute.
pub fn millis_since(since: std::time::Instant) -> u64 {
    u64::try_from(since.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// Exports what is still buffered; call once, at exit, outside the async runtime.
pub fn flush() {
    if let Some(provider) = PROVIDER.get() {
        if let Err(error) = provider.shutdown() {
            eprintln!("failed to flush traces: {error}");
        }
    }
}

/// The W3C `traceparent` of `span`'s context, to send with the change; empty when the span
/// is not exported.
pub fn traceparent(span: &tracing::Span) -> String {
    if span.is_disabled() {
        return String::new();
    }
    let context = span.context();
    if !context.span().span_context().is_valid() {
        return String::new();
    }
    let mut carrier = HashMap::new();
    opentelemetry_sdk::propagation::TraceContextPropagator::new()
        .inject_context(&context, &mut carrier);
    carrier.remove("traceparent").unwrap_or_default()
}

/// Makes `span` a child of the remote span `traceparent` names, if it is well-formed;
/// otherwise `span` starts a trace of its own.
pub fn continue_from(span: &tracing::Span, traceparent: &str) {
    if traceparent.len() != TRACEPARENT_LEN || !traceparent.is_ascii() {
        return;
    }
    let carrier = HashMap::from([("traceparent".to_string(), traceparent.to_string())]);
    let context = opentelemetry_sdk::propagation::TraceContextPropagator::new().extract(&carrier);
    if context.span().span_context().is_valid() {
        let _ = span.set_parent(context);
    }
}

/// The OTLP/gRPC exporter on a runtime of its own: the SDK's batch processor exports from a
/// thread of its own, where the gRPC client finds no runtime to run on.
#[derive(Debug)]
struct OwnRuntime {
    inner: opentelemetry_otlp::SpanExporter,
    runtime: tokio::runtime::Runtime,
}

impl OwnRuntime {
    fn build(endpoint: Option<&str>) -> anyhow::Result<Self> {
        use opentelemetry_otlp::WithExportConfig as _;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("refract-otlp")
            .enable_all()
            .build()?;
        let inner = {
            // The gRPC channel starts its connection task on the runtime entered here.
            let _entered = runtime.enter();
            let mut builder = opentelemetry_otlp::SpanExporter::builder()
                .with_tonic()
                .with_timeout(Duration::from_secs(10));
            if let Some(endpoint) = endpoint {
                builder = builder.with_endpoint(endpoint);
            }
            builder
                .build()
                .map_err(|e| anyhow::anyhow!("invalid OTLP exporter settings: {e}"))?
        };
        Ok(Self { inner, runtime })
    }
}

impl SpanExporter for OwnRuntime {
    async fn export(&self, batch: Vec<SpanData>) -> opentelemetry_sdk::error::OTelSdkResult {
        self.runtime.block_on(self.inner.export(batch))
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> opentelemetry_sdk::error::OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> opentelemetry_sdk::error::OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_malformed_traceparent_is_ignored_and_a_disabled_span_has_none() {
        let span = tracing::Span::none();
        continue_from(&span, "00-not-a-trace");
        continue_from(&span, &"x".repeat(TRACEPARENT_LEN));
        assert_eq!(traceparent(&span), "");
    }
}
