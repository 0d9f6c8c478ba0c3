//! Which of a streamed answer's chunks carry tokens. The Responses and Messages APIs interleave events that carry
//! none (`response.created`, `output_item.added`, `content_block_start`, `ping`, the closing events): timed as
//! decode steps, a short stream's handful of them made an engine look many times faster than its twin. Those
//! streams name each event (`event: <type>` lines, as vLLM and Anthropic send them); a token is a
//! `response.*.delta` or a `content_block_delta`. Chat and completions streams carry one token a `data:` line
//! (not `[DONE]`), counted by line, not by read: two events in one read are two tokens.

/// Bytes of a line kept to classify it: `event: response.function_call_arguments.delta` fits.
const LINE_HEAD: usize = 64;

/// How a stream's answer is shaped: by the API it answers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) enum Api {
    /// One token a `data:` line, `[DONE]` none.
    #[default]
    Chunks,
    /// OpenAI Responses: `event: response.<...>.delta`.
    Responses,
    /// Anthropic Messages: `event: content_block_delta`.
    Messages,
}

/// Counts token-carrying events across a stream's body chunks (an event line may be split between chunks).
#[derive(Debug, Clone)]
pub(super) struct TokenEvents {
    api: Api,
    /// The start of the line the last chunk ended inside.
    head: [u8; LINE_HEAD],
    head_len: usize,
}

impl Api {
    /// The API a request to `path` is answered in.
    pub(super) fn for_path(path: &str) -> Self {
        match path {
            "/v1/responses" => Api::Responses,
            "/v1/messages" => Api::Messages,
            _ => Api::Chunks,
        }
    }
}

impl Default for TokenEvents {
    fn default() -> Self {
        TokenEvents {
            api: Api::Chunks,
            head: [0; LINE_HEAD],
            head_len: 0,
        }
    }
}

impl TokenEvents {
    /// For a stream answering a request to `path`.
    pub(super) fn for_path(path: &str) -> Self {
        TokenEvents {
            api: Api::for_path(path),
            ..Self::default()
        }
    }

    /// The tokens `chunk` carries. Fed every chunk in order.
    pub(super) fn tokens_in(&mut self, chunk: &[u8]) -> u32 {
        let mut tokens = 0;
        let mut rest = chunk;
        while !rest.is_empty() {
            let (line, ended) = match memchr::memchr(b'\n', rest) {
                Some(nl) => (&rest[..nl], true),
                None => (rest, false),
            };
            let room = LINE_HEAD - self.head_len;
            let take = line.len().min(room);
            self.head[self.head_len..self.head_len + take].copy_from_slice(&line[..take]);
            self.head_len += take;
            if !ended {
                break;
            }
            tokens += u32::from(self.carries_token());
            self.head_len = 0;
            rest = &rest[line.len() + 1..];
        }
        tokens
    }

    /// Whether the line just ended (its head) carries a token: a chat or completions `data:` line, or a line
    /// naming a token-carrying event.
    fn carries_token(&self) -> bool {
        let line = &self.head[..self.head_len];
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let field = |name: &[u8]| {
            line.strip_prefix(name)
                .map(|value| value.strip_prefix(b" ").unwrap_or(value))
        };
        match self.api {
            Api::Chunks => field(b"data:").is_some_and(|data| data != b"[DONE]"),
            Api::Responses => field(b"event:")
                .is_some_and(|name| name.starts_with(b"response.") && name.ends_with(b".delta")),
            Api::Messages => field(b"event:").is_some_and(|name| name == b"content_block_delta"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RESPONSES: &[&str] = &[
        "event: response.created\ndata: {\"type\":\"response.created\",\"response\":{\"instructions\":\"say x.delta\\n\"}}\n\n",
        "event: response.in_progress\ndata: {\"type\":\"response.in_progress\"}\n\n",
        "event: response.output_item.added\ndata: {\"type\":\"response.output_item.added\"}\n\n",
        "event: response.reasoning_text.delta\ndata: {\"type\":\"response.reasoning_text.delta\",\"delta\":\"hm\"}\n\n",
        "event: response.content_part.added\ndata: {\"type\":\"response.content_part.added\"}\n\n",
        "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"a.delta\"}\n\n",
        "event: response.output_text.delta\r\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"b\"}\r\n\r\n",
        "event: response.function_call_arguments.delta\ndata: {\"delta\":\"{\\\"q\\\"\"}\n\n",
        "event: response.output_text.done\ndata: {\"type\":\"response.output_text.done\",\"text\":\"ab\"}\n\n",
        "event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{}}\n\n",
    ];

    const MESSAGES: &[&str] = &[
        "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{}}\n\n",
        "event: content_block_start\ndata: {\"type\":\"content_block_start\"}\n\n",
        "event: ping\ndata: {\"type\": \"ping\"}\n\n",
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"text\":\"a\"}}\n\n",
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"text\":\"b\"}}\n\n",
        "event: content_block_stop\ndata: {\"type\":\"content_block_stop\"}\n\n",
        "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"}}\n\n",
        "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
    ];

    const CHAT: &[&str] = &[
        "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n",
        "data: {\"choices\":[{\"delta\":{\"content\":\"a\\ndata: [DONE]\"}}]}\n\n",
        "data: {\"choices\":[{\"delta\":{\"content\":\"b\"}}]}\r\n\r\n",
        "data: [DONE]\n\n",
    ];

    fn per_event(path: &str, events: &[&str]) -> Vec<u32> {
        let mut t = TokenEvents::for_path(path);
        events.iter().map(|e| t.tokens_in(e.as_bytes())).collect()
    }

    #[test]
    fn only_delta_events_carry_tokens() {
        assert_eq!(
            per_event("/v1/responses", RESPONSES),
            [0, 0, 0, 1, 0, 1, 1, 1, 0, 0]
        );
        assert_eq!(
            per_event("/v1/messages", MESSAGES),
            [0, 0, 0, 1, 1, 0, 0, 0]
        );
    }

    #[test]
    fn events_split_anywhere_or_read_together_count_once() {
        for (path, events, total) in [
            ("/v1/responses", RESPONSES, 4),
            ("/v1/messages", MESSAGES, 2),
            ("/v1/chat/completions", CHAT, 3),
        ] {
            let all = events.concat();
            let all = all.as_bytes();
            assert_eq!(TokenEvents::for_path(path).tokens_in(all), total);
            for cut in 0..=all.len() {
                let mut t = TokenEvents::for_path(path);
                let (a, b) = all.split_at(cut);
                assert_eq!(
                    t.tokens_in(a) + t.tokens_in(b),
                    total,
                    "{path} cut at {cut}"
                );
            }
            // One byte at a time.
            let mut t = TokenEvents::for_path(path);
            let bytes: u32 = all.chunks(1).map(|b| t.tokens_in(b)).sum();
            assert_eq!(bytes, total, "{path}");
        }
    }

    #[test]
    fn chat_and_completions_carry_a_token_a_data_line() {
        for path in ["/v1/chat/completions", "/v1/completions"] {
            let mut t = TokenEvents::for_path(path);
            assert_eq!(t.tokens_in(b"data: {\"choices\":[]}\n\n"), 1);
            // Two events in one read are two tokens; a line is counted in the read that ends it.
            assert_eq!(
                t.tokens_in(b"data: {\"a\":1}\n\ndata: {\"a\":2}\n\ndata: {\"a\""),
                2
            );
            assert_eq!(t.tokens_in(b":3}\r\n\r\n"), 1);
            assert_eq!(t.tokens_in(b""), 0);
            assert_eq!(t.tokens_in(b": keep-alive\n\n"), 0);
            assert_eq!(t.tokens_in(b"data:{\"a\":4}\n\ndata: [DONE]\n\n"), 1);
        }
    }

    #[test]
    fn a_line_longer_than_its_kept_head_is_classified_by_its_head() {
        let mut t = TokenEvents::for_path("/v1/responses");
        let long = format!("data: {}\n", "x".repeat(10_000));
        assert_eq!(t.tokens_in(long.as_bytes()), 0);
        let name = format!("event: response.{}.delta\n", "y".repeat(100));
        assert_eq!(t.tokens_in(name.as_bytes()), 0, "a name past the head");
        assert_eq!(t.tokens_in(b"event: response.output_text.delta\n"), 1);
    }
}
