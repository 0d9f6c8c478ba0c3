//! What one generation request is answered with, and which API family's shapes each part of the answer takes.

use serde_json::Value;

use crate::scheduler::TokenEvent;
use crate::tokenize::{output_token, ApiKind};

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
