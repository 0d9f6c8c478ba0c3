//! Answers across the API families (chat, completions, messages, responses): shapes, usage, stop reasons.

use infergate_sim::{spawn_engine, SimConfig};
use serde_json::{json, Value};

use super::common::*;

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
