//! `local-agent preview`: what would be sent for given objects, offline.
//!
//! Runs the agent's own forge on objects read from files or stdin (YAML or JSON, one or many,
//! `List`s included), or on a live namespace, and prints a JSON array with one entry per
//! object: what would be sent, or why it would not be reflected. With `--existing`, objects
//! already on the provider are taken into account (conflict, unchanged).

use std::io::Read;
use std::path::PathBuf;

use anyhow::{bail, Context};
use k8s_openapi::api::core::v1::Service;
use refract_core::forge::{self, Decision};
use refract_core::hash::{bytes_hash, object_hash};
use refract_core::json;
use refract_core::keys::{
    DESIRED_HASH_ANNOTATION, DESTINATION_LABEL, ORIGIN_HASH_ANNOTATION, ORIGIN_LABEL,
    SERVICE_NAME_LABEL,
};
use refract_core::offloading::{self, MappingStrategy};
use refract_core::options::Kind;
use refract_shared::tls::ClusterId;
use serde_json::{json, Value};

use crate::config::ReflectionFlags;

/// Prints exactly what the local agent would send for the given objects, without a cluster.
#[derive(Debug, clap::Parser)]
pub struct PreviewArgs {
    /// Files with objects (YAML or JSON, several documents or a List); `-` reads stdin.
    #[arg(short = 'f', long = "filename", value_name = "FILE")]
    pub files: Vec<PathBuf>,

    /// Preview a live namespace of the cluster in this kubeconfig instead of files.
    #[arg(long, requires = "namespace")]
    pub kubeconfig: Option<PathBuf>,

    /// The namespace to preview with --kubeconfig.
    #[arg(long)]
    pub namespace: Option<String>,

    /// The origin cluster id.
    #[arg(long)]
    pub cluster_id: ClusterId,

    /// The provider cluster id.
    #[arg(long)]
    pub remote_cluster_id: ClusterId,

    /// The twin namespace; by default derived with --namespace-mapping-strategy.
    #[arg(long)]
    pub remote_namespace: Option<String>,

    /// How the twin namespace is named when --remote-namespace is not given.
    #[arg(long, value_enum, default_value = "default-name")]
    pub namespace_mapping_strategy: Strategy,

    /// Objects already on the provider (YAML or JSON), to show conflicts and unchanged objects.
    #[arg(long, value_name = "FILE")]
    pub existing: Vec<PathBuf>,

    /// Origin nodes that are this peering's virtual nodes (their endpoints are not reflected).
    #[arg(long = "provider-node", value_name = "NODE")]
    pub provider_nodes: Vec<String>,

    /// Pods are bound to this virtual node (default `refract-<remote cluster id>`).
    #[arg(long)]
    pub node_name: Option<String>,

    /// Status mode: the provider's pod (YAML or JSON). The input (-f) is the origin pod; the
    /// output is the status the origin pod would get.
    #[arg(long, value_name = "FILE")]
    pub remote_pod: Option<PathBuf>,

    /// Status mode: how many times the provider re-created the pod.
    #[arg(long, default_value_t = 0)]
    pub recreations: u32,

    /// Status mode: provider pod IPs → origin-visible IPs, FROM_CIDR=TO_CIDR (repeatable).
    #[arg(long = "remote-pod-remap", value_name = "FROM=TO")]
    pub remote_pod_remap: Vec<refract_core::remap::Rule>,

    /// Status mode: further provider pod ranges, used as they are (repeatable).
    #[arg(long = "remote-pod-cidr", value_name = "CIDR")]
    pub remote_pod_cidr: Vec<ipnet::IpNet>,

    /// Status mode: the host IP shown (the local agent's pod IP).
    #[arg(long, default_value = "127.0.0.1")]
    pub node_ip: String,

    /// Reflection settings, as the agent takes them.
    #[command(flatten)]
    pub reflection: ReflectionFlags,
}

/// Namespace mapping strategies as flag values.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum Strategy {
    /// `<namespace>-<cluster id>`.
    DefaultName,
    /// The same name.
    EnforceSameName,
}

/// Runs the preview, printing JSON to stdout.
pub async fn run(args: PreviewArgs) -> anyhow::Result<()> {
    let mut options = args
        .reflection
        .options(args.cluster_id.as_str(), args.remote_cluster_id.as_str())?;
    options.virtual_node = args.node_name.clone().unwrap_or_default();
    let objects = match &args.kubeconfig {
        Some(kc) => {
            let Some(namespace) = args.namespace.as_deref() else {
                anyhow::bail!("--kubeconfig needs --namespace: the namespace to preview");
            };
            live_objects(kc, namespace, &options).await?
        }
        None => {
            if args.files.is_empty() {
                bail!("give objects with -f FILE (or -f - for stdin), or --kubeconfig and --namespace");
            }
            let mut all = Vec::new();
            for f in &args.files {
                all.extend(read_objects(f)?);
            }
            all
        }
    };
    let mut existing = Vec::new();
    for f in &args.existing {
        existing.extend(read_objects(f)?);
    }
    let services: Vec<Service> = objects
        .iter()
        .filter(|o| o["kind"] == "Service")
        .filter_map(|o| serde_json::from_value(o.clone()).ok())
        .collect();
    let nodes = forge::NodeLists {
        provider: args.provider_nodes.iter().cloned().collect(),
        known: None,
    };
    let strategy = match args.namespace_mapping_strategy {
        Strategy::DefaultName => MappingStrategy::DefaultName,
        Strategy::EnforceSameName => MappingStrategy::EnforceSameName,
    };

    let mut out = Vec::new();
    for object in &objects {
        let kind_name = object["kind"].as_str().unwrap_or_default();
        let ns = object["metadata"]["namespace"]
            .as_str()
            .unwrap_or("default");
        let name = object["metadata"]["name"].as_str().unwrap_or_default();
        let source = format!("{kind_name} {ns}/{name}");
        let remote_ns = match &args.remote_namespace {
            Some(n) => n.clone(),
            None => offloading::remote_namespace_name(strategy, None, ns, args.cluster_id.as_str())
                .map_err(anyhow::Error::msg)?,
        };
        if kind_name == "Pod" {
            out.push(preview_pod(object, &args, &options, &remote_ns, source)?);
            continue;
        }
        let api_version = object["apiVersion"].as_str().unwrap_or_default();
        let reflected = |k: &Kind| options.kind(*k).workers > 0 || Kind::ALL.contains(k);
        let Some(kind) = Kind::lookup(api_version, kind_name)
            .or_else(|| Kind::from_kind(kind_name))
            .filter(reflected)
        else {
            out.push(json!({"source": source, "decision": "skip", "reason": format!("kind {kind_name:?} is not reflected")}));
            continue;
        };
        let service_name = object["metadata"]["labels"][SERVICE_NAME_LABEL].as_str();
        let service = services.iter().find(|s| {
            s.metadata.namespace.as_deref() == Some(ns)
                && s.metadata.name.as_deref() == service_name
        });
        let ctx = forge::Context {
            options: &options,
            remote_namespace: &remote_ns,
            service,
            nodes: &nodes,
        };
        let mut entry = match forge::forge(kind, object, &ctx) {
            Ok(Decision::Reflect(desired)) => against_existing(
                &desired,
                &existing,
                &options.local_cluster_id,
                &options.remote_cluster_id,
            ),
            Ok(decision) => serde_json::to_value(decision)?,
            Err(e) => json!({"decision": "error", "reason": e.to_string()}),
        };
        if let Some(fields) = entry.as_object_mut() {
            fields.insert("source".into(), source.into());
        }
        out.push(entry);
    }
    refract_shared::stdout::write_line(&serde_json::to_string_pretty(&out)?)?;
    Ok(())
}

/// A pod: the ShadowPod that would be sent, or in status mode the origin status.
fn preview_pod(
    object: &Value,
    args: &PreviewArgs,
    options: &refract_core::options::ReflectionOptions,
    remote_ns: &str,
    source: String,
) -> anyhow::Result<Value> {
    let pod: k8s_openapi::api::core::v1::Pod = match serde_json::from_value(object.clone()) {
        Ok(p) => p,
        Err(e) => {
            return Ok(
                json!({"source": source, "decision": "error", "reason": format!("malformed Pod: {e}")}),
            )
        }
    };
    if let Some(remote_file) = &args.remote_pod {
        let remote = read_objects(remote_file)?
            .into_iter()
            .next()
            .with_context(|| format!("{} holds no object", remote_file.display()))?;
        let remote_status: k8s_openapi::api::core::v1::PodStatus =
            serde_json::from_value(remote["status"].clone()).with_context(|| {
                format!("{}: status is not a pod status", remote_file.display())
            })?;
        let addresses = refract_core::inbound::address::PodAddresses {
            remapping: refract_core::remap::Remapping(args.remote_pod_remap.clone()),
            allowed: args.remote_pod_cidr.clone(),
        };
        let out = refract_core::pod_status::origin_status(
            &remote_status,
            &refract_core::pod_status::StatusContext {
                addresses: &addresses,
                host_ip: &args.node_ip,
                recreations: args.recreations,
                spec: pod.spec.as_ref(),
            },
        );
        return Ok(
            json!({"source": source, "decision": "status", "status": out.status, "refused": out.refused}),
        );
    }
    let node = options.virtual_node_name();
    let ctx = forge::Context {
        options,
        remote_namespace: remote_ns,
        service: None,
        nodes: &forge::NO_NODES,
    };
    Ok(match forge::pod::shadow_pod(&pod, &node, &ctx) {
        Ok(shadow) => {
            let mut entry = json!({"source": source, "decision": "reflect", "kind": "shadowpod", "namespace": remote_ns, "name": pod.metadata.name, "object": shadow});
            // The bound tokens the agent would request and send beside the ShadowPod.
            if forge::token::origin_tokens(&pod, &ctx) {
                let tokens: Vec<Value> = forge::token::token_sources(&pod)
                    .into_iter()
                    .map(|t| json!({"key": t.key, "audience": t.audience, "expirationSeconds": t.expiration_seconds}))
                    .collect();
                if !tokens.is_empty() {
                    entry["tokens"] = json!({
                        "secret": forge::token::token_secret_name(pod.metadata.name.as_deref().unwrap_or_default()),
                        "serviceAccount": forge::token::service_account_of(&pod),
                        "requests": tokens,
                    });
                }
            }
            entry
        }
        Err(e) => json!({"source": source, "decision": "error", "reason": e.to_string()}),
    })
}

/// The hash the remote agent would store for `object`: it records the hash of the bytes sent
/// (the reflector sends the object serialized as it is here) before hashing the whole.
fn applied_hash(object: &Value) -> String {
    let mut applied = object.clone();
    let sent = json::to_vec(object);
    applied["metadata"]["annotations"][ORIGIN_HASH_ANNOTATION] = bytes_hash(&sent).into();
    object_hash(&applied)
}

/// What the remote agent would answer, given what the provider already holds.
fn against_existing(
    desired: &forge::Desired,
    existing: &[Value],
    local: &str,
    remote: &str,
) -> Value {
    let mut value = json::to_value(desired);
    value["decision"] = "reflect".into();
    let found = existing.iter().find(|e| {
        e["kind"] == desired.object["kind"]
            && e["metadata"]["name"] == desired.name.as_str()
            && e["metadata"]["namespace"]
                .as_str()
                .unwrap_or(&desired.namespace)
                == desired.namespace
    });
    if let Some(e) = found {
        let labels = &e["metadata"]["labels"];
        if labels[ORIGIN_LABEL] != local || labels[DESTINATION_LABEL] != remote {
            value["decision"] = "conflict".into();
            value["reason"] = "an object of this name exists on the provider without Refract's origin/destination labels; it would be left untouched and a Warning event recorded".into();
        } else if e["metadata"]["annotations"][DESIRED_HASH_ANNOTATION]
            == applied_hash(&desired.object).as_str()
        {
            value["decision"] = "unchanged".into();
            value["reason"] =
                "the provider already holds this desired state; nothing would be written".into();
        }
    }
    value
}

/// Reads every object in a YAML or JSON file (or stdin), flattening Lists.
fn read_objects(path: &std::path::Path) -> anyhow::Result<Vec<Value>> {
    let text = if path.as_os_str() == "-" {
        let mut s = String::new();
        std::io::stdin().read_to_string(&mut s)?;
        s
    } else {
        std::fs::read_to_string(path)
            .with_context(|| format!("failed to read {}", path.display()))?
    };
    let mut objects = Vec::new();
    for (i, doc) in serde_yaml_ng::Deserializer::from_str(&text).enumerate() {
        let value: Value = serde::Deserialize::deserialize(doc).with_context(|| {
            format!(
                "{}: document {} is not valid YAML or JSON",
                path.display(),
                i + 1
            )
        })?;
        match value {
            Value::Null => {}
            Value::Object(ref m)
                if m.get("kind")
                    .and_then(Value::as_str)
                    .is_some_and(|k| k.ends_with("List")) =>
            {
                objects.extend(
                    m.get("items")
                        .and_then(Value::as_array)
                        .cloned()
                        .unwrap_or_default(),
                )
            }
            Value::Object(_) => objects.push(value),
            _ => bail!(
                "{}: document {} is not a Kubernetes object",
                path.display(),
                i + 1
            ),
        }
    }
    Ok(objects)
}

async fn live_objects(
    kubeconfig: &std::path::Path,
    namespace: &str,
    options: &refract_core::options::ReflectionOptions,
) -> anyhow::Result<Vec<Value>> {
    use k8s_openapi::api::{core::v1, discovery, networking};
    use kube::api::{Api, ListParams};
    let client = refract_shared::kubeconfig::client(Some(kubeconfig)).await?;
    let mut out = Vec::new();
    macro_rules! list {
        ($t:ty) => {{
            let api: Api<$t> = Api::namespaced(client.clone(), namespace);
            for item in api
                .list(&ListParams::default())
                .await
                .with_context(|| format!("failed to list in {namespace}"))?
            {
                out.push(serde_json::to_value(item)?);
            }
        }};
    }
    let custom = options.custom_kinds.iter().map(|c| Kind::Custom(c.kind));
    for kind in Kind::ALL.into_iter().chain(custom) {
        if options.kind(kind).workers == 0 {
            continue;
        }
        match kind {
            Kind::ConfigMap => list!(v1::ConfigMap),
            Kind::Secret => list!(v1::Secret),
            Kind::Service => list!(v1::Service),
            Kind::Ingress => list!(networking::v1::Ingress),
            Kind::EndpointSlice => list!(discovery::v1::EndpointSlice),
            Kind::PersistentVolumeClaim => list!(v1::PersistentVolumeClaim),
            Kind::Custom(custom) => {
                let resource = refract_shared::custom_kind::api_resource(custom);
                let api: Api<kube::api::DynamicObject> =
                    Api::namespaced_with(client.clone(), namespace, &resource);
                let items = api.list(&ListParams::default()).await.with_context(|| {
                    format!("failed to list {} in {namespace}", custom.resource_name())
                })?;
                for mut item in items {
                    // A list's items may come without their type; the preview reads it.
                    item.types.get_or_insert_with(|| kube::api::TypeMeta {
                        api_version: resource.api_version.clone(),
                        kind: resource.kind.clone(),
                    });
                    out.push(serde_json::to_value(item)?);
                }
            }
        }
    }
    Ok(out)
}
