//! A real node: its own containerd, kubelet 1.20.2 and a CNI bridge, running pods as real
//! containers (`shared/design/testing.md`, "Real nodes").
//!
//! Each node has a containerd of its own (root, state, socket and CNI configuration in the
//! node's folder: two kubelets sharing one containerd would fight over its containers), a
//! bridge and a /24 pod subnet no other bridge on the machine routes, and is registered as
//! `localhost`: the API server reaches a kubelet by its Hostname address, and `localhost`
//! resolves to 127.0.0.1 while `--node-ip 127.0.0.1` is refused as a loopback address. The
//! kubelet authenticates to the API server as `system:node:localhost` and accepts only clients
//! with a certificate of the cluster's CA (the API server's kubelet client certificate).
//!
//! containerd and the kubelet share a mount namespace of their own, where the node's folder
//! provides /var/log/pods and /var/log/containers (see `start_containerd`). Dropping the node
//! kills its containers, unmounts what they mounted (volumes, network namespaces, root
//! filesystems; those made inside the node's mount namespace go with it), stops containerd and
//! the kubelet and deletes the bridge.
//!
//! A node with its own network ([`NodeOptions::own_network`]) also runs kube-proxy: containerd,
//! the kubelet, kube-proxy and the pods live in a network namespace of the node's own, and
//! the node's InternalIP is its end of a veth pair ([`crate::node_network`]). Without it, the
//! node shares the machine's network and Services do not route (no kube-proxy: two of them in
//! one namespace would delete each other's rules).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use ipnet::Ipv4Net;
use k8s_openapi::api::core::v1::Node;
use kube::api::Api;

use crate::control_plane::{binary, log_tail};
use crate::node_network::{NodeNetwork, API_ADDRESS};
use crate::ports::free_port;

/// The name every real node registers as (see the module documentation).
pub const NODE_NAME: &str = "localhost";
/// Where Debian's `containernetworking-plugins` installs the CNI plugins.
const CNI_BIN_DIR: &str = "/usr/lib/cni";
/// Where image pulls are sent: the discard port, which nothing on these machines serves.
const CLOSED_PORT: u16 = 9;
/// The machine's pod log folders, and the node's own folder that stands in for each.
const POD_LOG_DIRS: [(&str, &str); 2] = [
    ("/var/log/pods", "pod-logs"),
    ("/var/log/containers", "container-logs"),
];
/// How long a node may take to turn Ready.
const READY_TIMEOUT: Duration = Duration::from_secs(120);

/// What a node is started with.
#[derive(Debug, Clone)]
pub struct NodeOptions {
    /// The pod subnets are /24s taken from this range (the second octet names the cluster in
    /// the bridge's name, so give each cluster its own /16).
    pub pod_range: Ipv4Net,
    /// OCI image archives imported into the node's containerd before the kubelet starts.
    pub images: Vec<PathBuf>,
    /// The sandbox image's name, as imported from one of `images`.
    pub pause_image: String,
    /// A plain-HTTP registry on the machine's loopback the node pulls from (the agents'
    /// images; [`crate::registry`]), reached at the same address from inside a network of
    /// the node's own.
    pub registry: Option<SocketAddr>,
    /// A network namespace of the node's own, with kube-proxy (see the module documentation).
    pub own_network: bool,
    /// kube-proxy reads EndpointSlices rather than Endpoints (see
    /// [`crate::Options::with_endpoint_slices`]).
    pub proxies_endpoint_slices: bool,
}

/// A running node. Dropping it stops everything and removes what it made on the machine.
pub struct RealNode {
    /// The pod subnet of this node.
    pub pod_cidr: Ipv4Net,
    /// The node's folder (logs, containerd, kubelet).
    pub dir: PathBuf,
    /// The bridge the node's pods are attached to.
    pub bridge: String,
    /// containerd's socket, for `ctr --address`.
    pub containerd_socket: PathBuf,
    /// The node's own network, when it has one.
    pub network: Option<NodeNetwork>,
    containerd: Option<Child>,
    kubelet: Option<Child>,
    kube_proxy: Option<Child>,
}

/// The files a node needs from its control plane.
pub struct ClusterAccess<'a> {
    /// The API server's URL.
    pub server: &'a str,
    /// The cluster CA (it signs the API server's kubelet client certificate).
    pub ca: &'a Path,
    /// A bearer token of `system:node:localhost` in group `system:nodes`.
    pub node_token: &'a str,
    /// A bearer token of `system:kube-proxy` (bound to `system:node-proxier` by default).
    pub kube_proxy_token: &'a str,
}

impl RealNode {
    /// Starts containerd, imports the images, starts the kubelet and waits until the node is
    /// Ready in the cluster `client` talks to.
    pub async fn start(
        dir: &Path,
        cluster: &ClusterAccess<'_>,
        options: &NodeOptions,
        client: &kube::Client,
    ) -> anyhow::Result<Self> {
        let started = Instant::now();
        std::fs::create_dir_all(dir)?;
        let (pod_cidr, bridge) = free_subnet(options.pod_range)?;
        let network = if options.own_network {
            let tag = bridge.replacen("rfx", "node", 1);
            Some(NodeNetwork::create(
                &tag,
                pod_cidr,
                api_port(cluster.server)?,
                options.registry,
            )?)
        } else {
            None
        };
        let mut node = Self {
            pod_cidr,
            dir: dir.to_path_buf(),
            bridge,
            containerd_socket: dir.join("containerd/containerd.sock"),
            network,
            containerd: None,
            kubelet: None,
            kube_proxy: None,
        };
        node.write_cni_config()?;
        node.start_containerd(&options.pause_image, options.registry)?;
        node.wait_for_containerd().await?;
        for image in &options.images {
            node.import(image)?;
        }
        node.start_kubelet(cluster, &options.pause_image)?;
        if node.network.is_some() {
            node.start_kube_proxy(cluster, options.pod_range, options.proxies_endpoint_slices)?;
        }
        node.wait_ready(client).await?;
        tracing::info!(
            bridge = %node.bridge,
            pod_cidr = %node.pod_cidr,
            node_ip = ?node.network.as_ref().map(NodeNetwork::node_ip),
            elapsed_ms = started.elapsed().as_millis() as u64,
            "node ready"
        );
        Ok(node)
    }

    /// Imports an OCI image archive into the node's containerd (namespace `k8s.io`).
    pub fn import(&self, archive: &Path) -> anyhow::Result<()> {
        let archive = archive.display().to_string();
        self.ctr(&["images", "import", &archive])
            .with_context(|| format!("failed to import {archive}"))?;
        Ok(())
    }

    /// Runs `ctr` against this node's containerd in namespace `k8s.io`; stdout on success.
    pub fn ctr(&self, args: &[&str]) -> anyhow::Result<String> {
        let out = Command::new("ctr")
            .arg("--address")
            .arg(&self.containerd_socket)
            .args(["--namespace", "k8s.io"])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .context("failed to run ctr (Debian's containerd package)")?;
        if !out.status.success() {
            bail!(
                "ctr {args:?} failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            );
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    fn write_cni_config(&self) -> anyhow::Result<()> {
        let net_d = self.dir.join("cni/net.d");
        std::fs::create_dir_all(&net_d)?;
        // No masquerading and no port mappings: pod traffic stays on this bridge, or with a
        // network of the node's own, goes through the node (the default route), where
        // kube-proxy translates Service addresses and only 10.0.0.0/8 leads anywhere.
        let conflist = serde_json::json!({
            "cniVersion": "0.4.0",
            "name": self.bridge,
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": self.bridge,
                    "isGateway": true,
                    "isDefaultGateway": self.network.is_some(),
                    "ipMasq": false,
                    "hairpinMode": true,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": self.pod_cidr.to_string()}]],
                        "dataDir": self.dir.join("cni/ipam"),
                    }
                },
                {"type": "portmap", "capabilities": {"portMappings": true}}
            ]
        });
        std::fs::write(
            net_d.join("10-refract.conflist"),
            serde_json::to_vec_pretty(&conflist)?,
        )?;
        Ok(())
    }

    fn start_containerd(
        &mut self,
        pause_image: &str,
        registry: Option<SocketAddr>,
    ) -> anyhow::Result<()> {
        let d = |p: &str| self.dir.join(p).display().to_string();
        // restrict_oom_score_adj: these machines lack CAP_SYS_RESOURCE, and without it every
        // sandbox fails. Network namespaces are mounted under the state folder so that the
        // clean-up finds them with the node's other mounts.
        let config = format!(
            r#"version = 2
root = "{root}"
state = "{state}"
[grpc]
  address = "{socket}"
[ttrpc]
  address = "{socket}.ttrpc"
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "{opt}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{pause_image}"
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  disable_apparmor = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_BIN_DIR}"
    conf_dir = "{net_d}"
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "{registries}"
"#,
            root = d("containerd/root"),
            state = d("containerd/state"),
            socket = self.containerd_socket.display(),
            opt = d("containerd/opt"),
            net_d = d("cni/net.d"),
            registries = d("registries"),
        );
        self.write_registry_guard(registry)?;
        let path = self.dir.join("containerd.toml");
        std::fs::write(&path, config)?;
        // containerd (and the kubelet, which joins it) runs in a mount namespace of its own
        // where the node's folders stand in for /var/log/pods and /var/log/containers: a
        // kubelet removes every pod log folder there of a pod it does not know, so nodes
        // sharing the machine's would delete each other's logs.
        let mut args: Vec<String> = self.enter_network();
        args.extend([
            "/usr/bin/unshare".to_string(),
            "--mount".into(),
            "--propagation".into(),
            "slave".into(),
            "--".into(),
            "sh".into(),
            "-c".into(),
            r#"mount --bind "$1" /var/log/pods && mount --bind "$2" /var/log/containers && shift 2 && exec "$@""#.into(),
            "node-mounts".into(),
        ]);
        for (host, own) in POD_LOG_DIRS {
            std::fs::create_dir_all(host)?;
            let own = self.dir.join(own);
            std::fs::create_dir_all(&own)?;
            args.push(own.display().to_string());
        }
        args.extend([
            "/usr/bin/containerd".into(),
            "--config".into(),
            path.display().to_string(),
        ]);
        self.containerd = Some(spawn(
            Path::new("/usr/bin/nsenter"),
            &args,
            &self.dir.join("containerd.log"),
        )?);
        Ok(())
    }

    /// `nsenter` arguments that enter the node's own network (none without one), ending with
    /// `--`: the command follows.
    fn enter_network(&self) -> Vec<String> {
        let mut args: Vec<String> = self
            .network
            .iter()
            .map(|n| format!("--net={}", n.path()))
            .collect();
        args.push("--".into());
        args
    }

    /// The API server's URL as the node's processes reach it.
    fn server_in_node(&self, cluster: &ClusterAccess<'_>) -> anyhow::Result<String> {
        Ok(match &self.network {
            Some(_) => format!("https://{API_ADDRESS}:{}", api_port(cluster.server)?),
            None => cluster.server.to_string(),
        })
    }

    fn write_kubeconfig(
        &self,
        name: &str,
        cluster: &ClusterAccess<'_>,
        token: &str,
    ) -> anyhow::Result<PathBuf> {
        let path = self.dir.join(name);
        std::fs::write(
            &path,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: {}\n    certificate-authority: {}\nusers:\n- name: u\n  user:\n    token: {}\ncontexts:\n- name: c\n  context: {{cluster: c, user: u}}\ncurrent-context: c\n",
                self.server_in_node(cluster)?,
                cluster.ca.display(),
                token
            ),
        )?;
        Ok(path)
    }

    /// kube-proxy in iptables mode, in the node's own network. It reads Endpoints unless
    /// `slices`: testkit's clusters serve EndpointSlices from a shim that only a cluster
    /// started [`crate::Options::with_endpoint_slices`] fills (see
    /// `install_endpointslice_shim`). It leaves the conntrack table's sysctls alone
    /// (machine-wide ones are not writable from a namespace) and its OOM score too (these
    /// machines lack CAP_SYS_RESOURCE).
    fn start_kube_proxy(
        &mut self,
        cluster: &ClusterAccess<'_>,
        cluster_cidr: Ipv4Net,
        slices: bool,
    ) -> anyhow::Result<()> {
        let kubeconfig =
            self.write_kubeconfig("kube-proxy.kubeconfig", cluster, cluster.kube_proxy_token)?;
        let mut args = self.enter_network();
        args.extend([
            binary("kube-proxy")?.display().to_string(),
            format!("--kubeconfig={}", kubeconfig.display()),
            format!("--hostname-override={NODE_NAME}"),
            format!("--cluster-cidr={cluster_cidr}"),
            "--proxy-mode=iptables".into(),
            format!("--feature-gates=EndpointSliceProxying={slices}"),
            // The EndpointSlice shim is a CRD, which speaks JSON only.
            "--kube-api-content-type=application/json".into(),
            "--conntrack-max-per-core=0".into(),
            "--conntrack-tcp-timeout-established=0".into(),
            "--conntrack-tcp-timeout-close-wait=0".into(),
            "--oom-score-adj=0".into(),
            "--healthz-bind-address=127.0.0.1:10256".into(),
            "--metrics-bind-address=127.0.0.1:10249".into(),
            "--v=1".into(),
        ]);
        self.kube_proxy = Some(spawn(
            Path::new("/usr/bin/nsenter"),
            &args,
            &self.dir.join("kube-proxy.log"),
        )?);
        Ok(())
    }

    /// A pull must never leave the machine: test nodes run images imported from archives, and
    /// pull only from the test's own `registry` on loopback. Unqualified names (`nginx`)
    /// resolve to docker.io, so its registry, and every registry where containerd supports a
    /// default (`_default`), is a closed port on loopback.
    fn write_registry_guard(&self, registry: Option<SocketAddr>) -> anyhow::Result<()> {
        let closed = format!("127.0.0.1:{CLOSED_PORT}");
        let mut hosts = vec![
            ("docker.io".to_string(), closed.clone()),
            ("_default".into(), closed),
        ];
        if let Some(registry) = registry {
            hosts.push((registry.to_string(), registry.to_string()));
        }
        for (host, server) in hosts {
            let dir = self.dir.join("registries").join(host);
            std::fs::create_dir_all(&dir)?;
            std::fs::write(
                dir.join("hosts.toml"),
                // containerd 1.6 refuses a hosts.toml without a [host] table.
                format!(
                    "server = \"http://{server}\"\n[host.\"http://{server}\"]\n  capabilities = [\"pull\", \"resolve\"]\n"
                ),
            )?;
        }
        Ok(())
    }

    async fn wait_for_containerd(&mut self) -> anyhow::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if self.ctr(&["version"]).is_ok() {
                return Ok(());
            }
            self.check_alive()?;
            if Instant::now() > deadline {
                bail!(
                    "containerd did not answer within 30s; the end of its log:\n{}",
                    log_tail(&self.dir.join("containerd.log"), 20)
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    fn start_kubelet(&mut self, cluster: &ClusterAccess<'_>, pause: &str) -> anyhow::Result<()> {
        let d = |p: &str| self.dir.join(p).display().to_string();
        let port = free_port()?;
        let config = format!(
            r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
port: {port}
readOnlyPort: 0
healthzPort: 0
cgroupDriver: cgroupfs
cgroupsPerQOS: false
enforceNodeAllocatable: []
failSwapOn: false
podCIDR: "{cidr}"
makeIPTablesUtilChains: false
volumePluginDir: "{plugins}"
serializeImagePulls: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {{memory.available: "50Mi", nodefs.available: "1%", imagefs.available: "1%"}}
authentication:
  anonymous: {{enabled: false}}
  webhook: {{enabled: false}}
  x509: {{clientCAFile: "{ca}"}}
authorization: {{mode: AlwaysAllow}}
"#,
            cidr = self.pod_cidr,
            plugins = d("kubelet/volume-plugins"),
            ca = cluster.ca.display(),
        );
        std::fs::write(self.dir.join("kubelet.yaml"), config)?;
        self.write_kubeconfig("kubelet.kubeconfig", cluster, cluster.node_token)?;
        let mut args = vec![
            format!("--config={}", d("kubelet.yaml")),
            format!("--kubeconfig={}", d("kubelet.kubeconfig")),
            "--container-runtime=remote".into(),
            format!(
                "--container-runtime-endpoint=unix://{}",
                self.containerd_socket.display()
            ),
            format!("--root-dir={}", d("kubelet")),
            format!("--cert-dir={}", d("kubelet/pki")),
            format!("--hostname-override={NODE_NAME}"),
            format!("--pod-infra-container-image={pause}"),
            "--v=1".into(),
        ];
        if let Some(network) = &self.network {
            args.push(format!("--node-ip={}", network.node_ip()));
        }
        // In containerd's mount namespace: the same pod log folders, and the volumes it
        // mounts are where containerd's containers see them.
        let containerd = self
            .containerd
            .as_ref()
            .context("containerd is not running")?;
        let kubelet = binary("kubelet")?;
        let args: Vec<String> =
            std::iter::once(format!("--mount=/proc/{}/ns/mnt", containerd.id()))
                .chain(self.enter_network())
                .chain([kubelet.display().to_string()])
                .chain(args)
                .collect();
        self.kubelet = Some(spawn(
            Path::new("/usr/bin/nsenter"),
            &args,
            &self.dir.join("kubelet.log"),
        )?);
        Ok(())
    }

    async fn wait_ready(&mut self, client: &kube::Client) -> anyhow::Result<()> {
        let nodes: Api<Node> = Api::all(client.clone());
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            self.check_alive()?;
            if let Ok(Some(node)) = nodes.get_opt(NODE_NAME).await {
                let ready = node
                    .status
                    .and_then(|s| s.conditions)
                    .unwrap_or_default()
                    .iter()
                    .any(|c| c.type_ == "Ready" && c.status == "True");
                if ready {
                    return Ok(());
                }
            }
            if Instant::now() > deadline {
                bail!(
                    "node not Ready after {READY_TIMEOUT:?}; the end of {}:\n{}",
                    self.dir.join("kubelet.log").display(),
                    log_tail(&self.dir.join("kubelet.log"), 30)
                );
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// Fails with the end of its log when containerd or the kubelet has exited.
    fn check_alive(&mut self) -> anyhow::Result<()> {
        for (name, child) in [
            ("containerd", &mut self.containerd),
            ("kubelet", &mut self.kubelet),
            ("kube-proxy", &mut self.kube_proxy),
        ] {
            if let Some(status) = child.as_mut().and_then(|c| c.try_wait().ok().flatten()) {
                bail!(
                    "{name} exited ({status}); the end of its log:\n{}",
                    log_tail(&self.dir.join(format!("{name}.log")), 30)
                );
            }
        }
        Ok(())
    }

    /// Kills every container of the node and removes what containerd, the CNI plugins and the
    /// kubelet left on the machine. Runs from `Drop`, so it only logs what fails.
    fn clean_up(&mut self) {
        stop(self.kube_proxy.take());
        stop(self.kubelet.take());
        if self.containerd.is_some() {
            for id in self.ctr(&["tasks", "ls", "-q"]).unwrap_or_default().lines() {
                let _ = self.ctr(&["tasks", "kill", "--all", "--signal", "SIGKILL", id]);
                let _ = self.ctr(&["tasks", "delete", "--force", id]);
            }
        }
        stop(self.containerd.take());
        unmount_below(&self.dir);
        if self.network.is_some() {
            // The bridge lives in the node's namespace and goes with it; a bridge of the same
            // name on the machine is another node's.
            self.network = None;
        } else {
            let _ = Command::new("ip")
                .args(["link", "delete", &self.bridge])
                .stderr(Stdio::null())
                .status();
        }
    }
}

impl Drop for RealNode {
    fn drop(&mut self) {
        self.clean_up();
    }
}

/// The port of an `https://host:port` URL.
fn api_port(server: &str) -> anyhow::Result<u16> {
    server
        .rsplit(':')
        .next()
        .and_then(|p| p.trim_end_matches('/').parse().ok())
        .with_context(|| format!("no port in the API server's URL {server}"))
}

fn spawn(bin: &Path, args: &[String], log: &Path) -> anyhow::Result<Child> {
    let file = std::fs::File::create(log)?;
    Command::new(bin)
        .args(args)
        .stdin(Stdio::null())
        .stdout(file.try_clone()?)
        .stderr(file)
        .spawn()
        .with_context(|| {
            format!(
                "failed to start {} (run scripts/ensure-toolchain.sh)",
                bin.display()
            )
        })
}

fn stop(child: Option<Child>) {
    if let Some(mut child) = child {
        let _ = child.kill();
        let _ = child.wait();
    }
}

/// A /24 of `range` and a bridge name that nothing on the machine uses yet.
fn free_subnet(range: Ipv4Net) -> anyhow::Result<(Ipv4Net, String)> {
    let routes = String::from_utf8_lossy(
        &Command::new("ip")
            .args(["-4", "route", "show"])
            .output()
            .context("failed to run ip (Debian's iproute2)")?
            .stdout,
    )
    .into_owned();
    let links = std::fs::read_dir("/sys/class/net")?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect::<Vec<_>>();
    let subnets: Vec<Ipv4Net> = range.subnets(24)?.collect();
    let start = fastrand::usize(..subnets.len());
    let cluster_octet = range.network().octets()[1];
    for i in 0..subnets.len() {
        let subnet = subnets[(start + i) % subnets.len()];
        let third = subnet.network().octets()[2];
        let bridge = format!("rfx{cluster_octet}-{third}");
        let network = subnet.network().to_string();
        if !routes.contains(&format!("{network}/24")) && !links.contains(&bridge) {
            return Ok((subnet, bridge));
        }
    }
    bail!("no free /24 left in {range}")
}

/// Unmounts everything mounted at or below `dir`, deepest first.
fn unmount_below(dir: &Path) {
    let Ok(mounts) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return;
    };
    let prefix = dir.display().to_string();
    let mut points: Vec<&str> = mounts
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|p| p.starts_with(&prefix))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.len()));
    for point in points {
        let _ = Command::new("umount")
            .args(["--lazy", point])
            .stderr(Stdio::null())
            .status();
    }
}
