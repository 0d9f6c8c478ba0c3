//! Chat completions streams: headers first, the first token after prefill, one event per decoded token.

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use infergate_sim::spawn_engine;
use serde_json::Value;

use super::common::*;

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
