//! The first message of a stream: it must be a Hello naming the cluster the client certificate
//! identifies, in the protocol this agent speaks. Anything else refuses the stream, with the
//! reason counted and the tenant told why.

use refract_shared::tls::ClusterId;
use refract_wire::proto::{local_message, Hello, LocalMessage};
use tonic::Status;

use crate::metrics::StreamRefusal;
use crate::registry::local_kind;

/// Why a stream is refused, as counted and as told to the tenant.
#[derive(Debug)]
pub(super) struct Refusal {
    pub reason: StreamRefusal,
    pub status: Status,
}

/// The stream's Hello if `first` (the stream's first message) is one that `certified` (the
/// cluster of the client certificate) may open a session with.
pub(super) fn accept(certified: &ClusterId, first: LocalMessage) -> Result<Hello, Refusal> {
    let hello = match first.kind {
        Some(local_message::Kind::Hello(hello)) => hello,
        _ => {
            return Err(Refusal {
                reason: StreamRefusal::NoHello,
                status: Status::failed_precondition(format!(
                    "first message must be Hello, got {}",
                    local_kind(&first)
                )),
            })
        }
    };
    if hello.cluster_id != certified.as_str() {
        return Err(Refusal {
            reason: StreamRefusal::IdentityMismatch,
            status: Status::permission_denied(format!(
                "Hello names cluster {:?} but the client certificate identifies {:?}",
                hello.cluster_id,
                certified.as_str()
            )),
        });
    }
    if hello.protocol_version != refract_wire::proto::PROTOCOL_VERSION {
        return Err(Refusal {
            reason: StreamRefusal::ProtocolVersion,
            status: Status::failed_precondition(format!(
                "protocol version {} is not supported (this remote agent speaks {})",
                hello.protocol_version,
                refract_wire::proto::PROTOCOL_VERSION
            )),
        });
    }
    Ok(hello)
}

#[cfg(test)]
mod tests {
    use super::*;
    use refract_wire::proto::{SnapshotComplete, PROTOCOL_VERSION};
    use tonic::Code;

    fn tenant() -> ClusterId {
        ClusterId::parse("origin").unwrap()
    }

    fn mk_hello(cluster: &str, protocol_version: u32) -> LocalMessage {
        LocalMessage {
            kind: Some(local_message::Kind::Hello(Hello {
                cluster_id: cluster.into(),
                protocol_version,
                ..Hello::default()
            })),
        }
    }

    #[test]
    fn a_hello_from_the_certified_cluster_in_this_protocol_opens_the_session() {
        let hello = accept(&tenant(), mk_hello("origin", PROTOCOL_VERSION)).unwrap();
        assert_eq!(hello.cluster_id, "origin");
    }

    #[test]
    fn a_stream_not_opened_by_hello_is_refused() {
        let first = LocalMessage {
            kind: Some(local_message::Kind::SnapshotComplete(
                SnapshotComplete::default(),
            )),
        };
        let refusal = accept(&tenant(), first).unwrap_err();
        assert_eq!(refusal.reason, StreamRefusal::NoHello);
        assert_eq!(refusal.status.code(), Code::FailedPrecondition);
        assert!(refusal.status.message().contains("snapshot_complete"));
        let empty = accept(&tenant(), LocalMessage { kind: None }).unwrap_err();
        assert_eq!(empty.reason, StreamRefusal::NoHello);
    }

    #[test]
    fn a_hello_naming_another_cluster_than_the_certificate_is_refused() {
        let refusal = accept(&tenant(), mk_hello("someone-else", PROTOCOL_VERSION)).unwrap_err();
        assert_eq!(refusal.reason, StreamRefusal::IdentityMismatch);
        assert_eq!(refusal.status.code(), Code::PermissionDenied);
        assert!(refusal.status.message().contains("someone-else"));
    }

    #[test]
    fn another_protocol_version_is_refused_with_the_one_spoken_here() {
        let refusal = accept(&tenant(), mk_hello("origin", PROTOCOL_VERSION + 1)).unwrap_err();
        assert_eq!(refusal.reason, StreamRefusal::ProtocolVersion);
        assert!(refusal
            .status
            .message()
            .contains(&format!("speaks {PROTOCOL_VERSION}")));
    }
}
