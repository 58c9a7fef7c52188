//! Free loopback ports.

use std::net::TcpListener;
use std::sync::atomic::{AtomicU32, Ordering};

/// Where [`free_port`] looks first: below Linux's default ephemeral range (32768–60999), from
/// which the kernel picks the local port of every outgoing connection and of every bind to
/// port 0.
const QUIET_PORTS: std::ops::Range<u16> = 20_000..32_768;
/// Ports tried in [`QUIET_PORTS`] before asking the kernel for one.
const ATTEMPTS: usize = 64;

/// How many ports this process has tried so far: where the walk has got to.
static TRIED: AtomicU32 = AtomicU32::new(0);
/// Where this process's walk through [`QUIET_PORTS`] starts (random, so that two processes
/// rarely walk the same ports).
static START: std::sync::OnceLock<u32> = std::sync::OnceLock::new();

/// A port on 127.0.0.1 that was free a moment ago.
///
/// The check's listener is closed before returning, so something else could take the port
/// before the caller binds it. Two things did: an outgoing connection, which the kernel may
/// hand any port of the ephemeral range as its local port (a test's API client retrying, say),
/// and another test of the same process handed the same port. So ports come from below the
/// ephemeral range, walked in order from a random start: a process never hands out the same
/// port twice. Only if none there is free does the kernel choose.
pub fn free_port() -> std::io::Result<u16> {
    let span = u32::from(QUIET_PORTS.end - QUIET_PORTS.start);
    let start = *START.get_or_init(|| fastrand::u32(..span));
    for _ in 0..ATTEMPTS {
        let offset = (start + TRIED.fetch_add(1, Ordering::Relaxed)) % span;
        let port = QUIET_PORTS.start + offset as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_are_free_distinct_and_below_the_ephemeral_range() {
        let ports: Vec<u16> = (0..50).map(|_| free_port().unwrap()).collect();
        let distinct: std::collections::BTreeSet<_> = ports.iter().collect();
        assert_eq!(distinct.len(), ports.len(), "{ports:?}");
        for port in ports {
            assert!(QUIET_PORTS.contains(&port), "{port}");
            TcpListener::bind(("127.0.0.1", port)).unwrap();
        }
    }
}
