//! One OpenAI-compatible chat request, streamed or not, with its timings: time to response headers, time to the
//! first SSE `data:` chunk carrying a token (TTFT), and the time of the last one (for the decode rate).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use serde::ser::SerializeStruct;
use serde::{Serialize, Serializer};
use serde_json::Value;

/// Live counters for the progress line (shared by every task of a run).
#[derive(Default)]
pub struct Live {
    pub sessions_started: AtomicU64,
    pub sessions_done: AtomicU64,
    pub sent: AtomicU64,
    pub ok: AtomicU64,
    pub errors: AtomicU64,
    /// Token chunks received (all requests, background streams included).
    pub chunks: AtomicU64,
}

impl Live {
    pub fn in_flight(&self) -> u64 {
        let done = self.ok.load(Ordering::Relaxed) + self.errors.load(Ordering::Relaxed);
        self.sent.load(Ordering::Relaxed).saturating_sub(done)
    }
}

/// A chat message as sent.
#[derive(Debug, Clone, Serialize)]
pub struct Msg {
    pub role: &'static str,
    pub content: String,
}

/// The order of the keys in a chat body. JSON servers must not care, but a router that reads bodies as they
/// stream in may (which key comes first decides what it has seen when).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum FieldOrder {
    // What openai-python 1.x sends: `messages`, `model`, `max_tokens`, `stream`, `temperature` (the order of its
    // `chat.completions.create` body), then `ignore_eos`, which it can only send through `extra_body`, merged
    // after the named parameters.
    #[default]
    MessagesFirst,
    // What infergate's tools sent before: `model`, `messages`, `max_tokens`, `stream`, `ignore_eos`,
    // `temperature`.
    ModelFirst,
}

impl FieldOrder {
    pub fn name(self) -> &'static str {
        match self {
            FieldOrder::MessagesFirst => "messages-first",
            FieldOrder::ModelFirst => "model-first",
        }
    }
}

/// A `/v1/chat/completions` body, serialised in `field_order` without copying the conversation.
pub struct ChatBody<'a> {
    pub model: &'a str,
    pub messages: &'a [Msg],
    pub max_tokens: u64,
    pub stream: bool,
    /// Some OpenAI-compatible servers stop early on EOS; the benchmark wants exactly `max_tokens`.
    pub ignore_eos: bool,
    pub temperature: f64,
    /// Key order of the serialised body.
    pub field_order: FieldOrder,
}

impl Serialize for ChatBody<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut b = s.serialize_struct("ChatBody", 6)?;
        match self.field_order {
            FieldOrder::MessagesFirst => {
                b.serialize_field("messages", self.messages)?;
                b.serialize_field("model", self.model)?;
                b.serialize_field("max_tokens", &self.max_tokens)?;
                b.serialize_field("stream", &self.stream)?;
                b.serialize_field("temperature", &self.temperature)?;
                b.serialize_field("ignore_eos", &self.ignore_eos)?;
            }
            FieldOrder::ModelFirst => {
                b.serialize_field("model", self.model)?;
                b.serialize_field("messages", self.messages)?;
                b.serialize_field("max_tokens", &self.max_tokens)?;
                b.serialize_field("stream", &self.stream)?;
                b.serialize_field("ignore_eos", &self.ignore_eos)?;
                b.serialize_field("temperature", &self.temperature)?;
            }
        }
        b.end()
    }
}

impl ChatBody<'_> {
    pub fn to_vec(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("a chat body serialises")
    }
}

/// What happened to one request.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    /// HTTP status (0 when no response arrived).
    pub status: u16,
    /// Short error class when the request failed (`http_503`, `connect`, `timeout`, `truncated`, ...).
    pub error: Option<String>,
    pub headers_at: Option<Duration>,
    pub first_token_at: Option<Duration>,
    pub last_token_at: Option<Duration>,
    pub total: Duration,
    /// SSE `data:` chunks that carried a token (non-streaming: 0).
    pub chunks: u64,
    /// The assistant text received (appended to the conversation for the next turn).
    pub content: String,
    /// `usage.prompt_tokens` / `usage.prompt_tokens_details.cached_tokens` when the server sent them.
    pub usage_prompt_tokens: Option<u64>,
    pub usage_cached_tokens: Option<u64>,
    /// When the request was sent.
    pub sent_at: Option<Instant>,
    /// The serving endpoint, from infergate's `x-infergate-endpoint` response header.
    pub endpoint: Option<String>,
}

impl Outcome {
    pub fn ok(&self) -> bool {
        self.error.is_none()
    }

    /// (chunks - 1) / (last - first), when there are at least two chunks apart in time.
    pub fn decode_rate(&self) -> Option<f64> {
        let (f, l) = (self.first_token_at?, self.last_token_at?);
        let dt = l.checked_sub(f)?.as_secs_f64();
        (self.chunks >= 2 && dt > 0.0).then(|| (self.chunks - 1) as f64 / dt)
    }
}

/// The HTTP client every scenario uses: keep-alive pool, no proxy, no overall timeout (set per request).
pub fn http_client(pool_per_host: usize) -> reqwest::Client {
    reqwest::Client::builder()
        .pool_max_idle_per_host(pool_per_host)
        .pool_idle_timeout(Duration::from_secs(30))
        .tcp_nodelay(true)
        .connect_timeout(Duration::from_secs(5))
        .build()
        .expect("an HTTP client")
}

/// `base` + `/v1/chat/completions` (a base that already names the path is used as is).
pub fn chat_url(base: &str) -> String {
    let b = base.trim_end_matches('/');
    if b.ends_with("/chat/completions") {
        b.to_string()
    } else if b.ends_with("/v1") {
        format!("{b}/chat/completions")
    } else {
        format!("{b}/v1/chat/completions")
    }
}

fn classify(e: &reqwest::Error) -> String {
    if e.is_timeout() {
        "timeout".into()
    } else if e.is_connect() {
        "connect".into()
    } else if e.is_body() || e.is_decode() {
        "body".into()
    } else if e.is_request() {
        "request".into()
    } else {
        "transport".into()
    }
}

/// Finds the end of the first SSE event in `buf`: (event length, separator length).
fn event_end(buf: &[u8]) -> Option<(usize, usize)> {
    let mut i = 0;
    while i + 1 < buf.len() {
        if buf[i] == b'\n' {
            if buf[i + 1] == b'\n' {
                return Some((i, 2));
            }
            if buf[i + 1] == b'\r' && buf.get(i + 2) == Some(&b'\n') {
                return Some((i, 3));
            }
        }
        i += 1;
    }
    None
}

/// What one SSE event contributed.
#[derive(Debug, Default, PartialEq)]
struct EventInfo {
    tokens: u64,
    done: bool,
    error: bool,
}

/// Reads one SSE event: every `data:` line that carries a choice counts as one token chunk; `[DONE]` ends the
/// stream; a `usage` object and an `error` object are noted.
fn read_event(ev: &[u8], out: &mut Outcome) -> EventInfo {
    let mut info = EventInfo::default();
    for line in ev.split(|&b| b == b'\n') {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let Some(data) = line.strip_prefix(b"data:") else {
            continue;
        };
        let data = data.trim_ascii();
        if data == b"[DONE]" {
            info.done = true;
            continue;
        }
        let Ok(v) = serde_json::from_slice::<Value>(data) else {
            continue;
        };
        if v.get("error").is_some_and(|e| !e.is_null()) {
            info.error = true;
        }
        if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
            out.usage_prompt_tokens = u.get("prompt_tokens").and_then(Value::as_u64);
            out.usage_cached_tokens = u
                .pointer("/prompt_tokens_details/cached_tokens")
                .and_then(Value::as_u64);
        }
        if let Some(choice) = v.get("choices").and_then(|c| c.get(0)) {
            info.tokens += 1;
            let text = choice
                .pointer("/delta/content")
                .or_else(|| choice.get("text"))
                .and_then(Value::as_str);
            if let Some(t) = text {
                out.content.push_str(t);
            }
        }
    }
    info
}

/// One request to send.
pub struct Call<'a> {
    /// Full URL (see [`chat_url`]).
    pub url: &'a str,
    pub headers: &'a [(String, String)],
    pub body: Vec<u8>,
    /// Read the response as SSE (true) or as one JSON body.
    pub stream: bool,
    pub timeout: Duration,
}

/// Sends one chat request and reads the whole response; timings are measured from the send. `first_token`
/// fires at the first token chunk (for background streams).
pub async fn chat(
    client: &reqwest::Client,
    call: Call<'_>,
    live: &Live,
    first_token: Option<tokio::sync::oneshot::Sender<()>>,
) -> Outcome {
    live.sent.fetch_add(1, Ordering::Relaxed);
    let out = chat_inner(client, call, live, first_token).await;
    if out.ok() {
        live.ok.fetch_add(1, Ordering::Relaxed);
    } else {
        live.errors.fetch_add(1, Ordering::Relaxed);
    }
    out
}

async fn chat_inner(
    client: &reqwest::Client,
    call: Call<'_>,
    live: &Live,
    mut first_token: Option<tokio::sync::oneshot::Sender<()>>,
) -> Outcome {
    let Call {
        url,
        headers,
        body,
        stream,
        timeout,
    } = call;
    let mut out = Outcome::default();
    let mut req = client
        .post(url)
        .header("content-type", "application/json")
        .timeout(timeout)
        .body(body);
    for (k, v) in headers {
        req = req.header(k.as_str(), v.as_str());
    }
    let t0 = Instant::now();
    out.sent_at = Some(t0);
    let resp = match req.send().await {
        Ok(r) => r,
        Err(e) => {
            out.error = Some(classify(&e));
            out.total = t0.elapsed();
            return out;
        }
    };
    out.headers_at = Some(t0.elapsed());
    out.status = resp.status().as_u16();
    out.endpoint = resp
        .headers()
        .get("x-infergate-endpoint")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    if !resp.status().is_success() {
        // Drain (bounded by the request timeout) so the connection can be reused.
        let _ = resp.bytes().await;
        out.error = Some(format!("http_{}", out.status));
        out.total = t0.elapsed();
        return out;
    }
    if !stream {
        match resp.bytes().await {
            Ok(b) => {
                out.first_token_at = Some(t0.elapsed());
                out.last_token_at = out.first_token_at;
                match serde_json::from_slice::<Value>(&b) {
                    Ok(v) => {
                        if let Some(t) = v
                            .pointer("/choices/0/message/content")
                            .and_then(Value::as_str)
                        {
                            out.content = t.to_string();
                        }
                        if let Some(u) = v.get("usage") {
                            out.usage_prompt_tokens =
                                u.get("prompt_tokens").and_then(Value::as_u64);
                            out.usage_cached_tokens = u
                                .pointer("/prompt_tokens_details/cached_tokens")
                                .and_then(Value::as_u64);
                        }
                    }
                    Err(_) => out.error = Some("bad_json".into()),
                }
            }
            Err(e) => out.error = Some(classify(&e)),
        }
        out.total = t0.elapsed();
        return out;
    }

    let mut body = resp.bytes_stream();
    let mut buf: Vec<u8> = Vec::with_capacity(4096);
    let mut done = false;
    let mut server_error = false;
    while let Some(item) = body.next().await {
        let bytes = match item {
            Ok(b) => b,
            Err(e) => {
                out.error = Some(classify(&e));
                break;
            }
        };
        let now = t0.elapsed();
        buf.extend_from_slice(&bytes);
        let mut start = 0;
        while let Some((len, sep)) = event_end(&buf[start..]) {
            let info = read_event(&buf[start..start + len], &mut out);
            start += len + sep;
            if info.tokens > 0 {
                if out.first_token_at.is_none() {
                    out.first_token_at = Some(now);
                    if let Some(tx) = first_token.take() {
                        let _ = tx.send(());
                    }
                }
                out.last_token_at = Some(now);
                out.chunks += info.tokens;
                live.chunks.fetch_add(info.tokens, Ordering::Relaxed);
            }
            done |= info.done;
            server_error |= info.error;
        }
        buf.drain(..start);
    }
    if out.error.is_none() {
        // An unterminated last event (no blank line before EOF) still counts.
        if !buf.is_empty() {
            let info = read_event(&buf, &mut out);
            done |= info.done;
            server_error |= info.error;
        }
        if server_error {
            out.error = Some("stream_error".into());
        } else if !done {
            out.error = Some("truncated".into());
        }
    }
    out.total = t0.elapsed();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        assert_eq!(chat_url("http://h:1"), "http://h:1/v1/chat/completions");
        assert_eq!(chat_url("http://h:1/"), "http://h:1/v1/chat/completions");
        assert_eq!(chat_url("http://h:1/v1"), "http://h:1/v1/chat/completions");
        assert_eq!(
            chat_url("http://h:1/v1/chat/completions"),
            "http://h:1/v1/chat/completions"
        );
    }

    #[test]
    fn sse_events() {
        let mut o = Outcome::default();
        let buf = b"data: {\"choices\":[{\"delta\":{\"content\":\" hi\"}}]}\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"prompt_tokens_details\":{\"cached_tokens\":4}}}\r\n\r\ndata: [DONE]\n\n";
        let (l1, s1) = event_end(buf).unwrap();
        assert_eq!(
            read_event(&buf[..l1], &mut o),
            EventInfo {
                tokens: 1,
                done: false,
                error: false
            }
        );
        let rest = &buf[l1 + s1..];
        let (l2, s2) = event_end(rest).unwrap();
        assert_eq!(s2, 3);
        assert_eq!(read_event(&rest[..l2], &mut o).tokens, 0);
        let rest = &rest[l2 + s2..];
        assert!(read_event(rest, &mut o).done);
        assert_eq!(o.content, " hi");
        assert_eq!(
            (o.usage_prompt_tokens, o.usage_cached_tokens),
            (Some(9), Some(4))
        );
        assert!(event_end(b"data: {}\n").is_none());
    }

    #[test]
    fn chat_body_key_order() {
        let messages = [
            Msg {
                role: "system",
                content: "be brief".into(),
            },
            Msg {
                role: "user",
                content: "hello there".into(),
            },
        ];
        let body = |field_order| {
            ChatBody {
                model: "sim-model",
                messages: &messages,
                max_tokens: 7,
                stream: true,
                ignore_eos: true,
                temperature: 0.0,
                field_order,
            }
            .to_vec()
        };
        // Byte offset of each top-level key (none of them occurs inside the messages).
        let offsets = |b: &[u8], keys: &[&str]| -> Vec<usize> {
            let text = std::str::from_utf8(b).unwrap();
            keys.iter()
                .map(|k| {
                    let pat = format!("\"{k}\":");
                    assert_eq!(text.matches(&pat).count(), 1, "{k} in {text}");
                    text.find(&pat).unwrap()
                })
                .collect()
        };
        let increasing = |v: &[usize]| v.windows(2).all(|w| w[0] < w[1]);

        let first = body(FieldOrder::MessagesFirst);
        assert!(first.starts_with(b"{\"messages\":[{\"role\":\"system\""));
        let keys = [
            "messages",
            "model",
            "max_tokens",
            "stream",
            "temperature",
            "ignore_eos",
        ];
        assert!(
            increasing(&offsets(&first, &keys)),
            "{:?}",
            String::from_utf8_lossy(&first)
        );

        let old = body(FieldOrder::ModelFirst);
        assert!(old.starts_with(b"{\"model\":\"sim-model\",\"messages\":["));
        let keys = [
            "model",
            "messages",
            "max_tokens",
            "stream",
            "ignore_eos",
            "temperature",
        ];
        assert!(
            increasing(&offsets(&old, &keys)),
            "{:?}",
            String::from_utf8_lossy(&old)
        );

        // Same content, same length: only the order differs.
        assert_eq!(first.len(), old.len());
        let (a, b): (Value, Value) = (
            serde_json::from_slice(&first).unwrap(),
            serde_json::from_slice(&old).unwrap(),
        );
        assert_eq!(a, b);
        assert_eq!(FieldOrder::default(), FieldOrder::MessagesFirst);
    }

    #[test]
    fn decode_rate() {
        let o = Outcome {
            chunks: 11,
            first_token_at: Some(Duration::from_millis(100)),
            last_token_at: Some(Duration::from_millis(600)),
            ..Outcome::default()
        };
        assert!((o.decode_rate().unwrap() - 20.0).abs() < 1e-9);
        assert!(Outcome {
            chunks: 1,
            ..o.clone()
        }
        .decode_rate()
        .is_none());
    }
}
