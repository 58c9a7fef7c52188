//! How the remote agent writes each kind of tenant object, and so what it keeps of it: the one
//! place the write mode is chosen.
//!
//! A kind is written one of two ways ([`Strategy`]): server-side apply, or (ConfigMaps, plain
//! Secrets and Services, see [`super::merge`]) a POST and JSON merge patches, which cost the
//! API server less. A write is made for one of three purposes ([`Purpose`]); the two together
//! give the request ([`Mode`]). The desired-state store is told what to keep ([`keep`]) and
//! never learns how writes are made.

use refract_core::options::Kind;

use super::desired::Keep;
use super::tokens::is_token_secret;
use super::write::Mode;
use crate::kinds::Allowed;

/// How objects of a kind are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Strategy {
    /// Server-side apply: the API server tracks which fields the agent set.
    ServerSideApply,
    /// A POST to create, then merge patches that set every desired field and remove the keys
    /// the agent set before and the origin dropped ([`super::merge`]).
    PostAndMerge,
}

/// What a write is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Purpose {
    /// The object is believed absent: create it. `guarded` when this kind's API takes a
    /// guarded create, which never takes over an object created a moment ago by someone else;
    /// otherwise the object was read first and found absent.
    Create { guarded: bool },
    /// The object exists and is the tenant's: make it the desired state.
    Update,
    /// Put back the whole remembered object over a copy changed on the provider, only if
    /// nothing wrote the copy since it was seen (a resourceVersion precondition).
    Restore,
}

impl Strategy {
    /// How objects of `kind` are written; `token` when the object is a pod's token Secret,
    /// which keeps server-side apply because the provider's token controller writes its data.
    pub(crate) fn of(kind: Allowed, token: bool) -> Self {
        let shallow = matches!(
            kind,
            Allowed::Reflected(Kind::ConfigMap)
                | Allowed::Reflected(Kind::Secret)
                | Allowed::Reflected(Kind::Service)
        );
        if shallow && !token {
            Strategy::PostAndMerge
        } else {
            Strategy::ServerSideApply
        }
    }

    /// The request that writes an object of this strategy for `purpose`.
    ///
    /// A restore always applies: it writes a whole object with a precondition, and the only
    /// objects the provider restores alone are kept whole ([`keep`]), all applied.
    pub(crate) fn mode(self, purpose: Purpose) -> Mode {
        match (self, purpose) {
            (Strategy::PostAndMerge, Purpose::Create { .. }) => Mode::Create,
            (Strategy::PostAndMerge, Purpose::Update) => Mode::Merge,
            (Strategy::ServerSideApply, Purpose::Create { guarded: true }) => Mode::CreateOnly,
            (Strategy::ServerSideApply, Purpose::Create { guarded: false })
            | (Strategy::ServerSideApply, Purpose::Update)
            | (_, Purpose::Restore) => Mode::Apply,
        }
    }
}

/// What the desired-state store keeps of an object, by how it is written and restored: twin
/// namespaces, ShadowPods and pods' token Secrets whole (the provider restores them alone,
/// keeping pods running while the link is down), an object written with merge patches the keys
/// it sets (see [`super::merge`]), any other only its hash (restored from the origin).
pub(crate) fn keep(kind: Allowed, object: &serde_json::Value) -> Keep {
    let token = is_token_secret(kind, object);
    if matches!(kind, Allowed::Namespace | Allowed::ShadowPod) || token {
        Keep::Whole
    } else if Strategy::of(kind, token) == Strategy::PostAndMerge {
        Keep::HashAndKeys
    } else {
        Keep::Hash
    }
}

/// Whether the watch of tenant objects of `kind` keeps the agent's managedFields entries,
/// which a merge patch of that kind reads to know the keys the agent set (see
/// [`super::merge`]).
pub fn needs_managed_fields(kind: Allowed) -> bool {
    Strategy::of(kind, false) == Strategy::PostAndMerge
}

#[cfg(test)]
mod tests {
    use super::*;
    use refract_core::keys::SERVICE_ACCOUNT_LABEL;
    use serde_json::json;

    #[test]
    fn only_plain_configmaps_secrets_and_services_skip_server_side_apply() {
        let of = |kind, token| Strategy::of(Allowed::Reflected(kind), token);
        assert_eq!(of(Kind::ConfigMap, false), Strategy::PostAndMerge);
        assert_eq!(of(Kind::Secret, false), Strategy::PostAndMerge);
        assert_eq!(of(Kind::Secret, true), Strategy::ServerSideApply);
        assert_eq!(of(Kind::Service, false), Strategy::PostAndMerge);
        assert_eq!(of(Kind::EndpointSlice, false), Strategy::ServerSideApply);
        assert_eq!(
            Strategy::of(Allowed::ShadowPod, false),
            Strategy::ServerSideApply
        );
        assert_eq!(
            Strategy::of(Allowed::Namespace, false),
            Strategy::ServerSideApply
        );
    }

    #[test]
    fn each_purpose_has_one_mode_per_strategy() {
        use Purpose::*;
        use Strategy::*;
        let table = [
            (PostAndMerge, Create { guarded: true }, Mode::Create),
            // A POST never takes over an existing object: it needs no guard.
            (PostAndMerge, Create { guarded: false }, Mode::Create),
            (PostAndMerge, Update, Mode::Merge),
            (PostAndMerge, Restore, Mode::Apply),
            (ServerSideApply, Create { guarded: true }, Mode::CreateOnly),
            (ServerSideApply, Create { guarded: false }, Mode::Apply),
            (ServerSideApply, Update, Mode::Apply),
            (ServerSideApply, Restore, Mode::Apply),
        ];
        for (strategy, purpose, mode) in table {
            assert_eq!(strategy.mode(purpose), mode, "{strategy:?} {purpose:?}");
        }
    }

    #[test]
    fn the_writer_decides_what_the_desired_store_keeps() {
        let plain = json!({"metadata": {"name": "x"}});
        let token = json!({"metadata": {"labels": {SERVICE_ACCOUNT_LABEL: "default"}}});
        // Restored on the provider alone, so pods keep running while the link is down.
        assert_eq!(keep(Allowed::ShadowPod, &plain), Keep::Whole);
        assert_eq!(keep(Allowed::Namespace, &plain), Keep::Whole);
        assert_eq!(keep(Allowed::Reflected(Kind::Secret), &token), Keep::Whole);
        // Written with merge patches: the keys the next patch removes if the origin drops them.
        for kind in [Kind::ConfigMap, Kind::Secret, Kind::Service] {
            assert_eq!(keep(Allowed::Reflected(kind), &plain), Keep::HashAndKeys);
        }
        // Server-side apply tracks its fields itself.
        assert_eq!(keep(Allowed::Reflected(Kind::Ingress), &plain), Keep::Hash);
        assert_eq!(
            keep(Allowed::Reflected(Kind::ConfigMap), &token),
            Keep::HashAndKeys
        );
        assert!(needs_managed_fields(Allowed::Reflected(Kind::Service)));
        assert!(!needs_managed_fields(Allowed::ShadowPod));
    }
}
