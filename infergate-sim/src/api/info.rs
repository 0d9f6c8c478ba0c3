//! The engine's own routes: `/health`, `/v1/models`, `/version`, `/metrics` and vLLM's `/tokenize`.

use serde_json::{json, Value};

use super::reply::now_secs;
use super::respond::{respond, respond_error, respond_json};
use crate::engine::Engine;
use crate::http::{ConnIo, InBuf, Request};
use crate::metrics as prometheus;
use crate::tokenize::{self, ApiKind, BadRequest};

pub(super) async fn health(eng: &Engine, req: &Request, io: &mut ConnIo, rb: &InBuf) -> bool {
    let status = eng.control.health_status();
    respond(io, rb, req, status, "", b"").await
}

pub(super) async fn models(eng: &Engine, req: &Request, io: &mut ConnIo, rb: &InBuf) -> bool {
    let m = &eng.cfg.model;
    let v = json!({"object": "list", "data": [{
        "id": m, "object": "model", "created": now_secs(), "owned_by": "engine-sim", "root": m,
        "parent": null, "max_model_len": eng.cfg.max_model_len, "permission": []
    }]});
    respond_json(io, rb, req, 200, &v).await
}

pub(super) async fn version(req: &Request, io: &mut ConnIo, rb: &InBuf) -> bool {
    respond_json(io, rb, req, 200, &json!({"version": "engine-sim"})).await
}

pub(super) async fn metrics(eng: &Engine, req: &Request, io: &mut ConnIo, rb: &InBuf) -> bool {
    let c = eng.sched.snapshot();
    let text = prometheus::render(
        &eng.cfg,
        &c,
        eng.control.extra_running(),
        eng.control.extra_waiting(),
    );
    respond(
        io,
        rb,
        req,
        200,
        "text/plain; version=0.0.4; charset=utf-8",
        text.as_bytes(),
    )
    .await
}

pub(super) async fn tokenize(eng: &Engine, req: &Request, io: &mut ConnIo, rb: &InBuf) -> bool {
    let v: Value = match serde_json::from_slice(&req.body) {
        Ok(v) => v,
        Err(e) => {
            return respond_error(io, rb, req, None, 400, &format!("invalid JSON body: {e}")).await
        }
    };
    let kind = tokenize_kind(&v);
    match tokenize::prompt_of(kind, &v, eng.cfg.block_tokens, true) {
        Ok(p) => {
            let body =
                json!({"count": p.len, "max_model_len": eng.cfg.max_model_len, "tokens": p.ids});
            respond_json(io, rb, req, 200, &body).await
        }
        Err(BadRequest(m)) => respond_error(io, rb, req, None, 400, &m).await,
    }
}

/// `/tokenize` takes a chat body (`messages`) or a completion body (`prompt`), as vLLM's does.
fn tokenize_kind(v: &Value) -> ApiKind {
    if v.get("messages").is_some() {
        ApiKind::Chat
    } else {
        ApiKind::Completion
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn tokenize_reads_messages_as_chat_and_anything_else_as_a_prompt() {
        assert_eq!(
            tokenize_kind(&json!({"messages": [{"role": "user", "content": "hi"}]})),
            ApiKind::Chat
        );
        assert_eq!(tokenize_kind(&json!({"prompt": "hi"})), ApiKind::Completion);
        assert_eq!(tokenize_kind(&json!({})), ApiKind::Completion);
    }
}
