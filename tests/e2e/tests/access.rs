//! Who may call the provider: one tenant cut off with `--tenant-deny-list` is disconnected
//! within 2 s and refused, with the reason, until it is taken off the list, while another
//! tenant's stream goes on; an Inspect admin identity cannot act as a tenant; Tap redacts
//! Secret data. Real binaries, real mTLS, grpcurl as operators run it.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails by panicking"
)]
use std::time::{Duration, Instant};

use base64::Engine;
use refract_e2e::wire::Wire;
use refract_e2e::{json_of, Peering};
use refract_wire::proto::Outcome;
use serde_json::json;

const WAIT: Duration = Duration::from_secs(60);

/// Whether Inspect (as the admin identity `ops`) shows `tenant` connected.
fn connected(p: &Peering, tenant: &str) -> bool {
    let out = p.grpcurl(Some("ops"), &["refract.v1.Inspect/ListTenants"]);
    let Ok(list) = json_of(&out) else {
        return false;
    };
    list["tenants"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|t| t["clusterId"] == tenant && t["connected"] == true)
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[tokio::test]
async fn a_tenant_cut_off_is_disconnected_at_once_and_refused_while_others_stay() {
    let deny = tempfile::NamedTempFile::new().expect("deny list");
    std::fs::write(deny.path(), "# nobody yet\n").unwrap();
    let flags = [
        format!("--tenant-deny-list={}", deny.path().display()),
        "--inspect-admin=ops".to_string(),
    ];
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let p = Peering::start_with_flags(false, &[], &flags)
        .await
        .expect("peering");
    p.certs.issue("ops", "ops", "client", &[]);
    let bystander_certs = p.certs.issue("bystander", "bystander", "client", &[]);
    p.eventually(WAIT, "the local agent connected", || {
        connected(&p, "origin").then_some(())
    })
    .await;
    let mut bystander = Wire::open(&p.remote_addr, "provider", "bystander", &bystander_certs)
        .await
        .expect("the second tenant connects");
    let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "shop-bystander",
        "annotations": {"refract.io/original-name": "shop"}}});
    assert_eq!(
        bystander.upsert(&ns).await.unwrap().outcome,
        Outcome::Applied
    );

    // Cut the origin off: its stream ends within 2 s.
    std::fs::write(deny.path(), "# compromised, 2026-11-24\norigin\n").unwrap();
    let cut = Instant::now();
    while connected(&p, "origin") {
        assert!(
            cut.elapsed() < Duration::from_secs(2),
            "origin still connected {:?} after it was cut off\n{}",
            cut.elapsed(),
            p.remote_log()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let closed_after = cut.elapsed();
    println!("the cut-off tenant's stream closed {closed_after:?} after the deny list changed");

    // Its reconnects, and any call with its certificate, are refused with the reason.
    let out = p.grpcurl(Some("client"), &["refract.v1.Inspect/ListTenants"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("PermissionDenied")
            && stderr(&out).contains("tenant origin is cut off by this provider"),
        "{}",
        stderr(&out)
    );
    p.eventually(WAIT, "the local agent told why it cannot reconnect", || {
        p.local_log()
            .contains("tenant origin is cut off by this provider")
            .then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!connected(&p, "origin"), "a cut-off tenant got back in");

    // The other tenant's stream went on throughout.
    let cm = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "after-the-cut", "namespace": "shop-bystander"}, "data": {"a": "b"}});
    assert_eq!(
        bystander.upsert(&cm).await.unwrap().outcome,
        Outcome::Applied,
        "the other tenant's stream must survive the cut"
    );
    assert!(connected(&p, "bystander"));

    // Taken off the list, the origin reconnects by itself.
    std::fs::write(deny.path(), "").unwrap();
    p.eventually(WAIT, "the origin reconnected", || {
        connected(&p, "origin").then_some(())
    })
    .await;

    // The admin identity may inspect, but never open a tenant's stream.
    let out = p.grpcurl_with(
        Some("ops"),
        Some(r#"{"hello":{"clusterId":"ops","agentVersion":"grpcurl","protocolVersion":1}}"#),
        &["refract.v1.Reflection/Sync"],
    );
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("Inspect admin identity"),
        "{}",
        stderr(&out)
    );

    // Tap, as the admin: the Secret the tenant sends is shown without its values.
    let token = "ZXlKaGJHY2lPaUpTVXpJMU5pSXNJbXRwWkNJNkluUmxjM1FpZlEK";
    let tap = {
        let remote = p.remote_addr.clone();
        let ca = p.certs.dir.join("ca/ca.crt");
        let ops = p.certs.dir.join("ops");
        std::thread::spawn(move || {
            refract_e2e::run(
                refract_e2e::grpcurl(),
                &[
                    "-max-time",
                    "6",
                    "-cacert",
                    &ca.display().to_string(),
                    "-cert",
                    &ops.join("tls.crt").display().to_string(),
                    "-key",
                    &ops.join("tls.key").display().to_string(),
                    "-d",
                    r#"{"clusterId":"bystander"}"#,
                    &remote,
                    "refract.v1.Inspect/Tap",
                ],
            )
        })
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    let secret = json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "api-client-token", "namespace": "shop-bystander"},
        "data": {"api-token-3c469e": token}});
    assert_eq!(
        bystander.upsert(&secret).await.unwrap().outcome,
        Outcome::Applied
    );
    let out = tap.join().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let shown: Vec<String> = serde_json::Deserializer::from_str(&text)
        .into_iter::<serde_json::Value>()
        .filter_map(Result::ok)
        .filter_map(|e| {
            e["fromLocal"]["upsert"]["objectJson"]
                .as_str()
                .map(str::to_string)
        })
        .map(|b64| {
            let bytes = base64::engine::general_purpose::STANDARD
                .decode(b64)
                .unwrap_or_default();
            String::from_utf8_lossy(&bytes).into_owned()
        })
        .collect();
    let tapped = shown
        .iter()
        .find(|o| o.contains("api-client-token"))
        .unwrap_or_else(|| panic!("the Secret's Upsert not tapped: {text}\n{}", stderr(&out)));
    assert!(
        tapped.contains("<redacted: 52 characters>") && !tapped.contains(token),
        "{tapped}"
    );
    assert!(!text.contains(token));
}

/// The serial number of the certificate served on `port`, as `openssl` reads it.
fn served_serial(port: u16) -> Option<String> {
    let out = std::process::Command::new("sh")
        .args([
            "-c",
            &format!("openssl s_client -connect 127.0.0.1:{port} </dev/null 2>/dev/null | openssl x509 -noout -serial"),
        ])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
    text.strip_prefix("serial=").map(str::to_string)
}

#[tokio::test]
async fn the_webhook_follows_its_certificate_without_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let certs = refract_e2e::Certs::new(dir.path());
    let issue = || {
        certs.issue(
            "webhook",
            "origin-webhook",
            "server",
            &["--ip", "127.0.0.1"],
        )
    };
    let files = issue();
    let port = refract_e2e::free_port();
    let flags = [
        format!("--webhook-listen=127.0.0.1:{port}"),
        format!("--webhook-cert={}", files.join("tls.crt").display()),
        format!("--webhook-key={}", files.join("tls.key").display()),
    ];
    let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
    let p = Peering::start_with_flags(false, &flags, &[])
        .await
        .expect("peering");
    let first = p
        .eventually(WAIT, "the webhook serving", || served_serial(port))
        .await;
    // cert-manager renews the Secret in place: new files, same paths.
    issue();
    let renewed = Instant::now();
    let second = p
        .eventually(
            Duration::from_secs(10),
            "the renewed certificate served",
            || served_serial(port).filter(|s| *s != first),
        )
        .await;
    println!(
        "the webhook served the renewed certificate ({first} -> {second}) {:?} after the files changed",
        renewed.elapsed()
    );
    assert!(
        p.local_log().contains("reloaded serving certificate"),
        "{}",
        p.local_log()
    );
}
