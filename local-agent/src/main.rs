//! The `local-agent` binary: run the agent, or `preview` / `crd`.
use clap::Parser;
use refract_shared::runtime::RuntimeArgs;

#[global_allocator]
static ALLOCATOR: refract_shared::runtime::Allocator = refract_shared::runtime::Allocator;

fn main() -> anyhow::Result<()> {
    // The agent's flags stay top-level (`local-agent --remote ...`); the two tools are
    // subcommands.
    match std::env::args().nth(1).as_deref() {
        Some("preview") => {
            let args =
                refract_local_agent::preview::PreviewArgs::parse_from(std::env::args().skip(1));
            RuntimeArgs::default().run(refract_local_agent::preview::run(args))
        }
        Some("crd") => {
            print!("{}", refract_local_agent::crd::crd_yaml());
            Ok(())
        }
        _ => {
            let args = refract_local_agent::Args::parse();
            refract_shared::telemetry::init_logging(&args.telemetry)?;
            let runtime = args.runtime.clone();
            runtime.run(refract_local_agent::run(
                args,
                refract_shared::telemetry::shutdown_signal(),
            ))
        }
    }
}
