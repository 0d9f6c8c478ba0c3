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

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::super::reply::testing::{names, reply, sse, token};
    use super::*;

    #[test]
    fn the_first_token_opens_the_message_and_its_text_block() {
        let r = reply(ApiKind::Messages, 2, false);
        let first = r.messages_token_events(&token(0, false));
        assert_eq!(
            names(&first),
            [
                "message_start",
                "content_block_start",
                "content_block_delta"
            ]
        );
        let (_, start) = sse(&first[0]);
        assert_eq!(start["message"]["content"], json!([]));
        assert_eq!(start["message"]["stop_reason"], Value::Null);
        assert_eq!(
            start["message"]["usage"],
            json!({"input_tokens": 10, "output_tokens": 0, "cache_read_input_tokens": 4,
                   "cache_creation_input_tokens": 0})
        );
        let next = r.messages_token_events(&token(1, true));
        assert_eq!(names(&next), ["content_block_delta"]);
        assert_eq!(
            sse(&next[0]).1["delta"],
            json!({"type": "text_delta", "text": " engine"})
        );
    }

    #[test]
    fn the_tail_and_the_full_body_name_the_stop_reason() {
        for (ended, stop) in [(false, "max_tokens"), (true, "end_turn")] {
            let r = reply(ApiKind::Messages, 2, ended);
            let tail = r.messages_tail_events();
            assert_eq!(
                names(&tail),
                ["content_block_stop", "message_delta", "message_stop"]
            );
            let (_, delta) = sse(&tail[1]);
            assert_eq!(delta["delta"]["stop_reason"], stop);
            assert_eq!(delta["usage"], json!({"output_tokens": 2}));
            let full = r.full_body(4);
            assert_eq!(
                (&full["type"], &full["stop_reason"], &full["content"]),
                (
                    &json!("message"),
                    &json!(stop),
                    &json!([{"type": "text", "text": " The engine"}])
                )
            );
            assert_eq!(full["usage"]["cache_read_input_tokens"], 4);
        }
    }
}
