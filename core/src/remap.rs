//! Network remapping: addresses of one CIDR rewritten into another of the same size.
//!
//! When the provider reaches origin pods through a NAT'd range (as a network fabric does), an
//! endpoint `10.0.3.7` in origin pod CIDR `10.0.0.0/16`, remapped to `10.50.0.0/16`, becomes
//! `10.50.3.7`: the host bits are kept and the network bits replaced.

use std::net::IpAddr;
use std::str::FromStr;

use ipnet::IpNet;

/// One `FROM=TO` rule; both networks have the same prefix length and address family.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// Addresses in here are rewritten.
    pub from: IpNet,
    /// Into here.
    pub to: IpNet,
}

impl FromStr for Rule {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (from, to) = s
            .split_once('=')
            .ok_or_else(|| format!("remapping {s:?} must be FROM_CIDR=TO_CIDR"))?;
        let from: IpNet = from.trim().parse().map_err(|e| format!("{from:?}: {e}"))?;
        let to: IpNet = to.trim().parse().map_err(|e| format!("{to:?}: {e}"))?;
        if from.prefix_len() != to.prefix_len() || from.addr().is_ipv4() != to.addr().is_ipv4() {
            return Err(format!(
                "remapping {s:?}: both sides need the same address family and prefix length"
            ));
        }
        Ok(Rule {
            from: from.trunc(),
            to: to.trunc(),
        })
    }
}

impl std::fmt::Display for Rule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}={}", self.from, self.to)
    }
}

impl serde::Serialize for Rule {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> serde::Deserialize<'de> for Rule {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// An ordered list of rules; the first whose `from` contains an address applies.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(transparent)]
pub struct Remapping(pub Vec<Rule>);

impl Remapping {
    /// The address as seen from the other side.
    pub fn map(&self, addr: IpAddr) -> IpAddr {
        self.0
            .iter()
            .find(|r| r.from.contains(&addr))
            .map(|r| swap_network(addr, r))
            .unwrap_or(addr)
    }

    /// Maps an address given as text; text that is not an address is returned unchanged.
    pub fn map_str(&self, addr: &str) -> String {
        addr.parse::<IpAddr>()
            .map(|a| self.map(a).to_string())
            .unwrap_or_else(|_| addr.to_string())
    }
}

fn swap_network(addr: IpAddr, rule: &Rule) -> IpAddr {
    match (addr, rule.to.addr(), rule.from.hostmask()) {
        (IpAddr::V4(a), IpAddr::V4(to), IpAddr::V4(host)) => {
            let host = u32::from(host);
            IpAddr::V4((u32::from(to) & !host | u32::from(a) & host).into())
        }
        (IpAddr::V6(a), IpAddr::V6(to), IpAddr::V6(host)) => {
            let host = u128::from(host);
            IpAddr::V6((u128::from(to) & !host | u128::from(a) & host).into())
        }
        _ => addr,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_host_bits_and_swaps_network() {
        let m = Remapping(vec!["10.0.0.0/16=10.50.0.0/16".parse().unwrap()]);
        assert_eq!(m.map_str("10.0.3.7"), "10.50.3.7");
        assert_eq!(m.map_str("192.168.1.1"), "192.168.1.1");
        assert_eq!(m.map_str("not-an-ip"), "not-an-ip");
    }

    #[test]
    fn ipv6_and_first_match_wins() {
        let m = Remapping(vec![
            "fd00::/64=fd99::/64".parse().unwrap(),
            "10.0.0.0/8=11.0.0.0/8".parse().unwrap(),
            "10.1.0.0/16=12.1.0.0/16".parse().unwrap(),
        ]);
        assert_eq!(m.map_str("fd00::5"), "fd99::5");
        assert_eq!(m.map_str("10.1.2.3"), "11.1.2.3");
    }

    #[test]
    fn rejects_mismatched_rules() {
        assert!("10.0.0.0/16=10.1.0.0/24".parse::<Rule>().is_err());
        assert!("10.0.0.0/16=fd00::/16".parse::<Rule>().is_err());
        assert!("10.0.0.0/16".parse::<Rule>().is_err());
    }
}
