//! Free loopback ports.

use std::net::TcpListener;

/// Where [`free_port`] looks first: below Linux's default ephemeral range (32768–60999), from
/// which the kernel picks the local port of every outgoing connection and of every bind to
/// port 0.
const QUIET_PORTS: std::ops::Range<u16> = 20_000..32_768;
/// Random ports tried in [`QUIET_PORTS`] before asking the kernel for one.
const ATTEMPTS: usize = 64;

/// A port on 127.0.0.1 that was free a moment ago.
///
/// The check's listener is closed before returning, so another process could take the port
/// before the caller binds it. A port from the ephemeral range is the likeliest to go: any
/// process connecting anywhere (a test's API client retrying, say) may be handed it as its
/// local port. So a random port below that range is tried first; only if none is free does
/// the kernel choose.
pub fn free_port() -> std::io::Result<u16> {
    for _ in 0..ATTEMPTS {
        let port = fastrand::u16(QUIET_PORTS);
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
    fn ports_come_from_below_the_ephemeral_range_and_are_free() {
        for _ in 0..20 {
            let port = free_port().unwrap();
            assert!(QUIET_PORTS.contains(&port), "{port}");
            TcpListener::bind(("127.0.0.1", port)).unwrap();
        }
    }
}
