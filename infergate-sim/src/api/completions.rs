//! OpenAI's chat completions and (text) completions shapes as vLLM sends them: chunks, usage, final objects.

use serde_json::{json, Value};

use super::reply::Reply;
use crate::scheduler::TokenEvent;
use crate::tokenize::{output_token, ApiKind};

impl Reply {
    pub(super) fn usage(&self, completion: usize, cached: usize) -> Value {
        json!({
            "prompt_tokens": self.prompt_tokens,
            "total_tokens": self.prompt_tokens + completion,
            "completion_tokens": completion,
            "prompt_tokens_details": {"cached_tokens": cached},
        })
    }

    fn openai_object(&self, stream: bool) -> &'static str {
        match (self.kind, stream) {
            (ApiKind::Completion, _) => "text_completion",
            (_, true) => "chat.completion.chunk",
            (_, false) => "chat.completion",
        }
    }

    /// OpenAI's `finish_reason`: `stop` at end of sequence, `length` at the request's limit.
    fn finish_reason(&self) -> &'static str {
        if self.ended_itself {
            "stop"
        } else {
            "length"
        }
    }

    /// One chunk per token; the last one carries `finish_reason` (and usage, unless it gets its own chunk).
    pub(super) fn completions_token_events(&self, ev: &TokenEvent) -> Vec<Vec<u8>> {
        let tok = output_token(ev.index);
        let finish = if ev.finished {
            json!(self.finish_reason())
        } else {
            Value::Null
        };
        let choice = if self.kind == ApiKind::Chat {
            let delta = if ev.index == 0 {
                json!({"role": "assistant", "content": tok})
            } else {
                json!({"content": tok})
            };
            json!({"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish})
        } else {
            json!({"index": 0, "text": tok, "logprobs": null, "finish_reason": finish, "stop_reason": null})
        };
        let mut chunk = json!({"id": self.id, "object": self.openai_object(true), "created": self.created,
                               "model": self.model, "choices": [choice]});
        if ev.finished && !self.include_usage {
            // Not vLLM (it sends usage only with stream_options.include_usage): convenient for clients.
            chunk["usage"] = self.usage(ev.index + 1, ev.cached_tokens);
        }
        vec![Self::data(&chunk)]
    }

    /// The usage chunk (with `stream_options.include_usage`), then `[DONE]`.
    pub(super) fn completions_tail_events(&self, cached: usize) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        if self.include_usage {
            out.push(Self::data(
                &json!({"id": self.id, "object": self.openai_object(true),
                "created": self.created, "model": self.model, "choices": [],
                "usage": self.usage(self.max_tokens, cached)}),
            ));
        }
        out.push(b"data: [DONE]\n\n".to_vec());
        out
    }

    pub(super) fn chat_full_body(&self, cached: usize) -> Value {
        let text = self.output_text();
        json!({
            "id": self.id, "object": "chat.completion", "created": self.created, "model": self.model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text, "tool_calls": []},
                         "logprobs": null, "finish_reason": self.finish_reason(), "stop_reason": null}],
            "usage": self.usage(self.max_tokens, cached),
        })
    }

    pub(super) fn completion_full_body(&self, cached: usize) -> Value {
        let text = self.output_text();
        json!({
            "id": self.id, "object": "text_completion", "created": self.created, "model": self.model,
            "choices": [{"index": 0, "text": text, "logprobs": null, "finish_reason": self.finish_reason(),
                         "stop_reason": null}],
            "usage": self.usage(self.max_tokens, cached),
        })
    }
}
