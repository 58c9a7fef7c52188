//! Who may call an agent's HTTP endpoints, decided as Kubernetes components decide it: the
//! caller is the owner of a bearer token its cluster's TokenReview accepts (or, for the virtual
//! node's kubelet API, the subject of a client certificate the caller checked), and the
//! cluster's SubjectAccessReview decides whether that user may have the request's [`Access`]:
//! a subresource of a node (the kubelet API) or a path that is no resource (`/metrics`).
//! There is no anonymous access. Answers are reused for a while ([`DecisionCache`],
//! [`token_cache`]).

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use refract_core::lock::Locked;

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};

pub mod token_cache;

/// An authenticated caller.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct User {
    /// The user name.
    pub name: String,
    /// Its groups.
    pub groups: Vec<String>,
    /// Its UID, when the token review gave one.
    pub uid: Option<String>,
    /// Extra attributes from the token review.
    pub extra: BTreeMap<String, Vec<String>>,
}

/// Why a request is not let in.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    /// No credentials: neither a bearer token nor (where one is taken) a client certificate.
    #[error("Unauthorized: no credentials (a bearer token, or a client certificate where taken)")]
    Anonymous,
    /// The token was not accepted.
    #[error("Unauthorized: {0}")]
    BadToken(String),
    /// The user may not do this.
    #[error("Forbidden (user={user}, {access}): {reason}")]
    Forbidden {
        /// Who.
        user: String,
        /// What, as the reviewer was asked (`verb=get, path=/metrics`).
        access: String,
        /// The reviewer's reason.
        reason: String,
    },
    /// The caller's address failed to authenticate too often lately.
    #[error("Too many failed authentications from this address; try again in a few seconds")]
    TooManyFailures,
    /// The cluster's API server could not be asked.
    #[error("the API server could not review the request: {0}")]
    Review(#[from] kube::Error),
}

impl AuthError {
    /// The HTTP status that answers a request refused for this.
    pub fn http_status(&self) -> axum::http::StatusCode {
        use axum::http::StatusCode;
        match self {
            AuthError::Anonymous | AuthError::BadToken(_) => StatusCode::UNAUTHORIZED,
            AuthError::Forbidden { .. } => StatusCode::FORBIDDEN,
            AuthError::TooManyFailures => StatusCode::TOO_MANY_REQUESTS,
            AuthError::Review(_) => StatusCode::SERVICE_UNAVAILABLE,
        }
    }
}

/// Reads a bearer token from an `Authorization` header value.
pub fn bearer(header: Option<&str>) -> Option<&str> {
    let value = header?.trim();
    let (scheme, token) = value.split_once(' ')?;
    (scheme.eq_ignore_ascii_case("bearer") && !token.trim().is_empty()).then(|| token.trim())
}

/// Authenticates a bearer token with the cluster's TokenReview.
pub async fn review_token(client: &kube::Client, token: &str) -> Result<User, AuthError> {
    let review = TokenReview {
        spec: TokenReviewSpec {
            token: Some(token.to_string()),
            audiences: None,
        },
        ..Default::default()
    };
    let answer = Api::<TokenReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await?;
    let status = answer.status.unwrap_or_default();
    if status.authenticated != Some(true) {
        return Err(AuthError::BadToken(
            status.error.unwrap_or_else(|| "token not accepted".into()),
        ));
    }
    let user = status.user.unwrap_or_default();
    Ok(User {
        name: user.username.unwrap_or_default(),
        groups: user.groups.unwrap_or_default(),
        uid: user.uid,
        extra: user.extra.unwrap_or_default(),
    })
}

/// How long an allowed decision is reused, as a kubelet's webhook authorizer does by default.
const ALLOWED_TTL: Duration = Duration::from_secs(300);
/// How long a denial is reused, as a kubelet's webhook authorizer does by default: a grant
/// takes effect within this.
const DENIED_TTL: Duration = Duration::from_secs(30);
/// Decisions remembered at most; the older ones are dropped beyond that.
const MAX_DECISIONS: usize = 1024;

/// A decision's subject and attributes: user, groups, UID, extras, and the access.
type DecisionKey = (
    String,
    Vec<String>,
    Option<String>,
    BTreeMap<String, Vec<String>>,
    String,
);

/// A decision and when it was made: `None` when allowed, the reviewer's reason when denied.
type Decision = (Instant, Option<String>);

/// Recent decisions, so that a busy caller (the API server) is not reviewed on every request,
/// nor a refused one on each of its retries.
#[derive(Default)]
pub struct DecisionCache {
    decided: Mutex<HashMap<DecisionKey, Decision>>,
}

fn fresh((at, denied): &Decision) -> bool {
    at.elapsed()
        < if denied.is_none() {
            ALLOWED_TTL
        } else {
            DENIED_TTL
        }
}

impl DecisionCache {
    /// Like [`authorize`], reusing an allowed decision younger than five minutes and a denial
    /// younger than thirty seconds.
    pub async fn authorize(
        &self,
        client: &kube::Client,
        user: &User,
        access: &Access<'_>,
    ) -> Result<(), AuthError> {
        let key = (
            user.name.clone(),
            user.groups.clone(),
            user.uid.clone(),
            user.extra.clone(),
            access.to_string(),
        );
        let forbidden = |reason: String| AuthError::Forbidden {
            user: user.name.clone(),
            access: access.to_string(),
            reason,
        };
        {
            let decided = self.decided.locked();
            if let Some(decision) = decided.get(&key).filter(|d| fresh(d)) {
                return match &decision.1 {
                    None => Ok(()),
                    Some(reason) => Err(forbidden(reason.clone())),
                };
            }
        }
        let result = authorize(client, user, access).await;
        let denied = match &result {
            Ok(()) => None,
            Err(AuthError::Forbidden { reason, .. }) => Some(reason.clone()),
            Err(_) => return result, // not a decision: asked again next time
        };
        let mut decided = self.decided.locked();
        if decided.len() >= MAX_DECISIONS {
            decided.retain(|_, d| fresh(d));
            if decided.len() >= MAX_DECISIONS {
                decided.clear();
            }
        }
        decided.insert(key, (Instant::now(), denied));
        result
    }
}

/// What a request does, in authorization terms.
#[derive(Debug, Clone, Copy)]
pub enum Access<'a> {
    /// A subresource of a node (the kubelet API).
    Node {
        /// `get`, `create`, ...
        verb: &'a str,
        /// The `nodes` subresource: `proxy`, `stats` or `metrics`.
        subresource: &'a str,
        /// The node's name.
        node: &'a str,
    },
    /// A path that is no resource, such as an agent's `/metrics`.
    Path {
        /// `get`, ...
        verb: &'a str,
        /// The path.
        path: &'a str,
    },
}

impl std::fmt::Display for Access<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Access::Node {
                verb,
                subresource,
                node,
            } => write!(
                f,
                "verb={verb}, resource=nodes, subresource={subresource}, name={node}"
            ),
            Access::Path { verb, path } => write!(f, "verb={verb}, path={path}"),
        }
    }
}

/// Asks the cluster whether `user` may have `access`.
pub async fn authorize(
    client: &kube::Client,
    user: &User,
    access: &Access<'_>,
) -> Result<(), AuthError> {
    let mut spec = SubjectAccessReviewSpec {
        user: Some(user.name.clone()),
        groups: Some(user.groups.clone()),
        uid: user.uid.clone(),
        extra: (!user.extra.is_empty()).then(|| user.extra.clone()),
        ..Default::default()
    };
    match *access {
        Access::Node {
            verb,
            subresource,
            node,
        } => {
            spec.resource_attributes = Some(ResourceAttributes {
                verb: Some(verb.to_string()),
                resource: Some("nodes".into()),
                subresource: Some(subresource.to_string()),
                name: Some(node.to_string()),
                ..Default::default()
            });
        }
        Access::Path { verb, path } => {
            spec.non_resource_attributes = Some(NonResourceAttributes {
                verb: Some(verb.to_string()),
                path: Some(path.to_string()),
            });
        }
    }
    let review = SubjectAccessReview {
        spec,
        ..Default::default()
    };
    let answer = Api::<SubjectAccessReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await?;
    let status = answer.status.unwrap_or_default();
    if status.allowed {
        return Ok(());
    }
    Err(AuthError::Forbidden {
        user: user.name.clone(),
        access: access.to_string(),
        reason: status.reason.unwrap_or_default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bearer_tokens_are_read() {
        assert_eq!(bearer(Some("Bearer abc")), Some("abc"));
        assert_eq!(bearer(Some("bearer  abc ")), Some("abc"));
        assert_eq!(bearer(Some("Basic abc")), None);
        assert_eq!(bearer(Some("Bearer ")), None);
        assert_eq!(bearer(None), None);
    }
}
