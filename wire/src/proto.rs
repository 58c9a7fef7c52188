//! The generated `refract.v1` wire types, clients and servers.
#![allow(missing_docs, clippy::all)]

tonic::include_proto!("refract.v1");

/// The encoded file descriptor set of `refract.v1`, served by gRPC server reflection.
pub const FILE_DESCRIPTOR_SET: &[u8] = tonic::include_file_descriptor_set!("refract_descriptor");

/// The wire protocol version this build speaks (see `Hello.protocol_version`).
pub const PROTOCOL_VERSION: u32 = 1;

impl ObjectRef {
    /// A short `kind ns/name` form for logs and errors.
    pub fn display(&self) -> String {
        format!("{} {}/{}", self.kind, self.namespace, self.name)
    }
}

impl Outcome {
    /// Whether this is not an answer to a request but something the provider says on its own
    /// about an object it was sent (asking for it again, restored, quarantined): no one waits
    /// on it, and it carries no revision.
    pub fn is_notice(self) -> bool {
        matches!(
            self,
            Outcome::Resend | Outcome::Drifted | Outcome::Quarantined
        )
    }

    /// The outcome's name in metrics, logs and `refractctl`: lower case, the same in both
    /// agents (`applied`, `quota_exceeded`, ...), never the wire's `OUTCOME_` spelling.
    pub fn label(self) -> &'static str {
        match self {
            Outcome::Unspecified => "unspecified",
            Outcome::Applied => "applied",
            Outcome::Unchanged => "unchanged",
            Outcome::Conflict => "conflict",
            Outcome::Invalid => "invalid",
            Outcome::Denied => "denied",
            Outcome::Transient => "transient",
            Outcome::Resend => "resend",
            Outcome::QuotaExceeded => "quota_exceeded",
            Outcome::Drifted => "drifted",
            Outcome::Quarantined => "quarantined",
        }
    }
}
