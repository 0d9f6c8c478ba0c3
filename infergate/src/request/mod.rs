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
                || p.starts_with("/v1/responses/")
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
    /// Prompt text in the order an engine renders it: the system prompt (`system`, `instructions`) first wherever it
    /// sits in the body (the Anthropic and openai SDKs send it after the conversation), then `messages[*].content`
    /// (string or `[*].text`), `prompt` and `input` in body order; raw JSON string bytes (escapes kept; equal text
    /// gives equal bytes), separated by a 0x1e record separator.
    pub prompt: Vec<u8>,
    /// Where the conversation starts in `prompt`: after the top-level system prompt and its separator (0 without
    /// one, or without a conversation after it).
    pub conversation_at: usize,
    /// Bytes (quotes included) of the body's inline base64 attachments: `data:...;base64,` URLs (OpenAI
    /// `image_url`, `input_audio`-style and Responses `input_image`) and Anthropic `source.data`. They cost an engine
    /// a few hundred to a few thousand tokens each, not their size over bytes per token.
    pub media_bytes: u64,
    /// How many such attachments.
    pub media_items: u64,
    /// Top-level `"stream"` if seen.
    pub stream: Option<bool>,
    /// Top-level `"store"` if seen (Responses API: whether the engine keeps the response; absent means yes).
    pub store: Option<bool>,
    /// Top-level `"previous_response_id"` (Responses API): the stored response this one continues.
    pub previous_response_id: Option<String>,
    /// Top-level `"background"` (Responses API): answered at once, generated afterwards.
    pub background: Option<bool>,
    /// Top-level `"prompt_cache_key"` (OpenAI's routing hint: requests with one key share a prompt cache; agents
    /// set it to their session or thread id).
    pub prompt_cache_key: Option<String>,
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
        system: Vec::new(),
        max_prompt,
    };
    s.skip_ws();
    if s.peek() == Some(b'{') {
        s.out.complete = s.value(Role::Root, 0).is_some();
    }
    if !s.system.is_empty() {
        let rest = std::mem::take(&mut s.out.prompt);
        let system_len = s.system.len();
        s.out.prompt = std::mem::take(&mut s.system);
        if !rest.is_empty() {
            s.push_prompt(&rest);
            // Unless the bound left no room for the separator.
            if s.out.prompt.len() > system_len {
                s.out.conversation_at = system_len + 1;
            }
        }
    }
    s.out
}

/// Where in the document a value sits, as far as routing cares.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Role {
    Root,
    Model,
    Stream,
    Store,
    Background,
    PreviousResponseId,
    PromptCacheKey,
    /// A string here is prompt text; an array holds more prompt parts.
    PromptText,
    /// The system prompt: prompt text that goes first.
    SystemText,
    /// `messages`: an array of message objects.
    Messages,
    /// One message object: its `content` is prompt text.
    Message,
    /// A content part object: its `text` is prompt text.
    ContentPart,
    /// An Anthropic attachment's `source` object: its `data` is base64.
    MediaSource,
    /// An Anthropic attachment's base64 `data`.
    MediaData,
    /// A block of the system prompt: its `text` is system text.
    SystemPart,
    Other,
}

struct Scanner<'a> {
    b: &'a [u8],
    i: usize,
    out: BodyScan,
    /// The system prompt's text, put in front of `out.prompt` at the end.
    system: Vec<u8>,
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
                    self.note_media(role, raw);
                    match role {
                        Role::Model => self.out.model = Some(unescape(raw)),
                        Role::PreviousResponseId => {
                            self.out.previous_response_id = Some(unescape(raw))
                        }
                        Role::PromptCacheKey => self.out.prompt_cache_key = Some(unescape(raw)),
                        Role::PromptText => self.push_prompt(raw),
                        Role::SystemText if !is_billing_header(raw) => self.push_system(raw),
                        _ => {}
                    }
                    Some(())
                }
                Err(partial) => {
                    self.note_media(role, partial);
                    // Cut by the prefix end: a long prompt still contributes what was seen.
                    match role {
                        Role::PromptText => self.push_prompt(partial),
                        Role::SystemText if !is_billing_header(partial) => {
                            self.push_system(partial)
                        }
                        _ => {}
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
                let flag = match &self.b[start..self.i] {
                    b"true" => Some(true),
                    b"false" => Some(false),
                    _ => None,
                };
                match role {
                    Role::Stream => self.out.stream = flag,
                    Role::Store => self.out.store = flag,
                    Role::Background => self.out.background = flag,
                    _ => {}
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
                (Role::Root, b"store") => Role::Store,
                (Role::Root, b"background") => Role::Background,
                (Role::Root, b"previous_response_id") => Role::PreviousResponseId,
                (Role::Root, b"prompt_cache_key") => Role::PromptCacheKey,
                (Role::Root, b"messages") => Role::Messages,
                (Role::Root, b"system" | b"instructions") => Role::SystemText,
                (Role::Root, b"prompt" | b"input") => Role::PromptText,
                (Role::Message, b"content") => Role::PromptText,
                // `content` nests (Anthropic tool_result blocks, Responses API input messages); `output` is a
                // Responses API tool output.
                (Role::ContentPart, b"text" | b"content" | b"output") => Role::PromptText,
                (Role::SystemPart, b"text") => Role::SystemText,
                (Role::ContentPart, b"source") => Role::MediaSource,
                (Role::MediaSource, b"data") => Role::MediaData,
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
            // Anthropic: system: [{"type":"text","text":...,"cache_control":...}]
            Role::SystemText => Role::SystemText,
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
                b'{' if child == Role::SystemText => self.value(Role::SystemPart, depth + 1)?,
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

    /// Counts `raw` as an inline attachment when it is one.
    fn note_media(&mut self, role: Role, raw: &[u8]) {
        let data_url = raw.starts_with(b"data:")
            && raw
                .get(..raw.len().min(128))
                .is_some_and(|head| head.windows(8).any(|w| w == b";base64,"));
        if data_url || role == Role::MediaData {
            self.out.media_bytes += raw.len() as u64 + 2;
            self.out.media_items += 1;
        }
    }

    fn push_prompt(&mut self, raw: &[u8]) {
        push_bounded(&mut self.out.prompt, raw, self.max_prompt);
    }

    fn push_system(&mut self, raw: &[u8]) {
        push_bounded(&mut self.system, raw, self.max_prompt);
    }
}

/// Claude Code opens its system prompt with an attribution block (`x-anthropic-billing-header: cc_version=...;
/// cch=...;`) whose hashes change per conversation and per request. vLLM drops it before rendering the prompt, so
/// it is not part of what the engine caches; counted here it would make every turn a new prompt lineage and no
/// two sessions share a prefix.
fn is_billing_header(raw: &[u8]) -> bool {
    raw.starts_with(b"x-anthropic-billing-header")
}

/// Appends `raw` to `buf` after a 0x1e separator (none first), keeping `buf` within `max` bytes.
fn push_bounded(buf: &mut Vec<u8>, raw: &[u8], max: usize) {
    if buf.len() >= max {
        return;
    }
    if !buf.is_empty() {
        buf.push(0x1e);
    }
    let room = max.saturating_sub(buf.len());
    buf.extend_from_slice(&raw[..raw.len().min(room)]);
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
    fn the_system_prompt_goes_first_wherever_the_body_has_it() {
        // The anthropic SDK: `system` (here cache-controlled blocks) after `messages`.
        let s = scan(
            br#"{"max_tokens":4,"messages":[{"role":"user","content":"hi"}],"model":"c",
                "system":[{"type":"text","text":"sys1","cache_control":{"type":"ephemeral"}},{"type":"text","text":"sys2"}]}"#,
            100,
        );
        assert_eq!(s.prompt, b"sys1\x1esys2\x1ehi");
        // Claude Code's attribution block is not prompt text (vLLM drops it; its hashes change per request).
        let with_billing = |cch: &str| {
            let body = format!(
                r#"{{"model":"c","messages":[{{"role":"user","content":"hi"}}],"system":[
                    {{"type":"text","text":"x-anthropic-billing-header: cc_version=2.1.119.af2; cc_entrypoint=cli; cch={cch};"}},
                    {{"type":"text","text":"You are Claude Code.","cache_control":{{"type":"ephemeral"}}}}]}}"#
            );
            scan(body.as_bytes(), 1000)
        };
        let (a, b) = (with_billing("97bd6"), with_billing("24c2d"));
        assert_eq!(a.prompt, b"You are Claude Code.\x1ehi");
        assert_eq!((a.prompt, a.conversation_at), (b.prompt, b.conversation_at));
        // The openai SDK's responses.create: `instructions` after `input`.
        let s = scan(
            br#"{"input":"hello","instructions":"be brief","model":"r"}"#,
            100,
        );
        assert_eq!(
            (s.model.as_deref(), s.prompt.as_slice()),
            (Some("r"), &b"be brief\x1ehello"[..])
        );
        assert_eq!(&s.prompt[s.conversation_at..], b"hello");
        let s = scan(br#"{"system":"only","model":"c"}"#, 100);
        assert_eq!((s.prompt.as_slice(), s.conversation_at), (&b"only"[..], 0));
        assert_eq!(
            scan(br#"{"messages":[{"content":"x"}]}"#, 100).conversation_at,
            0
        );
        // The bound holds for the whole, the system prompt first.
        let s = scan(
            br#"{"messages":[{"content":"0123456789"}],"system":"abcdef"}"#,
            8,
        );
        assert_eq!(s.prompt, b"abcdef\x1e0");
        // A body cut inside the system prompt keeps what was seen of it, first.
        let s = scan(br#"{"messages":[{"content":"hi"}],"system":"abcdef"#, 100);
        assert_eq!(s.prompt, b"abcdef\x1ehi");
    }

    #[test]
    fn scans_responses_api_input_items() {
        let s = scan(
            br#"{"input":[{"role":"user","content":[{"type":"input_text","text":"fix it"}]},
                {"type":"function_call","call_id":"c","name":"f","arguments":"{}"},
                {"type":"function_call_output","call_id":"c","output":"done"},
                {"role":"user","content":"thanks"}],"instructions":"sys","model":"r","stream":true}"#,
            100,
        );
        assert_eq!(s.prompt, b"sys\x1efix it\x1edone\x1ethanks");
        assert_eq!((s.model.as_deref(), s.stream), (Some("r"), Some(true)));
        assert_eq!(classify("POST", "/v1/responses"), CallKind::Generate);
        assert_eq!((s.store, s.previous_response_id), (None, None));
    }

    #[test]
    fn reads_the_stored_response_a_turn_continues() {
        let s = scan(
            br#"{"input":"and then?","model":"r","previous_response_id":"resp_1a","store":false,
                "metadata":{"previous_response_id":"resp_nested","store":true}}"#,
            100,
        );
        assert_eq!(s.previous_response_id.as_deref(), Some("resp_1a"));
        assert_eq!((s.store, s.background), (Some(false), None));
        assert_eq!(scan(br#"{"background":true}"#, 10).background, Some(true));
        // Retrieval and cancel by id hold no prefill.
        assert_eq!(classify("GET", "/v1/responses/resp_1a"), CallKind::Passive);
        assert_eq!(
            classify("POST", "/v1/responses/resp_1a/cancel"),
            CallKind::Passive
        );
    }

    #[test]
    fn reads_the_prompt_cache_key_wherever_it_sits_at_the_top() {
        let last = scan(
            br#"{"messages":[{"role":"user","content":"hi","prompt_cache_key":"nested"}],
                "metadata":{"prompt_cache_key":"meta"},"model":"m","prompt_cache_key":"thread-\u0031"}"#,
            100,
        );
        assert_eq!(last.prompt_cache_key.as_deref(), Some("thread-1"));
        let first = scan(br#"{"prompt_cache_key":"k","input":"hi"}"#, 100);
        assert_eq!(first.prompt_cache_key.as_deref(), Some("k"));
        assert_eq!(
            scan(br#"{"prompt_cache_key":7}"#, 10).prompt_cache_key,
            None
        );
    }

    #[test]
    fn counts_inline_attachments_apart_from_the_prompt() {
        let img = "iVBORw0KGgo".repeat(100);
        let chat = format!(
            r#"{{"messages":[{{"role":"user","content":[{{"type":"text","text":"what is this"}},
                {{"type":"image_url","image_url":{{"url":"data:image/png;base64,{img}"}}}}]}}],"model":"v"}}"#
        );
        let s = scan(chat.as_bytes(), 1 << 20);
        let url_len = "data:image/png;base64,".len() + img.len() + 2;
        assert_eq!((s.media_bytes, s.media_items), (url_len as u64, 1));
        assert_eq!(s.prompt, b"what is this");
        // Anthropic: base64 `source.data`, also inside a tool result; a URL source is no attachment.
        let anthropic = format!(
            r#"{{"messages":[{{"role":"user","content":[{{"type":"tool_result","tool_use_id":"t","content":[
                {{"type":"image","source":{{"type":"base64","media_type":"image/png","data":"{img}"}}}}]}},
                {{"type":"image","source":{{"type":"url","url":"https://x/y.png"}}}}]}}],"model":"c"}}"#
        );
        let s = scan(anthropic.as_bytes(), 1 << 20);
        assert_eq!((s.media_bytes, s.media_items), (img.len() as u64 + 2, 1));
        // A tool call's arguments that happen to hold `source.data` are no attachment.
        let tool_input = format!(
            r#"{{"messages":[{{"role":"assistant","content":[{{"type":"tool_use","id":"t","name":"f",
                "input":{{"source":{{"data":"{img}"}}}}}}]}}],"model":"c"}}"#
        );
        assert_eq!(scan(tool_input.as_bytes(), 1 << 20).media_items, 0);
        // Responses API input_image; a body cut inside the attachment counts what arrived.
        let responses = format!(
            r#"{{"input":[{{"role":"user","content":[{{"type":"input_image","image_url":"data:image/jpeg;base64,{img}"}}]}}]}}"#
        );
        let s = scan(responses.as_bytes(), 1 << 20);
        assert_eq!(s.media_items, 1);
        let cut = scan(&responses.as_bytes()[..responses.len() / 2], 1 << 20);
        assert_eq!(cut.media_items, 1);
        assert!(cut.media_bytes > 400, "{}", cut.media_bytes);
        // Text that merely mentions a data URL later in the string is prompt text.
        let s = scan(
            br#"{"prompt":"see data:image/png;base64,AAAA","model":"x"}"#,
            100,
        );
        assert_eq!(s.media_items, 0);
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
        // A system prompt after the conversation, cut anywhere, with a bound that cuts too.
        let late_system = br#"{"input":[{"role":"user","content":[{"type":"input_text","text":"abcdef"}]}],"instructions":"sys prompt","model":"r"}"#;
        for cut in 0..=late_system.len() {
            for max in [4, 12, 1 << 20] {
                let s = scan(&late_system[..cut], max);
                assert!(s.prompt.len() <= max, "cut {cut}, max {max}");
                assert!(s.conversation_at <= s.prompt.len(), "cut {cut}, max {max}");
                if s.conversation_at > 0 {
                    assert_eq!(
                        s.prompt[s.conversation_at - 1],
                        0x1e,
                        "cut {cut}, max {max}"
                    );
                }
            }
        }
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
