//! Connections per source address: each TCP connection takes a slot of its address from accept
//! to close (its TLS handshake included), and an address holding its maximum
//! (`--max-connections-per-source`, [`MAX_PER_SOURCE`] by default) gets no more: one client
//! cannot hold the agent's handshakes and connections for everyone else, certificate or not.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use refract_core::lock::Locked;

/// Connections one source address may have at once, handshaking or open, by default.
pub const MAX_PER_SOURCE: usize = 64;

/// The open connections' source addresses, counted.
#[derive(Clone)]
pub struct Sources {
    counts: Arc<Mutex<HashMap<IpAddr, usize>>>,
    max: usize,
}

/// One connection's place among its address's; given back when dropped.
pub struct SourceSlot {
    sources: Sources,
    address: IpAddr,
}

impl Sources {
    /// Sources allowed `max` connections each.
    pub fn new(max: usize) -> Self {
        Self {
            counts: Arc::default(),
            max,
        }
    }

    /// The most connections one address may have.
    pub fn max(&self) -> usize {
        self.max
    }

    /// A slot for a connection from `address`, unless it has its maximum already.
    pub fn take(&self, address: IpAddr) -> Option<SourceSlot> {
        let mut counts = self.counts.locked();
        let count = counts.entry(address).or_insert(0);
        if *count >= self.max {
            return None;
        }
        *count += 1;
        Some(SourceSlot {
            sources: self.clone(),
            address,
        })
    }
}

impl Drop for SourceSlot {
    fn drop(&mut self) {
        let mut counts = self.sources.counts.locked();
        if let Some(count) = counts.get_mut(&self.address) {
            *count -= 1;
            if *count == 0 {
                counts.remove(&self.address);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_holds_a_bounded_number_of_connections_and_gets_them_back() {
        let sources = Sources::new(MAX_PER_SOURCE);
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let held: Vec<_> = (0..MAX_PER_SOURCE)
            .map(|_| sources.take(a).unwrap())
            .collect();
        assert!(sources.take(a).is_none());
        assert!(sources.take("10.0.0.2".parse().unwrap()).is_some());
        drop(held);
        assert!(sources.take(a).is_some());
        assert_eq!(
            sources.counts.locked().len(),
            0,
            "slots given back, entries gone"
        );
    }
}
