//! Wire-level tests of the simulated vLLM engine (`infergate::sim`) over real loopback sockets.

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use infergate_sim::{fnv64, spawn_engine, spawn_engine_blocking, EngineHandle, SimConfig};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn scaled(time_scale: f64) -> SimConfig {
    SimConfig {
        time_scale,
        ..SimConfig::default()
    }
}

/// `n` distinct words, one token each by the simulator's rule.
fn words(n: usize, salt: &str) -> String {
    let mut s = String::with_capacity(n * 8);
    for i in 0..n {
        s.push_str(salt);
        s.push_str(&i.to_string());
        s.push(' ');
    }
    s
}

fn chat(content: &str, max_tokens: usize, stream: bool) -> Value {
    json!({"model": "sim-model", "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
           "stream": stream})
}

async fn wait_until(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < timeout, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Sums every sample of `name` in a Prometheus text body.
fn metric_sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| {
            l.starts_with(name) && matches!(l.as_bytes().get(name.len()), Some(b'{') | Some(b' '))
        })
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
        .sum()
}

/// POSTs `body` as JSON to `path` on engine `e`; the answer's JSON.
async fn post_value(c: &reqwest::Client, e: &EngineHandle, path: &str, body: &Value) -> Value {
    c.post(format!("{}{path}", e.url()))
        .json(body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap()
}

/// The `event:` names of an SSE body, in order.
fn event_names(text: &str) -> Vec<&str> {
    text.lines()
        .filter_map(|l| l.strip_prefix("event: "))
        .collect()
}

/// The whole answer's text to a JSON POST of `body` to `path` on `e`.
async fn post_text(e: &EngineHandle, path: &str, body: &Value) -> String {
    reqwest::Client::new()
        .post(format!("{}{path}", e.url()))
        .json(body)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

async fn metrics(e: &EngineHandle) -> String {
    reqwest::get(format!("{}/metrics", e.url()))
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

async fn fill(s: &mut TcpStream, rest: &mut Vec<u8>, need: usize) -> std::io::Result<()> {
    while rest.len() < need {
        let mut tmp = [0u8; 65536];
        let n = s.read(&mut tmp).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        rest.extend_from_slice(&tmp[..n]);
    }
    Ok(())
}

/// Minimal HTTP/1.1 response reader for raw-socket tests: (status, lower-case headers, de-chunked body).
async fn read_response(
    s: &mut TcpStream,
) -> std::io::Result<(u16, Vec<(String, String)>, Vec<u8>)> {
    let mut buf = Vec::new();
    let head_end = loop {
        if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break p;
        }
        let mut tmp = [0u8; 4096];
        let n = s.read(&mut tmp).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        buf.extend_from_slice(&tmp[..n]);
    };
    let head = String::from_utf8(buf[..head_end].to_vec()).unwrap();
    let mut rest = buf[head_end + 4..].to_vec();
    let mut lines = head.split("\r\n");
    let status: u16 = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers: Vec<(String, String)> = lines
        .map(|l| {
            let (n, v) = l.split_once(':').unwrap();
            (n.to_ascii_lowercase(), v.trim().to_string())
        })
        .collect();
    let get = |n: &str| headers.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone());
    let body = if let Some(cl) = get("content-length") {
        let cl: usize = cl.parse().unwrap();
        fill(s, &mut rest, cl).await?;
        rest.truncate(cl);
        rest
    } else if get("transfer-encoding").as_deref() == Some("chunked") {
        let mut body = Vec::new();
        loop {
            let line_end = loop {
                if let Some(p) = rest.windows(2).position(|w| w == b"\r\n") {
                    break p;
                }
                let need = rest.len() + 1;
                fill(s, &mut rest, need).await?;
            };
            let size =
                usize::from_str_radix(std::str::from_utf8(&rest[..line_end]).unwrap(), 16).unwrap();
            rest.drain(..line_end + 2);
            fill(s, &mut rest, size + 2).await?;
            body.extend_from_slice(&rest[..size]);
            rest.drain(..size + 2);
            if size == 0 {
                break;
            }
        }
        body
    } else {
        Vec::new()
    };
    Ok((status, headers, body))
}

#[tokio::test(flavor = "multi_thread")]
async fn headers_come_first_and_first_byte_waits_for_prefill() {
    let e = spawn_engine(scaled(0.25)).await.unwrap();
    let client = reqwest::Client::new();
    let mut gaps = Vec::new();
    for (n, salt) in [(100, "s"), (40_000, "l")] {
        let t0 = Instant::now();
        let mut resp = client
            .post(format!("{}/v1/chat/completions", e.url()))
            .json(&chat(&words(n, salt), 2, true))
            .send()
            .await
            .unwrap();
        let headers_at = t0.elapsed();
        assert_eq!(resp.status(), 200);
        assert!(resp.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream"));
        let first = resp.chunk().await.unwrap().expect("a first chunk");
        let first_at = t0.elapsed();
        assert!(
            first.starts_with(b"data: {"),
            "{:?}",
            String::from_utf8_lossy(&first)
        );
        while resp.chunk().await.unwrap().is_some() {}
        gaps.push((headers_at, first_at - headers_at));
    }
    let (small_headers, small_gap) = gaps[0];
    let (large_headers, large_gap) = gaps[1];
    // 40k tokens: 5 steps x 18 ms + 40k / 44k s = ~1.0 s, scaled by 0.25.
    assert!(
        large_gap >= Duration::from_millis(150),
        "large prompt gap {large_gap:?}"
    );
    assert!(
        large_gap > small_gap + Duration::from_millis(100),
        "small {small_gap:?} vs large {large_gap:?}"
    );
    assert!(
        large_headers < large_gap,
        "headers after {large_headers:?}, body after another {large_gap:?}"
    );
    assert!(small_headers < Duration::from_millis(500));
}

#[tokio::test(flavor = "multi_thread")]
async fn responses_api_announces_the_response_before_prefill_as_vllm_does() {
    let e = spawn_engine(scaled(0.25)).await.unwrap();
    let c = reqwest::Client::new();
    // `input` as items (a message with input_text parts, a tool output), `instructions` after it, as the openai
    // SDK sends them.
    let body = json!({"input": [{"role": "user", "content": [{"type": "input_text", "text": words(40_000, "r")}]},
                                {"type": "function_call_output", "call_id": "c1", "output": "42"}],
                      "instructions": "be brief", "max_output_tokens": 3, "model": "m", "stream": true});
    let t0 = Instant::now();
    let mut resp = c
        .post(format!("{}/v1/responses", e.url()))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let mut text = String::new();
    let mut first_output_at = None;
    let mut preamble_at = None;
    while let Some(chunk) = resp.chunk().await.unwrap() {
        text.push_str(&String::from_utf8_lossy(&chunk));
        if preamble_at.is_none() && text.contains("event: response.in_progress") {
            preamble_at = Some(t0.elapsed());
        }
        if first_output_at.is_none() && text.contains("event: response.output_item.added") {
            first_output_at = Some(t0.elapsed());
        }
    }
    let names = event_names(&text);
    assert_eq!(
        names,
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.delta",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed"
        ]
    );
    // 40k tokens of prefill (~0.25 s scaled) lie between the announcement and the first output.
    let (preamble_at, first_output_at) = (preamble_at.unwrap(), first_output_at.unwrap());
    assert!(
        first_output_at > preamble_at + Duration::from_millis(150),
        "announced at {preamble_at:?}, first output at {first_output_at:?}"
    );
    let completed: Value = serde_json::from_str(
        text.lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .next_back()
            .unwrap_or("{}"),
    )
    .unwrap();
    assert_eq!(completed["sequence_number"], 10);
    assert_eq!(completed["response"]["usage"]["output_tokens"], 3);
    assert!(
        completed["response"]["usage"]["input_tokens"]
            .as_u64()
            .unwrap()
            > 30_000
    );

    // Without streaming: one response object; input as a string.
    let v = post_value(
        &c,
        &e,
        "/v1/responses",
        &json!({"input": "hi", "max_output_tokens": 2, "model": "m"}),
    )
    .await;
    assert_eq!(
        (v["object"].as_str(), v["status"].as_str()),
        (Some("response"), Some("incomplete"))
    );
    assert_eq!(v["output"][0]["content"][0]["type"], "output_text");
    assert_eq!(v["usage"]["output_tokens"], 2);
    let r = c
        .post(format!("{}/v1/responses", e.url()))
        .json(&json!({"model": "m"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
}

#[tokio::test(flavor = "multi_thread")]
async fn with_stop_after_answers_end_on_their_own_in_every_api() {
    let e = spawn_engine(SimConfig {
        stop_after: Some(3),
        ..scaled(0.1)
    })
    .await
    .unwrap();
    let c = reqwest::Client::new();
    let v = post_value(&c, &e, "/v1/chat/completions", &chat("hi", 32_000, false)).await;
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    assert_eq!(v["usage"]["completion_tokens"], 3);
    let messages = json!({"model": "m", "max_tokens": 32_000, "messages": [{"role": "user", "content": "hi"}]});
    let v = post_value(&c, &e, "/v1/messages", &messages).await;
    assert_eq!(
        (
            v["stop_reason"].as_str(),
            v["usage"]["output_tokens"].as_u64()
        ),
        (Some("end_turn"), Some(3))
    );
    let v = post_value(
        &c,
        &e,
        "/v1/responses",
        &json!({"input": "hi", "model": "m"}),
    )
    .await;
    assert_eq!(v["status"], "completed");
    assert_eq!(v["incomplete_details"], Value::Null);
    // A request asking for fewer tokens still stops at its limit.
    let v = post_value(&c, &e, "/v1/chat/completions", &chat("hi", 2, false)).await;
    assert_eq!(v["choices"][0]["finish_reason"], "length");
}

#[tokio::test(flavor = "multi_thread")]
async fn streaming_sends_one_event_per_token_as_it_is_decoded() {
    let e = spawn_engine(scaled(1.0)).await.unwrap();
    let resp = reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", e.url()))
        .json(&chat("hello there", 6, true))
        .send()
        .await
        .unwrap();
    let mut frames = Vec::new();
    let mut stream = resp.bytes_stream();
    while let Some(b) = stream.next().await {
        frames.push((Instant::now(), b.unwrap()));
    }
    let all: Vec<u8> = frames.iter().flat_map(|(_, b)| b.to_vec()).collect();
    let text = String::from_utf8(all).unwrap();
    assert!(text.ends_with("data: [DONE]\n\n"));
    let events: Vec<&str> = text.split("\n\n").filter(|s| !s.is_empty()).collect();
    assert_eq!(events.len(), 7, "{text}");
    let mut content = String::new();
    for (i, ev) in events[..6].iter().enumerate() {
        let v: Value = serde_json::from_str(ev.strip_prefix("data: ").unwrap()).unwrap();
        assert_eq!(v["object"], "chat.completion.chunk");
        content.push_str(v["choices"][0]["delta"]["content"].as_str().unwrap());
        if i == 0 {
            assert_eq!(v["choices"][0]["delta"]["role"], "assistant");
        }
        if i == 5 {
            assert_eq!(v["choices"][0]["finish_reason"], "length");
            assert_eq!(v["usage"]["completion_tokens"], 6);
            assert!(v["usage"]["prompt_tokens"].as_u64().unwrap() > 0);
            assert_eq!(v["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
        } else {
            assert!(v["choices"][0]["finish_reason"].is_null());
        }
    }
    assert!(!content.is_empty());
    // Tokens are decoded one step (~18 ms) apart, each written on its own: the first five arrive as separate
    // frames, spaced in time.
    assert!(frames.len() >= 6, "{} frames", frames.len());
    for w in frames[..5].windows(2) {
        assert_eq!(w[0].1.windows(6).filter(|x| x == b"data: ").count(), 1);
        assert!(
            w[1].0 - w[0].0 >= Duration::from_millis(8),
            "frames {:?} apart",
            w[1].0 - w[0].0
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn non_streaming_answers_json_with_usage() {
    let e = spawn_engine(scaled(0.1)).await.unwrap();
    let c = reqwest::Client::new();
    let r = c
        .post(format!("{}/v1/chat/completions", e.url()))
        .json(&chat("hi", 4, false))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "application/json");
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["model"], "sim-model");
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    assert!(!v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap()
        .is_empty());
    assert_eq!(v["usage"]["completion_tokens"], 4);

    let r = c
        .post(format!("{}/v1/completions", e.url()))
        .json(&json!({"model": "other", "prompt": "one two three", "max_completion_tokens": 2}))
        .send()
        .await
        .unwrap();
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["object"], "text_completion");
    assert_eq!(v["model"], "other");
    assert_eq!(v["usage"]["prompt_tokens"], 3);
    assert_eq!(v["usage"]["completion_tokens"], 2);
    assert_eq!(v["usage"]["total_tokens"], 5);

    // Default max_tokens.
    let v = post_value(&c, &e, "/v1/completions", &json!({"prompt": "x"})).await;
    assert_eq!(v["usage"]["completion_tokens"], 16);

    // Anthropic messages, both ways.
    let body = json!({"model": "m", "system": "be brief", "max_tokens": 3,
                      "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]});
    let v = post_value(&c, &e, "/v1/messages", &body).await;
    assert_eq!(v["type"], "message");
    assert_eq!(v["content"][0]["type"], "text");
    assert_eq!(v["usage"]["output_tokens"], 3);
    let mut sbody = body.clone();
    sbody["stream"] = json!(true);
    let text = post_text(&e, "/v1/messages", &sbody).await;
    let names = event_names(&text);
    assert_eq!(
        names,
        [
            "message_start",
            "content_block_start",
            "content_block_delta",
            "content_block_delta",
            "content_block_delta",
            "content_block_stop",
            "message_delta",
            "message_stop"
        ]
    );

    // Errors: invalid JSON, bad max_tokens, unknown path, wrong method.
    let r = c
        .post(format!("{}/v1/chat/completions", e.url()))
        .header("content-type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["type"], "invalid_request_error");
    assert_eq!(v["error"]["code"], 400);
    let r = c
        .post(format!("{}/v1/chat/completions", e.url()))
        .json(&chat("x", 0, false))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let r = c.get(format!("{}/nope", e.url())).send().await.unwrap();
    assert_eq!(r.status(), 404);
    assert!(r.json::<Value>().await.unwrap()["error"]["message"].is_string());
    let r = c
        .get(format!("{}/v1/chat/completions", e.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 405);

    let models: Value = c
        .get(format!("{}/v1/models", e.url()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(models["object"], "list");
    assert_eq!(models["data"][0]["id"], "sim-model");
    assert_eq!(models["data"][0]["owned_by"], "engine-sim");
    let st = e.stats();
    assert_eq!(st.requests, 5);
    assert_eq!(st.finished, 5);
    assert_eq!(st.rejected, 2);
}

#[tokio::test(flavor = "multi_thread")]
async fn big_bodies_with_content_length_and_chunked() {
    let e = spawn_engine(scaled(0.002)).await.unwrap();
    let c = reqwest::Client::new();
    let prompt = words(560_000, "w"); // ~4.3 MiB
    let body = serde_json::to_vec(&json!({"prompt": prompt, "max_tokens": 1})).unwrap();
    assert!(body.len() >= 4 << 20);
    let r = c
        .post(format!("{}/v1/completions", e.url()))
        .header("content-type", "application/json")
        .body(body.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["usage"]["prompt_tokens"], 560_000);

    // The same body as a chunked stream of 64 KiB pieces.
    let pieces: Vec<Result<Vec<u8>, std::io::Error>> =
        body.chunks(64 * 1024).map(|c| Ok(c.to_vec())).collect();
    let r = c
        .post(format!("{}/v1/completions", e.url()))
        .header("content-type", "application/json")
        .body(reqwest::Body::wrap_stream(futures_util::stream::iter(
            pieces,
        )))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let reqs = e.requests();
    assert_eq!(reqs.len(), 2);
    assert_eq!(
        reqs[0].header("content-length").unwrap(),
        body.len().to_string()
    );
    assert_eq!(reqs[1].header("transfer-encoding"), Some("chunked"));
    for r in &reqs {
        assert_eq!(r.method, "POST");
        assert_eq!(r.path, "/v1/completions");
        assert_eq!(r.body_len, body.len());
        assert_eq!(r.body_fnv64, fnv64(&body));
    }
    // The second prefill hit the cache for all but the last (partial) block.
    assert!(e.stats().cached_prompt_tokens >= 559_000);
}

#[tokio::test(flavor = "multi_thread")]
async fn raw_chunked_body_with_expect_continue_and_pipelining() {
    let e = spawn_engine(scaled(0.1)).await.unwrap();
    let mut s = TcpStream::connect(e.addr).await.unwrap();
    let body = serde_json::to_vec(&chat("raw chunked request", 2, false)).unwrap();
    let head =
        "POST /v1/chat/completions?x=1 HTTP/1.1\r\nhost: sim\r\ncontent-type: application/json\r\n\
                transfer-encoding: chunked\r\nexpect: 100-continue\r\n\r\n";
    s.write_all(head.as_bytes()).await.unwrap();
    let mut cont = [0u8; 25];
    s.read_exact(&mut cont).await.unwrap();
    assert_eq!(&cont, b"HTTP/1.1 100 Continue\r\n\r\n");
    let (a, b) = body.split_at(10);
    s.write_all(format!("{:x};ext=1\r\n", a.len()).as_bytes())
        .await
        .unwrap();
    s.write_all(a).await.unwrap();
    s.write_all(format!("\r\n{:X}\r\n", b.len()).as_bytes())
        .await
        .unwrap();
    s.write_all(b).await.unwrap();
    s.write_all(b"\r\n0\r\ntrailer: x\r\n\r\n").await.unwrap();
    let (status, _, resp) = read_response(&mut s).await.unwrap();
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&resp));
    let v: Value = serde_json::from_slice(&resp).unwrap();
    assert_eq!(v["usage"]["completion_tokens"], 2);
    let rec = e.requests();
    assert_eq!(rec[0].path, "/v1/chat/completions");
    assert_eq!(rec[0].body_fnv64, fnv64(&body));

    // Two pipelined requests on the same keep-alive connection; the second asks to close.
    s.write_all(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\nGET /v1/models HTTP/1.1\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut rest = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut rest))
        .await
        .unwrap()
        .unwrap();
    let text = String::from_utf8(rest).unwrap();
    assert_eq!(text.matches("HTTP/1.1 200 OK\r\n").count(), 2, "{text}");
    assert!(text.contains("connection: close\r\n"));
    assert!(text.ends_with("}") && text.contains("sim-model"));
    assert_eq!(e.requests().len(), 3);
}

#[tokio::test(flavor = "multi_thread")]
async fn count_tokens_and_tokenize_answer_at_once_while_busy() {
    let e = spawn_engine(scaled(0.5)).await.unwrap();
    let c = reqwest::Client::new();
    // Keep the engine busy with a long prefill (~60k tokens: ~1.5 s, scaled to ~0.75 s).
    let busy = c
        .post(format!("{}/v1/chat/completions", e.url()))
        .json(&chat(&words(60_000, "b"), 1, true))
        .send();
    let busy = tokio::spawn(busy);
    wait_until("the long prefill to start", Duration::from_secs(5), || {
        e.stats().running == 1
    })
    .await;
    let t0 = Instant::now();
    let v = post_value(
        &c,
        &e,
        "/v1/messages/count_tokens",
        &json!({"model": "m", "messages": [{"role": "user", "content": "one two three"}]}),
    )
    .await;
    assert!(
        t0.elapsed() < Duration::from_millis(300),
        "count_tokens took {:?}",
        t0.elapsed()
    );
    let n = v["input_tokens"].as_u64().unwrap();
    assert!(n >= 3, "{v}");
    let v = post_value(&c, &e, "/tokenize", &json!({"prompt": "hello, world"})).await;
    assert_eq!(v["count"], 3);
    assert_eq!(v["tokens"].as_array().unwrap().len(), 3);
    assert!(v["max_model_len"].as_u64().unwrap() > 0);
    // count_tokens is not scheduled.
    assert_eq!(e.stats().requests, 1);
    drop(busy);
}

#[tokio::test(flavor = "multi_thread")]
async fn metrics_carry_vllm_names_split_over_engine_labels() {
    let cfg = SimConfig {
        engine_label_count: 3,
        ..scaled(0.1)
    };
    let e = spawn_engine(cfg).await.unwrap();
    let c = reqwest::Client::new();
    let p = words(500, "m");
    for _ in 0..2 {
        let r = c
            .post(format!("{}/v1/chat/completions", e.url()))
            .json(&chat(&p, 3, false))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    e.control.set_extra_waiting(7);
    e.control.set_extra_running(2);
    let r = c.get(format!("{}/metrics", e.url())).send().await.unwrap();
    assert!(r.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/plain"));
    let text = r.text().await.unwrap();
    for (name, kind) in [
        ("vllm:num_requests_running", "gauge"),
        ("vllm:num_requests_waiting", "gauge"),
        ("vllm:kv_cache_usage_perc", "gauge"),
        ("vllm:prompt_tokens_total", "counter"),
        ("vllm:generation_tokens_total", "counter"),
        ("vllm:prompt_tokens_by_source_total", "counter"),
        ("vllm:prefix_cache_queries_total", "counter"),
        ("vllm:prefix_cache_hits_total", "counter"),
        ("vllm:request_success_total", "counter"),
    ] {
        assert!(text.contains(&format!("# TYPE {name} {kind}\n")), "{name}");
        assert!(text.contains(&format!("# HELP {name} ")), "{name}");
        for i in 0..3 {
            assert!(
                text.contains(&format!("{name}{{engine=\"{i}\",model_name=\"sim-model\"")),
                "{name} engine {i}"
            );
        }
    }
    let st = e.stats();
    assert_eq!(metric_sum(&text, "vllm:num_requests_waiting"), 7.0);
    assert_eq!(metric_sum(&text, "vllm:num_requests_running"), 2.0);
    assert_eq!(
        metric_sum(&text, "vllm:prompt_tokens_total"),
        st.prompt_tokens as f64
    );
    assert_eq!(metric_sum(&text, "vllm:generation_tokens_total"), 6.0);
    assert_eq!(metric_sum(&text, "vllm:request_success_total"), 2.0);
    assert_eq!(
        metric_sum(&text, "vllm:prefix_cache_hits_total"),
        st.prefix_cache_hits as f64
    );
    let hit: f64 = text
        .lines()
        .filter(|l| {
            l.starts_with("vllm:prompt_tokens_by_source_total") && l.contains("local_cache_hit")
        })
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
        .sum();
    assert_eq!(hit, st.cached_prompt_tokens as f64);
    assert!(hit > 0.0);

    // A mis-prefixed engine.
    let bad = spawn_engine(SimConfig {
        metric_prefix: "vllm_".into(),
        ..scaled(0.1)
    })
    .await
    .unwrap();
    let text = metrics(&bad).await;
    assert!(text.contains("vllm_num_requests_running{engine=\"0\",model_name=\"sim-model\"} 0.0"));
    assert!(!text.contains("vllm:"));
}

#[tokio::test(flavor = "multi_thread")]
async fn refuse_connections_refuses_then_serves_again_on_the_same_port() {
    let e = spawn_engine(scaled(0.1)).await.unwrap();
    let addr = e.addr;
    // An established keep-alive connection survives the listener closing. Wait until the engine has accepted
    // it: a connection still in the kernel's accept queue is reset when the listener closes.
    let mut kept = TcpStream::connect(addr).await.unwrap();
    wait_until(
        "the connection to be accepted",
        Duration::from_secs(5),
        || e.control.open_connections() == 1,
    )
    .await;
    e.control.refuse_connections(true).unwrap();
    assert!(e.control.is_refusing());
    let err = TcpStream::connect(addr).await.unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionRefused);
    kept.write_all(b"GET /health HTTP/1.1\r\n\r\n")
        .await
        .unwrap();
    assert_eq!(read_response(&mut kept).await.unwrap().0, 200);

    e.control.refuse_connections(false).unwrap();
    let r = reqwest::get(format!("{}/health", e.url())).await.unwrap();
    assert_eq!(r.status(), 200);
    // Toggling twice in a row is harmless.
    e.control.refuse_connections(false).unwrap();
    e.control.refuse_connections(true).unwrap();
    e.control.refuse_connections(true).unwrap();
    assert!(TcpStream::connect(addr).await.is_err());
    e.control.refuse_connections(false).unwrap();
    assert!(TcpStream::connect(addr).await.is_ok());

    // Scripts do the same through /sim/control: refuse for a while, then listen again by themselves.
    let r = reqwest::Client::new()
        .post(format!("{}/sim/control", e.url()))
        .json(&json!({"refuse_connections_ms": 300}))
        .send()
        .await
        .unwrap();
    assert_eq!(
        r.json::<Value>().await.unwrap()["refusing_connections"],
        true
    );
    assert!(TcpStream::connect(addr).await.is_err());
    wait_until("listening again", Duration::from_secs(3), || {
        !e.control.is_refusing()
    })
    .await;
    assert!(TcpStream::connect(addr).await.is_ok());
}

#[tokio::test(flavor = "multi_thread")]
async fn keep_alive_timeout_closes_idle_connections() {
    let cfg = SimConfig {
        keep_alive_timeout: Some(Duration::from_millis(100)),
        ..scaled(0.1)
    };
    let e = spawn_engine(cfg).await.unwrap();
    let mut s = TcpStream::connect(e.addr).await.unwrap();
    s.write_all(b"GET /health HTTP/1.1\r\n\r\n").await.unwrap();
    assert_eq!(read_response(&mut s).await.unwrap().0, 200);
    let t0 = Instant::now();
    let mut b = [0u8; 8];
    let n = tokio::time::timeout(Duration::from_secs(2), s.read(&mut b))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(n, 0);
    assert!(
        t0.elapsed() >= Duration::from_millis(80),
        "closed after {:?}",
        t0.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn fail_status_health_status_and_slow_headers() {
    let e = spawn_engine(scaled(0.1)).await.unwrap();
    let c = reqwest::Client::new();
    let url = format!("{}/v1/chat/completions", e.url());
    e.control.set_fail_status(Some(503));
    let r = c.post(&url).json(&chat("x", 1, true)).send().await.unwrap();
    assert_eq!(r.status(), 503);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], 503);
    assert!(v["error"]["message"].is_string());
    // Health is separate.
    assert_eq!(
        c.get(format!("{}/health", e.url()))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    e.control.set_health_status(500);
    assert_eq!(
        c.get(format!("{}/health", e.url()))
            .send()
            .await
            .unwrap()
            .status(),
        500
    );
    e.control.set_fail_status(None);
    assert_eq!(
        c.post(&url)
            .json(&chat("x", 1, false))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );

    // The same through /sim/control (what scripts use on a child process).
    let ctl = format!("{}/sim/control", e.url());
    let v: Value = c
        .post(&ctl)
        .json(&json!({"fail_status": 429, "health_status": 200}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["fail_status"], 429);
    assert_eq!(
        c.post(&url)
            .json(&chat("x", 1, false))
            .send()
            .await
            .unwrap()
            .status(),
        429
    );
    assert_eq!(
        c.get(format!("{}/health", e.url()))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    c.post(&ctl)
        .json(&json!({"fail_status": null, "slow_headers_ms": 300}))
        .send()
        .await
        .unwrap();
    assert_eq!(e.control.fail_status(), None);
    let t0 = Instant::now();
    let r = c.post(&url).json(&chat("x", 1, true)).send().await.unwrap();
    assert!(
        t0.elapsed() >= Duration::from_millis(280),
        "headers after {:?}",
        t0.elapsed()
    );
    assert_eq!(r.status(), 200);
    r.text().await.unwrap();
    assert_eq!(
        c.post(&ctl)
            .json(&json!({"bogus": 1}))
            .send()
            .await
            .unwrap()
            .status(),
        400
    );
    c.post(&ctl)
        .json(&json!({"reset": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(e.control.slow_headers(), Duration::ZERO);
}

#[tokio::test(flavor = "multi_thread")]
async fn close_mid_stream_cuts_the_connection_and_aborts() {
    let e = spawn_engine(scaled(0.2)).await.unwrap();
    e.control.set_close_mid_stream_after(Some(2));
    let resp = reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", e.url()))
        .json(&chat("cut me", 10, true))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let mut stream = resp.bytes_stream();
    let mut got = Vec::new();
    let mut failed = false;
    while let Some(b) = stream.next().await {
        match b {
            Ok(b) => got.extend_from_slice(&b),
            Err(_) => {
                failed = true;
                break;
            }
        }
    }
    assert!(
        failed,
        "the stream ended cleanly: {}",
        String::from_utf8_lossy(&got)
    );
    let text = String::from_utf8(got).unwrap();
    assert_eq!(text.matches("data: ").count(), 2, "{text}");
    assert!(!text.contains("[DONE]"));
    wait_until("the abort", Duration::from_secs(3), || {
        e.stats().aborted == 1 && e.stats().running == 0
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn repeated_prompt_hits_the_prefix_cache() {
    let e = spawn_engine(scaled(0.1)).await.unwrap();
    let c = reqwest::Client::new();
    let p = words(3_000, "c");
    c.post(format!("{}/v1/chat/completions", e.url()))
        .json(&chat(&p, 1, false))
        .send()
        .await
        .unwrap();
    let first = e.stats();
    assert_eq!(first.cached_prompt_tokens, 0);
    assert_eq!(first.computed_prompt_tokens, first.prompt_tokens);
    let v = post_value(&c, &e, "/v1/chat/completions", &chat(&p, 1, false)).await;
    let second = e.stats();
    let prompt = first.prompt_tokens;
    let cached = second.cached_prompt_tokens;
    assert!(
        cached >= prompt - 16 && cached < prompt,
        "prompt {prompt}, cached {cached}"
    );
    assert_eq!(
        second.computed_prompt_tokens - first.computed_prompt_tokens,
        prompt - cached
    );
    assert_eq!(v["usage"]["prompt_tokens_details"]["cached_tokens"], cached);
    assert_eq!(second.prefix_cache_hits, cached);
    assert_eq!(second.prefix_cache_queries, 2 * prompt);
    // A conversation's next turn reuses the previous turn's blocks.
    let turn2 = json!({"messages": [{"role": "user", "content": p}, {"role": "assistant", "content": "ok"},
                                    {"role": "user", "content": "and then?"}], "max_tokens": 1});
    let v = post_value(&c, &e, "/v1/chat/completions", &turn2).await;
    assert!(
        v["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap()
            >= prompt - 32
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn requests_beyond_max_num_seqs_wait() {
    let e = spawn_engine(SimConfig {
        max_num_seqs: 2,
        ..scaled(0.1)
    })
    .await
    .unwrap();
    let c = reqwest::Client::new();
    let mut tasks = Vec::new();
    for i in 0..5 {
        let req = c
            .post(format!("{}/v1/chat/completions", e.url()))
            .json(&chat(&format!("q{i}"), 400, true));
        tasks.push(tokio::spawn(async move {
            let r = req.send().await.unwrap();
            let mut s = r.bytes_stream();
            while s.next().await.is_some() {}
        }));
    }
    let start = Instant::now();
    loop {
        let text = metrics(&e).await;
        let (run, wait) = (
            metric_sum(&text, "vllm:num_requests_running"),
            metric_sum(&text, "vllm:num_requests_waiting"),
        );
        if (run, wait) == (2.0, 3.0) {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(3),
            "running {run} waiting {wait}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let st = e.stats();
    assert_eq!((st.running, st.waiting), (2, 3));
    assert!(st.kv_cache_usage > 0.0);
    // Clients going away free their slots.
    for t in &tasks {
        t.abort();
    }
    wait_until("aborts", Duration::from_secs(3), || {
        let s = e.stats();
        s.running == 0 && s.waiting == 0 && s.aborted == 5
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn client_disconnect_during_prefill_aborts() {
    let e = spawn_engine(scaled(0.5)).await.unwrap();
    let resp = reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", e.url()))
        .json(&chat(&words(60_000, "d"), 5, true))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let s = e.stats();
    assert_eq!(s.running + s.waiting, 1);
    drop(resp);
    wait_until("the abort", Duration::from_secs(2), || {
        let s = e.stats();
        s.aborted == 1 && s.running == 0
    })
    .await;
    let s = e.stats();
    assert_eq!(s.prompt_tokens, 0, "the prefill never completed");
    assert_eq!(s.generation_tokens, 0);
}

#[tokio::test(flavor = "multi_thread")]
async fn idle_connections_can_be_dropped_or_poisoned() {
    let e = spawn_engine(scaled(0.1)).await.unwrap();
    // drop: the idle connection gets a FIN right away.
    let mut s = TcpStream::connect(e.addr).await.unwrap();
    s.write_all(b"GET /health HTTP/1.1\r\n\r\n").await.unwrap();
    assert_eq!(read_response(&mut s).await.unwrap().0, 200);
    assert_eq!(e.control.drop_idle_connections(), 1);
    let mut b = [0u8; 16];
    let n = tokio::time::timeout(Duration::from_secs(1), s.read(&mut b))
        .await
        .unwrap();
    assert!(matches!(n, Ok(0) | Err(_)), "{n:?}");
    wait_until("the registry to empty", Duration::from_secs(1), || {
        e.control.open_connections() == 0
    })
    .await;

    // poison: the connection stays open, the next request on it is reset without an answer.
    let mut s = TcpStream::connect(e.addr).await.unwrap();
    s.write_all(b"GET /health HTTP/1.1\r\n\r\n").await.unwrap();
    assert_eq!(read_response(&mut s).await.unwrap().0, 200);
    assert_eq!(e.control.poison_idle_connections(), 1);
    tokio::time::sleep(Duration::from_millis(20)).await;
    s.write_all(b"GET /health HTTP/1.1\r\n\r\n").await.unwrap();
    let r = tokio::time::timeout(Duration::from_secs(1), read_response(&mut s))
        .await
        .unwrap();
    assert!(r.is_err(), "got an answer on a poisoned connection");

    // A connection busy with a request is neither dropped nor poisoned.
    let c = reqwest::Client::new();
    let resp = c
        .post(format!("{}/v1/chat/completions", e.url()))
        .json(&chat("busy", 50, true))
        .send()
        .await
        .unwrap();
    assert_eq!(e.control.drop_idle_connections(), 0);
    assert_eq!(e.control.poison_idle_connections(), 0);
    let text = resp.text().await.unwrap();
    assert!(text.ends_with("data: [DONE]\n\n"));
    // Once the response is complete the connection is idle at once.
    assert_eq!(e.control.drop_idle_connections(), 1);
}

#[test]
fn blocking_engine_from_a_plain_thread() {
    use std::io::{Read, Write};
    let e = spawn_engine_blocking(scaled(0.1)).unwrap();
    let mut s = std::net::TcpStream::connect(e.addr).unwrap();
    s.write_all(b"GET /sim/stats HTTP/1.1\r\nconnection: close\r\n\r\n")
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    assert!(out.starts_with("HTTP/1.1 200 OK\r\n"));
    assert!(out.contains("\"http_requests\":1"));
    e.control.refuse_connections(true).unwrap();
    e.control.refuse_connections(false).unwrap();
    assert!(std::net::TcpStream::connect(e.addr).is_ok());
    let addr = e.addr;
    e.shutdown_blocking();
    assert!(std::net::TcpStream::connect(addr).is_err());
}

#[tokio::test(flavor = "multi_thread")]
async fn stats_endpoint_and_shutdown() {
    let e = spawn_engine(scaled(0.1)).await.unwrap();
    let c = reqwest::Client::new();
    c.post(format!("{}/v1/completions", e.url()))
        .json(&json!({"prompt": "a b c", "max_tokens": 2}))
        .send()
        .await
        .unwrap();
    let v: Value = c
        .get(format!("{}/sim/stats", e.url()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    for k in [
        "requests",
        "prompt_tokens",
        "computed_prompt_tokens",
        "cached_prompt_tokens",
        "generation_tokens",
        "running",
        "waiting",
        "kv_cache_usage",
    ] {
        assert!(v.get(k).is_some(), "{k} missing from {v}");
    }
    assert_eq!(v["requests"], 1);
    assert_eq!(v["generation_tokens"], 2);
    assert_eq!(v["prompt_tokens"], 3);
    // The recorded requests, as scripts read them: the completion, the stats call and this call itself.
    let body = serde_json::to_vec(&json!({"prompt": "a b c", "max_tokens": 2})).unwrap();
    let v: Value = c
        .get(format!("{}/sim/requests", e.url()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let recorded = v.as_array().unwrap();
    assert_eq!(recorded.len(), 3, "{v}");
    assert_eq!(recorded[0]["path"], "/v1/completions");
    assert_eq!(recorded[0]["body_len"], body.len());
    assert_eq!(recorded[0]["body_fnv64"], format!("{:016x}", fnv64(&body)));
    assert_eq!(recorded[1]["path"], "/sim/stats");
    assert_eq!(recorded[2]["path"], "/sim/requests");
    let addr = e.addr;
    e.shutdown().await;
    assert!(TcpStream::connect(addr).await.is_err());
}

/// Prompt tokens of a chat body by the engine's own count (`/tokenize`).
async fn prompt_tokens(c: &reqwest::Client, e: &EngineHandle, body: &Value) -> usize {
    let v = post_value(c, e, "/tokenize", &json!({"messages": body["messages"]})).await;
    v["count"].as_u64().unwrap() as usize
}

#[tokio::test(flavor = "multi_thread")]
async fn context_length_is_vllms_400_before_any_prefill() {
    // Any request that reaches the scheduler takes at least 2 s (one step); a 400 must come long before.
    let e = spawn_engine(SimConfig {
        max_model_len: 100,
        step_overhead: Duration::from_secs(2),
        ..SimConfig::default()
    })
    .await
    .unwrap();
    let c = reqwest::Client::new();
    let url = format!("{}/v1/chat/completions", e.url());
    let mut body = chat(&words(60, "c"), 1, true);
    let p = prompt_tokens(&c, &e, &body).await;
    assert!((60..90).contains(&p), "{p}");

    // An explicit max_tokens one too many (streaming asked for: the error is still one JSON body).
    let m = 100 - p + 1;
    body["max_tokens"] = json!(m);
    let t0 = Instant::now();
    let r = c.post(&url).json(&body).send().await.unwrap();
    assert_eq!(r.status(), 400);
    assert!(r.headers().get("retry-after").is_none());
    assert_eq!(r.headers()["content-type"], "application/json");
    let v: Value = r.json().await.unwrap();
    assert!(
        t0.elapsed() < Duration::from_millis(500),
        "{:?}",
        t0.elapsed()
    );
    assert_eq!(
        v,
        json!({"error": {
            "message": format!(
                "'max_tokens' or 'max_completion_tokens' is too large: {m}. This model's maximum context length \
                 is 100 tokens and your request has {p} input tokens ({m} > 100 - {p})."
            ),
            "type": "BadRequestError",
            "param": "max_tokens",
            "code": 400,
        }})
    );

    // A prompt that fills the context leaves no room for output, whatever max_tokens says.
    let long = json!({"messages": [{"role": "user", "content": words(120, "d")}]});
    let lp = prompt_tokens(&c, &e, &long).await;
    let r = c.post(&url).json(&long).send().await.unwrap();
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.unwrap();
    assert_eq!(
        v["error"]["message"],
        format!(
            "This model's maximum context length is 100 tokens. However, your request has {lp} input tokens. \
             Please reduce the length of the input messages."
        )
    );
    assert_eq!(
        (
            &v["error"]["type"],
            &v["error"]["param"],
            &v["error"]["code"]
        ),
        (
            &json!("BadRequestError"),
            &json!("input_tokens"),
            &json!(400)
        )
    );
    assert!(
        t0.elapsed() < Duration::from_millis(1000),
        "{:?}",
        t0.elapsed()
    );
    let st = e.stats();
    assert_eq!((st.requests, st.rejected, st.steps), (0, 2, 0), "{st:?}");
}

#[tokio::test(flavor = "multi_thread")]
async fn explicit_max_tokens_may_fill_the_context_and_the_default_is_capped() {
    let e = spawn_engine(SimConfig {
        max_model_len: 100,
        default_max_tokens: 50,
        ..scaled(0.01)
    })
    .await
    .unwrap();
    let c = reqwest::Client::new();
    let body = json!({"messages": [{"role": "user", "content": words(70, "f")}]});
    let p = prompt_tokens(&c, &e, &body).await;
    assert!(p > 50 && p < 100, "{p}");
    let v = post_value(&c, &e, "/v1/chat/completions", &body).await;
    assert_eq!(v["usage"]["completion_tokens"], 100 - p, "{v}");

    // max_completion_tokens is checked like max_tokens: the exact fit is served, one more is refused.
    let url = format!("{}/v1/chat/completions", e.url());
    let mut fit = body.clone();
    fit["max_completion_tokens"] = json!(100 - p);
    let r = c.post(&url).json(&fit).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["usage"]["completion_tokens"], 100 - p);
    fit["max_completion_tokens"] = json!(100 - p + 1);
    let r = c.post(&url).json(&fit).send().await.unwrap();
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["param"], "max_tokens");
}

#[tokio::test(flavor = "multi_thread")]
async fn full_waiting_queue_answers_429_at_once() {
    // Real time: the endless stream decodes ~55 tokens/s, cheap for a machine running other tests.
    let e = spawn_engine(SimConfig {
        max_num_seqs: 1,
        max_waiting: Some(2),
        ..SimConfig::default()
    })
    .await
    .unwrap();
    let c = reqwest::Client::new();
    let chat_url = format!("{}/v1/chat/completions", e.url());
    // One endless stream holds the only running slot; two more requests wait behind it.
    let holder = c
        .post(&chat_url)
        .json(&chat("hold", 100_000, true))
        .send()
        .await
        .unwrap();
    assert_eq!(holder.status(), 200);
    wait_until("the holder to run", Duration::from_secs(5), || {
        e.stats().running == 1
    })
    .await;
    let mut waiters = Vec::new();
    for i in 0..2 {
        let (c, url) = (c.clone(), chat_url.clone());
        waiters.push(tokio::spawn(async move {
            c.post(&url)
                .json(&chat(&format!("wait {i}"), 1, false))
                .send()
                .await
                .unwrap()
                .status()
        }));
    }
    wait_until("two requests waiting", Duration::from_secs(5), || {
        e.stats().waiting == 2
    })
    .await;

    // The third arrival on every generation route: 429 at once, with Retry-After and an error body.
    let t0 = Instant::now();
    let r = c
        .post(&chat_url)
        .json(&chat("x", 1, true))
        .send()
        .await
        .unwrap();
    assert!(
        t0.elapsed() < Duration::from_millis(300),
        "{:?}",
        t0.elapsed()
    );
    assert_eq!(r.status(), 429);
    assert_eq!(r.headers()["retry-after"], "1");
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], 429);
    assert_eq!(v["error"]["type"], "TooManyRequestsError");
    assert!(v["error"]["param"].is_null());
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("waiting queue is full"),
        "{v}"
    );
    let r = c
        .post(format!("{}/v1/completions", e.url()))
        .json(&json!({"prompt": "x", "max_tokens": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 429);
    assert_eq!(r.headers()["retry-after"], "1");
    let r = c
        .post(format!("{}/v1/messages", e.url()))
        .json(
            &json!({"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": "x"}]}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 429);
    let v: Value = r.json().await.unwrap();
    assert_eq!(
        (&v["type"], &v["error"]["type"]),
        (&json!("error"), &json!("rate_limit_error"))
    );

    let st = e.stats();
    assert_eq!(
        (
            st.received,
            st.requests,
            st.rejected,
            st.refused_queue_full,
            st.refused_injected
        ),
        (6, 3, 3, 3, 0),
        "{st:?}"
    );
    assert_eq!(st.waiting, 2, "refused requests never queue");
    let refused: Vec<Option<u16>> = e
        .requests()
        .iter()
        .filter(|r| r.path.starts_with("/v1/"))
        .map(|r| r.refused)
        .collect();
    assert_eq!(refused, [None, None, None, Some(429), Some(429), Some(429)]);

    // Once the holder goes away the queue drains and requests are served again.
    drop(holder);
    for w in waiters {
        assert_eq!(w.await.unwrap(), 200);
    }
    let r = c
        .post(&chat_url)
        .json(&chat("again", 1, false))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
}

#[tokio::test(flavor = "multi_thread")]
async fn injected_refusals_are_immediate_counted_and_marked() {
    let e = spawn_engine(SimConfig {
        // A scheduled request would take seconds.
        step_overhead: Duration::from_secs(2),
        ..SimConfig::default()
    })
    .await
    .unwrap();
    let c = reqwest::Client::new();
    let ctl = format!("{}/sim/control", e.url());
    let url = format!("{}/v1/chat/completions", e.url());
    for (status, typ, retry) in [
        (503, "ServiceUnavailableError", Some("1")),
        (429, "TooManyRequestsError", Some("1")),
        (500, "InternalServerError", None),
    ] {
        let r = c
            .post(&ctl)
            .json(&json!({ "fail_status": status }))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let t0 = Instant::now();
        let r = c
            .post(&url)
            .json(&chat(&words(1000, "i"), 64, true))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), status);
        assert_eq!(
            r.headers().get("retry-after").map(|v| v.to_str().unwrap()),
            retry
        );
        assert_eq!(r.headers()["content-type"], "application/json");
        let v: Value = r.json().await.unwrap();
        assert!(
            t0.elapsed() < Duration::from_millis(300),
            "{:?}",
            t0.elapsed()
        );
        assert_eq!(
            v,
            json!({"error": {"message": format!("simulated failure (status {status})"), "type": typ,
                             "param": null, "code": status}})
        );
    }
    let v: Value = c
        .get(format!("{}/sim/stats", e.url()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        (
            &v["received"],
            &v["requests"],
            &v["rejected"],
            &v["refused_injected"],
            &v["refused_queue_full"]
        ),
        (&json!(3), &json!(0), &json!(3), &json!(3), &json!(0)),
        "{v}"
    );
    let recs = e.requests();
    let gen: Vec<Option<u16>> = recs
        .iter()
        .filter(|r| r.path == "/v1/chat/completions")
        .map(|r| r.refused)
        .collect();
    assert_eq!(gen, [Some(503), Some(429), Some(500)]);
    assert!(recs
        .iter()
        .filter(|r| r.path.starts_with("/sim/"))
        .all(|r| r.refused.is_none()));
    let seqs: Vec<u64> = recs.iter().map(|r| r.seq).collect();
    assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>());

    // Reset: served again, and not marked.
    c.post(&ctl)
        .json(&json!({"reset": true}))
        .send()
        .await
        .unwrap();
    e.control.set_fail_status(None);
    let r = c
        .post(&url)
        .json(&chat("x", 1, false))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let last = e.requests().pop().unwrap();
    assert_eq!(
        (last.path.as_str(), last.refused),
        ("/v1/chat/completions", None)
    );
    let st = e.stats();
    assert_eq!((st.received, st.requests, st.refused_injected), (4, 1, 3));
}

/// An engine with vLLM's Responses API store on (`--responses-store`).
fn storing(time_scale: f64) -> SimConfig {
    SimConfig {
        responses_store: true,
        ..scaled(time_scale)
    }
}

/// `method` on `path` of engine `e` with an optional JSON body: (status, JSON answer or Null).
async fn call(e: &EngineHandle, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
    let c = reqwest::Client::new();
    let url = format!("{}{path}", e.url());
    let req = c.request(method.parse().unwrap(), url);
    let req = match body {
        Some(b) => req.json(b),
        None => req,
    };
    let r = req.send().await.unwrap();
    let status = r.status().as_u16();
    let text = r.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

/// vLLM's error body of its response store: always `invalid_request_error`, with the param it names.
fn store_error(status: u16, message: &str, param: &str) -> Value {
    json!({"error": {"message": message, "type": "invalid_request_error", "param": param, "code": status}})
}

/// The `response` of the `response.completed` event of a streamed Responses API answer.
async fn streamed_response(e: &EngineHandle, body: &Value) -> Value {
    let text = post_text(e, "/v1/responses", body).await;
    let done = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .filter_map(|d| serde_json::from_str::<Value>(d).ok())
        .find(|ev| ev["type"] == "response.completed")
        .unwrap_or_else(|| panic!("no response.completed in {text}"));
    done["response"].clone()
}

fn usage_of(v: &Value) -> (u64, u64) {
    let u = &v["usage"];
    (
        u["input_tokens"].as_u64().unwrap(),
        u["input_tokens_details"]["cached_tokens"].as_u64().unwrap(),
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn a_stored_response_continues_as_the_whole_conversation_and_hits_the_prefix_cache() {
    let e = spawn_engine(storing(0.1)).await.unwrap();
    // 2,039 words plus the template's 9 tokens: a turn-1 prompt of whole blocks, all of it cacheable.
    let first_input = words(2_039, "h");
    let t1 = json!({"input": first_input, "max_output_tokens": 4, "model": "m"});
    let (status, r1) = call(&e, "POST", "/v1/responses", Some(&t1)).await;
    assert_eq!(status, 200, "{r1}");
    let (p1, _) = usage_of(&r1);
    assert_eq!(p1 % 16, 0, "turn 1 fills whole blocks");
    let id1 = r1["id"].as_str().unwrap().to_string();
    assert!(id1.starts_with("resp_"), "{id1}");

    // Turn 2, streamed: the engine computes the previous conversation, then the new input.
    let t2 = json!({"input": "and then?", "previous_response_id": id1, "max_output_tokens": 4, "stream": true});
    let r2 = streamed_response(&e, &t2).await;
    let (p2, cached2) = usage_of(&r2);
    assert!(cached2 >= p1, "turn 2 cached {cached2} of turn 1's {p1}");
    assert!(
        p2 > p1 + 4,
        "turn 2 prompt {p2} holds turn 1's {p1} and its answer"
    );
    // The same prompt as a client resending the conversation itself.
    let answer1 = r1["output"][0]["content"][0]["text"].as_str().unwrap();
    let resent = json!({"input": [{"role": "user", "content": first_input},
                                  {"role": "assistant", "content": answer1},
                                  {"role": "user", "content": "and then?"}],
                        "max_output_tokens": 1, "store": false});
    let (_, r) = call(&e, "POST", "/v1/responses", Some(&resent)).await;
    assert_eq!(usage_of(&r).0, p2);

    // Turn 3 continues the streamed turn 2, so that one was stored too.
    let id2 = r2["id"].as_str().unwrap().to_string();
    let t3 = json!({"input": "more", "previous_response_id": id2, "max_output_tokens": 2});
    let (status, r3) = call(&e, "POST", "/v1/responses", Some(&t3)).await;
    assert_eq!(status, 200, "{r3}");
    let (p3, cached3) = usage_of(&r3);
    assert!(
        p3 > p2 && cached3 >= p2 / 16 * 16,
        "turn 3 {p3}, cached {cached3}, turn 2 {p2}"
    );

    // Retrieval: the very object each turn was answered with.
    for (id, answered) in [(&id1, &r1), (&id2, &r2)] {
        let (status, got) = call(&e, "GET", &format!("/v1/responses/{id}"), None).await;
        assert_eq!((status, &got), (200, answered));
    }
    // `store: false` keeps nothing.
    let (_, unstored) = call(&e, "POST", "/v1/responses", Some(&resent)).await;
    let id = unstored["id"].as_str().unwrap();
    let (status, got) = call(&e, "GET", &format!("/v1/responses/{id}"), None).await;
    assert_eq!(
        (status, got),
        (
            404,
            store_error(
                404,
                &format!("Response with id '{id}' not found."),
                "response_id"
            )
        )
    );

    // The previous response's instructions do not carry over (vLLM drops them).
    let a = json!({"input": "hi", "instructions": "answer in one long careful paragraph", "max_output_tokens": 2});
    let (_, ra) = call(&e, "POST", "/v1/responses", Some(&a)).await;
    let b = json!({"input": "more", "previous_response_id": ra["id"], "max_output_tokens": 1});
    let (_, rb) = call(&e, "POST", "/v1/responses", Some(&b)).await;
    let answer = ra["output"][0]["content"][0]["text"].as_str().unwrap();
    let resent = json!({"input": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": answer},
                                  {"role": "user", "content": "more"}], "max_output_tokens": 1});
    let (_, rr) = call(&e, "POST", "/v1/responses", Some(&resent)).await;
    assert_eq!(usage_of(&rb).0, usage_of(&rr).0);
}

#[tokio::test(flavor = "multi_thread")]
async fn stored_response_routes_answer_like_vllm() {
    let e = spawn_engine(storing(0.1)).await.unwrap();
    let unknown = |id: &str| {
        store_error(
            404,
            &format!("Response with id '{id}' not found."),
            "response_id",
        )
    };
    for (method, path) in [
        ("GET", "/v1/responses/resp_nope"),
        ("POST", "/v1/responses/resp_nope/cancel"),
    ] {
        assert_eq!(
            call(&e, method, path, None).await,
            (404, unknown("resp_nope"))
        );
    }
    let body = json!({"input": "hi", "max_output_tokens": 2});
    let (_, made) = call(&e, "POST", "/v1/responses", Some(&body)).await;
    let id = made["id"].as_str().unwrap();
    assert_eq!(made["background"], false);
    let (status, v) = call(&e, "POST", &format!("/v1/responses/{id}/cancel"), None).await;
    assert_eq!(
        (status, v),
        (
            400,
            store_error(400, "Cannot cancel a synchronous response.", "response_id")
        )
    );
    // A query (vLLM's `?stream=true&starting_after=N`) is ignored.
    let (status, v) = call(&e, "GET", &format!("/v1/responses/{id}?stream=false"), None).await;
    assert_eq!((status, &v), (200, &made));
    // Wrong methods are 405; other shapes under /v1/responses/ are unknown paths.
    for (method, path, want) in [
        ("POST", format!("/v1/responses/{id}"), 405),
        ("DELETE", format!("/v1/responses/{id}"), 405),
        ("GET", format!("/v1/responses/{id}/cancel"), 405),
        ("GET", "/v1/responses/".to_string(), 404),
        ("GET", format!("/v1/responses/{id}/input_items"), 404),
        ("POST", format!("/v1/responses/{id}/cancel/now"), 404),
    ] {
        let (status, _) = call(&e, method, &path, None).await;
        assert_eq!(status, want, "{method} {path}");
    }
    // Raw HTTP/1.1 on one keep-alive connection: a retrieval, then a wrong method.
    let mut s = TcpStream::connect(e.addr).await.unwrap();
    s.write_all(format!("GET /v1/responses/{id} HTTP/1.1\r\nhost: sim\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let (status, _, got) = read_response(&mut s).await.unwrap();
    assert_eq!(status, 200);
    assert_eq!(serde_json::from_slice::<Value>(&got).unwrap(), made);
    s.write_all(
        format!("POST /v1/responses/{id} HTTP/1.1\r\nhost: sim\r\ncontent-length: 0\r\n\r\n")
            .as_bytes(),
    )
    .await
    .unwrap();
    let (status, _, got) = read_response(&mut s).await.unwrap();
    assert_eq!(status, 405, "{}", String::from_utf8_lossy(&got));
    // None of these is a generation request.
    assert_eq!(e.stats().received, 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn a_background_response_runs_in_the_scheduler_and_can_be_cancelled() {
    let e = spawn_engine(storing(0.1)).await.unwrap();
    // 20,000 tokens: 36 s of decoding at this scale, so it is still running when cancelled.
    let long = json!({"input": words(200, "b"), "max_output_tokens": 20_000, "background": true, "model": "m"});
    let t0 = Instant::now();
    let (status, queued) = call(&e, "POST", "/v1/responses", Some(&long)).await;
    assert_eq!(status, 200, "{queued}");
    assert!(t0.elapsed() < Duration::from_secs(1), "{:?}", t0.elapsed());
    assert_eq!(
        (&queued["status"], &queued["background"], &queued["output"]),
        (&json!("queued"), &json!(true), &json!([]))
    );
    let id = queued["id"].as_str().unwrap().to_string();
    let path = format!("/v1/responses/{id}");
    // A running request like any other, in the stats and the metrics.
    wait_until(
        "the background request runs",
        Duration::from_secs(5),
        || e.stats().running == 1,
    )
    .await;
    assert_eq!(
        metric_sum(&metrics(&e).await, "vllm:num_requests_running"),
        1.0
    );
    let start = Instant::now();
    loop {
        let (status, v) = call(&e, "GET", &path, None).await;
        assert_eq!(status, 200);
        if v["status"] == "in_progress" {
            break;
        }
        assert_eq!(v["status"], "queued");
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "never in progress"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (status, cancelled) = call(&e, "POST", &format!("{path}/cancel"), None).await;
    assert_eq!((status, &cancelled["status"]), (200, &json!("cancelled")));
    assert_eq!(call(&e, "GET", &path, None).await, (200, cancelled.clone()));
    wait_until("the generation is aborted", Duration::from_secs(5), || {
        let s = e.stats();
        s.running == 0 && s.aborted == 1
    })
    .await;
    // Cancelling again changes nothing.
    assert_eq!(
        call(&e, "POST", &format!("{path}/cancel"), None).await,
        (200, cancelled)
    );

    // A short one completes on its own; its stored object then is the final one.
    let short = json!({"input": "quick", "max_output_tokens": 3, "background": true});
    let (_, queued) = call(&e, "POST", "/v1/responses", Some(&short)).await;
    let path = format!("/v1/responses/{}", queued["id"].as_str().unwrap());
    let start = Instant::now();
    let done = loop {
        let (_, v) = call(&e, "GET", &path, None).await;
        if v["status"] == "incomplete" {
            break v;
        }
        assert!(start.elapsed() < Duration::from_secs(5), "still {v}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert_eq!(done["usage"]["output_tokens"], 3);
    assert_eq!(done["background"], true);
    assert_eq!(done["output"][0]["content"][0]["type"], "output_text");
    // An ended background response is returned unchanged, and it can be continued.
    assert_eq!(
        call(&e, "POST", &format!("{path}/cancel"), None).await,
        (200, done.clone())
    );
    let next =
        json!({"input": "go on", "previous_response_id": done["id"], "max_output_tokens": 1});
    let (status, v) = call(&e, "POST", "/v1/responses", Some(&next)).await;
    assert_eq!((status, &v["status"]), (200, &json!("incomplete")), "{v}");

    // A background stream is not simulated.
    let streamed = json!({"input": "x", "background": true, "stream": true});
    let (status, v) = call(&e, "POST", "/v1/responses", Some(&streamed)).await;
    assert_eq!(
        (status, &v["error"]["param"]),
        (400, &json!("stream")),
        "{v}"
    );
    let st = e.stats();
    assert_eq!((st.received, st.requests, st.rejected), (4, 3, 1));
}

#[tokio::test(flavor = "multi_thread")]
async fn without_the_store_background_is_refused_and_every_previous_response_is_unknown() {
    let e = spawn_engine(scaled(0.1)).await.unwrap();
    let (status, made) = call(
        &e,
        "POST",
        "/v1/responses",
        Some(&json!({"input": "hi", "max_output_tokens": 2, "store": true})),
    )
    .await;
    assert_eq!(status, 200);
    let id = made["id"].as_str().unwrap();
    // `store` was silently ignored.
    let unknown = store_error(
        404,
        &format!("Response with id '{id}' not found."),
        "response_id",
    );
    for (method, path) in [
        ("GET", format!("/v1/responses/{id}")),
        ("POST", format!("/v1/responses/{id}/cancel")),
    ] {
        assert_eq!(call(&e, method, &path, None).await, (404, unknown.clone()));
    }
    let next = json!({"input": "more", "previous_response_id": id, "max_output_tokens": 2});
    assert_eq!(
        call(&e, "POST", "/v1/responses", Some(&next)).await,
        (404, unknown)
    );
    let refusal = store_error(
        400,
        "This vLLM engine does not support `store=True` and therefore does not support the background mode. To \
         enable these features, set the environment variable `VLLM_ENABLE_RESPONSES_API_STORE=1` when launching \
         the vLLM server.",
        "background",
    );
    for body in [
        json!({"input": "x", "background": true}),
        json!({"input": "x", "background": true, "store": true, "stream": true}),
    ] {
        assert_eq!(
            call(&e, "POST", "/v1/responses", Some(&body)).await,
            (400, refusal.clone())
        );
    }
    // Refused at once, counted and marked like every refusal.
    let st = e.stats();
    assert_eq!((st.received, st.requests, st.rejected), (4, 1, 3));
    let refused: Vec<Option<u16>> = e
        .requests()
        .iter()
        .filter(|r| r.path == "/v1/responses")
        .map(|r| r.refused)
        .collect();
    assert_eq!(refused, [None, Some(404), Some(400), Some(400)]);
}
