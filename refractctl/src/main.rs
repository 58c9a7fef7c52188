//! `refractctl`: peer two clusters with Refract, and look after the peering.

mod apply;
mod cli;
mod display;
mod dry_run;
mod install;
mod join;
mod manifests;
mod peer;
mod peering;
mod pki;
mod plan;
mod ready;
mod rotate;
mod status;
mod tap;
mod tenant;
mod tenant_cert;
mod unpeer;
mod version;
mod wait;

use std::process::ExitCode;

use clap::{CommandFactory, Parser};
use refract_shared::runtime::RuntimeArgs;

/// The exit code of `status` when a peering does not work (or there is none): distinct from
/// 1, a command that failed, so that scripts can tell "unhealthy" from "could not tell".
const EXIT_UNHEALTHY: u8 = 3;

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    manifests::AgentNamespace::choose(&cli.namespace);
    if let cli::Command::Completion(args) = &cli.command {
        let mut command = cli::Cli::command();
        clap_complete::generate(
            args.shell,
            &mut command,
            "refractctl",
            &mut std::io::stdout(),
        );
        return ExitCode::SUCCESS;
    }
    let result = RuntimeArgs::default().run(async move {
        match cli.command {
            cli::Command::Peer(args) => peer::run(args).await,
            cli::Command::Status(args) => status::run(args).await,
            cli::Command::Unpeer(args) => unpeer::run(args).await,
            cli::Command::Rotate(args) => rotate::run(args).await,
            cli::Command::Tap(args) => tap::run(args).await,
            cli::Command::Install(cli::InstallCommand::Provider(args)) => {
                install::run_provider(args).await
            }
            cli::Command::Join(cli::JoinCommand::Request(args)) => join::request(args).await,
            cli::Command::Join(cli::JoinCommand::Complete(args)) => join::complete(args).await,
            cli::Command::Tenant(cli::TenantCommand::Export(args)) => tenant::export(args).await,
            cli::Command::Version(args) => version::run(args).await,
            cli::Command::Completion(_) => Ok(()),
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.downcast_ref::<status::Unhealthy>().is_some() => {
            eprintln!("refractctl: {e}");
            ExitCode::from(EXIT_UNHEALTHY)
        }
        Err(e) => {
            eprintln!("Error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
