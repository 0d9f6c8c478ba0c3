//! engine-sim beside real vLLM: the same requests to both, and the fields of their answers compared, so that
//! engine-sim keeps vLLM's shapes (where they differ, vLLM is right and engine-sim is fixed).

use std::collections::BTreeSet;

use super::*;
use serde_json::{json, Value};

/// Every key path of a JSON value (`usage.prompt_tokens`, `choices[].delta.content`), with its JSON type.
fn paths(v: &Value, at: &str, out: &mut BTreeSet<String>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                let p = if at.is_empty() {
                    k.clone()
                } else {
                    format!("{at}.{k}")
                };
                paths(x, &p, out);
            }
        }
        Value::Array(a) => a.iter().for_each(|x| paths(x, &format!("{at}[]"), out)),
        Value::Null => {} // vLLM sends many optional fields as null; their absence is the same to a client
        Value::String(_) => drop(out.insert(format!("{at}: string"))),
        Value::Number(_) => drop(out.insert(format!("{at}: number"))),
        Value::Bool(_) => drop(out.insert(format!("{at}: bool"))),
    }
}

/// Status, content type and the key paths of the answer (of each `data:` event, for a stream).
async fn shape(base: &str, path: &str, body: &Value) -> (u16, String, BTreeSet<String>) {
    let resp = post_json(&client(), base, path)
        .body(body.to_string())
        .send()
        .await
        .expect("a response");
    let status = resp.status().as_u16();
    let ctype = header(&resp, "content-type").unwrap_or_default();
    let ctype = ctype.split(';').next().unwrap_or("").to_string();
    let text = resp.text().await.expect("a body");
    if status >= 400 {
        eprintln!("{base}: {text}");
    }
    let mut out = BTreeSet::new();
    if ctype == "text/event-stream" {
        for data in text.lines().filter_map(|l| l.strip_prefix("data: ")) {
            if let Ok(v) = serde_json::from_str::<Value>(data) {
                paths(&v, "", &mut out);
            }
        }
    } else {
        paths(
            &serde_json::from_str(&text).unwrap_or(Value::Null),
            "",
            &mut out,
        );
    }
    (status, ctype, out)
}

/// Fields an API client reads: what engine-sim must send when vLLM does, with the same type.
const READ_BY_CLIENTS: &[&str] = &[
    "id",
    "object",
    "created",
    "model",
    "choices[].index",
    "choices[].finish_reason",
    "choices[].message.role",
    "choices[].message.content",
    "choices[].delta.content",
    "choices[].text",
    "usage.prompt_tokens",
    "usage.completion_tokens",
    "usage.total_tokens",
    "usage.prompt_tokens_details.cached_tokens",
    "error.message",
    "error.type",
    "error.code",
    "error.param",
    "type",
    "role",
    "content[].type",
    "content[].text",
    "stop_reason",
    "usage.input_tokens",
    "usage.output_tokens",
    "status",
    "output[].type",
    "output[].content[].text",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs real vLLM engines: scripts/real-vllm.sh runs it"]
async fn engine_sim_answers_in_vllms_shapes() {
    let f = fleet();
    let sim = engine(infergate_sim::SimConfig {
        model: f.model.clone(),
        max_model_len: 16_384,
        only_served_model: true,
        ..Default::default()
    })
    .await;
    let sim_url = format!("http://{}", sim.addr);
    let m = &f.model;
    // Over 16,384 tokens for both: vLLM counts " 12345" as six tokens, engine-sim as five.
    let long = cold_text(24_000);
    let cases = [
        (
            "chat",
            CHAT,
            json!({"model": m, "messages": user("hi"), "max_tokens": 3}),
        ),
        (
            "chat stream",
            CHAT,
            json!({"model": m, "messages": user("hi"), "max_tokens": 3, "stream": true,
                                      "stream_options": {"include_usage": true}}),
        ),
        (
            "completions",
            "/v1/completions",
            json!({"model": m, "prompt": "hi", "max_tokens": 3}),
        ),
        (
            "too long",
            CHAT,
            json!({"model": m, "messages": user(&long), "max_tokens": 3}),
        ),
        (
            "too long, stream",
            CHAT,
            json!({"model": m, "messages": user(&long), "max_tokens": 3, "stream": true}),
        ),
        (
            "unknown model",
            CHAT,
            json!({"model": "nope", "messages": user("hi"), "max_tokens": 3}),
        ),
        (
            "messages",
            "/v1/messages",
            json!({"model": m, "messages": user("hi"), "max_tokens": 3}),
        ),
        (
            "responses",
            "/v1/responses",
            json!({"model": m, "input": "hi", "max_output_tokens": 3}),
        ),
    ];
    let mut differ = Vec::new();
    for (name, path, body) in &cases {
        let (vs, vt, vp) = shape(&f.urls[0], path, body).await;
        let (ss, st, sp) = shape(&sim_url, path, body).await;
        let read = |p: &BTreeSet<String>| {
            p.iter()
                .filter(|x| READ_BY_CLIENTS.contains(&x.split(':').next().unwrap_or("")))
                .cloned()
                .collect::<BTreeSet<_>>()
        };
        let missing: Vec<_> = read(&vp).difference(&read(&sp)).cloned().collect();
        let invented: Vec<_> = read(&sp).difference(&read(&vp)).cloned().collect();
        eprintln!("{name}: vLLM {vs} {vt}, engine-sim {ss} {st}; engine-sim lacks {missing:?}, adds {invented:?}");
        if (vs, &vt) != (ss, &st) || !missing.is_empty() || !invented.is_empty() {
            differ.push(*name);
        }
    }
    assert!(
        differ.is_empty(),
        "engine-sim differs from vLLM in: {differ:?} (see above)"
    );
}
