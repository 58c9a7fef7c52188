//! Each tenant's own Kubernetes identity on the provider.
//!
//! The remote agent writes a tenant's objects impersonating that tenant's ServiceAccount
//! (`tenant-<cluster id>` in the agent's namespace), which a RoleBinding in each of the
//! tenant's twin namespaces grants the ClusterRole [`TENANT_ROLE`]. So the API server, not only
//! our code, keeps a tenant's writes inside its own namespaces: a write aimed anywhere else is
//! refused with 403 whatever the agent's code decided.
//!
//! The agent's own identity keeps what no tenant may do: creating and labelling the twin
//! namespaces and their bindings, quotas and network fences, and the watches it streams from.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{ClusterRole, RoleBinding};
use kube::api::{Api, Patch, PatchParams, PostParams};
use refract_core::keys::{REMOTE_FIELD_MANAGER, TENANT_NAMESPACE_LABEL};
use refract_core::lock::Locked as _;
use refract_shared::tls::ClusterId;
use serde_json::json;

/// The ClusterRole every tenant's RoleBindings grant: what a tenant's objects need in its own
/// twin namespaces (`deploy/remote-agent/tenant-role.yaml`).
pub const TENANT_ROLE: &str = "refract-tenant";

/// The name of the RoleBinding in each twin namespace.
pub const BINDING_NAME: &str = "refract-tenant";

/// How long a new binding may take to reach the API server's authorizer.
const BINDING_EFFECTIVE_WITHIN: Duration = Duration::from_secs(10);

/// The ServiceAccount name of `tenant`.
pub fn account_name(tenant: &ClusterId) -> String {
    refract_core::keys::tenant_account(tenant.as_str())
}

struct Inner {
    /// The agent's own client.
    own: kube::Client,
    /// The namespace of the tenants' ServiceAccounts (the agent's own).
    namespace: String,
    /// The configuration each tenant's client is built from, impersonating the tenant's
    /// ServiceAccount. `None` only in unit tests: every tenant writes with the one (mock)
    /// client, and no binding is written.
    impersonate: Option<Box<kube::Config>>,
    clients: Mutex<HashMap<ClusterId, kube::Client>>,
    /// Tenants whose ServiceAccount this process has written.
    accounts: Mutex<HashSet<ClusterId>>,
    /// Twin namespaces whose binding this process has written and seen in force.
    bound: Mutex<HashSet<String>>,
}

/// Tenants' identities: their clients and their bindings.
#[derive(Clone)]
pub struct Identities {
    inner: Arc<Inner>,
}

/// Why a tenant's identity could not be used.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    /// The provider API refused or failed a request.
    #[error(transparent)]
    Kube(#[from] kube::Error),
    /// The binding was written but the API server does not apply it yet.
    #[error("the RoleBinding {BINDING_NAME} in namespace {namespace} for {user} is not in force after {BINDING_EFFECTIVE_WITHIN:?}")]
    NotInForce {
        /// The twin namespace.
        namespace: String,
        /// The tenant's user name.
        user: String,
    },
}

impl Identities {
    /// Identities impersonated from `config`, the configuration `own` was built from;
    /// tenants' ServiceAccounts live in `namespace`.
    pub fn impersonating(own: kube::Client, config: kube::Config, namespace: String) -> Self {
        Self::with(own, namespace, Some(Box::new(config)))
    }

    /// Unit tests: every tenant writes with `client`.
    #[cfg(test)]
    pub fn shared(client: kube::Client) -> Self {
        Self::with(client, "refract-system".into(), None)
    }

    fn with(own: kube::Client, namespace: String, impersonate: Option<Box<kube::Config>>) -> Self {
        Self {
            inner: Arc::new(Inner {
                own,
                namespace,
                impersonate,
                clients: Mutex::default(),
                accounts: Mutex::default(),
                bound: Mutex::default(),
            }),
        }
    }

    /// The namespace of the tenants' ServiceAccounts (the agent's own).
    pub fn accounts_namespace(&self) -> &str {
        &self.inner.namespace
    }

    /// Forgets what this process wrote for `tenant` (its client, account and bindings), once
    /// the tenant is removed: should it peer again, everything is written anew.
    pub fn forget_tenant(&self, tenant: &ClusterId) {
        self.inner.clients.locked().remove(tenant);
        self.inner.accounts.locked().remove(tenant);
        // Which namespaces were the tenant's is not kept here; forgetting every binding costs
        // each namespace one access review at its next write, and tenants leave rarely.
        self.inner.bound.locked().clear();
    }

    /// The agent's own client.
    pub fn own(&self) -> &kube::Client {
        &self.inner.own
    }

    /// The user name the API server knows `tenant` by.
    pub fn user_name(&self, tenant: &ClusterId) -> String {
        format!(
            "system:serviceaccount:{}:{}",
            self.inner.namespace,
            account_name(tenant)
        )
    }

    /// A client acting as `tenant`.
    pub fn client(&self, tenant: &ClusterId) -> Result<kube::Client, kube::Error> {
        let Some(config) = &self.inner.impersonate else {
            return Ok(self.inner.own.clone());
        };
        if let Some(client) = self.inner.clients.locked().get(tenant) {
            return Ok(client.clone());
        }
        let mut config = (**config).clone();
        config.auth_info.impersonate = Some(self.user_name(tenant));
        // No groups: the API server gives an impersonated ServiceAccount its own groups, and
        // impersonating groups would need a right of its own.
        let client = kube::Client::try_from(config)?;
        self.inner
            .clients
            .locked()
            .insert(tenant.clone(), client.clone());
        Ok(client)
    }

    /// Grants `tenant` its rights in `namespace`, one of its twin namespaces: its
    /// ServiceAccount, the RoleBinding, and a wait until the API server applies it. Done once
    /// per namespace in this process; callers must have checked the namespace is the tenant's.
    pub async fn bind(&self, tenant: &ClusterId, namespace: &str) -> Result<(), IdentityError> {
        if self.inner.impersonate.is_none() || self.inner.bound.locked().contains(namespace) {
            return Ok(());
        }
        self.write_account(tenant).await?;
        let bindings: Api<RoleBinding> = Api::namespaced(self.inner.own.clone(), namespace);
        let binding = role_binding(namespace, tenant, &self.inner.namespace);
        bindings
            .patch(BINDING_NAME, &apply_params(), &Patch::Apply(binding))
            .await?;
        self.wait_in_force(tenant, namespace).await?;
        self.inner.bound.locked().insert(namespace.to_string());
        Ok(())
    }

    /// Forgets `namespace`'s binding (the namespace is going away).
    pub fn forget(&self, namespace: &str) {
        self.inner.bound.locked().remove(namespace);
    }

    /// Checks at start that the role tenants are bound to exists: without it no tenant could
    /// write anything. Only an answer that it does not exist stops the agent.
    pub async fn check_role(&self, custom: &[crate::kinds::CustomKindName]) -> anyhow::Result<()> {
        if self.inner.impersonate.is_none() {
            return Ok(());
        }
        let roles: Api<ClusterRole> = Api::all(self.inner.own.clone());
        match roles.get_opt(TENANT_ROLE).await {
            Ok(Some(role)) => {
                for kind in custom.iter().filter(|k| !grants_writes(&role, k)) {
                    tracing::warn!(%kind, "ClusterRole {TENANT_ROLE} does not let tenants write this custom kind (get, list, create, patch, delete): every write of it will be refused until a rule is added (see the README, \"Custom kinds\")");
                }
                Ok(())
            }
            Ok(None) => anyhow::bail!(
                "ClusterRole {TENANT_ROLE} does not exist: tenants are bound to it in their namespaces; apply deploy/remote-agent/tenant-role.yaml (included in `kubectl apply -k deploy/remote-agent`)"
            ),
            // The API server not answering yet is no reason not to start: the agent serves
            // its tenants' links, and writes wait for the API server anyway.
            Err(error) => {
                tracing::warn!(%error, "cannot read ClusterRole {TENANT_ROLE}, which tenants are bound to; going on");
                Ok(())
            }
        }
    }

    async fn write_account(&self, tenant: &ClusterId) -> Result<(), kube::Error> {
        if self.inner.accounts.locked().contains(tenant) {
            return Ok(());
        }
        let accounts: Api<ServiceAccount> =
            Api::namespaced(self.inner.own.clone(), &self.inner.namespace);
        let account = json!({
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {
                "name": account_name(tenant),
                "namespace": self.inner.namespace,
                "labels": {TENANT_NAMESPACE_LABEL: tenant.as_str()},
            },
            // The account is only ever impersonated: no token of it is mounted anywhere.
            "automountServiceAccountToken": false,
        });
        accounts
            .patch(
                &account_name(tenant),
                &apply_params(),
                &Patch::Apply(account),
            )
            .await?;
        self.inner.accounts.locked().insert(tenant.clone());
        Ok(())
    }

    /// Asks the API server, as `tenant`, whether it may now write in `namespace`.
    async fn wait_in_force(
        &self,
        tenant: &ClusterId,
        namespace: &str,
    ) -> Result<(), IdentityError> {
        let reviews: Api<SelfSubjectAccessReview> = Api::all(self.client(tenant)?);
        let review = SelfSubjectAccessReview {
            spec: SelfSubjectAccessReviewSpec {
                resource_attributes: Some(ResourceAttributes {
                    namespace: Some(namespace.to_string()),
                    verb: Some("create".into()),
                    group: Some("offloading.refract.io".into()),
                    resource: Some("shadowpods".into()),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let deadline = tokio::time::Instant::now() + BINDING_EFFECTIVE_WITHIN;
        loop {
            let answer = reviews.create(&PostParams::default(), &review).await?;
            if answer.status.is_some_and(|s| s.allowed) {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(IdentityError::NotInForce {
                    namespace: namespace.to_string(),
                    user: self.user_name(tenant),
                });
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

fn apply_params() -> PatchParams {
    PatchParams::apply(REMOTE_FIELD_MANAGER).force()
}

/// The RoleBinding granting `tenant` (its account in `account_namespace`) its rights in its
/// twin namespace `namespace`.
pub fn role_binding(
    namespace: &str,
    tenant: &ClusterId,
    account_namespace: &str,
) -> serde_json::Value {
    json!({
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {
            "name": BINDING_NAME,
            "namespace": namespace,
            "labels": {TENANT_NAMESPACE_LABEL: tenant.as_str()},
        },
        "roleRef": {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "ClusterRole",
            "name": TENANT_ROLE,
        },
        "subjects": [{
            "kind": "ServiceAccount",
            "name": account_name(tenant),
            "namespace": account_namespace,
        }],
    })
}

/// Whether `role` grants what a tenant's writes of `kind` need.
fn grants_writes(role: &ClusterRole, kind: &crate::kinds::CustomKindName) -> bool {
    let has = |list: &[String], wanted: &str| list.iter().any(|v| v == wanted || v == "*");
    ["get", "list", "create", "patch", "delete"]
        .iter()
        .all(|verb| {
            role.rules.iter().flatten().any(|rule| {
                has(rule.api_groups.as_deref().unwrap_or_default(), &kind.group)
                    && has(rule.resources.as_deref().unwrap_or_default(), &kind.plural)
                    && has(&rule.verbs, verb)
            })
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_binding_grants_the_tenant_role_to_that_tenants_account_only() {
        let tenant = ClusterId::parse("shop").unwrap();
        let binding = role_binding("web-shop", &tenant, "refract-system");
        assert_eq!(binding["metadata"]["namespace"], "web-shop");
        assert_eq!(binding["roleRef"]["name"], TENANT_ROLE);
        assert_eq!(
            binding["subjects"],
            json!([{"kind": "ServiceAccount", "name": "tenant-shop", "namespace": "refract-system"}])
        );
    }
}
