//! `/exec` and `/attach`: a kubectl SPDY session (remote command protocol v4) bridged to the
//! provider's `Exec` or `Attach` call.
//!
//! The client opens one stream per role it wants (error, stdin, stdout, stderr, resize);
//! once all have arrived the call starts. Stdin and resizes go up, stdout and stderr come
//! down, and the exit is written on the error stream as the kubelet's `Status`. Either side
//! ending ends the other: the session closing cancels the call, the call ending closes the
//! session.

use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response};
use hyper::body::Incoming;
use refract_wire::kubelet_protocol::{self as kp, status_from_exit, take_resizes};
use refract_wire::proto::{session_input, session_output, ExitStatus, SessionInput, SessionStart};
use refract_wire::spdy::{headers, Session, Stream, StreamWriter};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

use super::route::{query_flag, query_values, Target};
use super::{upgrade, Backend, Body, HttpError};

/// How long the client has to open its streams.
const STREAMS_TIMEOUT: Duration = Duration::from_secs(30);
/// Inputs buffered towards the provider: stdin is read only as fast as the link takes it.
const INPUT_BUFFER: usize = 8;

/// Which call.
#[derive(Debug, Clone, Copy)]
pub enum Call {
    /// Run a command.
    Exec,
    /// Join the main process.
    Attach,
}

/// The roles the client asked for in the query.
#[derive(Debug, Clone, Copy)]
struct Wanted {
    stdin: bool,
    stdout: bool,
    stderr: bool,
    tty: bool,
}

#[derive(Default)]
struct Streams {
    error: Option<Stream>,
    stdin: Option<Stream>,
    stdout: Option<Stream>,
    stderr: Option<Stream>,
    resize: Option<Stream>,
}

impl Streams {
    fn complete(&self, w: Wanted) -> bool {
        self.error.is_some()
            && (!w.stdin || self.stdin.is_some())
            && (!w.stdout || self.stdout.is_some())
            && (!w.stderr || self.stderr.is_some())
            && (!w.tty || self.resize.is_some())
    }
}

/// Answers the upgrade and bridges the session in the background.
pub fn serve(
    backend: &Backend,
    target: Target,
    call: Call,
    mut req: Request<Incoming>,
) -> Result<Response<Body>, HttpError> {
    let query = req.uri().query().unwrap_or_default().to_string();
    let tty = query_flag(&query, "tty");
    let wanted = Wanted {
        stdin: query_flag(&query, "input"),
        stdout: query_flag(&query, "output"),
        stderr: query_flag(&query, "error") && !tty,
        tty,
    };
    let command = query_values(&query, "command");
    if matches!(call, Call::Exec) && command.is_empty() {
        return Err(HttpError::new(
            http::StatusCode::BAD_REQUEST,
            "exec needs a command",
        ));
    }
    if !(wanted.stdin || wanted.stdout || wanted.stderr) {
        return Err(HttpError::new(
            http::StatusCode::BAD_REQUEST,
            "you must specify at least one of stdin, stdout, stderr",
        ));
    }
    let pod = backend.remote(&target)?;
    let client = backend.client()?;
    let (response, session) = upgrade::accept(&mut req, kp::REMOTE_COMMAND_V4)?;
    let start = SessionStart {
        pod: Some(pod),
        container: target.container,
        command,
        stdin: wanted.stdin,
        stdout: wanted.stdout,
        stderr: wanted.stderr,
        tty,
    };
    tokio::spawn(async move {
        let Some((session, accepted)) = session.await else {
            return;
        };
        bridge(session, accepted, wanted, start, call, client).await;
    });
    Ok(response)
}

async fn bridge(
    session: Session,
    mut accepted: mpsc::Receiver<Stream>,
    wanted: Wanted,
    start: SessionStart,
    call: Call,
    mut client: refract_wire::proto::kubelet_client::KubeletClient<tonic::transport::Channel>,
) {
    let mut streams = Streams::default();
    let gathered = tokio::time::timeout(STREAMS_TIMEOUT, async {
        while !streams.complete(wanted) {
            let Some(stream) = accepted.recv().await else {
                return false;
            };
            let slot = match headers::get(&stream.headers, kp::STREAM_TYPE) {
                Some(kp::ERROR) => &mut streams.error,
                Some(kp::STDIN) => &mut streams.stdin,
                Some(kp::STDOUT) => &mut streams.stdout,
                Some(kp::STDERR) => &mut streams.stderr,
                Some(kp::RESIZE) => &mut streams.resize,
                _ => {
                    stream.writer().reset().await;
                    continue;
                }
            };
            *slot = Some(stream);
        }
        true
    })
    .await;
    let error = match (gathered, streams.error.take()) {
        (Ok(true), Some(error)) => error.writer(),
        _ => {
            tracing::debug!("the client did not open its streams in time");
            session.shutdown().await;
            return;
        }
    };
    let stdout = streams.stdout.as_ref().map(Stream::writer);
    let stderr = streams.stderr.as_ref().map(Stream::writer);

    let (input_tx, input_rx) = mpsc::channel(INPUT_BUFFER);
    let _ = input_tx
        .send(SessionInput {
            kind: Some(session_input::Kind::Start(start)),
        })
        .await;
    let inputs = ReceiverStream::new(input_rx);
    let answer = match call {
        Call::Exec => client.exec(inputs).await,
        Call::Attach => client.attach(inputs).await,
    };
    let mut outputs = match answer {
        Ok(r) => r.into_inner(),
        Err(status) => {
            finish(
                &session,
                &error,
                &stdout,
                &stderr,
                failure(status.message()),
            )
            .await;
            return;
        }
    };
    if let Some(stdin) = streams.stdin.take() {
        tokio::spawn(pump_stdin(stdin, input_tx.clone()));
    }
    if let Some(resize) = streams.resize.take() {
        tokio::spawn(pump_resizes(resize, input_tx.clone()));
    }
    drop(input_tx);

    let exit = loop {
        let message = tokio::select! {
            // The client went away: dropping the call cancels it at the provider.
            _ = session.closed() => return,
            m = outputs.message() => m,
        };
        match message {
            Ok(Some(out)) => match out.kind {
                Some(session_output::Kind::Stdout(data)) => {
                    write(&stdout, data).await;
                }
                Some(session_output::Kind::Stderr(data)) => {
                    // With a terminal there is one output; the provider should not split it.
                    write(if stderr.is_some() { &stderr } else { &stdout }, data).await;
                }
                Some(session_output::Kind::Exit(exit)) => break exit,
                None => {}
            },
            Ok(None) => break failure("the provider ended the session without an exit status"),
            Err(status) => break failure(status.message()),
        }
    };
    finish(&session, &error, &stdout, &stderr, exit).await;
}

fn failure(message: &str) -> ExitStatus {
    ExitStatus {
        success: false,
        exit_code: 0,
        reason: "InternalError".into(),
        message: message.to_string(),
    }
}

async fn write(stream: &Option<StreamWriter>, data: Vec<u8>) {
    if let Some(w) = stream {
        let _ = w.write(Bytes::from(data)).await;
    }
}

/// Writes the exit on the error stream, closes every stream, and ends the session.
async fn finish(
    session: &Session,
    error: &StreamWriter,
    stdout: &Option<StreamWriter>,
    stderr: &Option<StreamWriter>,
    exit: ExitStatus,
) {
    for w in [stdout, stderr].into_iter().flatten() {
        let _ = w.close().await;
    }
    let _ = error.write(Bytes::from(status_from_exit(&exit))).await;
    let _ = error.close().await;
    session.shutdown().await;
}

async fn pump_stdin(mut stdin: Stream, tx: mpsc::Sender<SessionInput>) {
    while let Some(data) = stdin.read().await {
        let input = SessionInput {
            kind: Some(session_input::Kind::Stdin(data.to_vec())),
        };
        if tx.send(input).await.is_err() {
            return;
        }
    }
    let _ = tx
        .send(SessionInput {
            kind: Some(session_input::Kind::StdinClosed(true)),
        })
        .await;
}

async fn pump_resizes(mut resize: Stream, tx: mpsc::Sender<SessionInput>) {
    let mut buffer = Vec::new();
    while let Some(data) = resize.read().await {
        buffer.extend_from_slice(&data);
        for size in take_resizes(&mut buffer) {
            let input = SessionInput {
                kind: Some(session_input::Kind::Resize(size)),
            };
            if tx.send(input).await.is_err() {
                return;
            }
        }
    }
}
