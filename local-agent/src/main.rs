//! The `local-agent` binary: run the agent, or `preview` / `unpeer` / `crd`.
use clap::Parser;
use refract_shared::runtime::RuntimeArgs;
use refract_shared::stdout::quiet_when_closed;

#[global_allocator]
static ALLOCATOR: refract_shared::runtime::Allocator = refract_shared::runtime::Allocator;

fn main() -> anyhow::Result<()> {
    // The agent's flags stay top-level (`local-agent --remote ...`); the two tools are
    // subcommands.
    match std::env::args().nth(1).as_deref() {
        Some("preview") => {
            let args =
                refract_local_agent::preview::PreviewArgs::parse_from(std::env::args().skip(1));
            quiet_when_closed(RuntimeArgs::default().run(refract_local_agent::preview::run(args)))
        }
        Some("unpeer") => {
            let args = refract_local_agent::unpeer::command::UnpeerArgs::parse_from(
                std::env::args().skip(1),
            );
            RuntimeArgs::default().run(refract_local_agent::unpeer::command::run(args))
        }
        Some("crd") => {
            let yaml = refract_local_agent::crd::crd_yaml()?;
            quiet_when_closed(refract_shared::stdout::write(&yaml).map_err(Into::into))
        }
        _ => {
            let args = refract_local_agent::Args::parse();
            refract_shared::telemetry::init_logging(&args.telemetry)?;
            refract_shared::telemetry::exit_on_panic();
            let runtime = args.runtime.clone();
            runtime.run(refract_local_agent::run(
                args,
                refract_shared::telemetry::shutdown_signal(),
            ))
        }
    }
}
