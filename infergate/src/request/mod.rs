//! Request classification (which calls generate) and a one-pass, tolerant scan of the request body for routing.
//!
//! The scan finds `model`, `stream` and the prompt text wherever they sit in the body, in one pass and without
//! building a JSON tree (a 1 MiB prompt costs a byte loop), and tolerates a body cut short or malformed.

pub mod kv_transfer;

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
    /// Top-level `max_tokens` (`max_completion_tokens`, Responses `max_output_tokens`): the longest answer the
    /// request allows, if it says.
    pub max_tokens: Option<u64>,
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
    MaxTokens,
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
                    Role::MaxTokens => {
                        let n = std::str::from_utf8(&self.b[start..self.i]).ok();
                        self.out.max_tokens = n.and_then(|n| n.parse().ok());
                    }
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
                (Role::Root, b"max_tokens" | b"max_completion_tokens" | b"max_output_tokens") => {
                    Role::MaxTokens
                }
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
    // The common case, plain UTF-8 without escapes: one check, one copy.
    if let (Ok(s), None) = (std::str::from_utf8(raw), memchr::memchr(b'\\', raw)) {
        return s.to_owned();
    }
    let s = String::from_utf8_lossy(raw);
    if !s.contains('\\') {
        return s.into_owned();
    }
    serde_json::from_str::<String>(&format!("\"{s}\"")).unwrap_or_else(|_| s.into_owned())
}

#[cfg(test)]
mod tests;
