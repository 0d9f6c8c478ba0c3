//! `trusted_proxies` (top level): the peers, as CIDRs, whose `X-Real-IP` header the router keeps.

use std::net::IpAddr;

use serde_norway::Value;

use super::walk::Field;
use super::ConfigError;

/// An IP network: an address and a prefix length (`10.0.0.0/8`, `fd00::/8`; a bare address is one host).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cidr {
    addr: IpAddr,
    prefix: u8,
}

impl Cidr {
    /// Parse `addr/prefix` or a bare address. Host bits set below the prefix are an error (a likely typo).
    pub fn parse(s: &str) -> Result<Cidr, String> {
        let s = s.trim();
        let (addr_text, prefix_text) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        let addr: IpAddr = addr_text.parse().map_err(|_| {
            format!("invalid CIDR `{s}`: `{addr_text}` is not an IP address; write e.g. `10.0.0.0/8` or `fd00::/8`")
        })?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix_text {
            None => max,
            Some(p) => match p.parse::<u8>() {
                Ok(n) if n <= max => n,
                _ => {
                    return Err(format!(
                        "invalid CIDR `{s}`: the prefix length must be a number from 0 to {max}"
                    ))
                }
            },
        };
        let cidr = Cidr { addr, prefix };
        let network = cidr.network();
        if network != addr {
            return Err(format!(
                "invalid CIDR `{s}`: host bits are set below the /{prefix} prefix; did you mean `{network}/{prefix}`?"
            ));
        }
        Ok(cidr)
    }

    /// Whether `ip` is inside this network (an IPv4-mapped IPv6 address counts as its IPv4 address).
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.addr, ip.to_canonical()) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                mask(u128::from(u32::from(ip)), self.prefix, 32) == u128::from(u32::from(net))
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                mask(u128::from(ip), self.prefix, 128) == u128::from(net)
            }
            _ => false,
        }
    }

    /// The address with the bits below the prefix cleared.
    fn network(&self) -> IpAddr {
        match self.addr {
            IpAddr::V4(a) => {
                let bits = mask(u128::from(u32::from(a)), self.prefix, 32);
                IpAddr::V4(u32::try_from(bits).unwrap_or(0).into())
            }
            IpAddr::V6(a) => IpAddr::V6(mask(u128::from(a), self.prefix, 128).into()),
        }
    }
}

impl std::fmt::Display for Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

/// `bits` (an address `width` bits wide) with everything below the top `prefix` bits cleared.
fn mask(bits: u128, prefix: u8, width: u32) -> u128 {
    let host_bits = width - u32::from(prefix).min(width);
    if host_bits >= 128 {
        0
    } else {
        bits & !((1u128 << host_bits) - 1)
    }
}

/// `trusted_proxies`: a list of CIDRs; absent or empty = trust no peer.
pub(super) fn trusted_proxies(f: &Field<'_>) -> Result<Vec<Cidr>, ConfigError> {
    let seq = match f.value() {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Sequence(seq)) => seq,
        Some(other) => return Err(f.type_err("a list of CIDRs such as [\"10.0.0.0/8\"]", other)),
    };
    let mut out: Vec<Cidr> = Vec::new();
    for (i, v) in seq.iter().enumerate() {
        let item = f.item(i, v);
        let cidr = Cidr::parse(item.string()?).map_err(|r| item.err(r))?;
        if out.contains(&cidr) {
            return Err(item.err(format!("`{cidr}` is listed twice")));
        }
        out.push(cidr);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::testing::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn cidrs_parse_and_match() {
        let net = Cidr::parse("10.0.0.0/8").unwrap();
        assert!(net.contains(ip("10.1.2.3")));
        assert!(net.contains(ip("::ffff:10.1.2.3")), "IPv4-mapped counts");
        assert!(!net.contains(ip("11.0.0.1")));
        assert!(!net.contains(ip("::1")));
        let host = Cidr::parse("192.168.1.7").unwrap();
        assert_eq!(host.to_string(), "192.168.1.7/32");
        assert!(host.contains(ip("192.168.1.7")));
        assert!(!host.contains(ip("192.168.1.8")));
        let all = Cidr::parse("0.0.0.0/0").unwrap();
        assert!(all.contains(ip("203.0.113.9")));
        assert!(!all.contains(ip("2001:db8::1")));
        let v6 = Cidr::parse("fd00::/8").unwrap();
        assert!(v6.contains(ip("fd12:3456::1")));
        assert!(!v6.contains(ip("fe80::1")));
        assert!(Cidr::parse("::/0").unwrap().contains(ip("2001:db8::1")));
        assert!(Cidr::parse("::1").unwrap().contains(ip("::1")));
    }

    #[test]
    fn bad_cidrs_are_explained() {
        for (text, needle) in [
            ("10.0.0.1/8", "did you mean `10.0.0.0/8`?"),
            ("10.0.0.0/33", "from 0 to 32"),
            ("fd00::/129", "from 0 to 128"),
            ("10.0.0.0/x", "from 0 to 32"),
            ("ten/8", "not an IP address"),
            ("", "not an IP address"),
        ] {
            let e = Cidr::parse(text).unwrap_err();
            assert!(e.contains(needle), "{text}: {e}");
        }
    }

    #[test]
    fn config_key() {
        assert!(parse(POOL).unwrap().trusted_proxies.is_empty());
        let c = parse(&format!(
            "trusted_proxies: [\"10.0.0.0/8\", \"127.0.0.1\", \"fd00::/8\"]\n{POOL}"
        ))
        .unwrap();
        assert_eq!(c.trusted_proxies.len(), 3);
        assert!(c.trusted_proxies[1].contains(ip("127.0.0.1")));
        assert_err(
            &format!("trusted_proxies: [\"10.0.0.0/8\", \"10.0.0.5/8\"]\n{POOL}"),
            "trusted_proxies[1]",
            &["host bits", "`10.0.0.0/8`"],
        );
        assert_err(
            &format!("trusted_proxies: [\"10.0.0.0/8\", \"10.0.0.0/8\"]\n{POOL}"),
            "trusted_proxies[1]",
            &["listed twice"],
        );
        assert_err(
            &format!("trusted_proxies: \"10.0.0.0/8\"\n{POOL}"),
            "trusted_proxies",
            &["expected a list of CIDRs"],
        );
        assert_err(
            &format!("trusted_proxies: [8]\n{POOL}"),
            "trusted_proxies[0]",
            &["expected a string"],
        );
    }
}
