//! Reflection policies: which objects are reflected, decided by annotations.

use std::collections::BTreeMap;

use crate::keys::{ALLOW_ANNOTATION, SKIP_ANNOTATION};

/// How a kind decides what to reflect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub enum Policy {
    /// Reflect everything except objects annotated `liqo.io/skip-reflection`.
    #[default]
    DenyList,
    /// Reflect nothing except objects annotated `liqo.io/allow-reflection`.
    AllowList,
}

impl Policy {
    /// Every policy, in the order flags and messages list them.
    pub const ALL: [Policy; 2] = [Policy::DenyList, Policy::AllowList];

    /// The name used in flags, files and messages.
    pub fn as_str(self) -> &'static str {
        match self {
            Policy::DenyList => "DenyList",
            Policy::AllowList => "AllowList",
        }
    }
}

impl std::fmt::Display for Policy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A name that is not a [`Policy`].
#[derive(Debug, thiserror::Error)]
#[error("{0:?} is not a reflection policy: DenyList or AllowList")]
pub struct UnknownPolicy(String);

impl std::str::FromStr for Policy {
    type Err = UnknownPolicy;

    /// The policy of that exact name, as Liqo's values spell it.
    fn from_str(name: &str) -> Result<Self, Self::Err> {
        Policy::ALL
            .into_iter()
            .find(|p| p.as_str() == name)
            .ok_or_else(|| UnknownPolicy(name.to_string()))
    }
}

/// An annotation counts as set when present with any value but (case-insensitive) `false`.
fn is_set(annotations: Option<&BTreeMap<String, String>>, key: &str) -> bool {
    annotations
        .and_then(|a| a.get(key))
        .is_some_and(|v| !v.eq_ignore_ascii_case("false"))
}

/// Why an object is not reflected under `policy`, or `None` if it is.
pub fn skip_reason(
    policy: Policy,
    annotations: Option<&BTreeMap<String, String>>,
) -> Option<String> {
    match policy {
        Policy::DenyList if is_set(annotations, SKIP_ANNOTATION) => {
            Some(format!("annotated {SKIP_ANNOTATION} (policy DenyList)"))
        }
        Policy::AllowList if !is_set(annotations, ALLOW_ANNOTATION) => Some(format!(
            "not annotated {ALLOW_ANNOTATION} (policy AllowList)"
        )),
        _ => None,
    }
}

/// An explicit decision from the object's own annotations, whatever the policy: `Some(true)`
/// to reflect, `Some(false)` to skip, `None` when neither annotation is set.
pub fn forced(annotations: Option<&BTreeMap<String, String>>) -> Result<Option<bool>, String> {
    match (
        is_set(annotations, ALLOW_ANNOTATION),
        is_set(annotations, SKIP_ANNOTATION),
    ) {
        (true, true) => Err(format!(
            "both {ALLOW_ANNOTATION} and {SKIP_ANNOTATION} are set; remove one"
        )),
        (true, false) => Ok(Some(true)),
        (false, true) => Ok(Some(false)),
        (false, false) => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::test_support::string_map as ann;

    #[test]
    fn deny_list_skips_only_annotated_objects() {
        assert!(skip_reason(Policy::DenyList, None).is_none());
        assert!(skip_reason(Policy::DenyList, Some(&ann(&[(SKIP_ANNOTATION, "")]))).is_some());
        assert!(skip_reason(Policy::DenyList, Some(&ann(&[(SKIP_ANNOTATION, "true")]))).is_some());
        assert!(skip_reason(Policy::DenyList, Some(&ann(&[(SKIP_ANNOTATION, "FALSE")]))).is_none());
    }

    #[test]
    fn allow_list_reflects_only_annotated_objects() {
        assert!(skip_reason(Policy::AllowList, None).is_some());
        assert!(skip_reason(Policy::AllowList, Some(&ann(&[(ALLOW_ANNOTATION, "yes")]))).is_none());
        assert!(skip_reason(
            Policy::AllowList,
            Some(&ann(&[(ALLOW_ANNOTATION, "false")]))
        )
        .is_some());
    }

    #[test]
    fn forced_decisions() {
        assert_eq!(forced(None), Ok(None));
        assert_eq!(
            forced(Some(&ann(&[(ALLOW_ANNOTATION, "")]))),
            Ok(Some(true))
        );
        assert_eq!(
            forced(Some(&ann(&[(SKIP_ANNOTATION, "1")]))),
            Ok(Some(false))
        );
        assert!(forced(Some(&ann(&[
            (SKIP_ANNOTATION, "1"),
            (ALLOW_ANNOTATION, "1")
        ])))
        .is_err());
    }
}
