//! Who may call the remote agent, decided per connection and per call.
//!
//! Every TLS connection is registered with the identity in its client certificate
//! ([`Access::register`]) and wrapped so it can be closed from outside ([`Guarded`]). When the
//! operator cuts a tenant off (`--tenant-deny-list`, re-read every second), the tenant's open
//! connections are closed at once, so its Sync stream and kubelet calls end; every later call
//! is refused with the reason ([`crate::peer::Peer::from_request`]). Other tenants' connections
//! are untouched, and so is the CA. The Inspect admin identities (`--inspect-admin`) are known
//! here too, so a service can refuse them what only a tenant may do.
//!
//! Nothing on the provider is removed when a tenant is cut off: its pods keep running until
//! the operator removes the tenant (`remote-agent remove-tenant`).

mod connection;
pub mod deny_list;
pub mod sources;

use std::collections::{BTreeSet, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use refract_core::lock::Locked;
use refract_shared::tls::ClusterId;
use tokio_util::sync::CancellationToken;

pub use connection::{ConnectionInfo, Guarded};
pub use deny_list::DenyList;

/// How often the deny list file is re-read.
pub const DENY_LIST_POLL: Duration = Duration::from_secs(1);

/// Connections one client identity may have open at once. A local agent needs one (its stream
/// and every kubelet call share it); `refractctl` and `grpcurl` open one each. A tenant cannot
/// hold more of the agent's connections, and what each costs, than this.
pub const MAX_CONNECTIONS_PER_IDENTITY: usize = 16;

/// A client identity has [`MAX_CONNECTIONS_PER_IDENTITY`] connections open already.
#[derive(Debug, thiserror::Error)]
#[error("{identity} has {MAX_CONNECTIONS_PER_IDENTITY} connections open already")]
pub struct TooManyConnections {
    /// The identity, as its certificate names it.
    pub identity: String,
}

/// The access rules and the open connections they apply to.
#[derive(Debug)]
pub struct Access {
    admins: BTreeSet<ClusterId>,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    denied: DenyList,
    open: HashMap<u64, Open>,
    next: u64,
}

#[derive(Debug)]
struct Open {
    tenant: Option<ClusterId>,
    serial: String,
    closer: CancellationToken,
}

/// A connection's place in [`Access`]; dropping it forgets the connection.
#[derive(Debug)]
pub struct Registration {
    access: Arc<Access>,
    id: u64,
    closer: CancellationToken,
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.access.state.locked().open.remove(&self.id);
    }
}

impl Access {
    /// Access with `admins` as the Inspect admin identities and `denied` cut off.
    pub fn new(admins: BTreeSet<ClusterId>, denied: DenyList) -> Arc<Self> {
        Arc::new(Self {
            admins,
            state: Mutex::new(State {
                denied,
                ..State::default()
            }),
        })
    }

    /// Whether `identity` is an Inspect admin identity.
    pub fn is_admin(&self, identity: &ClusterId) -> bool {
        self.admins.contains(identity)
    }

    /// Why a caller whose certificate names `tenant` with serial `serial` is refused, if it is.
    pub fn refusal(&self, tenant: Option<&ClusterId>, serial: &str) -> Option<String> {
        self.state.locked().denied.refusal(tenant, serial)
    }

    /// Registers an open connection of `tenant` (certificate serial `serial`), unless that
    /// identity has [`MAX_CONNECTIONS_PER_IDENTITY`] open already (certificates without an
    /// identity count together).
    pub fn register(
        self: &Arc<Self>,
        tenant: Option<ClusterId>,
        serial: String,
    ) -> Result<Registration, TooManyConnections> {
        let closer = CancellationToken::new();
        let mut state = self.state.locked();
        let open = state.open.values().filter(|o| o.tenant == tenant).count();
        if open >= MAX_CONNECTIONS_PER_IDENTITY {
            return Err(TooManyConnections {
                identity: tenant.map_or_else(
                    || "a certificate without identity".into(),
                    |t| t.to_string(),
                ),
            });
        }
        state.next += 1;
        let id = state.next;
        state.open.insert(
            id,
            Open {
                tenant,
                serial,
                closer: closer.clone(),
            },
        );
        Ok(Registration {
            access: self.clone(),
            id,
            closer,
        })
    }

    /// Replaces the deny list and closes every open connection it now refuses; returns the
    /// refusals, one per closed connection.
    pub fn set_denied(&self, denied: DenyList) -> Vec<String> {
        let mut state = self.state.locked();
        state.denied = denied;
        let state = &*state;
        state
            .open
            .values()
            .filter(|o| !o.closer.is_cancelled())
            .filter_map(|o| {
                let reason = state.denied.refusal(o.tenant.as_ref(), &o.serial)?;
                o.closer.cancel();
                Some(reason)
            })
            .collect()
    }
}

/// The deny list file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum DenyListFileError {
    /// It could not be read.
    #[error("failed to read --tenant-deny-list {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// A line is not an entry.
    #[error("invalid --tenant-deny-list {path}: {source}")]
    Invalid {
        /// The file.
        path: String,
        /// The line and what is wrong.
        source: deny_list::DenyListError,
    },
}

/// Reads and parses the deny list file.
pub fn load_deny_list(path: &std::path::Path) -> Result<(String, DenyList), DenyListFileError> {
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| DenyListFileError::Read {
        path: shown.clone(),
        source,
    })?;
    let list = DenyList::parse(&text).map_err(|source| DenyListFileError::Invalid {
        path: shown,
        source,
    })?;
    Ok((text, list))
}

/// Re-reads the deny list at `path` every [`DENY_LIST_POLL`] until `shutdown`, applying each
/// change. A file that cannot be read or parsed is logged and the last good list stays.
pub fn follow_deny_list(
    access: Arc<Access>,
    path: PathBuf,
    mut last_text: String,
    shutdown: CancellationToken,
) {
    tokio::spawn(async move {
        // Said once per distinct problem, not every second.
        let mut last_error = String::new();
        let mut tick = tokio::time::interval(DENY_LIST_POLL);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tick.tick() => {}
            }
            let (text, list) = match load_deny_list(&path) {
                Ok(loaded) => loaded,
                Err(error) => {
                    let error = error.to_string();
                    if error != last_error {
                        tracing::error!(%error, "keeping the last good tenant deny list");
                        last_error = error;
                    }
                    continue;
                }
            };
            last_error.clear();
            if text == last_text {
                continue;
            }
            last_text = text;
            let entries = list.len();
            let closed = access.set_denied(list);
            tracing::info!(entries, closed = closed.len(), "tenant deny list changed");
            for reason in closed {
                tracing::warn!(%reason, "closed a connection");
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(s: &str) -> ClusterId {
        ClusterId::parse(s).unwrap()
    }

    #[test]
    fn cutting_a_tenant_off_closes_its_connections_only() {
        let access = Access::new(BTreeSet::new(), DenyList::default());
        let shop = access.register(Some(id("shop")), "0a".into()).unwrap();
        let other = access.register(Some(id("other")), "0b".into()).unwrap();
        let closed = access.set_denied(DenyList::parse("shop\n").unwrap());
        assert_eq!(closed.len(), 1);
        assert!(shop.closer.is_cancelled());
        assert!(!other.closer.is_cancelled());
        assert!(access.refusal(Some(&id("shop")), "0c").is_some());
        drop(shop);
        assert_eq!(
            access.state.locked().open.len(),
            1,
            "a dropped connection is forgotten"
        );
        // By serial: only that certificate.
        let closed = access.set_denied(DenyList::parse("serial:0b\n").unwrap());
        assert_eq!(closed.len(), 1);
        assert!(other.closer.is_cancelled());
        assert!(access.refusal(Some(&id("shop")), "0c").is_none());
    }

    #[test]
    fn one_identity_holds_a_bounded_number_of_connections() {
        let access = Access::new(BTreeSet::new(), DenyList::default());
        let held: Vec<_> = (0..MAX_CONNECTIONS_PER_IDENTITY)
            .map(|i| access.register(Some(id("shop")), format!("{i}")).unwrap())
            .collect();
        let refused = access.register(Some(id("shop")), "x".into()).unwrap_err();
        assert!(refused.to_string().contains("shop has 16"), "{refused}");
        assert!(access.register(Some(id("other")), "y".into()).is_ok());
        drop(held);
        assert!(access.register(Some(id("shop")), "z".into()).is_ok());
    }
}
