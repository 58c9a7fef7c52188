//! In-process tests of the stream over loopback mutual TLS, with certificates minted here:
//! Hello/Welcome, reconnect, refused certificates and identities, and certificates swapped on
//! disk being used by the next connection.
//!
//! Both agents run as tasks in this process; the provider's Kubernetes API is never called by
//! these paths, so its kubeconfig points at a closed port, and each agent runs as the one
//! replica (`--leader-elect=false`): with no API server there is no Lease to elect on.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "a test fails by panicking"
)]
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use refract_certs::{output, Issued, LeafRequest, Role, Validity};
use refract_local_agent::connector::{ConnectError, Connector};
use refract_shared::tls::{self, ClusterId, TlsFiles, Watched};
use refract_wire::proto::inspect_client::InspectClient;
use refract_wire::proto::reflection_client::ReflectionClient;
use refract_wire::proto::{local_message, Hello, ListTenantsRequest, LocalMessage, Tenant};
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

struct Pki {
    dir: tempfile::TempDir,
    ca: Issued,
}

impl Pki {
    fn new() -> Self {
        tls::install_default_crypto_provider();
        let dir = tempfile::tempdir().unwrap();
        let ca = refract_certs::create_ca("test-ca", Validity::days_from_now(10)).unwrap();
        std::fs::write(dir.path().join("kubeconfig"), DEAD_KUBECONFIG).unwrap();
        Self { dir, ca }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Issues a leaf into folder `name`, signed by `ca` (this PKI's CA when `None`).
    fn leaf(
        &self,
        name: &str,
        id: &str,
        role: Role,
        validity: Validity,
        ca: Option<&Issued>,
    ) -> PathBuf {
        let ca = ca.unwrap_or(&self.ca);
        let request = LeafRequest {
            cluster_id: ClusterId::parse(id).unwrap(),
            role,
            dns_names: vec!["localhost".into()],
            ips: vec!["127.0.0.1".parse().unwrap()],
            validity,
        };
        let leaf = refract_certs::issue(ca, &request).unwrap();
        let dir = self.path(name);
        // ca.crt is always this PKI's CA: the bundle the peer is checked against.
        output::write_files(&dir, &leaf, &self.ca.cert_pem).unwrap();
        dir
    }
}

const DEAD_KUBECONFIG: &str = "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:1\n    insecure-skip-tls-verify: true\nusers:\n- name: u\n  user:\n    token: t\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: u\ncurrent-context: c\n";

fn free_port() -> u16 {
    refract_testkit::ports::free_port().expect("free port")
}

/// A running agent task; dropping the handle's sender stops it.
struct Running {
    stop: Option<oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

impl Running {
    async fn stop(mut self) {
        let _ = self.stop.take().unwrap().send(());
        let _ = tokio::time::timeout(Duration::from_secs(10), self.task).await;
    }
}

fn start_remote(pki: &Pki, port: u16, extra: &[&str]) -> Running {
    let server = pki.path("server");
    let mut argv: Vec<String> = [
        "remote-agent",
        "--listen",
        &format!("127.0.0.1:{port}"),
        "--tls-cert",
        &server.join("tls.crt").display().to_string(),
        "--tls-key",
        &server.join("tls.key").display().to_string(),
        "--client-ca",
        &server.join("ca.crt").display().to_string(),
        "--cluster-id",
        "provider",
        "--kubeconfig",
        &pki.path("kubeconfig").display().to_string(),
        "--admin-listen",
        "127.0.0.1:0",
        "--cert-poll-interval",
        "200ms",
        // One replica, and no API server to hold Leases on: these paths are the stream's.
        "--leader-elect=false",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    argv.extend(extra.iter().map(|s| s.to_string()));
    // Parsed as the binary parses its command line.
    let refract_remote_agent::Invocation::Agent(args) =
        refract_remote_agent::Invocation::try_parse_from::<refract_remote_agent::Cli, _, _>(argv)
            .expect("the agent's flags")
    else {
        panic!("the agent's flags run the agent");
    };
    let args = *args;
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(refract_remote_agent::run(args, async move {
        let _ = stopped.await;
    }));
    Running {
        stop: Some(stop),
        task,
    }
}

fn start_local(pki: &Pki, client: &str, port: u16, remote_id: &str) -> Running {
    let client = pki.path(client);
    let argv: Vec<String> = [
        "local-agent",
        "--remote",
        &format!("127.0.0.1:{port}"),
        "--tls-cert",
        &client.join("tls.crt").display().to_string(),
        "--tls-key",
        &client.join("tls.key").display().to_string(),
        "--server-ca",
        &client.join("ca.crt").display().to_string(),
        "--cluster-id",
        "origin",
        "--remote-cluster-id",
        remote_id,
        "--kubeconfig",
        &pki.path("kubeconfig").display().to_string(),
        "--admin-listen",
        "127.0.0.1:0",
        "--min-backoff",
        "100ms",
        "--max-backoff",
        "500ms",
        "--cert-poll-interval",
        "200ms",
        // One replica, and no API server to hold its Lease on: these paths are the stream's.
        "--leader-elect=false",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let refract_local_agent::Invocation::Agent(args) =
        refract_local_agent::Invocation::try_parse_from::<refract_local_agent::Cli, _, _>(argv)
            .expect("the agent's flags")
    else {
        panic!("the agent's flags run the agent");
    };
    let args = *args;
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(refract_local_agent::run(args, async move {
        let _ = stopped.await;
    }));
    Running {
        stop: Some(stop),
        task,
    }
}

/// A connector to the remote agent with the certificate in folder `client`.
fn connector(pki: &Pki, client: &str, port: u16, expected: &str) -> Connector {
    let dir = pki.path(client);
    let files = TlsFiles::in_folder(&dir);
    let tls: Watched<Arc<rustls::ClientConfig>> = Watched::spawn(
        files,
        Duration::from_secs(60),
        tls::client_config,
        CancellationToken::new(),
    )
    .unwrap();
    Connector {
        addr: format!("127.0.0.1:{port}"),
        server_name: "127.0.0.1".try_into().unwrap(),
        expected: ClusterId::parse(expected).unwrap(),
        tls,
    }
}

async fn channel(
    connector: Connector,
) -> Result<tonic::transport::Channel, tonic::transport::Error> {
    tonic::transport::Endpoint::from_static("http://remote")
        .connect_with_connector(tower::service_fn(move |_| {
            let c = connector.clone();
            async move { c.connect().await }
        }))
        .await
}

async fn tenants(pki: &Pki, port: u16) -> Vec<Tenant> {
    let Ok(ch) = channel(connector(pki, "inspector", port, "provider")).await else {
        return vec![];
    };
    match InspectClient::new(ch)
        .list_tenants(ListTenantsRequest {})
        .await
    {
        Ok(r) => r.into_inner().tenants,
        Err(_) => vec![],
    }
}

/// Polls Inspect until `check` holds for the tenant list, or fails after `within`.
async fn wait_for(
    pki: &Pki,
    port: u16,
    within: Duration,
    what: &str,
    check: impl Fn(&[Tenant]) -> bool,
) -> Vec<Tenant> {
    let deadline = Instant::now() + within;
    loop {
        let t = tenants(pki, port).await;
        if check(&t) {
            return t;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}; last tenants: {t:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn setup() -> (Pki, u16) {
    let pki = Pki::new();
    pki.leaf(
        "server",
        "provider",
        Role::Server,
        Validity::days_from_now(5),
        None,
    );
    pki.leaf(
        "client",
        "origin",
        Role::Client,
        Validity::days_from_now(5),
        None,
    );
    // Inspect as the tenant itself: a tenant sees only itself.
    pki.leaf(
        "inspector",
        "origin",
        Role::Client,
        Validity::days_from_now(5),
        None,
    );
    (pki, free_port())
}

fn connected(t: &[Tenant]) -> bool {
    t.iter().any(|t| t.cluster_id == "origin" && t.connected)
}

#[tokio::test]
async fn hello_welcome_registers_the_tenant_from_its_certificate() {
    let (pki, port) = setup();
    let remote = start_remote(&pki, port, &[]);
    let local = start_local(&pki, "client", port, "provider");
    let t = wait_for(
        &pki,
        port,
        Duration::from_secs(10),
        "tenant connected",
        connected,
    )
    .await;
    assert_eq!(t.len(), 1);
    assert_eq!(t[0].agent_version, env!("CARGO_PKG_VERSION"));
    assert_eq!(t[0].connections, 1);
    local.stop().await;
    wait_for(
        &pki,
        port,
        Duration::from_secs(10),
        "tenant disconnected",
        |t| !connected(t),
    )
    .await;
    remote.stop().await;
}

#[tokio::test]
async fn local_agent_reconnects_after_the_remote_agent_restarts() {
    let (pki, port) = setup();
    let remote = start_remote(&pki, port, &[]);
    let local = start_local(&pki, "client", port, "provider");
    wait_for(
        &pki,
        port,
        Duration::from_secs(10),
        "first connection",
        connected,
    )
    .await;
    remote.stop().await;
    // Let the local agent notice and fail a few attempts against the closed port.
    tokio::time::sleep(Duration::from_millis(800)).await;
    let remote = start_remote(&pki, port, &[]);
    wait_for(
        &pki,
        port,
        Duration::from_secs(15),
        "reconnection",
        connected,
    )
    .await;
    local.stop().await;
    remote.stop().await;
}

#[tokio::test]
async fn rotated_client_certificate_is_used_by_the_next_connection() {
    let (pki, port) = setup();
    // Connections older than 2s are closed, so the stream moves to the new certificate.
    let remote = start_remote(
        &pki,
        port,
        &[
            "--max-connection-age",
            "2s",
            "--max-connection-age-grace",
            "1s",
        ],
    );
    let local = start_local(&pki, "client", port, "provider");
    let before = wait_for(
        &pki,
        port,
        Duration::from_secs(10),
        "first connection",
        connected,
    )
    .await;
    let old_expiry = before[0].certificate_not_after.clone();

    // Rotate on disk, as `refract-certs rotate` or a Secret update would.
    let old_pem = std::fs::read_to_string(pki.path("client/tls.crt")).unwrap();
    let rotated = refract_certs::reissue(&pki.ca, &old_pem, Validity::days_from_now(30)).unwrap();
    output::write_files(&pki.path("client"), &rotated, &pki.ca.cert_pem).unwrap();

    let after = wait_for(
        &pki,
        port,
        Duration::from_secs(45),
        "a connection with the rotated certificate",
        |t| {
            t.iter()
                .any(|t| t.connected && t.certificate_not_after != old_expiry)
        },
    )
    .await;
    assert!(after[0].connections >= 2, "{after:?}");
    local.stop().await;
    remote.stop().await;
}

#[tokio::test]
async fn rotated_server_certificate_is_presented_to_new_connections() {
    let (pki, port) = setup();
    let remote = start_remote(&pki, port, &[]);
    let first = server_not_after(&pki, port).await;
    let old_pem = std::fs::read_to_string(pki.path("server/tls.crt")).unwrap();
    let rotated = refract_certs::reissue(&pki.ca, &old_pem, Validity::days_from_now(40)).unwrap();
    output::write_files(&pki.path("server"), &rotated, &pki.ca.cert_pem).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let now = server_not_after(&pki, port).await;
        if now != first {
            assert!(now > first);
            break;
        }
        assert!(
            Instant::now() < deadline,
            "server kept presenting the old certificate"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    remote.stop().await;
}

async fn server_not_after(pki: &Pki, port: u16) -> time::OffsetDateTime {
    let c = connector(pki, "client", port, "provider");
    for _ in 0..50 {
        if let Ok(stream) = c.connect().await {
            let leaf = stream.inner().get_ref().1.peer_certificates().unwrap()[0].clone();
            return refract_shared::tls::identity::summarize(&leaf)
                .unwrap()
                .not_after;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("could not connect to the remote agent");
}

async fn handshake_error(pki: &Pki, client: &str, port: u16) -> String {
    // Wait until the server listens, using a good certificate.
    server_not_after(pki, port).await;
    let c = connector(pki, client, port, "provider");
    // With TLS 1.3 the client learns of a refused certificate on its first read, so send a
    // real request.
    match channel(c).await {
        Err(e) => format!("{e:?}"),
        Ok(ch) => match InspectClient::new(ch)
            .list_tenants(ListTenantsRequest {})
            .await
        {
            Ok(_) => panic!("a connection with certificate {client:?} was accepted"),
            Err(status) => format!("{status:?}"),
        },
    }
}

#[tokio::test]
async fn certificates_from_another_ca_or_expired_are_refused() {
    let (pki, port) = setup();
    let other_ca = refract_certs::create_ca("other", Validity::days_from_now(10)).unwrap();
    pki.leaf(
        "foreign",
        "origin",
        Role::Client,
        Validity::days_from_now(5),
        Some(&other_ca),
    );
    let long_ago = time::OffsetDateTime::now_utc() - time::Duration::days(10);
    pki.leaf(
        "expired",
        "origin",
        Role::Client,
        Validity {
            not_before: long_ago,
            not_after: long_ago + time::Duration::days(1),
        },
        None,
    );
    let remote = start_remote(&pki, port, &[]);
    // The server's TLS alert names the reason.
    for (client, alert) in [("foreign", "UnknownCA"), ("expired", "CertificateExpired")] {
        let error = handshake_error(&pki, client, port).await;
        assert!(
            error.contains(alert),
            "{client}: expected {alert}, got {error}"
        );
    }
    assert!(tenants(&pki, port).await.is_empty());
    remote.stop().await;
}

#[tokio::test]
async fn connection_without_a_client_certificate_is_refused() {
    let (pki, port) = setup();
    let remote = start_remote(&pki, port, &[]);
    server_not_after(&pki, port).await;
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(refract_certs::pem_to_der(&pki.ca.cert_pem).unwrap().into())
        .unwrap();
    let config = rustls::ClientConfig::builder_with_provider(tls::crypto_provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .unwrap();
    let result = async {
        let mut stream = tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect("127.0.0.1".try_into().unwrap(), tcp)
            .await?;
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        stream
            .write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
            .await?;
        let mut buf = [0u8; 16];
        stream.read(&mut buf).await
    }
    .await;
    let error = result.expect_err("a connection without a client certificate was accepted");
    assert!(
        error.to_string().contains("CertificateRequired")
            || error.to_string().contains("certificate"),
        "{error}"
    );
    remote.stop().await;
}

#[tokio::test]
async fn local_agent_refuses_a_server_with_another_identity() {
    let (pki, port) = setup();
    let remote = start_remote(&pki, port, &[]);
    server_not_after(&pki, port).await;
    let c = connector(&pki, "client", port, "someone-else");
    match c.connect().await {
        Err(ConnectError::WrongPeer { found, .. }) => assert_eq!(found, "provider"),
        Err(e) => panic!("unexpected error {e}"),
        Ok(_) => panic!("connected to a server with the wrong identity"),
    }
    remote.stop().await;
}

#[tokio::test]
async fn hello_naming_another_cluster_is_denied() {
    let (pki, port) = setup();
    let remote = start_remote(&pki, port, &[]);
    server_not_after(&pki, port).await;
    let ch = channel(connector(&pki, "client", port, "provider"))
        .await
        .unwrap();
    let hello = LocalMessage {
        kind: Some(local_message::Kind::Hello(Hello {
            cluster_id: "victim".into(),
            agent_version: "test".into(),
            protocol_version: refract_wire::proto::PROTOCOL_VERSION,
            resume: false,
        })),
    };
    let status = ReflectionClient::new(ch)
        .sync(tokio_stream::iter(vec![hello]))
        .await
        .expect_err("a Hello naming another cluster was accepted");
    assert_eq!(status.code(), tonic::Code::PermissionDenied, "{status:?}");
    assert!(status.message().contains("victim"), "{status:?}");
    remote.stop().await;
}
