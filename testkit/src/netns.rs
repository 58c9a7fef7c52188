//! A link with real network faults: a network namespace of the test's own, joined to the host
//! by a veth pair, whose packets the test drops with iptables inside that namespace.
//!
//! One agent runs inside the namespace and reaches its peer over the veth pair, so every fault
//! is a real one for the kernel's TCP: a cut drops packets without a reset (the connection goes
//! half-open until keepalive notices), random loss drops a share of them. What that agent also
//! needs on the host's loopback (its own API server) is carried by [`NetNs::bridge_loopback`],
//! a relay that listens inside the namespace, untouched by the packet faults; its [`Gate`]
//! closes every connection through it at once and refuses new ones until it opens again (an
//! API server gone away, as the agent sees it).
//!
//! Delay: this kernel has no `netem` qdisc (`CONFIG_NET_SCH_NETEM` is not set), so added
//! latency comes from [`NetNs::delay_relay`], a relay inside the namespace that holds every
//! chunk for a fixed time in each direction; loss stays the kernel's.
//!
//! Everything is removed on drop: the iptables rules live and die with the namespace, and
//! deleting the host end of the veth pair deletes both ends.

use std::net::{Ipv4Addr, SocketAddr};
use std::os::fd::AsFd;
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, Context};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// The iptables chain holding the faults, in the namespace's INPUT and OUTPUT.
const CHAIN: &str = "RFX-FAULTS";

/// A namespace, its veth pair, and the addresses on each end (a /30).
pub struct NetNs {
    /// The namespace's name (`ip netns`).
    pub name: String,
    /// The host end of the veth pair.
    pub host_if: String,
    /// The address of the host end.
    pub host_ip: Ipv4Addr,
    /// The address of the namespace end.
    pub ns_ip: Ipv4Addr,
    stop: CancellationToken,
}

fn ip(args: &[&str]) -> anyhow::Result<()> {
    run("ip", args)
}

fn run(program: &str, args: &[&str]) -> anyhow::Result<()> {
    let out = Command::new(program)
        .args(args)
        .output()
        .with_context(|| format!("failed to run {program} (Debian's iproute2 and iptables)"))?;
    if !out.status.success() {
        bail!(
            "{program} {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(())
}

/// How many veth pairs this process has named: with its pid, a name no other pair of this
/// process has (several namespaces are made at once: both clusters' nodes).
static VETHS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// A veth pair's two names (interface names hold 15 characters), neither of them on the
/// machine now: a pair another process left behind keeps its name.
fn free_veth_names(pid: u32) -> anyhow::Result<(String, String)> {
    for _ in 0..1024 {
        let n = VETHS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let suffix = format!("{:x}", (pid as u64) << 8 | (n & 0xff));
        let suffix = &suffix[suffix.len().saturating_sub(8)..];
        let (host_if, ns_if) = (format!("rfxh{suffix}"), format!("rfxn{suffix}"));
        let taken = |name: &str| std::path::Path::new("/sys/class/net").join(name).exists();
        if !taken(&host_if) && !taken(&ns_if) {
            return Ok((host_if, ns_if));
        }
    }
    anyhow::bail!("no free veth name for process {pid}")
}

impl NetNs {
    /// Creates namespace `rfx-<tag>-<pid>` and a veth pair with a free /30 of 10.251.0.0/16.
    pub fn create(tag: &str) -> anyhow::Result<Self> {
        let pid = std::process::id();
        let name = format!("rfx-{tag}-{pid}");
        let (host_if, ns_if) = free_veth_names(pid)?;
        let routes = String::from_utf8_lossy(
            &Command::new("ip")
                .args(["-4", "route", "show"])
                .output()?
                .stdout,
        )
        .into_owned();
        let (host_ip, ns_ip) = (0..16_384u32)
            .map(|i| {
                let base = u32::from(Ipv4Addr::new(10, 251, 0, 0))
                    + (i * 4 + fastrand::u32(..16_384) * 4) % 65_536;
                (
                    Ipv4Addr::from(base + 1),
                    Ipv4Addr::from(base + 2),
                    Ipv4Addr::from(base),
                )
            })
            .find(|(_, _, net)| !routes.contains(&format!("{net}/30")))
            .map(|(h, n, _)| (h, n))
            .context("no free /30 in 10.251.0.0/16")?;
        ip(&["netns", "add", &name])?;
        let netns = Self {
            name,
            host_if,
            host_ip,
            ns_ip,
            stop: CancellationToken::new(),
        };
        ip(&[
            "link",
            "add",
            &netns.host_if,
            "type",
            "veth",
            "peer",
            "name",
            &ns_if,
        ])?;
        ip(&["link", "set", &ns_if, "netns", &netns.name])?;
        ip(&[
            "addr",
            "add",
            &format!("{host_ip}/30"),
            "dev",
            &netns.host_if,
        ])?;
        ip(&["link", "set", &netns.host_if, "up"])?;
        netns.exec_ok(
            "ip",
            &["addr", "add", &format!("{ns_ip}/30"), "dev", &ns_if],
        )?;
        netns.exec_ok("ip", &["link", "set", &ns_if, "up"])?;
        netns.exec_ok("ip", &["link", "set", "lo", "up"])?;
        netns.exec_ok("iptables", &["-N", CHAIN])?;
        netns.exec_ok("iptables", &["-I", "INPUT", "-j", CHAIN])?;
        netns.exec_ok("iptables", &["-I", "OUTPUT", "-j", CHAIN])?;
        Ok(netns)
    }

    /// `program args` to run inside the namespace.
    pub fn command(&self, program: &std::path::Path) -> tokio::process::Command {
        let mut c = tokio::process::Command::new("ip");
        c.args(["netns", "exec", &self.name]).arg(program);
        c
    }

    fn exec_ok(&self, program: &str, args: &[&str]) -> anyhow::Result<()> {
        let mut all = vec!["netns", "exec", &self.name, program];
        all.extend_from_slice(args);
        run("ip", &all)
    }

    /// Drops every packet between the namespace and the host, without a reset: both ends see
    /// silence, as when a cable is pulled or a middlebox forgets the connection.
    pub fn cut(&self) -> anyhow::Result<()> {
        self.heal()?;
        let host = self.host_ip.to_string();
        self.exec_ok("iptables", &["-A", CHAIN, "-s", &host, "-j", "DROP"])?;
        self.exec_ok("iptables", &["-A", CHAIN, "-d", &host, "-j", "DROP"])
    }

    /// Drops `percent` of the packets between the namespace and the host, at random.
    pub fn lose(&self, percent: u32) -> anyhow::Result<()> {
        self.heal()?;
        let host = self.host_ip.to_string();
        let p = format!("{:.4}", f64::from(percent) / 100.0);
        for dir in ["-s", "-d"] {
            self.exec_ok(
                "iptables",
                &[
                    "-A",
                    CHAIN,
                    dir,
                    &host,
                    "-m",
                    "statistic",
                    "--mode",
                    "random",
                    "--probability",
                    &p,
                    "-j",
                    "DROP",
                ],
            )?;
        }
        Ok(())
    }

    /// Removes every fault.
    pub fn heal(&self) -> anyhow::Result<()> {
        self.exec_ok("iptables", &["-F", CHAIN])
    }

    /// Creates a TCP listener on `addr` inside the namespace (the calling process stays where
    /// it is: only a short-lived thread enters the namespace to open the socket).
    pub fn listen(&self, addr: SocketAddr) -> anyhow::Result<TcpListener> {
        Ok(TcpListener::from_std(self.listen_std(addr)?)?)
    }

    /// [`NetNs::listen`] for a caller outside a Tokio runtime: a non-blocking std listener.
    pub fn listen_std(&self, addr: SocketAddr) -> anyhow::Result<std::net::TcpListener> {
        let path = format!("/var/run/netns/{}", self.name);
        let listener = std::thread::scope(|s| {
            s.spawn(|| -> anyhow::Result<std::net::TcpListener> {
                let ns = std::fs::File::open(&path).with_context(|| format!("open {path}"))?;
                // This thread only, and it ends right after the socket is made.
                enter(&ns).with_context(|| format!("setns into {path}"))?;
                let l = std::net::TcpListener::bind(addr)?;
                l.set_nonblocking(true)?;
                Ok(l)
            })
            .join()
            .map_err(|_| anyhow::anyhow!("the thread entering {path} panicked"))?
        })?;
        Ok(listener)
    }

    /// Makes the host's `127.0.0.1:port` reachable at `127.0.0.1:port` inside the namespace,
    /// by a relay that no packet fault touches (an agent's own API server, say); the returned
    /// [`Gate`] cuts it off on request.
    pub fn bridge_loopback(&self, port: u16) -> anyhow::Result<Gate> {
        let listener = self.listen(SocketAddr::from(([127, 0, 0, 1], port)))?;
        let gate = Gate::default();
        self.relay(
            listener,
            SocketAddr::from(([127, 0, 0, 1], port)),
            None,
            gate.clone(),
        );
        Ok(gate)
    }

    /// A relay listening inside the namespace on `127.0.0.1:<returned port>` that forwards to
    /// `target` over the veth pair, holding every chunk for the returned [`Delay`] in each
    /// direction (none at first): together with [`NetNs::lose`], a long, lossy path.
    pub fn delay_relay(&self, target: SocketAddr) -> anyhow::Result<(u16, Delay)> {
        let listener = self.listen(SocketAddr::from(([127, 0, 0, 1], 0)))?;
        let port = listener.local_addr()?.port();
        let delay = Delay::default();
        self.relay(listener, target, Some(delay.clone()), Gate::default());
        Ok((port, delay))
    }

    fn relay(&self, listener: TcpListener, target: SocketAddr, delay: Option<Delay>, gate: Gate) {
        let stop = self.stop.clone();
        let ns_path = format!("/var/run/netns/{}", self.name);
        tokio::spawn(async move {
            loop {
                let (inside, _) = tokio::select! {
                    _ = stop.cancelled() => return,
                    accepted = listener.accept() => match accepted { Ok(a) => a, Err(_) => continue },
                };
                // A closed gate hangs up at once: the caller sees its connection end.
                let Some(closing) = gate.admit() else {
                    continue;
                };
                let stop = stop.clone();
                let ns_path = ns_path.clone();
                let delay = delay.clone();
                tokio::spawn(async move {
                    // A delay relay dials from inside the namespace, so its packets cross the
                    // veth pair; a loopback bridge dials the host's loopback.
                    let outside = match &delay {
                        None => TcpStream::connect(target).await,
                        Some(_) => connect_inside(&ns_path, target).await,
                    };
                    let delay = delay.unwrap_or_default();
                    let Ok(outside) = outside else { return };
                    let _ = inside.set_nodelay(true);
                    let _ = outside.set_nodelay(true);
                    let (ri, wi) = inside.into_split();
                    let (ro, wo) = outside.into_split();
                    tokio::select! {
                        _ = stop.cancelled() => {}
                        _ = closing.cancelled() => {}
                        _ = pump(ri, wo, delay.clone()) => {}
                        _ = pump(ro, wi, delay) => {}
                    }
                });
            }
        });
    }
}

/// Moves the calling thread into the network namespace of `ns`.
fn enter(ns: &std::fs::File) -> std::io::Result<()> {
    rustix::thread::move_into_link_name_space(
        ns.as_fd(),
        Some(rustix::thread::LinkNameSpaceType::Network),
    )
    .map_err(std::io::Error::from)
}

/// Connects to `target` from inside the namespace at `ns_path`.
async fn connect_inside(ns_path: &str, target: SocketAddr) -> std::io::Result<TcpStream> {
    let ns_path = ns_path.to_string();
    let socket = tokio::task::spawn_blocking(move || -> std::io::Result<std::net::TcpStream> {
        let ns = std::fs::File::open(&ns_path)?;
        // The blocking pool reuses its threads: this one enters the namespace to connect and
        // goes back before it returns.
        let home = std::fs::File::open("/proc/thread-self/ns/net")?;
        enter(&ns)?;
        let connected = std::net::TcpStream::connect_timeout(&target, Duration::from_secs(10));
        if enter(&home).is_err() {
            // A pool thread stuck in the test's namespace would misroute later work: stop.
            std::process::abort();
        }
        let s = connected?;
        s.set_nonblocking(true)?;
        Ok(s)
    })
    .await
    .map_err(std::io::Error::other)??;
    TcpStream::from_std(socket)
}

/// Cuts a relay off: closed, it ends every connection through it and hangs up on new ones;
/// open (at first), it relays.
#[derive(Clone, Default)]
pub struct Gate(std::sync::Arc<std::sync::Mutex<GateState>>);

#[derive(Default)]
struct GateState {
    closed: bool,
    /// Cancelled when the gate closes; the connections admitted while open watch it.
    connections: CancellationToken,
}

impl Gate {
    /// Ends every connection through the relay and refuses new ones until [`Gate::open`].
    pub fn close(&self) {
        let mut state = self.lock();
        state.closed = true;
        std::mem::take(&mut state.connections).cancel();
    }

    /// Relays again.
    pub fn open(&self) {
        self.lock().closed = false;
    }

    /// For a new connection: the token that ends it when the gate closes, or `None` when the
    /// gate is closed.
    fn admit(&self) -> Option<CancellationToken> {
        let state = self.lock();
        (!state.closed).then(|| state.connections.clone())
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, GateState> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The delay a relay adds in each direction, changeable while it runs.
#[derive(Clone, Default)]
pub struct Delay(std::sync::Arc<std::sync::atomic::AtomicU64>);

impl Delay {
    /// Sets the delay of each direction from now on.
    pub fn set(&self, delay: Duration) {
        let ms = u64::try_from(delay.as_millis()).unwrap_or(u64::MAX);
        self.0.store(ms, std::sync::atomic::Ordering::Relaxed);
    }

    fn get(&self) -> Duration {
        Duration::from_millis(self.0.load(std::sync::atomic::Ordering::Relaxed))
    }
}

async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    to: tokio::net::tcp::OwnedWriteHalf,
    delay: Delay,
) {
    // Chunks are released `delay` after they were read, in order, however many are in flight.
    let (tx, mut rx) = tokio::sync::mpsc::channel::<(tokio::time::Instant, Vec<u8>)>(1024);
    let writer = async move {
        let mut to = to;
        while let Some((due, chunk)) = rx.recv().await {
            tokio::time::sleep_until(due).await;
            if to.write_all(&chunk).await.is_err() {
                return;
            }
        }
        let _ = to.shutdown().await;
    };
    let reader = async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match from.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    let due = tokio::time::Instant::now() + delay.get();
                    if tx.send((due, buf[..n].to_vec())).await.is_err() {
                        return;
                    }
                }
            }
        }
    };
    tokio::join!(reader, writer);
}

impl Drop for NetNs {
    fn drop(&mut self) {
        self.stop.cancel();
        let _ = Command::new("ip")
            .args(["link", "del", &self.host_if])
            .output();
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
    }
}
