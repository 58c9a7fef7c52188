//! The `remote-agent` binary: run the agent, or one of its tools (`crd`, `remove-tenant`).
use refract_remote_agent::{Cli, Command, Invocation};
use refract_shared::runtime::RuntimeArgs;
use refract_shared::stdout::{quiet_when_closed, write};

#[global_allocator]
static ALLOCATOR: refract_shared::runtime::Allocator = refract_shared::runtime::Allocator;

fn main() -> anyhow::Result<()> {
    match Invocation::parse::<Cli>() {
        Invocation::Tool(Command::Crd) => {
            let yaml = refract_remote_agent::shadowpod::crd_yaml()?;
            quiet_when_closed(write(&yaml).map_err(Into::into))
        }
        Invocation::Tool(Command::RemoveTenant(args)) => {
            RuntimeArgs::default().run(refract_admin::tenant::run(args))
        }
        Invocation::Agent(args) => {
            refract_shared::telemetry::init_logging(&args.telemetry, "refract-remote-agent")?;
            refract_shared::telemetry::exit_on_panic();
            let runtime = args.runtime.clone();
            let ended = runtime.run(refract_remote_agent::run(
                *args,
                refract_shared::telemetry::shutdown_signal(),
            ));
            refract_shared::journey::flush();
            ended
        }
    }
}
