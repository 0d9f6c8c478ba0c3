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
