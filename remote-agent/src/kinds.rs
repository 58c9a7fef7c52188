//! The kinds a tenant may write, and how to reach them in the provider's API.

use kube::api::ApiResource;
use refract_core::forge::pod::SHADOWPOD_API_VERSION;
use refract_core::options::Kind;

pub use refract_core::custom_kind as custom;
pub use refract_core::custom_kind::{CustomKind, CustomKindName};

/// A kind the remote agent accepts from tenants.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Allowed {
    /// The tenant's twin namespace itself.
    Namespace,
    /// A pod to keep running (`offloading.refract.io/v1alpha1` ShadowPod).
    ShadowPod,
    /// A namespaced reflected kind: a built-in one, or a custom kind the provider's policy
    /// names ([`custom`]).
    Reflected(Kind),
}

impl Allowed {
    /// Looks up the kind named by a request, checking its apiVersion too.
    pub fn lookup(api_version: &str, kind: &str) -> Option<Self> {
        if kind == "Namespace" && api_version == "v1" {
            return Some(Allowed::Namespace);
        }
        if kind == "ShadowPod" && api_version == SHADOWPOD_API_VERSION {
            return Some(Allowed::ShadowPod);
        }
        Kind::lookup(api_version, kind).map(Allowed::Reflected)
    }

    /// The kind named `kind`, whatever its apiVersion (for operators, who name kinds only).
    pub fn by_kind(kind: &str) -> Option<Self> {
        Self::all().find(|a| a.kind() == kind)
    }

    /// The API resource for dynamic requests.
    pub fn resource(self) -> ApiResource {
        use k8s_openapi::api::{core::v1, discovery, networking};
        match self {
            Allowed::Namespace => ApiResource::erase::<v1::Namespace>(&()),
            Allowed::ShadowPod => ApiResource::erase::<crate::shadowpod::ShadowPod>(&()),
            Allowed::Reflected(Kind::ConfigMap) => ApiResource::erase::<v1::ConfigMap>(&()),
            Allowed::Reflected(Kind::Secret) => ApiResource::erase::<v1::Secret>(&()),
            Allowed::Reflected(Kind::Service) => ApiResource::erase::<v1::Service>(&()),
            Allowed::Reflected(Kind::Ingress) => ApiResource::erase::<networking::v1::Ingress>(&()),
            Allowed::Reflected(Kind::EndpointSlice) => {
                ApiResource::erase::<discovery::v1::EndpointSlice>(&())
            }
            Allowed::Reflected(Kind::PersistentVolumeClaim) => {
                ApiResource::erase::<v1::PersistentVolumeClaim>(&())
            }
            Allowed::Reflected(Kind::Custom(custom)) => {
                refract_shared::custom_kind::api_resource(custom)
            }
        }
    }

    /// Labels every tenant object of this kind carries besides the origin and destination
    /// ones, stamped by the judge, so that the agent's watches tell them from objects others
    /// made in the twin namespaces. The provider's EndpointSlice controller copies a
    /// Service's labels (Refract's included) onto the slices it makes for the pods running
    /// there: only the managed-by label tells a reflected slice from those.
    pub fn own_labels(self) -> &'static [(&'static str, &'static str)] {
        match self {
            Allowed::Reflected(Kind::EndpointSlice) => &[(
                refract_core::keys::ENDPOINTSLICE_MANAGED_BY_LABEL,
                refract_core::forge::endpointslice::MANAGED_BY_REFRACT,
            )],
            _ => &[],
        }
    }

    /// Whether `key` is one of [`Allowed::own_labels`] of any kind.
    pub fn is_own_label(key: &str) -> bool {
        Self::all().any(|kind| kind.own_labels().iter().any(|(k, _)| *k == key))
    }

    /// The Kubernetes kind.
    pub fn kind(self) -> &'static str {
        match self {
            Allowed::Namespace => "Namespace",
            Allowed::ShadowPod => "ShadowPod",
            Allowed::Reflected(k) => k.kind(),
        }
    }

    /// Every allowed kind: the built-in ones and the custom kinds registered.
    pub fn all() -> impl Iterator<Item = Allowed> {
        [Allowed::Namespace, Allowed::ShadowPod]
            .into_iter()
            .chain(Kind::ALL.into_iter().map(Allowed::Reflected))
            .chain(
                custom::registered()
                    .into_iter()
                    .map(|c| Allowed::Reflected(Kind::Custom(c))),
            )
    }
}
