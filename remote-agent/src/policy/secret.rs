//! Secrets: never one the provider's token controller would fill with a provider
//! ServiceAccount's token.

use refract_core::forge::secret::SA_TOKEN_TYPE;
use refract_core::keys::SERVICE_ACCOUNT_NAME_ANNOTATION;

use super::Violation;

/// Refuses Secrets that would hold the provider's credentials.
pub(super) fn check(secret: &serde_json::Value) -> Result<(), Violation> {
    if secret["type"].as_str() == Some(SA_TOKEN_TYPE) {
        return Err(Violation::new(
            "type",
            format!(
                "{SA_TOKEN_TYPE} Secrets would be filled with a provider ServiceAccount's token"
            ),
        ));
    }
    if !secret["metadata"]["annotations"][SERVICE_ACCOUNT_NAME_ANNOTATION].is_null() {
        return Err(Violation::new(
            format!("metadata.annotations[{SERVICE_ACCOUNT_NAME_ANNOTATION}]"),
            "names a provider ServiceAccount",
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn service_account_token_secrets_are_refused() {
        assert!(check(&json!({"type": SA_TOKEN_TYPE, "metadata": {}})).is_err());
        let named =
            json!({"metadata": {"annotations": {SERVICE_ACCOUNT_NAME_ANNOTATION: "default"}}});
        assert!(check(&named).is_err());
        assert_eq!(check(&json!({"type": "Opaque", "metadata": {}})), Ok(()));
    }
}
