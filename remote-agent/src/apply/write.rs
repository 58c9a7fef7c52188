//! The one write the remote agent makes of a tenant object: a server-side apply, optionally
//! guarded so that it can only create, or for the kinds of [`super::merge`] a create or a merge
//! patch.
//!
//! Only the written resourceVersion is read back from the API server's answer: the rest of the
//! object (several KiB, parsed into a tree by `Api::patch`) is of no use to the agent.

use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::Request;
use refract_core::keys::REMOTE_FIELD_MANAGER;
use serde::Deserialize;

use super::ApplyError;

/// A resourceVersion no stored object can have (the largest the API server parses). An apply
/// carrying it creates the object when it is absent, and when it is present fails with 409
/// without writing, as an optimistic-concurrency precondition does: a create in one request,
/// which can never take over an object created a moment ago by someone else.
const ABSENT_GUARD: &str = "18446744073709551615";

/// How an object is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mode {
    /// Server-side apply with force: creates or updates the fields Refract owns.
    Apply,
    /// The same apply, but only if the object does not exist yet.
    CreateOnly,
    /// A plain create (POST): only if the object does not exist yet.
    Create,
    /// A JSON merge patch (the object written is the patch, see [`super::merge`]).
    Merge,
}

/// Why a write did not happen.
#[derive(Debug)]
pub(super) enum Refused {
    /// `CreateOnly`, and the object exists.
    Exists,
    /// `CreateOnly`, and this kind's API refuses a resourceVersion on create (Services up to
    /// Kubernetes 1.22 are not stored by the generic registry); nothing was written.
    GuardUnsupported,
    /// Any other failure, as the tenant is told.
    Failed(ApplyError),
}

impl Refused {
    /// The error the tenant is told.
    pub(super) fn into_error(self) -> ApplyError {
        match self {
            Refused::Failed(error) => error,
            Refused::Exists => ApplyError::Transient("the object exists already".into()),
            Refused::GuardUnsupported => {
                ApplyError::Transient("the API refused a guarded create".into())
            }
        }
    }
}

#[derive(Deserialize)]
struct Written {
    metadata: WrittenMeta,
}

#[derive(Deserialize)]
struct WrittenMeta {
    #[serde(rename = "resourceVersion")]
    resource_version: Option<String>,
}

/// Writes `desired` as `name` through `api`; returns the written resourceVersion.
pub(super) async fn write(
    api: &Api<DynamicObject>,
    name: &str,
    mut desired: serde_json::Value,
    mode: Mode,
) -> Result<Option<String>, Refused> {
    let url = api.resource_url();
    let request = match mode {
        Mode::Apply | Mode::CreateOnly => {
            if mode == Mode::CreateOnly {
                desired["metadata"]["resourceVersion"] = ABSENT_GUARD.into();
            }
            let params = PatchParams::apply(REMOTE_FIELD_MANAGER).force();
            Request::new(url).patch(name, &params, &Patch::Apply(&desired))
        }
        Mode::Create => {
            let params = PostParams {
                field_manager: Some(REMOTE_FIELD_MANAGER.into()),
                ..PostParams::default()
            };
            serde_json::to_vec(&desired)
                .map_err(kube::core::request::Error::SerializeBody)
                .and_then(|body| Request::new(url).create(&params, body))
        }
        Mode::Merge => {
            let params = PatchParams {
                field_manager: Some(REMOTE_FIELD_MANAGER.into()),
                ..PatchParams::default()
            };
            Request::new(url).patch(name, &params, &Patch::Merge(&desired))
        }
    };
    let request = request.map_err(|e| Refused::Failed(kube::Error::BuildRequest(e).into()))?;
    let creates = matches!(mode, Mode::CreateOnly | Mode::Create);
    // The client `api` acts as: the tenant's own identity for its objects.
    let client = kube::Client::from(api.clone());
    match client.request::<Written>(request).await {
        Ok(written) => Ok(written.metadata.resource_version),
        Err(kube::Error::Api(s)) if creates && s.code == 409 => Err(Refused::Exists),
        Err(kube::Error::Api(s))
            if mode == Mode::CreateOnly
                && s.message
                    .contains("resourceVersion should not be set on objects to be created") =>
        {
            Err(Refused::GuardUnsupported)
        }
        Err(e) => Err(Refused::Failed(e.into())),
    }
}
