//! Bodies as real clients send them: `model` and `stream` anywhere in bodies from 70 KiB to 8 MiB, declared or
//! chunked, `Expect: 100-continue`, and a retry that must resend the whole body.

use std::time::Duration;

use crate::common::*;
use infergate_sim::{self as sim, SimConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Engines that prefill fast: multi-MiB prompts must not take simulated minutes.
fn fast() -> SimConfig {
    SimConfig {
        model: "m".into(),
        prefill_tokens_per_sec: 50_000_000.0,
        max_model_len: 100_000_000,
        ..SimConfig::default()
    }
}

/// A chat body of about `bytes` bytes naming `model`, with `model` and `stream` before or after `messages`.
fn body(model: &str, bytes: usize, model_last: bool) -> String {
    let content = "lorem ipsum dolor sit amet ".repeat(bytes / 27 + 1);
    let messages = serde_json::json!([{"role": "user", "content": &content[..bytes]}]);
    if model_last {
        // openai-python 1.x order: messages first.
        format!(r#"{{"messages":{messages},"model":"{model}","stream":true,"max_tokens":1}}"#)
    } else {
        format!(r#"{{"model":"{model}","stream":true,"max_tokens":1,"messages":{messages}}}"#)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn model_anywhere_in_bodies_of_any_size_reaches_its_pool_intact() {
    let e1 = engine(fast()).await;
    let e2 = engine(fast()).await;
    let router = start_router(&two_pools_yaml(&e1.url(), &e2.url())).await;
    router.all_healthy().await;
    let cases = [
        (70 << 10, false, false),
        (70 << 10, true, false),
        (1 << 20, false, false),
        (1 << 20, true, false),
        (1 << 20, true, true),
        (1 << 20, false, true),
        (8 << 20, true, false),
        (8 << 20, false, false),
    ];
    for (i, (size, model_last, is_chunked)) in cases.into_iter().enumerate() {
        let (model, engine) = if i % 2 == 0 { ("m1", &e1) } else { ("m2", &e2) };
        let text = body(model, size, model_last);
        let sent = if is_chunked {
            chunked(&text, 64 * 1024)
        } else {
            reqwest::Body::from(text.clone())
        };
        let what = format!("{size} bytes, model last {model_last}, chunked {is_chunked}");
        assert_eq!(post_chat_intact(&router.url(), sent).await, 200, "{what}");
        let got = last_generate(engine).expect("the pool's engine got it");
        assert_eq!(got.body_len, text.len(), "{what}: length");
        assert_eq!(got.body_fnv64, sim::fnv64(text.as_bytes()), "{what}: bytes");
        assert!(
            got.header("transfer-encoding").is_none(),
            "{what}: sent with a length"
        );
    }
    router.wait_idle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_attempt_is_retried_elsewhere_with_the_whole_body() {
    let bad = engine(fast()).await;
    let good = engine(fast()).await;
    bad.control.set_fail_status(Some(503));
    // round_robin starts at the first endpoint: the first attempt goes to the refusing engine.
    let router = start_router(&pool_yaml("round_robin", &[bad.url(), good.url()], "")).await;
    router.all_healthy().await;
    let text = body("sim-model", 1 << 20, true);
    assert_eq!(post_chat_intact(&router.url(), text.clone()).await, 200);
    assert!(
        bad.stats().rejected >= 1,
        "the first attempt reached the refusing engine"
    );
    let got = last_generate(&good).expect("retried on the other engine");
    assert_eq!(got.body_len, text.len());
    assert_eq!(got.body_fnv64, sim::fnv64(text.as_bytes()));
    assert_eq!(router.metric_sum("infergate_retries_total", &[]).await, 1.0);
    router.wait_idle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expect_100_continue_is_answered_before_the_body() {
    let eng = engine(SimConfig::default()).await;
    let router = start_router(&pool_yaml("load_aware", &[eng.url()], "")).await;
    router.ready().await;
    let text = chat_body(200_000, false, 2);
    let mut s = tokio::net::TcpStream::connect(router.addr).await.unwrap();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nExpect: 100-continue\r\n\r\n",
        text.len()
    );
    s.write_all(head.as_bytes()).await.unwrap();
    let mut buf = vec![0u8; 256];
    // curl waits one second for this before sending anyway: it must come well before.
    let n = tokio::time::timeout(Duration::from_millis(500), s.read(&mut buf))
        .await
        .expect("100 Continue within 500 ms")
        .unwrap();
    assert!(
        String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 100"),
        "{}",
        String::from_utf8_lossy(&buf[..n])
    );
    s.write_all(text.as_bytes()).await.unwrap();
    let resp = read_raw_until(&mut s, Duration::from_secs(10), |r| {
        String::from_utf8_lossy(r).contains("\"choices\"")
    })
    .await;
    let resp = String::from_utf8_lossy(&resp);
    assert!(resp.contains("HTTP/1.1 200"), "{resp}");
    let got = last_generate(&eng).expect("engine got it");
    assert!(got.header("expect").is_none(), "Expect is not forwarded");
    assert_eq!(got.body_len, text.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_chunking_answers_400_as_json() {
    let eng = engine(SimConfig::default()).await;
    let router = start_router(&pool_yaml("load_aware", &[eng.url()], "")).await;
    router.ready().await;
    let mut s = tokio::net::TcpStream::connect(router.addr).await.unwrap();
    s.write_all(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhelloXXXX\r\n0\r\n\r\n",
    )
    .await
    .unwrap();
    let mut resp = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut resp)).await;
    let resp = String::from_utf8_lossy(&resp);
    assert!(resp.starts_with("HTTP/1.1 400"), "{resp}");
    assert!(resp.contains("\"error\""), "OpenAI-style body: {resp}");
    assert!(last_generate(&eng).is_none(), "{:?}", last_generate(&eng));
}

/// Whether `seen` (bytes read up to the end of a request head) already holds the whole body its Content-Length
/// declares.
fn body_came_with_head(seen: &[u8]) -> bool {
    let Some(end) = seen.windows(4).position(|w| w == b"\r\n\r\n") else {
        return false;
    };
    let head = String::from_utf8_lossy(&seen[..end]).to_ascii_lowercase();
    let declared = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse::<usize>().ok());
    declared.is_some_and(|n| n > 0 && seen.len() - (end + 4) == n)
}

/// A body the router read whole goes to the engine in the segment of its request head (the head is corked until
/// the body's end is written): an engine that reads the head finds the body with it, on every request. Without
/// it the head and the body went out as two segments.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_body_reaches_the_engine_in_the_segment_of_its_head() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    let (together, all) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let (t, a) = (together.clone(), all.clone());
    let url = raw_engine(move |seen| {
        // The chat requests (not the router's own GETs).
        if seen.starts_with(b"POST ") {
            a.fetch_add(1, Ordering::SeqCst);
        }
        if body_came_with_head(seen) {
            t.fetch_add(1, Ordering::SeqCst);
        }
        RawAnswer {
            wait: Duration::ZERO,
            bytes:
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n{}"
                    .to_vec(),
            close: true,
        }
    })
    .await;
    let router = start_router(&pool_yaml("round_robin", &[url], "")).await;
    router.all_healthy().await;
    for _ in 0..10 {
        assert_eq!(
            post_chat(&router.url(), chat_body(2000, false, 2)).await,
            200
        );
    }
    assert_eq!(
        (together.load(Ordering::SeqCst), all.load(Ordering::SeqCst)),
        (10, 10)
    );
    router.wait_idle().await;
}
