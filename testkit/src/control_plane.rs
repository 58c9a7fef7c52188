//! One real control plane: etcd, kube-apiserver, and optionally scheduler and controller
//! manager, as child processes on loopback.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, PostParams};
use tokio::process::{Child, Command};

use crate::node::{ClusterAccess, NodeOptions, RealNode, NODE_NAME};
use crate::node_network::API_ADDRESS;
use crate::pki;
use crate::ports::free_port;

/// The Kubernetes version testkit runs.
pub const K8S_VERSION: &str = "1.20.2";
/// The admin bearer token written into the kubeconfig (member of `system:masters`).
pub const ADMIN_TOKEN: &str = "refract-testkit-admin";

/// What to start.
#[derive(Debug, Clone)]
pub struct Options {
    /// A name for logs and file names, e.g. `origin` or `provider`.
    pub name: String,
    /// Also run kube-scheduler.
    pub scheduler: bool,
    /// Also run kube-controller-manager (without the EndpointSlice controllers).
    pub controller_manager: bool,
    /// The Service CIDR.
    pub service_cidr: String,
    /// Where to keep files; a fresh temporary folder when `None`.
    pub dir: Option<PathBuf>,
    /// Also run a real node (containerd, kubelet and a CNI bridge) with pod subnets from this
    /// range, importing these images; see [`crate::node`].
    pub node: Option<NodeOptions>,
    /// A folder in which etcd gets a fresh data folder of its own, removed with the control
    /// plane (e.g. a tmpfs, so that etcd's fsyncs never wait for a slow disk); with the other
    /// files when `None`. Defaults to `$REFRACT_ETCD_PARENT`.
    pub etcd_parent: Option<PathBuf>,
    /// More kube-apiserver flags, after the usual ones (a later flag wins).
    pub apiserver_args: Vec<String>,
    /// The controller manager fills EndpointSlices ([`Options::with_endpoint_slices`]).
    pub endpoint_slices: bool,
}

impl Options {
    /// An apiserver only, named `name`.
    pub fn named(name: &str) -> Self {
        Self {
            name: name.to_string(),
            scheduler: false,
            controller_manager: false,
            service_cidr: "10.96.0.0/16".to_string(),
            dir: None,
            node: None,
            etcd_parent: std::env::var_os("REFRACT_ETCD_PARENT").map(PathBuf::from),
            apiserver_args: Vec::new(),
            endpoint_slices: false,
        }
    }

    /// Also passes `args` to kube-apiserver.
    pub fn with_apiserver_args(mut self, args: &[&str]) -> Self {
        self.apiserver_args
            .extend(args.iter().map(|a| a.to_string()));
        self
    }

    /// Also run the scheduler and the controller manager.
    pub fn with_controllers(mut self) -> Self {
        self.scheduler = true;
        self.controller_manager = true;
        self
    }

    /// Also run the scheduler, the controller manager and a real node whose pod subnets come
    /// from `pod_range`, with the base images (pause, busybox) imported. With `pulled` images
    /// (`local-agent`, `remote-agent`, `refractctl`) the node also pulls from the test
    /// process's registry, where those are pushed first (see [`crate::images`]).
    pub fn with_node(mut self, pod_range: &str, pulled: &[&str]) -> anyhow::Result<Self> {
        let catalog = crate::images::catalog(!pulled.is_empty())?;
        let mut images = Vec::new();
        for name in ["pause", "busybox"] {
            let archive = catalog
                .get(name)
                .and_then(|image| image.archive.clone())
                .with_context(|| format!("no image archive for {name}"))?;
            images.push(archive);
        }
        for name in pulled {
            crate::images::reference(&catalog, name)?;
        }
        let registry = if pulled.is_empty() {
            None
        } else {
            Some(crate::registry::Registry::shared()?.address)
        };
        self.node = Some(NodeOptions {
            pod_range: pod_range.parse()?,
            images,
            pause_image: crate::images::reference(&catalog, "pause")?,
            registry,
            own_network: false,
            proxies_endpoint_slices: false,
        });
        Ok(self.with_controllers())
    }

    /// Gives the node of [`Options::with_node`] a network namespace of its own and kube-proxy,
    /// so that ClusterIP and NodePort Services route and pods reach the API server at the
    /// `kubernetes` Service ([`crate::node_network`]).
    pub fn with_own_network(mut self) -> Self {
        if let Some(node) = &mut self.node {
            node.own_network = true;
        }
        self
    }

    /// EndpointSlices as a cluster of Kubernetes 1.21 or later has them: every Service's
    /// endpoints are in EndpointSlices ([`crate::endpointslice_mirror`] writes them from the
    /// Endpoints the controller manager fills), and the node's kube-proxy (with
    /// [`Options::with_own_network`]) routes Services by them, so a slice written by someone
    /// else (Refract's reflection) routes too. The 1.20 kube-proxy reads
    /// `discovery.k8s.io/v1beta1`, so the shim serves its objects as v1beta1 as well,
    /// unconverted: the two versions agree on every field kube-proxy reads (addresses,
    /// `conditions.ready`, ports, the service-name label).
    pub fn with_endpoint_slices(mut self) -> Self {
        self.endpoint_slices = true;
        self
    }

    fn own_network(&self) -> bool {
        self.node.as_ref().is_some_and(|n| n.own_network)
    }
}

/// A running control plane. Dropping it stops the processes and removes the files.
pub struct ControlPlane {
    /// The options it was started with.
    pub options: Options,
    /// `https://127.0.0.1:<port>`.
    pub server: String,
    /// The admin kubeconfig.
    pub kubeconfig: PathBuf,
    /// The folder with logs, certificates and etcd data.
    pub dir: PathBuf,
    /// The real node, when one runs.
    pub node: Option<RealNode>,
    children: Vec<(String, Child)>,
    _tmp: Option<tempfile::TempDir>,
    _etcd_tmp: Option<tempfile::TempDir>,
    _slices: Option<crate::endpointslice_mirror::Mirror>,
}

/// Where the Kubernetes binaries are.
pub fn k8s_bin_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("REFRACT_K8S_BIN") {
        return PathBuf::from(dir);
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_default();
    let cache = std::env::var_os("REFRACT_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| home.join(".cache/refract"));
    cache.join(format!("k8s-{K8S_VERSION}"))
}

pub(crate) fn binary(name: &str) -> anyhow::Result<PathBuf> {
    let path = k8s_bin_dir().join(name);
    if !path.is_file() {
        bail!(
            "{} not found: run `scripts/ensure-toolchain.sh` to build the Kubernetes {K8S_VERSION} control plane (or set REFRACT_K8S_BIN)",
            path.display()
        );
    }
    Ok(path)
}

fn etcd_binary() -> anyhow::Result<PathBuf> {
    for dir in ["/usr/bin", "/usr/local/bin"] {
        let p = Path::new(dir).join("etcd");
        if p.is_file() {
            return Ok(p);
        }
    }
    bail!("etcd not found: run `scripts/ensure-toolchain.sh` (installs Debian's etcd-server)")
}

/// How many times a start is tried when a process finds its port taken.
const START_ATTEMPTS: u32 = 3;

/// A child process that exited before the control plane was ready.
#[derive(Debug)]
struct EarlyExit {
    name: String,
    status: std::process::ExitStatus,
    log: PathBuf,
    log_tail: String,
}

impl EarlyExit {
    /// Ports come from [`free_port`], which closes its listener before the child binds: another
    /// process (any outgoing connection takes an ephemeral port) can win that race.
    fn port_taken(&self) -> bool {
        self.log_tail.contains("address already in use")
    }
}

impl std::fmt::Display for EarlyExit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} exited ({}) during startup; the end of {}:\n{}",
            self.name,
            self.status,
            self.log.display(),
            self.log_tail
        )
    }
}

impl std::error::Error for EarlyExit {}

/// The last `lines` lines of a log, for errors that outlive the log's folder.
pub(crate) fn log_tail(path: &Path, lines: usize) -> String {
    match std::fs::read_to_string(path) {
        Ok(text) => {
            let all: Vec<&str> = text.lines().collect();
            all[all.len().saturating_sub(lines)..].join("\n")
        }
        Err(e) => format!("(unreadable: {e})"),
    }
}

impl ControlPlane {
    /// Starts a control plane and waits until it serves requests.
    ///
    /// A start whose etcd or kube-apiserver lost its port to another process is retried with
    /// fresh ports; any other failure is returned with the end of the failing process's log.
    pub async fn start(options: Options) -> anyhow::Result<Self> {
        let mut attempt = 1;
        loop {
            match Self::start_once(options.clone()).await {
                Err(e) if attempt < START_ATTEMPTS => match e.downcast_ref::<EarlyExit>() {
                    Some(exit) if exit.port_taken() => {
                        tracing::warn!(name = %options.name, process = %exit.name, attempt,
                            "a port was taken before the process bound it; starting again with fresh ports");
                        attempt += 1;
                    }
                    _ => return Err(e),
                },
                result => return result,
            }
        }
    }

    async fn start_once(options: Options) -> anyhow::Result<Self> {
        let started = Instant::now();
        let (dir, tmp) = match &options.dir {
            Some(d) => {
                std::fs::create_dir_all(d)?;
                (d.clone(), None)
            }
            None => {
                let t = tempfile::Builder::new()
                    .prefix(&format!("refract-{}-", options.name))
                    .tempdir()?;
                (t.path().to_path_buf(), Some(t))
            }
        };
        // The `kubernetes` Service takes the first address of the Service range.
        let service_ip = options
            .service_cidr
            .parse::<ipnet::Ipv4Net>()
            .ok()
            .and_then(|net| net.hosts().next())
            .with_context(|| format!("bad Service range {}", options.service_cidr))?;
        pki::write_apiserver_pki(&dir, service_ip)?;
        let node_token = format!("refract-testkit-node-{:016x}", fastrand::u64(..));
        let kube_proxy_token = format!("refract-testkit-proxy-{:016x}", fastrand::u64(..));
        std::fs::write(
            dir.join("tokens.csv"),
            format!(
                "{ADMIN_TOKEN},admin,admin,\"system:masters\"\n{node_token},system:node:{NODE_NAME},system:node:{NODE_NAME},\"system:nodes\"\n{kube_proxy_token},system:kube-proxy,system:kube-proxy\n"
            ),
        )?;
        let etcd_tmp = match &options.etcd_parent {
            Some(parent) => Some(
                tempfile::Builder::new()
                    .prefix(&format!("refract-etcd-{}-", options.name))
                    .tempdir_in(parent)
                    .with_context(|| {
                        format!(
                            "failed to create etcd's data folder in {}",
                            parent.display()
                        )
                    })?,
            ),
            None => None,
        };
        let etcd_data = etcd_tmp
            .as_ref()
            .map_or_else(|| dir.join("etcd"), |t| t.path().to_path_buf());
        let etcd_data_is_new = !etcd_data.exists();
        let mut cp = Self {
            server: String::new(),
            kubeconfig: dir.join("kubeconfig"),
            dir: dir.clone(),
            options: options.clone(),
            node: None,
            children: Vec::new(),
            _tmp: tmp,
            _etcd_tmp: etcd_tmp,
            _slices: None,
        };

        let etcd_port = free_port()?;
        let peer_port = free_port()?;
        let etcd_url = format!("http://127.0.0.1:{etcd_port}");
        cp.spawn(
            "etcd",
            &etcd_binary()?,
            &[
                "--name=testkit".into(),
                format!("--data-dir={}", etcd_data.display()),
                format!("--listen-client-urls={etcd_url}"),
                format!("--advertise-client-urls={etcd_url}"),
                format!("--listen-peer-urls=http://127.0.0.1:{peer_port}"),
                format!("--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}"),
                format!("--initial-cluster=testkit=http://127.0.0.1:{peer_port}"),
                "--log-level=warn".into(),
                "--logger=zap".into(),
            ],
        )?;

        let port = free_port()?;
        cp.server = format!("https://127.0.0.1:{port}");
        let p = |f: &str| dir.join(f).display().to_string();
        // A node with a network of its own reaches the API server at API_ADDRESS, where its
        // pods reach the `kubernetes` Service's endpoint; its kubelet is called at its
        // InternalIP (its Hostname, `localhost`, is the machine's loopback, not the node's).
        let (advertise, kubelet_address_types) = if options.own_network() {
            (API_ADDRESS.to_string(), "InternalIP,Hostname")
        } else {
            ("127.0.0.1".to_string(), "Hostname,InternalIP")
        };
        let mut apiserver_args = vec![
            format!("--etcd-servers={etcd_url}"),
            "--bind-address=127.0.0.1".into(),
            format!("--advertise-address={advertise}"),
            format!("--kubelet-preferred-address-types={kubelet_address_types}"),
            format!("--secure-port={port}"),
            "--insecure-port=0".into(),
            format!("--tls-cert-file={}", p("serving.crt")),
            format!("--tls-private-key-file={}", p("serving.key")),
            format!("--client-ca-file={}", p("ca.crt")),
            // Kubelets trust this certificate's CA for logs, exec and port-forward.
            format!("--kubelet-client-certificate={}", p("kubelet-client.crt")),
            format!("--kubelet-client-key={}", p("kubelet-client.key")),
            format!("--service-account-key-file={}", p("sa.pub")),
            format!("--service-account-signing-key-file={}", p("sa.key")),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
            "--api-audiences=https://kubernetes.default.svc.cluster.local".into(),
            format!("--token-auth-file={}", p("tokens.csv")),
            "--authorization-mode=Node,RBAC".into(),
            format!("--service-cluster-ip-range={}", options.service_cidr),
            "--runtime-config=discovery.k8s.io/v1beta1=false".into(),
            "--enable-priority-and-fairness=false".into(),
            // Aggregated APIs (a metrics API) and webhooks behind a Service are reached at
            // their endpoints' addresses: the API server runs on the machine, where no
            // kube-proxy routes a Service's cluster IP.
            "--enable-aggregator-routing=true".into(),
            // As in real clusters; the provider-side pod security check is what refuses.
            "--allow-privileged=true".into(),
            "--profiling=false".into(),
            "--v=0".into(),
        ];
        apiserver_args.extend(options.apiserver_args.iter().cloned());
        cp.spawn(
            "kube-apiserver",
            &binary("kube-apiserver")?,
            &apiserver_args,
        )?;
        cp.write_kubeconfig()?;
        if let Err(e) = cp.wait_ready(Duration::from_secs(90)).await {
            cp.stop_children().await;
            // A retry starts etcd on other ports: data it initialised with this attempt's peer
            // URL must not be reused then.
            if etcd_data_is_new && etcd_data.exists() {
                let _ = std::fs::remove_dir_all(&etcd_data);
            }
            return Err(e);
        }
        install_endpointslice_shim(&cp.client().await?, options.endpoint_slices).await?;
        grant_kubelet_api(&cp.client().await?).await?;

        if options.controller_manager {
            let kc = cp.kubeconfig.display().to_string();
            cp.spawn(
                "kube-controller-manager",
                &binary("kube-controller-manager")?,
                &[
                    format!("--kubeconfig={kc}"),
                    format!("--authentication-kubeconfig={kc}"),
                    format!("--authorization-kubeconfig={kc}"),
                    "--bind-address=127.0.0.1".into(),
                    "--port=0".into(),
                    format!("--secure-port={}", free_port()?),
                    "--leader-elect=false".into(),
                    // The 1.20 EndpointSlice controllers cannot fill the shim (see
                    // `endpointslice_mirror`).
                    "--controllers=*,-endpointslice,-endpointslicemirroring,-nodeipam".into(),
                    format!("--service-account-private-key-file={}", p("sa.key")),
                    format!("--root-ca-file={}", p("ca.crt")),
                    "--use-service-account-credentials=false".into(),
                ],
            )?;
        }
        if options.endpoint_slices {
            cp._slices = Some(crate::endpointslice_mirror::Mirror::start(
                cp.client().await?,
                &options.name,
            )?);
        }
        if options.scheduler {
            let kc = cp.kubeconfig.display().to_string();
            cp.spawn(
                "kube-scheduler",
                &binary("kube-scheduler")?,
                &[
                    format!("--kubeconfig={kc}"),
                    format!("--authentication-kubeconfig={kc}"),
                    format!("--authorization-kubeconfig={kc}"),
                    "--bind-address=127.0.0.1".into(),
                    "--port=0".into(),
                    format!("--secure-port={}", free_port()?),
                    "--leader-elect=false".into(),
                ],
            )?;
        }
        if let Some(node_options) = &options.node {
            let access = ClusterAccess {
                server: &cp.server,
                ca: &dir.join("ca.crt"),
                node_token: &node_token,
                kube_proxy_token: &kube_proxy_token,
            };
            let client = cp.client().await?;
            let node_options = NodeOptions {
                proxies_endpoint_slices: options.endpoint_slices,
                ..node_options.clone()
            };
            match RealNode::start(&dir.join("node"), &access, &node_options, &client).await {
                Ok(node) => cp.node = Some(node),
                Err(e) => {
                    cp.stop_children().await;
                    return Err(e.context(format!("failed to start the node of {}", options.name)));
                }
            }
        }
        tracing::info!(
            name = %options.name,
            server = %cp.server,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "control plane ready"
        );
        Ok(cp)
    }

    /// The processes of this control plane: (`etcd`, `kube-apiserver`, ..., pid).
    pub fn processes(&self) -> Vec<(String, u32)> {
        self.children
            .iter()
            .filter_map(|(name, child)| child.id().map(|pid| (name.clone(), pid)))
            .collect()
    }

    /// An admin client for this control plane.
    pub async fn client(&self) -> anyhow::Result<kube::Client> {
        let kubeconfig = kube::config::Kubeconfig::read_from(&self.kubeconfig)?;
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?;
        Ok(kube::Client::try_from(config)?)
    }

    fn spawn(&mut self, name: &str, bin: &Path, args: &[String]) -> anyhow::Result<()> {
        let log = std::fs::File::create(self.dir.join(format!("{name}.log")))?;
        let child = Command::new(bin)
            .args(args)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("failed to start {}", bin.display()))?;
        self.children.push((name.to_string(), child));
        Ok(())
    }

    fn write_kubeconfig(&self) -> anyhow::Result<()> {
        let name = &self.options.name;
        let yaml = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: {name}\n  cluster:\n    server: {server}\n    certificate-authority: {ca}\nusers:\n- name: {name}-admin\n  user:\n    token: {ADMIN_TOKEN}\ncontexts:\n- name: {name}\n  context:\n    cluster: {name}\n    user: {name}-admin\ncurrent-context: {name}\n",
            server = self.server,
            ca = self.dir.join("ca.crt").display(),
        );
        std::fs::write(&self.kubeconfig, yaml)?;
        Ok(())
    }

    async fn wait_ready(&mut self, timeout: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        let mut last_error: String;
        loop {
            for (name, child) in &mut self.children {
                if let Some(status) = child.try_wait()? {
                    let log = self.dir.join(format!("{name}.log"));
                    let log_tail = log_tail(&log, 20);
                    return Err(EarlyExit {
                        name: name.clone(),
                        status,
                        log,
                        log_tail,
                    }
                    .into());
                }
            }
            match self.readyz().await {
                Ok(()) => return Ok(()),
                Err(e) => last_error = e.to_string(),
            }
            if Instant::now() > deadline {
                let log = self.dir.join("kube-apiserver.log");
                bail!(
                    "kube-apiserver of {} not ready after {timeout:?}: {last_error}; the end of {}:\n{}",
                    self.options.name,
                    log.display(),
                    log_tail(&log, 20)
                );
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    async fn readyz(&self) -> anyhow::Result<()> {
        let client = self.client().await?;
        let req = http_get("/readyz")?;
        let body = client.request_text(req).await?;
        if body.trim() == "ok" {
            Ok(())
        } else {
            bail!("readyz said {body:?}")
        }
    }

    /// Stops the processes (apiserver side first) and waits for them.
    pub async fn stop(mut self) {
        self.stop_children().await;
    }

    async fn stop_children(&mut self) {
        // The node first: its kubelet must not outlive the API server it reports to.
        self.node = None;
        while let Some((_, mut child)) = self.children.pop() {
            let _ = child.start_kill();
            let _ = child.wait().await;
        }
    }
}

fn http_get(path: &str) -> anyhow::Result<http::Request<Vec<u8>>> {
    Ok(http::Request::get(path).body(Vec::new())?)
}

/// Lets the API server's kubelet client identity use every kubelet's API, as kubeadm does
/// (binding `system:kubelet-api-admin`). Kubelets that authorize with SubjectAccessReview,
/// the virtual node's included, then answer logs, exec and stats for the API server.
async fn grant_kubelet_api(client: &kube::Client) -> anyhow::Result<()> {
    use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
    let binding: ClusterRoleBinding = serde_json::from_value(serde_json::json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": "kube-apiserver-kubelet-client"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:kubelet-api-admin"},
        "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": "kube-apiserver-kubelet-client"}],
    }))?;
    kube::Api::<ClusterRoleBinding>::all(client.clone())
        .patch(
            "kube-apiserver-kubelet-client",
            &kube::api::PatchParams::apply("refract-testkit").force(),
            &kube::api::Patch::Apply(&binding),
        )
        .await
        .context("failed to bind the API server's kubelet client to system:kubelet-api-admin")?;
    Ok(())
}

/// Serves `discovery.k8s.io/v1` EndpointSlices on a 1.20 apiserver through a CRD.
///
/// 1.20 only serves v1beta1 (switched off with `--runtime-config`); the CRD lets the agents use
/// the v1 API they use against current clusters, with the same server-side apply and watch
/// semantics. With `also_v1beta1` it serves the same objects as v1beta1 too, for the 1.20
/// controller manager and kube-proxy (see [`Options::with_endpoint_slices`]).
pub async fn install_endpointslice_shim(
    client: &kube::Client,
    also_v1beta1: bool,
) -> anyhow::Result<()> {
    let schema = serde_json::json!({"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}});
    let mut versions =
        vec![serde_json::json!({"name": "v1", "served": true, "storage": true, "schema": schema})];
    if also_v1beta1 {
        versions.push(serde_json::json!({"name": "v1beta1", "served": true, "storage": false, "schema": schema}));
    }
    let crd: CustomResourceDefinition = serde_json::from_value(serde_json::json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": "endpointslices.discovery.k8s.io",
            "annotations": {"api-approved.kubernetes.io": "https://github.com/kubernetes/enhancements/pull/752"}
        },
        "spec": {
            "group": "discovery.k8s.io",
            "scope": "Namespaced",
            "names": {"plural": "endpointslices", "singular": "endpointslice", "kind": "EndpointSlice", "listKind": "EndpointSliceList"},
            "versions": versions
        }
    }))?;
    install_crd(client, crd).await
}

/// Creates a CRD (if missing) and waits until it is established.
pub async fn install_crd(
    client: &kube::Client,
    crd: CustomResourceDefinition,
) -> anyhow::Result<()> {
    let api: Api<CustomResourceDefinition> = Api::all(client.clone());
    let name = crd.metadata.name.clone().unwrap_or_default();
    match api.create(&PostParams::default(), &crd).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => return Err(e).with_context(|| format!("failed to create CRD {name}")),
    }
    let cond = kube::runtime::wait::conditions::is_crd_established();
    tokio::time::timeout(
        Duration::from_secs(30),
        kube::runtime::wait::await_condition(api, &name, cond),
    )
    .await
    .with_context(|| format!("CRD {name} not established after 30s"))??;
    Ok(())
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        self.node = None;
        // kill_on_drop sends SIGKILL to each child when `children` is dropped.
        for (_, child) in &mut self.children {
            let _ = child.start_kill();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_tail_keeps_the_last_lines() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("x.log");
        std::fs::write(&log, "a\nb\nc\nd\n").unwrap();
        assert_eq!(log_tail(&log, 2), "c\nd");
        assert_eq!(log_tail(&log, 10), "a\nb\nc\nd");
        assert!(log_tail(&dir.path().join("missing"), 2).starts_with("(unreadable"));
    }

    #[test]
    fn only_a_bind_failure_is_retried() {
        use std::os::unix::process::ExitStatusExt;
        let exit = |tail: &str| EarlyExit {
            name: "kube-apiserver".into(),
            status: std::process::ExitStatus::from_raw(1 << 8),
            log: PathBuf::from("kube-apiserver.log"),
            log_tail: tail.into(),
        };
        let taken = exit("failed to listen on 127.0.0.1:40000: listen tcp 127.0.0.1:40000: bind: address already in use");
        assert!(taken.port_taken());
        assert!(!exit("error: unknown flag: --insecure-port").port_taken());
        assert!(taken.to_string().contains("address already in use"));
    }
}
