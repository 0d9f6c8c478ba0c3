//! An engine's failure inside a 2xx stream: vLLM sends a stream's headers before its prefill, so a generation that
//! fails afterwards (its engine core died, an internal error) ends the stream with an error event instead of a
//! status: `data: {"error": {..., "code": 500}}` then `[DONE]` (chat and completions), `event: error` with an
//! `internal_error` (Anthropic messages). Only errors the engine owns count (a code of 500 or more, or a server
//! error type); a client's (400) does not.

/// Longest event line kept across chunks while it may be an error (vLLM's error events are a few hundred bytes).
const MAX_LINE: usize = 16 * 1024;

/// What an error's `type` (or non-numeric `code`) says when the engine owns it: vLLM's `InternalServerError` and
/// `ServiceUnavailableError`, OpenAI's `server_error`, Anthropic's `internal_error`, `api_error`, `overloaded_error`.
const ENGINE_OWNED: [&str; 6] = [
    "InternalServerError",
    "ServiceUnavailable",
    "server_error",
    "internal_error",
    "api_error",
    "overloaded_error",
];

/// Reads a stream's chunks in order, line by line from each line's start (a JSON string never holds a raw line
/// break, so generated text cannot open a line), for an error event the engine owns.
#[derive(Debug, Default, Clone)]
pub struct StreamErrors {
    /// The start of a line the last chunk cut, kept while it may be an error event.
    partial: Vec<u8>,
    /// The last chunk ended inside a line that cannot be one: skip to the next line break.
    skipping: bool,
    /// The current event is named `error`: its data says whose.
    named_error: bool,
}

impl StreamErrors {
    /// Whether `chunk` (the stream's next) completes an error event the engine owns.
    pub fn feed(&mut self, mut chunk: &[u8]) -> bool {
        let mut found = false;
        if self.skipping || !self.partial.is_empty() {
            let Some(nl) = memchr::memchr(b'\n', chunk) else {
                self.carry(chunk);
                return false;
            };
            if !std::mem::take(&mut self.skipping) {
                let mut line = std::mem::take(&mut self.partial);
                line.extend_from_slice(&chunk[..nl]);
                found |= self.line(&line);
            }
            chunk = &chunk[nl + 1..];
        }
        while let Some(nl) = memchr::memchr(b'\n', chunk) {
            found |= self.line(&chunk[..nl]);
            chunk = &chunk[nl + 1..];
        }
        if !chunk.is_empty() {
            if self.may_be_error(chunk) {
                self.partial.extend_from_slice(chunk);
            } else {
                self.skipping = true;
            }
        }
        found
    }

    /// More of a cut line: kept (bounded) if it was being kept.
    fn carry(&mut self, more: &[u8]) {
        if self.skipping {
            return;
        }
        if self.partial.len() + more.len() > MAX_LINE {
            self.partial.clear();
            self.skipping = true;
        } else {
            self.partial.extend_from_slice(more);
        }
    }

    /// Whether a line's start may still become an error event: an `event:` line, or a `data:` line of an event
    /// named `error` or whose data may still open with `{"error"`.
    fn may_be_error(&self, start: &[u8]) -> bool {
        if b"event:".starts_with(start)
            || b"data:".starts_with(start)
            || start.starts_with(b"event:")
        {
            return true;
        }
        let Some(data) = start.strip_prefix(b"data:") else {
            return false;
        };
        let data = data.trim_ascii_start();
        const KEY: &[u8] = b"{\"error\"";
        self.named_error || KEY.starts_with(data) || data.starts_with(KEY)
    }

    /// One whole line: true if it completes an error event the engine owns.
    fn line(&mut self, line: &[u8]) -> bool {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.is_empty() {
            self.named_error = false;
            return false;
        }
        if let Some(name) = line.strip_prefix(b"event:") {
            self.named_error = name.trim_ascii() == b"error";
            return false;
        }
        let Some(data) = line.strip_prefix(b"data:") else {
            return false;
        };
        let data = data.trim_ascii_start();
        if !self.named_error && !data.starts_with(b"{\"error\"") {
            return false;
        }
        serde_json::from_slice::<serde_json::Value>(data).is_ok_and(|v| engine_owned(&v))
    }
}

/// Whether an error event's data is an error the engine owns.
fn engine_owned(v: &serde_json::Value) -> bool {
    // `{"error": {...}}` (OpenAI, Anthropic) or the error itself (`{"type": "error", "code": ...}`).
    let err = v.get("error").filter(|e| e.is_object()).unwrap_or(v);
    let code = err.get("code");
    if let Some(n) = code.and_then(|c| c.as_u64().or_else(|| c.as_str()?.parse().ok())) {
        return n >= 500;
    }
    ["type", "code"]
        .iter()
        .filter_map(|k| err.get(*k)?.as_str())
        .any(|w| ENGINE_OWNED.iter().any(|s| w.contains(s)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What vLLM 0.32 sent to a stream when its engine core was killed (measured on the CPU build).
    const DEAD: &[u8] = b"data: {\"error\": {\"message\": \"EngineCore encountered an issue. See stack trace (above) \
        for the root cause.\", \"type\": \"InternalServerError\", \"param\": null, \"code\": 500}}\n\n";
    const TOKEN: &[u8] =
        b"data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"error\"}}]}\n\n";
    const DONE: &[u8] = b"data: [DONE]\n\n";

    #[test]
    fn the_engines_error_is_found_whole_or_cut_anywhere() {
        let all = [TOKEN, TOKEN, DEAD, DONE].concat();
        assert!(StreamErrors::default().feed(&all));
        for cut in 1..all.len() {
            let mut s = StreamErrors::default();
            let found = s.feed(&all[..cut]) | s.feed(&all[cut..]);
            assert!(found, "cut at {cut}");
        }
        // Byte by byte.
        let mut s = StreamErrors::default();
        assert!(all.iter().any(|b| s.feed(std::slice::from_ref(b))));
    }

    #[test]
    fn output_and_client_errors_are_not_the_engines() {
        let mut s = StreamErrors::default();
        assert!(!s.feed(&[TOKEN, TOKEN, DONE].concat()));
        // The model writing about an error, even a JSON one, is output: it sits inside a string.
        let quoted = b"data: {\"choices\":[{\"delta\":{\"content\":\"\\ndata: {\\\"error\\\": {\\\"code\\\": 500}}\"}}]}\n\n";
        assert!(!s.feed(quoted));
        // vLLM's in-band error for a request it refused (a client's fault).
        let bad = b"data: {\"error\": {\"message\": \"bad tool\", \"type\": \"BadRequestError\", \"param\": null, \"code\": 400}}\n\n";
        assert!(!StreamErrors::default().feed(bad));
        let not_json = b"data: {\"error\" then nothing\n\n";
        assert!(!StreamErrors::default().feed(not_json));
    }

    #[test]
    fn anthropic_and_responses_error_events() {
        let internal = b"event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"internal_error\",\"message\":\"x\"}}\n\n";
        assert!(StreamErrors::default().feed(internal));
        let overloaded = b"event: error\r\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\"}}\r\n\r\n";
        assert!(StreamErrors::default().feed(overloaded));
        let invalid = b"event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"invalid_request_error\"}}\n\n";
        assert!(!StreamErrors::default().feed(invalid));
        let responses = b"event: error\ndata: {\"type\":\"error\",\"code\":\"server_error\",\"message\":\"x\"}\n\n";
        assert!(StreamErrors::default().feed(responses));
        // An event named otherwise whose data mentions an error type is not an error event.
        let delta = b"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"delta\":{\"text\":\"api_error\"}}\n\n";
        assert!(!StreamErrors::default().feed(delta));
    }

    #[test]
    fn a_long_cut_line_is_not_kept() {
        let mut s = StreamErrors::default();
        let long = [b"data: {\"id\":\"".as_slice(), &[b'x'; 100_000]].concat();
        assert!(!s.feed(&long));
        assert!(s.partial.is_empty());
        // The next event is read from its line's start.
        assert!(s.feed(&[b"\"}\n\n".as_slice(), DEAD].concat()));
    }
}
