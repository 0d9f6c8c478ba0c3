//! `/tokenize` and `/v1/messages/count_tokens`: counted at once, never scheduled.

use std::time::{Duration, Instant};

use infergate_sim::spawn_engine;
use serde_json::json;

use super::common::*;

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
