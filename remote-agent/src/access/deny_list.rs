//! The tenant deny list (`--tenant-deny-list`): the tenants, or single client certificates, the
//! provider's operator has cut off. Parsing is pure; [`super::Access`] applies it.
//!
//! One entry per line; `#` starts a comment:
//!
//! ```text
//! # every certificate of this tenant
//! shop-cluster
//! # one certificate, by its serial number (hex, colons and case ignored)
//! serial:5f:3a:0c:91
//! ```

use std::collections::BTreeSet;

use refract_shared::tls::ClusterId;

/// Tenants and certificate serials that may not call.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DenyList {
    tenants: BTreeSet<ClusterId>,
    serials: BTreeSet<String>,
}

/// A line of the deny list that is not an entry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {reason}")]
pub struct DenyListError {
    /// The line number, from 1.
    pub line: usize,
    /// What is wrong with it.
    pub reason: String,
}

impl DenyList {
    /// Parses the file's text.
    pub fn parse(text: &str) -> Result<Self, DenyListError> {
        let mut list = Self::default();
        for (i, raw) in text.lines().enumerate() {
            let entry = raw.split('#').next().unwrap_or_default().trim();
            if entry.is_empty() {
                continue;
            }
            let error = |reason: String| DenyListError {
                line: i + 1,
                reason,
            };
            match entry.strip_prefix("serial:") {
                Some(serial) => {
                    let serial = normalize_serial(serial).ok_or_else(|| {
                        error(format!("{serial:?} is not a hexadecimal serial number"))
                    })?;
                    list.serials.insert(serial);
                }
                None => {
                    let id = ClusterId::parse(entry)
                        .map_err(|e| error(format!("{entry:?} is not a cluster id: {e}")))?;
                    list.tenants.insert(id);
                }
            }
        }
        Ok(list)
    }

    /// Why a caller with certificate identity `tenant` and serial `serial` is refused, if it
    /// is.
    pub fn refusal(&self, tenant: Option<&ClusterId>, serial: &str) -> Option<String> {
        if let Some(tenant) = tenant.filter(|t| self.tenants.contains(*t)) {
            return Some(format!(
                "tenant {tenant} is cut off by this provider (--tenant-deny-list)"
            ));
        }
        let serial = normalize_serial(serial)?;
        self.serials.contains(&serial).then(|| {
            format!("client certificate serial {serial} is revoked by this provider (--tenant-deny-list)")
        })
    }

    /// How many entries the list has.
    pub fn len(&self) -> usize {
        self.tenants.len() + self.serials.len()
    }

    /// Whether the list is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A serial number in one spelling: lowercase hex without separators or leading zeros.
fn normalize_serial(serial: &str) -> Option<String> {
    let hex: String = serial
        .trim()
        .chars()
        .filter(|c| *c != ':')
        .map(|c| c.to_ascii_lowercase())
        .collect();
    if hex.is_empty() || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
        return None;
    }
    let trimmed = hex.trim_start_matches('0');
    Some(if trimmed.is_empty() { "0" } else { trimmed }.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(s: &str) -> ClusterId {
        ClusterId::parse(s).unwrap()
    }

    #[test]
    fn tenants_and_serials_with_comments() {
        let list = DenyList::parse("# cut off\nshop-cluster  # for good\n\nserial:00:5F:3a\n   \n")
            .unwrap();
        assert_eq!(list.len(), 2);
        assert!(list
            .refusal(Some(&id("shop-cluster")), "01")
            .unwrap()
            .contains("tenant shop-cluster is cut off"));
        assert!(list
            .refusal(Some(&id("other")), "5f:3a")
            .unwrap()
            .contains("serial 5f3a is revoked"));
        assert_eq!(list.refusal(Some(&id("other")), "5f:3b"), None);
        assert_eq!(list.refusal(None, "zz"), None);
        assert!(DenyList::parse("").unwrap().is_empty());
    }

    #[test]
    fn bad_lines_are_named() {
        let e = DenyList::parse("ok-cluster\nNot_A_Cluster\n").unwrap_err();
        assert_eq!(e.line, 2);
        assert!(e.reason.contains("Not_A_Cluster"), "{e}");
        let e = DenyList::parse("serial:xyz").unwrap_err();
        assert_eq!(e.line, 1);
        assert!(e.to_string().contains("not a hexadecimal serial"), "{e}");
    }
}
