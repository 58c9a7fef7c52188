//! Kubelet calls (logs, exec, attach, port-forward) listed per tenant while open, and bounded
//! per tenant.

use refract_core::lock::Locked;
use refract_shared::tls::ClusterId;
use refract_wire::proto;

use super::{now, Registry, TenantState};

/// Keeps a kubelet call listed in Inspect while it is open.
pub struct KubeletSessionGuard {
    registry: Registry,
    tenant: ClusterId,
    id: u64,
}

impl Drop for KubeletSessionGuard {
    fn drop(&mut self) {
        if let Some(t) = self.registry.inner.locked().get_mut(&self.tenant) {
            t.kubelet_sessions.remove(&self.id);
        }
    }
}

/// A tenant already has as many kubelet calls open as it may.
#[derive(Debug, thiserror::Error)]
#[error("{open} kubelet calls are open for this tenant, the most allowed; close one first")]
pub struct TooManySessions {
    /// How many are open.
    pub open: usize,
}

static NEXT_KUBELET_SESSION: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

impl Registry {
    /// Lists a kubelet call of `tenant` until the guard drops, unless `limit` calls are open.
    pub fn open_kubelet_session(
        &self,
        tenant: &ClusterId,
        call: &str,
        pod: String,
        limit: usize,
    ) -> Result<KubeletSessionGuard, TooManySessions> {
        let mut tenants = self.inner.locked();
        let t = tenants
            .entry(tenant.clone())
            .or_insert_with(TenantState::new);
        if t.kubelet_sessions.len() >= limit {
            return Err(TooManySessions {
                open: t.kubelet_sessions.len(),
            });
        }
        let id = NEXT_KUBELET_SESSION.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        t.kubelet_sessions.insert(
            id,
            proto::KubeletSession {
                call: call.to_string(),
                pod,
                opened_at: now(),
            },
        );
        Ok(KubeletSessionGuard {
            registry: self.clone(),
            tenant: tenant.clone(),
            id,
        })
    }
}
