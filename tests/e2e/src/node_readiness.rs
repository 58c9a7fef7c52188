//! The virtual node's Ready condition, watched through a failover.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::Api;

/// Every Ready status the virtual node showed, polled twice a second until dropped.
pub struct NodeReadiness {
    seen: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl NodeReadiness {
    /// Starts polling the virtual node `refract-provider`.
    pub fn watch(nodes: Api<Node>) -> Self {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let record = seen.clone();
        let task = tokio::spawn(async move {
            loop {
                if let Ok(node) = nodes.get("refract-provider").await {
                    let status = node
                        .status
                        .and_then(|s| s.conditions)
                        .unwrap_or_default()
                        .into_iter()
                        .find(|c| c.type_ == "Ready")
                        .map(|c| format!("{} {}", c.status, c.reason.unwrap_or_default()))
                        .unwrap_or_else(|| "missing".into());
                    record.lock().unwrap().push(status);
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        });
        Self { seen, task }
    }

    /// Statuses other than True seen so far.
    pub fn not_ready(&self) -> Vec<String> {
        let seen = self.seen.lock().unwrap();
        let mut bad: Vec<String> = seen
            .iter()
            .filter(|s| !s.starts_with("True"))
            .cloned()
            .collect();
        bad.dedup();
        bad
    }
}

impl Drop for NodeReadiness {
    fn drop(&mut self) {
        self.task.abort();
    }
}
