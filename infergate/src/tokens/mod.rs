//! Exact prompt tokens: a pool's tokenizer and chat template read from its model directory (`load`), the prompt
//! vLLM would tokenise rebuilt from a request body (`prompt`) and rendered (`template`), counted off the proxy's
//! threads with a bound (`run`), and the series that counting produces (`metrics`).
//!
//! Without a tokenizer, or when a body has no exact count here, the router estimates bytes / `bytes_per_token`;
//! every such fallback is counted by reason.

mod load;
mod metrics;
mod prompt;
mod reuse;
mod run;
mod template;

use std::path::{Path, PathBuf};

pub use load::{load, LoadError, CONFIG_FILE, TEMPLATE_FILE, TOKENIZER_FILE};
pub use prompt::{Api, Conversation, Message, Prompt};
pub use run::{Tokenizing, DEFAULT_MAX_BYTES};
pub use template::ChatTemplate;

/// A request's prompt as the engine tokenises it: its token ids (another part recomputes the engine's KV block
/// keys from them) and their number.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PromptTokens {
    pub ids: Vec<u32>,
    pub count: u64,
    /// Of them, the ids of a prefix counted before and not encoded again (`reuse`).
    pub reused: u64,
}

impl PromptTokens {
    pub fn new(ids: Vec<u32>) -> PromptTokens {
        PromptTokens {
            count: ids.len() as u64,
            ids,
            reused: 0,
        }
    }
}

/// Why a request's tokens were estimated from its bytes instead (`infergate_tokenizer_fallbacks_total{reason}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fallback {
    /// The body is not a chat, completions or messages request (not JSON, no `messages` or `prompt`).
    Body,
    /// A content part that is not text (an image's tokens depend on the engine's processor).
    Media,
    /// What has no exact rule here: the Responses API, several prompts in one request, Anthropic tools.
    Unsupported,
    /// The chat template failed on this conversation (or the model has none).
    Template,
    /// The tokenizer failed on the rendered text.
    Encode,
    /// The body is larger than the pool's `tokenizer.max_bytes`.
    TooLarge,
    /// Too many requests were already waiting to be counted.
    Busy,
}

impl Fallback {
    pub const ALL: [Fallback; 7] = [
        Fallback::Body,
        Fallback::Media,
        Fallback::Unsupported,
        Fallback::Template,
        Fallback::Encode,
        Fallback::TooLarge,
        Fallback::Busy,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Fallback::Body => "body",
            Fallback::Media => "media",
            Fallback::Unsupported => "unsupported",
            Fallback::Template => "template",
            Fallback::Encode => "encode",
            Fallback::TooLarge => "too_large",
            Fallback::Busy => "busy",
        }
    }
}

/// A model's tokenizer and chat template, loaded once (config load or reload) and shared by its pool's requests.
pub struct ModelTokenizer {
    dir: PathBuf,
    tokenizer: tokenizers::Tokenizer,
    template: Option<ChatTemplate>,
    /// Prefixes of chat prompts counted before (None: reuse would not be exact for this tokenizer).
    reuse: Option<reuse::Reuse>,
    bos: Option<String>,
    eos: Option<String>,
    /// A hash of the files read: a reload that finds them changed loads them again.
    fingerprint: u64,
}

/// The directory and a fingerprint of its files, never their contents.
impl std::fmt::Debug for ModelTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelTokenizer")
            .field("dir", &self.dir)
            .field("files", &format_args!("{:016x}", self.fingerprint))
            .field("chat_template", &self.template.is_some())
            .finish()
    }
}

impl ModelTokenizer {
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Whether the model has a chat template (without one, chat requests fall back to bytes).
    pub fn has_chat_template(&self) -> bool {
        self.template.is_some()
    }

    /// The text the chat template makes of `conv`, as transformers' `apply_chat_template(tokenize=False)` makes it
    /// for vLLM: `messages`, `tools`, `add_generation_prompt`, `bos_token`, `eos_token` and the request's
    /// `chat_template_kwargs`; with `continue_final_message`, cut after the last message's content.
    pub fn render(&self, conv: &Conversation) -> Result<String, String> {
        let Some(t) = &self.template else {
            return Err("the model has no chat template".to_string());
        };
        let kwargs = conv.kwargs.clone().unwrap_or_default();
        let ctx = minijinja::context! {
            messages => minijinja::Value::from(minijinja::value::Serde(&conv.messages)),
            tools => conv.tools.clone(),
            documents => (),
            add_generation_prompt => conv.add_generation_prompt && !conv.continue_final_message,
            bos_token => self.bos.as_deref().unwrap_or(""),
            eos_token => self.eos.as_deref().unwrap_or(""),
            ..kwargs
        };
        let mut text = t.render(ctx)?;
        if conv.continue_final_message {
            let last = conv.messages.last().map_or("", |m| m.content.trim());
            match text.rfind(last) {
                Some(i) if !last.is_empty() => text.truncate(i + last.len()),
                _ => return Err("the final message is not in the rendered text".to_string()),
            }
        }
        Ok(text)
    }

    /// The token ids of `text`, with the tokenizer's special tokens (BOS) added when `special`.
    pub fn encode(&self, text: &str, special: bool) -> Result<Vec<u32>, Fallback> {
        let enc = self
            .tokenizer
            .encode_fast(text, special)
            .map_err(|_| Fallback::Encode)?;
        Ok(enc.get_ids().to_vec())
    }

    /// The prompt tokens of a request body to `api`, as vLLM tokenises them. CPU-bound: call it off the async
    /// threads (`Tokenizing::count`).
    pub fn count(&self, api: Api, body: &[u8]) -> Result<PromptTokens, Fallback> {
        let (text, special, chat) = match prompt::prompt(api, body)? {
            Prompt::Ids(ids) => return Ok(PromptTokens::new(ids)),
            Prompt::Text { text, special } => (text, special, false),
            Prompt::Chat(conv) => (
                self.render(&conv).map_err(|_| Fallback::Template)?,
                conv.special,
                true,
            ),
        };
        // A chat's next turn renders as this one plus what it adds: only that is encoded again.
        if let Some(reuse) = self.reuse.as_ref().filter(|_| chat && !special) {
            let (ids, reused) = reuse
                .encode(&text, |t| self.encode(t, false).ok())
                .ok_or(Fallback::Encode)?;
            return Ok(PromptTokens {
                reused,
                ..PromptTokens::new(ids)
            });
        }
        Ok(PromptTokens::new(self.encode(&text, special)?))
    }
}

#[cfg(test)]
pub(crate) mod testing;

#[cfg(test)]
mod tests;
