//! What operators monitor with: the alert rules in `deploy/monitoring/` pass `promtool`, and
//! every metric they and the Grafana dashboard name is one the running agents export, with
//! the values a peering at work shows (build info, certificate expiry, answer latency, tenant
//! labels).

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails by panicking"
)]
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use refract_e2e::{kubectl_stdin, metric, run, Peering};

const WAIT: Duration = Duration::from_secs(60);

fn repo_file(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(path)
}

/// promtool: `$REFRACT_PROMTOOL` (set by scripts/test.sh), else the toolchain cache.
fn promtool() -> PathBuf {
    let path = std::env::var_os("REFRACT_PROMTOOL")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let home = std::env::var_os("HOME").unwrap_or_default();
            Path::new(&home).join(".cache/refract/promtool/promtool")
        });
    assert!(
        path.is_file(),
        "{} not found: run scripts/ensure-toolchain.sh (or set REFRACT_PROMTOOL)",
        path.display()
    );
    path
}

/// The metric families an agent's /metrics declares (`# TYPE <name> <type>`).
async fn families(admin: &str) -> BTreeSet<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut body = String::new();
    let mut tcp = tokio::net::TcpStream::connect(admin)
        .await
        .expect("admin endpoint");
    tcp.write_all(b"GET /metrics HTTP/1.0\r\nHost: agent\r\n\r\n")
        .await
        .unwrap();
    tcp.read_to_string(&mut body).await.unwrap();
    body.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

/// Every `refract_…` metric name in `text`; a `refract_(local|remote)_x` pattern names both.
fn named_metrics(text: &str) -> BTreeSet<String> {
    const EITHER: &str = "refract_(local|remote)_";
    let mut names = BTreeSet::new();
    let mut rest = text;
    while let Some(at) = rest.find("refract_") {
        let tail = &rest[at..];
        let (prefixes, body) = match tail.strip_prefix(EITHER) {
            Some(body) => (vec!["refract_local_", "refract_remote_"], body),
            None => (vec![""], tail),
        };
        let end = body
            .find(|c: char| !(c.is_ascii_lowercase() || c == '_'))
            .unwrap_or(body.len());
        for prefix in prefixes {
            names.insert(format!("{prefix}{}", &body[..end]));
        }
        rest = &body[end..];
    }
    names.retain(|n| !n.ends_with('_'));
    names
}

#[test]
fn the_alert_rules_pass_promtool() {
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("refract-rules.yaml");
    std::fs::write(&rules, rule_file()).unwrap();
    let out = run(promtool(), &["check", "rules", rules.to_str().unwrap()]);
    let said =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "promtool refused the rules:\n{said}");
    assert!(said.contains("SUCCESS: 11 rules found"), "{said}");

    // The alerts that watch certificates and the agents themselves fire when they should:
    // `promtool test rules` on series a day apart.
    let tests = dir.path().join("refract-rules-test.yaml");
    std::fs::write(&tests, RULE_TESTS).unwrap();
    let out = run(promtool(), &["test", "rules", tests.to_str().unwrap()]);
    let said =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "promtool test rules failed:\n{said}");
    println!("{said}");
}

/// The rule file inside deploy/monitoring's PrometheusRule: its `spec`, as Prometheus without
/// the operator loads it.
fn rule_file() -> String {
    let text =
        std::fs::read_to_string(repo_file("deploy/monitoring/prometheus-rule.yaml")).unwrap();
    let rule: serde_json::Value = serde_yaml_ng::from_str(&text).unwrap();
    assert_eq!(rule["kind"], "PrometheusRule");
    serde_yaml_ng::to_string(&rule["spec"]).unwrap()
}

/// `promtool test rules` input: a link certificate 10 days from expiry (the 21-day alert
/// fires, the 7-day one not), a webhook certificate 3 days from it (both fire), a replica
/// that stops answering scrapes, and a cluster where no agent is scraped at all.
const RULE_TESTS: &str = r#"rule_files: [refract-rules.yaml]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:
      # Unix seconds: the evaluation starts at 0, so these are 10 and 3 days ahead.
      - series: 'refract_local_certificate_expiry_timestamp_seconds{job="refract-system/refract-local-agent",instance="a",certificate="link"}'
        values: '864000x10'
      - series: 'refract_local_certificate_expiry_timestamp_seconds{job="refract-system/refract-local-agent",instance="a",certificate="webhook"}'
        values: '259200x10'
      - series: 'up{job="refract-system/refract-local-agent",instance="a"}'
        values: '1x10'
      - series: 'up{job="refract-system/refract-local-agent",instance="b"}'
        values: '0x10'
    alert_rule_test:
      - eval_time: 1m
        alertname: RefractCertificateExpiresIn21Days
        exp_alerts:
          - exp_labels: {severity: warning, job: refract-system/refract-local-agent, instance: a, certificate: link}
            exp_annotations:
              summary: "The link certificate of a expires in 9d 23h 59m 0s"
              description: "Renew it (refractctl rotate, refract-certs, or cert-manager); the agent reloads it without a restart."
              runbook_url: "https://example.invalid/refract/blob/main/README.md#troubleshooting"
          - exp_labels: {severity: warning, job: refract-system/refract-local-agent, instance: a, certificate: webhook}
            exp_annotations:
              summary: "The webhook certificate of a expires in 2d 23h 59m 0s"
              description: "Renew it (refractctl rotate, refract-certs, or cert-manager); the agent reloads it without a restart."
              runbook_url: "https://example.invalid/refract/blob/main/README.md#troubleshooting"
      - eval_time: 1m
        alertname: RefractCertificateExpiresIn7Days
        exp_alerts:
          - exp_labels: {severity: critical, job: refract-system/refract-local-agent, instance: a, certificate: webhook}
            exp_annotations:
              summary: "The webhook certificate of a expires in 2d 23h 59m 0s"
              description: "Renew it now (refractctl rotate, refract-certs, or cert-manager); the agent reloads it without a restart."
              runbook_url: "https://example.invalid/refract/blob/main/README.md#troubleshooting"
      - eval_time: 1m
        alertname: RefractCertificateExpired
        exp_alerts: []
      - eval_time: 6m
        alertname: RefractAgentDown
        exp_alerts:
          - exp_labels: {severity: critical, job: refract-system/refract-local-agent, instance: b}
            exp_annotations:
              summary: "Refract agent b (refract-system/refract-local-agent) does not answer scrapes"
              description: "Check the pod's state and log (kubectl -n refract-system describe pod, logs)."
              runbook_url: "https://example.invalid/refract/blob/main/README.md#troubleshooting"
      - eval_time: 6m
        alertname: RefractAgentAbsent
        exp_alerts: []
  - interval: 1m
    input_series:
      - series: 'up{job="refract-system/refract-remote-agent",instance="c"}'
        values: '0x10'
    alert_rule_test:
      - eval_time: 6m
        alertname: RefractAgentAbsent
        exp_alerts:
          - exp_labels: {severity: critical}
            exp_annotations:
              summary: "No Refract agent is being scraped in this cluster"
              description: "No replica of either agent answers. Offloading and reflection have stopped (pods already offloaded keep running on the provider)."
              runbook_url: "https://example.invalid/refract/blob/main/README.md#troubleshooting"
"#;

#[tokio::test]
async fn every_metric_the_rules_and_dashboard_name_is_exported_with_live_values() {
    let p = Peering::start(false).await.expect("peering");
    kubectl_stdin(
        &p.origin,
        &["apply", "-f", "-"],
        "apiVersion: v1\nkind: Namespace\nmetadata: {name: shop}\n---\napiVersion: offloading.refract.io/v1alpha1\nkind: NamespaceOffloading\nmetadata: {name: offloading, namespace: shop}\nspec: {}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: settings, namespace: shop}\ndata: {mode: prod}\n",
    );
    let answered = r#"refract_local_answer_seconds_count{kind="ConfigMap",outcome="applied"}"#;
    let deadline = std::time::Instant::now() + WAIT;
    while metric(&p.local_admin, answered).await < 1.0 {
        assert!(
            std::time::Instant::now() < deadline,
            "no answer about the ConfigMap observed in {answered}\n{}",
            p.local_log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // From the change queued to applied includes the time from sent to answered: it is
    // observed first, for every applied answer, and starts no later.
    let applied_count = r#"refract_local_change_applied_seconds_count{kind="ConfigMap"}"#;
    let applied_sum = r#"refract_local_change_applied_seconds_sum{kind="ConfigMap"}"#;
    let answered_sum = r#"refract_local_answer_seconds_sum{kind="ConfigMap",outcome="applied"}"#;
    // Read in this order, a later answer can only add to the first.
    let from_sent = metric(&p.local_admin, answered_sum).await;
    let from_queued = metric(&p.local_admin, applied_sum).await;
    assert!(
        metric(&p.local_admin, applied_count).await >= 1.0,
        "{applied_count}"
    );
    assert!(
        from_queued >= from_sent && from_queued > 0.0,
        "change queued to applied {from_queued}s, sent to answered {from_sent}s"
    );

    let exported: BTreeSet<String> = families(&p.local_admin)
        .await
        .into_iter()
        .chain(families(&p.remote_admin).await)
        .collect();
    let rules = rule_file();
    let dashboard = std::fs::read_to_string(repo_file("deploy/monitoring/dashboard.json")).unwrap();
    serde_json::from_str::<serde_json::Value>(&dashboard).expect("the dashboard is JSON");
    let named = named_metrics(&rules)
        .into_iter()
        .chain(named_metrics(&dashboard))
        .collect::<BTreeSet<_>>();
    assert!(named.len() >= 12, "{named:?}");
    let family_of = |name: &str| {
        ["_bucket", "_count", "_sum", "_total"]
            .iter()
            .find_map(|s| name.strip_suffix(s).filter(|b| exported.contains(*b)))
            .map(str::to_string)
            .unwrap_or_else(|| name.to_string())
    };
    let missing: Vec<&String> = named
        .iter()
        .filter(|n| !exported.contains(&family_of(n)))
        .collect();
    assert!(
        missing.is_empty(),
        "named in deploy/monitoring but not exported: {missing:?}\nexported: {exported:?}"
    );

    // Live values.
    let version = refract_core::AGENT_VERSION;
    for (admin, side) in [(&p.local_admin, "local"), (&p.remote_admin, "remote")] {
        let info = format!(r#"refract_{side}_build_info{{version="{version}"}}"#);
        assert_eq!(metric(admin, &info).await, 1.0, "{info}");
        let name =
            format!(r#"refract_{side}_certificate_expiry_timestamp_seconds{{certificate="link"}}"#);
        let expiry = metric(admin, &name).await;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        assert!(
            expiry > now + 24.0 * 3600.0,
            "the {side} agent's link certificate expires at {expiry}, now is {now}"
        );
    }
    let acks = metric(
        &p.remote_admin,
        r#"refract_remote_acks_total{tenant="origin",outcome="applied"}"#,
    )
    .await;
    assert!(acks >= 2.0, "applied acks of tenant origin: {acks}");
}
