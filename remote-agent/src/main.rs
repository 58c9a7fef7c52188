//! The `remote-agent` binary: run the agent, or one of its tools (`crd`, `remove-tenant`).
use clap::{CommandFactory, Parser};
use refract_remote_agent::{Cli, Command};
use refract_shared::runtime::RuntimeArgs;
use refract_shared::stdout::{quiet_when_closed, write};

#[global_allocator]
static ALLOCATOR: refract_shared::runtime::Allocator = refract_shared::runtime::Allocator;

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Some(Command::Crd) => {
            let yaml = refract_remote_agent::shadowpod::crd_yaml()?;
            quiet_when_closed(write(&yaml).map_err(Into::into))
        }
        Some(Command::RemoveTenant(args)) => {
            RuntimeArgs::default().run(refract_admin::tenant::run(args))
        }
        None => {
            // clap asks for the agent's required flags when no command is named, so this
            // answer is only a fallback that keeps the binary free of a panic path.
            let Some(args) = cli.agent else {
                Cli::command()
                    .error(
                        clap::error::ErrorKind::MissingRequiredArgument,
                        "name a command or give the agent's flags",
                    )
                    .exit()
            };
            refract_shared::telemetry::init_logging(&args.telemetry)?;
            refract_shared::telemetry::exit_on_panic();
            let runtime = args.runtime.clone();
            runtime.run(refract_remote_agent::run(
                args,
                refract_shared::telemetry::shutdown_signal(),
            ))
        }
    }
}
