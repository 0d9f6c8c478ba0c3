//! A client's requests to the router: chat bodies, and posting them the ways the tests need.

use futures_util::StreamExt;

/// The chat completions path.
pub const CHAT: &str = "/v1/chat/completions";
/// Anthropic's count_tokens path (answered by the engine, no generation).
pub const COUNT_TOKENS: &str = "/v1/messages/count_tokens";
/// The header `router::sessions_yaml` keys sessions by.
pub const SESSION_HEADER: &str = "x-session-id";

/// A response header's value, when it is text.
pub fn header(resp: &reqwest::Response, name: &str) -> Option<String> {
    resp.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

/// The endpoint that served `resp` (`x-infergate-endpoint`); None when the router answered itself.
pub fn served_by(resp: &reqwest::Response) -> Option<String> {
    header(resp, "x-infergate-endpoint")
}

/// The `Content-Length` an HTTP head declares (its lines up to the blank one); 0 when it declares none.
pub fn content_length(head: &str) -> usize {
    head.lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.eq_ignore_ascii_case("content-length")
                .then(|| v.trim().parse().ok())?
        })
        .unwrap_or(0)
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .pool_max_idle_per_host(64)
        .build()
        .expect("client")
}

/// A chat body of about `bytes` bytes (one user message), streaming or not.
pub fn chat_body(bytes: usize, stream: bool, max_tokens: u32) -> String {
    let filler = "lorem ipsum dolor sit amet ".repeat(bytes / 27 + 1);
    let content = &filler[..bytes.min(filler.len())];
    serde_json::json!({
        "model": "sim-model",
        "stream": stream,
        "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": content}],
    })
    .to_string()
}

/// The same bytes as a chunked upload (no Content-Length), `chunk` bytes a chunk.
pub fn chunked(text: &str, chunk: usize) -> reqwest::Body {
    let chunks: Vec<Result<bytes::Bytes, std::io::Error>> = text
        .as_bytes()
        .chunks(chunk)
        .map(|c| Ok(bytes::Bytes::copy_from_slice(c)))
        .collect();
    reqwest::Body::wrap_stream(futures_util::stream::iter(chunks))
}

/// A JSON POST from `c` to `path` of the router at `base` (its `url()`); add the body, headers, and send.
pub fn post_json(c: &reqwest::Client, base: &str, path: &str) -> reqwest::RequestBuilder {
    c.post(format!("{base}{path}"))
        .header("content-type", "application/json")
}

/// POST a chat request from a new client; the response once its headers are in (the body not read).
pub async fn send_chat(base: &str, body: impl Into<reqwest::Body>) -> reqwest::Response {
    post_json(&client(), base, CHAT)
        .body(body)
        .send()
        .await
        .expect("response headers")
}

/// Read a response to its end; the first error of its body, if any.
pub async fn drain(resp: reqwest::Response) -> Result<(), reqwest::Error> {
    let mut s = resp.bytes_stream();
    while let Some(chunk) = s.next().await {
        chunk?;
    }
    Ok(())
}

/// Drain a response, ignoring a body that breaks off; its status.
pub async fn finish(resp: reqwest::Response) -> u16 {
    let status = resp.status().as_u16();
    let _ = drain(resp).await;
    status
}

/// POST a chat request from a new client and drain the response; its status.
pub async fn post_chat(base: &str, body: impl Into<reqwest::Body>) -> u16 {
    finish(send_chat(base, body).await).await
}

/// `post_chat`, one turn of `session`.
pub async fn post_chat_in_session(
    base: &str,
    session: &str,
    body: impl Into<reqwest::Body>,
) -> u16 {
    let resp = post_json(&client(), base, CHAT)
        .header(SESSION_HEADER, session)
        .body(body)
        .send()
        .await
        .expect("response");
    finish(resp).await
}

/// `post_chat`, and every chunk of the response body must arrive.
pub async fn post_chat_intact(base: &str, body: impl Into<reqwest::Body>) -> u16 {
    let resp = send_chat(base, body).await;
    let status = resp.status().as_u16();
    drain(resp).await.expect("body chunk");
    status
}

/// GET `path` of the router at `base` as JSON.
pub async fn get_json(base: &str, path: &str) -> serde_json::Value {
    client()
        .get(format!("{base}{path}"))
        .send()
        .await
        .expect("response")
        .json()
        .await
        .expect("a JSON body")
}

/// Read what the router sends on a raw connection until `done(bytes so far)` holds, it closes, a read fails or
/// `limit` passes; the bytes that arrived.
pub async fn read_raw_until(
    s: &mut tokio::net::TcpStream,
    limit: std::time::Duration,
    done: impl Fn(&[u8]) -> bool,
) -> Vec<u8> {
    use tokio::io::AsyncReadExt;
    let mut got = Vec::new();
    let _ = tokio::time::timeout(limit, async {
        let mut b = [0u8; 8192];
        while let Ok(n) = s.read(&mut b).await {
            if n == 0 {
                break;
            }
            got.extend_from_slice(&b[..n]);
            if done(&got) {
                break;
            }
        }
    })
    .await;
    got
}
