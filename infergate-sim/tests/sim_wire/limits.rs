//! Requests refused before scheduling: vLLM's context-length 400s, a full waiting queue, injected failures.

use std::time::{Duration, Instant};

use infergate_sim::{spawn_engine, EngineHandle, SimConfig};
use serde_json::{json, Value};

use super::common::*;

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
    let seen = lp.min(101);
    let r = c.post(&url).json(&long).send().await.unwrap();
    assert_eq!(r.status(), 400);
    let v: Value = r.json().await.unwrap();
    assert_eq!(
        v["error"]["message"],
        format!(
            "This model's maximum context length is 100 tokens. However, your prompt contains at least {seen} \
             input tokens, which exceeds this limit even without any output tokens. Please reduce the length of \
             the input prompt. (parameter=input_tokens, value={seen})"
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
