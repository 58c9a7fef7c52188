//! Free loopback ports.

/// A port on 127.0.0.1 that was free a moment ago.
///
/// The listener is closed before returning, so another process could take the port first;
/// the window is small, and a start that fails for it fails loudly.
pub fn free_port() -> std::io::Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}
