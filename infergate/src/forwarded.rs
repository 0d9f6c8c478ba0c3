//! The client-address headers sent upstream: the client is appended to `X-Forwarded-For` and to `Forwarded`
//! (RFC 7239), and `X-Real-IP` is set to it, unless the peer is a trusted proxy that sent its own `X-Real-IP`.
//!
//! What the client sent in `X-Forwarded-For` and `Forwarded` is kept (joined into one header line) and never
//! trusted here: only the last element, the one the router appends, is known to be true. An engine or log
//! reader that wants the original client behind a trusted load balancer reads `X-Real-IP`.

use std::net::IpAddr;

use http::{HeaderName, HeaderValue};
use pingora_core::protocols::l4::socket::SocketAddr;
use pingora_error::OrErr;

use crate::config::Cidr;
use crate::header_case::Headers;

static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
static X_REAL_IP: HeaderName = HeaderName::from_static("x-real-ip");

/// The three headers as they go upstream; `None` removes the header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ForwardHeaders {
    pub x_forwarded_for: Option<Vec<u8>>,
    pub forwarded: Vec<u8>,
    pub x_real_ip: Option<Vec<u8>>,
}

/// The peer's IP address (None for a Unix-socket peer or when unknown).
pub fn peer_ip(addr: Option<&SocketAddr>) -> Option<IpAddr> {
    addr.and_then(|a| a.as_inet())
        .map(|a| a.ip().to_canonical())
}

/// Whether `peer` is inside one of the `trusted` networks.
pub fn is_trusted(peer: Option<IpAddr>, trusted: &[Cidr]) -> bool {
    peer.is_some_and(|ip| trusted.iter().any(|c| c.contains(ip)))
}

/// Append an IPv4 address as text; by hand, since `Display` (the formatting machinery) costs more than the rest
/// of this module on every request.
fn push_ipv4(out: &mut String, a: std::net::Ipv4Addr) {
    for (i, octet) in a.octets().into_iter().enumerate() {
        if i > 0 {
            out.push('.');
        }
        if octet >= 100 {
            out.push(char::from(b'0' + octet / 100));
        }
        if octet >= 10 {
            out.push(char::from(b'0' + octet / 10 % 10));
        }
        out.push(char::from(b'0' + octet % 10));
    }
}

/// An address as text.
fn ip_text(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(a) => {
            let mut out = String::with_capacity(15);
            push_ipv4(&mut out, a);
            out
        }
        IpAddr::V6(a) => a.to_string(),
    }
}

/// The `Forwarded` element for `peer`, `for=` and its node: an IPv4 address bare, an IPv6 one quoted in brackets
/// (RFC 7239 §6), and `unknown` without an address.
fn forwarded_for(peer: Option<IpAddr>) -> String {
    match peer {
        Some(IpAddr::V4(a)) => {
            let mut out = String::with_capacity(19);
            out.push_str("for=");
            push_ipv4(&mut out, a);
            out
        }
        Some(IpAddr::V6(a)) => format!("for=\"[{a}]\""),
        None => "for=unknown".to_string(),
    }
}

/// Non-empty values (header lines) joined with ", ", then `tail` if given.
fn join(values: &[&[u8]], tail: Option<&[u8]>) -> Option<Vec<u8>> {
    let mut out: Vec<u8> = Vec::new();
    for v in values
        .iter()
        .map(|v| v.trim_ascii())
        .chain(tail)
        .filter(|v| !v.is_empty())
    {
        if !out.is_empty() {
            out.extend_from_slice(b", ");
        }
        out.extend_from_slice(v);
    }
    (!out.is_empty()).then_some(out)
}

/// The headers to send for a request from `peer` that carried these `X-Forwarded-For` and `Forwarded` lines and
/// this `X-Real-IP`.
pub fn compute(
    peer: Option<IpAddr>,
    trusted: &[Cidr],
    x_forwarded_for: &[&[u8]],
    forwarded: &[&[u8]],
    x_real_ip: Option<&[u8]>,
) -> ForwardHeaders {
    let client = peer.map(ip_text);
    let node = forwarded_for(peer);
    let keep_real_ip =
        is_trusted(peer, trusted) && x_real_ip.is_some_and(|v| !v.trim_ascii().is_empty());
    ForwardHeaders {
        x_forwarded_for: join(x_forwarded_for, client.as_deref().map(str::as_bytes)),
        forwarded: join(forwarded, Some(node.as_bytes())).unwrap_or_default(),
        x_real_ip: if keep_real_ip {
            x_real_ip.map(|v| v.trim_ascii().to_vec())
        } else {
            client.map(String::into_bytes)
        },
    }
}

/// The three headers, in the order of [`Values`].
static NAMES: [&HeaderName; 3] = [&X_FORWARDED_FOR, &http::header::FORWARDED, &X_REAL_IP];

/// The three values as header values: X-Forwarded-For, Forwarded, X-Real-IP.
type Values = [Option<HeaderValue>; 3];

impl ForwardHeaders {
    fn into_values(self) -> pingora_error::Result<Values> {
        Ok([
            self.x_forwarded_for.map(value).transpose()?,
            Some(value(self.forwarded)?),
            self.x_real_ip.map(value).transpose()?,
        ])
    }
}

/// The values for a request that carried none of the three headers. They depend on the peer alone, and the
/// requests of a keep-alive connection (or of a load balancer) come from one peer, so each thread keeps the last
/// peer's values: a request then costs three reference counts instead of building three strings.
fn values_for_peer(peer: Option<IpAddr>) -> pingora_error::Result<Values> {
    thread_local! {
        static LAST: std::cell::RefCell<Option<(Option<IpAddr>, Values)>> =
            const { std::cell::RefCell::new(None) };
    }
    LAST.with(|last| {
        let mut last = last.borrow_mut();
        if let Some((p, v)) = &*last {
            if *p == peer {
                return Ok(v.clone());
            }
        }
        // Nothing sent, so nothing to trust: the trusted networks do not matter.
        let v = compute(peer, &[], &[], &[], None).into_values()?;
        *last = Some((peer, v.clone()));
        Ok(v)
    })
}

/// Rewrite the three headers of an upstream request (see [`compute`]).
pub fn apply(
    req: &mut (impl Headers + ?Sized),
    peer: Option<IpAddr>,
    trusted: &[Cidr],
) -> pingora_error::Result<()> {
    let map = req.map();
    // Looked up by `HeaderName`: a `&str` name is parsed again at every lookup.
    let sent = NAMES.map(|n| map.contains_key(n));
    let values = if sent == [false; 3] {
        values_for_peer(peer)?
    } else {
        let all = |name: &HeaderName| -> Vec<&[u8]> {
            map.get_all(name).iter().map(|v| v.as_bytes()).collect()
        };
        let real_ip = map.get(&X_REAL_IP).map(|v| v.as_bytes());
        compute(
            peer,
            trusted,
            &all(&X_FORWARDED_FOR),
            &all(&http::header::FORWARDED),
            real_ip,
        )
        .into_values()?
    };
    for ((name, v), sent) in NAMES.into_iter().zip(values).zip(sent) {
        match v {
            Some(v) => req.set(name, v)?,
            None if sent => req.remove(name),
            None => {}
        }
    }
    Ok(())
}

/// A header value from bytes the client sent (already valid header bytes) and addresses; no copy.
fn value(v: Vec<u8>) -> pingora_error::Result<HeaderValue> {
    HeaderValue::from_maybe_shared(bytes::Bytes::from(v)).or_err(
        pingora_error::ErrorType::InvalidHTTPHeader,
        "invalid client address header",
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use pingora_http::RequestHeader;

    #[test]
    fn ip_text_matches_display() {
        for ip in [
            "0.0.0.0",
            "127.0.0.1",
            "10.20.100.255",
            "1.2.3.4",
            "::1",
            "fe80::1",
        ] {
            let ip: IpAddr = ip.parse().unwrap();
            assert_eq!(ip_text(ip), ip.to_string());
        }
    }

    fn ip(s: &str) -> Option<IpAddr> {
        Some(s.parse().unwrap())
    }

    fn s(v: &Option<Vec<u8>>) -> Option<&str> {
        v.as_deref().map(|b| std::str::from_utf8(b).unwrap())
    }

    fn nets(list: &[&str]) -> Vec<Cidr> {
        list.iter().map(|c| Cidr::parse(c).unwrap()).collect()
    }

    #[test]
    fn a_direct_client_is_appended_and_is_the_real_ip() {
        let h = compute(ip("203.0.113.7"), &[], &[], &[], None);
        assert_eq!(s(&h.x_forwarded_for), Some("203.0.113.7"));
        assert_eq!(h.forwarded, b"for=203.0.113.7");
        assert_eq!(s(&h.x_real_ip), Some("203.0.113.7"));
    }

    #[test]
    fn existing_chains_are_kept_and_extended() {
        let h = compute(
            ip("10.1.2.3"),
            &[],
            &[b"198.51.100.1, 192.0.2.4", b" 192.0.2.5 "],
            &[b"for=198.51.100.1;proto=https", b"for=\"[2001:db8::9]\""],
            Some(b"6.6.6.6"),
        );
        assert_eq!(
            s(&h.x_forwarded_for),
            Some("198.51.100.1, 192.0.2.4, 192.0.2.5, 10.1.2.3")
        );
        assert_eq!(
            h.forwarded,
            b"for=198.51.100.1;proto=https, for=\"[2001:db8::9]\", for=10.1.2.3"
        );
        // Not from a trusted proxy: a client-supplied X-Real-IP is replaced.
        assert_eq!(s(&h.x_real_ip), Some("10.1.2.3"));
    }

    #[test]
    fn ipv6_is_quoted_in_forwarded_only() {
        let h = compute(ip("2001:db8::1"), &[], &[], &[], None);
        assert_eq!(s(&h.x_forwarded_for), Some("2001:db8::1"));
        assert_eq!(h.forwarded, b"for=\"[2001:db8::1]\"");
        assert_eq!(s(&h.x_real_ip), Some("2001:db8::1"));
        // An IPv4-mapped peer is its IPv4 address.
        let mapped: IpAddr = "::ffff:192.0.2.1".parse().unwrap();
        let h = compute(Some(mapped.to_canonical()), &[], &[], &[], None);
        assert_eq!(h.forwarded, b"for=192.0.2.1");
    }

    #[test]
    fn a_trusted_proxy_keeps_its_real_ip() {
        let trusted = nets(&["10.0.0.0/8", "fd00::/8"]);
        let h = compute(
            ip("10.0.0.5"),
            &trusted,
            &[b"198.51.100.1"],
            &[],
            Some(b"198.51.100.1"),
        );
        assert_eq!(s(&h.x_real_ip), Some("198.51.100.1"));
        assert_eq!(s(&h.x_forwarded_for), Some("198.51.100.1, 10.0.0.5"));
        let h = compute(ip("fd00::2"), &trusted, &[], &[], Some(b"2001:db8::7"));
        assert_eq!(s(&h.x_real_ip), Some("2001:db8::7"));
        // Trusted but without an X-Real-IP (or an empty one): the peer is the real IP.
        let h = compute(ip("10.0.0.5"), &trusted, &[], &[], None);
        assert_eq!(s(&h.x_real_ip), Some("10.0.0.5"));
        let h = compute(ip("10.0.0.5"), &trusted, &[], &[], Some(b"  "));
        assert_eq!(s(&h.x_real_ip), Some("10.0.0.5"));
        // Untrusted peer claiming an address.
        let h = compute(ip("192.0.2.9"), &trusted, &[], &[], Some(b"10.0.0.1"));
        assert_eq!(s(&h.x_real_ip), Some("192.0.2.9"));
    }

    #[test]
    fn an_unknown_peer_adds_nothing_it_cannot_vouch_for() {
        let h = compute(
            None,
            &nets(&["0.0.0.0/0"]),
            &[b"192.0.2.1"],
            &[],
            Some(b"1.2.3.4"),
        );
        assert_eq!(s(&h.x_forwarded_for), Some("192.0.2.1"));
        assert_eq!(h.forwarded, b"for=unknown");
        assert_eq!(h.x_real_ip, None);
        let h = compute(None, &[], &[b""], &[], None);
        assert_eq!(h.x_forwarded_for, None);
    }

    #[test]
    fn apply_rewrites_the_upstream_request() {
        // Through Pingora's methods (a request that keeps its case map) and on the header map itself.
        for direct in [false, true] {
            let mut req = RequestHeader::build("POST", b"/v1/completions", None).unwrap();
            req.append_header("x-forwarded-for", "198.51.100.1")
                .unwrap();
            req.append_header("X-Forwarded-For", "192.0.2.4").unwrap();
            req.append_header("x-real-ip", "1.1.1.1").unwrap();
            let peer = ip("127.0.0.1");
            if direct {
                crate::header_case::edit_request(&mut req, |h| apply(h, peer, &[])).unwrap();
            } else {
                apply(&mut req, peer, &[]).unwrap();
            }
            assert_eq!(req.has_case(), !direct);
            let get = |n: &str| -> Vec<&str> {
                req.headers
                    .get_all(n)
                    .iter()
                    .map(|v| v.to_str().unwrap())
                    .collect()
            };
            assert_eq!(
                get("x-forwarded-for"),
                ["198.51.100.1, 192.0.2.4, 127.0.0.1"]
            );
            assert_eq!(get("forwarded"), ["for=127.0.0.1"]);
            assert_eq!(get("x-real-ip"), ["127.0.0.1"]);

            let mut req = RequestHeader::build("GET", b"/v1/models/x", None).unwrap();
            req.append_header("x-real-ip", "1.1.1.1").unwrap();
            if direct {
                crate::header_case::edit_request(&mut req, |h| apply(h, None, &[])).unwrap();
            } else {
                apply(&mut req, None, &[]).unwrap();
            }
            assert!(req.headers.get("x-forwarded-for").is_none());
            assert!(req.headers.get("x-real-ip").is_none());
            assert_eq!(req.headers.get("forwarded").unwrap(), "for=unknown");
        }
    }

    #[test]
    fn a_request_without_the_headers_gets_its_own_peer() {
        // The values kept for the last peer never leak to another peer's request.
        let get = |req: &RequestHeader, n: &str| {
            req.headers.get(n).map(|v| v.to_str().unwrap().to_string())
        };
        for (peer, xff, fwd) in [
            (ip("192.0.2.1"), Some("192.0.2.1"), "for=192.0.2.1"),
            (ip("192.0.2.1"), Some("192.0.2.1"), "for=192.0.2.1"),
            (
                ip("2001:db8::1"),
                Some("2001:db8::1"),
                "for=\"[2001:db8::1]\"",
            ),
            (None, None, "for=unknown"),
            (
                ip("198.51.100.20"),
                Some("198.51.100.20"),
                "for=198.51.100.20",
            ),
        ] {
            let mut req = RequestHeader::build("POST", b"/v1/completions", None).unwrap();
            crate::header_case::edit_request(&mut req, |h| apply(h, peer, &nets(&["0.0.0.0/0"])))
                .unwrap();
            assert_eq!(get(&req, "x-forwarded-for").as_deref(), xff);
            assert_eq!(get(&req, "forwarded").as_deref(), Some(fwd));
            assert_eq!(get(&req, "x-real-ip").as_deref(), xff);
            assert_eq!(req.headers.len(), 1 + 2 * usize::from(xff.is_some()));
        }
    }
}
