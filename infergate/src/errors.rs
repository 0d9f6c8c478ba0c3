//! The errors the router answers itself, in OpenAI's shape (`{"error":{"message","type","code"}}`), and the map
//! from a proxy failure to one of them.

use bytes::Bytes;
use pingora_error::{Error, ErrorSource, ErrorType};

/// An error the router answers with, OpenAI-style.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: u16,
    pub message: String,
    pub kind: &'static str,
    pub code: &'static str,
    /// Seconds for a `Retry-After` header.
    pub retry_after: Option<u32>,
}

impl ApiError {
    pub fn new(
        status: u16,
        kind: &'static str,
        code: &'static str,
        message: impl Into<String>,
    ) -> Self {
        ApiError {
            status,
            message: message.into(),
            kind,
            code,
            retry_after: None,
        }
    }

    fn retry_after(mut self, secs: u32) -> Self {
        self.retry_after = Some(secs);
        self
    }

    pub fn model_not_found(model: Option<&str>) -> Self {
        let message = match model {
            Some(model) => {
                format!("The model `{model}` does not exist or is not served by this router.")
            }
            None => "The request names no `model` and this router has no `*` pool.".to_string(),
        };
        Self::new(404, "invalid_request_error", "model_not_found", message)
    }

    /// A path this router does not serve: neither the inference API nor listed in `expose_paths`.
    pub fn not_found(method: &str, path: &str) -> Self {
        Self::new(
            404,
            "invalid_request_error",
            "not_found",
            format!("Invalid URL ({method} {path}): this router serves only the inference API"),
        )
    }

    /// A stored response this router knows no holder of: never made through it, forgotten, or no response id. The
    /// id is echoed (as vLLM does) only when it is a well-formed one.
    pub fn response_not_found(id: &str) -> Self {
        let message = if crate::paths::is_valid_response_id(id) {
            format!("Response with id '{id}' not found.")
        } else {
            "Response not found: the id is not a response id.".to_string()
        };
        Self::new(404, "invalid_request_error", "response_not_found", message)
    }

    /// The engine holding a stored response cannot take a request for it now (down, ejected or at its limit); no
    /// other engine has the response.
    pub fn response_holder_unavailable(id: &str, endpoint: &str) -> Self {
        Self::new(
            503,
            "service_unavailable",
            "response_holder_unavailable",
            format!("the engine holding response '{id}' ({endpoint}) is unavailable; retry later"),
        )
        .retry_after(2)
    }

    /// A CORS preflight from a web origin `cors_allowed_origins` does not list.
    pub fn cors_origin_not_allowed() -> Self {
        Self::new(
            403,
            "invalid_request_error",
            "cors_origin_not_allowed",
            "this origin may not call the API from a browser (see cors_allowed_origins)",
        )
    }

    /// A CORS preflight whose `Access-Control-Request-Headers` is not a plain list of header names.
    pub fn cors_bad_request_headers() -> Self {
        Self::new(
            400,
            "invalid_request_error",
            "bad_request",
            "Access-Control-Request-Headers must be a list of header names",
        )
    }

    /// A request target that cannot be normalised (encoded separators, dot segments, bad escapes, ...).
    pub fn invalid_path(reason: &str) -> Self {
        Self::new(
            400,
            "invalid_request_error",
            "invalid_path",
            format!("invalid request path: {reason}"),
        )
    }

    /// A request whose HTTP framing breaks a rule the router keeps (`framing`): Host, Transfer-Encoding, Upgrade.
    pub fn bad_framing(message: &str) -> Self {
        Self::new(400, "invalid_request_error", "bad_request", message)
    }

    /// A transfer coding other than `chunked`: not implemented, as nginx answers it.
    pub fn unsupported_transfer_coding() -> Self {
        Self::new(
            501,
            "invalid_request_error",
            "unsupported_transfer_coding",
            "Only the chunked transfer coding is supported.",
        )
    }

    /// A session key longer than `max_session_key_bytes`: 431 in a header, 400 in the body.
    pub fn session_key_too_large(limit: usize, from_header: bool) -> Self {
        let (status, place) = if from_header {
            (431, "session header value")
        } else {
            (400, "prompt_cache_key")
        };
        Self::new(
            status,
            "invalid_request_error",
            "session_key_too_large",
            format!("The {place} is longer than {limit} bytes."),
        )
    }

    pub fn no_healthy_endpoint(pool: &str) -> Self {
        Self::new(
            503,
            "service_unavailable",
            "no_healthy_endpoint",
            format!("pool `{pool}` has no healthy endpoint; retry later"),
        )
        .retry_after(2)
    }

    pub fn upstream_unreachable(pool: &str) -> Self {
        Self::new(
            502,
            "upstream_error",
            "upstream_unreachable",
            format!("every healthy endpoint of pool `{pool}` failed to connect"),
        )
    }

    pub fn invalid_content_length() -> Self {
        Self::new(
            400,
            "invalid_request_error",
            "invalid_content_length",
            "invalid Content-Length header",
        )
    }

    pub fn body_too_large(limit: usize, size: Option<u64>) -> Self {
        let message = match size {
            Some(n) => format!("request body of {n} bytes exceeds the limit of {limit} bytes"),
            None => format!("request body exceeds the limit of {limit} bytes"),
        };
        Self::new(413, "invalid_request_error", "request_too_large", message)
    }

    pub fn body_timeout() -> Self {
        Self::new(
            408,
            "invalid_request_error",
            "request_timeout",
            "the request body did not arrive in time",
        )
    }

    pub fn malformed_body() -> Self {
        Self::new(
            400,
            "invalid_request_error",
            "bad_request",
            "malformed request body",
        )
    }

    /// The process-wide budget for request bodies held for routing is spent: a flood of large uploads.
    pub fn router_busy() -> Self {
        Self::new(
            503,
            "service_unavailable",
            "router_overloaded",
            "the router is holding too many request bodies; retry shortly",
        )
        .retry_after(1)
    }

    /// Auth is on and the request carries no key.
    pub fn missing_api_key() -> Self {
        Self::new(
            401,
            "invalid_request_error",
            "invalid_api_key",
            "Missing API key: send it as `Authorization: Bearer KEY` or `x-api-key: KEY`.",
        )
    }

    /// Auth is on and the request's key is not one of the configured keys (the key is never echoed).
    pub fn invalid_api_key() -> Self {
        Self::new(
            401,
            "invalid_request_error",
            "invalid_api_key",
            "Incorrect API key provided.",
        )
    }

    /// A client key's limit refused the request; `kind` is OpenAI's `requests` or `tokens`.
    pub fn rate_limited(kind: &'static str, message: String, retry_after: u32) -> Self {
        Self::new(429, kind, "rate_limit_exceeded", message).retry_after(retry_after)
    }

    /// Every endpoint of the pool is at its in-flight limit and its wait queue is full.
    pub fn queue_full(pool: &str, retry_after: u32) -> Self {
        Self::new(
            503,
            "service_unavailable",
            "queue_full",
            format!(
                "every endpoint of pool `{pool}` is busy and its wait queue is full; retry later"
            ),
        )
        .retry_after(retry_after)
    }

    /// The request waited in the pool's queue for its longest wait without an endpoint freeing up for it.
    pub fn queue_timeout(pool: &str, retry_after: u32) -> Self {
        Self::new(
            503,
            "service_unavailable",
            "queue_timeout",
            format!(
                "every endpoint of pool `{pool}` stayed busy while the request waited; retry later"
            ),
        )
        .retry_after(retry_after)
    }

    pub fn upstream_timeout() -> Self {
        Self::new(
            504,
            "upstream_error",
            "upstream_timeout",
            "the engine did not answer in time",
        )
    }

    pub fn upstream_failed() -> Self {
        Self::new(
            502,
            "upstream_error",
            "upstream_unreachable",
            "the engine connection failed",
        )
    }

    pub fn internal() -> Self {
        Self::new(
            500,
            "internal_error",
            "internal_error",
            "internal router error",
        )
    }

    pub fn body(&self) -> Bytes {
        let v = serde_json::json!({"error": {"message": self.message, "type": self.kind, "code": self.code}});
        Bytes::from(v.to_string())
    }

    /// Map a failure to what the client is told; None when the client is gone (nothing to answer).
    pub fn from_proxy_error(e: &Error) -> Option<ApiError> {
        use ErrorType::*;
        if let HTTPStatus(code) = e.etype() {
            return Some(Self::new(
                *code,
                "upstream_error",
                "http_error",
                "request failed",
            ));
        }
        match e.esource() {
            ErrorSource::Upstream => Some(match e.etype() {
                ConnectTimedout | ReadTimedout | WriteTimedout | TLSHandshakeTimedout => {
                    Self::upstream_timeout()
                }
                _ => Self::upstream_failed(),
            }),
            ErrorSource::Downstream => match e.etype() {
                WriteError | ReadError | ConnectionClosed => None,
                ReadTimedout => Some(Self::body_timeout()),
                _ => Some(Self::malformed_body()),
            },
            ErrorSource::Internal | ErrorSource::Unset => Some(Self::internal()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn body_is_openai_shaped() {
        let v: serde_json::Value =
            serde_json::from_slice(&ApiError::model_not_found(Some("x")).body()).unwrap();
        assert_eq!(v["error"]["code"], "model_not_found");
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert!(v["error"]["message"].as_str().unwrap().contains("`x`"));
    }

    #[test]
    fn not_found_is_openai_shaped() {
        let v: serde_json::Value =
            serde_json::from_slice(&ApiError::not_found("POST", "/sleep").body()).unwrap();
        assert_eq!(v["error"]["code"], "not_found");
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert!(v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("(POST /sleep)"));
        assert_eq!(ApiError::not_found("GET", "/metrics").status, 404);
        assert_eq!(ApiError::invalid_path("x").status, 400);
    }

    #[test]
    fn proxy_errors_map_to_statuses() {
        let up = Error::new_up;
        let down = Error::new_down;
        let status = |e: &Error| ApiError::from_proxy_error(e).map(|a| a.status);
        assert_eq!(status(&up(ErrorType::ReadTimedout)), Some(504));
        assert_eq!(status(&up(ErrorType::ConnectRefused)), Some(502));
        assert_eq!(status(&down(ErrorType::ConnectionClosed)), None);
        assert_eq!(status(&down(ErrorType::ReadTimedout)), Some(408));
        assert_eq!(status(&down(ErrorType::new("InvalidChunk"))), Some(400));
        assert_eq!(status(&Error::new(ErrorType::HTTPStatus(413))), Some(413));
    }
}
