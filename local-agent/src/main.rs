//! The `local-agent` binary: run the agent, or one of its tools (`preview`, `unpeer`, `crd`).
use refract_local_agent::{Cli, Command, Invocation};
use refract_shared::runtime::RuntimeArgs;
use refract_shared::stdout::{quiet_when_closed, write};

#[global_allocator]
static ALLOCATOR: refract_shared::runtime::Allocator = refract_shared::runtime::Allocator;

fn main() -> anyhow::Result<()> {
    match Invocation::parse::<Cli>() {
        Invocation::Tool(Command::Preview(args)) => {
            quiet_when_closed(RuntimeArgs::default().run(refract_local_agent::preview::run(*args)))
        }
        Invocation::Tool(Command::Unpeer(args)) => {
            RuntimeArgs::default().run(refract_admin::unpeer::command::run(args))
        }
        Invocation::Tool(Command::Crd) => {
            let yaml = refract_admin::crd::crd_yaml()?;
            quiet_when_closed(write(&yaml).map_err(Into::into))
        }
        Invocation::Agent(args) => {
            refract_shared::telemetry::init_logging(&args.telemetry, "refract-local-agent")?;
            refract_shared::telemetry::exit_on_panic();
            let runtime = args.runtime.clone();
            let ended = runtime.run(refract_local_agent::run(
                *args,
                refract_shared::telemetry::shutdown_signal(),
            ));
            refract_shared::journey::flush();
            ended
        }
    }
}
