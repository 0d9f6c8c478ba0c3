//! Error bodies in the shapes the simulated servers send: OpenAI's as vLLM writes it, and Anthropic's.

use serde_json::json;

use super::http;
use super::tokenize::ApiKind;

/// `{"error":{"message","type","param","code"}}` as vLLM's OpenAI server sends it.
pub(crate) fn openai_error_body(status: u16, msg: &str) -> Vec<u8> {
    let typ = match status {
        400 | 413 | 422 | 431 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        405 => "method_not_allowed",
        429 => "rate_limit_error",
        s if s >= 500 => "server_error",
        _ => "error",
    };
    serde_json::to_vec(
        &json!({"error": {"message": msg, "type": typ, "param": null, "code": status}}),
    )
    .unwrap()
}

pub(crate) fn anthropic_error_body(status: u16, msg: &str) -> Vec<u8> {
    let typ = match status {
        400 | 413 | 422 => "invalid_request_error",
        401 => "authentication_error",
        403 => "permission_error",
        404 => "not_found_error",
        429 => "rate_limit_error",
        529 | 503 => "overloaded_error",
        _ => "api_error",
    };
    serde_json::to_vec(&json!({"type": "error", "error": {"type": typ, "message": msg}})).unwrap()
}

/// vLLM's name for an error type: the status's reason phrase in CamelCase plus `Error`, as vLLM's
/// `create_error_response` names them ("BadRequestError", "NotFoundError", "InternalServerError"; the same rule
/// gives "TooManyRequestsError" and "ServiceUnavailableError").
fn vllm_error_type(status: u16) -> String {
    let phrase = http::reason(status);
    if phrase == "Status" {
        return "Error".into();
    }
    let mut t: String = phrase.split(' ').collect();
    if !t.ends_with("Error") {
        t.push_str("Error");
    }
    t
}

/// The error body of vLLM's OpenAI-compatible server today (`ErrorResponse { error: ErrorInfo }` in
/// `vllm/entrypoints/openai/engine/protocol.py`, since vLLM 0.10.1; before that the same four fields sat at the
/// top level beside `"object": "error"`): `{"error": {"message", "type", "param", "code"}}`.
pub(crate) fn vllm_error_body(status: u16, msg: &str, param: Option<&str>) -> Vec<u8> {
    typed_error_body(status, &vllm_error_type(status), msg, param)
}

/// vLLM's error body with the type its serving code names itself (`invalid_request_error` for the Responses API's
/// store checks, whatever the status).
pub(crate) fn typed_error_body(status: u16, typ: &str, msg: &str, param: Option<&str>) -> Vec<u8> {
    json!({"error": {"message": msg, "type": typ, "param": param, "code": status}})
        .to_string()
        .into_bytes()
}

pub(crate) fn error_body(kind: Option<ApiKind>, status: u16, msg: &str) -> Vec<u8> {
    match kind {
        Some(ApiKind::Messages) => anthropic_error_body(status, msg),
        _ => openai_error_body(status, msg),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{json, Value};

    use super::*;

    fn parsed(body: Vec<u8>) -> Value {
        serde_json::from_slice(&body).unwrap()
    }

    #[test]
    fn openai_error_types_follow_the_status() {
        for (status, typ) in [
            (400, "invalid_request_error"),
            (413, "invalid_request_error"),
            (431, "invalid_request_error"),
            (401, "authentication_error"),
            (403, "permission_error"),
            (404, "not_found_error"),
            (405, "method_not_allowed"),
            (429, "rate_limit_error"),
            (500, "server_error"),
            (503, "server_error"),
            (418, "error"),
        ] {
            assert_eq!(
                parsed(openai_error_body(status, "m")),
                json!({"error": {"message": "m", "type": typ, "param": null, "code": status}}),
                "{status}"
            );
        }
    }

    #[test]
    fn anthropic_error_types_follow_the_status() {
        for (status, typ) in [
            (400, "invalid_request_error"),
            (401, "authentication_error"),
            (403, "permission_error"),
            (404, "not_found_error"),
            (429, "rate_limit_error"),
            (503, "overloaded_error"),
            (529, "overloaded_error"),
            (500, "api_error"),
        ] {
            assert_eq!(
                parsed(anthropic_error_body(status, "m")),
                json!({"type": "error", "error": {"type": typ, "message": "m"}}),
                "{status}"
            );
        }
    }

    #[test]
    fn vllm_error_types_are_the_reason_phrase_in_camel_case() {
        assert_eq!(vllm_error_type(400), "BadRequestError");
        assert_eq!(vllm_error_type(404), "NotFoundError");
        assert_eq!(vllm_error_type(429), "TooManyRequestsError");
        assert_eq!(vllm_error_type(500), "InternalServerError");
        assert_eq!(vllm_error_type(503), "ServiceUnavailableError");
        // A status without a known reason phrase.
        assert_eq!(vllm_error_type(599), "Error");
    }

    #[test]
    fn vllm_and_typed_bodies_carry_the_param() {
        assert_eq!(
            parsed(vllm_error_body(400, "too long", Some("max_tokens"))),
            json!({"error": {"message": "too long", "type": "BadRequestError", "param": "max_tokens",
                             "code": 400}})
        );
        assert_eq!(
            parsed(vllm_error_body(503, "down", None))["error"]["param"],
            Value::Null
        );
        assert_eq!(
            parsed(typed_error_body(
                404,
                "invalid_request_error",
                "gone",
                Some("response_id")
            )),
            json!({"error": {"message": "gone", "type": "invalid_request_error", "param": "response_id",
                             "code": 404}})
        );
    }

    #[test]
    fn only_the_messages_route_answers_in_anthropics_shape() {
        assert_eq!(
            error_body(Some(ApiKind::Messages), 400, "m"),
            anthropic_error_body(400, "m")
        );
        for kind in [
            None,
            Some(ApiKind::Chat),
            Some(ApiKind::Completion),
            Some(ApiKind::Responses),
        ] {
            assert_eq!(error_body(kind, 400, "m"), openai_error_body(400, "m"));
        }
    }
}
