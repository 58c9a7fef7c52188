//! `Exec` and `Attach`: the provider's `pods/exec` and `pods/attach` over SPDY, bridged to the
//! gRPC call in both directions.
//!
//! The streams are opened in the order Kubernetes' own client opens them (error, stdin,
//! stdout, stderr, resize), one per role the start message asks for; the kubelet waits for
//! exactly those. Output ends with one exit, read from the error stream once stdout and stderr
//! have ended.

use bytes::Bytes;
use refract_core::json;
use refract_wire::kubelet_protocol::{self as kp, exit_from_status};
use refract_wire::proto::{
    session_input, session_output, SessionInput, SessionOutput, SessionStart,
};
use refract_wire::spdy::{Session, Stream, StreamWriter};
use tokio::sync::mpsc;
use tonic::{Status, Streaming};

use super::coalesce::{self, ChunkSource};
use super::upgrade::{self, query_pair};
use super::Output;
use crate::registry::KubeletSessionGuard;
use crate::shadowpod_controller::ProviderPod;

/// The most a status stream may hold; a real one is a few hundred bytes.
const MAX_STATUS_BYTES: usize = 64 * 1024;
/// Outputs buffered towards the caller: the provider is read only as fast as the caller reads.
const OUTPUT_BUFFER: usize = 8;

/// Which subresource.
#[derive(Debug, Clone, Copy)]
pub enum Call {
    /// `pods/exec`: runs a command.
    Exec,
    /// `pods/attach`: joins the main process.
    Attach,
}

impl Call {
    /// The gRPC method's name.
    pub fn name(self) -> &'static str {
        match self {
            Call::Exec => "Exec",
            Call::Attach => "Attach",
        }
    }
}

/// Starts the provider session and the pumps; returns the output stream.
pub async fn run(
    client: &kube::Client,
    pod: &ProviderPod,
    call: Call,
    start: SessionStart,
    inbound: Streaming<SessionInput>,
    guard: KubeletSessionGuard,
) -> Result<Output<SessionOutput>, Status> {
    if matches!(call, Call::Exec) && start.command.is_empty() {
        return Err(Status::invalid_argument("exec needs a command"));
    }
    let stderr = start.stderr && !start.tty;
    let mut query = String::new();
    if !start.container.is_empty() {
        query_pair(&mut query, "container", &start.container);
    }
    for arg in &start.command {
        query_pair(&mut query, "command", arg);
    }
    for (key, on) in [
        ("stdin", start.stdin),
        ("stdout", start.stdout),
        ("stderr", stderr),
        ("tty", start.tty),
    ] {
        if on {
            query_pair(&mut query, key, "true");
        }
    }
    let subresource = match call {
        Call::Exec => "exec",
        Call::Attach => "attach",
    };
    let path = format!(
        "/api/v1/namespaces/{}/pods/{}/{subresource}{query}",
        pod.meta().namespace(),
        pod.meta().name()
    );
    let session = upgrade::connect(client, &path, kp::REMOTE_COMMAND_V4).await?;
    let open = |role: &'static str| {
        let session = session.clone();
        async move {
            session
                .open(vec![(kp::STREAM_TYPE.into(), role.into())])
                .await
                .map_err(|e| Status::unavailable(format!("opening the {role} stream: {e}")))
        }
    };
    let error = open(kp::ERROR).await?;
    let stdin = if start.stdin {
        Some(open(kp::STDIN).await?)
    } else {
        None
    };
    let stdout = if start.stdout {
        Some(open(kp::STDOUT).await?)
    } else {
        None
    };
    let stderr = if stderr {
        Some(open(kp::STDERR).await?)
    } else {
        None
    };
    let resize = if start.tty {
        Some(open(kp::RESIZE).await?)
    } else {
        None
    };

    tokio::spawn(pump_input(
        inbound,
        stdin.map(|s| s.writer()),
        resize.map(|s| s.writer()),
        session.clone(),
    ));
    let (tx, rx) = mpsc::channel(OUTPUT_BUFFER);
    tokio::spawn(pump_output(session, error, stdout, stderr, tx, guard));
    Ok(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx)))
}

/// Caller → provider: stdin and resizes. The caller ending the call early ends the session.
async fn pump_input(
    mut inbound: Streaming<SessionInput>,
    stdin: Option<StreamWriter>,
    resize: Option<StreamWriter>,
    session: Session,
) {
    use session_input::Kind;
    loop {
        let message = tokio::select! {
            _ = session.closed() => return,
            m = inbound.message() => m,
        };
        match message {
            Ok(Some(SessionInput {
                kind: Some(Kind::Stdin(data)),
            })) => {
                if let Some(w) = &stdin {
                    if w.write(Bytes::from(data)).await.is_err() {
                        return;
                    }
                }
            }
            Ok(Some(SessionInput {
                kind: Some(Kind::StdinClosed(_)),
            })) => {
                if let Some(w) = &stdin {
                    let _ = w.close().await;
                }
            }
            Ok(Some(SessionInput {
                kind: Some(Kind::Resize(size)),
            })) => {
                if let Some(w) = &resize {
                    let json = json::to_vec(&kp::Resize::from(&size));
                    let _ = w.write(Bytes::from(json)).await;
                }
            }
            Ok(Some(_)) => {}
            // The caller finished sending: nothing more to forward, the session goes on.
            Ok(None) => return,
            // The caller went away: end the provider session too.
            Err(_) => {
                session.shutdown().await;
                return;
            }
        }
    }
}

/// Provider → caller: stdout and stderr as they come, then the exit.
async fn pump_output(
    session: Session,
    mut error: Stream,
    mut stdout: Option<Stream>,
    mut stderr: Option<Stream>,
    tx: mpsc::Sender<Result<SessionOutput, Status>>,
    _guard: KubeletSessionGuard,
) {
    use session_output::Kind;
    let mut status = Vec::new();
    let mut error_open = true;
    while stdout.is_some() || stderr.is_some() || error_open {
        let out = tokio::select! {
            chunk = stdout.next_chunk() => match chunk {
                Some(data) => {
                    let (data, ended) = coalesce::gather(data, &mut stdout).await;
                    if ended {
                        stdout = None;
                    }
                    Kind::Stdout(data)
                }
                None => { stdout = None; continue; }
            },
            chunk = stderr.next_chunk() => match chunk {
                Some(data) => {
                    let (data, ended) = coalesce::gather(data, &mut stderr).await;
                    if ended {
                        stderr = None;
                    }
                    Kind::Stderr(data)
                }
                None => { stderr = None; continue; }
            },
            chunk = error.read(), if error_open => {
                match chunk {
                    Some(data) if status.len() + data.len() <= MAX_STATUS_BYTES => status.extend_from_slice(&data),
                    Some(_) => {}
                    None => error_open = false,
                }
                continue;
            }
            _ = tx.closed() => {
                session.shutdown().await;
                return;
            }
        };
        if tx
            .send(Ok(SessionOutput { kind: Some(out) }))
            .await
            .is_err()
        {
            session.shutdown().await;
            return;
        }
    }
    let exit = exit_from_status(&status);
    let _ = tx
        .send(Ok(SessionOutput {
            kind: Some(Kind::Exit(exit)),
        }))
        .await;
    session.shutdown().await;
}
