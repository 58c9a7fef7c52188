//! `refractctl`: peer two clusters with Refract, and look after the peering.

mod apply;
mod cli;
mod display;
mod manifests;
mod peer;
mod peering;
mod pki;
mod plan;
mod rotate;
mod status;
mod tap;
mod unpeer;
mod wait;

use clap::Parser;
use refract_shared::runtime::RuntimeArgs;

fn main() -> anyhow::Result<()> {
    let cli = cli::Cli::parse();
    RuntimeArgs::default().run(async move {
        match cli.command {
            cli::Command::Peer(args) => peer::run(args).await,
            cli::Command::Status(args) => status::run(args).await,
            cli::Command::Unpeer(args) => unpeer::run(args).await,
            cli::Command::Rotate(args) => rotate::run(args).await,
            cli::Command::Tap(args) => tap::run(args).await,
        }
    })
}
