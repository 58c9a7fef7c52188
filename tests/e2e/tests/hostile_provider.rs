//! A provider the origin does not trust: the real local agent, on a real origin control plane,
//! connected over mutual TLS to a server that speaks the wire protocol with the provider's
//! certificate and sends what a compromised provider could: node labels that are invalid or
//! reserved, capacity that is unparseable or absurd, pod IPs outside its pod ranges (a cloud
//! metadata address among them), statuses of containers the pod lacks and of pods it was never
//! given, and a flood of events. The origin must show only what it may, keep its heartbeat,
//! and write events at the configured rate.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails by panicking"
)]
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use refract_e2e::{kubectl_get, kubectl_stdin, Peering};
use refract_shared::tls::{self, TlsFiles, Watched};
use refract_wire::proto::reflection_server::{Reflection, ReflectionServer};
use refract_wire::proto::{
    self, local_message, remote_message, Ack, LocalMessage, ObjectRef, Outcome, RemoteMessage,
    Welcome,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status, Streaming};

const WAIT: Duration = Duration::from_secs(60);
const EVENT_RATE: u32 = 20;

/// What the hostile provider learned from the origin, and its way to talk back.
#[derive(Default)]
struct Seen {
    /// ShadowPods sent: provider `namespace/name` → origin UID.
    shadow_pods: HashMap<String, String>,
    /// The open session's sender.
    session: Option<mpsc::Sender<Result<RemoteMessage, Status>>>,
}

#[derive(Clone, Default)]
struct Hostile(Arc<Mutex<Seen>>);

impl Hostile {
    fn sender(&self) -> Option<mpsc::Sender<Result<RemoteMessage, Status>>> {
        self.0.lock().unwrap().session.clone()
    }

    fn uid_of(&self, remote: &str) -> Option<String> {
        self.0.lock().unwrap().shadow_pods.get(remote).cloned()
    }

    async fn send(&self, kind: remote_message::Kind) {
        let tx = self.sender().expect("a session is open");
        tx.send(Ok(RemoteMessage { kind: Some(kind) }))
            .await
            .expect("the local agent reads the stream");
    }
}

#[tonic::async_trait]
impl Reflection for Hostile {
    type SyncStream = ReceiverStream<Result<RemoteMessage, Status>>;

    async fn unpeer(
        &self,
        _request: Request<refract_wire::proto::UnpeerRequest>,
    ) -> Result<Response<refract_wire::proto::UnpeerResponse>, Status> {
        Err(Status::unimplemented("a hostile provider does not unpeer"))
    }

    async fn sync(
        &self,
        request: Request<Streaming<LocalMessage>>,
    ) -> Result<Response<Self::SyncStream>, Status> {
        let mut inbound = request.into_inner();
        let (tx, rx) = mpsc::channel(256);
        let seen = self.0.clone();
        tokio::spawn(async move {
            while let Ok(Some(message)) = inbound.message().await {
                let reply = match message.kind {
                    Some(local_message::Kind::Hello(_)) => {
                        seen.lock().unwrap().session = Some(tx.clone());
                        let welcome = Welcome {
                            cluster_id: "provider".into(),
                            agent_version: "hostile".into(),
                            protocol_version: proto::PROTOCOL_VERSION,
                            session_id: "hostile-1".into(),
                            ..Default::default()
                        };
                        let capacity = hostile_capacity();
                        let _ = tx
                            .send(Ok(RemoteMessage {
                                kind: Some(remote_message::Kind::Welcome(welcome)),
                            }))
                            .await;
                        remote_message::Kind::Capacity(capacity)
                    }
                    Some(local_message::Kind::Upsert(upsert)) => {
                        let object = upsert.object.unwrap_or_default();
                        if object.kind == "ShadowPod" {
                            seen.lock().unwrap().shadow_pods.insert(
                                format!("{}/{}", object.namespace, object.name),
                                upsert.origin_uid.clone(),
                            );
                        }
                        applied(object, upsert.revision)
                    }
                    Some(local_message::Kind::Delete(delete)) => {
                        applied(delete.object.unwrap_or_default(), delete.revision)
                    }
                    _ => continue,
                };
                if tx
                    .send(Ok(RemoteMessage { kind: Some(reply) }))
                    .await
                    .is_err()
                {
                    return;
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

fn applied(object: ObjectRef, revision: String) -> remote_message::Kind {
    remote_message::Kind::Ack(Ack {
        object: Some(object),
        revision,
        outcome: Outcome::Applied as i32,
        message: String::new(),
        awaited: false,
        restores: 0,
    })
}

fn hostile_capacity() -> proto::Capacity {
    let pairs = |p: &[(&str, &str)]| {
        p.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    proto::Capacity {
        free: pairs(&[
            ("cpu", "1e2147483647"),
            ("memory", "64Gi"),
            ("pods", "110"),
            ("example.com/huge", "1e15"),
            ("bad resource!", "1"),
        ]),
        node_labels: pairs(&[
            ("provider.example/zone", "eu-1"),
            ("Bad Key", "x"),
            ("node-role.kubernetes.io/control-plane", ""),
            ("ok.example/value", "not valid!"),
        ]),
        api_server_ready: true,
        quota: Default::default(),
    }
}

/// Serves the hostile provider on `addr` with the provider's real certificate.
async fn serve(p: &Peering, hostile: Hostile, stop: CancellationToken) {
    tls::install_default_crypto_provider();
    let s = p.certs.dir.join("server");
    let files = TlsFiles::in_folder(&s);
    let config: Watched<Arc<rustls::ServerConfig>> = Watched::spawn(
        files,
        Duration::from_secs(60),
        tls::server_config,
        stop.clone(),
    )
    .unwrap();
    let listener = tokio::net::TcpListener::bind(&p.remote_addr).await.unwrap();
    let incoming = refract_remote_agent::tls_listener::incoming(
        listener,
        config,
        refract_remote_agent::access::Access::new(Default::default(), Default::default()),
        Default::default(),
        refract_remote_agent::access::sources::Sources::new(
            refract_remote_agent::access::sources::MAX_PER_SOURCE,
        ),
        stop.clone(),
    );
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(ReflectionServer::new(hostile))
            .serve_with_incoming_shutdown(incoming, stop.cancelled_owned()),
    );
}

fn status(origin_uid: &str, pod_ip: &str, containers: &[&str]) -> remote_message::Kind {
    let statuses: Vec<serde_json::Value> = containers
        .iter()
        .map(|name| serde_json::json!({"name": name, "ready": true, "restartCount": 0, "image": "x", "imageID": "x", "state": {"running": {}}}))
        .collect();
    let json = serde_json::json!({"phase": "Running", "podIP": pod_ip, "podIPs": [{"ip": pod_ip}], "containerStatuses": statuses});
    remote_message::Kind::PodStatus(proto::PodStatus {
        origin_uid: origin_uid.into(),
        namespace: "apps-origin".into(),
        name: "web".into(),
        status_json: serde_json::to_vec(&json).unwrap().into(),
        recreations: u32::MAX,
        sent_unix_millis: i64::MIN,
    })
}

fn event(kind: &str, name: &str, message: &str) -> remote_message::Kind {
    let json = serde_json::json!({
        "metadata": {"name": format!("{name}.{message}"), "namespace": "apps-origin"},
        "involvedObject": {"kind": kind, "name": name, "namespace": "apps-origin"},
        "type": "Warning", "reason": "Flood", "message": message, "count": 1,
        "source": {"component": "hostile"},
    });
    remote_message::Kind::Event(proto::Event {
        involved: Some(ObjectRef {
            api_version: "v1".into(),
            kind: kind.into(),
            namespace: "apps-origin".into(),
            name: name.into(),
        }),
        origin_uid: String::new(),
        event_json: serde_json::to_vec(&json).unwrap(),
    })
}

fn pod_field(p: &Peering, path: &str) -> Option<String> {
    kubectl_get(
        &p.origin,
        &[
            "-n",
            "apps",
            "pod",
            "web",
            "-o",
            &format!("jsonpath={path}"),
        ],
    )
}

/// One series of the local agent's `/metrics`, 0 when absent.
async fn metric(p: &Peering, series: &str) -> f64 {
    refract_e2e::metric(&p.local_admin, series).await
}

#[tokio::test]
async fn a_hostile_provider_gets_only_what_it_may_onto_the_origin() {
    let rate = format!("--event-rate={EVENT_RATE}");
    let mut p = Peering::start_with_flags(
        true,
        &[
            "--remote-pod-remap=10.200.0.0/16=10.71.0.0/16",
            &rate,
            "--node-ip=127.0.0.1",
        ],
        &[],
    )
    .await
    .unwrap();
    // The real remote agent makes way for the hostile one on the same address.
    p.remote.take().unwrap().stop().await;
    let hostile = Hostile::default();
    let stop = CancellationToken::new();
    let _stop = stop.clone().drop_guard();
    serve(&p, hostile.clone(), stop).await;

    // The virtual node: valid suggestions only, capacity bounded, and Ready all the same.
    p.eventually(
        WAIT,
        "the virtual node Ready with the hostile capacity",
        || {
            let node = kubectl_get(&p.origin, &["node", "refract-provider", "-o", "json"])?;
            let node: serde_json::Value = serde_json::from_str(&node).ok()?;
            let ready = node["status"]["conditions"]
                .as_array()?
                .iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True");
            (ready && node["status"]["capacity"]["memory"].is_string()).then_some(node)
        },
    )
    .await;
    let node: serde_json::Value = serde_json::from_str(
        &kubectl_get(&p.origin, &["node", "refract-provider", "-o", "json"]).unwrap(),
    )
    .unwrap();
    let labels = &node["metadata"]["labels"];
    let capacity = &node["status"]["capacity"];
    println!("virtual node labels: {labels}\nvirtual node capacity: {capacity}");
    assert_eq!(labels["provider.example/zone"], "eu-1");
    for refused in [
        "Bad Key",
        "node-role.kubernetes.io/control-plane",
        "ok.example/value",
    ] {
        assert!(labels.get(refused).is_none(), "{refused} reached the node");
    }
    assert!(
        capacity.get("cpu").is_none(),
        "an unparseable cpu is left out"
    );
    assert_eq!(capacity["memory"], "61847529062", "90% of 64Gi");
    assert_eq!(
        capacity["example.com/huge"], "900k",
        "capped at one million, then shared"
    );
    assert!(capacity.get("bad resource!").is_none());
    assert!(
        metric(
            &p,
            "refract_local_provider_input_refused_total{what=\"node_label\"}"
        )
        .await
            >= 3.0
    );
    assert!(
        metric(
            &p,
            "refract_local_provider_input_refused_total{what=\"capacity\"}"
        )
        .await
            >= 3.0
    );

    // A pod offloaded to it.
    kubectl_stdin(
        &p.origin,
        &["apply", "-f", "-"],
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: apps}\n---\napiVersion: offloading.refract.io/v1alpha1\nkind: NamespaceOffloading\nmetadata: {name: offloading, namespace: apps}\nspec: {podOffloadingStrategy: Remote}\n",
    );
    p.until_extended("apps", WAIT).await;
    kubectl_stdin(
        &p.origin,
        &["apply", "-f", "-"],
        "apiVersion: v1\nkind: Pod\nmetadata: {name: web, namespace: apps}\nspec:\n  nodeName: refract-provider\n  tolerations: [{key: virtual-node.liqo.io/not-allowed, operator: Exists}]\n  containers: [{name: app, image: example.invalid/app}]\n",
    );
    let uid = p
        .eventually(WAIT, "the ShadowPod of web sent", || {
            hostile.uid_of("apps-origin/web")
        })
        .await;

    // A cloud metadata address and a container the pod lacks: both left out, the rest shown.
    hostile
        .send(status(&uid, "169.254.169.254", &["app", "smuggled"]))
        .await;
    p.eventually(WAIT, "web Running without the metadata address", || {
        let out = pod_field(&p, "{.status.phase}|{.status.podIP}|{.status.containerStatuses[*].name}|{.status.containerStatuses[0].restartCount}")?;
        (out.starts_with("Running|")).then_some(out)
    })
    .await;
    let shown = pod_field(&p, "{.status.phase}|{.status.podIP}|{.status.containerStatuses[*].name}|{.status.containerStatuses[0].restartCount}").unwrap();
    println!("origin pod after a metadata address: {shown}");
    assert_eq!(
        shown, "Running||app|2147483647",
        "no IP, no smuggled container, counts saturate"
    );

    // An address in its pod range is remapped; one outside it is refused again.
    hostile.send(status(&uid, "10.200.0.5", &["app"])).await;
    p.eventually(WAIT, "web's IP remapped", || {
        (pod_field(&p, "{.status.podIP}")? == "10.71.0.5").then_some(())
    })
    .await;
    hostile.send(status(&uid, "192.168.1.1", &["app"])).await;
    p.eventually(
        WAIT,
        "an IP outside the provider's pod range left out",
        || pod_field(&p, "{.status.podIP}")?.is_empty().then_some(()),
    )
    .await;

    // A status for a pod it was never given: nothing changes. It may be for a pod not sent
    // yet on a session just started, so it is refused once it has waited 30 s.
    let refused_statuses = || {
        metric(
            &p,
            "refract_local_provider_input_refused_total{what=\"pod_status\"}",
        )
    };
    let before = refused_statuses().await;
    hostile
        .send(status("not-a-uid-we-sent", "10.200.0.9", &["app"]))
        .await;
    let deadline = Instant::now() + WAIT;
    while refused_statuses().await <= before {
        assert!(
            Instant::now() < deadline,
            "the foreign status was not refused"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(pod_field(&p, "{.status.podIP}").unwrap(), "");
    p.eventually(
        WAIT,
        "the refused status named in the local agent's log",
        || {
            p.local_log()
                .lines()
                .any(|l| l.contains("ignoring pod statuses") && l.contains("apps-origin/web"))
                .then_some(())
        },
    )
    .await;

    // A flood: 10,000 distinct events about the pod, and 200 about objects never reflected.
    let flood_started = Instant::now();
    for i in 0..10_000 {
        hostile
            .send(event("Pod", "web", &format!("flood-{i}")))
            .await;
    }
    for i in 0..100 {
        hostile
            .send(event("ConfigMap", "never-reflected", &format!("x-{i}")))
            .await;
        hostile
            .send(event("Pod", "someone-else", &format!("x-{i}")))
            .await;
    }
    let sent_in = flood_started.elapsed();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let written = kubectl_get(
        &p.origin,
        &[
            "-n",
            "apps",
            "events",
            "--field-selector",
            "reason=Flood",
            "-o",
            "name",
        ],
    )
    .unwrap_or_default()
    .lines()
    .count();
    // Taken after the count, so every write the count saw is within it.
    let elapsed = flood_started.elapsed();
    let allowed = (f64::from(EVENT_RATE) * (elapsed.as_secs_f64() + 1.0)) as usize;
    println!(
        "flood: 10,200 events sent in {sent_in:.1?}; after {elapsed:.1?} the origin holds {written} (rate {EVENT_RATE}/s, at most {allowed})"
    );
    assert!(
        written <= allowed,
        "{written} events written, at most {allowed} allowed"
    );
    assert!(
        written >= EVENT_RATE as usize,
        "events still get through: {written}"
    );
    // All 200 about foreign objects (once they waited 30 s for the objects to be sent), and
    // what neither fit the backlog of 1,024 nor took the place of one already written.
    let least = (10_200 - 1024 - written) as f64;
    let deadline = Instant::now() + WAIT;
    loop {
        let refused = metric(&p, "refract_local_provider_events_refused_total").await;
        if refused >= least {
            println!("events refused: {refused}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{refused} refused, at least {least} expected"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    p.eventually(
        WAIT,
        "the foreign events named in the local agent's log",
        || {
            p.local_log()
                .lines()
                .any(|l| {
                    l.contains("ignoring events from the provider")
                        && (l.contains("apps-origin/never-reflected")
                            || l.contains("apps-origin/someone-else"))
                })
                .then_some(())
        },
    )
    .await;
    assert!(kubectl_get(
        &p.origin,
        &[
            "-n",
            "apps",
            "events",
            "--field-selector",
            "involvedObject.name=someone-else",
            "-o",
            "name"
        ],
    )
    .unwrap_or_default()
    .is_empty());

    // Through it all the agent stayed up (it answers its readiness check, which a process
    // that exited or hung could not) and the node Ready.
    let (status, body) = refract_e2e::http_get(&p.local_admin, "/readyz", None).await;
    assert_eq!(
        (status, body.trim()),
        (200, "ready"),
        "the local agent answers"
    );
    assert!(
        p.local.as_mut().unwrap().exited().is_none(),
        "the local agent is still running"
    );
    let ready = kubectl_get(
        &p.origin,
        &[
            "node",
            "refract-provider",
            "-o",
            "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
        ],
    )
    .unwrap();
    assert_eq!(ready, "True");
}
