//! Logging and the admin endpoint, identical in both agents.
//!
//! The admin endpoint serves `/healthz` (the process is alive), `/readyz` (the agent can do its
//! job: the remote agent once it serves; a local agent replica once it serves its webhook,
//! leader or standby) and `/metrics` (Prometheus text format).
//!
//! The metrics name tenants, peerings and certificates, so they are served only to whom may
//! read them: on a loopback address to any local process (as a kubelet serves its read-only
//! port), on any other address only to a bearer token the agent's cluster accepts
//! (TokenReview) whose user may `get` the non-resource path `/metrics` (SubjectAccessReview),
//! as Kubernetes' own components protect theirs. Health answers carry nothing and stay open:
//! kubelet probes send no token.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use axum::extract::{ConnectInfo, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

use refract_core::lock::Locked;

use crate::kube_auth::token_cache::TokenCache;
use crate::kube_auth::{Access, AuthError, DecisionCache};

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Plain,
    /// One JSON object per line, for log collectors.
    Json,
}

/// The logging and admin flags both agents take.
#[derive(Debug, Clone, clap::Args)]
pub struct TelemetryArgs {
    /// Log line format.
    #[arg(long, value_enum, default_value = "plain", env = "REFRACT_LOG_FORMAT")]
    pub log_format: LogFormat,

    /// Log filter in tracing's EnvFilter syntax, e.g. `info` or `info,refract_remote_agent=debug`.
    #[arg(long, default_value = "info", env = "REFRACT_LOG_LEVEL")]
    pub log_level: String,

    /// Address of the admin HTTP endpoint serving /healthz, /readyz and /metrics.
    #[arg(long, default_value = "127.0.0.1:9090")]
    pub admin_listen: SocketAddr,

    /// Who may read /metrics: `auto` lets any local process on a loopback --admin-listen and
    /// asks the cluster on any other address; `kubernetes` always asks the cluster (a bearer
    /// token its TokenReview accepts, whose user may `get` the path /metrics). /healthz and
    /// /readyz are always open: they carry nothing.
    #[arg(long, value_enum, default_value = "auto")]
    pub admin_auth: AdminAuth,

    /// Where each change's journey is exported as OpenTelemetry traces.
    #[command(flatten)]
    pub traces: crate::journey::TraceArgs,
}

/// Who may read the admin endpoint's `/metrics`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum AdminAuth {
    /// Anyone on a loopback address, the cluster's say anywhere else.
    Auto,
    /// The cluster's say: TokenReview, then SubjectAccessReview of `get /metrics`.
    Kubernetes,
}

/// Installs the global tracing subscriber: log lines as `--log-format` and `--log-level`
/// say, and the journey spans of `service` exported when tracing is on ([`crate::journey`]).
pub fn init_logging(args: &TelemetryArgs, service: &'static str) -> anyhow::Result<()> {
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    use tracing_subscriber::Layer as _;
    let filter = tracing_subscriber::EnvFilter::try_new(&args.log_level)
        .map_err(|e| anyhow::anyhow!("invalid --log-level {:?}: {e}", args.log_level))?;
    let lines = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let lines = match args.log_format {
        LogFormat::Plain => lines.boxed(),
        LogFormat::Json => lines.json().flatten_event(true).boxed(),
    };
    let journeys = crate::journey::layer(&args.traces, service)?;
    let traced = journeys.is_some();
    tracing_subscriber::registry()
        .with(lines.with_filter(filter))
        .with(journeys)
        .try_init()
        .map_err(|e| anyhow::anyhow!("failed to install logger: {e}"))?;
    if traced {
        tracing::info!(
            service,
            "exporting each change's journey as OpenTelemetry traces (OTLP/gRPC)"
        );
    }
    Ok(())
}

/// The exit status of a process a panic ended, as Rust's own for a panic in `main`.
pub const PANIC_EXIT_CODE: i32 = 101;

/// Makes a panic on any thread end the process, with the usual message on stderr, an error
/// log line, and status [`PANIC_EXIT_CODE`].
///
/// Without it a panic ends only the task it happens in: tokio catches it, and the agent goes
/// on answering `/healthz` with, say, its link or one reflector gone, never restarted. Ended,
/// it is restarted by its supervisor and resynchronizes; on the provider nothing is deleted by
/// an agent going away. The hook runs before the panicking thread unwinds, so no lock is ever
/// seen poisoned ([`refract_core::lock`]).
pub fn exit_on_panic() {
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        report(info);
        tracing::error!(panic = %info, "the agent panicked; exiting so that it is restarted");
        std::process::exit(PANIC_EXIT_CODE);
    }));
}

/// Readiness and metrics shared between an agent's tasks and its admin endpoint.
#[derive(Clone, Default)]
pub struct Admin {
    ready: Arc<AtomicBool>,
    registry: Arc<Mutex<Registry>>,
    /// Who reviews metrics readers, once the agent has its cluster's client.
    reviewer: Arc<OnceLock<Reviewer>>,
}

/// Reviews bearer tokens and access with the agent's cluster, reusing answers.
struct Reviewer {
    client: kube::Client,
    tokens: TokenCache,
    decisions: DecisionCache,
}

/// The admin endpoint's state: the agent's, and whether metrics need a reviewed token.
#[derive(Clone)]
struct Served {
    admin: Admin,
    protected: bool,
}

impl Admin {
    /// Marks the agent ready (or not) for `/readyz`.
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Relaxed);
    }

    /// Reviews metrics readers with `client` (the agent's own cluster): until this is called,
    /// a non-loopback endpoint answers `/metrics` 503.
    pub fn review_readers_with(&self, client: kube::Client) {
        let _ = self.reviewer.set(Reviewer {
            client,
            tokens: TokenCache::default(),
            decisions: DecisionCache::default(),
        });
    }

    /// Lets a component register its metrics under a prefix.
    pub fn register(&self, prefix: &str, f: impl FnOnce(&mut Registry)) {
        let mut registry = self.registry.locked();
        f(registry.sub_registry_with_prefix(prefix));
    }

    /// Binds the admin endpoint (failing now if the address is taken) and serves it until
    /// `shutdown`.
    pub async fn spawn(
        &self,
        addr: SocketAddr,
        auth: AdminAuth,
        shutdown: CancellationToken,
    ) -> anyhow::Result<SocketAddr> {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| anyhow::anyhow!("failed to bind admin endpoint {addr}: {e}"))?;
        let local = listener.local_addr()?;
        let protected = auth == AdminAuth::Kubernetes || !local.ip().is_loopback();
        let app = axum::Router::new()
            .route("/healthz", get(|| async { "ok\n" }))
            .route("/readyz", get(readyz))
            .route("/metrics", get(metrics))
            .with_state(Served {
                admin: self.clone(),
                protected,
            });
        tokio::spawn(async move {
            let served = axum::serve(
                listener,
                app.into_make_service_with_connect_info::<SocketAddr>(),
            )
            .with_graceful_shutdown(async move { shutdown.cancelled().await })
            .await;
            if let Err(error) = served {
                tracing::error!(%error, "admin endpoint failed");
            }
        });
        if protected {
            tracing::info!(%local, "admin endpoint serving /healthz /readyz, and /metrics to bearer tokens allowed `get` on /metrics");
        } else {
            tracing::info!(%local, "admin endpoint serving /healthz /readyz /metrics on loopback");
        }
        Ok(local)
    }
}

async fn readyz(State(served): State<Served>) -> impl IntoResponse {
    if served.admin.ready.load(Ordering::Relaxed) {
        (StatusCode::OK, "ready\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready\n")
    }
}

/// Whether the caller may read `/metrics`: always on loopback, else as its cluster says.
async fn may_read_metrics(
    served: &Served,
    headers: &HeaderMap,
    source: SocketAddr,
) -> Result<(), (StatusCode, String)> {
    if !served.protected {
        return Ok(());
    }
    let Some(reviewer) = served.admin.reviewer.get() else {
        return Err((
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready to review credentials yet\n".into(),
        ));
    };
    let authorization = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    let refused = |e: AuthError| (e.http_status(), format!("{e}\n"));
    let user = reviewer
        .tokens
        .bearer_user(&reviewer.client, authorization, source.ip())
        .await
        .map_err(refused)?;
    let access = Access::Path {
        verb: "get",
        path: "/metrics",
    };
    reviewer
        .decisions
        .authorize(&reviewer.client, &user, &access)
        .await
        .map_err(|e| {
            tracing::info!(user = %user.name, %source, error = %e, "metrics request refused");
            refused(e)
        })
}

async fn metrics(
    State(served): State<Served>,
    ConnectInfo(source): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
) -> impl IntoResponse {
    if let Err(refused) = may_read_metrics(&served, &headers, source).await {
        return refused.into_response();
    }
    let admin = served.admin;
    let mut body = String::new();
    let encoded = {
        let registry = admin.registry.locked();
        prometheus_client::encoding::text::encode(&mut body, &registry)
    };
    match encoded {
        Ok(()) => (
            StatusCode::OK,
            [(
                header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            body,
        )
            .into_response(),
        Err(e) => (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()).into_response(),
    }
}

/// Resolves when the process receives SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = ctrl_c => {}
                _ = term.recv() => {}
            }
        }
        Err(error) => {
            tracing::warn!(%error, "cannot handle SIGTERM; only SIGINT stops the agent cleanly");
            let _ = ctrl_c.await;
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}

/// How often the certificate expiry gauges are brought up to date.
const EXPIRY_PERIOD: std::time::Duration = std::time::Duration::from_secs(10);

/// Registers, under `prefix`, `build_info{version}` (always 1) and
/// `certificate_expiry_timestamp_seconds{certificate}`: when each certificate the agent
/// presents or serves expires, as Unix seconds. `link` is the link certificate as `tls`
/// follows it; each of `served` (`webhook`, `kubelet`) is read from its file, as the server
/// using it re-reads it (a file that does not parse keeps the last value). Kept current until
/// `shutdown`.
pub fn register_agent_info<T: Send + Sync + 'static>(
    admin: &Admin,
    prefix: &str,
    tls: crate::tls::Watched<T>,
    served: Vec<(&'static str, std::path::PathBuf)>,
    shutdown: CancellationToken,
) {
    use prometheus_client::metrics::family::Family;
    use prometheus_client::metrics::gauge::Gauge;
    type ExpiryGauge = Gauge<f64, std::sync::atomic::AtomicU64>;
    let info: Family<Vec<(&'static str, &'static str)>, Gauge> = Family::default();
    info.get_or_create(&vec![("version", refract_core::AGENT_VERSION)])
        .set(1);
    let expiry: Family<Vec<(&'static str, &'static str)>, ExpiryGauge> = Family::default();
    admin.register(prefix, |r| {
        r.register("build_info", "The agent's version (always 1)", info);
        r.register(
            "certificate_expiry_timestamp_seconds",
            "When each certificate the agent presents or serves expires (Unix seconds), by certificate: link, webhook, kubelet",
            expiry.clone(),
        );
    });
    let unix = |t: time::OffsetDateTime| t.unix_timestamp() as f64;
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(EXPIRY_PERIOD);
        loop {
            expiry
                .get_or_create(&vec![("certificate", "link")])
                .set(unix(tls.current().not_after));
            for (name, path) in &served {
                match crate::tls::files::leaf_not_after(path) {
                    Ok(not_after) => {
                        expiry
                            .get_or_create(&vec![("certificate", *name)])
                            .set(unix(not_after));
                    }
                    Err(error) => {
                        tracing::debug!(certificate = name, %error, "certificate expiry not read; keeping the last value");
                    }
                }
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tick.tick() => {}
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Set in the child process `a_panic_in_a_task_ends_the_process` starts.
    const PANIC_CHILD: &str = "REFRACT_TEST_PANIC_CHILD";

    /// The child's part of `a_panic_in_a_task_ends_the_process`; nothing in a plain test run.
    #[test]
    fn panic_child() {
        if std::env::var_os(PANIC_CHILD).is_none() {
            return;
        }
        exit_on_panic();
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let _ = tokio::spawn(async { panic!("a task panicked") }).await;
            // Without the hook tokio catches the panic, and the process goes on to here.
            println!("still running");
        });
    }

    #[test]
    fn a_panic_in_a_task_ends_the_process() {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "telemetry::tests::panic_child", "--nocapture"])
            .env(PANIC_CHILD, "1")
            .output()
            .unwrap();
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        assert_eq!(
            out.status.code(),
            Some(PANIC_EXIT_CODE),
            "{stdout}\n{stderr}"
        );
        assert!(stderr.contains("a task panicked"), "{stderr}");
        // Ended in the hook: neither the rest of the child test nor the harness's summary ran.
        assert!(!stdout.contains("still running"), "{stdout}");
        assert!(!stdout.contains("test result"), "{stdout}");
    }
}
