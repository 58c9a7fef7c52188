//! Provider pod addresses as the origin sees them.
//!
//! A pod IP from the provider ends up in the origin's EndpointSlices, so origin Service traffic
//! goes where it says. It is accepted only when it is a pod address: never loopback,
//! link-local (a cloud metadata service), multicast or unspecified, and, when the operator named
//! the provider's pod ranges (`--remote-pod-remap` sources or `--remote-pod-cidr`), inside one
//! of them. An accepted address is remapped; a refused one is left out of the origin status.

use std::net::IpAddr;

use ipnet::IpNet;

use crate::remap::Remapping;

/// Which provider pod addresses the origin accepts, and how it reaches them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PodAddresses {
    /// Provider ranges rewritten into the ranges the origin reaches them at.
    pub remapping: Remapping,
    /// Further provider pod ranges, used as they are (a flat network).
    pub allowed: Vec<IpNet>,
}

/// Why a provider address was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AddressRefused {
    /// Not an IP address at all.
    #[error("{0:?} is not an IP address")]
    NotAnAddress(String),
    /// An address no pod has.
    #[error("{0} is a loopback, link-local, multicast, broadcast or unspecified address")]
    Reserved(IpAddr),
    /// Outside every range the operator allowed.
    #[error("{addr} is outside the provider's pod ranges ({ranges})")]
    OutsideRanges {
        /// The address.
        addr: IpAddr,
        /// The ranges, comma-separated.
        ranges: String,
    },
}

impl PodAddresses {
    /// The origin's view of provider pod address `text`, or why it is refused.
    pub fn admit(&self, text: &str) -> Result<IpAddr, AddressRefused> {
        let addr: IpAddr = text
            .parse()
            .map_err(|_| AddressRefused::NotAnAddress(super::excerpt(text)))?;
        if is_reserved(addr) {
            return Err(AddressRefused::Reserved(addr));
        }
        let mut ranges = self
            .remapping
            .0
            .iter()
            .map(|r| &r.from)
            .chain(&self.allowed)
            .peekable();
        // No ranges named: any pod-like address, as before ranges could be named.
        if ranges.peek().is_some() && !ranges.clone().any(|net| net.contains(&addr)) {
            return Err(AddressRefused::OutsideRanges {
                addr,
                ranges: ranges
                    .map(ToString::to_string)
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        }
        Ok(self.remapping.map(addr))
    }

    /// Whether the operator named the provider's pod ranges.
    pub fn is_bounded(&self) -> bool {
        !self.remapping.0.is_empty() || !self.allowed.is_empty()
    }
}

fn is_reserved(addr: IpAddr) -> bool {
    match addr {
        IpAddr::V4(v4) => {
            v4.is_loopback()
                || v4.is_link_local()
                || v4.is_multicast()
                || v4.is_broadcast()
                || v4.is_unspecified()
        }
        IpAddr::V6(v6) => {
            v6.is_loopback()
                || v6.is_multicast()
                || v6.is_unspecified()
                || v6.is_unicast_link_local()
                || v6.to_ipv4_mapped().is_some_and(|v4| is_reserved(v4.into()))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addresses(remap: &[&str], allowed: &[&str]) -> PodAddresses {
        PodAddresses {
            remapping: Remapping(remap.iter().map(|r| r.parse().unwrap()).collect()),
            allowed: allowed.iter().map(|r| r.parse().unwrap()).collect(),
        }
    }

    #[test]
    fn remaps_addresses_in_the_named_ranges() {
        let a = addresses(&["10.0.0.0/16=10.50.0.0/16"], &["172.16.0.0/12"]);
        assert_eq!(a.admit("10.0.3.7").unwrap().to_string(), "10.50.3.7");
        assert_eq!(a.admit("172.20.1.1").unwrap().to_string(), "172.20.1.1");
        assert!(matches!(
            a.admit("192.168.1.1"),
            Err(AddressRefused::OutsideRanges { .. })
        ));
        let error = a.admit("8.8.8.8").unwrap_err().to_string();
        assert!(error.contains("10.0.0.0/16, 172.16.0.0/12"), "{error}");
    }

    #[test]
    fn refuses_what_no_pod_has_even_without_ranges() {
        let open = PodAddresses::default();
        assert!(!open.is_bounded());
        assert_eq!(open.admit("10.1.2.3").unwrap().to_string(), "10.1.2.3");
        for reserved in [
            "127.0.0.1",
            "169.254.169.254",
            "0.0.0.0",
            "224.0.0.1",
            "255.255.255.255",
            "::1",
            "fe80::1",
            "::ffff:169.254.169.254",
        ] {
            assert!(
                matches!(open.admit(reserved), Err(AddressRefused::Reserved(_))),
                "{reserved}"
            );
        }
        let long = "x".repeat(10_000);
        let refused = open.admit(&long).unwrap_err().to_string();
        assert!(refused.len() < 200, "the reason quotes an excerpt");
    }
}
