//! Every API the router relays, the openai SDK, and vLLM's own errors, through the router to real vLLM.

use std::time::Duration;

use super::*;
use serde_json::{json, Value};

async fn post(base: &str, path: &str, body: String) -> (u16, String) {
    let resp = post_json(&client(), base, path)
        .body(body)
        .send()
        .await
        .expect("a response");
    let status = resp.status().as_u16();
    (status, resp.text().await.expect("a body"))
}

fn json_of(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"))
}

/// The `data:` payloads of an event stream, `[DONE]` included.
fn events(text: &str) -> Vec<&str> {
    text.lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs real vLLM engines: scripts/real-vllm.sh runs it"]
async fn every_api_reaches_vllm_and_comes_back_whole() {
    let f = fleet();
    let router = start_router(&fleet_yaml(&f, "predicted_ttft", "")).await;
    router.all_healthy().await;
    let base = router.url();
    let m = &f.model;

    let (s, text) = post(&base, CHAT, chat(&f, user("Say something."), false, 7)).await;
    assert_eq!(s, 200, "{text}");
    let v = json_of(&text);
    assert_eq!(v["usage"]["completion_tokens"], 7, "{text}");
    assert_eq!(v["object"], "chat.completion");

    // Whole by the stream's own usage: vLLM's API server coalesces tokens into fewer chunks when it falls behind
    // (a loaded 2-core machine), so the number of chunks is not the number of tokens.
    let mut body: Value =
        serde_json::from_str(&chat(&f, user("Stream something."), true, 5)).expect("a chat body");
    body["stream_options"] = json!({"include_usage": true});
    let (s, text) = post(&base, CHAT, body.to_string()).await;
    assert_eq!(s, 200, "{text}");
    let ev = events(&text);
    assert_eq!(ev.last(), Some(&"[DONE]"), "{text}");
    let chunks = ev.iter().filter(|e| e.contains("\"delta\"")).count();
    assert!(chunks >= 2, "{chunks} chunks: {text}");
    let usage = ev
        .iter()
        .rev()
        .find_map(|e| {
            serde_json::from_str::<Value>(e)
                .ok()
                .filter(|v| v["usage"].is_object())
        })
        .unwrap_or_else(|| panic!("a usage chunk: {text}"));
    assert_eq!(usage["usage"]["completion_tokens"], 5, "{text}");
    eprintln!("5 tokens streamed in {chunks} delta chunks");
    assert!(
        ev.iter()
            .any(|e| e.contains("\"finish_reason\":\"length\"")),
        "{text}"
    );

    let body =
        json!({"model": m, "prompt": "Once upon a time", "max_tokens": 4, "ignore_eos": true});
    let (s, text) = post(&base, "/v1/completions", body.to_string()).await;
    assert_eq!(s, 200, "{text}");
    assert_eq!(json_of(&text)["usage"]["completion_tokens"], 4, "{text}");

    let body = json!({"model": m, "input": "Tell me more.", "max_output_tokens": 4});
    let (s, text) = post(&base, "/v1/responses", body.to_string()).await;
    assert_eq!(s, 200, "{text}");
    assert_eq!(json_of(&text)["object"], "response", "{text}");

    let body = json!({"model": m, "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}],
                      "stream": true});
    let (s, text) = post(&base, "/v1/messages", body.to_string()).await;
    assert_eq!(s, 200, "{text}");
    assert!(text.contains("event: message_stop"), "{text}");

    router.wait_idle().await;
    assert_load_gauges_at_zero(&router.metrics_text().await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs real vLLM engines: scripts/real-vllm.sh runs it"]
async fn vllms_streams_teach_decode_speed_on_every_api() {
    // The router times only the tokens of a stream: on Responses and Messages streams, the events vLLM names
    // `response.*.delta` and `content_block_delta`, scaled by the output tokens the engine reports at the end
    // (vLLM's Responses deltas are detokenized text, 21 to 24 events for 24 tokens, and it may put two tokens in
    // one event when it falls behind). Each API's streams, through a router of its own, must teach a decode speed
    // near the others' and an answer length near 24 tokens (Messages has no `ignore_eos`). Chat is asked once
    // with its usage and once without (as most SDK clients ask): then each `data:` line is counted as a token.
    let f = fleet();
    let m = &f.model;
    let mut learned = Vec::new();
    for (path, usage) in [
        (CHAT, true),
        (CHAT, false),
        ("/v1/responses", true),
        ("/v1/messages", true),
    ] {
        let router = start_router(&fleet_yaml(&f, "load_aware", "")).await;
        router.all_healthy().await;
        for i in 0..4 {
            let text = format!("Decode speed on {path}, stream {i}.");
            let body = match path {
                CHAT => {
                    let mut b: serde_json::Value =
                        serde_json::from_str(&chat(&f, user(&text), true, 24))
                            .expect("a chat body");
                    if usage {
                        b["stream_options"] = json!({"include_usage": true});
                    }
                    b
                }
                "/v1/responses" => {
                    json!({"model": m, "input": text, "max_output_tokens": 24, "stream": true,
                           "ignore_eos": true})
                }
                _ => json!({"model": m, "messages": user(&text), "max_tokens": 24, "stream": true}),
            };
            let (s, text) = post(&router.url(), path, body.to_string()).await;
            assert_eq!(s, 200, "{path}: {text}");
        }
        let metrics = router
            .metrics_when(|t| t.contains("infergate_endpoint_decode_seconds_per_token{"))
            .await;
        let step = metric_value(&metrics, "infergate_endpoint_decode_seconds_per_token", &[])
            .expect("a decode line");
        let answer = metric_value(&metrics, "infergate_pool_typical_answer_tokens", &[])
            .expect("a typical answer");
        learned.push((path, usage, step, answer));
        router.wait_idle().await;
    }
    eprintln!("seconds a token and answer tokens learned per API (and usage asked): {learned:?}");
    let chat_step = learned[0].2;
    for (path, _, step, answer) in &learned {
        assert!(
            (0.5..2.0).contains(&(step / chat_step)),
            "{path}: {learned:?}"
        );
        assert!((20.0..=26.0).contains(answer), "{path}: {learned:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs real vLLM engines: scripts/real-vllm.sh runs it"]
async fn the_openai_sdk_talks_to_vllm_through_the_router() {
    let f = fleet();
    let router = start_router(&fleet_yaml(&f, "predicted_ttft", "")).await;
    router.all_healthy().await;
    let script = r#"
import sys, openai
c = openai.OpenAI(base_url=sys.argv[1] + "/v1", api_key="unused", max_retries=0)
m = sys.argv[2]
r = c.chat.completions.create(model=m, messages=[{"role": "user", "content": "hi"}], max_tokens=3,
                              extra_body={"ignore_eos": True})
assert r.usage.completion_tokens == 3, r
# vLLM sends no chunk for a token whose text is not whole yet (a random model samples byte tokens), so the
# stream is judged by its usage chunk, not by counting chunks.
chunks = list(c.chat.completions.create(model=m, messages=[{"role": "user", "content": "hey"}], max_tokens=4,
        stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
# Streamed, not one whole answer: vLLM always sends the role chunk first and the finish_reason chunk last.
assert sum(1 for ch in chunks if ch.choices) >= 2, chunks
assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 4, chunks[-1]
r = c.completions.create(model=m, prompt="abc", max_tokens=2, extra_body={"ignore_eos": True})
assert r.usage.completion_tokens == 2, r
r = c.responses.create(model=m, input="hello", max_output_tokens=3)
assert r.object == "response", r
assert [x.id for x in c.models.list().data] == [m]
print("sdk ok", openai.__version__)
"#;
    let out = tools::run(
        std::process::Command::new(&f.python).args(["-c", script, &router.url(), &f.model]),
        120,
    );
    assert!(out.contains("sdk ok"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs real vLLM engines: scripts/real-vllm.sh runs it"]
async fn vllm_errors_pass_through_in_its_own_shape_and_eject_nothing() {
    let f = fleet();
    // "nope" is listed for the pool but served by no engine: vLLM itself answers 404.
    let yaml = fleet_yaml(&f, "predicted_ttft", "").replace(
        "models: [\"*\"]",
        &format!("models: [\"{}\", \"nope\"]", f.model),
    );
    let router = start_router(&yaml).await;
    router.all_healthy().await;
    let base = router.url();
    for stream in [false, true] {
        // 17k tokens: over the engines' 16,384-token context.
        let (s, text) = post(&base, CHAT, chat(&f, user(&cold_text(17_500)), stream, 4)).await;
        assert_eq!(s, 400, "{text}");
        let e = &json_of(&text)["error"];
        assert_eq!(e["type"], "BadRequestError", "{text}");
        assert!(
            e["message"]
                .as_str()
                .unwrap_or("")
                .contains("maximum context length"),
            "{text}"
        );

        let body =
            json!({"model": "nope", "messages": user("hi"), "max_tokens": 2, "stream": stream});
        let (s, text) = post(&base, CHAT, body.to_string()).await;
        assert_eq!(s, 404, "{text}");
        assert_eq!(json_of(&text)["error"]["type"], "NotFoundError", "{text}");
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let m = router.metrics_text().await;
    assert_eq!(
        metric_sum(&m, "infergate_endpoint_ejected", &[]),
        0.0,
        "{m}"
    );
    router.all_healthy().await;
    let (s, text) = post(&base, CHAT, chat(&f, user("still fine?"), false, 2)).await;
    assert_eq!(s, 200, "{text}");
    router.wait_idle().await;
}
