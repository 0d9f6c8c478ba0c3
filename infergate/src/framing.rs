//! The client request's HTTP framing rules, checked before anything else reads it: `Host` on HTTP/1.1, transfer
//! codings, protocol upgrades and the size of a session header's value.
//!
//! Pingora accepts what RFC 9112 tells a server to refuse. Each rule answers the way nginx does: an HTTP/1.1
//! request without exactly one `Host` is a 400 (RFC 9112 §3.2), a transfer coding other than `chunked` a 501
//! (nginx: "unknown transfer-encoding"), `Transfer-Encoding` on HTTP/1.0 a 400. (Codings that do not end in
//! `chunked` leave the body's length unknown, and Pingora refuses them with a 400 while reading, §6.3.) An API call is never a protocol
//! switch: a request asking to upgrade (`Upgrade: websocket`) is a 400, except `h2c`, which a server may ignore
//! and curl sends with `--http2` on plain http (the header is then dropped on the way to the engine).

use http::HeaderName;
use pingora_http::RequestHeader;

use crate::errors::ApiError;
use crate::header_case::Headers;

/// Check the request's framing; the error the client gets when it breaks a rule.
pub fn screen(req: &RequestHeader) -> Result<(), ApiError> {
    let headers = &req.headers;
    // One pass over the header lines (cheaper than a lookup per rule, on every request); the rare headers are
    // then read in detail.
    let (mut hosts, mut coded, mut upgrade) = (0, false, false);
    for (name, _) in headers {
        if name == http::header::HOST {
            hosts += 1;
        } else if name == http::header::TRANSFER_ENCODING {
            coded = true;
        } else if name == http::header::UPGRADE {
            upgrade = true;
        }
    }
    if req.version == http::Version::HTTP_11 && hosts != 1 {
        return Err(ApiError::bad_framing(
            "An HTTP/1.1 request must carry exactly one Host header.",
        ));
    }
    if coded {
        let codings = headers.get_all(http::header::TRANSFER_ENCODING).iter();
        if req.version < http::Version::HTTP_11 {
            return Err(ApiError::bad_framing(
                "Transfer-Encoding is not allowed in an HTTP/1.0 request.",
            ));
        }
        let tokens: Vec<&[u8]> = codings.flat_map(|v| tokens(v.as_bytes())).collect();
        if tokens.len() != 1 || !tokens[0].eq_ignore_ascii_case(b"chunked") {
            return Err(ApiError::unsupported_transfer_coding());
        }
    }
    if upgrade && asks_upgrade(req) {
        return Err(ApiError::bad_framing(
            "This router does not switch protocols: send the API call without Upgrade.",
        ));
    }
    Ok(())
}

/// The request asks to switch to a protocol other than `h2c` (which is ignored).
fn asks_upgrade(req: &RequestHeader) -> bool {
    req.headers
        .get_all(http::header::UPGRADE)
        .iter()
        .flat_map(|v| tokens(v.as_bytes()))
        .any(|t| !t.eq_ignore_ascii_case(b"h2c"))
}

/// The comma-separated, trimmed, non-empty tokens of a header value.
fn tokens(value: &[u8]) -> impl Iterator<Item = &[u8]> {
    value
        .split(|&b| b == b',')
        .map(<[u8]>::trim_ascii)
        .filter(|t| !t.is_empty())
}

/// Headers that describe one connection, never the request (RFC 9110 §7.6.1, and the obsolete ones proxies still
/// meet): they are not forwarded to the engine, nor is any header a `Connection` header names.
static HOP_BY_HOP: [HeaderName; 8] = [
    http::header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    http::header::TE,
    http::header::TRAILER,
    http::header::UPGRADE,
    HeaderName::from_static("http2-settings"),
    http::header::PROXY_AUTHORIZATION,
];

/// Remove from a request about to be forwarded the hop-by-hop headers, those its `Connection` names, and those
/// `also` picks. One pass over the names the request carries, not one lookup per candidate name (a lookup by a
/// `&str` parses the name first); nothing is allocated when none is present, the common case.
pub fn strip_hop_by_hop(req: &mut (impl Headers + ?Sized), also: impl Fn(&HeaderName) -> bool) {
    let found: Vec<HeaderName> = {
        let map = req.map();
        let connection = map.get_all(http::header::CONNECTION);
        // Transfer-Encoding is the caller's: the held body is re-framed with one Content-Length.
        let named = |name: &HeaderName| {
            *name != http::header::TRANSFER_ENCODING
                && connection
                    .iter()
                    .flat_map(|v| tokens(v.as_bytes()))
                    .any(|t| t.eq_ignore_ascii_case(name.as_str().as_bytes()))
        };
        map.keys()
            .filter(|k| also(k) || HOP_BY_HOP.contains(k) || named(k))
            .cloned()
            .collect()
    };
    for name in &found {
        req.remove(name);
    }
}

/// The session header value is too long: 431 (a header field too large), or for a body's `prompt_cache_key`, 400.
pub fn check_session_key(key: &[u8], limit: usize, from_header: bool) -> Result<(), ApiError> {
    if key.len() <= limit {
        return Ok(());
    }
    Err(ApiError::session_key_too_large(limit, from_header))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(version: http::Version, headers: &[(&str, &str)]) -> RequestHeader {
        let mut r = RequestHeader::build("POST", b"/v1/chat/completions", None).unwrap();
        r.set_version(version);
        for (k, v) in headers {
            r.append_header(k.to_string(), *v).unwrap();
        }
        r
    }

    fn status(version: http::Version, headers: &[(&str, &str)]) -> u16 {
        screen(&req(version, headers)).map_or_else(|e| e.status, |_| 200)
    }

    const HTTP_10: http::Version = http::Version::HTTP_10;
    const HTTP_11: http::Version = http::Version::HTTP_11;

    #[test]
    fn http_1_1_needs_exactly_one_host() {
        assert_eq!(status(HTTP_11, &[("host", "x")]), 200);
        assert_eq!(status(HTTP_11, &[]), 400);
        assert_eq!(status(HTTP_11, &[("host", "x"), ("host", "y")]), 400);
        assert_eq!(status(HTTP_10, &[]), 200, "HTTP/1.0 may omit Host");
    }

    #[test]
    fn only_chunked_is_a_transfer_coding_served() {
        let host = ("host", "x");
        assert_eq!(
            status(HTTP_11, &[host, ("transfer-encoding", "chunked")]),
            200
        );
        assert_eq!(
            status(HTTP_11, &[host, ("transfer-encoding", " Chunked ")]),
            200
        );
        for te in ["gzip, chunked", "gzip", "chunked, chunked", "identity", ","] {
            assert_eq!(
                status(HTTP_11, &[host, ("transfer-encoding", te)]),
                501,
                "{te}"
            );
        }
        let two = [
            host,
            ("transfer-encoding", "gzip"),
            ("transfer-encoding", "chunked"),
        ];
        assert_eq!(status(HTTP_11, &two), 501);
        assert_eq!(status(HTTP_10, &[("transfer-encoding", "chunked")]), 400);
    }

    #[test]
    fn an_upgrade_is_refused_but_h2c_is_ignored() {
        let host = ("host", "x");
        let ws = [host, ("connection", "Upgrade"), ("upgrade", "websocket")];
        assert_eq!(status(HTTP_11, &ws), 400);
        assert_eq!(status(HTTP_11, &[host, ("upgrade", "h2c, websocket")]), 400);
        let h2c = [
            host,
            ("connection", "Upgrade, HTTP2-Settings"),
            ("upgrade", "h2c"),
        ];
        assert_eq!(status(HTTP_11, &h2c), 200);
    }

    #[test]
    fn hop_by_hop_headers_and_those_connection_names_are_not_forwarded() {
        let mut r = req(
            HTTP_11,
            &[
                ("host", "x"),
                (
                    "connection",
                    "keep-alive, Upgrade, HTTP2-Settings, X-Secret-Hop",
                ),
                ("upgrade", "h2c"),
                ("http2-settings", "AAMAAABk"),
                ("x-secret-hop", "1"),
                ("keep-alive", "timeout=5"),
                ("te", "trailers"),
                ("proxy-authorization", "Basic abc"),
                ("x-session-id", "s"),
            ],
        );
        strip_hop_by_hop(&mut r, |_| false);
        let left: Vec<&str> = r.headers.keys().map(|k| k.as_str()).collect();
        assert_eq!(left, ["host", "x-session-id"]);
    }

    #[test]
    fn a_session_key_is_bounded() {
        assert!(check_session_key(&[b'a'; 1024], 1024, true).is_ok());
        assert_eq!(
            check_session_key(&[b'a'; 1025], 1024, true)
                .unwrap_err()
                .status,
            431
        );
        assert_eq!(
            check_session_key(&[b'a'; 1025], 1024, false)
                .unwrap_err()
                .status,
            400
        );
    }
}
