//! The simulator's tokeniser, FNV-1a hashing and prompt extraction from OpenAI / Anthropic request bodies.
//!
//! Tokenisation rule (deterministic, prefix-stable, deliberately NOT bytes/4):
//! - a maximal run of ASCII letters and `_` is one token per started 8 characters (`ceil(len / 8)`);
//! - every ASCII digit is one token (Llama's, Mistral's and Qwen's tokenizers split numbers into digits: real vLLM
//!   counts a 10 kB prompt of numbers as ~10k tokens, `tests/it/real_vllm/parity.rs`);
//! - every other ASCII printable character (punctuation, symbols) is one token;
//! - spaces, tabs and `\r` cost nothing; a run of `\n` is one token;
//! - every non-ASCII character is one token;
//! - a chat-template special token `<|name|>` is one token.
//!
//! On English prose this gives ~5 bytes per token, i.e. 15-25% fewer tokens than the bytes/4 estimate routers
//! use; on JSON or code (many symbols) it gives more tokens than bytes/4.

use serde_json::Value;

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

/// FNV-1a 64-bit hash of `bytes` (tests use it to compare request bodies byte for byte).
pub fn fnv64(bytes: &[u8]) -> u64 {
    fnv_extend(FNV_OFFSET, bytes)
}

#[inline]
fn fnv_extend(mut h: u64, bytes: &[u8]) -> u64 {
    for &b in bytes {
        h ^= b as u64;
        h = h.wrapping_mul(FNV_PRIME);
    }
    h
}

/// Longest alphanumeric piece that is one token.
const RUN_PIECE: usize = 8;

/// Calls `f` with the 64-bit identity of every token of `text`, in order.
pub fn for_each_token(text: &str, mut f: impl FnMut(u64)) {
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let b = bytes[i];
        if b.is_ascii_digit() {
            f(fnv64(&bytes[i..i + 1]));
            i += 1;
        } else if b.is_ascii_alphabetic() || b == b'_' {
            let start = i;
            while i < bytes.len()
                && (bytes[i].is_ascii_alphabetic() || bytes[i] == b'_')
                && i - start < RUN_PIECE
            {
                i += 1;
            }
            f(fnv64(&bytes[start..i]));
        } else if b == b'<' && bytes.get(i + 1) == Some(&b'|') {
            // A chat-template special token `<|name|>` is one token; a lone `<|` is two symbols.
            let end = bytes[i + 2..]
                .iter()
                .take(32)
                .position(|c| !(c.is_ascii_alphanumeric() || *c == b'_'))
                .map(|p| i + 2 + p)
                .filter(|&e| bytes[e..].starts_with(b"|>"));
            match end {
                Some(e) => {
                    f(fnv64(&bytes[i..e + 2]));
                    i = e + 2;
                }
                None => {
                    f(fnv64(b"<"));
                    i += 1;
                }
            }
        } else if b == b'\n' {
            while i < bytes.len() && bytes[i] == b'\n' {
                i += 1;
            }
            f(fnv64(b"\n"));
        } else if b == b' ' || b == b'\t' || b == b'\r' {
            i += 1;
        } else if b < 0x80 {
            f(fnv64(&bytes[i..i + 1]));
            i += 1;
        } else {
            // A multi-byte UTF-8 character: one token. `text` is valid UTF-8, so skip continuation bytes.
            let start = i;
            i += 1;
            while i < bytes.len() && (bytes[i] & 0xC0) == 0x80 {
                i += 1;
            }
            f(fnv64(&bytes[start..i]));
        }
    }
}

/// Number of tokens in `text` by the rule above.
pub fn count_tokens(text: &str) -> usize {
    let mut n = 0;
    for_each_token(text, |_| n += 1);
    n
}

/// A token's id as a tokenizer endpoint shows it (its identity folded into a 151,936-entry vocabulary).
pub fn token_id(token: u64) -> u32 {
    (token % 151_936) as u32
}

/// A prompt reduced to what the scheduler needs: its length and the chained hashes of its full blocks.
#[derive(Debug, Clone, Default)]
pub struct PromptTokens {
    pub len: usize,
    pub block_hashes: Vec<u64>,
    /// Token ids (only filled for `/tokenize`).
    pub ids: Vec<u32>,
}

/// Builds [`PromptTokens`] incrementally: block i's hash covers block i-1's hash and block i's tokens.
pub struct BlockHasher {
    block_tokens: usize,
    in_block: usize,
    prev: u64,
    state: u64,
    collect_ids: bool,
    out: PromptTokens,
}

impl BlockHasher {
    pub fn new(block_tokens: usize) -> Self {
        let block_tokens = block_tokens.max(1);
        BlockHasher {
            block_tokens,
            in_block: 0,
            prev: 0,
            state: fnv_extend(FNV_OFFSET, &0u64.to_le_bytes()),
            collect_ids: false,
            out: PromptTokens::default(),
        }
    }

    /// Also keep the token ids (see [`token_id`]).
    pub fn collecting_ids(mut self) -> Self {
        self.collect_ids = true;
        self
    }

    pub fn push(&mut self, token: u64) {
        self.state = fnv_extend(self.state, &token.to_le_bytes());
        self.in_block += 1;
        self.out.len += 1;
        if self.collect_ids {
            self.out.ids.push(token_id(token));
        }
        if self.in_block == self.block_tokens {
            self.prev = self.state;
            self.out.block_hashes.push(self.prev);
            self.state = fnv_extend(FNV_OFFSET, &self.prev.to_le_bytes());
            self.in_block = 0;
        }
    }

    pub fn push_text(&mut self, text: &str) {
        for_each_token(text, |t| self.push(t));
    }

    pub fn finish(self) -> PromptTokens {
        self.out
    }
}

/// The API family of a generation request (decides request parsing and response shapes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApiKind {
    Chat,
    Completion,
    Messages,
    /// OpenAI's Responses API (`/v1/responses`): `input` and `instructions`.
    Responses,
}

/// A parsed generation request.
#[derive(Debug, Clone)]
pub struct GenRequest {
    /// The `model` field, if any (echoed in responses).
    pub model: Option<String>,
    pub stream: bool,
    /// `stream_options.include_usage` (OpenAI): usage is then sent in its own final chunk, as vLLM does.
    pub include_usage: bool,
    pub max_tokens: Option<i64>,
    pub prompt: PromptTokens,
    /// Responses API: the request's `input` as chat messages (what a stored response keeps); empty otherwise.
    pub input: Vec<Value>,
    /// The request's `kv_transfer_params` (disaggregated prefill and decode, `kv_transfer`).
    pub kv_transfer: Option<Value>,
}

/// The Responses API's storage fields of a request.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StoreFields {
    /// `store` (true when absent, as in OpenAI's API).
    pub store: bool,
    pub background: bool,
    pub previous_response_id: Option<String>,
}

/// Why a request body was rejected (400).
#[derive(Debug, Clone)]
pub struct BadRequest(pub String);

/// Appends the text of an OpenAI / Anthropic `content` value (string, or array of parts with `text`).
fn push_content(h: &mut BlockHasher, content: &Value) {
    match content {
        Value::String(s) => h.push_text(s),
        Value::Array(parts) => {
            for p in parts {
                match p {
                    Value::String(s) => h.push_text(s),
                    Value::Object(o) => {
                        if let Some(Value::String(t)) = o.get("text") {
                            h.push_text(t);
                        } else if let Some(c) = o.get("content") {
                            // Anthropic tool_result blocks nest content.
                            push_content(h, c);
                        } else if let Some(i) = o.get("input") {
                            // Anthropic tool_use blocks.
                            h.push_text(&i.to_string());
                        } else {
                            // Images and other parts: a fixed small cost.
                            h.push_text("<|media|>");
                        }
                    }
                    other => h.push_text(&other.to_string()),
                }
            }
        }
        Value::Null => {}
        other => h.push_text(&other.to_string()),
    }
}

/// Applies a ChatML-like template to `messages` (and an optional Anthropic `system`), so a conversation's
/// turn n+1 prompt starts with turn n's prompt token for token (the property prefix caching relies on).
fn push_chat<'a>(
    h: &mut BlockHasher,
    system: Option<&Value>,
    messages: impl IntoIterator<Item = &'a Value>,
    tools: Option<&Value>,
) {
    if let Some(tools) = tools {
        h.push_text("<|im_start|>tools\n");
        h.push_text(&tools.to_string());
        h.push_text("<|im_end|>\n");
    }
    if let Some(sys) = system {
        h.push_text("<|im_start|>system\n");
        match sys {
            // vLLM drops Claude Code's attribution block (its hashes change per request) before rendering.
            Value::Array(blocks) => {
                let kept: Vec<Value> = blocks
                    .iter()
                    .filter(|b| {
                        !b.get("text")
                            .and_then(Value::as_str)
                            .is_some_and(|t| t.starts_with("x-anthropic-billing-header"))
                    })
                    .cloned()
                    .collect();
                push_content(h, &Value::Array(kept));
            }
            other => push_content(h, other),
        }
        h.push_text("<|im_end|>\n");
    }
    for m in messages {
        let role = m.get("role").and_then(Value::as_str).unwrap_or("user");
        h.push_text("<|im_start|>");
        h.push_text(role);
        h.push_text("\n");
        if let Some(c) = m.get("content") {
            push_content(h, c);
        }
        if let Some(tc) = m.get("tool_calls") {
            h.push_text(&tc.to_string());
        }
        h.push_text("<|im_end|>\n");
    }
    h.push_text("<|im_start|>assistant\n");
}

fn push_prompt(h: &mut BlockHasher, prompt: &Value) -> Result<(), BadRequest> {
    match prompt {
        Value::String(s) => h.push_text(s),
        Value::Array(items) => {
            for it in items {
                match it {
                    Value::String(s) => h.push_text(s),
                    Value::Number(n) => h.push(n.as_u64().unwrap_or(0).wrapping_mul(FNV_PRIME)),
                    Value::Array(inner) => {
                        for t in inner {
                            h.push(t.as_u64().unwrap_or(0).wrapping_mul(FNV_PRIME));
                        }
                    }
                    _ => {
                        return Err(BadRequest(
                            "prompt must be a string, an array of strings or of token ids".into(),
                        ))
                    }
                }
            }
        }
        _ => {
            return Err(BadRequest(
                "prompt must be a string, an array of strings or of token ids".into(),
            ))
        }
    }
    Ok(())
}

/// Tokenises the prompt of a request body of the given API kind (also used by count_tokens and /tokenize).
pub fn prompt_of(
    kind: ApiKind,
    v: &Value,
    block_tokens: usize,
    ids: bool,
) -> Result<PromptTokens, BadRequest> {
    let mut h = BlockHasher::new(block_tokens);
    if ids {
        h = h.collecting_ids();
    }
    if kind == ApiKind::Responses {
        return Ok(responses_prompt(h, v, &[])?.0);
    }
    let messages = v.get("messages");
    match (kind, messages) {
        (ApiKind::Completion, _) | (_, None) if v.get("prompt").is_some() => {
            push_prompt(&mut h, &v["prompt"])?
        }
        (_, Some(Value::Array(msgs))) => {
            let system = if kind == ApiKind::Messages {
                v.get("system")
            } else {
                None
            };
            push_chat(&mut h, system, msgs, v.get("tools"))
        }
        (ApiKind::Completion, _) => return Err(BadRequest("'prompt' is required".into())),
        (_, Some(_)) => return Err(BadRequest("'messages' must be an array".into())),
        (_, None) => return Err(BadRequest("'messages' is required".into())),
    }
    Ok(finish_prompt(h))
}

fn finish_prompt(h: BlockHasher) -> PromptTokens {
    let mut p = h.finish();
    if p.len == 0 {
        // An empty prompt still costs one token (a BOS token on a real model).
        p.len = 1;
    }
    p
}

/// A Responses API prompt: the stored conversation `history` (of its `previous_response_id`) continued by the
/// request's `input`, which comes back as chat messages too.
fn responses_prompt(
    mut h: BlockHasher,
    v: &Value,
    history: &[&Value],
) -> Result<(PromptTokens, Vec<Value>), BadRequest> {
    let input = responses_messages(v)?;
    let messages = history.iter().copied().chain(&input);
    push_chat(&mut h, v.get("instructions"), messages, v.get("tools"));
    Ok((finish_prompt(h), input))
}

/// A Responses API `input` as chat messages: a string is one user message; list items are messages (`role`,
/// `content`), tool calls (`arguments`) or tool outputs (`output`).
fn responses_messages(v: &Value) -> Result<Vec<Value>, BadRequest> {
    match v.get("input") {
        Some(Value::String(s)) => Ok(vec![serde_json::json!({"role": "user", "content": s})]),
        Some(Value::Array(items)) => Ok(items
            .iter()
            .map(|it| match it.get("type").and_then(Value::as_str) {
                Some("function_call") => {
                    serde_json::json!({"role": "assistant", "content": it.get("arguments")})
                }
                Some("function_call_output") => {
                    serde_json::json!({"role": "tool", "content": it.get("output")})
                }
                _ if it.get("role").is_some() => it.clone(),
                _ => serde_json::json!({"role": "user", "content": it.to_string()}),
            })
            .collect()),
        None | Some(Value::Null) => Err(BadRequest("'input' is required".into())),
        Some(_) => Err(BadRequest("'input' must be a string or an array".into())),
    }
}

/// A generation request body: a JSON object.
pub fn parse_body(body: &[u8]) -> Result<Value, BadRequest> {
    let v: Value =
        serde_json::from_slice(body).map_err(|e| BadRequest(format!("invalid JSON body: {e}")))?;
    if !v.is_object() {
        return Err(BadRequest("request body must be a JSON object".into()));
    }
    Ok(v)
}

/// The storage fields of a Responses API request body.
pub fn store_fields(v: &Value) -> Result<StoreFields, BadRequest> {
    let flag = |name: &str, default: bool| match v.get(name) {
        None | Some(Value::Null) => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(BadRequest(format!("{name} must be a boolean"))),
    };
    let previous_response_id = match v.get("previous_response_id") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => return Err(BadRequest("previous_response_id must be a string".into())),
    };
    Ok(StoreFields {
        store: flag("store", true)?,
        background: flag("background", false)?,
        previous_response_id,
    })
}

/// The generation request of a body of the given kind; a Responses API request continues `history`.
pub fn gen_request(
    kind: ApiKind,
    v: &Value,
    block_tokens: usize,
    history: &[&Value],
) -> Result<GenRequest, BadRequest> {
    let (prompt, input) = if kind == ApiKind::Responses {
        responses_prompt(BlockHasher::new(block_tokens), v, history)?
    } else {
        (prompt_of(kind, v, block_tokens, false)?, Vec::new())
    };
    let max_tokens = match v
        .get("max_completion_tokens")
        .filter(|x| !x.is_null())
        .or_else(|| v.get("max_output_tokens").filter(|x| !x.is_null()))
        .or_else(|| v.get("max_tokens"))
    {
        None | Some(Value::Null) => None,
        Some(x) => Some(
            x.as_i64()
                .ok_or_else(|| BadRequest("max_tokens must be an integer".into()))?,
        ),
    };
    let stream = match v.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(BadRequest("stream must be a boolean".into())),
    };
    let include_usage = v
        .get("stream_options")
        .and_then(|o| o.get("include_usage"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let model = v.get("model").and_then(Value::as_str).map(str::to_string);
    Ok(GenRequest {
        model,
        stream,
        include_usage,
        max_tokens,
        prompt,
        input,
        kv_transfer: v.get("kv_transfer_params").cloned(),
    })
}

/// Text of generated token `i` (deterministic filler words).
pub fn output_token(i: usize) -> &'static str {
    const WORDS: [&str; 16] = [
        " The", " engine", " sim", " says", " hello", " and", " keeps", " going", " with", " more",
        " tokens", ",", " a", " steady", " stream", ".",
    ];
    WORDS[i % WORDS.len()]
}

#[cfg(test)]
mod tests;
