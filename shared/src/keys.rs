//! Label, annotation and field-manager names, in one place.
//!
//! User-facing keys are Liqo's, spelled as the seed documents spell them; Refract's own
//! bookkeeping keys live under `offloading.refract.io/` and `refract.io/`.

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
