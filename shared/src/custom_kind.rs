//! How the Kubernetes API names a custom kind's objects, for both agents' dynamic requests.

use kube::api::ApiResource;
use refract_core::custom_kind::CustomKind;

/// The API resource of `kind`'s objects.
pub fn api_resource(kind: CustomKind) -> ApiResource {
    let name = kind.name();
    ApiResource {
        group: name.group.clone(),
        version: name.version.clone(),
        api_version: name.api_version(),
        kind: name.kind.clone(),
        plural: name.plural.clone(),
    }
}
