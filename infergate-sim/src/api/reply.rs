//! What one generation request is answered with, and which API family's shapes each part of the answer takes.

use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::Value;

use crate::scheduler::TokenEvent;
use crate::tokenize::{output_token, ApiKind};

/// Seconds since the epoch, for the `created` fields of answers and model lists.
pub(super) fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Response shapes of one generation request; each API family adds its own in its file.
pub(super) struct Reply {
    pub kind: ApiKind,
    pub id: String,
    pub created: u64,
    pub model: String,
    pub prompt_tokens: usize,
    pub max_tokens: usize,
    /// The answer ends at end of sequence (`--stop-after`), not at the request's limit.
    pub ended_itself: bool,
    pub include_usage: bool,
    /// A Responses API request with `background` (echoed in its response object).
    pub background: bool,
}

impl Reply {
    /// An SSE event with data only (OpenAI's chat completions and completions streams).
    pub(super) fn data(v: &Value) -> Vec<u8> {
        format!("data: {v}\n\n").into_bytes()
    }

    /// A named SSE event (Anthropic messages and the Responses API).
    pub(super) fn event(name: &str, v: &Value) -> Vec<u8> {
        format!("event: {name}\ndata: {v}\n\n").into_bytes()
    }

    /// The whole generated text.
    pub(super) fn output_text(&self) -> String {
        (0..self.max_tokens).map(output_token).collect()
    }

    /// SSE events sent as the stream opens, before any token: vLLM's Responses API announces the response
    /// (`response.created`, `response.in_progress`) before its prefill has run.
    pub(super) fn preamble_events(&self) -> Vec<Vec<u8>> {
        match self.kind {
            ApiKind::Responses => self.responses_preamble_events(),
            _ => Vec::new(),
        }
    }

    /// The SSE events that carry one generated token.
    pub(super) fn token_events(&self, ev: &TokenEvent) -> Vec<Vec<u8>> {
        match self.kind {
            ApiKind::Messages => self.messages_token_events(ev),
            ApiKind::Responses => self.responses_token_events(ev),
            ApiKind::Chat | ApiKind::Completion => self.completions_token_events(ev),
        }
    }

    /// The SSE events after the last token.
    pub(super) fn tail_events(&self, cached: usize) -> Vec<Vec<u8>> {
        match self.kind {
            ApiKind::Responses => self.responses_tail_events(cached),
            ApiKind::Messages => self.messages_tail_events(),
            ApiKind::Chat | ApiKind::Completion => self.completions_tail_events(cached),
        }
    }

    /// vLLM's in-band error for a stream that fails after its headers (`create_streaming_error_response`; the
    /// Anthropic converter's `error` event), and the `[DONE]` the OpenAI families still send after it.
    pub(super) fn error_events(&self) -> Vec<Vec<u8>> {
        let message =
            "EngineCore encountered an issue. See stack trace (above) for the root cause.";
        match self.kind {
            ApiKind::Messages => vec![Self::event(
                "error",
                &serde_json::json!({"type": "error", "error": {"type": "internal_error", "message": message}}),
            )],
            _ => vec![
                Self::data(&serde_json::json!({"error": {
                    "message": message, "type": "InternalServerError", "param": null, "code": 500,
                }})),
                b"data: [DONE]\n\n".to_vec(),
            ],
        }
    }

    /// The whole answer of a request that does not stream.
    pub(super) fn full_body(&self, cached: usize) -> Value {
        match self.kind {
            ApiKind::Responses => self.responses_full_body(cached),
            ApiKind::Messages => self.messages_full_body(cached),
            ApiKind::Chat => self.chat_full_body(cached),
            ApiKind::Completion => self.completion_full_body(cached),
        }
    }
}

/// A reply and the SSE parsing the API families' tests share.
#[cfg(test)]
pub(super) mod testing {
    use serde_json::Value;

    use super::Reply;
    use crate::scheduler::TokenEvent;
    use crate::tokenize::ApiKind;

    /// A reply of `max_tokens` tokens to a 10-token prompt.
    pub fn reply(kind: ApiKind, max_tokens: usize, ended_itself: bool) -> Reply {
        let id = match kind {
            ApiKind::Responses => "resp_0001",
            ApiKind::Messages => "msg_0001",
            _ => "cmpl-0001",
        };
        Reply {
            kind,
            id: id.into(),
            created: 1_700_000_000,
            model: "m".into(),
            prompt_tokens: 10,
            max_tokens,
            ended_itself,
            include_usage: false,
            background: false,
        }
    }

    pub fn token(index: usize, finished: bool) -> TokenEvent {
        TokenEvent {
            index,
            finished,
            cached_tokens: 4,
        }
    }

    /// One SSE event: its `event:` name (if any) and its data as JSON (`[DONE]` as a string).
    pub fn sse(bytes: &[u8]) -> (Option<String>, Value) {
        let text = std::str::from_utf8(bytes).unwrap();
        assert!(text.ends_with("\n\n"), "{text:?}");
        let mut name = None;
        let mut data = Value::Null;
        for line in text.lines() {
            if let Some(n) = line.strip_prefix("event: ") {
                name = Some(n.to_string());
            } else if let Some(d) = line.strip_prefix("data: ") {
                data = serde_json::from_str(d).unwrap_or_else(|_| Value::String(d.into()));
            }
        }
        (name, data)
    }

    /// The `event:` names of a list of SSE events.
    pub fn names(events: &[Vec<u8>]) -> Vec<String> {
        events.iter().filter_map(|e| sse(e).0).collect()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::testing::{reply, sse};
    use super::*;

    #[test]
    fn sse_framing_with_and_without_an_event_name() {
        let v = json!({"a": 1});
        assert_eq!(Reply::data(&v), b"data: {\"a\":1}\n\n");
        assert_eq!(Reply::event("x", &v), b"event: x\ndata: {\"a\":1}\n\n");
        assert_eq!(sse(&Reply::event("x", &v)), (Some("x".into()), v));
    }

    #[test]
    fn the_output_is_the_token_rule_repeated_up_to_max_tokens() {
        let r = reply(ApiKind::Chat, 3, false);
        assert_eq!(r.output_text(), " The engine sim");
        assert_eq!(reply(ApiKind::Chat, 0, false).output_text(), "");
    }

    #[test]
    fn only_the_responses_api_opens_its_stream_before_the_first_token() {
        for kind in [ApiKind::Chat, ApiKind::Completion, ApiKind::Messages] {
            assert!(
                reply(kind, 2, false).preamble_events().is_empty(),
                "{kind:?}"
            );
        }
        assert_eq!(
            reply(ApiKind::Responses, 2, false).preamble_events().len(),
            2
        );
    }
}
