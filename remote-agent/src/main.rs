//! The `remote-agent` binary: parse flags, run.
use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = refract_remote_agent::Args::parse();
    refract_shared::telemetry::init_logging(&args.telemetry)?;
    refract_remote_agent::run(args, refract_shared::telemetry::shutdown_signal()).await
}
