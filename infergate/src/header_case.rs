//! Pingora's header-case maps dropped from requests and responses: names go out in their canonical case, and every
//! later header edit and copy touches one map instead of two.
//!
//! Pingora keeps each HTTP/1 message's header names twice: once parsed and once as received, to write them back in
//! the same case. Header names are case-insensitive (RFC 9110 §5.1) and vLLM's server reads and writes them in
//! lower case, so the second map only costs: every insert the router makes (request id, client address, endpoint)
//! parses, allocates and may grow both, and Pingora copies both for the upstream request.

use pingora_http::{RequestHeader, ResponseHeader};

/// Drop `req`'s case map. A request-target the URI does not reproduce byte for byte (absolute-form, not UTF-8)
/// keeps it: rebuilding from the URI would change the target.
pub fn plain_request(req: &mut RequestHeader) {
    let from_uri = req.uri.path_and_query().map_or("/", |p| p.as_str());
    if !req.has_case() || !req.raw_path_is_utf8() || req.raw_path() != from_uri.as_bytes() {
        return;
    }
    let placeholder = RequestHeader::from(http::Request::new(()).into_parts().0);
    let parts = http::request::Parts::from(std::mem::replace(req, placeholder));
    *req = RequestHeader::from(parts);
}

/// Drop `resp`'s case map; a reason phrase other than the status's own is kept.
pub fn plain_response(resp: &mut ResponseHeader) {
    if !resp.has_case() {
        return;
    }
    let reason = resp
        .get_reason_phrase()
        .filter(|r| Some(*r) != resp.status.canonical_reason())
        .map(str::to_string);
    let placeholder = ResponseHeader::from(http::Response::new(()).into_parts().0);
    let parts = http::response::Parts::from(std::mem::replace(resp, placeholder));
    *resp = ResponseHeader::from(parts);
    if reason.is_some() {
        // Cannot fail: the phrase came from a parsed response.
        let _ = resp.set_reason_phrase(reason.as_deref());
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
}
