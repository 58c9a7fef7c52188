//! Every label, annotation and field-manager name the agents and `refractctl` read or write,
//! in one place, so that a key is spelled once and its meaning is written next to it.
//!
//! User-facing keys are Liqo's, spelled as the seed documents spell them; Refract's own
//! bookkeeping keys live under `offloading.refract.io/` and `refract.io/`; Kubernetes' own
//! well-known keys close the file.

/// Field manager of everything the remote agent applies.
pub const REMOTE_FIELD_MANAGER: &str = "refract-remote-agent";
/// Field manager of everything the local agent applies in the origin cluster.
pub const LOCAL_FIELD_MANAGER: &str = "refract-local-agent";
/// Field manager of status the local agent applies. Separate from [`LOCAL_FIELD_MANAGER`]:
/// older API servers drop fields a manager owns outside `status` when the same manager applies
/// through the status subresource.
pub const LOCAL_STATUS_FIELD_MANAGER: &str = "refract-local-agent-status";
/// Field manager of status the remote agent applies (see [`LOCAL_STATUS_FIELD_MANAGER`]).
pub const REMOTE_STATUS_FIELD_MANAGER: &str = "refract-remote-agent-status";
/// Field manager of the pods the remote agent's ShadowPod controller creates and of their
/// labels and annotations: which label and annotation keys it set is read back from it.
pub const SHADOWPOD_FIELD_MANAGER: &str = "refract-shadowpod";

/// Label on provider objects: the origin cluster id (the tenant).
pub const ORIGIN_LABEL: &str = "offloading.refract.io/origin";
/// Label on provider objects: the provider cluster id they were reflected to.
pub const DESTINATION_LABEL: &str = "offloading.refract.io/destination";
/// Label on provider namespaces owned by a tenant: the tenant's cluster id.
pub const TENANT_NAMESPACE_LABEL: &str = "refract.io/tenant";

/// The provider ServiceAccount a tenant's objects are written as (in the remote agent's own
/// namespace): `tenant-<cluster id>`.
pub fn tenant_account(tenant: &str) -> String {
    format!("tenant-{tenant}")
}

/// The Lease the local agents of one peering elect their leader on (in the agents'
/// namespace): one per provider, so that peerings sharing a namespace never contend.
pub fn local_agent_lease(remote_cluster_id: &str) -> String {
    format!("refract-local-agent-{remote_cluster_id}")
}

/// ShadowPod annotation: the phase (`Succeeded` or `Failed`) the origin pod finished in. The
/// remote agent never starts a pod for a ShadowPod carrying it: a finished pod is never run
/// again, even when its ShadowPod or its provider pod was lost meanwhile.
pub const ORIGIN_FINISHED_ANNOTATION: &str = "offloading.refract.io/origin-finished";
/// Annotation on provider objects: hash of the desired state last applied.
pub const DESIRED_HASH_ANNOTATION: &str = "refract.io/desired-hash";
/// Annotation on provider objects: hash of the Upsert bytes the tenant sent for the object
/// ([`crate::hash::bytes_hash`]), from which a reconnecting local agent learns what the provider
/// holds without sending it again ([`crate::hash::bucket_digest`]).
pub const ORIGIN_HASH_ANNOTATION: &str = "refract.io/origin-hash";
/// Annotation on a twin namespace: the origin namespace it mirrors. Two origin namespaces never
/// share a twin: the remote agent refuses a twin that already mirrors another namespace.
pub const ORIGINAL_NAME_ANNOTATION: &str = "refract.io/original-name";

/// Annotation on a tenant namespace being removed (unpeer, expiry, `remote-agent
/// remove-tenant`): why. A remote agent that sees it stops restoring the tenant's objects.
pub const TENANT_REMOVAL_ANNOTATION: &str = "refract.io/tenant-removal";
/// Annotation on the virtual node asking its local agent to unpeer: `graceful` (drain the
/// offloaded pods, have the provider remove the tenant, then remove the node) or `forced`
/// (stop the link and clean up the origin without asking the provider). Set by
/// `local-agent unpeer`.
pub const UNPEER_ANNOTATION: &str = "refract.io/unpeer";
/// Annotation on the virtual node: how far its unpeering has come, in words.
pub const UNPEER_PROGRESS_ANNOTATION: &str = "refract.io/unpeer-progress";

// Refract's own labels and annotations on reflected objects.

/// ShadowPod label: the origin pod's UID, so status flows back only to that pod.
pub const ORIGIN_UID_LABEL: &str = "offloading.refract.io/origin-uid";
/// ShadowPod label: the virtual node the pod was bound to.
pub const NODE_NAME_LABEL: &str = "offloading.refract.io/nodename";
/// Token Secret label: the service account the tokens are for. Its presence marks the Secret
/// as a token Secret on the provider.
pub const SERVICE_ACCOUNT_LABEL: &str = "offloading.refract.io/service-account-name";
/// Token Secret annotation: the pod the tokens are bound to.
pub const FOR_POD_ANNOTATION: &str = "offloading.refract.io/service-account-for-pod-name";
/// Token Secret annotation: that pod's origin UID.
pub const FOR_POD_UID_ANNOTATION: &str = "offloading.refract.io/service-account-for-pod-uid";
/// Token Secret annotation: the earliest expiry of its tokens (RFC 3339).
pub const EXPIRATION_ANNOTATION: &str = "offloading.refract.io/service-account-expiration";
/// Label on the provider pods the remote agent's ShadowPod controller created.
pub const MANAGED_BY_LABEL: &str = "refract.io/managed-by";
/// Origin PV annotation: the provider PV it stands for.
pub const REMOTE_VOLUME_ANNOTATION: &str = "offloading.refract.io/remote-volume";

// Refract's labels and annotations on tenants and peerings.

/// Annotation on a tenant's namespaces: when its origin was last seen disconnecting (RFC 3339).
/// Written only when `--tenant-expiry` is set; it is what a restarted agent measures from.
pub const LAST_SEEN_ANNOTATION: &str = "refract.io/tenant-last-seen";
/// The origin-side label naming the provider a local agent and its Secrets serve.
pub const PEERING_LABEL: &str = "refract.io/peering";

// Liqo's keys that users set on their objects and namespaces (the seed documents' names).

/// The annotation that excludes an object under [`crate::policy::Policy::DenyList`].
pub const SKIP_ANNOTATION: &str = "liqo.io/skip-reflection";
/// The annotation that includes an object under [`crate::policy::Policy::AllowList`].
pub const ALLOW_ANNOTATION: &str = "liqo.io/allow-reflection";
/// Pod annotation choosing an anti-affinity preset: `propagate`, `soft` or `hard`.
pub const ANTI_AFFINITY_PRESET_ANNOTATION: &str = "liqo.io/anti-affinity-preset";
/// Pod annotation listing the label keys the preset matches on (comma-separated).
pub const ANTI_AFFINITY_LABELS_ANNOTATION: &str = "liqo.io/anti-affinity-labels";
/// Annotation of an origin pod naming the RuntimeClass its provider pod runs with.
pub const REMOTE_RUNTIME_CLASS_ANNOTATION: &str = "liqo.io/remote-runtime-class-name";
/// Pod annotation: `disabled` turns API server support off for this pod; `remote` has it talk
/// to the provider's API server instead of the origin's
/// ([`crate::forge::token::ApiServerAccess::Provider`]).
pub const API_SERVER_SUPPORT_ANNOTATION: &str = "liqo.io/api-server-support";
/// Pod annotation: the provider ServiceAccount a pod with `api-server-support: remote` runs as
/// (default: the pod's own ServiceAccount name).
pub const REMOTE_SERVICE_ACCOUNT_ANNOTATION: &str = "liqo.io/remote-service-account-name";
/// Claim annotation overriding the provider storage class for this claim.
pub const REMOTE_STORAGE_CLASS_ANNOTATION: &str = "liqo.io/remote-storage-class";
/// Claim annotation overriding the access modes on the provider (comma-separated).
pub const REMOTE_ACCESS_MODES_ANNOTATION: &str = "liqo.io/remote-access-modes";
/// Keeps the origin's node ports on the provider when `"true"`.
pub const FORCE_NODE_PORT_ANNOTATION: &str = "liqo.io/force-remote-node-port";
/// The namespace label the pod webhook's `namespaceSelector` matches.
pub const SCHEDULING_LABEL: &str = "liqo.io/scheduling-enabled";

// The virtual node's labels and taint (Liqo's names).

/// Node label every virtual node carries.
pub const VIRTUAL_NODE_TYPE_LABEL: &str = "liqo.io/type";
/// Its value.
pub const VIRTUAL_NODE_TYPE: &str = "virtual-node";
/// Node label naming the provider a virtual node stands for.
pub const REMOTE_CLUSTER_ID_LABEL: &str = "liqo.io/remote-cluster-id";
/// The taint every virtual node carries.
pub const VIRTUAL_NODE_TAINT_KEY: &str = "virtual-node.liqo.io/not-allowed";

// Kubernetes' own keys that Refract reads or writes.

/// Label naming an EndpointSlice's Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";
/// Label naming an EndpointSlice's controller.
pub const ENDPOINTSLICE_MANAGED_BY_LABEL: &str = "endpointslice.kubernetes.io/managed-by";
/// Annotation Kubernetes uses to tell which provisioner made a PV.
pub const PROVISIONED_BY_ANNOTATION: &str = "pv.kubernetes.io/provisioned-by";
/// Set by the scheduler on a claim of a WaitForFirstConsumer class: the node of its first pod.
pub const SELECTED_NODE_ANNOTATION: &str = "volume.kubernetes.io/selected-node";
/// kubectl's copy of the whole object, never reflected (see the default skip list): often as
/// large as the object itself.
pub const LAST_APPLIED_ANNOTATION: &str = "kubectl.kubernetes.io/last-applied-configuration";
/// Annotation naming the ServiceAccount whose token the provider's token controller writes
/// into a Secret of type `kubernetes.io/service-account-token`.
pub const SERVICE_ACCOUNT_NAME_ANNOTATION: &str = "kubernetes.io/service-account.name";
/// The Pod Security Admission label the remote agent sets on tenant namespaces.
pub const PSA_ENFORCE_LABEL: &str = "pod-security.kubernetes.io/enforce";
