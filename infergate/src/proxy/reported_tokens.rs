//! The engine's own count of a stream's output tokens, read from the usage it reports as the stream passes:
//! `"completion_tokens":` on chat and completions (with `stream_options.include_usage`), `"output_tokens":` on
//! Responses (`response.completed`) and Messages (`message_delta`). vLLM puts several tokens in one event when its
//! API server falls behind, and a Responses delta is detokenized text that may hold more than one token: with the
//! count, a stream's timing is per token, not per event. The last count in the stream wins (Messages and vLLM's
//! continuous usage report a running total). A key inside a JSON string cannot match: its quotes are escaped.

use std::sync::LazyLock;

use memchr::memmem::Finder;

use super::token_events::Api;

static COMPLETION_TOKENS: LazyLock<Finder<'static>> =
    LazyLock::new(|| Finder::new(b"\"completion_tokens\":"));
static OUTPUT_TOKENS: LazyLock<Finder<'static>> =
    LazyLock::new(|| Finder::new(b"\"output_tokens\":"));

/// A count this long is not a token count.
const MAX_DIGITS: u8 = 12;

/// Reads a stream's body chunks, in order, for the engine's output token count (a key or its number may be split
/// between chunks).
#[derive(Debug, Clone, Default)]
pub(super) struct ReportedTokens {
    chat: bool,
    /// Bytes of the key matched at the end of the last chunk.
    partial: usize,
    /// A number being read after a key: its value so far and its digits.
    reading: Option<(u64, u8)>,
    last: Option<u64>,
}

impl ReportedTokens {
    /// For a stream answering a request to `path`.
    pub(super) fn for_path(path: &str) -> Self {
        ReportedTokens {
            chat: Api::for_path(path) == Api::Chunks,
            ..Self::default()
        }
    }

    /// The last output token count the stream reported, if any.
    pub(super) fn count(&self) -> Option<u64> {
        self.last
    }

    fn finder(&self) -> &'static Finder<'static> {
        if self.chat {
            &COMPLETION_TOKENS
        } else {
            &OUTPUT_TOKENS
        }
    }

    /// Read the next chunk.
    pub(super) fn feed(&mut self, chunk: &[u8]) {
        let key = self.finder().needle();
        let mut from = 0;
        if self.partial > 0 {
            let need = &key[self.partial..];
            let take = need.len().min(chunk.len());
            if chunk[..take] == need[..take] {
                if take < need.len() {
                    self.partial += take;
                    return;
                }
                self.reading = Some((0, 0));
                from = take;
            }
            self.partial = 0;
        }
        if self.reading.is_some() {
            from = self.read_number(chunk, from);
            if self.reading.is_some() {
                return;
            }
        }
        let mut at = from;
        while let Some(found) = self.finder().find(&chunk[at..]) {
            self.reading = Some((0, 0));
            at = self.read_number(chunk, at + found + key.len());
            if self.reading.is_some() {
                return;
            }
        }
        self.partial = suffix_in_key(&chunk[at..], key);
    }

    /// Read the number after a key from `chunk[at..]`; where it ended (still reading at the chunk's end).
    fn read_number(&mut self, chunk: &[u8], mut at: usize) -> usize {
        let Some((mut n, mut digits)) = self.reading else {
            return at;
        };
        while let Some(&b) = chunk.get(at) {
            match b {
                b'0'..=b'9' if digits < MAX_DIGITS => {
                    n = n * 10 + u64::from(b - b'0');
                    digits += 1;
                }
                b' ' if digits == 0 => {}
                _ => {
                    // A number ended (or the value was not one: `null`, or too long).
                    if digits > 0 && !b.is_ascii_digit() {
                        self.last = Some(n);
                    }
                    self.reading = None;
                    return at;
                }
            }
            at += 1;
        }
        self.reading = Some((n, digits));
        at
    }
}

/// The length of the longest end of `tail` that begins `key` (shorter than `key`).
fn suffix_in_key(tail: &[u8], key: &[u8]) -> usize {
    let from = tail.len().saturating_sub(key.len() - 1);
    // The key begins with a quote: only a quote near the end can begin it; the first such is the longest end.
    memchr::memchr_iter(key[0], &tail[from..])
        .map(|i| &tail[from + i..])
        .find(|end| key.starts_with(end))
        .map_or(0, <[u8]>::len)
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHAT: &str = "data: {\"choices\":[{\"delta\":{\"content\":\"say \\\"completion_tokens\\\": 99\"}}]}\n\n\
        data: {\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":48,\"completion_tokens_details\":null}}\n\n\
        data: [DONE]\n\n";
    const RESPONSES: &str = "event: response.created\ndata: {\"response\":{\"usage\":null}}\n\n\
        event: response.output_text.delta\ndata: {\"delta\":\"\\\"output_tokens\\\":5\"}\n\n\
        event: response.completed\ndata: {\"response\":{\"usage\":{\"input_tokens\":3,\"output_tokens\": 24,\"output_tokens_details\":{\"reasoning_tokens\":0}}}}\n\n";
    const MESSAGES: &str = "event: message_start\ndata: {\"message\":{\"usage\":{\"input_tokens\":9,\"output_tokens\":1}}}\n\n\
        event: message_delta\ndata: {\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":31}}\n\n";

    fn read(path: &str, chunks: &[&[u8]]) -> Option<u64> {
        let mut r = ReportedTokens::for_path(path);
        for c in chunks {
            r.feed(c);
        }
        r.count()
    }

    #[test]
    fn each_apis_count_is_read_split_anywhere() {
        for (path, text, want) in [
            ("/v1/chat/completions", CHAT, 48),
            ("/v1/completions", CHAT, 48),
            ("/v1/responses", RESPONSES, 24),
            ("/v1/messages", MESSAGES, 31),
        ] {
            let all = text.as_bytes();
            assert_eq!(read(path, &[all]), Some(want), "{path}");
            for cut in 0..=all.len() {
                let (a, b) = all.split_at(cut);
                assert_eq!(read(path, &[a, b]), Some(want), "{path} cut at {cut}");
            }
            let bytes: Vec<&[u8]> = all.chunks(1).collect();
            assert_eq!(read(path, &bytes), Some(want), "{path} a byte at a time");
        }
    }

    #[test]
    fn no_count_without_a_usage_number() {
        let no_usage =
            b"data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\ndata: [DONE]\n\n";
        assert_eq!(read("/v1/chat/completions", &[no_usage]), None);
        assert_eq!(
            read("/v1/chat/completions", &[b"{\"completion_tokens\":null}"]),
            None
        );
        // A stream cut inside the number reports nothing.
        assert_eq!(
            read("/v1/chat/completions", &[b"{\"completion_tokens\":12"]),
            None
        );
        assert_eq!(
            read(
                "/v1/chat/completions",
                &[b"{\"completion_tokens\":12345678901234567890}"]
            ),
            None
        );
        // The other API's key is not this one's.
        assert_eq!(read("/v1/responses", &[CHAT.as_bytes()]), None);
    }

    #[test]
    fn the_last_count_wins() {
        let running = b"data: {\"usage\":{\"completion_tokens\":1}}\n\ndata: {\"usage\":{\"completion_tokens\":2}}\n\n\
            data: {\"usage\":{\"completion_tokens\":3}}\n\n";
        assert_eq!(read("/v1/chat/completions", &[running]), Some(3));
    }
}
