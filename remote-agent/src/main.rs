//! The `remote-agent` binary: run the agent, `crd` to print the ShadowPod CRD, or
//! `remove-tenant` to remove what the provider holds for one origin.
use clap::Parser;

#[global_allocator]
static ALLOCATOR: refract_shared::runtime::Allocator = refract_shared::runtime::Allocator;

fn main() -> anyhow::Result<()> {
    if std::env::args().nth(1).as_deref() == Some("crd") {
        let yaml = refract_remote_agent::shadowpod::crd_yaml()?;
        let written = refract_shared::stdout::write(&yaml);
        return refract_shared::stdout::quiet_when_closed(written.map_err(Into::into));
    }
    if std::env::args().nth(1).as_deref() == Some("remove-tenant") {
        let args = refract_remote_agent::RemoveTenantArgs::parse_from(std::env::args().skip(1));
        return tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
            .block_on(refract_remote_agent::remove_tenant(args));
    }
    let args = refract_remote_agent::Args::parse();
    refract_shared::telemetry::init_logging(&args.telemetry)?;
    refract_shared::telemetry::exit_on_panic();
    let runtime = args.runtime.clone();
    runtime.run(refract_remote_agent::run(
        args,
        refract_shared::telemetry::shutdown_signal(),
    ))
}
