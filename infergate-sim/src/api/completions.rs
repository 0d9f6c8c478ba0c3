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

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::super::reply::testing::{reply, sse, token};
    use super::*;

    #[test]
    fn chat_chunks_open_with_the_role_and_close_with_finish_reason_and_usage() {
        let r = reply(ApiKind::Chat, 3, false);
        let first = r.completions_token_events(&token(0, false));
        assert_eq!(first.len(), 1);
        let (name, v) = sse(&first[0]);
        assert_eq!(name, None);
        assert_eq!(v["object"], "chat.completion.chunk");
        assert_eq!(
            v["choices"][0],
            json!({"index": 0, "delta": {"role": "assistant", "content": " The"}, "logprobs": null,
                   "finish_reason": null})
        );
        assert!(v.get("usage").is_none());
        let (_, v) = sse(&r.completions_token_events(&token(1, false))[0]);
        assert_eq!(v["choices"][0]["delta"], json!({"content": " engine"}));
        let (_, last) = sse(&r.completions_token_events(&token(2, true))[0]);
        assert_eq!(last["choices"][0]["finish_reason"], "length");
        assert_eq!(
            last["usage"],
            json!({"prompt_tokens": 10, "total_tokens": 13, "completion_tokens": 3,
                   "prompt_tokens_details": {"cached_tokens": 4}})
        );
        let ended = reply(ApiKind::Chat, 3, true);
        let (_, last) = sse(&ended.completions_token_events(&token(2, true))[0]);
        assert_eq!(last["choices"][0]["finish_reason"], "stop");
    }

    #[test]
    fn completion_chunks_carry_text() {
        let r = reply(ApiKind::Completion, 2, false);
        let (_, v) = sse(&r.completions_token_events(&token(0, false))[0]);
        assert_eq!(v["object"], "text_completion");
        assert_eq!(
            v["choices"][0],
            json!({"index": 0, "text": " The", "logprobs": null, "finish_reason": null,
                   "stop_reason": null})
        );
    }

    #[test]
    fn include_usage_moves_usage_into_its_own_chunk_before_done() {
        let mut r = reply(ApiKind::Chat, 2, false);
        let tail = r.completions_tail_events(4);
        assert_eq!(tail, [b"data: [DONE]\n\n".to_vec()]);
        r.include_usage = true;
        let (_, last) = sse(&r.completions_token_events(&token(1, true))[0]);
        assert!(last.get("usage").is_none());
        let tail = r.completions_tail_events(4);
        assert_eq!(tail.len(), 2);
        let (_, usage) = sse(&tail[0]);
        assert_eq!(usage["choices"], json!([]));
        assert_eq!(usage["usage"]["completion_tokens"], 2);
        assert_eq!(usage["usage"]["prompt_tokens_details"]["cached_tokens"], 4);
        assert_eq!(sse(&tail[1]).1, "[DONE]");
    }

    #[test]
    fn full_bodies_of_chat_and_completion() {
        let chat = reply(ApiKind::Chat, 2, true).full_body(4);
        assert_eq!(chat["object"], "chat.completion");
        assert_eq!(
            chat["choices"][0],
            json!({"index": 0, "message": {"role": "assistant", "content": " The engine", "tool_calls": []},
                   "logprobs": null, "finish_reason": "stop", "stop_reason": null})
        );
        assert_eq!(chat["usage"]["total_tokens"], 12);
        let completion = reply(ApiKind::Completion, 2, false).full_body(0);
        assert_eq!(
            (
                &completion["object"],
                &completion["choices"][0]["text"],
                &completion["choices"][0]["finish_reason"]
            ),
            (
                &json!("text_completion"),
                &json!(" The engine"),
                &json!("length")
            )
        );
    }
}
