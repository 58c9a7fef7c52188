//! What a request came to: [`Applied`] or a typed [`ApplyError`]. Only the gRPC edge turns
//! them into the wire's `Outcome` and message ([`answer`]).

use refract_shared::tls::ClusterId;
use refract_wire::proto::Outcome;

use crate::policy::Violation;

/// A request that needed no refusal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Applied {
    /// The object was written.
    Written,
    /// The provider already held the desired state: nothing was written.
    Unchanged,
    /// The object was deleted.
    Deleted,
    /// The object to delete was not there.
    AlreadyAbsent,
    /// The object to collect was written since it was listed, so it stays.
    WrittenSince,
    /// The deletion waits for a grace period; why and until when.
    Deferred(String),
}

/// Why a request was not applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApplyError {
    /// The request or its object cannot be decoded, or does not match its envelope.
    #[error("{0}")]
    Malformed(String),
    /// The object is larger than the provider accepts.
    #[error("the object is {size} bytes, over the provider's limit of {limit} bytes")]
    TooLarge {
        /// The object's size.
        size: usize,
        /// The limit.
        limit: usize,
    },
    /// Tenants may not write this kind at all.
    #[error("{api_version} {kind} is not a kind tenants may write")]
    KindNotAllowed {
        /// The request's apiVersion.
        api_version: String,
        /// The request's kind.
        kind: String,
    },
    /// The provider does not serve this custom kind (its CustomResourceDefinition is not
    /// installed).
    #[error("the provider does not serve {api_version} {plural} (is its CustomResourceDefinition installed?)")]
    KindNotServed {
        /// The kind's apiVersion.
        api_version: String,
        /// The kind's resource name.
        plural: String,
    },
    /// The namespace is not one of the tenant's.
    #[error("namespace {namespace:?} is not a namespace of tenant {tenant}")]
    NotTenantNamespace {
        /// The tenant.
        tenant: ClusterId,
        /// The namespace named.
        namespace: String,
    },
    /// The tenant's policy on this provider forbids the object.
    #[error("refused by the provider's policy: {0}")]
    Policy(#[from] Violation),
    /// The tenant may not use something the object refers to.
    #[error("{0}")]
    Reference(String),
    /// An object of the same name is someone else's (or of another sort); left untouched.
    #[error("{0}")]
    Conflict(String),
    /// The provider's API server refused the agent's request (403).
    #[error("provider API refused: {0}")]
    Forbidden(String),
    /// The provider's API server found the object invalid (400, 422).
    #[error("{0}")]
    Rejected(String),
    /// The tenant's quota leaves no room for the object (the remote agent's count, or a
    /// ResourceQuota in the namespace).
    #[error("{0}")]
    Quota(String),
    /// A failure worth retrying.
    #[error("{0}")]
    Transient(String),
}

impl From<crate::quota::Exceeded> for ApplyError {
    fn from(e: crate::quota::Exceeded) -> Self {
        Self::Quota(e.to_string())
    }
}

impl From<kube::Error> for ApplyError {
    fn from(e: kube::Error) -> Self {
        match e {
            kube::Error::Api(s) if s.code == 400 || s.code == 422 => Self::Rejected(s.message),
            // A namespace's ResourceQuota refusing the object: the tenant's quota, counted by
            // Kubernetes.
            kube::Error::Api(s) if s.code == 403 && s.message.contains("exceeded quota") => {
                Self::Quota(s.message)
            }
            kube::Error::Api(s) if s.code == 403 => Self::Forbidden(s.message),
            // Server-side apply's schema check answers 500 for an object it cannot type (such
            // as a Service port without a protocol on Kubernetes 1.20): the same object fails
            // the same way every time, so it is no failure worth retrying.
            kube::Error::Api(s)
                if s.code == 500
                    && s.message.starts_with("failed to create typed patch object") =>
            {
                Self::Rejected(s.message)
            }
            other => Self::Transient(other.to_string()),
        }
    }
}

impl ApplyError {
    /// The wire outcome of this error.
    pub fn outcome(&self) -> Outcome {
        match self {
            Self::Malformed(_) | Self::TooLarge { .. } | Self::Rejected(_) => Outcome::Invalid,
            Self::KindNotAllowed { .. }
            | Self::KindNotServed { .. }
            | Self::NotTenantNamespace { .. }
            | Self::Policy(_)
            | Self::Reference(_)
            | Self::Forbidden(_) => Outcome::Denied,
            Self::Conflict(_) => Outcome::Conflict,
            Self::Quota(_) => Outcome::QuotaExceeded,
            Self::Transient(_) => Outcome::Transient,
        }
    }
}

/// The wire's outcome and message for a request's result.
pub fn answer(result: &Result<Applied, ApplyError>) -> (Outcome, String) {
    match result {
        Ok(Applied::Written | Applied::Deleted) => (Outcome::Applied, String::new()),
        Ok(Applied::Unchanged) => (Outcome::Unchanged, String::new()),
        Ok(Applied::AlreadyAbsent) => (Outcome::Unchanged, "already absent".into()),
        Ok(Applied::WrittenSince) => (Outcome::Unchanged, "written since it was listed".into()),
        Ok(Applied::Deferred(why)) => (Outcome::Unchanged, format!("deletion deferred: {why}")),
        Err(e) => (e.outcome(), e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_map_to_the_wire_at_one_place() {
        let policy = ApplyError::Policy(Violation::new("spec.nodeName", "not allowed"));
        assert_eq!(
            answer(&Err(policy)),
            (
                Outcome::Denied,
                "refused by the provider's policy: spec.nodeName: not allowed".into()
            )
        );
        let big = ApplyError::TooLarge { size: 10, limit: 5 };
        assert_eq!(big.outcome(), Outcome::Invalid);
        assert_eq!(answer(&Ok(Applied::Deleted)).0, Outcome::Applied);
        assert_eq!(answer(&Ok(Applied::AlreadyAbsent)).0, Outcome::Unchanged);
    }
}
