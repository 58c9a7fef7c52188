//! What `refractctl status` found, as data: printed as text for people, as JSON or YAML for
//! scripts (`-o`), and judged healthy or not for the exit code. Nothing here does I/O.

use std::fmt::Write as _;

use serde::Serialize;

/// Everything `status` shows of one origin.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Report {
    /// The origin's API server, from the kubeconfig.
    pub origin_api_server: String,
    pub peerings: Vec<PeeringReport>,
    /// Every NamespaceOffloading of the origin; `None` when they could not be listed.
    pub offloaded_namespaces: Fallible<Vec<Offloading>>,
}

/// A value, or why it could not be read.
#[derive(Debug, Serialize)]
#[serde(untagged)]
pub enum Fallible<T> {
    Known(T),
    Unknown { error: String },
}

impl<T> Fallible<T> {
    pub fn from_result<E: std::fmt::Display>(result: Result<T, E>) -> Self {
        match result {
            Ok(value) => Fallible::Known(value),
            Err(e) => Fallible::Unknown {
                error: format!("{e:#}"),
            },
        }
    }
}

/// One peering of the origin.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PeeringReport {
    /// The origin's cluster id, from the local agent's flags (`None` when it has none).
    pub origin: Option<String>,
    pub provider: String,
    pub local_agent: LocalAgent,
    /// Where the local agent reaches the remote agent.
    pub provider_endpoint: Option<String>,
    /// The tenant's client certificate.
    pub certificate: Fallible<Certificate>,
    pub link: Link,
    pub virtual_node: VirtualNode,
    /// The local agent's outbox, from its metrics.
    pub queue: Fallible<Queue>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct LocalAgent {
    /// `namespace/name` of its Deployment.
    pub deployment: String,
    pub available_replicas: i32,
    pub replicas: i32,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Certificate {
    pub serial: String,
    pub not_after: String,
}

/// The link as the provider's Inspect service describes the tenant.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Link {
    pub state: LinkState,
    /// Why the state is not `connected`, in words.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// What the provider says of the tenant, when it knows it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tenant: Option<Tenant>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum LinkState {
    Connected,
    Disconnected,
    /// The provider does not know the tenant.
    NeverConnected,
    /// The provider could not be asked (unreachable, or it refused the call).
    Unknown,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Tenant {
    pub connected_since: String,
    pub disconnected_at: String,
    pub peer_address: String,
    /// The local agent's version, as its last Hello gave it.
    pub agent_version: String,
    pub connections: u64,
    pub objects: u64,
    pub certificate_not_after: String,
    pub quota: Vec<QuotaUse>,
    /// The objects the provider did not apply, latest first; `Unknown` when not listed.
    pub refused: Fallible<Refused>,
    /// The copies the provider no longer restores because something there keeps rewriting
    /// them, oldest quarantine first; empty when none is, or the objects were not listed.
    pub quarantined: Vec<QuarantinedObject>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct QuarantinedObject {
    /// When the quarantine began, RFC 3339.
    pub since: String,
    pub object: String,
    /// Restores before it.
    pub restores: u32,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct QuotaUse {
    pub resource: String,
    pub used: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit: Option<f64>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Refused {
    /// How many objects are not applied.
    pub count: usize,
    /// The latest few.
    pub latest: Vec<RefusedObject>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RefusedObject {
    pub at: String,
    pub object: String,
    /// Lower case, as in the agents' metrics (`refused`, `conflict`, ...).
    pub outcome: String,
    pub message: String,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct VirtualNode {
    pub name: String,
    /// The Ready condition: `True`, `False`, `Unknown`; `None` when the node is missing or
    /// could not be read (then `error` says which).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ready: Option<String>,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub reason: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Queue {
    pub unacknowledged: f64,
    pub oldest_unacknowledged_seconds: f64,
    pub reconnects: f64,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Offloading {
    pub namespace: String,
    pub remote_namespace: String,
    pub phase: String,
    /// The Ready condition's status and reason.
    pub ready: String,
    pub reason: String,
}

impl PeeringReport {
    /// What is wrong with this peering for a script: the link is not up, or the virtual
    /// node is not Ready. Empty when healthy.
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        if self.link.state != LinkState::Connected {
            problems.push(format!(
                "link to {} is {}",
                self.provider,
                serde_json::to_value(self.link.state)
                    .ok()
                    .and_then(|v| v.as_str().map(str::to_string))
                    .unwrap_or_default()
            ));
        }
        if self.virtual_node.ready.as_deref() != Some("True") {
            problems.push(format!(
                "virtual node {} is not Ready",
                self.virtual_node.name
            ));
        }
        problems
    }
}

impl Report {
    /// Every problem of every peering; no peering at all is one too (nothing is offloaded).
    pub fn problems(&self) -> Vec<String> {
        if self.peerings.is_empty() {
            return vec!["no peerings".into()];
        }
        self.peerings
            .iter()
            .flat_map(PeeringReport::problems)
            .collect()
    }

    /// The text people read.
    pub fn text(&self) -> String {
        let mut out = String::new();
        if self.peerings.is_empty() {
            let _ = writeln!(
                out,
                "origin {}: no peerings (no local agent Deployment labelled {} in {})",
                self.origin_api_server,
                refract_core::keys::PEERING_LABEL,
                crate::manifests::NAMESPACE
            );
            return out;
        }
        for p in &self.peerings {
            p.write_text(&mut out);
        }
        match &self.offloaded_namespaces {
            Fallible::Unknown { error } => {
                let _ = writeln!(out, "OFFLOADED NAMESPACES unknown ({error})");
            }
            Fallible::Known(list) if list.is_empty() => {
                out.push_str("OFFLOADED NAMESPACES none (create a NamespaceOffloading in one)\n");
            }
            Fallible::Known(list) => {
                out.push_str("OFFLOADED NAMESPACES\n");
                for o in list {
                    let _ = writeln!(
                        out,
                        "  {} -> {} {} Ready={} {}",
                        o.namespace, o.remote_namespace, o.phase, o.ready, o.reason
                    );
                }
            }
        }
        out
    }
}

impl PeeringReport {
    fn write_text(&self, out: &mut String) {
        let p = crate::display::printable;
        let _ = writeln!(
            out,
            "PEERING {} -> {}",
            self.origin.as_deref().unwrap_or("?"),
            self.provider
        );
        let _ = writeln!(
            out,
            "  local agent:   {} {}/{} available",
            self.local_agent.deployment,
            self.local_agent.available_replicas,
            self.local_agent.replicas
        );
        let _ = writeln!(
            out,
            "  provider:      {}",
            self.provider_endpoint.as_deref().unwrap_or("?")
        );
        match &self.certificate {
            Fallible::Known(c) => {
                let _ = writeln!(
                    out,
                    "  certificate:   serial {}, valid until {}",
                    c.serial, c.not_after
                );
            }
            Fallible::Unknown { error } => {
                let _ = writeln!(out, "  certificate:   unreadable: {error}");
            }
        }
        let link = match (&self.link.state, &self.link.tenant) {
            (LinkState::Connected, Some(t)) => format!(
                "connected since {} from {} (agent {}, {} connections, {} objects; connection certificate valid until {})",
                p(&t.connected_since),
                p(&t.peer_address),
                p(&t.agent_version),
                t.connections,
                t.objects,
                p(&t.certificate_not_after)
            ),
            (LinkState::Disconnected, Some(t)) => format!(
                "DISCONNECTED since {} ({} connections before)",
                p(&t.disconnected_at),
                t.connections
            ),
            _ => self.link.reason.clone().unwrap_or_default(),
        };
        let _ = writeln!(out, "  link:          {link}");
        if let Some(t) = &self.link.tenant {
            let shown: Vec<String> = t
                .quota
                .iter()
                .filter(|u| u.limit.is_some() || u.used > 0.0)
                .map(|u| match u.limit {
                    Some(limit) => format!("{} {}/{}", p(&u.resource), u.used, limit),
                    None => format!("{} {}", p(&u.resource), u.used),
                })
                .collect();
            if !shown.is_empty() {
                let _ = writeln!(out, "  quota:         {}", shown.join(", "));
            }
            if !t.quarantined.is_empty() {
                let _ = writeln!(
                    out,
                    "  quarantined:   {} copies something on the provider keeps rewriting, no longer restored (ends after a quiet period, or Inspect/ClearQuarantine):",
                    t.quarantined.len()
                );
                for q in &t.quarantined {
                    let _ = writeln!(
                        out,
                        "    since {} {} (restored {} times)",
                        p(&q.since),
                        p(&q.object),
                        q.restores
                    );
                }
            }
            match &t.refused {
                Fallible::Unknown { error } => {
                    let _ = writeln!(out, "  last errors:   unknown ({})", p(error));
                }
                Fallible::Known(r) if r.count == 0 => {
                    out.push_str("  last errors:   none\n");
                }
                Fallible::Known(r) => {
                    let _ = writeln!(
                        out,
                        "  last errors:   {} objects not applied; latest:",
                        r.count
                    );
                    for o in &r.latest {
                        let _ = writeln!(
                            out,
                            "    {} {} {}: {}",
                            p(&o.at),
                            p(&o.object),
                            p(&o.outcome),
                            p(&o.message)
                        );
                    }
                }
            }
        }
        let node = &self.virtual_node;
        let node_line = match (&node.ready, &node.error) {
            (Some(ready), _) => format!(
                "{} Ready={ready} {} {}",
                node.name,
                p(&node.reason),
                p(&node.message)
            ),
            (None, Some(error)) => format!("{}: {error}", node.name),
            (None, None) => format!("{} does not exist", node.name),
        };
        let _ = writeln!(out, "  virtual node:  {}", node_line.trim_end());
        match &self.queue {
            Fallible::Known(q) => {
                let _ = writeln!(
                    out,
                    "  queue:         {} unacknowledged, oldest {:.1}s; {} reconnects",
                    q.unacknowledged, q.oldest_unacknowledged_seconds, q.reconnects
                );
            }
            Fallible::Unknown { error } => {
                let _ = writeln!(out, "  queue:         unknown: {error}");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peering(state: LinkState, ready: Option<&str>) -> PeeringReport {
        PeeringReport {
            origin: Some("origin".into()),
            provider: "provider".into(),
            local_agent: LocalAgent {
                deployment: "refract-system/refract-local-agent-provider".into(),
                available_replicas: 2,
                replicas: 2,
            },
            provider_endpoint: Some("10.0.0.1:443".into()),
            certificate: Fallible::Known(Certificate {
                serial: "ab".into(),
                not_after: "2027-01-01T00:00:00Z".into(),
            }),
            link: Link {
                state,
                reason: (state != LinkState::Connected).then(|| "provider not reachable".into()),
                tenant: None,
            },
            virtual_node: VirtualNode {
                name: "refract-provider".into(),
                ready: ready.map(str::to_string),
                reason: String::new(),
                message: String::new(),
                error: None,
            },
            queue: Fallible::Unknown {
                error: "no running local agent pod".into(),
            },
        }
    }

    #[test]
    fn a_peering_is_healthy_only_when_connected_and_its_node_ready() {
        assert!(peering(LinkState::Connected, Some("True"))
            .problems()
            .is_empty());
        assert_eq!(
            peering(LinkState::Unknown, Some("True")).problems(),
            vec!["link to provider is unknown"]
        );
        assert_eq!(
            peering(LinkState::Connected, Some("False")).problems(),
            vec!["virtual node refract-provider is not Ready"]
        );
        assert_eq!(peering(LinkState::Disconnected, None).problems().len(), 2);
    }

    #[test]
    fn quarantined_copies_are_listed_without_making_the_peering_unhealthy() {
        let mut p = peering(LinkState::Connected, Some("True"));
        p.link.tenant = Some(Tenant {
            connected_since: "2026-11-30T08:00:00Z".into(),
            disconnected_at: String::new(),
            peer_address: "10.0.0.2:5000".into(),
            agent_version: "0.1.0".into(),
            connections: 1,
            objects: 3,
            certificate_not_after: "2027-01-01T00:00:00Z".into(),
            quota: vec![],
            refused: Fallible::Known(Refused {
                count: 0,
                latest: vec![],
            }),
            quarantined: vec![QuarantinedObject {
                since: "2026-11-30T08:01:17Z".into(),
                object: "ConfigMap shop-origin/fought".into(),
                restores: 5,
            }],
        });
        assert!(p.problems().is_empty());
        let report = Report {
            origin_api_server: "https://127.0.0.1:6443".into(),
            peerings: vec![p],
            offloaded_namespaces: Fallible::Known(vec![]),
        };
        let text = report.text();
        assert!(
            text.contains("  quarantined:   1 copies something on the provider keeps rewriting")
                && text.contains(
                    "    since 2026-11-30T08:01:17Z ConfigMap shop-origin/fought (restored 5 times)"
                ),
            "{text}"
        );
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(
            json["peerings"][0]["link"]["tenant"]["quarantined"][0]["restores"],
            5
        );
    }

    #[test]
    fn no_peering_is_a_problem_and_json_names_fields_in_camel_case() {
        let mut report = Report {
            origin_api_server: "https://127.0.0.1:6443".into(),
            peerings: vec![],
            offloaded_namespaces: Fallible::Known(vec![]),
        };
        assert_eq!(report.problems(), vec!["no peerings"]);
        report
            .peerings
            .push(peering(LinkState::NeverConnected, Some("True")));
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["peerings"][0]["link"]["state"], "never-connected");
        assert_eq!(json["peerings"][0]["virtualNode"]["ready"], "True");
        assert_eq!(
            json["peerings"][0]["queue"]["error"],
            "no running local agent pod"
        );
        assert_eq!(json["offloadedNamespaces"], serde_json::json!([]));
    }
}
