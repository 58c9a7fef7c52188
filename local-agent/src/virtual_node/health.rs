//! The virtual node's readiness, from periodic health checks.
//!
//! Every `--health-check-interval` the agent checks the link to the remote agent and the
//! provider's API server as the remote agent last reported it. One failed check changes
//! nothing: the node turns NotReady after `--health-failure-threshold` failures in a row, and
//! Ready again at the first check that passes. The origin's node lifecycle controller then
//! does what it does for any NotReady node: it taints it `node.kubernetes.io/not-ready`
//! (NoExecute), and pods are evicted once their toleration of that taint runs out.

/// What one check found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Check {
    /// Connected, and the provider's API server answers the remote agent.
    Healthy,
    /// Connected, but the remote agent has not reported the provider yet.
    WaitingForProvider,
    /// No stream to the remote agent.
    LinkDown,
    /// The remote agent reports that the provider's API server does not answer it.
    ProviderApiServerDown,
}

/// The node's Ready condition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Readiness {
    /// Whether the node is Ready.
    pub ready: bool,
    /// The condition's reason.
    pub reason: &'static str,
    /// The condition's message.
    pub message: String,
}

/// Consecutive check results, turned into readiness.
#[derive(Debug, Clone)]
pub struct Health {
    threshold: u32,
    failures: u32,
    ready: bool,
}

impl Health {
    /// NotReady after `threshold` failed checks in a row (at least 1); not Ready at first.
    pub fn new(threshold: u32) -> Self {
        Self {
            threshold: threshold.max(1),
            failures: 0,
            ready: false,
        }
    }

    /// Carries on from a node shown Ready before this agent started (a restart, or another
    /// replica that led), whose last heartbeat is `missed` check intervals old: those count
    /// as failed checks but for the one this agent's first check stands for, so the node turns
    /// NotReady once the checks have failed for `threshold` intervals in all, wherever they ran.
    pub fn resumed(threshold: u32, missed: u32) -> Self {
        Self {
            ready: true,
            failures: missed.saturating_sub(1),
            ..Self::new(threshold)
        }
    }

    /// Whether `check`, seen between two periodic checks, is shown at once: good news is,
    /// and so is a link that came up on a node not Ready yet (waiting for the provider's first
    /// report counts no failure then), so the node never goes on naming a link down that is
    /// up. Anything that would count as a failure waits for the next periodic check.
    pub fn shown_between_checks(&self, check: Check) -> bool {
        check == Check::Healthy || (check == Check::WaitingForProvider && !self.ready)
    }

    /// Takes one check's result; returns the readiness to show.
    pub fn observe(&mut self, check: Check) -> Readiness {
        let (reason, what) = match check {
            Check::Healthy => {
                self.failures = 0;
                self.ready = true;
                return Readiness {
                    ready: true,
                    reason: "KubeletReady",
                    message: "connected to the remote agent; the provider's API server answers"
                        .into(),
                };
            }
            Check::WaitingForProvider => {
                // Never Ready before the provider has been described once: there is nothing
                // to schedule onto.
                if !self.ready {
                    return Readiness {
                        ready: false,
                        reason: "WaitingForProvider",
                        message: "no capacity received from the remote agent yet".into(),
                    };
                }
                (
                    "WaitingForProvider",
                    "no capacity report from the remote agent",
                )
            }
            Check::LinkDown => ("LinkDown", "the link to the remote agent is down"),
            Check::ProviderApiServerDown => (
                "ProviderAPIServerDown",
                "the provider's API server does not answer the remote agent",
            ),
        };
        self.failures = self.failures.saturating_add(1);
        if self.failures >= self.threshold {
            self.ready = false;
        }
        let message = if self.ready {
            format!(
                "{what} ({} of {} failed checks before NotReady)",
                self.failures, self.threshold
            )
        } else {
            format!("{what} ({} failed checks in a row)", self.failures)
        };
        Readiness {
            ready: self.ready,
            reason,
            message,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_ready_only_after_the_threshold_of_failures_in_a_row() {
        let mut h = Health::new(3);
        assert!(!h.observe(Check::WaitingForProvider).ready);
        assert!(h.observe(Check::Healthy).ready);
        assert!(h.observe(Check::LinkDown).ready);
        assert!(h.observe(Check::ProviderApiServerDown).ready);
        let r = h.observe(Check::LinkDown);
        assert!(!r.ready);
        assert_eq!(r.reason, "LinkDown");
        assert!(r.message.contains("3 failed checks"), "{}", r.message);
        assert!(!h.observe(Check::LinkDown).ready);
        assert!(h.observe(Check::Healthy).ready);
    }

    #[test]
    fn between_checks_only_news_that_counts_no_failure_is_shown() {
        let mut h = Health::new(3);
        assert!(h.shown_between_checks(Check::WaitingForProvider));
        assert!(!h.shown_between_checks(Check::LinkDown));
        assert!(h.shown_between_checks(Check::Healthy));
        h.observe(Check::Healthy);
        assert!(!h.shown_between_checks(Check::WaitingForProvider));
        assert!(!h.shown_between_checks(Check::ProviderApiServerDown));
        assert!(!Health::resumed(3, 0).shown_between_checks(Check::WaitingForProvider));
    }

    #[test]
    fn a_passing_check_starts_the_count_again() {
        let mut h = Health::new(2);
        h.observe(Check::Healthy);
        assert!(h.observe(Check::LinkDown).ready);
        assert!(h.observe(Check::Healthy).ready);
        assert!(h.observe(Check::LinkDown).ready);
        assert!(!h.observe(Check::LinkDown).ready);
    }

    #[test]
    fn a_takeover_keeps_the_node_ready_until_the_threshold() {
        let mut h = Health::resumed(3, 1);
        assert!(h.observe(Check::LinkDown).ready, "the stream is not up yet");
        assert!(h.observe(Check::WaitingForProvider).ready);
        assert!(h.observe(Check::Healthy).ready);
        // Two intervals since the last heartbeat: this check is the third failure.
        let mut h = Health::resumed(3, 2);
        assert!(h.observe(Check::LinkDown).ready);
        assert!(!h.observe(Check::LinkDown).ready);
    }

    #[test]
    fn a_link_that_never_came_up_is_not_ready() {
        let mut h = Health::new(3);
        let r = h.observe(Check::LinkDown);
        assert!(!r.ready);
        assert_eq!(r.reason, "LinkDown");
    }
}
