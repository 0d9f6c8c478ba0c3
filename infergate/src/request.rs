//! Request classification (which calls generate) and a one-pass, tolerant scan of the request body for routing.
//!
//! The scan finds `model`, `stream` and the prompt text wherever they sit in the body, in one pass and without
//! building a JSON tree (a 1 MiB prompt costs a byte loop), and tolerates a body cut short or malformed.

/// What kind of call a request is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CallKind {
    /// Runs a prefill on the engine: counts prefill tokens and placements.
    Generate,
    /// Proxied, but holds no prefill tokens and counts no placement (count_tokens, tokenize, GETs, ...).
    #[default]
    Passive,
    /// `GET /health` answered by the router itself.
    RouterHealth,
    /// `GET /v1/models` answered by the router itself (union of the pools' models).
    RouterModels,
}

/// Classify by method and path (query string already stripped or not: it is ignored).
pub fn classify(method: &str, path: &str) -> CallKind {
    let path = path.split('?').next().unwrap_or(path);
    let path = path.trim_end_matches('/');
    match (method, path) {
        ("GET", "/health") => CallKind::RouterHealth,
        ("GET", "/v1/models") => CallKind::RouterModels,
        ("POST", p) => {
            let passive = p.ends_with("/count_tokens")
                || p.ends_with("/tokenize")
                || p.ends_with("/detokenize")
                || p == "/v1/models";
            if passive {
                CallKind::Passive
            } else {
                CallKind::Generate
            }
        }
        _ => CallKind::Passive,
    }
}

/// What routing needs from the body prefix.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct BodyScan {
    /// Top-level `"model"` string, if seen in the prefix.
    pub model: Option<String>,
    /// Prompt text in order: `system`, `messages[*].content` (string or `[*].text`), `prompt`, `input`; raw JSON
    /// string bytes (escapes kept; equal text gives equal bytes), separated by a 0x1e record separator.
    pub prompt: Vec<u8>,
    /// Top-level `"stream"` if seen.
    pub stream: Option<bool>,
    /// The scan reached the end of a complete top-level object.
    pub complete: bool,
}

const MAX_DEPTH: usize = 32;

/// Scan a (possibly truncated) JSON body prefix. `max_prompt` bounds the prompt bytes collected.
pub fn scan(body: &[u8], max_prompt: usize) -> BodyScan {
    let mut s = Scanner {
        b: body,
        i: 0,
        out: BodyScan::default(),
        max_prompt,
    };
    s.skip_ws();
    if s.peek() == Some(b'{') {
        s.out.complete = s.value(Role::Root, 0).is_some();
    }
    s.out
}

/// Where in the document a value sits, as far as routing cares.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Role {
    Root,
    Model,
    Stream,
    /// A string here is prompt text; an array holds more prompt parts.
    PromptText,
    /// `messages`: an array of message objects.
    Messages,
    /// One message object: its `content` is prompt text.
    Message,
    /// A content part object: its `text` is prompt text.
    ContentPart,
    Other,
}

struct Scanner<'a> {
    b: &'a [u8],
    i: usize,
    out: BodyScan,
    max_prompt: usize,
}

impl<'a> Scanner<'a> {
    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    fn skip_ws(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\n' | b'\r' | b'\t')) {
            self.i += 1;
        }
    }

    /// Returns None when the input ends (truncated) or is malformed: the scan stops there.
    fn value(&mut self, role: Role, depth: usize) -> Option<()> {
        if depth > MAX_DEPTH {
            return None;
        }
        self.skip_ws();
        match self.peek()? {
            b'{' => self.object(role, depth),
            b'[' => self.array(role, depth),
            b'"' => match self.string() {
                Ok(raw) => {
                    match role {
                        Role::Model => self.out.model = Some(unescape(raw)),
                        Role::PromptText => self.push_prompt(raw),
                        _ => {}
                    }
                    Some(())
                }
                Err(partial) => {
                    // Cut by the prefix end: a long prompt still contributes what was seen.
                    if role == Role::PromptText {
                        self.push_prompt(partial);
                    }
                    None
                }
            },
            _ => {
                let start = self.i;
                while matches!(self.peek(), Some(c) if !matches!(c, b',' | b'}' | b']' | b' ' | b'\n' | b'\r' | b'\t'))
                {
                    self.i += 1;
                }
                if self.i >= self.b.len() {
                    return None; // a literal cut by the prefix end
                }
                if role == Role::Stream {
                    match &self.b[start..self.i] {
                        b"true" => self.out.stream = Some(true),
                        b"false" => self.out.stream = Some(false),
                        _ => {}
                    }
                }
                Some(())
            }
        }
    }

    fn object(&mut self, role: Role, depth: usize) -> Option<()> {
        self.i += 1; // '{'
        loop {
            self.skip_ws();
            match self.peek()? {
                b'}' => {
                    self.i += 1;
                    return Some(());
                }
                b',' => {
                    self.i += 1;
                    continue;
                }
                b'"' => {}
                _ => return None,
            }
            let key = self.string().ok()?;
            self.skip_ws();
            if self.peek()? != b':' {
                return None;
            }
            self.i += 1;
            let child = match (role, key) {
                (Role::Root, b"model") => Role::Model,
                (Role::Root, b"stream") => Role::Stream,
                (Role::Root, b"messages") => Role::Messages,
                (Role::Root, b"system" | b"prompt" | b"input") => Role::PromptText,
                (Role::Message, b"content") => Role::PromptText,
                (Role::ContentPart, b"text") => Role::PromptText,
                _ => Role::Other,
            };
            self.value(child, depth + 1)?;
        }
    }

    fn array(&mut self, role: Role, depth: usize) -> Option<()> {
        self.i += 1; // '['
        let child = match role {
            Role::Messages => Role::Message,
            // prompt: ["a", "b"] or content: [{"type":"text","text":...}]
            Role::PromptText => Role::PromptText,
            _ => Role::Other,
        };
        loop {
            self.skip_ws();
            match self.peek()? {
                b']' => {
                    self.i += 1;
                    return Some(());
                }
                b',' => {
                    self.i += 1;
                    continue;
                }
                b'{' if child == Role::PromptText => self.value(Role::ContentPart, depth + 1)?,
                _ => self.value(child, depth + 1)?,
            }
        }
    }

    /// A string's raw bytes between the quotes; `Err(partial)` if the prefix ends inside it.
    fn string(&mut self) -> Result<&'a [u8], &'a [u8]> {
        let b: &'a [u8] = self.b;
        let start = self.i + 1;
        let mut j = start;
        // Long prompts are one string: jump between quotes and backslashes (SIMD) instead of a byte loop.
        while let Some(k) = b
            .get(j..)
            .and_then(|rest| memchr::memchr2(b'"', b'\\', rest))
        {
            j += k;
            if b[j] == b'"' {
                self.i = j + 1;
                return Ok(&b[start..j]);
            }
            j += 2;
        }
        self.i = b.len();
        Err(b.get(start..).unwrap_or_default())
    }

    fn push_prompt(&mut self, raw: &[u8]) {
        let room = self.max_prompt.saturating_sub(self.out.prompt.len());
        if room == 0 {
            return;
        }
        if !self.out.prompt.is_empty() {
            self.out.prompt.push(0x1e);
        }
        let room = self.max_prompt.saturating_sub(self.out.prompt.len());
        self.out
            .prompt
            .extend_from_slice(&raw[..raw.len().min(room)]);
    }
}

/// Unescape the simple JSON escapes; enough for model names.
fn unescape(raw: &[u8]) -> String {
    let s = String::from_utf8_lossy(raw);
    if !s.contains('\\') {
        return s.into_owned();
    }
    serde_json::from_str::<String>(&format!("\"{s}\"")).unwrap_or_else(|_| s.into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_calls() {
        assert_eq!(classify("POST", "/v1/chat/completions"), CallKind::Generate);
        assert_eq!(classify("POST", "/v1/completions?x=1"), CallKind::Generate);
        assert_eq!(classify("POST", "/v1/messages"), CallKind::Generate);
        assert_eq!(
            classify("POST", "/v1/messages/count_tokens"),
            CallKind::Passive
        );
        assert_eq!(classify("POST", "/tokenize"), CallKind::Passive);
        assert_eq!(classify("GET", "/v1/models"), CallKind::RouterModels);
        assert_eq!(classify("GET", "/health"), CallKind::RouterHealth);
        assert_eq!(classify("GET", "/v1/models/x"), CallKind::Passive);
    }

    #[test]
    fn scans_chat_body() {
        let b = br#"{"model":"m\/1","stream":true,"messages":[{"role":"system","content":"be brief"},
            {"role":"user","content":[{"type":"text","text":"hello"},{"type":"image_url","image_url":{"url":"x"}}]}],
            "max_tokens":5}"#;
        let s = scan(b, 1 << 20);
        assert_eq!(s.model.as_deref(), Some("m/1"));
        assert_eq!(s.stream, Some(true));
        assert_eq!(s.prompt, b"be brief\x1ehello");
        assert!(s.complete);
    }

    #[test]
    fn scans_completion_prompt_and_anthropic_system() {
        let s = scan(br#"{"prompt":["a","b"],"model":"x"}"#, 100);
        assert_eq!(
            (s.model.as_deref(), s.prompt.as_slice()),
            (Some("x"), &b"a\x1eb"[..])
        );
        let s = scan(
            br#"{"system":"sys","messages":[{"role":"user","content":"hi"}],"model":"c"}"#,
            100,
        );
        assert_eq!(s.prompt, b"sys\x1ehi");
    }

    #[test]
    fn tolerates_truncation_everywhere() {
        let full = br#"{"model":"llama","messages":[{"role":"user","content":"0123456789abcdef"}],"stream":false}"#;
        for cut in 0..full.len() {
            let s = scan(&full[..cut], 1 << 20);
            assert!(!s.complete || cut == full.len());
            if cut > 17 {
                assert_eq!(s.model.as_deref(), Some("llama"), "cut {cut}");
            }
        }
        let s = scan(&full[..60], 1 << 20);
        assert!(s.prompt.is_empty() || b"0123456789abcdef".starts_with(&s.prompt));
    }

    #[test]
    fn garbage_and_deep_nesting_do_not_panic() {
        for g in [
            &b""[..],
            b"null",
            b"{",
            b"{\"model\":",
            b"[[[[",
            b"{\"a\":}",
            b"\xff\xfe{\"model\":1}",
        ] {
            let _ = scan(g, 10);
        }
        let deep = format!("{{\"messages\":{}", "[".repeat(10_000));
        let s = scan(deep.as_bytes(), 10);
        assert!(!s.complete);
    }

    #[test]
    fn prompt_is_bounded() {
        let s = scan(br#"{"prompt":"aaaaaaaaaaaaaaaaaaaa"}"#, 8);
        assert_eq!(s.prompt.len(), 8);
    }
}
