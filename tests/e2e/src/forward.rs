//! A TCP forwarder standing in for a Service in front of several replicas: each connection goes
//! to the first backend that accepts it, so while one replica is down the next one serves, as
//! kube-proxy sends a Service's connections to its ready endpoints. (testkit's clusters have
//! no kube-proxy yet; see issue 51.)

use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

/// Forwards 127.0.0.1:`port` to its backends until dropped.
pub struct Forwarder {
    /// Where it listens on 127.0.0.1.
    pub port: u16,
    stop: CancellationToken,
}

impl Forwarder {
    /// Listens on a free port and forwards to `backends` (`host:port`), first come first tried.
    /// It runs on a thread of its own: tests block their runtime's one thread on `kubectl`,
    /// whose requests may need this forwarder to be answered.
    pub fn spawn(backends: Vec<String>) -> Self {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.set_nonblocking(true).expect("nonblocking");
        let port = listener.local_addr().expect("address").port();
        let stop = CancellationToken::new();
        let token = stop.clone();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        std::thread::spawn(move || {
            runtime.block_on(async move {
            let listener = TcpListener::from_std(listener).expect("listener");
            loop {
                let accepted = tokio::select! {
                    _ = token.cancelled() => return,
                    accepted = listener.accept() => accepted,
                };
                let Ok((mut inbound, _)) = accepted else {
                    continue;
                };
                let backends = backends.clone();
                let token = token.clone();
                tokio::spawn(async move {
                    for backend in &backends {
                        let connect = TcpStream::connect(backend.as_str());
                        if let Ok(Ok(mut outbound)) =
                            tokio::time::timeout(Duration::from_secs(1), connect).await
                        {
                            tokio::select! {
                                _ = token.cancelled() => {}
                                _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                            }
                            return;
                        }
                    }
                });
            }
        })
        });
        Self { port, stop }
    }
}

impl Drop for Forwarder {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}
