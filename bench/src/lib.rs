//! What the benchmark binaries share: percentiles over measured durations, first sightings of
//! objects by a watch, and processes' memory and CPU time.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    reason = "test and benchmark harness: a panic is how it reports a failed step"
)]
pub mod cpus;
/// What `/proc` says of a process (shared with the end-to-end tests).
pub use refract_testkit::procfs;
pub mod sightings;
pub mod stats;

/// Has the agents log at info unless `REFRACT_AGENT_LOG_LEVEL` says otherwise. The test kit
/// starts them at debug, which writes a line or two per object: a benchmark would measure the
/// logger. `REFRACT_AGENT_LOG_LEVEL=info,refract::trace=debug` logs each object's stages.
pub fn agents_log_at_info() {
    if std::env::var_os("REFRACT_AGENT_LOG_LEVEL").is_none() {
        std::env::set_var("REFRACT_AGENT_LOG_LEVEL", "info");
    }
}
