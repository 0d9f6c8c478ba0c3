//! Reading a model directory: `tokenizer.json`, `tokenizer_config.json` (`chat_template`, `bos_token`,
//! `eos_token`) and, when present, `chat_template.jinja` (newer models ship the template beside the config; it
//! takes precedence, as in transformers).

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};

use super::template::ChatTemplate;
use super::ModelTokenizer;

/// Why a model directory cannot be used: the file, and what is wrong with it.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadError {
    pub file: PathBuf,
    pub reason: String,
}

impl std::fmt::Display for LoadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.file.display(), self.reason)
    }
}

pub const TOKENIZER_FILE: &str = "tokenizer.json";
pub const CONFIG_FILE: &str = "tokenizer_config.json";
pub const TEMPLATE_FILE: &str = "chat_template.jinja";

fn read(file: &Path, hasher: &mut impl Hasher) -> Result<Vec<u8>, LoadError> {
    let bytes = std::fs::read(file).map_err(|e| LoadError {
        file: file.to_path_buf(),
        reason: match e.kind() {
            std::io::ErrorKind::NotFound => "not found".to_string(),
            _ => format!("cannot be read: {e}"),
        },
    })?;
    bytes.hash(hasher);
    Ok(bytes)
}

/// A special token as tokenizer_config.json writes it: a string, or an added-token object with `content`.
fn special_token(config: &serde_json::Value, key: &str) -> Option<String> {
    match config.get(key)? {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Object(o) => o.get("content")?.as_str().map(str::to_string),
        _ => None,
    }
}

/// tokenizer_config.json's `chat_template`: a string, or a list of named templates (the one named "default").
fn config_template(config: &serde_json::Value) -> Result<Option<String>, String> {
    match config.get("chat_template") {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(serde_json::Value::String(s)) => Ok(Some(s.clone())),
        Some(serde_json::Value::Array(list)) => {
            let named = |want: &str| {
                list.iter().find_map(|t| {
                    (t.get("name")?.as_str()? == want)
                        .then(|| t.get("template")?.as_str().map(str::to_string))
                        .flatten()
                })
            };
            named("default").map(Some).ok_or_else(|| {
                "chat_template lists named templates but none named \"default\"".to_string()
            })
        }
        Some(_) => Err("chat_template must be a string or a list of {name, template}".to_string()),
    }
}

/// Load the tokenizer and the chat template of the model in `dir`, and check that the template renders a
/// one-message conversation.
pub fn load(dir: &Path) -> Result<ModelTokenizer, LoadError> {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    let at = |name: &str| dir.join(name);
    let err = |name: &str, reason: String| LoadError {
        file: at(name),
        reason,
    };
    if !dir.is_dir() {
        return Err(LoadError {
            file: dir.to_path_buf(),
            reason: "is not a directory (the model directory with tokenizer.json and tokenizer_config.json)"
                .to_string(),
        });
    }
    let bytes = read(&at(TOKENIZER_FILE), &mut hasher)?;
    let tokenizer = tokenizers::Tokenizer::from_bytes(&bytes)
        .map_err(|e| err(TOKENIZER_FILE, format!("not a Hugging Face tokenizer: {e}")))?;
    let bytes = read(&at(CONFIG_FILE), &mut hasher)?;
    let config: serde_json::Value = serde_json::from_slice(&bytes)
        .map_err(|e| err(CONFIG_FILE, format!("not valid JSON: {e}")))?;
    if !config.is_object() {
        return Err(err(CONFIG_FILE, "must be a JSON object".to_string()));
    }
    let bos = special_token(&config, "bos_token");
    let eos = special_token(&config, "eos_token");
    let (source, from) = if at(TEMPLATE_FILE).exists() {
        let bytes = read(&at(TEMPLATE_FILE), &mut hasher)?;
        let text =
            String::from_utf8(bytes).map_err(|_| err(TEMPLATE_FILE, "is not UTF-8".to_string()))?;
        (Some(text), TEMPLATE_FILE)
    } else {
        (
            config_template(&config).map_err(|r| err(CONFIG_FILE, r))?,
            CONFIG_FILE,
        )
    };
    let template = match source {
        None => None,
        Some(src) => {
            let t = ChatTemplate::compile(&src)
                .map_err(|e| err(from, format!("the chat template does not compile: {e}")))?;
            Some(t)
        }
    };
    let model = ModelTokenizer {
        dir: dir.to_path_buf(),
        reuse: super::reuse::Reuse::new(&tokenizer),
        tokenizer,
        template,
        bos,
        eos,
        fingerprint: hasher.finish(),
    };
    if model.template.is_some() {
        // What a template calls that MiniJinja lacks (a Python method, a filter) shows at render time: once now.
        let probe = super::prompt::Conversation {
            messages: vec![super::prompt::Message {
                role: "user".to_string(),
                content: "Hello".to_string(),
                tool_calls: None,
                reasoning: None,
                reasoning_content: None,
                tool_call_id: None,
                name: None,
            }],
            tools: None,
            add_generation_prompt: true,
            continue_final_message: false,
            kwargs: None,
            special: false,
        };
        model.render(&probe).map_err(|e| {
            err(
                from,
                format!("the chat template cannot render a user message: {e}"),
            )
        })?;
    }
    Ok(model)
}
