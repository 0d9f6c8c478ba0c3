//! What the engine tokenises of a request body: a chat conversation as vLLM hands it to the chat template, or a
//! completion's prompt.
//!
//! vLLM (`renderers/chat_utils.py`) passes each message to the template as `role`, `content` (a string: text parts
//! joined with "\n", "" for none), `tool_calls` (their `arguments` parsed into a mapping, `{}` when empty or not an
//! object), `reasoning`, `tool_call_id` and `name`; it then tokenises the rendered text without special tokens
//! (the template writes them), unless the request says `add_special_tokens`. A completion's prompt string is
//! tokenised with them (BOS), a list of token ids is taken as it is.

use minijinja::Value;
use serde::{Deserialize, Serialize};

use super::Fallback;

/// The request APIs whose prompt this module knows how to rebuild.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    /// `/v1/chat/completions`
    Chat,
    /// `/v1/completions`
    Completions,
    /// `/v1/messages` (Anthropic-style; vLLM renders it through the same chat template)
    Messages,
}

impl Api {
    /// The API of a normalised request path (None: no exact count, e.g. the Responses API).
    pub fn of_path(path: &str) -> Option<Api> {
        match path {
            "/v1/chat/completions" => Some(Api::Chat),
            "/v1/completions" => Some(Api::Completions),
            "/v1/messages" => Some(Api::Messages),
            _ => None,
        }
    }
}

/// What to tokenise.
#[derive(Debug, PartialEq)]
pub enum Prompt {
    /// A conversation for the chat template.
    Chat(Conversation),
    /// Text tokenised as it is; `special`: with the tokenizer's special tokens (BOS) added.
    Text { text: String, special: bool },
    /// Token ids the client sent.
    Ids(Vec<u32>),
}

/// A conversation as the chat template sees it, plus the request's rendering switches.
#[derive(Debug, PartialEq)]
pub struct Conversation {
    pub messages: Vec<Message>,
    pub tools: Option<Value>,
    pub add_generation_prompt: bool,
    pub continue_final_message: bool,
    /// Extra template variables (`chat_template_kwargs`, e.g. `enable_thinking`).
    pub kwargs: Option<Value>,
    /// Tokenise the rendered text with special tokens added (vLLM's default for chat: no).
    pub special: bool,
}

/// One message in the shape vLLM gives the template.
#[derive(Debug, Serialize, PartialEq)]
pub struct Message {
    pub role: String,
    pub content: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCall>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reasoning_content: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

#[derive(Debug, Serialize, Deserialize, PartialEq)]
pub struct ToolCall {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(rename = "type", default = "function_type")]
    pub kind: String,
    pub function: Function,
}

fn function_type() -> String {
    "function".to_string()
}

#[derive(Debug, Serialize, Deserialize, PartialEq)]
pub struct Function {
    pub name: String,
    /// A JSON string as the client sends it; a mapping once parsed for the template.
    #[serde(default)]
    pub arguments: Value,
}

/// A tool as vLLM hands it to the template (its `ChatCompletionToolsParam.model_dump()`): `description` and
/// `parameters` null when absent, `strict` and `defer_loading` only when set, nothing else.
#[derive(Debug, Serialize, Deserialize, PartialEq)]
pub struct Tool {
    #[serde(rename = "type", default = "function_type")]
    pub kind: String,
    pub function: ToolFunction,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub defer_loading: Option<bool>,
}

#[derive(Debug, Serialize, Deserialize, PartialEq)]
pub struct ToolFunction {
    pub name: String,
    #[serde(default)]
    pub description: Option<String>,
    #[serde(default)]
    pub parameters: Option<Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strict: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub defer_loading: Option<bool>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Content {
    Text(String),
    Parts(Vec<Part>),
}

#[derive(Deserialize)]
struct Part {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    text: Option<String>,
}

#[derive(Deserialize)]
struct ChatBody {
    messages: Vec<ChatMessage>,
    #[serde(default)]
    tools: Option<Vec<Tool>>,
    #[serde(default)]
    add_generation_prompt: Option<bool>,
    #[serde(default)]
    continue_final_message: Option<bool>,
    #[serde(default)]
    chat_template_kwargs: Option<Value>,
    #[serde(default)]
    add_special_tokens: Option<bool>,
}

#[derive(Deserialize)]
struct ChatMessage {
    role: String,
    #[serde(default)]
    content: Option<Content>,
    #[serde(default)]
    tool_calls: Option<Vec<ToolCall>>,
    #[serde(default)]
    reasoning: Option<String>,
    #[serde(default)]
    tool_call_id: Option<String>,
    #[serde(default)]
    name: Option<String>,
}

#[derive(Deserialize)]
struct MessagesBody {
    #[serde(default)]
    system: Option<Content>,
    messages: Vec<AnthropicMessage>,
    #[serde(default)]
    tools: Option<serde::de::IgnoredAny>,
}

#[derive(Deserialize)]
struct AnthropicMessage {
    role: String,
    content: Content,
}

#[derive(Deserialize)]
struct CompletionsBody {
    prompt: PromptField,
    #[serde(default)]
    add_special_tokens: Option<bool>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum PromptField {
    Text(String),
    Ids(Vec<u32>),
    Texts(Vec<String>),
    IdLists(Vec<Vec<u32>>),
}

/// The prompt of a request body to `api`. `Fallback::Body` for a body that is not such a request,
/// `Fallback::Media` for content that is not text, `Fallback::Unsupported` for what has no exact rule here.
pub fn prompt(api: Api, body: &[u8]) -> Result<Prompt, Fallback> {
    match api {
        Api::Chat => chat(body),
        Api::Completions => completion(body),
        Api::Messages => messages(body),
    }
}

fn chat(body: &[u8]) -> Result<Prompt, Fallback> {
    let b: ChatBody = serde_json::from_slice(body).map_err(|_| Fallback::Body)?;
    let messages = b
        .messages
        .into_iter()
        .map(chat_message)
        .collect::<Result<Vec<_>, _>>()?;
    Ok(Prompt::Chat(Conversation {
        messages,
        tools: b.tools.map(|tools| {
            let tools: Vec<Tool> = tools
                .into_iter()
                .map(|mut t| {
                    // A tool's defer_loading reaches its function, as vLLM's validator does.
                    if t.function.defer_loading.is_none() {
                        t.function.defer_loading = t.defer_loading;
                    }
                    t
                })
                .collect();
            Value::from(minijinja::value::Serde(tools))
        }),
        add_generation_prompt: b.add_generation_prompt.unwrap_or(true),
        continue_final_message: b.continue_final_message.unwrap_or(false),
        kwargs: b.chat_template_kwargs,
        special: b.add_special_tokens.unwrap_or(false),
    }))
}

fn chat_message(m: ChatMessage) -> Result<Message, Fallback> {
    let content = text_of(m.content)?;
    let tool_calls = match m.tool_calls {
        // An empty list is dropped (the template's plain assistant path), as vLLM does.
        Some(calls) if calls.is_empty() => None,
        Some(calls) if m.role == "assistant" => {
            Some(calls.into_iter().map(parse_arguments).collect())
        }
        _ => None,
    };
    // vLLM reads `reasoning` and hands it to the template under both names.
    let reasoning = m.reasoning.filter(|_| m.role == "assistant");
    Ok(Message {
        tool_call_id: m.tool_call_id.filter(|_| m.role == "tool"),
        reasoning_content: reasoning.clone(),
        reasoning,
        role: m.role,
        content,
        tool_calls,
        name: m.name,
    })
}

/// The arguments of a tool call as the template sees them: the JSON object the string holds, else `{}`.
fn parse_arguments(mut call: ToolCall) -> ToolCall {
    let args = &call.function.arguments;
    let parsed = match args.as_str() {
        Some(s) if !s.is_empty() => serde_json::from_str::<Value>(s).ok(),
        Some(_) => None,
        None if args.is_none() || args.is_undefined() => None,
        None => Some(args.clone()),
    };
    call.function.arguments = match parsed {
        Some(v) if v.kind() == minijinja::value::ValueKind::Map => v,
        _ => Value::from(minijinja::value::Serde(serde_json::Map::new())),
    };
    call
}

/// A message's content as one string: text parts joined with "\n", "" for none; any other part has no exact
/// count here (an image's tokens depend on the engine's processor).
fn text_of(content: Option<Content>) -> Result<String, Fallback> {
    match content {
        None => Ok(String::new()),
        Some(Content::Text(s)) => Ok(s),
        Some(Content::Parts(parts)) => {
            let mut texts = Vec::with_capacity(parts.len());
            for p in parts {
                match (p.kind.as_str(), p.text) {
                    ("text", Some(t)) => texts.push(t),
                    _ => return Err(Fallback::Media),
                }
            }
            Ok(texts.join("\n"))
        }
    }
}

fn messages(body: &[u8]) -> Result<Prompt, Fallback> {
    let b: MessagesBody = serde_json::from_slice(body).map_err(|_| Fallback::Body)?;
    if b.tools.is_some() {
        // vLLM converts Anthropic tools to OpenAI ones with defaults of its own: not reproduced here.
        return Err(Fallback::Unsupported);
    }
    let mut messages = Vec::with_capacity(b.messages.len() + 1);
    if let Some(system) = b.system {
        messages.push(plain("system", text_of(Some(system))?));
    }
    for m in b.messages {
        messages.push(plain(&m.role, text_of(Some(m.content))?));
    }
    Ok(Prompt::Chat(Conversation {
        messages,
        tools: None,
        add_generation_prompt: true,
        continue_final_message: false,
        kwargs: None,
        special: false,
    }))
}

fn plain(role: &str, content: String) -> Message {
    Message {
        role: role.to_string(),
        content,
        tool_calls: None,
        reasoning: None,
        reasoning_content: None,
        tool_call_id: None,
        name: None,
    }
}

fn completion(body: &[u8]) -> Result<Prompt, Fallback> {
    let b: CompletionsBody = serde_json::from_slice(body).map_err(|_| Fallback::Body)?;
    let special = b.add_special_tokens.unwrap_or(true);
    match b.prompt {
        PromptField::Text(text) => Ok(Prompt::Text { text, special }),
        PromptField::Ids(ids) => Ok(Prompt::Ids(ids)),
        PromptField::Texts(mut t) if t.len() == 1 => Ok(Prompt::Text {
            text: t.remove(0),
            special,
        }),
        PromptField::IdLists(mut l) if l.len() == 1 => Ok(Prompt::Ids(l.remove(0))),
        // Several prompts are several engine requests: one request's token ids do not describe them.
        _ => Err(Fallback::Unsupported),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn conv(body: serde_json::Value) -> Conversation {
        match prompt(Api::Chat, body.to_string().as_bytes()).unwrap() {
            Prompt::Chat(c) => c,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn chat_messages_take_the_shape_vllm_gives_the_template() {
        let c = conv(serde_json::json!({
            "model": "m",
            "messages": [
                {"role": "system", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"z\": 1, \"a\": 2}"}},
                    {"id": "c2", "type": "function", "function": {"name": "g", "arguments": "not json"}}
                ]},
                {"role": "tool", "content": "42", "tool_call_id": "c1"},
                {"role": "assistant", "content": "ok", "tool_calls": []}
            ]
        }));
        assert!(c.add_generation_prompt && !c.special && c.tools.is_none());
        let m = &c.messages;
        assert_eq!(m[0].content, "a\nb");
        assert_eq!(m[1].content, "");
        let calls = m[1].tool_calls.as_ref().unwrap();
        // Parsed into a mapping, keys in the client's order; a string that is no object becomes {}.
        let json = |v: &Value| serde_json::to_string(v).unwrap();
        assert_eq!(json(&calls[0].function.arguments), "{\"z\":1,\"a\":2}");
        assert_eq!(json(&calls[1].function.arguments), "{}");
        assert_eq!(m[2].tool_call_id.as_deref(), Some("c1"));
        assert_eq!(m[3].tool_calls, None, "an empty list is dropped");
    }

    #[test]
    fn images_bad_bodies_and_several_prompts_have_no_exact_count() {
        let image = serde_json::json!({"messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}]});
        assert_eq!(
            prompt(Api::Chat, image.to_string().as_bytes()),
            Err(Fallback::Media)
        );
        assert_eq!(prompt(Api::Chat, b"{\"messages\": 3}"), Err(Fallback::Body));
        assert_eq!(prompt(Api::Chat, b"not json"), Err(Fallback::Body));
        assert_eq!(
            prompt(Api::Completions, b"{\"prompt\": [\"a\", \"b\"]}"),
            Err(Fallback::Unsupported)
        );
    }

    #[test]
    fn completion_prompts_add_special_tokens_unless_told_not_to() {
        assert_eq!(
            prompt(Api::Completions, b"{\"prompt\": \"hi\", \"model\": \"m\"}"),
            Ok(Prompt::Text {
                text: "hi".into(),
                special: true
            })
        );
        assert_eq!(
            prompt(
                Api::Completions,
                b"{\"prompt\": [\"hi\"], \"add_special_tokens\": false}"
            ),
            Ok(Prompt::Text {
                text: "hi".into(),
                special: false
            })
        );
        assert_eq!(
            prompt(Api::Completions, b"{\"prompt\": [1, 2, 3]}"),
            Ok(Prompt::Ids(vec![1, 2, 3]))
        );
    }

    #[test]
    fn an_anthropic_request_becomes_a_system_message_and_its_turns() {
        let body = serde_json::json!({"model": "m", "max_tokens": 5, "system": "be brief",
            "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]});
        let Prompt::Chat(c) = prompt(Api::Messages, body.to_string().as_bytes()).unwrap() else {
            panic!()
        };
        let roles: Vec<_> = c
            .messages
            .iter()
            .map(|m| (m.role.as_str(), m.content.as_str()))
            .collect();
        assert_eq!(roles, [("system", "be brief"), ("user", "hi")]);
    }
}
