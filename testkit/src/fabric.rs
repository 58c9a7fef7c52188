//! The address translation a network fabric installs between two clusters whose pod ranges
//! are remapped (Liqo's network fabric does it with its gateways; here the machine, which
//! routes between the nodes' veth pairs, does it with iptables `NETMAP`).
//!
//! Each cluster sees the other's pods in a range of its own choosing, of the same size
//! (`seen_as`): the origin's `--remote-pod-remap` names how it sees the provider's pods, its
//! `--remap` how the provider sees the origin's. The fabric makes those addresses real:
//!
//! - a packet to a `seen_as` address goes to the pod it stands for (destination rewritten,
//!   host bits kept);
//! - a packet from one cluster's pods to the other's leaves with its source rewritten into
//!   the range the receiving cluster knows its sender by, so that the answer comes back the
//!   same way and each cluster only ever meets the other's pods by their remapped addresses.
//!
//! Nodes of [`crate::Options::with_own_network`] send everything in 10.0.0.0/8 to the machine,
//! so every `seen_as` range must be in there too. The rules carry a comment naming this
//! process; dropping the fabric deletes them.

use std::process::Command;

use anyhow::Context;
use ipnet::Ipv4Net;

/// One cluster's pods: their real range, and the range the other cluster sees them in.
#[derive(Debug, Clone, Copy)]
pub struct Side {
    /// The pods' real addresses (the node's pod range).
    pub pods: Ipv4Net,
    /// The same pods as the other cluster addresses them.
    pub seen_as: Ipv4Net,
}

/// The rules in force. Dropping it deletes them.
pub struct Fabric {
    rules: Vec<Vec<String>>,
}

impl Fabric {
    /// Installs the translation between `a` and `b` on the machine.
    pub fn between(a: Side, b: Side) -> anyhow::Result<Self> {
        for side in [a, b] {
            anyhow::ensure!(
                side.pods.prefix_len() == side.seen_as.prefix_len(),
                "{} and {} differ in size: NETMAP keeps the host bits",
                side.pods,
                side.seen_as
            );
        }
        let comment = format!("refract-testkit-fabric-{}", std::process::id());
        let mut rules = Vec::new();
        for (from, to) in [(a, b), (b, a)] {
            // Addressed to `to` by its remapped address: deliver to the real one.
            rules.push(rule(&[
                "PREROUTING",
                "-d",
                &to.seen_as.to_string(),
                "-j",
                "NETMAP",
                "--to",
                &to.pods.to_string(),
            ]));
            // Sent by `from` to `to`: `to` knows the sender by `from`'s remapped address.
            rules.push(rule(&[
                "POSTROUTING",
                "-s",
                &from.pods.to_string(),
                "-d",
                &to.pods.to_string(),
                "-j",
                "NETMAP",
                "--to",
                &from.seen_as.to_string(),
            ]));
        }
        for r in &mut rules {
            r.extend(["-m", "comment", "--comment", &comment].map(String::from));
        }
        // Rules land one by one, so a failure part way deletes those already in (on drop).
        let mut fabric = Self { rules: Vec::new() };
        for r in rules {
            iptables("-A", &r)?;
            fabric.rules.push(r);
        }
        tracing::info!(
            a = %format!("{} as {}", a.pods, a.seen_as),
            b = %format!("{} as {}", b.pods, b.seen_as),
            "network fabric: pod ranges remapped between the clusters"
        );
        Ok(fabric)
    }
}

impl Drop for Fabric {
    fn drop(&mut self) {
        for r in self.rules.drain(..) {
            if let Err(e) = iptables("-D", &r) {
                tracing::warn!(error = %e, "failed to delete a fabric rule");
            }
        }
    }
}

fn rule(parts: &[&str]) -> Vec<String> {
    parts.iter().map(|p| p.to_string()).collect()
}

/// `iptables -w -t nat <op> <rule>` in the machine's network namespace.
fn iptables(op: &str, rule: &[String]) -> anyhow::Result<()> {
    let out = Command::new("iptables")
        .args(["-w", "-t", "nat", op])
        .args(rule)
        .output()
        .context("failed to run iptables (Debian's iptables)")?;
    anyhow::ensure!(
        out.status.success(),
        "iptables -t nat {op} {} failed: {}",
        rule.join(" "),
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(())
}
