//! The Kubernetes client each agent builds for its own cluster (the origin's for the local
//! agent, the provider's for the remote agent), found the way `kubectl` users expect.

use std::path::Path;

use anyhow::Context as _;

/// A client from `--kubeconfig` when given, else the in-cluster service account, else
/// `$KUBECONFIG` (or `~/.kube/config`).
pub async fn client(kubeconfig: Option<&Path>) -> anyhow::Result<kube::Client> {
    Ok(client_and_config(kubeconfig).await?.0)
}

/// Like [`client`], with the configuration it was built from (for clients that act as
/// someone else).
pub async fn client_and_config(
    kubeconfig: Option<&Path>,
) -> anyhow::Result<(kube::Client, kube::Config)> {
    let config = match kubeconfig {
        Some(path) => {
            let kubeconfig = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("failed to read --kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
                .await
                .with_context(|| format!("--kubeconfig {} is not usable", path.display()))?
        }
        None => kube::Config::infer()
            .await
            .context("no --kubeconfig given and neither in-cluster config nor $KUBECONFIG works")?,
    };
    let client =
        kube::Client::try_from(config.clone()).context("failed to build Kubernetes client")?;
    Ok((client, config))
}
