//! A real OCI registry on loopback (Debian's `docker-registry`, the CNCF distribution server),
//! from which test nodes pull the agents' images by reference, as a user's nodes pull them
//! from the user's registry. `scripts/images.sh --push` puts the images there.
//!
//! One registry serves a whole test process. It stores under `target/registry/storage`, which
//! outlives the process, so a push of unchanged images only checks that the blobs are there.
//! It stops when the process ends, however it ends: it runs under a shell that waits for its
//! standard input to close, and only this process holds the other end.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use crate::images::workspace_root;
use crate::ports::free_port;

/// How long the registry may take to answer `GET /v2/`.
const START_TIMEOUT: Duration = Duration::from_secs(20);

/// A running registry.
pub struct Registry {
    /// `127.0.0.1:<port>`, plain HTTP.
    pub address: SocketAddr,
    /// Closing it (the process ending) stops the registry; never written.
    _lifeline: Mutex<ChildStdin>,
    _shell: Mutex<Child>,
}

static SHARED: Mutex<Option<&'static Registry>> = Mutex::new(None);

impl Registry {
    /// The process's registry, started on first use.
    pub fn shared() -> anyhow::Result<&'static Registry> {
        let mut shared = SHARED
            .lock()
            .map_err(|_| anyhow::anyhow!("registry lock poisoned"))?;
        if let Some(registry) = *shared {
            return Ok(registry);
        }
        let registry: &'static Registry = Box::leak(Box::new(Self::start()?));
        *shared = Some(registry);
        Ok(registry)
    }

    fn start() -> anyhow::Result<Self> {
        let dir = workspace_root().join("target/registry");
        std::fs::create_dir_all(dir.join("storage"))?;
        let port = free_port()?;
        let address = SocketAddr::from(([127, 0, 0, 1], port));
        let config = dir.join(format!("config-{}.yml", std::process::id()));
        std::fs::write(
            &config,
            format!(
                "version: 0.1\nlog:\n  level: warn\n  accesslog: {{disabled: true}}\nstorage:\n  filesystem:\n    rootdirectory: {storage}\n  maintenance:\n    uploadpurging: {{enabled: false}}\nhttp:\n  addr: {address}\n",
                storage = dir.join("storage").display()
            ),
        )?;
        let log_path = dir.join("registry.log");
        let log = std::fs::File::create(&log_path)?;
        // The shell ends the registry once its standard input reaches end of file.
        let mut shell = Command::new("sh")
            .args([
                "-c",
                "docker-registry serve \"$1\" & registry=$!; cat >/dev/null; kill $registry; wait $registry",
                "sh",
            ])
            .arg(&config)
            .stdin(Stdio::piped())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("failed to start docker-registry under sh")?;
        let lifeline = shell.stdin.take().context("the registry shell's stdin")?;
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if answers_v2(address) {
                break;
            }
            if let Some(status) = shell.try_wait()? {
                bail!(
                    "docker-registry exited ({status}) before answering; is Debian's docker-registry installed (scripts/ensure-toolchain.sh)? {}:\n{}",
                    log_path.display(),
                    std::fs::read_to_string(&log_path).unwrap_or_default()
                );
            }
            if Instant::now() > deadline {
                bail!(
                    "docker-registry did not answer at {address} within {START_TIMEOUT:?}; {}",
                    log_path.display()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        // Read once at start; a file per process would otherwise pile up.
        let _ = std::fs::remove_file(&config);
        tracing::info!(%address, "registry ready");
        Ok(Self {
            address,
            _lifeline: Mutex::new(lifeline),
            _shell: Mutex::new(shell),
        })
    }
}

/// Whether the registry answers the distribution API's base endpoint with 200.
fn answers_v2(address: SocketAddr) -> bool {
    let Ok(mut stream) = TcpStream::connect_timeout(&address, Duration::from_millis(500)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_secs(2)));
    if stream
        .write_all(b"GET /v2/ HTTP/1.0\r\nHost: registry\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut head = [0u8; 12];
    stream.read_exact(&mut head).is_ok() && head.ends_with(b"200")
}
