//! Resuming the stream end to end: after a reconnect (local agent restarted, remote agent
//! restarted) the link carries only what changed while it was down, and the provider writes
//! only that. Real control planes, both agent binaries, mutual TLS.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails by panicking"
)]
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use refract_e2e::resume_series::{DELETES, SENT, SKIPPED_BYTES, SKIPPED_OBJECTS, UPSERTS};
use refract_e2e::{kubectl_get, kubectl_stdin, metric, Peering};

const WAIT: Duration = Duration::from_secs(60);
/// ConfigMaps reflected before the reconnects.
const OBJECTS: usize = 300;
const NS: &str = "bulk";
const TWIN: &str = "bulk-origin";

fn configmap(name: &str, data: &str) -> String {
    format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: {name}, namespace: {NS}}}\ndata: {{payload: {data}}}\n---\n"
    )
}

/// 1 KiB of payload that names its version.
fn payload(version: &str) -> String {
    format!("{version}-{}", "x".repeat(1024))
}

/// The provider's ConfigMaps in the twin namespace: name → (resourceVersion, payload prefix).
fn provider_configmaps(p: &Peering) -> BTreeMap<String, (String, String)> {
    let out = kubectl_get(
        &p.provider,
        &[
            "configmaps",
            "-n",
            TWIN,
            "-o",
            r#"jsonpath={range .items[*]}{.metadata.name} {.metadata.resourceVersion} {.data.payload}{"\n"}{end}"#,
        ],
    )
    .unwrap_or_default();
    out.lines()
        .filter_map(|l| {
            let mut parts = l.split(' ');
            let (name, rv, data) = (parts.next()?, parts.next()?, parts.next()?);
            let version = data.split('-').next().unwrap_or_default();
            Some((name.to_string(), (rv.to_string(), version.to_string())))
        })
        .filter(|(name, _)| name.starts_with("cm-") || name.starts_with("new-"))
        .collect()
}

/// Waits until the local agent has resumed and settled (see [`refract_e2e::until_resumed`]).
async fn until_resumed(p: &Peering, since: Instant, skipped_at_least: f64) -> Duration {
    refract_e2e::until_resumed(&p.local_admin, since, skipped_at_least, WAIT)
        .await
        .unwrap_or_else(|e| {
            panic!(
                "{e}\n--- local agent ---\n{}\n--- remote agent ---\n{}",
                p.local_log(),
                p.remote_log()
            )
        })
}

async fn restart_local(p: &mut Peering) -> Instant {
    if let Some(local) = p.local.take() {
        local.stop().await;
    }
    let started = Instant::now();
    p.start_local();
    started
}

#[tokio::test]
async fn a_reconnect_sends_and_writes_only_what_changed() {
    let mut p = Peering::start(false).await.expect("peering");
    kubectl_stdin(
        &p.origin,
        &["apply", "-f", "-"],
        &format!("apiVersion: v1\nkind: Namespace\nmetadata: {{name: {NS}}}\n---\napiVersion: offloading.refract.io/v1alpha1\nkind: NamespaceOffloading\nmetadata: {{name: offloading, namespace: {NS}}}\nspec: {{}}\n"),
    );
    let all: String = (0..OBJECTS)
        .map(|i| configmap(&format!("cm-{i:03}"), &payload("v1")))
        .collect();
    kubectl_stdin(&p.origin, &["apply", "-f", "-"], &all);
    let before = p
        .eventually(WAIT, "every ConfigMap on the provider", || {
            let found = provider_configmaps(&p);
            (found.len() == OBJECTS).then_some(found)
        })
        .await;

    // 1. The local agent restarts; nothing changed meanwhile.
    let upserts = metric(&p.remote_admin, UPSERTS).await;
    let started = restart_local(&mut p).await;
    let took = until_resumed(&p, started, OBJECTS as f64).await;
    let sent = metric(&p.local_admin, SENT).await;
    let skipped = metric(&p.local_admin, SKIPPED_BYTES).await;
    let upserted = metric(&p.remote_admin, UPSERTS).await - upserts;
    println!(
        "local agent restarted, nothing changed: settled in {:.2} s; sent {sent} bytes, not sent {skipped} bytes ({:.2} %); the remote agent received {upserted} upserts",
        took.as_secs_f64(),
        100.0 * sent / (sent + skipped)
    );
    assert!(sent < (sent + skipped) / 100.0, "over 1 % of a full resend");
    assert_eq!(upserted, 1.0, "only the twin namespace is sent again");
    assert_eq!(
        provider_configmaps(&p),
        before,
        "the provider wrote nothing"
    );

    // 2. Changes while the local agent is down: 10 changed, 5 deleted, 3 new.
    if let Some(local) = p.local.take() {
        local.stop().await;
    }
    let changed: String = (0..10)
        .map(|i| configmap(&format!("cm-{i:03}"), &payload("v2")))
        .chain((0..3).map(|i| configmap(&format!("new-{i}"), &payload("v1"))))
        .collect();
    kubectl_stdin(&p.origin, &["apply", "-f", "-"], &changed);
    let gone: Vec<String> = (10..15).map(|i| format!("cm-{i:03}")).collect();
    let mut delete = vec!["delete", "configmaps", "-n", NS];
    delete.extend(gone.iter().map(String::as_str));
    p.origin_kubectl(&delete);
    let (upserts, deletes) = (
        metric(&p.remote_admin, UPSERTS).await,
        metric(&p.remote_admin, DELETES).await,
    );
    let skipped_before = metric(&p.local_admin, SKIPPED_OBJECTS).await;
    let started = Instant::now();
    p.start_local();
    let after = p
        .eventually(WAIT, "the changes on the provider", || {
            let found = provider_configmaps(&p);
            let done = found.len() == OBJECTS - 5 + 3
                && (0..10).all(|i| found[&format!("cm-{i:03}")].1 == "v2")
                && gone.iter().all(|name| !found.contains_key(name));
            done.then_some(found)
        })
        .await;
    let took = until_resumed(&p, started, (OBJECTS - 15) as f64).await;
    let upserted = metric(&p.remote_admin, UPSERTS).await - upserts;
    let deleted = metric(&p.remote_admin, DELETES).await - deletes;
    let skipped = metric(&p.local_admin, SKIPPED_OBJECTS).await - skipped_before;
    println!(
        "10 changed, 5 deleted, 3 created while down: settled in {:.2} s; {upserted} upserts and {deleted} deletes received, {skipped} objects not sent",
        took.as_secs_f64()
    );
    assert_eq!(
        upserted,
        1.0 + 10.0 + 3.0,
        "the twin namespace and the 13 changes"
    );
    assert_eq!(deleted, 5.0);
    assert_eq!(skipped, (OBJECTS - 15) as f64);
    let rewritten: Vec<_> = after
        .iter()
        .filter(|(name, (rv, _))| before.get(*name).is_some_and(|(was, _)| was != rv))
        .map(|(name, _)| name.clone())
        .collect();
    let expected: Vec<String> = (0..10).map(|i| format!("cm-{i:03}")).collect();
    assert_eq!(rewritten, expected, "only the changed objects were written");

    // 3. The remote agent restarts: it learns what it holds from its watch, not from memory.
    if let Some(remote) = p.remote.take() {
        remote.stop().await;
    }
    let skipped_before = metric(&p.local_admin, SKIPPED_OBJECTS).await;
    let started = Instant::now();
    p.start_remote();
    let took = until_resumed(&p, started, skipped_before + (OBJECTS - 2) as f64).await;
    let upserted = metric(&p.remote_admin, UPSERTS).await;
    println!(
        "remote agent restarted: settled in {:.2} s; the new remote agent received {upserted} upserts",
        took.as_secs_f64()
    );
    assert_eq!(upserted, 1.0, "only the twin namespace is sent again");
    assert_eq!(provider_configmaps(&p), after, "the provider wrote nothing");
}
