//! The intake's gates, aggregation and pacing, without a cluster.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use refract_wire::proto::{self, ObjectRef};
use tokio_util::sync::CancellationToken;

use super::aggregate::Pending;
use super::*;
use refract_core::options::default_event_options;
use refract_core::policy::Policy;

/// Provider pods `remote/<name>` stand for origin pods `apps/<name>`, but only `web-*` ones.
struct Offloaded;

impl Reflected for Offloaded {
    fn origin_of(&self, remote_namespace: &str, remote_name: &str) -> Option<(Key, String)> {
        (remote_namespace == "remote" && remote_name.starts_with("web-")).then(|| {
            (
                Key {
                    namespace: "apps".into(),
                    name: remote_name.into(),
                },
                format!("uid-{remote_name}"),
            )
        })
    }
}

/// ShadowPods `remote/<name>` stand for origin pods `apps/<name>` once they are sent.
#[derive(Default)]
struct SentLater(std::sync::atomic::AtomicBool);

impl Reflected for SentLater {
    fn origin_of(&self, remote_namespace: &str, remote_name: &str) -> Option<(Key, String)> {
        let sent = self.0.load(std::sync::atomic::Ordering::Relaxed);
        (sent && remote_namespace == "remote").then(|| {
            (
                Key {
                    namespace: "apps".into(),
                    name: remote_name.into(),
                },
                format!("uid-{remote_name}"),
            )
        })
    }
}

#[derive(Clone, Default)]
struct Recorded(Arc<Mutex<Vec<(tokio::time::Instant, Pending)>>>);

impl EventWriter for Recorded {
    async fn write(&self, pending: Pending) {
        self.0
            .lock()
            .unwrap()
            .push((tokio::time::Instant::now(), pending));
    }
}

fn event(kind: &str, object: &str, name: &str, message: &str, count: i32) -> proto::Event {
    let json = serde_json::json!({
        "metadata": {"name": name, "namespace": "remote"},
        "involvedObject": {"kind": kind, "name": object, "namespace": "remote"},
        "type": "Warning", "reason": "BackOff", "message": message, "count": count,
    });
    proto::Event {
        involved: Some(ObjectRef {
            api_version: "v1".into(),
            kind: kind.into(),
            namespace: "remote".into(),
            name: object.into(),
        }),
        origin_uid: String::new(),
        event_json: serde_json::to_vec(&json).unwrap(),
    }
}

fn intake(rate: u32) -> (Arc<EventIntake>, Recorded, EventCounters) {
    intake_with(
        rate,
        Arc::new(SentLater::default()),
        default_event_options(),
    )
}

fn intake_with(
    rate: u32,
    later: Arc<SentLater>,
    reflection: KindOptions,
) -> (Arc<EventIntake>, Recorded, EventCounters) {
    let kinds: ReflectedKinds = [
        ("Pod", Arc::new(Offloaded) as Arc<dyn Reflected>),
        ("ShadowPod", later as Arc<dyn Reflected>),
    ]
    .into_iter()
    .collect();
    let recorded = Recorded::default();
    let counters = EventCounters::default();
    let intake = EventIntake::spawn(
        kinds,
        reflection,
        recorded.clone(),
        rate,
        counters.clone(),
        CancellationToken::new(),
    );
    (intake, recorded, counters)
}

#[tokio::test]
async fn events_about_objects_this_agent_did_not_reflect_are_refused() {
    let (intake, recorded, counters) = intake(100);
    intake.offer(event("Pod", "db-0", "e1", "x", 1));
    intake.offer(event("Node", "web-0", "e2", "x", 1));
    intake.offer(proto::Event {
        event_json: b"{not json".to_vec(),
        ..event("Pod", "web-0", "e3", "x", 1)
    });
    let mut odd = event("Pod", "web-0", "e4", "x", 1);
    odd.event_json = serde_json::to_vec(&serde_json::json!({"type": "Critical"})).unwrap();
    intake.offer(odd);
    tokio::time::sleep(Duration::from_millis(50)).await;
    // db-0 may yet be sent (a session starting): it waits, and is counted refused only when
    // it has waited too long (`early`'s tests).
    assert_eq!(counters.refused.get(), 3);
    assert!(recorded.0.lock().unwrap().is_empty());

    intake.offer(event("Pod", "web-0", "e5", "pulled", 1));
    tokio::time::sleep(Duration::from_millis(50)).await;
    let written = recorded.0.lock().unwrap();
    assert_eq!(written.len(), 1);
    let pending = &written[0].1;
    assert_eq!(pending.target.key.namespace, "apps");
    assert_eq!(pending.target.uid, "uid-web-0");
    let origin = origin::origin_event(pending, "origin", "provider");
    assert_eq!(origin.involved_object.kind.as_deref(), Some("Pod"));
    assert_eq!(origin.metadata.namespace.as_deref(), Some("apps"));
}

#[tokio::test]
async fn a_flood_is_written_at_the_configured_rate_and_repeats_are_aggregated() {
    let rate = 100;
    let (intake, recorded, counters) = intake(rate);
    // 10,000 events in one second: 5,000 distinct, then each of the first 100 repeated 50 times.
    for i in 0..5_000 {
        intake.offer(event(
            "Pod",
            &format!("web-{i}"),
            &format!("e{i}"),
            "crash",
            1,
        ));
    }
    for round in 2..=51 {
        for i in 0..100 {
            intake.offer(event(
                "Pod",
                &format!("web-{i}"),
                &format!("e{i}"),
                "crash",
                round,
            ));
        }
    }
    let window = Duration::from_secs(2);
    tokio::time::sleep(window).await;
    let written = recorded.0.lock().unwrap().clone();
    let allowed = rate as usize * (window.as_secs() as usize + 1);
    assert!(
        written.len() <= allowed,
        "{} writes in {window:?}, at most {allowed} allowed",
        written.len()
    );
    assert!(
        written.len() >= allowed - rate as usize,
        "the writer keeps up with its rate"
    );
    // Backlog: MAX_PENDING distinct events kept, the rest dropped and counted.
    assert_eq!(counters.refused.get(), 5_000 - MAX_PENDING as u64);
    assert_eq!(counters.aggregated.get(), 100 * 50);
    // The repeated events carry their provider count, not one write per repeat.
    let first = written
        .iter()
        .find(|(_, p)| p.target.key.name == "web-0")
        .unwrap();
    assert_eq!(first.1.count, 51);
    assert!(first.1.first);
    // Within any one second, no more than the burst and the rate.
    for (at, _) in &written {
        let in_second = written
            .iter()
            .filter(|(t, _)| *t >= *at && *t < *at + Duration::from_secs(1))
            .count();
        assert!(
            in_second <= 2 * rate as usize,
            "{in_second} writes in one second"
        );
    }
    assert!(intake.pending() > 0, "the rest still waits, bounded");
}

#[tokio::test]
async fn an_event_that_comes_before_its_object_is_sent_is_written_once_it_is() {
    let later = Arc::new(SentLater::default());
    let (intake, recorded, counters) = intake_with(100, later.clone(), default_event_options());
    // A session starts: the provider's event comes before the ShadowPod is sent again.
    intake.offer(event("ShadowPod", "web-1", "e1", "scheduled", 1));
    tokio::time::sleep(crate::early::RETRY_EVERY + Duration::from_millis(200)).await;
    assert!(recorded.0.lock().unwrap().is_empty());
    assert_eq!(counters.refused.get(), 0);
    later.0.store(true, std::sync::atomic::Ordering::Relaxed);
    tokio::time::sleep(crate::early::RETRY_EVERY + Duration::from_millis(500)).await;
    let written = recorded.0.lock().unwrap();
    assert_eq!(written.len(), 1);
    assert_eq!(written[0].1.target.key.name, "web-1");
    assert_eq!(written[0].1.target.uid, "uid-web-1");
    assert_eq!(counters.refused.get(), 0);
}

/// An event named `name` about pod `web-0`, annotated `annotations`.
fn annotated(name: &str, annotations: serde_json::Value) -> proto::Event {
    let mut e = event("Pod", "web-0", name, name, 1);
    let mut json: serde_json::Value = serde_json::from_slice(&e.event_json).unwrap();
    json["metadata"]["annotations"] = annotations;
    e.event_json = serde_json::to_vec(&json).unwrap();
    e
}

#[tokio::test]
async fn the_event_policy_is_read_on_the_provider_events_annotations() {
    let written = |recorded: &Recorded| -> Vec<String> {
        let mut names: Vec<String> = recorded
            .0
            .lock()
            .unwrap()
            .iter()
            .filter_map(|(_, p)| p.latest.message.clone())
            .collect();
        names.sort();
        names
    };
    let offer_three = |intake: &EventIntake| {
        intake.offer(annotated("plain", serde_json::json!({})));
        intake.offer(annotated(
            "skipped",
            serde_json::json!({"liqo.io/skip-reflection": ""}),
        ));
        intake.offer(annotated(
            "allowed",
            serde_json::json!({"liqo.io/allow-reflection": "true"}),
        ));
    };
    let options = |policy, workers| KindOptions { policy, workers };
    let cases: [(&str, KindOptions, &[&str]); 3] = [
        ("DenyList", default_event_options(), &["allowed", "plain"]),
        ("AllowList", options(Policy::AllowList, 3), &["allowed"]),
        ("0 workers", options(Policy::DenyList, 0), &[]),
    ];
    for (case, reflection, expected) in cases {
        let (intake, recorded, counters) =
            intake_with(100, Arc::new(SentLater::default()), reflection);
        offer_three(&intake);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(written(&recorded), expected, "{case}");
        let skipped = (3 - expected.len()) as u64;
        assert_eq!(
            (counters.skipped.get(), counters.refused.get()),
            (skipped, 0),
            "{case}"
        );
    }
}
