//! How an offloaded pod reaches an API server ([`ApiServerAccess`]): the volumes, environment
//! and ServiceAccount of the provider pod.
//!
//! - Origin: projected ServiceAccount tokens (and the legacy token volume) are mounted from the
//!   pod's token Secret, the origin's root CA from its reflected ConfigMap, and, when the
//!   operator configured the origin API server's address, the `KUBERNETES_SERVICE_*`
//!   environment points in-cluster clients at it.
//! - Disabled: projected tokens are removed, the legacy token volume becomes an empty folder.
//! - Provider: the pod runs as a provider ServiceAccount with its token automounted, and its
//!   volumes are left as they are, so projected tokens and `kube-root-ca.crt` are the
//!   provider's. The legacy token volume of an origin up to Kubernetes 1.20 (a Secret that never
//!   leaves the origin) is removed with its mounts, so the provider mounts its own token there;
//!   Liqo copies it, and the pod cannot start.

use k8s_openapi::api::core::v1::{
    ConfigMapProjection, Container, DownwardAPIProjection, DownwardAPIVolumeFile, EnvVar,
    KeyToPath, ObjectFieldSelector, Pod, PodSpec, ProjectedVolumeSource, SecretProjection, Volume,
    VolumeProjection,
};

use crate::forge::configmap::{remote_root_ca_name, ROOT_CA_NAME};
use crate::forge::token::{
    api_server_access, is_legacy_token_volume, service_account_of, token_key, token_secret_name,
    ApiServerAccess, LEGACY_TOKEN_PATH,
};
use crate::forge::Context;

/// Sets `spec`'s containers, volumes and ServiceAccount (copied from the origin pod `pod`) to
/// what `pod`'s [`ApiServerAccess`] needs.
pub(super) fn apply(spec: &mut PodSpec, pod: &Pod, ctx: &Context<'_>) {
    let service_account = service_account_of(pod);
    match api_server_access(pod, ctx) {
        ApiServerAccess::Provider {
            service_account: provider_account,
        } => {
            let legacy: Vec<String> = spec
                .volumes
                .iter()
                .flatten()
                .filter(|v| is_legacy_token_volume(v, &service_account))
                .map(|v| v.name.clone())
                .collect();
            if let Some(volumes) = spec.volumes.as_mut() {
                volumes.retain(|v| !legacy.contains(&v.name));
            }
            for c in all_containers(spec) {
                if let Some(mounts) = c.volume_mounts.as_mut() {
                    mounts.retain(|m| !legacy.contains(&m.name));
                    if mounts.is_empty() {
                        c.volume_mounts = None;
                    }
                }
            }
            spec.service_account_name = Some(provider_account);
            spec.automount_service_account_token = Some(true);
        }
        access => {
            let origin = access == ApiServerAccess::Origin;
            let token_secret =
                origin.then(|| token_secret_name(pod.metadata.name.as_deref().unwrap_or_default()));
            if let Some(volumes) = spec.volumes.as_mut() {
                *volumes = remote_volumes(volumes, &service_account, token_secret.as_deref(), ctx);
            }
            if origin {
                for c in all_containers(spec) {
                    api_server_env(c, &service_account, ctx);
                }
            }
            // The origin's ServiceAccount means nothing to the provider's API server.
            spec.service_account_name = None;
            spec.automount_service_account_token = Some(false);
        }
    }
}

/// The containers and init containers of `spec` (ephemeral containers are never forged).
fn all_containers(spec: &mut PodSpec) -> impl Iterator<Item = &mut Container> {
    spec.containers
        .iter_mut()
        .chain(spec.init_containers.iter_mut().flatten())
}

/// The legacy ServiceAccount token volume, on the provider: with API server support what a
/// current cluster's `kube-api-access` volume holds (the token from the pod's token Secret, the
/// origin's CA from the reflected root CA ConfigMap, the namespace), else an empty folder, so
/// the containers' mounts stay valid and no token of either cluster is there.
fn legacy_token_volume(volume: Volume, token_secret: Option<&str>, ctx: &Context<'_>) -> Volume {
    let Some(secret) = token_secret else {
        return Volume {
            name: volume.name,
            empty_dir: Some(Default::default()),
            ..Default::default()
        };
    };
    let item = |key: String, path: &str| {
        Some(vec![KeyToPath {
            key,
            path: path.into(),
            mode: None,
        }])
    };
    let sources = vec![
        VolumeProjection {
            secret: Some(SecretProjection {
                name: secret.to_string(),
                items: item(
                    token_key(&volume.name, LEGACY_TOKEN_PATH),
                    LEGACY_TOKEN_PATH,
                ),
                optional: None,
            }),
            ..Default::default()
        },
        VolumeProjection {
            config_map: Some(ConfigMapProjection {
                name: remote_root_ca_name(&ctx.options.local_cluster_id),
                items: item("ca.crt".into(), "ca.crt"),
                optional: None,
            }),
            ..Default::default()
        },
        VolumeProjection {
            downward_api: Some(DownwardAPIProjection {
                items: Some(vec![DownwardAPIVolumeFile {
                    path: "namespace".into(),
                    field_ref: Some(ObjectFieldSelector {
                        api_version: Some("v1".into()),
                        field_path: "metadata.namespace".into(),
                    }),
                    ..Default::default()
                }]),
            }),
            ..Default::default()
        },
    ];
    Volume {
        name: volume.name,
        projected: Some(ProjectedVolumeSource {
            default_mode: volume.secret.and_then(|s| s.default_mode),
            sources: Some(sources),
        }),
        ..Default::default()
    }
}

/// Volumes as the provider can satisfy them: the origin's root CA ConfigMap under its reflected
/// name, and projected service-account tokens read from the pod's token Secret
/// (`token_secret`), or removed when the pod gets no origin tokens.
fn remote_volumes(
    volumes: &[Volume],
    service_account: &str,
    token_secret: Option<&str>,
    ctx: &Context<'_>,
) -> Vec<Volume> {
    volumes
        .iter()
        .cloned()
        .map(|mut v| {
            let volume_name = v.name.clone();
            if is_legacy_token_volume(&v, service_account) {
                return legacy_token_volume(v, token_secret, ctx);
            }
            if let Some(projected) = v.projected.as_mut() {
                if let Some(sources) = projected.sources.as_mut() {
                    match token_secret {
                        None => sources.retain(|s| s.service_account_token.is_none()),
                        Some(secret) => {
                            for s in sources.iter_mut() {
                                if let Some(t) = s.service_account_token.take() {
                                    s.secret = Some(SecretProjection {
                                        name: secret.to_string(),
                                        items: Some(vec![KeyToPath {
                                            key: token_key(&volume_name, &t.path),
                                            path: t.path,
                                            mode: None,
                                        }]),
                                        optional: None,
                                    });
                                }
                            }
                        }
                    }
                    for s in sources.iter_mut() {
                        if let Some(cm) = s.config_map.as_mut() {
                            if cm.name == ROOT_CA_NAME {
                                cm.name = remote_root_ca_name(&ctx.options.local_cluster_id);
                            }
                        }
                    }
                }
            }
            if let Some(cm) = v.config_map.as_mut() {
                if cm.name == ROOT_CA_NAME {
                    cm.name = remote_root_ca_name(&ctx.options.local_cluster_id);
                }
            }
            v
        })
        .collect()
}

/// Points a container's in-cluster clients at the origin API server: the service account name
/// it reads from the downward API becomes a literal (the provider pod has none), and, when the
/// operator configured the origin API server's address, the variables client libraries read
/// are appended (after the container's own, so they win).
fn api_server_env(container: &mut Container, service_account: &str, ctx: &Context<'_>) {
    let address = ctx.options.api_server.address();
    let env = container.env.get_or_insert_with(Vec::new);
    for var in env.iter_mut() {
        let reads_sa = var
            .value_from
            .as_ref()
            .and_then(|f| f.field_ref.as_ref())
            .is_some_and(|f| f.field_path == "spec.serviceAccountName");
        if reads_sa {
            var.value_from = None;
            var.value = Some(service_account.to_string());
        }
    }
    if let Some((host, port)) = address {
        let host_port = if host.contains(':') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        };
        let url = format!("tcp://{host_port}");
        let vars = [
            ("KUBERNETES_SERVICE_HOST".to_string(), host.clone()),
            ("KUBERNETES_SERVICE_PORT".to_string(), port.to_string()),
            ("KUBERNETES_PORT".to_string(), url.clone()),
            (format!("KUBERNETES_PORT_{port}_TCP"), url),
            (format!("KUBERNETES_PORT_{port}_TCP_PROTO"), "tcp".into()),
            (format!("KUBERNETES_PORT_{port}_TCP_ADDR"), host),
            (format!("KUBERNETES_PORT_{port}_TCP_PORT"), port.to_string()),
        ];
        env.extend(vars.into_iter().map(|(name, value)| EnvVar {
            name,
            value: Some(value),
            value_from: None,
        }));
    }
    if env.is_empty() {
        container.env = None;
    }
}
