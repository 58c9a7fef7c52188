//! Logging and the admin endpoint, identical in both agents.
//!
//! The admin endpoint serves `/healthz` (the process is alive), `/readyz` (the agent has done
//! its first sync and can do its job) and `/metrics` (Prometheus text format).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::routing::get;
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

use refract_core::lock::Locked;

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
}

/// Installs the global tracing subscriber.
pub fn init_logging(args: &TelemetryArgs) -> anyhow::Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_new(&args.log_level)
        .map_err(|e| anyhow::anyhow!("invalid --log-level {:?}: {e}", args.log_level))?;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match args.log_format {
        LogFormat::Plain => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    }
    .map_err(|e| anyhow::anyhow!("failed to install logger: {e}"))
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
}

impl Admin {
    /// Marks the agent ready (or not) for `/readyz`.
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::Relaxed);
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
        shutdown: CancellationToken,
    ) -> anyhow::Result<SocketAddr> {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| anyhow::anyhow!("failed to bind admin endpoint {addr}: {e}"))?;
        let local = listener.local_addr()?;
        let app = axum::Router::new()
            .route("/healthz", get(|| async { "ok\n" }))
            .route("/readyz", get(readyz))
            .route("/metrics", get(metrics))
            .with_state(self.clone());
        tokio::spawn(async move {
            let served = axum::serve(listener, app)
                .with_graceful_shutdown(async move { shutdown.cancelled().await })
                .await;
            if let Err(error) = served {
                tracing::error!(%error, "admin endpoint failed");
            }
        });
        tracing::info!(%local, "admin endpoint serving /healthz /readyz /metrics");
        Ok(local)
    }
}

async fn readyz(State(admin): State<Admin>) -> impl IntoResponse {
    if admin.ready.load(Ordering::Relaxed) {
        (StatusCode::OK, "ready\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready\n")
    }
}

async fn metrics(State(admin): State<Admin>) -> impl IntoResponse {
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

/// How often the certificate expiry gauge is brought up to date.
const EXPIRY_PERIOD: std::time::Duration = std::time::Duration::from_secs(10);

/// Registers, under `prefix`, `build_info{version}` (always 1) and
/// `certificate_expiry_seconds`: how long until the agent's own certificate (as `tls` follows
/// it) expires, negative once it has. Kept current until `shutdown`.
pub fn register_agent_info<T: Send + Sync + 'static>(
    admin: &Admin,
    prefix: &str,
    tls: crate::tls::Watched<T>,
    shutdown: CancellationToken,
) {
    use prometheus_client::metrics::family::Family;
    use prometheus_client::metrics::gauge::Gauge;
    let info: Family<Vec<(&'static str, &'static str)>, Gauge> = Family::default();
    info.get_or_create(&vec![("version", refract_core::AGENT_VERSION)])
        .set(1);
    let expiry: Gauge<f64, std::sync::atomic::AtomicU64> = Gauge::default();
    admin.register(prefix, |r| {
        r.register("build_info", "The agent's version (always 1)", info);
        r.register(
            "certificate_expiry_seconds",
            "Seconds until the agent's own certificate expires (negative once it has)",
            expiry.clone(),
        );
    });
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(EXPIRY_PERIOD);
        loop {
            let left = tls.current().not_after - time::OffsetDateTime::now_utc();
            expiry.set(left.as_seconds_f64());
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
