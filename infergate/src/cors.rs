//! What the client port tells browsers (CORS, `cors_allowed_origins`): the answer to a preflight, and which origin
//! may read each answer. Off by default; the engines' own CORS headers never reach the client either way, so the
//! router's setting is the only one in effect.

use http::HeaderValue;
use pingora_http::{RequestHeader, ResponseHeader};

use crate::header_case::Headers;

use crate::config::CorsOrigins;

/// How long a browser may keep a preflight's answer.
const MAX_AGE_SECONDS: &str = "600";

/// Response headers a page may read besides the CORS-safelisted ones.
const EXPOSED: &str = "x-request-id, x-infergate-endpoint, x-infergate-route, retry-after";

/// The longest `Access-Control-Request-Headers` echoed back; a longer list is refused.
const MAX_REQUEST_HEADERS_LEN: usize = 2048;

/// The `Access-Control-Allow-Origin` value for `req`, when it comes from an allowed origin.
pub fn allow_origin<'r>(cfg: &CorsOrigins, req: &'r RequestHeader) -> Option<&'r str> {
    if cfg.is_off() {
        return None;
    }
    let origin = req.headers.get("origin")?.to_str().ok()?;
    cfg.allow(origin)
}

/// The method a CORS preflight asks about (`OPTIONS` with `Origin` and `Access-Control-Request-Method`).
pub fn preflight_method(req: &RequestHeader) -> Option<&str> {
    if req.method != http::Method::OPTIONS || !req.headers.contains_key("origin") {
        return None;
    }
    req.headers
        .get("access-control-request-method")?
        .to_str()
        .ok()
}

/// What a preflight asks to send (`Access-Control-Request-Headers`).
#[derive(Debug, PartialEq, Eq)]
pub enum RequestedHeaders<'r> {
    None,
    /// A plain list of header names, echoed back as allowed.
    Names(&'r str),
    /// Anything else (other bytes, or longer than [`MAX_REQUEST_HEADERS_LEN`]): refused.
    Malformed,
}

pub fn requested_headers(req: &RequestHeader) -> RequestedHeaders<'_> {
    let Some(v) = req.headers.get("access-control-request-headers") else {
        return RequestedHeaders::None;
    };
    match v.to_str() {
        Ok(s)
            if s.len() <= MAX_REQUEST_HEADERS_LEN
                && s.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-_, ".contains(&b)) =>
        {
            RequestedHeaders::Names(s)
        }
        _ => RequestedHeaders::Malformed,
    }
}

/// An answer to the request `req`: the engine's CORS headers removed, the router's added for an allowed origin.
pub fn apply(
    cfg: &CorsOrigins,
    req: &RequestHeader,
    resp: &mut (impl Headers + ?Sized),
) -> pingora_error::Result<()> {
    // Only when the engine sent some.
    if resp
        .map()
        .contains_key(http::header::ACCESS_CONTROL_ALLOW_ORIGIN)
    {
        for name in [
            http::header::ACCESS_CONTROL_ALLOW_ORIGIN,
            http::header::ACCESS_CONTROL_ALLOW_CREDENTIALS,
            http::header::ACCESS_CONTROL_ALLOW_METHODS,
            http::header::ACCESS_CONTROL_ALLOW_HEADERS,
            http::header::ACCESS_CONTROL_EXPOSE_HEADERS,
            http::header::ACCESS_CONTROL_MAX_AGE,
        ] {
            resp.remove(&name);
        }
    }
    if let Some(allow) = allow_origin(cfg, req) {
        allow_headers(resp, allow)?;
    }
    Ok(())
}

fn allow_headers(resp: &mut (impl Headers + ?Sized), allow: &str) -> pingora_error::Result<()> {
    let invalid = |_| {
        pingora_error::Error::explain(
            pingora_error::ErrorType::InvalidHTTPHeader,
            "invalid origin",
        )
    };
    resp.set(
        &http::header::ACCESS_CONTROL_ALLOW_ORIGIN,
        HeaderValue::from_str(allow).map_err(invalid)?,
    )?;
    resp.set(
        &http::header::ACCESS_CONTROL_EXPOSE_HEADERS,
        HeaderValue::from_static(EXPOSED),
    )?;
    if allow != "*" {
        // The answer depends on the request's origin: a shared cache must not serve it to another.
        resp.append(&http::header::VARY, HeaderValue::from_static("Origin"))?;
    }
    Ok(())
}

/// The `204` that allows a preflight from `allow` for `method` with `headers`.
pub fn preflight_answer(
    allow: &str,
    method: &str,
    headers: Option<&str>,
) -> pingora_error::Result<ResponseHeader> {
    let mut resp = ResponseHeader::build(204, Some(6))?;
    allow_headers(&mut resp, allow)?;
    resp.insert_header("access-control-allow-methods", method)?;
    if let Some(h) = headers {
        resp.insert_header("access-control-allow-headers", h)?;
    }
    resp.insert_header("access-control-max-age", MAX_AGE_SECONDS)?;
    resp.insert_header("content-length", "0")?;
    Ok(resp)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(method: &str, headers: &[(&str, &str)]) -> RequestHeader {
        let mut r = RequestHeader::build(method, b"/v1/chat/completions", None).unwrap();
        for (k, v) in headers {
            r.insert_header(k.to_string(), *v).unwrap();
        }
        r
    }

    #[test]
    fn preflights_are_recognised_and_their_headers_checked() {
        let pre = req(
            "OPTIONS",
            &[
                ("origin", "https://app.example"),
                ("access-control-request-method", "POST"),
                (
                    "access-control-request-headers",
                    "authorization, content-type",
                ),
            ],
        );
        assert_eq!(preflight_method(&pre), Some("POST"));
        assert_eq!(
            requested_headers(&pre),
            RequestedHeaders::Names("authorization, content-type")
        );
        assert_eq!(preflight_method(&req("OPTIONS", &[("origin", "x")])), None);
        assert_eq!(
            preflight_method(&req(
                "POST",
                &[("origin", "x"), ("access-control-request-method", "POST")]
            )),
            None
        );
        let odd = req(
            "OPTIONS",
            &[("access-control-request-headers", "x;y=\"z\"")],
        );
        assert_eq!(requested_headers(&odd), RequestedHeaders::Malformed);
    }

    #[test]
    fn the_engines_cors_headers_are_replaced_by_the_routers() {
        let mut resp = ResponseHeader::build(200, None).unwrap();
        resp.insert_header("access-control-allow-origin", "*")
            .unwrap();
        resp.insert_header("access-control-allow-credentials", "true")
            .unwrap();
        let from = req("POST", &[("origin", "https://evil.example")]);
        apply(&CorsOrigins::default(), &from, &mut resp).unwrap();
        assert!(
            !resp.headers.contains_key("access-control-allow-origin"),
            "off: none"
        );
        assert!(!resp
            .headers
            .contains_key("access-control-allow-credentials"));
    }
}
