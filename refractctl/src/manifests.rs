//! The agents' manifests, compiled in from `deploy/`: the files kustomize users apply are the
//! files `refractctl peer` applies, with the same three transformations their
//! `kustomization.yaml` makes (the `refract-system` namespace, or `-n`'s, the
//! `part-of`/`component` labels, the image). A test checks that the list below is the
//! kustomization's `resources:` list.

use std::sync::OnceLock;

use serde_json::Value;

/// deploy/'s namespace, where the agents run unless `-n` names another.
pub const DEFAULT_NAMESPACE: &str = "refract-system";

/// The namespace refractctl works in, in each cluster it reaches: where the agents run and keep
/// their Secrets. Chosen once per invocation (`-n`, [`AgentNamespace::choose`]) so that every
/// step of a command agrees on it; reads as `refract-system` until then.
pub static NAMESPACE: AgentNamespace = AgentNamespace;

static CHOSEN: OnceLock<String> = OnceLock::new();

/// See [`NAMESPACE`]: it reads as a `&str` (`&NAMESPACE`), formats and serializes as the name.
#[derive(Debug, Clone, Copy)]
pub struct AgentNamespace;

impl AgentNamespace {
    /// Sets the namespace for the rest of the process; a second call changes nothing.
    pub fn choose(name: &str) {
        let _ = CHOSEN.set(name.to_string());
    }

    /// The name.
    pub fn as_str(self) -> &'static str {
        CHOSEN.get().map_or(DEFAULT_NAMESPACE, String::as_str)
    }

    /// ` -n <name>` when it is not deploy/'s, for the next commands refractctl prints.
    pub fn flag(self) -> String {
        match self.as_str() {
            DEFAULT_NAMESPACE => String::new(),
            other => format!(" -n {other}"),
        }
    }
}

impl std::ops::Deref for AgentNamespace {
    type Target = str;
    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl std::fmt::Display for AgentNamespace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl serde::Serialize for AgentNamespace {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl From<AgentNamespace> for Value {
    fn from(namespace: AgentNamespace) -> Value {
        Value::from(namespace.as_str())
    }
}

/// Which agent a manifest set belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Agent {
    /// The origin's agent.
    Local,
    /// The provider's agent.
    Remote,
}

impl Agent {
    /// The component label value and the deploy/ folder name.
    pub fn component(self) -> &'static str {
        match self {
            Agent::Local => "local-agent",
            Agent::Remote => "remote-agent",
        }
    }

    /// The image name the manifests use before the image is set.
    fn image_placeholder(self) -> &'static str {
        match self {
            Agent::Local => "refract-local-agent",
            Agent::Remote => "refract-remote-agent",
        }
    }

    /// This version's image in `registry`, as `scripts/images.sh --push` tags it.
    pub fn image_in(self, registry: &str) -> String {
        format!(
            "{}/{}:{}",
            registry.trim_end_matches('/'),
            self.component(),
            env!("CARGO_PKG_VERSION")
        )
    }

    fn files(self) -> &'static [(&'static str, &'static str)] {
        match self {
            Agent::Local => LOCAL_FILES,
            Agent::Remote => REMOTE_FILES,
        }
    }
}

const LOCAL_FILES: &[(&str, &str)] = &[
    (
        "namespace.yaml",
        include_str!("../../deploy/local-agent/namespace.yaml"),
    ),
    (
        "namespaceoffloading-crd.yaml",
        include_str!("../../deploy/local-agent/namespaceoffloading-crd.yaml"),
    ),
    (
        "storageclass.yaml",
        include_str!("../../deploy/local-agent/storageclass.yaml"),
    ),
    (
        "rbac.yaml",
        include_str!("../../deploy/local-agent/rbac.yaml"),
    ),
    (
        "settings.yaml",
        include_str!("../../deploy/local-agent/settings.yaml"),
    ),
    (
        "deployment.yaml",
        include_str!("../../deploy/local-agent/deployment.yaml"),
    ),
    (
        "disruption-budget.yaml",
        include_str!("../../deploy/local-agent/disruption-budget.yaml"),
    ),
    (
        "service.yaml",
        include_str!("../../deploy/local-agent/service.yaml"),
    ),
    (
        "webhook.yaml",
        include_str!("../../deploy/local-agent/webhook.yaml"),
    ),
];

const REMOTE_FILES: &[(&str, &str)] = &[
    (
        "namespace.yaml",
        include_str!("../../deploy/remote-agent/namespace.yaml"),
    ),
    (
        "shadowpod-crd.yaml",
        include_str!("../../deploy/remote-agent/shadowpod-crd.yaml"),
    ),
    (
        "rbac.yaml",
        include_str!("../../deploy/remote-agent/rbac.yaml"),
    ),
    (
        "tenant-role.yaml",
        include_str!("../../deploy/remote-agent/tenant-role.yaml"),
    ),
    (
        "deployment.yaml",
        include_str!("../../deploy/remote-agent/deployment.yaml"),
    ),
    (
        "disruption-budget.yaml",
        include_str!("../../deploy/remote-agent/disruption-budget.yaml"),
    ),
    (
        "service.yaml",
        include_str!("../../deploy/remote-agent/service.yaml"),
    ),
];

/// Kinds without a namespace, which kustomize's `namespace:` leaves alone.
const CLUSTER_SCOPED: &[&str] = &[
    "Namespace",
    "CustomResourceDefinition",
    "StorageClass",
    "ClusterRole",
    "ClusterRoleBinding",
    "MutatingWebhookConfiguration",
];

/// Every object of `agent`'s manifests, as kustomize renders them, with `image` for the agent.
pub fn render(agent: Agent, image: &str) -> Vec<Value> {
    render_in(agent, image, &NAMESPACE)
}

/// [`render`] into `namespace`.
fn render_in(agent: Agent, image: &str, namespace: &str) -> Vec<Value> {
    let mut objects = Vec::new();
    for (file, text) in agent.files() {
        for document in serde_yaml_ng::Deserializer::from_str(text) {
            let value: Value = serde::Deserialize::deserialize(document)
                .unwrap_or_else(|e| panic!("deploy/{}/{file} is not YAML: {e}", agent.component()));
            if value.is_null() {
                continue;
            }
            objects.push(kustomize(value, agent, image, namespace));
        }
    }
    objects
}

fn kustomize(mut object: Value, agent: Agent, image: &str, namespace: &str) -> Value {
    let kind = object["kind"].as_str().unwrap_or_default().to_string();
    if !CLUSTER_SCOPED.contains(&kind.as_str()) {
        object["metadata"]["namespace"] = Value::from(namespace);
    }
    move_references(&mut object, &kind, namespace);
    let labels = &mut object["metadata"]["labels"];
    if labels.is_null() {
        *labels = serde_json::json!({});
    }
    labels["app.kubernetes.io/part-of"] = Value::from("refract");
    labels["app.kubernetes.io/component"] = Value::from(agent.component());
    if kind == "Deployment" {
        if let Some(containers) = object
            .pointer_mut("/spec/template/spec/containers")
            .and_then(Value::as_array_mut)
        {
            for c in containers {
                if c["image"].as_str() == Some(agent.image_placeholder()) {
                    c["image"] = Value::from(image);
                }
            }
        }
    }
    object
}

/// What else names deploy/'s namespace and must follow into another: the Namespace itself, the
/// subjects of role bindings and the webhooks' Services (which not every kustomize moves).
fn move_references(object: &mut Value, kind: &str, namespace: &str) {
    let moved = |field: &mut Value| {
        if field.as_str() == Some(DEFAULT_NAMESPACE) {
            *field = Value::from(namespace);
        }
    };
    match kind {
        "Namespace" => moved(&mut object["metadata"]["name"]),
        "RoleBinding" | "ClusterRoleBinding" => {
            for subject in object["subjects"].as_array_mut().into_iter().flatten() {
                moved(&mut subject["namespace"]);
            }
        }
        "MutatingWebhookConfiguration" | "ValidatingWebhookConfiguration" => {
            for webhook in object["webhooks"].as_array_mut().into_iter().flatten() {
                if let Some(service) = webhook.pointer_mut("/clientConfig/service") {
                    moved(&mut service["namespace"]);
                }
            }
        }
        _ => {}
    }
}

/// The one object of `kind` named `name` in `objects`.
pub fn find_mut<'a>(objects: &'a mut [Value], kind: &str, name: &str) -> Option<&'a mut Value> {
    objects
        .iter_mut()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The compiled-in list is the kustomization's: a file added to deploy/ is not forgotten.
    #[test]
    fn the_compiled_in_files_are_the_kustomizations_resources() {
        for (agent, kustomization) in [
            (
                Agent::Local,
                include_str!("../../deploy/local-agent/kustomization.yaml"),
            ),
            (
                Agent::Remote,
                include_str!("../../deploy/remote-agent/kustomization.yaml"),
            ),
        ] {
            let k: Value = serde_yaml_ng::from_str(kustomization).unwrap();
            let listed: Vec<&str> = k["resources"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| r.as_str().unwrap())
                .collect();
            let compiled: Vec<&str> = agent.files().iter().map(|(f, _)| *f).collect();
            assert_eq!(listed, compiled, "{}", agent.component());
            assert_eq!(k["namespace"], DEFAULT_NAMESPACE);
            assert_eq!(
                k["images"][0]["name"].as_str(),
                Some(agent.image_placeholder())
            );
        }
    }

    #[test]
    fn render_sets_namespace_labels_and_image_as_kustomize_does() {
        let objects = render(Agent::Local, "registry.example/local-agent:1");
        let deployment = objects.iter().find(|o| o["kind"] == "Deployment").unwrap();
        assert_eq!(deployment["metadata"]["namespace"], DEFAULT_NAMESPACE);
        assert_eq!(
            deployment["metadata"]["labels"]["app.kubernetes.io/component"],
            "local-agent"
        );
        assert_eq!(
            deployment["spec"]["template"]["spec"]["containers"][0]["image"],
            "registry.example/local-agent:1"
        );
        let crd = objects
            .iter()
            .find(|o| o["kind"] == "CustomResourceDefinition")
            .unwrap();
        assert!(crd["metadata"].get("namespace").is_none());
        let remote = render(Agent::Remote, "r:1");
        assert!(remote
            .iter()
            .any(|o| o["kind"] == "Deployment" && o["metadata"]["name"] == "refract-remote-agent"));
    }

    /// `-n`: nothing of either agent still names deploy/'s namespace, and what names the new
    /// one is what kustomize's namespace transformer moves.
    #[test]
    fn render_into_another_namespace_moves_every_reference() {
        for agent in [Agent::Local, Agent::Remote] {
            let objects = render_in(agent, "i:1", "platform-refract");
            let text = serde_json::to_string(&objects).unwrap();
            assert!(
                !text.contains(DEFAULT_NAMESPACE),
                "{} still names {DEFAULT_NAMESPACE}",
                agent.component()
            );
            assert!(objects
                .iter()
                .any(|o| o["kind"] == "Namespace" && o["metadata"]["name"] == "platform-refract"));
            let binding = objects
                .iter()
                .find(|o| o["kind"] == "ClusterRoleBinding")
                .unwrap();
            assert_eq!(binding["subjects"][0]["namespace"], "platform-refract");
        }
    }
}
