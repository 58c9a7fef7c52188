//! The `local-agent` binary: parse flags, run.
use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = refract_local_agent::Args::parse();
    refract_shared::telemetry::init_logging(&args.telemetry)?;
    refract_local_agent::run(args, refract_shared::telemetry::shutdown_signal()).await
}
