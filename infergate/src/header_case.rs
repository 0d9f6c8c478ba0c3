//! Pingora's header-case maps dropped from requests and responses: names go out in their canonical case, and every
//! later header edit and copy touches one map instead of two.
//!
//! Pingora keeps each HTTP/1 message's header names twice: once parsed and once as received, to write them back in
//! the same case. Header names are case-insensitive (RFC 9110 §5.1) and vLLM's server reads and writes them in
//! lower case, so the second map only costs: every insert the router makes (request id, client address, endpoint)
//! parses, allocates and may grow both, and Pingora copies both for the upstream request.

use http::{HeaderMap, HeaderName, HeaderValue};
use pingora_error::{ErrorType, OrErr, Result};
use pingora_http::{RequestHeader, ResponseHeader};

/// Header edits the router makes: on the header map itself where the message has no case map, through Pingora's
/// methods where it keeps one. Pingora's `insert_header` parses the name again and copies a custom one on every
/// call; the map takes a parsed name as it is.
pub trait Headers {
    /// The headers as they stand.
    fn map(&self) -> &HeaderMap;
    /// Replace every value of `name` with `value`.
    fn set(&mut self, name: &HeaderName, value: HeaderValue) -> Result<()>;
    /// Add `value` after the values `name` has.
    fn append(&mut self, name: &HeaderName, value: HeaderValue) -> Result<()>;
    /// Remove every value of `name`.
    fn remove(&mut self, name: &HeaderName);
}

impl Headers for HeaderMap {
    fn map(&self) -> &HeaderMap {
        self
    }
    fn set(&mut self, name: &HeaderName, value: HeaderValue) -> Result<()> {
        self.try_insert(name.clone(), value)
            .map(drop)
            .or_err(ErrorType::InvalidHTTPHeader, "too many headers")
    }
    fn append(&mut self, name: &HeaderName, value: HeaderValue) -> Result<()> {
        self.try_append(name.clone(), value)
            .map(drop)
            .or_err(ErrorType::InvalidHTTPHeader, "too many headers")
    }
    fn remove(&mut self, name: &HeaderName) {
        HeaderMap::remove(self, name);
    }
}

/// Pingora's two message types: through their own methods, which keep a case map in step.
macro_rules! through_pingora {
    ($($t:ty),*) => {$(
        impl Headers for $t {
            fn map(&self) -> &HeaderMap {
                &self.headers
            }
            fn set(&mut self, name: &HeaderName, value: HeaderValue) -> Result<()> {
                self.insert_header(name.clone(), value)
            }
            fn append(&mut self, name: &HeaderName, value: HeaderValue) -> Result<()> {
                self.append_header(name.clone(), value).map(drop)
            }
            fn remove(&mut self, name: &HeaderName) {
                self.remove_header(name);
            }
        }
    )*};
}

through_pingora!(RequestHeader, ResponseHeader);

/// Whether `req`'s target comes back byte for byte from its URI (origin-form, UTF-8): then the request can be
/// rebuilt from its parts without changing what goes on the wire.
fn target_from_uri(req: &RequestHeader) -> bool {
    let from_uri = req.uri.path_and_query().map_or("/", |p| p.as_str());
    req.raw_path_is_utf8() && req.raw_path() == from_uri.as_bytes()
}

/// Run `edit` on `req`'s headers, dropping its case map on the way: directly on the header map, unless the
/// request-target is one the URI does not reproduce (absolute-form, not UTF-8), which keeps the case map and goes
/// through Pingora's methods.
pub fn edit_request<R>(req: &mut RequestHeader, edit: impl FnOnce(&mut dyn Headers) -> R) -> R {
    if !target_from_uri(req) {
        return edit(req);
    }
    let end_stream = req.send_end_stream();
    let placeholder = RequestHeader::from(http::Request::new(()).into_parts().0);
    let mut parts = http::request::Parts::from(std::mem::replace(req, placeholder));
    let out = edit(&mut parts.headers);
    *req = RequestHeader::from(parts);
    if let Some(end_stream) = end_stream {
        req.set_send_end_stream(end_stream);
    }
    out
}

/// Drop `req`'s case map. A request-target the URI does not reproduce byte for byte (absolute-form, not UTF-8)
/// keeps it: rebuilding from the URI would change the target.
pub fn plain_request(req: &mut RequestHeader) {
    if req.has_case() {
        edit_request(req, |_| ());
    }
}

/// Headers a response usually gains after the engine's: the router's (request id, endpoint, CORS) and Pingora's
/// (`Date`, `Connection`). Pingora sizes the map for the engine's headers alone, and a full map grows (rehashes
/// every header) on the next insert, even one that replaces a value: made once up front, the room spares the
/// second growth that Pingora's own inserts would otherwise cause.
const RESPONSE_HEADROOM: usize = 6;

/// Run `edit` on `resp`'s headers directly on the header map, dropping its case map; a reason phrase other than
/// the status's own is kept.
pub fn edit_response<R>(resp: &mut ResponseHeader, edit: impl FnOnce(&mut dyn Headers) -> R) -> R {
    let reason = resp
        .get_reason_phrase()
        .filter(|r| Some(*r) != resp.status.canonical_reason())
        .map(str::to_string);
    let placeholder = ResponseHeader::from(http::Response::new(()).into_parts().0);
    let mut parts = http::response::Parts::from(std::mem::replace(resp, placeholder));
    // Cannot exceed the map's limit (32k headers) with a response Pingora parsed; if it did, the edit's own
    // inserts report it.
    let _ = parts.headers.try_reserve(RESPONSE_HEADROOM);
    let out = edit(&mut parts.headers);
    *resp = ResponseHeader::from(parts);
    if reason.is_some() {
        // Cannot fail: the phrase came from a parsed response.
        let _ = resp.set_reason_phrase(reason.as_deref());
    }
    out
}

/// Drop `resp`'s case map; a reason phrase other than the status's own is kept.
pub fn plain_response(resp: &mut ResponseHeader) {
    if resp.has_case() {
        edit_response(resp, |_| ());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wire_req(req: &RequestHeader) -> String {
        let mut buf = Vec::new();
        req.header_to_h1_wire(&mut buf);
        String::from_utf8(buf).unwrap()
    }

    #[test]
    fn a_request_keeps_its_headers_target_and_order_in_canonical_case() {
        let mut req = RequestHeader::build("POST", b"/v1/chat/completions?x=1", None).unwrap();
        req.append_header("X-Session-ID", "s1").unwrap();
        req.append_header("content-TYPE", "application/json")
            .unwrap();
        req.append_header("X-Multi", "a").unwrap();
        req.append_header("X-Multi", "b").unwrap();
        assert!(req.has_case());
        plain_request(&mut req);
        assert!(!req.has_case());
        assert_eq!(req.method, "POST");
        assert_eq!(req.raw_path(), b"/v1/chat/completions?x=1");
        assert_eq!(
            wire_req(&req),
            "x-session-id: s1\r\nContent-Type: application/json\r\nx-multi: a\r\nx-multi: b\r\n"
        );
        // Edits after it work on the one map.
        req.insert_header("x-request-id", "r").unwrap();
        req.remove_header("x-multi");
        assert_eq!(req.headers.get("x-request-id").unwrap(), "r");
        assert!(req.headers.get("x-multi").is_none());
    }

    #[test]
    fn a_target_the_uri_would_not_reproduce_keeps_the_case_map() {
        let mut req =
            RequestHeader::build("POST", b"http://engine:8000/v1/completions", None).unwrap();
        req.append_header("X-A", "1").unwrap();
        plain_request(&mut req);
        assert!(req.has_case());
        assert_eq!(req.raw_path(), b"http://engine:8000/v1/completions");
        let mut req = RequestHeader::build("GET", b"/caf\xe9", None).unwrap();
        req.append_header("X-A", "1").unwrap();
        plain_request(&mut req);
        assert!(req.has_case());
        assert_eq!(req.raw_path(), b"/caf\xe9");
    }

    #[test]
    fn a_response_keeps_status_headers_and_an_unusual_reason() {
        let mut resp = ResponseHeader::build(200, None).unwrap();
        resp.append_header("Content-Type", "text/event-stream")
            .unwrap();
        resp.append_header("X-Engine", "e1").unwrap();
        plain_response(&mut resp);
        assert!(!resp.has_case());
        assert_eq!(resp.status, 200);
        assert_eq!(resp.headers.get("x-engine").unwrap(), "e1");
        assert_eq!(resp.get_reason_phrase(), Some("OK"));

        let mut resp = ResponseHeader::build(429, None).unwrap();
        resp.set_reason_phrase(Some("Slow Down")).unwrap();
        resp.append_header("Retry-After", "2").unwrap();
        plain_response(&mut resp);
        assert!(!resp.has_case());
        assert_eq!(resp.get_reason_phrase(), Some("Slow Down"));
        assert_eq!(resp.headers.get("retry-after").unwrap(), "2");
    }

    #[test]
    fn edits_go_to_the_map_and_keep_the_target_version_and_end_stream() {
        let mut req = RequestHeader::build("POST", b"/v1/chat/completions?x=1", None).unwrap();
        req.set_version(http::Version::HTTP_2);
        req.set_send_end_stream(false);
        req.append_header("X-Multi", "a").unwrap();
        let name = HeaderName::from_static("x-request-id");
        edit_request(&mut req, |h| {
            h.set(&name, HeaderValue::from_static("r1")).unwrap();
            h.append(&name, HeaderValue::from_static("r2")).unwrap();
            h.remove(&HeaderName::from_static("x-multi"));
        });
        assert!(!req.has_case());
        assert_eq!(req.raw_path(), b"/v1/chat/completions?x=1");
        assert_eq!(req.version, http::Version::HTTP_2);
        assert_eq!(req.send_end_stream(), Some(false));
        let ids: Vec<_> = req.headers.get_all(&name).iter().collect();
        assert_eq!(ids, ["r1", "r2"]);
        assert!(req.headers.get("x-multi").is_none());
    }

    #[test]
    fn a_target_the_uri_would_not_reproduce_is_edited_through_pingora() {
        let mut req =
            RequestHeader::build("POST", b"http://engine:8000/v1/completions", None).unwrap();
        req.append_header("X-A", "1").unwrap();
        edit_request(&mut req, |h| {
            h.set(
                &HeaderName::from_static("x-b"),
                HeaderValue::from_static("2"),
            )
            .unwrap()
        });
        assert!(req.has_case());
        assert_eq!(req.raw_path(), b"http://engine:8000/v1/completions");
        assert_eq!(wire_req(&req), "X-A: 1\r\nx-b: 2\r\n");
    }

    #[test]
    fn a_response_edited_on_the_map_keeps_an_unusual_reason() {
        let mut resp = ResponseHeader::build(429, None).unwrap();
        resp.set_reason_phrase(Some("Slow Down")).unwrap();
        resp.append_header("Retry-After", "2").unwrap();
        edit_response(&mut resp, |h| {
            h.set(
                &HeaderName::from_static("x-request-id"),
                HeaderValue::from_static("r"),
            )
            .unwrap()
        });
        assert!(!resp.has_case());
        assert_eq!(resp.get_reason_phrase(), Some("Slow Down"));
        assert_eq!(resp.headers.get("x-request-id").unwrap(), "r");
        assert_eq!(resp.headers.get("retry-after").unwrap(), "2");
    }

    #[test]
    fn an_edited_response_has_room_for_pingoras_date_and_connection() {
        // Sized by Pingora for the engine's three headers, as it parses them.
        let mut resp = ResponseHeader::build(200, Some(3)).unwrap();
        resp.set_reason_phrase(Some("Fine")).unwrap();
        for (k, v) in [
            ("server", "e"),
            ("content-type", "application/json"),
            ("content-length", "9"),
        ] {
            resp.append_header(k, v).unwrap();
        }
        // As the hooks do: the case map goes first (upstream_response_filter), then the headers are edited in
        // place on the plain map (response_filter).
        plain_response(&mut resp);
        assert!(!resp.has_case());
        edit_response(&mut resp, |h| {
            for name in ["x-request-id", "x-infergate-endpoint"] {
                h.set(
                    &HeaderName::from_static(name),
                    HeaderValue::from_static("v"),
                )
                .unwrap();
            }
        });
        assert_eq!(resp.get_reason_phrase(), Some("Fine"));
        assert_eq!(resp.headers.len(), 5);
        assert_eq!(resp.headers.get("x-infergate-endpoint").unwrap(), "v");
        assert_eq!(resp.headers.get("server").unwrap(), "e");
        // Pingora then inserts Date and Connection: neither may grow the map again.
        assert!(
            resp.headers.capacity() >= resp.headers.len() + 2,
            "{} of {}",
            resp.headers.len(),
            resp.headers.capacity()
        );
    }
}
