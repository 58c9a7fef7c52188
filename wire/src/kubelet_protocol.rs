//! What Kubernetes' streaming protocols put on SPDY streams: the header names and values that
//! say which stream is which, the protocol versions, and the exit status on the error stream.
//! Both agents speak them (the local agent to the origin's API server, the remote agent to the
//! provider's), so they live in one place.

use serde::{Deserialize, Serialize};

use crate::proto::{ExitStatus, TerminalSize};

/// The request header that lists (and the response header that picks) a protocol version.
pub const PROTOCOL_HEADER: &str = "X-Stream-Protocol-Version";
/// exec and attach: the version whose error stream carries a JSON `Status`.
pub const REMOTE_COMMAND_V4: &str = "v4.channel.k8s.io";
/// port-forward.
pub const PORT_FORWARD_V1: &str = "portforward.k8s.io";
/// The upgrade token.
pub const SPDY_UPGRADE: &str = "SPDY/3.1";

/// The stream header naming a stream's role.
pub const STREAM_TYPE: &str = "streamtype";
/// port-forward: the stream header naming the port.
pub const PORT: &str = "port";
/// port-forward: the stream header pairing a data stream with its error stream.
pub const REQUEST_ID: &str = "requestid";
/// Stream roles.
pub const ERROR: &str = "error";
/// The process's stdin.
pub const STDIN: &str = "stdin";
/// The process's stdout.
pub const STDOUT: &str = "stdout";
/// The process's stderr.
pub const STDERR: &str = "stderr";
/// Terminal size changes, as JSON objects one after another.
pub const RESIZE: &str = "resize";
/// port-forward: the connection's bytes.
pub const DATA: &str = "data";

/// The longest status message passed on: enough for any real error, small enough that a
/// peer cannot make us carry megabytes in a "status".
pub const MAX_STATUS_MESSAGE: usize = 4096;

/// The part of `metav1.Status` the error stream carries.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct Status {
    /// `Success` or `Failure`.
    #[serde(default)]
    pub status: String,
    /// Why, for a person.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// Why, for a machine.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    /// The exit code, as a cause.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub details: Option<StatusDetails>,
    /// Always `{}`; clients expect the field.
    #[serde(default)]
    pub metadata: serde_json::Map<String, serde_json::Value>,
}

/// `metav1.StatusDetails`, only the causes.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct StatusDetails {
    /// The causes.
    #[serde(default)]
    pub causes: Vec<StatusCause>,
}

/// `metav1.StatusCause`.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct StatusCause {
    /// `ExitCode` for the process's exit code.
    #[serde(default)]
    pub reason: String,
    /// The value.
    #[serde(default)]
    pub message: String,
}

const EXIT_CODE_CAUSE: &str = "ExitCode";
const NON_ZERO_EXIT: &str = "NonZeroExitCode";

/// Reads the error stream's content. An empty stream means success (older kubelets); anything
/// unreadable is a failure whose message says so, never passed on raw.
pub fn exit_from_status(raw: &[u8]) -> ExitStatus {
    if raw.iter().all(u8::is_ascii_whitespace) {
        return ExitStatus {
            success: true,
            ..Default::default()
        };
    }
    let Ok(status) = serde_json::from_slice::<Status>(raw) else {
        return ExitStatus {
            reason: "InternalError".into(),
            message: truncate(&String::from_utf8_lossy(raw)),
            ..Default::default()
        };
    };
    if status.status == "Success" {
        return ExitStatus {
            success: true,
            ..Default::default()
        };
    }
    let exit_code = status
        .details
        .iter()
        .flat_map(|d| &d.causes)
        .find(|c| c.reason == EXIT_CODE_CAUSE)
        .and_then(|c| c.message.parse::<i32>().ok())
        .unwrap_or(0);
    ExitStatus {
        success: false,
        exit_code,
        reason: truncate(&status.reason),
        message: truncate(&status.message),
    }
}

/// Writes what a kubelet puts on the error stream for `exit`.
pub fn status_from_exit(exit: &ExitStatus) -> Vec<u8> {
    let status = if exit.success {
        Status {
            status: "Success".into(),
            ..Default::default()
        }
    } else {
        let non_zero = exit.exit_code != 0;
        Status {
            status: "Failure".into(),
            message: truncate(&exit.message),
            reason: if non_zero {
                NON_ZERO_EXIT.into()
            } else {
                truncate(&exit.reason)
            },
            details: non_zero.then(|| StatusDetails {
                causes: vec![StatusCause {
                    reason: EXIT_CODE_CAUSE.into(),
                    message: exit.exit_code.to_string(),
                }],
            }),
            metadata: Default::default(),
        }
    };
    refract_core::json::to_vec(&status)
}

/// The JSON a client writes on the resize stream.
#[derive(Debug, Serialize, Deserialize)]
pub struct Resize {
    /// Columns.
    #[serde(rename = "Width")]
    pub width: u16,
    /// Rows.
    #[serde(rename = "Height")]
    pub height: u16,
}

impl From<&TerminalSize> for Resize {
    fn from(size: &TerminalSize) -> Self {
        Self {
            width: size.width.min(u32::from(u16::MAX)) as u16,
            height: size.height.min(u32::from(u16::MAX)) as u16,
        }
    }
}

/// Splits the resize stream into sizes: complete JSON objects are taken from the front of
/// `buffer`, a partial one stays for the next chunk. Garbage empties the buffer.
pub fn take_resizes(buffer: &mut Vec<u8>) -> Vec<TerminalSize> {
    let mut sizes = Vec::new();
    let mut stream = serde_json::Deserializer::from_slice(buffer).into_iter::<Resize>();
    let mut used = 0;
    loop {
        match stream.next() {
            Some(Ok(r)) => {
                used = stream.byte_offset();
                sizes.push(TerminalSize {
                    width: u32::from(r.width),
                    height: u32::from(r.height),
                });
            }
            Some(Err(e)) if e.is_eof() => break,
            Some(Err(_)) => {
                used = buffer.len();
                break;
            }
            None => break,
        }
    }
    buffer.drain(..used);
    // A partial object longer than any real one is garbage.
    if buffer.len() > 1024 {
        buffer.clear();
    }
    sizes
}

/// `s` cut to at most [`MAX_STATUS_MESSAGE`] bytes (at a character boundary): what a peer's
/// error text may cost to pass on.
pub fn truncate(s: &str) -> String {
    if s.len() <= MAX_STATUS_MESSAGE {
        return s.to_string();
    }
    let mut end = MAX_STATUS_MESSAGE;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_exit_code_survives_the_status_round_trip() {
        let exit = ExitStatus {
            success: false,
            exit_code: 42,
            reason: String::new(),
            message: "command terminated with non-zero exit code".into(),
        };
        let back = exit_from_status(&status_from_exit(&exit));
        assert_eq!(back.exit_code, 42);
        assert_eq!(back.reason, NON_ZERO_EXIT);
        assert!(
            exit_from_status(&status_from_exit(&ExitStatus {
                success: true,
                ..Default::default()
            }))
            .success
        );
    }

    #[test]
    fn a_kubelet_status_is_read() {
        let raw = br#"{"metadata":{},"status":"Failure","message":"command terminated with non-zero exit code: error executing command [sh -c exit 3], exit code 3","reason":"NonZeroExitCode","details":{"causes":[{"reason":"ExitCode","message":"3"}]}}"#;
        let exit = exit_from_status(raw);
        assert!(!exit.success);
        assert_eq!(exit.exit_code, 3);
        assert!(exit_from_status(b"").success);
        let garbage = exit_from_status(&vec![b'x'; 10_000]);
        assert!(!garbage.success);
        assert_eq!(garbage.message.len(), MAX_STATUS_MESSAGE);
    }

    #[test]
    fn resizes_are_split_across_chunks() {
        let mut buffer = br#"{"Width":80,"Height":24}{"Width":1"#.to_vec();
        let sizes = take_resizes(&mut buffer);
        assert_eq!(sizes.len(), 1);
        assert_eq!((sizes[0].width, sizes[0].height), (80, 24));
        buffer.extend_from_slice(br#"00,"Height":50}"#);
        let sizes = take_resizes(&mut buffer);
        assert_eq!((sizes[0].width, sizes[0].height), (100, 50));
        assert!(buffer.is_empty());
        buffer.extend_from_slice(b"nonsense");
        assert!(take_resizes(&mut buffer).is_empty());
        assert!(buffer.is_empty());
    }
}
