//! Writing complete (Content-Length) answers: JSON, error bodies in each route's shape, extra headers.

use serde_json::Value;

use crate::errors::{anthropic_error_body, error_body, typed_error_body, vllm_error_body};
use crate::http::{self, ConnIo, InBuf, Request};
use crate::tokenize::ApiKind;

/// Writes a complete response with a Content-Length body; returns whether the connection stays open.
pub(super) async fn respond(
    io: &mut ConnIo,
    rb: &InBuf,
    req: &Request,
    status: u16,
    ctype: &str,
    body: &[u8],
) -> bool {
    respond_with(io, rb, req, status, ctype, &[], body).await
}

/// [`respond`] with extra response headers.
pub(super) async fn respond_with(
    io: &mut ConnIo,
    rb: &InBuf,
    req: &Request,
    status: u16,
    ctype: &str,
    extra_headers: &[(&str, &str)],
    body: &[u8],
) -> bool {
    let keep = req.keep_alive;
    let mut head = http::head(status, ctype, Some(body.len()), keep, req.http10);
    if !extra_headers.is_empty() {
        // Insert before the blank line that ends the head.
        head.truncate(head.len() - 2);
        for (name, value) in extra_headers {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        head.push_str("\r\n");
    }
    let mut out = head.into_bytes();
    if req.method != "HEAD" {
        out.extend_from_slice(body);
    }
    io.write(&out, keep && rb.is_empty()).await.is_ok() && keep
}

pub(super) async fn respond_json(
    io: &mut ConnIo,
    rb: &InBuf,
    req: &Request,
    status: u16,
    v: &Value,
) -> bool {
    respond(
        io,
        rb,
        req,
        status,
        "application/json",
        &serde_json::to_vec(v).unwrap(),
    )
    .await
}

pub(super) async fn respond_error(
    io: &mut ConnIo,
    rb: &InBuf,
    req: &Request,
    kind: Option<ApiKind>,
    status: u16,
    msg: &str,
) -> bool {
    respond(
        io,
        rb,
        req,
        status,
        "application/json",
        &error_body(kind, status, msg),
    )
    .await
}

/// vLLM's `invalid_request_error` answer of the Responses API store (unknown id, refused background, cancel).
pub(super) async fn respond_invalid(
    io: &mut ConnIo,
    rb: &InBuf,
    req: &Request,
    status: u16,
    msg: &str,
    param: &str,
) -> bool {
    let body = typed_error_body(status, "invalid_request_error", msg, Some(param));
    respond(io, rb, req, status, "application/json", &body).await
}

pub(super) async fn respond_no_route(io: &mut ConnIo, rb: &InBuf, req: &Request) -> bool {
    let msg = format!("Not Found: {} {}", req.method, req.path);
    respond_error(io, rb, req, None, 404, &msg).await
}

/// An error answer of a generation route: vLLM's body for the OpenAI routes, Anthropic's for `/v1/messages`.
/// 429 and 503 carry `Retry-After: 1`, so clients and routers may try again (or elsewhere) a second later.
pub(super) async fn respond_gen_error(
    io: &mut ConnIo,
    rb: &InBuf,
    req: &Request,
    kind: ApiKind,
    status: u16,
    msg: &str,
    param: Option<&str>,
) -> bool {
    let body = match kind {
        ApiKind::Messages => anthropic_error_body(status, msg),
        ApiKind::Chat | ApiKind::Completion | ApiKind::Responses => {
            vllm_error_body(status, msg, param)
        }
    };
    let extra: &[(&str, &str)] = if matches!(status, 429 | 503) {
        &[("retry-after", "1")]
    } else {
        &[]
    };
    respond_with(io, rb, req, status, "application/json", extra, &body).await
}
