//! The Responses API: its stream's announcement, stored responses, background runs and the store's routes.

use std::time::{Duration, Instant};

use infergate_sim::{spawn_engine, EngineHandle, SimConfig};
use serde_json::{json, Value};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

use super::common::*;

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
