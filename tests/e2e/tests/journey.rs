//! One change's journey traced across both agents: both run with `--otlp-endpoint` pointing
//! at an OTLP/gRPC receiver this test serves; one ConfigMap change, and one pod offloaded to a
//! real provider node, each yield one trace holding the local agent's spans (reflect, forge,
//! outbox, send, ack) and the remote agent's (apply, judge, write), the remote ones children of
//! the origin's, each with its duration.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails by panicking"
)]
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use refract_e2e::{busybox, free_port, kubectl_stdin, provider_get, Peering};

const WAIT: Duration = Duration::from_secs(90);

/// One span as received: its service, name, ids and duration.
#[derive(Debug, Clone)]
struct Received {
    service: String,
    name: String,
    trace_id: Vec<u8>,
    span_id: Vec<u8>,
    parent_span_id: Vec<u8>,
    nanos: u64,
    attributes: BTreeMap<String, String>,
}

/// An OTLP trace receiver keeping every span it is sent.
#[derive(Clone, Default)]
struct Receiver(Arc<Mutex<Vec<Received>>>);

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut kept = self.0.lock().unwrap();
        for resource_spans in request.into_inner().resource_spans {
            let service = resource_spans
                .resource
                .iter()
                .flat_map(|r| &r.attributes)
                .find(|a| a.key == "service.name")
                .and_then(|a| text(a.value.as_ref()?.value.as_ref()?))
                .unwrap_or_default();
            for scope in resource_spans.scope_spans {
                for span in scope.spans {
                    let attributes = span
                        .attributes
                        .iter()
                        .filter_map(|a| {
                            Some((a.key.clone(), text(a.value.as_ref()?.value.as_ref()?)?))
                        })
                        .collect();
                    kept.push(Received {
                        service: service.clone(),
                        name: span.name,
                        trace_id: span.trace_id,
                        span_id: span.span_id,
                        parent_span_id: span.parent_span_id,
                        nanos: span
                            .end_time_unix_nano
                            .saturating_sub(span.start_time_unix_nano),
                        attributes,
                    });
                }
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse::default()))
    }
}

fn text(value: &Value) -> Option<String> {
    match value {
        Value::StringValue(s) => Some(s.clone()),
        Value::IntValue(i) => Some(i.to_string()),
        Value::BoolValue(b) => Some(b.to_string()),
        Value::DoubleValue(d) => Some(d.to_string()),
        _ => None,
    }
}

/// Serves an OTLP trace receiver on a free port; returns it and the agents' flag naming it.
async fn serve_receiver() -> (Receiver, String) {
    let receiver = Receiver::default();
    let port = free_port();
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
        .await
        .unwrap();
    let serving = receiver.clone();
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(serving))
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
            .await
            .unwrap();
    });
    (receiver, format!("--otlp-endpoint=http://127.0.0.1:{port}"))
}

/// Waits for the trace of the change of origin object `kind` `name`, holding every stage of
/// both agents, checks how its spans nest, and prints it.
async fn the_journey(p: &Peering, receiver: &Receiver, kind: &str, name: &str) -> Vec<Received> {
    // The batch processors export within their schedule (5 s by default).
    let trace = p
        .eventually(
            WAIT,
            &format!("one trace of {kind} {name} with both agents' spans"),
            || {
                let spans = receiver.0.lock().unwrap().clone();
                let root = spans.iter().find(|s| {
                    s.name == "reflect"
                        && s.attributes.get("name").map(String::as_str) == Some(name)
                        && s.attributes.get("kind").map(String::as_str) == Some(kind)
                })?;
                let trace: Vec<Received> = spans
                    .iter()
                    .filter(|s| s.trace_id == root.trace_id)
                    .cloned()
                    .collect();
                let names: Vec<(&str, &str)> = trace
                    .iter()
                    .map(|s| (s.service.as_str(), s.name.as_str()))
                    .collect();
                let wanted = [
                    ("refract-local-agent", "reflect"),
                    ("refract-local-agent", "forge"),
                    ("refract-local-agent", "outbox"),
                    ("refract-local-agent", "send"),
                    ("refract-remote-agent", "apply"),
                    ("refract-remote-agent", "judge"),
                    ("refract-remote-agent", "write"),
                    ("refract-local-agent", "ack"),
                ];
                wanted.iter().all(|w| names.contains(w)).then_some(trace)
            },
        )
        .await;
    let by_name = |service: &str, name: &str| {
        trace
            .iter()
            .find(|s| s.service == service && s.name == name)
            .unwrap()
    };
    let root = by_name("refract-local-agent", "reflect");
    let apply = by_name("refract-remote-agent", "apply");
    assert!(
        root.parent_span_id.is_empty(),
        "the origin's span is the root"
    );
    assert_eq!(
        apply.parent_span_id, root.span_id,
        "the provider's span continues the origin's"
    );
    for child in ["judge", "write"] {
        assert_eq!(
            by_name("refract-remote-agent", child).parent_span_id,
            apply.span_id,
            "{child} is a stage of apply"
        );
    }
    let ack = by_name("refract-local-agent", "ack");
    assert_eq!(
        ack.attributes.get("outcome").map(String::as_str),
        Some("OUTCOME_APPLIED")
    );
    assert_eq!(
        apply.attributes.get("tenant").map(String::as_str),
        Some("origin")
    );
    println!("{kind} {name}: one trace, {} spans:", trace.len());
    for s in &trace {
        println!(
            "  {:<22} {:<8} {:>9.3} ms  {:?}",
            s.service,
            s.name,
            s.nanos as f64 / 1e6,
            s.attributes
        );
    }
    trace
}

#[tokio::test]
async fn one_config_map_change_is_one_trace_across_both_agents() {
    let (receiver, endpoint) = serve_receiver().await;
    let p = Peering::start_with_flags(false, &[&endpoint], &[&endpoint])
        .await
        .expect("peering");
    p.extend("traced", "{}");
    p.until_extended("traced", WAIT).await;
    kubectl_stdin(
        &p.origin,
        &["apply", "-f", "-"],
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: followed, namespace: traced}\ndata: {k: v}\n",
    );
    p.eventually(WAIT, "the ConfigMap on the provider", || {
        provider_get(
            &p,
            &["-n", "traced-origin", "configmap", "followed", "-o", "name"],
        )
    })
    .await;
    the_journey(&p, &receiver, "ConfigMap", "followed").await;
}

#[tokio::test]
async fn an_offloaded_pod_is_one_trace_across_both_agents() {
    let (receiver, endpoint) = serve_receiver().await;
    let mut p = Peering::start_offloading_with(&[&endpoint])
        .await
        .expect("peering");
    p.restart_remote_with(endpoint).await;
    p.until_node_ready(WAIT).await;
    p.extend("traced", "{podOffloadingStrategy: Remote}");
    p.until_extended("traced", WAIT).await;
    kubectl_stdin(
        &p.origin,
        &["apply", "-f", "-"],
        &format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: runner, namespace: traced}}\nspec:\n  terminationGracePeriodSeconds: 1\n  containers: [{{name: c, image: \"{}\", command: [sh, -c, 'trap \"exit 0\" TERM; while true; do sleep 1; done']}}]\n",
            busybox()
        ),
    );
    let trace = the_journey(&p, &receiver, "Pod", "runner").await;
    let apply = trace.iter().find(|s| s.name == "apply").unwrap();
    assert_eq!(
        apply.attributes.get("kind").map(String::as_str),
        Some("ShadowPod")
    );
}
