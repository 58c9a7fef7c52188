//! What one peering is made of, as objects: the manifests of `deploy/` shaped for this origin,
//! this provider and this way of reaching them. Pure: `peer` applies what this returns.

#![allow(
    clippy::expect_used,
    clippy::unwrap_used,
    reason = "the objects shaped here are deploy/'s manifests, compiled into this binary; \
              every path reached into is there, as this module's tests check for both networks"
)]

use refract_core::keys::PEERING_LABEL;
use refract_shared::tls::ClusterId;
use serde_json::{json, Value};

use crate::manifests::{self, Agent, NAMESPACE};

/// The provider-side label naming the tenant a record belongs to (as on its namespaces).
pub const TENANT_LABEL: &str = refract_core::keys::TENANT_NAMESPACE_LABEL;
/// The provider's peering CA: signs the remote agent's serving certificate and every tenant's
/// client certificate. Its key never leaves the provider (kept here in cert-manager's CA issuer
/// layout, `tls.crt` and `tls.key`).
pub const PROVIDER_CA_SECRET: &str = "refract-peering-ca";
/// The origin's own CA for the certificates its API server checks (the webhook's).
pub const ORIGIN_CA_SECRET: &str = "refract-origin-ca";
/// The remote agent's serving certificate, as `deploy/remote-agent` mounts it.
pub const REMOTE_TLS_SECRET: &str = "refract-remote-agent-tls";
/// The webhook's serving certificate, as `deploy/local-agent` mounts it (one per origin).
pub const WEBHOOK_TLS_SECRET: &str = "refract-local-agent-webhook-tls";
/// The deploy/ name of the local agent, which refractctl suffixes with the provider.
const LOCAL_BASE_NAME: &str = "refract-local-agent";
/// The remote agent's Deployment and Service.
pub const REMOTE_NAME: &str = "refract-remote-agent";
/// The webhook configuration's name (one per origin).
pub const WEBHOOK_NAME: &str = "refract-local-agent";

/// The local agent of the peering with `provider`.
pub fn local_agent_name(provider: &ClusterId) -> String {
    format!("{LOCAL_BASE_NAME}-{provider}")
}

/// The Secret with the tenant's client certificate and the provider's CA.
pub fn local_tls_secret(provider: &ClusterId) -> String {
    format!("{LOCAL_BASE_NAME}-{provider}-tls")
}

/// The Secret with the tenant's key and certificate request while the provider signs it.
pub fn local_request_secret(provider: &ClusterId) -> String {
    format!("{LOCAL_BASE_NAME}-{provider}-request")
}

/// The Secret with the virtual node's kubelet serving certificate.
pub fn kubelet_tls_secret(provider: &ClusterId) -> String {
    format!("{LOCAL_BASE_NAME}-{provider}-kubelet-tls")
}

/// The provider identity a remote agent with `args` serves as (its `--cluster-id`).
pub fn serving_identity(args: &[String]) -> Option<&str> {
    args.iter().find_map(|a| a.strip_prefix("--cluster-id="))
}

/// The provider's record of one tenant: the certificate it was given, for status and rotation.
pub fn tenant_record(origin: &ClusterId) -> String {
    format!("refract-tenant-{origin}")
}

/// The virtual node the local agent registers (its default `--node-name`).
pub fn virtual_node(provider: &ClusterId) -> String {
    format!("refract-{provider}")
}

/// A `host:port`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPort {
    /// DNS name or IP address.
    pub host: String,
    /// TCP port.
    pub port: u16,
}

impl std::fmt::Display for HostPort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

impl std::str::FromStr for HostPort {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let s = s
            .trim_start_matches("https://")
            .trim_start_matches("http://");
        let (host, port) = s
            .rsplit_once(':')
            .ok_or_else(|| format!("{s:?} must be HOST:PORT"))?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if host.is_empty() {
            return Err(format!("{s:?} has no host"));
        }
        let port = port
            .trim_end_matches('/')
            .parse()
            .map_err(|_| format!("{s:?}: the port must be a number from 1 to 65535"))?;
        Ok(Self {
            host: host.to_string(),
            port,
        })
    }
}

/// Ports of a single-host peering, where both agents share the machine's network with each
/// other and with the API servers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPorts {
    /// The remote agent's gRPC port.
    pub grpc: u16,
    /// The remote agent's admin port (probes, metrics).
    pub remote_admin: u16,
    /// The local agent's webhook port.
    pub webhook: u16,
    /// The local agent's admin port.
    pub local_admin: u16,
    /// The virtual node's kubelet API port.
    pub kubelet: u16,
}

/// How the agents are reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Network {
    /// Pods on the pod network, as `deploy/` runs them: the origin dials the provider's
    /// exposed address, the API server calls the webhook through its Service.
    Pods,
    /// Every part on one machine without kube-proxy (the demo, the tests): host networking,
    /// everything on 127.0.0.1, each API server at its kubeconfig's address.
    SingleHost {
        /// The chosen ports.
        ports: HostPorts,
        /// The API server of the cluster this half goes to, as its kubeconfig names it.
        api: HostPort,
    },
}

/// The origin's half of one peering: what `join complete` (and `peer`) apply in the origin.
#[derive(Debug, Clone)]
pub struct OriginPlan {
    /// The origin's cluster id (the tenant).
    pub origin: ClusterId,
    /// The provider's cluster id.
    pub provider: ClusterId,
    /// Where the local agent dials the remote agent.
    pub endpoint: HostPort,
    /// Where offloaded pods reach the origin's API server.
    pub home_api_server: HostPort,
    /// The local agent's image.
    pub image: String,
    /// How the agents are reached.
    pub network: Network,
    /// More local agent flags, appended as given.
    pub local_args: Vec<String>,
}

/// The provider's half: what `install provider` (and `peer`) apply in the provider, the same
/// for every tenant.
#[derive(Debug, Clone)]
pub struct ProviderPlan {
    /// The provider's cluster id.
    pub provider: ClusterId,
    /// Where origins reach the remote agent: its serving certificate names this host.
    pub endpoint: HostPort,
    /// The remote agent's image.
    pub image: String,
    /// How the agents are reached.
    pub network: Network,
    /// More remote agent flags, appended as given (`install provider --remote-agent-arg`).
    pub remote_args: Vec<String>,
}

impl OriginPlan {
    /// The origin's objects: deploy/local-agent with this peering's local agent, Secrets
    /// names, and the webhook pointed at `webhook_ca_pem`.
    pub fn objects(&self, webhook_ca_pem: &str) -> Vec<Value> {
        let mut objects = manifests::render(Agent::Local, &self.image);
        let name = local_agent_name(&self.provider);
        let deployment = manifests::find_mut(&mut objects, "Deployment", LOCAL_BASE_NAME)
            .expect("deploy/local-agent has a Deployment");
        deployment["metadata"]["name"] = Value::from(name.clone());
        for path in [
            "/metadata/labels",
            "/spec/selector/matchLabels",
            "/spec/template/metadata/labels",
        ] {
            deployment.pointer_mut(path).expect("labels")[PEERING_LABEL] =
                Value::from(self.provider.as_str());
        }
        // This peering's replicas only: a drain may take one of each peering's at a time.
        let budget = manifests::find_mut(&mut objects, "PodDisruptionBudget", LOCAL_BASE_NAME)
            .expect("deploy/local-agent has a PodDisruptionBudget");
        budget["metadata"]["name"] = Value::from(local_agent_name(&self.provider));
        budget["spec"]["selector"]["matchLabels"][PEERING_LABEL] =
            Value::from(self.provider.as_str());
        let deployment =
            manifests::find_mut(&mut objects, "Deployment", &name).expect("renamed above");
        let secrets = [
            (
                LOCAL_BASE_NAME.to_string() + "-tls",
                local_tls_secret(&self.provider),
            ),
            (
                LOCAL_BASE_NAME.to_string() + "-kubelet-tls",
                kubelet_tls_secret(&self.provider),
            ),
        ];
        for volume in volumes(deployment) {
            for (from, to) in &secrets {
                if volume["secret"]["secretName"] == from.as_str() {
                    volume["secret"]["secretName"] = Value::from(to.as_str());
                }
            }
        }
        let mut args = vec![
            format!("--remote=https://{}", self.endpoint),
            format!("--cluster-id={}", self.origin),
            format!("--remote-cluster-id={}", self.provider),
            format!("--home-api-server-host={}", self.home_api_server.host),
            format!("--home-api-server-port={}", self.home_api_server.port),
        ];
        if let Network::SingleHost { ports, api } = &self.network {
            args.extend([
                format!("--webhook-listen=127.0.0.1:{}", ports.webhook),
                format!("--admin-listen=127.0.0.1:{}", ports.local_admin),
                format!("--kubelet-listen=127.0.0.1:{}", ports.kubelet),
                "--node-ip=127.0.0.1".to_string(),
            ]);
            single_host(deployment, api, ports.local_admin);
        }
        set_args(deployment, &args);
        add_operator_args(deployment, &self.local_args);
        relax_pod_security(&self.network, &mut objects);

        let webhook =
            manifests::find_mut(&mut objects, "MutatingWebhookConfiguration", WEBHOOK_NAME)
                .expect("deploy/local-agent has the webhook");
        use base64::Engine;
        let ca_bundle = base64::engine::general_purpose::STANDARD.encode(webhook_ca_pem);
        let entries = webhook["webhooks"]
            .as_array_mut()
            .expect("deploy/local-agent's webhook lists its webhooks");
        for entry in entries {
            let client_config = &mut entry["clientConfig"];
            client_config["caBundle"] = Value::from(ca_bundle.clone());
            if let Network::SingleHost { ports, .. } = &self.network {
                // Nothing routes a Service's ClusterIP without kube-proxy: the API server calls
                // the webhook where it listens, on the path the Service would have.
                let path = client_config["service"]["path"]
                    .as_str()
                    .unwrap_or("/")
                    .to_string();
                client_config["url"] =
                    Value::from(format!("https://127.0.0.1:{}{path}", ports.webhook));
                client_config.as_object_mut().unwrap().remove("service");
            }
        }
        objects
    }

    /// The names of the webhook's serving certificate (one per origin).
    pub fn webhook_names(&self) -> Vec<String> {
        let mut names = vec![format!("{WEBHOOK_NAME}.{NAMESPACE}.svc")];
        if matches!(self.network, Network::SingleHost { .. }) {
            names.push("127.0.0.1".into());
        }
        names
    }

    /// The names of the virtual node's kubelet serving certificate. The API server checks it
    /// only when started with --kubelet-certificate-authority; a cluster that does must give
    /// the agent a certificate for its pod IP instead.
    pub fn kubelet_names(&self) -> Vec<String> {
        let mut names = vec![virtual_node(&self.provider)];
        if matches!(self.network, Network::SingleHost { .. }) {
            names.push("127.0.0.1".into());
        }
        names
    }
}

impl ProviderPlan {
    /// The provider's objects: deploy/remote-agent for this provider.
    pub fn objects(&self) -> Vec<Value> {
        let mut objects = manifests::render(Agent::Remote, &self.image);
        let deployment = manifests::find_mut(&mut objects, "Deployment", REMOTE_NAME)
            .expect("deploy/remote-agent has a Deployment");
        let mut args = vec![format!("--cluster-id={}", self.provider)];
        if let Network::SingleHost { ports, api } = &self.network {
            args.extend([
                format!("--listen=127.0.0.1:{}", ports.grpc),
                format!("--admin-listen=127.0.0.1:{}", ports.remote_admin),
            ]);
            single_host(deployment, api, ports.remote_admin);
        }
        set_args(deployment, &args);
        add_operator_args(deployment, &self.remote_args);
        relax_pod_security(&self.network, &mut objects);
        objects
    }

    /// The identity a running remote agent with `running_args` serves as, when it is not
    /// this plan's provider.
    pub fn other_identity_running(&self, running_args: &[String]) -> Option<String> {
        serving_identity(running_args)
            .filter(|id| *id != self.provider.as_str())
            .map(str::to_string)
    }

    /// Keeps in the remote agent's Deployment of `objects` the flags of `running_args` (the
    /// running agent's) that it does not set itself: an admin added them by hand (`--policy`,
    /// `--tenant-deny-list`), and `install provider` owns only its own. Returns those kept.
    pub fn keep_hand_added_flags(objects: &mut [Value], running_args: &[String]) -> Vec<String> {
        let Some(deployment) = manifests::find_mut(objects, "Deployment", REMOTE_NAME) else {
            return Vec::new();
        };
        let flag = |a: &str| a.split('=').next().unwrap_or(a).to_string();
        let Some(list) = container(deployment)["args"].as_array_mut() else {
            return Vec::new();
        };
        let ours: Vec<String> = list.iter().filter_map(|a| a.as_str()).map(flag).collect();
        let kept: Vec<String> = running_args
            .iter()
            .filter(|a| !ours.contains(&flag(a)))
            .cloned()
            .collect();
        list.extend(kept.iter().map(|a| Value::from(a.as_str())));
        kept
    }

    /// The names the remote agent's serving certificate must carry: its Service's, and the
    /// endpoint's host the origin dials.
    pub fn server_names(&self) -> Vec<String> {
        let mut names = vec![
            format!("{REMOTE_NAME}.{NAMESPACE}.svc"),
            format!("{REMOTE_NAME}.{NAMESPACE}.svc.cluster.local"),
        ];
        if !names.contains(&self.endpoint.host) {
            names.push(self.endpoint.host.clone());
        }
        names
    }
}

/// Host networking is not allowed at the restricted Pod Security level deploy/ enforces
/// in refract-system: a single-host peering runs it at the privileged level.
fn relax_pod_security(network: &Network, objects: &mut [Value]) {
    if matches!(network, Network::SingleHost { .. }) {
        if let Some(ns) = manifests::find_mut(objects, "Namespace", NAMESPACE.as_str()) {
            ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] =
                Value::from("privileged");
        }
    }
}

fn container(deployment: &mut Value) -> &mut Value {
    deployment
        .pointer_mut("/spec/template/spec/containers/0")
        .expect("the agent's container")
}

fn volumes(deployment: &mut Value) -> impl Iterator<Item = &mut Value> {
    deployment
        .pointer_mut("/spec/template/spec/volumes")
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
}

/// Replaces each `--flag=` of `args` in the container's arguments, or appends it.
fn set_args(deployment: &mut Value, args: &[String]) {
    let current = &mut container(deployment)["args"];
    let mut list: Vec<String> = current
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|a| a.as_str().map(str::to_string))
        .collect();
    for arg in args {
        let flag = arg.split('=').next().unwrap_or(arg);
        match list.iter_mut().find(|a| a.split('=').next() == Some(flag)) {
            Some(existing) => existing.clone_from(arg),
            None => list.push(arg.clone()),
        }
    }
    *current = json!(list);
}

/// The operator's own flags: one the manifest or the plan already sets replaces it (the agent
/// refuses a single-valued flag given twice); the others are appended as given, so a
/// repeatable flag (`--remote-pod-cidr`) may come several times.
fn add_operator_args(deployment: &mut Value, args: &[String]) {
    let flag = |a: &str| a.split('=').next().unwrap_or(a).to_string();
    let Some(list) = container(deployment)["args"].as_array_mut() else {
        return;
    };
    let preset: Vec<String> = list.iter().filter_map(|a| a.as_str()).map(flag).collect();
    for arg in args {
        let name = flag(arg);
        match list
            .iter_mut()
            .find(|a| preset.contains(&name) && a.as_str().map(flag) == Some(name.clone()))
        {
            Some(existing) => *existing = Value::from(arg.as_str()),
            None => list.push(Value::from(arg.as_str())),
        }
    }
}

/// Host networking, the API server at the kubeconfig's address, probes on 127.0.0.1.
fn single_host(deployment: &mut Value, api: &HostPort, admin_port: u16) {
    let spec = deployment
        .pointer_mut("/spec/template/spec")
        .expect("pod spec");
    spec["hostNetwork"] = Value::from(true);
    spec["dnsPolicy"] = Value::from("ClusterFirstWithHostNet");
    // A second replica on the one host would want the same ports: one, replaced, not surged.
    deployment["spec"]["replicas"] = Value::from(1);
    deployment["spec"]["strategy"] =
        json!({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}});
    let c = container(deployment);
    let env = c["env"].as_array().cloned().unwrap_or_default();
    let mut env: Vec<Value> = env
        .into_iter()
        .filter(|e| {
            !e["name"]
                .as_str()
                .is_some_and(|n| n.starts_with("KUBERNETES_SERVICE_"))
        })
        .collect();
    env.push(json!({"name": "KUBERNETES_SERVICE_HOST", "value": api.host}));
    env.push(json!({"name": "KUBERNETES_SERVICE_PORT", "value": api.port.to_string()}));
    c["env"] = json!(env);
    for (probe, path) in [("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")] {
        c[probe] = json!({"httpGet": {"host": "127.0.0.1", "port": admin_port, "path": path}, "periodSeconds": 2});
    }
    // Container ports of a host-network pod become host ports the scheduler must find free.
    c.as_object_mut().unwrap().remove("ports");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn origin_plan(network: Network) -> OriginPlan {
        OriginPlan {
            origin: ClusterId::parse("origin").unwrap(),
            provider: ClusterId::parse("provider").unwrap(),
            endpoint: "agent.provider.example:6443".parse().unwrap(),
            home_api_server: "api.origin.example:6443".parse().unwrap(),
            image: "l:1".into(),
            network,
            local_args: vec![
                "--remote-pod-cidr=10.0.0.0/16".into(),
                "--remote-pod-cidr=10.1.0.0/16".into(),
                "--log-format=plain".into(),
            ],
        }
    }

    fn provider_plan(network: Network) -> ProviderPlan {
        ProviderPlan {
            provider: ClusterId::parse("provider").unwrap(),
            endpoint: "agent.provider.example:6443".parse().unwrap(),
            image: "r:1".into(),
            network,
            remote_args: vec!["--max-orphan-share=30".into()],
        }
    }

    #[test]
    fn install_provider_keeps_the_flags_an_admin_added_and_owns_its_own() {
        let mut objects = provider_plan(Network::Pods).objects();
        let running = vec![
            "--cluster-id=old-name".to_string(),
            "--policy=/etc/refract/policy.yaml".to_string(),
            "--tenant-deny-list=serial:01".to_string(),
            "--tenant-deny-list=serial:02".to_string(),
            "--max-orphan-share=20".to_string(),
        ];
        let plan = provider_plan(Network::Pods);
        assert_eq!(
            plan.other_identity_running(&running).as_deref(),
            Some("old-name")
        );
        assert_eq!(
            plan.other_identity_running(&["--cluster-id=provider".to_string()]),
            None
        );
        let kept = ProviderPlan::keep_hand_added_flags(&mut objects, &running);
        assert_eq!(kept, running[1..4]);
        let a = args(&objects, REMOTE_NAME);
        assert!(a.contains(&"--cluster-id=provider".to_string()), "{a:?}");
        assert!(!a.contains(&"--cluster-id=old-name".to_string()));
        assert!(a.contains(&"--max-orphan-share=30".to_string()));
        assert!(!a.contains(&"--max-orphan-share=20".to_string()));
        assert_eq!(a[a.len() - 3..], running[1..4]);
    }

    fn args(objects: &[Value], kind_name: &str) -> Vec<String> {
        let d = objects
            .iter()
            .find(|o| o["kind"] == "Deployment" && o["metadata"]["name"] == kind_name)
            .unwrap();
        serde_json::from_value(d["spec"]["template"]["spec"]["containers"][0]["args"].clone())
            .unwrap()
    }

    #[test]
    fn the_local_agent_is_named_for_its_provider_and_keeps_deploys_defaults() {
        let objects = origin_plan(Network::Pods).objects("CA");
        let a = args(&objects, "refract-local-agent-provider");
        assert!(a.contains(&"--remote=https://agent.provider.example:6443".to_string()));
        assert!(a.contains(&"--remote-cluster-id=provider".to_string()));
        assert!(a.contains(&"--home-api-server-host=api.origin.example".to_string()));
        assert!(
            a.contains(&"--webhook-cert=/etc/refract/webhook/tls.crt".to_string()),
            "{a:?}"
        );
        assert_eq!(
            a.iter().filter(|x| x.starts_with("--cluster-id=")).count(),
            1
        );
        // Repeatable operator flags are all kept, in order, at the end; one deploy/ sets is
        // replaced in place.
        assert_eq!(
            a[a.len() - 2..],
            [
                "--remote-pod-cidr=10.0.0.0/16",
                "--remote-pod-cidr=10.1.0.0/16"
            ]
        );
        assert_eq!(
            a.iter()
                .filter(|x| x.starts_with("--log-format"))
                .collect::<Vec<_>>(),
            ["--log-format=plain"]
        );
        let d = objects.iter().find(|o| o["kind"] == "Deployment").unwrap();
        assert_eq!(
            d["spec"]["selector"]["matchLabels"][PEERING_LABEL],
            "provider"
        );
        let budget = objects
            .iter()
            .find(|o| o["kind"] == "PodDisruptionBudget")
            .unwrap();
        assert_eq!(budget["metadata"]["name"], "refract-local-agent-provider");
        assert_eq!(
            budget["spec"]["selector"]["matchLabels"],
            serde_json::json!({"app.kubernetes.io/name": "refract-local-agent", PEERING_LABEL: "provider"})
        );
        let secrets: Vec<&str> = d["spec"]["template"]["spec"]["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|v| v["secret"]["secretName"].as_str())
            .collect();
        assert!(secrets.contains(&"refract-local-agent-provider-tls"));
        assert!(secrets.contains(&"refract-local-agent-provider-kubelet-tls"));
        assert!(secrets.contains(&WEBHOOK_TLS_SECRET));
        let webhook = objects
            .iter()
            .find(|o| o["kind"] == "MutatingWebhookConfiguration")
            .unwrap();
        for entry in webhook["webhooks"].as_array().unwrap() {
            assert_eq!(entry["clientConfig"]["caBundle"], "Q0E=");
        }
        assert_eq!(
            webhook["webhooks"][0]["clientConfig"]["service"]["name"],
            "refract-local-agent"
        );
    }

    #[test]
    fn a_single_host_peering_listens_on_loopback_with_host_networking() {
        let ports = HostPorts {
            grpc: 1001,
            remote_admin: 1002,
            webhook: 1003,
            local_admin: 1004,
            kubelet: 1005,
        };
        let remote = provider_plan(Network::SingleHost {
            ports: ports.clone(),
            api: "127.0.0.1:7002".parse().unwrap(),
        })
        .objects();
        let a = args(&remote, REMOTE_NAME);
        assert!(a.contains(&"--listen=127.0.0.1:1001".to_string()), "{a:?}");
        assert_eq!(a.iter().filter(|x| x.starts_with("--listen")).count(), 1);
        let d = remote.iter().find(|o| o["kind"] == "Deployment").unwrap();
        assert_eq!(d["spec"]["template"]["spec"]["hostNetwork"], true);
        let env = &d["spec"]["template"]["spec"]["containers"][0]["env"];
        assert!(env.as_array().unwrap().iter().any(|e| e["value"] == "7002"));
        let origin = origin_plan(Network::SingleHost {
            ports,
            api: "127.0.0.1:7001".parse().unwrap(),
        })
        .objects("CA");
        let webhook = origin
            .iter()
            .find(|o| o["kind"] == "MutatingWebhookConfiguration")
            .unwrap();
        assert_eq!(
            webhook["webhooks"][0]["clientConfig"]["url"],
            "https://127.0.0.1:1003/mutate-pods"
        );
        assert_eq!(
            webhook["webhooks"][1]["clientConfig"]["url"],
            "https://127.0.0.1:1003/gate-namespace"
        );
        assert!(webhook["webhooks"][0]["clientConfig"]
            .get("service")
            .is_none());
        let local = origin.iter().find(|o| o["kind"] == "Deployment").unwrap();
        let env = &local["spec"]["template"]["spec"]["containers"][0]["env"];
        assert!(env
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["name"] == "POD_IP"));
    }

    #[test]
    fn endpoints_parse_with_or_without_a_scheme() {
        let e: HostPort = "https://10.0.0.1:6443".parse().unwrap();
        assert_eq!(e.to_string(), "10.0.0.1:6443");
        let v6: HostPort = "[fd00::1]:443".parse().unwrap();
        assert_eq!(v6.host, "fd00::1");
        assert_eq!(v6.to_string(), "[fd00::1]:443");
        assert!("no-port".parse::<HostPort>().is_err());
        assert!(":1".parse::<HostPort>().is_err());
        assert!("h:99999".parse::<HostPort>().is_err());
    }
}
