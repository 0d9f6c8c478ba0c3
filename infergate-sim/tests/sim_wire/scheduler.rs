//! The V1 scheduler as seen on the wire: prefix cache hits, `max_num_seqs`, aborts when clients go away.

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use infergate_sim::{spawn_engine, SimConfig};
use serde_json::json;

use super::common::*;

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

/// The engine's simulated busy time for one request of `tokens` new prompt tokens and 8 output tokens.
async fn busy_for(c: &reqwest::Client, e: &infergate_sim::EngineHandle, salt: &str) -> f64 {
    let before = e.stats().busy_seconds;
    post_value(
        c,
        e,
        "/v1/chat/completions",
        &chat(&words(5_000, salt), 8, false),
    )
    .await;
    e.stats().busy_seconds - before
}

#[tokio::test(flavor = "multi_thread")]
async fn speed_stretches_every_step_and_can_change_mid_run() {
    let c = reqwest::Client::new();
    let full = spawn_engine(scaled(0.01)).await.unwrap();
    let half = spawn_engine(SimConfig {
        speed: 0.5,
        ..scaled(0.01)
    })
    .await
    .unwrap();
    // Slows down to a quarter as soon as it has work.
    let throttled = spawn_engine(SimConfig {
        speed_change: Some((Duration::ZERO, 0.25)),
        ..scaled(0.01)
    })
    .await
    .unwrap();
    let base = busy_for(&c, &full, "a").await;
    assert!(base > 0.0);
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * b;
    // The same work (a new prompt of the same length each time) in steps twice and four times as long.
    assert!(close(busy_for(&c, &half, "b").await, 2.0 * base));
    assert!(close(busy_for(&c, &throttled, "c").await, 4.0 * base));
    assert_eq!(throttled.control.speed(), 0.25);
    // At run time through the control API; a reset restores the configured speed.
    let v = post_value(&c, &full, "/sim/control", &json!({"speed": 0.5})).await;
    assert_eq!(v["speed"], 0.5);
    assert!(close(busy_for(&c, &full, "d").await, 2.0 * base));
    post_value(&c, &half, "/sim/control", &json!({"reset": true})).await;
    assert_eq!(half.control.speed(), 0.5);
    let r = c
        .post(format!("{}/sim/control", full.url()))
        .json(&json!({"speed": 0}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
}
