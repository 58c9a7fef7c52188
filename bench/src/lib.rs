//! What the benchmark binaries share: percentiles over measured durations, first sightings of
//! objects by a watch, and processes' memory and CPU time.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test and benchmark harness: a panic is how it reports a failed step"
)]
pub mod cpus;
pub mod fake_fleet;
pub mod kube_ops;
/// What `/proc` says of a process (shared with the end-to-end tests).
pub use refract_testkit::procfs;
pub mod requests;
pub mod sightings;
pub mod stats;

/// What every run of a benchmark binary sets up first: its own log (warnings, to stderr), the
/// agents' at info ([`agents_log_at_info`]), the agent binaries beside it unless
/// `REFRACT_BIN_DIR` names others, and `etcd_parent` for the testkit's etcds.
pub fn set_up_run(etcd_parent: &std::path::Path) -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "warn,kube_client::client::builder=off".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    agents_log_at_info();
    if std::env::var_os("REFRACT_BIN_DIR").is_none() {
        let exe = std::env::current_exe()?;
        let dir = exe
            .parent()
            .ok_or_else(|| anyhow::anyhow!("{} has no folder", exe.display()))?;
        std::env::set_var("REFRACT_BIN_DIR", dir);
    }
    // Read by the testkit when it starts etcd.
    std::env::set_var("REFRACT_ETCD_PARENT", etcd_parent);
    Ok(())
}

/// Has the agents log at info unless `REFRACT_AGENT_LOG_LEVEL` says otherwise. The test kit
/// starts them at debug, which writes a line or two per object: a benchmark would measure the
/// logger. `REFRACT_AGENT_LOG_LEVEL=info,refract::trace=debug` logs each object's stages.
pub fn agents_log_at_info() {
    if std::env::var_os("REFRACT_AGENT_LOG_LEVEL").is_none() {
        std::env::set_var("REFRACT_AGENT_LOG_LEVEL", "info");
    }
}
