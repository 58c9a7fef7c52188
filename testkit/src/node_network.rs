//! A real node's own network, so that it can run kube-proxy: a network namespace of the
//! node's own, joined to the machine by a veth pair, holding the node's pod bridge, its
//! containerd, kubelet and kube-proxy, and every pod's network.
//!
//! Why a namespace per node: kube-proxy owns the `KUBE-*` iptables chains of the namespace it
//! runs in and rewrites them whole on every sync, so two kube-proxies (the origin's node and
//! the provider's, or the nodes of tests running side by side) in one namespace would delete
//! each other's Services.
//!
//! The addresses, all of them on links the test made:
//!
//! - the node's end of the veth pair (a /30 of 10.251.0.0/16) is the node's InternalIP: the
//!   API server calls the kubelet there, and NodePort Services answer there, from the machine
//!   and from other nodes' pods alike (the machine routes between the veth pairs);
//! - the machine routes the node's pod subnet over the veth pair, so the API server reaches
//!   pods at their IPs (webhooks and aggregated APIs behind a Service, the virtual node's
//!   kubelet API of an in-cluster local agent);
//! - inside, everything in 10.0.0.0/8 goes back over the pair and nothing else has a route:
//!   pods reach other nodes and their pods, never the machine's own networks;
//! - the API server listens on the machine's loopback only; a relay listening inside the
//!   namespace on [`API_ADDRESS`] carries the node's connections to it. The API server
//!   advertises that address as the `kubernetes` Service's endpoint, so pods reach it at the
//!   Service's cluster IP through kube-proxy, as in any cluster;
//! - the test's image registry listens on the machine's loopback too; a second relay listens
//!   at the same address on the namespace's loopback, so the node's containerd pulls from
//!   the same reference as a node sharing the machine's network.

use std::net::{Ipv4Addr, SocketAddr};
use std::thread::JoinHandle;

use anyhow::Context;
use ipnet::Ipv4Net;
use tokio_util::sync::CancellationToken;

use crate::netns::NetNs;

/// Where the API server is reached from inside every node's namespace (on the namespace's
/// loopback device; see the module documentation). It is in the API server's certificate.
pub const API_ADDRESS: Ipv4Addr = Ipv4Addr::new(10, 255, 255, 1);

/// The namespace, its routes and the relays. Dropping it stops the relays and deletes the
/// namespace with everything in it (the pod bridge included).
pub struct NodeNetwork {
    netns: NetNs,
    stop: CancellationToken,
    relays: Vec<JoinHandle<()>>,
}

impl NodeNetwork {
    /// Creates the namespace for a node whose pods get `pod_cidr`, whose API server listens
    /// on the machine's `127.0.0.1:api_port` and which pulls from `registry` (on the machine's
    /// loopback); `tag` names the namespace (`rfx-<tag>-<pid>`).
    pub fn create(
        tag: &str,
        pod_cidr: Ipv4Net,
        api_port: u16,
        registry: Option<SocketAddr>,
    ) -> anyhow::Result<Self> {
        ensure_forwarding()?;
        let netns = NetNs::create(tag)?;
        let ns = netns.name.clone();
        let run = |args: &[&str]| -> anyhow::Result<()> {
            let mut all = vec!["netns", "exec", ns.as_str(), "ip"];
            all.extend_from_slice(args);
            ip(&all)
        };
        run(&["addr", "add", &format!("{API_ADDRESS}/32"), "dev", "lo"])?;
        run(&[
            "route",
            "add",
            "10.0.0.0/8",
            "via",
            &netns.host_ip.to_string(),
        ])?;
        ip(&[
            "route",
            "add",
            &pod_cidr.to_string(),
            "via",
            &netns.ns_ip.to_string(),
            "dev",
            &netns.host_if,
        ])?;
        let stop = CancellationToken::new();
        let mut relays = vec![spawn_relay(
            netns.listen_std(SocketAddr::from((API_ADDRESS, api_port)))?,
            SocketAddr::from(([127, 0, 0, 1], api_port)),
            stop.clone(),
        )?];
        if let Some(registry) = registry {
            relays.push(spawn_relay(
                netns.listen_std(registry)?,
                registry,
                stop.clone(),
            )?);
        }
        Ok(Self {
            netns,
            stop,
            relays,
        })
    }

    /// The node's InternalIP: its end of the veth pair.
    pub fn node_ip(&self) -> Ipv4Addr {
        self.netns.ns_ip
    }

    /// The machine's end of the veth pair: an address the API server can reach that is not
    /// loopback (the aggregator refuses loopback endpoints).
    pub fn host_ip(&self) -> Ipv4Addr {
        self.netns.host_ip
    }

    /// `/var/run/netns/<name>`, for `nsenter --net=`.
    pub fn path(&self) -> String {
        format!("/var/run/netns/{}", self.netns.name)
    }
}

impl Drop for NodeNetwork {
    fn drop(&mut self) {
        self.stop.cancel();
        for relay in self.relays.drain(..) {
            let _ = relay.join();
        }
        // NetNs's own drop deletes the veth pair (and with it the route) and the namespace.
    }
}

/// The machine forwards between the nodes' veth pairs (one node's pods reaching another's
/// NodePort). The CNI bridge plugin turns IPv4 forwarding on where it makes a gateway bridge,
/// as it did on the machine for nodes sharing its network; here it is turned on the same way.
fn ensure_forwarding() -> anyhow::Result<()> {
    const FORWARD: &str = "/proc/sys/net/ipv4/ip_forward";
    if std::fs::read_to_string(FORWARD)?.trim() != "1" {
        tracing::info!("turning on IPv4 forwarding, as the CNI bridge plugin does");
        std::fs::write(FORWARD, "1").with_context(|| format!("failed to write 1 to {FORWARD}"))?;
    }
    Ok(())
}

fn ip(args: &[&str]) -> anyhow::Result<()> {
    let out = std::process::Command::new("ip")
        .args(args)
        .output()
        .context("failed to run ip (Debian's iproute2)")?;
    anyhow::ensure!(
        out.status.success(),
        "ip {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(())
}

/// Relays every connection accepted on `listener` to `target`, on a thread and runtime of its
/// own: a test blocks its runtime on `kubectl`, whose requests reach the API server through
/// the node's kubelet, which needs the API server's relay.
fn spawn_relay(
    listener: std::net::TcpListener,
    target: SocketAddr,
    stop: CancellationToken,
) -> anyhow::Result<JoinHandle<()>> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    Ok(std::thread::Builder::new()
        .name("node-relay".into())
        .spawn(move || {
            runtime.block_on(async move {
                let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
                    return;
                };
                loop {
                    let (mut inside, _) = tokio::select! {
                        _ = stop.cancelled() => return,
                        accepted = listener.accept() => match accepted {
                            Ok(a) => a,
                            Err(_) => continue,
                        },
                    };
                    let stop = stop.clone();
                    tokio::spawn(async move {
                        let Ok(mut outside) = tokio::net::TcpStream::connect(target).await else {
                            return;
                        };
                        let _ = inside.set_nodelay(true);
                        let _ = outside.set_nodelay(true);
                        tokio::select! {
                            _ = stop.cancelled() => {}
                            _ = tokio::io::copy_bidirectional(&mut inside, &mut outside) => {}
                        }
                    });
                }
            })
        })?)
}
