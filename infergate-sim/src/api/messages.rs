//! Anthropic's messages API as the simulator serves it: `/v1/messages` shapes and `/v1/messages/count_tokens`.

use serde_json::{json, Value};

use super::reply::Reply;
use super::respond::{respond_error, respond_json};
use crate::engine::Engine;
use crate::http::{ConnIo, InBuf, Request};
use crate::scheduler::TokenEvent;
use crate::tokenize::{self, output_token, ApiKind, BadRequest};

/// Counts a messages body's prompt at once: nothing is scheduled.
pub(super) async fn count_tokens(eng: &Engine, req: &Request, io: &mut ConnIo, rb: &InBuf) -> bool {
    let v: Value = match serde_json::from_slice(&req.body) {
        Ok(v) => v,
        Err(e) => {
            let msg = format!("invalid JSON body: {e}");
            return respond_error(io, rb, req, Some(ApiKind::Messages), 400, &msg).await;
        }
    };
    match tokenize::prompt_of(ApiKind::Messages, &v, eng.cfg.block_tokens, false) {
        Ok(p) => respond_json(io, rb, req, 200, &json!({"input_tokens": p.len})).await,
        Err(BadRequest(m)) => respond_error(io, rb, req, Some(ApiKind::Messages), 400, &m).await,
    }
}

impl Reply {
    fn anthropic_usage(&self, output: usize, cached: usize) -> Value {
        json!({"input_tokens": self.prompt_tokens, "output_tokens": output, "cache_read_input_tokens": cached,
               "cache_creation_input_tokens": 0})
    }

    /// Anthropic's `stop_reason`: `end_turn` at end of sequence, `max_tokens` at the request's limit.
    fn stop_reason(&self) -> &'static str {
        if self.ended_itself {
            "end_turn"
        } else {
            "max_tokens"
        }
    }

    fn anthropic_message(&self, content: Value, stop: Value, usage: Value) -> Value {
        json!({"id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": content,
               "stop_reason": stop, "stop_sequence": null, "usage": usage})
    }

    /// `message_start` and `content_block_start` before the first token, then one delta per token.
    pub(super) fn messages_token_events(&self, ev: &TokenEvent) -> Vec<Vec<u8>> {
        let tok = output_token(ev.index);
        let mut out = Vec::new();
        if ev.index == 0 {
            let start = self.anthropic_message(
                json!([]),
                Value::Null,
                self.anthropic_usage(0, ev.cached_tokens),
            );
            out.push(Self::event(
                "message_start",
                &json!({"type": "message_start", "message": start}),
            ));
            out.push(Self::event(
                "content_block_start",
                &json!({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}),
            ));
        }
        out.push(Self::event(
            "content_block_delta",
            &json!({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": tok}}),
        ));
        out
    }

    pub(super) fn messages_tail_events(&self) -> Vec<Vec<u8>> {
        vec![
            Self::event(
                "content_block_stop",
                &json!({"type": "content_block_stop", "index": 0}),
            ),
            Self::event(
                "message_delta",
                &json!({"type": "message_delta", "delta": {"stop_reason": self.stop_reason(), "stop_sequence": null},
                        "usage": {"output_tokens": self.max_tokens}}),
            ),
            Self::event("message_stop", &json!({"type": "message_stop"})),
        ]
    }

    pub(super) fn messages_full_body(&self, cached: usize) -> Value {
        let text = self.output_text();
        self.anthropic_message(
            json!([{"type": "text", "text": text}]),
            json!(self.stop_reason()),
            self.anthropic_usage(self.max_tokens, cached),
        )
    }
}
