//! Reflection settings from flags and from a Helm-values-shaped YAML file.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::Context;
use refract_core::options::{HelmValues, Kind, KindOptions, ReflectionOptions};
use refract_core::policy::Policy;
use refract_core::remap::Rule;

/// Parses a reflection policy flag, listing the policies in `--help` and in the error.
fn policy_parser() -> impl clap::builder::TypedValueParser<Value = Policy> {
    use clap::builder::TypedValueParser;
    clap::builder::PossibleValuesParser::new(Policy::ALL.map(Policy::as_str))
        .try_map(|name| name.parse::<Policy>())
}

/// Flags that shape what is reflected and how. Flags win over `--reflection-config`.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ReflectionFlags {
    /// YAML file in the shape of Liqo's Helm values: `offloading.reflection.<resource>.type`
    /// (DenyList|AllowList), `.workers` (`event` included: provider events recorded at the
    /// origin), `offloading.reflection.customKinds` (custom resource kinds to reflect: group,
    /// version, kind, plural, and optionally type, workers and the status fields brought back,
    /// `status: [ready]` or `["*"]`; added kinds wait for a restart), and
    /// `offloading.reflection.skip.labels|annotations`
    /// (older Liqo versions' top-level `reflection.` is accepted too), and
    /// `controllerManager.config.resourceSharingPercentage`; any other key is an error that
    /// names it. Followed while the agent runs: a change is in force within seconds (but
    /// turning on Services, EndpointSlices or claims that were off at start, from 0 workers,
    /// waits for the next start); a file that does not parse is refused and the last good one
    /// stays in force.
    #[arg(long, value_name = "FILE")]
    pub reflection_config: Option<PathBuf>,

    /// Rewrite endpoint addresses for the provider: FROM_CIDR=TO_CIDR, same prefix length
    /// (repeatable; the first match applies).
    #[arg(long = "remap", value_name = "FROM=TO")]
    pub remap: Vec<Rule>,

    /// Label key never reflected (repeatable).
    #[arg(long = "skip-label", value_name = "KEY")]
    pub skip_labels: Vec<String>,

    /// What every offloaded pod gets on the provider, as Liqo's VirtualNode
    /// `spec.offloadingPatch` (YAML): `nodeSelector`, `tolerations`, `affinity.nodeAffinity`,
    /// `runtimeClassName`, `labelsNotReflected`, `annotationsNotReflected`. Unknown fields are
    /// refused by name. Followed while the agent runs, like --reflection-config: a change is
    /// sent with every offloaded pod's ShadowPod; a running provider pod keeps its placement
    /// and gets the new one when it is created again.
    #[arg(long, value_name = "FILE")]
    pub offloading_patch: Option<std::path::PathBuf>,

    /// Annotation key never reflected (repeatable; cloud-provider keys are skipped by default).
    #[arg(long = "skip-annotation", value_name = "KEY")]
    pub skip_annotations: Vec<String>,

    /// ConfigMap reflection policy.
    #[arg(long, value_parser = policy_parser())]
    pub configmap_reflection_type: Option<Policy>,
    /// ConfigMap reflection workers (0 disables; default 3).
    #[arg(long)]
    pub configmap_reflection_workers: Option<u32>,
    /// Secret reflection policy.
    #[arg(long, value_parser = policy_parser())]
    pub secret_reflection_type: Option<Policy>,
    /// Secret reflection workers (0 disables; default 3).
    #[arg(long)]
    pub secret_reflection_workers: Option<u32>,
    /// Service reflection policy (EndpointSlices inherit it).
    #[arg(long, value_parser = policy_parser())]
    pub service_reflection_type: Option<Policy>,
    /// Service reflection workers (0 disables; default 3).
    #[arg(long)]
    pub service_reflection_workers: Option<u32>,
    /// Ingress reflection policy.
    #[arg(long, value_parser = policy_parser())]
    pub ingress_reflection_type: Option<Policy>,
    /// Ingress reflection workers (0 disables; default 3).
    #[arg(long)]
    pub ingress_reflection_workers: Option<u32>,
    /// EndpointSlice reflection workers (0 disables; default 10).
    #[arg(long)]
    pub endpointslice_reflection_workers: Option<u32>,
    /// PersistentVolumeClaim reflection workers (0 disables the storage fabric; default 3).
    #[arg(long)]
    pub persistentvolumeclaim_reflection_workers: Option<u32>,
    /// Provider event reflection policy, read on the provider event's own annotations
    /// (`liqo.io/skip-reflection`, `liqo.io/allow-reflection`).
    #[arg(long, value_parser = policy_parser())]
    pub event_reflection_type: Option<Policy>,
    /// Provider event reflection workers: 0 records no provider event at the origin; any other
    /// number records them, one at a time within --event-rate (default 3, as Liqo's).
    #[arg(long)]
    pub event_reflection_workers: Option<u32>,

    /// The origin storage class whose claims are provisioned on the provider when their first
    /// pod is scheduled onto the virtual node.
    #[arg(long, default_value = refract_core::options::DEFAULT_VIRTUAL_STORAGE_CLASS)]
    pub virtual_storage_class_name: String,

    /// The provider storage class reflected claims ask for (default: the provider's default
    /// class). A claim's `liqo.io/remote-storage-class` annotation overrides it.
    #[arg(long)]
    pub remote_real_storage_class_name: Option<String>,

    /// Give offloaded pods bound ServiceAccount tokens of the origin (TokenRequest), stored in
    /// a Secret on the provider, and point them at the origin API server. Anyone who can read
    /// Secrets in the tenant's namespaces on the provider can then act as those service
    /// accounts on the origin: set to false when the provider is not trusted that far.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, value_name = "BOOL")]
    pub enable_apiserver_support: bool,

    /// The origin API server's host as offloaded pods reach it (with --home-api-server-port,
    /// sets their KUBERNETES_SERVICE_HOST/PORT).
    #[arg(long, requires = "home_api_server_port")]
    pub home_api_server_host: Option<String>,

    /// The origin API server's port as offloaded pods reach it.
    #[arg(long, requires = "home_api_server_host")]
    pub home_api_server_port: Option<u16>,

    /// Extra label of this peer's virtual node, matched by NamespaceOffloading cluster
    /// selectors: KEY=VALUE (repeatable).
    #[arg(long = "virtual-node-label", value_name = "KEY=VALUE", value_parser = parse_label)]
    pub virtual_node_labels: Vec<(String, String)>,
}

/// Liqo's default share of the provider's free resources, in percent.
pub const DEFAULT_SHARING_PERCENTAGE: u32 = 90;

/// What the agent's settings files and flags say, all at once: read at start, and again
/// whenever a followed file changes ([`crate::settings`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// What is reflected and how.
    pub options: ReflectionOptions,
    /// Share of the provider's free resources the virtual node offers, in percent.
    pub sharing_percentage: u32,
}

fn parse_label(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("{s:?} must be KEY=VALUE"))
}

impl ReflectionFlags {
    /// The options for a peering: defaults, then the file, then flags.
    pub fn options(&self, local: &str, remote: &str) -> anyhow::Result<ReflectionOptions> {
        self.options_with(local, remote, self.values()?.as_ref())
    }

    /// Everything the files and flags set, read now: the reflection options, and the sharing
    /// percentage (`sharing_flag`, the `--sharing-percentage` flag, wins over the file's).
    pub fn settings(
        &self,
        local: &str,
        remote: &str,
        sharing_flag: Option<u32>,
    ) -> anyhow::Result<Settings> {
        let values = self.values()?;
        let options = self.options_with(local, remote, values.as_ref())?;
        let sharing_percentage = sharing_flag
            .or_else(|| values.as_ref().and_then(HelmValues::sharing_percentage))
            .unwrap_or(DEFAULT_SHARING_PERCENTAGE);
        Ok(Settings {
            options,
            sharing_percentage,
        })
    }

    /// The `--reflection-config` file's values, when one is named.
    fn values(&self) -> anyhow::Result<Option<HelmValues>> {
        let Some(path) = &self.reflection_config else {
            return Ok(None);
        };
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("failed to read --reflection-config {}", path.display()))?;
        let values = HelmValues::from_yaml(&text)
            .map_err(|e| anyhow::anyhow!("invalid --reflection-config {}: {e}", path.display()))?;
        Ok(Some(values))
    }

    fn options_with(
        &self,
        local: &str,
        remote: &str,
        values: Option<&HelmValues>,
    ) -> anyhow::Result<ReflectionOptions> {
        let mut o = ReflectionOptions::new(local, remote);
        if let Some(values) = values {
            o.merge_values(values);
        }
        if let Some(path) = &self.offloading_patch {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("failed to read --offloading-patch {}", path.display()))?;
            let patch = refract_core::options::OffloadingPatch::from_yaml(&text).map_err(|e| {
                anyhow::anyhow!("invalid --offloading-patch {}: {e}", path.display())
            })?;
            o.skip_labels
                .extend(patch.labels_not_reflected.iter().cloned());
            o.skip_annotations
                .extend(patch.annotations_not_reflected.iter().cloned());
            o.offloading_patch = patch;
        }
        o.remapping.0.extend(self.remap.iter().cloned());
        o.skip_labels.extend(self.skip_labels.iter().cloned());
        o.skip_annotations
            .extend(self.skip_annotations.iter().cloned());
        let per_kind = [
            (
                Kind::ConfigMap,
                self.configmap_reflection_type,
                self.configmap_reflection_workers,
            ),
            (
                Kind::Secret,
                self.secret_reflection_type,
                self.secret_reflection_workers,
            ),
            (
                Kind::Service,
                self.service_reflection_type,
                self.service_reflection_workers,
            ),
            (
                Kind::Ingress,
                self.ingress_reflection_type,
                self.ingress_reflection_workers,
            ),
            (
                Kind::EndpointSlice,
                None,
                self.endpointslice_reflection_workers,
            ),
            (
                Kind::PersistentVolumeClaim,
                None,
                self.persistentvolumeclaim_reflection_workers,
            ),
        ];
        for (kind, policy, workers) in per_kind {
            let mut k: KindOptions = o.kind(kind);
            k.policy = policy.unwrap_or(k.policy);
            k.workers = workers.unwrap_or(k.workers);
            o.kinds.insert(kind, k);
        }
        o.events.policy = self.event_reflection_type.unwrap_or(o.events.policy);
        o.events.workers = self.event_reflection_workers.unwrap_or(o.events.workers);
        o.storage.virtual_storage_class = self.virtual_storage_class_name.clone();
        o.storage.remote_storage_class = self
            .remote_real_storage_class_name
            .clone()
            .filter(|c| !c.is_empty());
        o.api_server.enabled = self.enable_apiserver_support;
        o.api_server.host = self.home_api_server_host.clone();
        o.api_server.port = self.home_api_server_port;
        Ok(o)
    }

    /// The extra virtual node labels as a map.
    pub fn node_labels(&self) -> BTreeMap<String, String> {
        self.virtual_node_labels.iter().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_patch(text: &str) -> anyhow::Result<ReflectionOptions> {
        let file = tempfile::NamedTempFile::new()?;
        std::fs::write(file.path(), text)?;
        let flags = ReflectionFlags {
            offloading_patch: Some(file.path().to_path_buf()),
            ..Default::default()
        };
        flags.options("origin", "provider")
    }

    #[test]
    fn an_offloading_patch_file_sets_placement_and_what_is_not_reflected() {
        let o = with_patch(
            "nodeSelector: {pool: tenants}\nlabelsNotReflected: [team.example/cost-centre]\nannotationsNotReflected: [audit.example/ticket]\n",
        )
        .unwrap();
        assert_eq!(o.offloading_patch.node_selector["pool"], "tenants");
        assert!(o.skip_labels.contains("team.example/cost-centre"));
        assert!(o.skip_annotations.contains("audit.example/ticket"));
    }

    #[test]
    fn an_unknown_field_in_an_offloading_patch_is_named() {
        let error = with_patch("nodeSelectors: {pool: tenants}\n")
            .unwrap_err()
            .to_string();
        assert!(error.contains("nodeSelectors"), "{error}");
        assert!(error.contains("--offloading-patch"), "{error}");
    }

    /// The settings deploy/ ships are the defaults, written out where an operator edits them.
    #[test]
    fn the_shipped_settings_file_says_the_defaults() {
        let config_map: serde_yaml_ng::Value =
            serde_yaml_ng::from_str(include_str!("../../deploy/local-agent/settings.yaml"))
                .unwrap();
        let text = config_map["data"]["reflection.yaml"].as_str().unwrap();
        let file = tempfile::NamedTempFile::new().unwrap();
        std::fs::write(file.path(), text).unwrap();
        let flags = ReflectionFlags {
            reflection_config: Some(file.path().to_path_buf()),
            ..ReflectionFlags::default()
        };
        let defaults = ReflectionFlags::default()
            .settings("origin", "provider", None)
            .unwrap();
        assert_eq!(
            flags.settings("origin", "provider", None).unwrap(),
            defaults
        );
        assert_eq!(defaults.sharing_percentage, DEFAULT_SHARING_PERCENTAGE);
    }
}
