//! Stored Responses API objects through the router: a continued turn (`previous_response_id`), a retrieval and a
//! cancel go to the engine that stored the response, engines with vLLM's response store on (engine-sim
//! `responses_store`).

use std::time::Duration;

use crate::common::*;
use infergate_sim::{EngineHandle, SimConfig};
use serde_json::{json, Value};

fn storing() -> SimConfig {
    SimConfig {
        responses_store: true,
        ..SimConfig::default()
    }
}

/// Two storing engines behind `round_robin`: without the pin, every second request lands on the other engine.
async fn two_storing_engines() -> (Vec<EngineHandle>, TestRouter) {
    let eng = engines(2, storing()).await;
    let router = start_router(&pool_yaml("round_robin", &urls(&eng), "")).await;
    router.ready().await;
    router.all_healthy().await;
    (eng, router)
}

/// What one answer of the router was: status, serving endpoint and JSON body (a stream's `response.completed`).
struct Answer {
    status: u16,
    endpoint: Option<String>,
    body: Value,
}

async fn send(router: &TestRouter, method: &str, path: &str, body: Option<Value>) -> Answer {
    let url = format!("{}{path}", router.url());
    let req = match method {
        "GET" => client().get(url),
        _ => client()
            .post(url)
            .header("content-type", "application/json"),
    };
    let req = match &body {
        Some(b) => req.body(b.to_string()),
        None => req,
    };
    // As the openai SDK (httpx) sends it.
    let req = req.header("accept-encoding", "gzip, deflate");
    let resp = req.send().await.expect("router answers");
    let status = resp.status().as_u16();
    let endpoint = served_by(&resp);
    let streamed = body.as_ref().is_some_and(|b| b["stream"] == json!(true));
    let text = resp.text().await.expect("body");
    let body = if streamed && status == 200 {
        let done = text
            .lines()
            .filter_map(|l| l.strip_prefix("data: "))
            .filter_map(|d| serde_json::from_str::<Value>(d).ok())
            .find(|e| e["type"] == "response.completed")
            .expect("a response.completed event");
        done["response"].clone()
    } else {
        serde_json::from_str(&text).unwrap_or(Value::Null)
    };
    Answer {
        status,
        endpoint,
        body,
    }
}

fn turn(text: &str, previous: Option<&str>, stream: bool) -> Value {
    // Field order as the openai SDK sends it: `model` after the input.
    let mut b =
        json!({"input": text, "max_output_tokens": 4, "model": "sim-model", "stream": stream});
    if let Some(p) = previous {
        b["previous_response_id"] = json!(p);
    }
    b
}

/// A Responses API turn through the router, continuing `previous` if given.
async fn respond(router: &TestRouter, text: &str, previous: Option<&str>, stream: bool) -> Answer {
    let body = turn(text, previous, stream);
    send(router, "POST", "/v1/responses", Some(body)).await
}

fn id_of(a: &Answer) -> String {
    a.body["id"].as_str().expect("a response id").to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_continued_response_goes_to_the_engine_that_stored_it() {
    let (eng, router) = two_storing_engines().await;
    let first = respond(&router, "hello", None, false).await;
    assert_eq!(first.status, 200, "{}", first.body);
    let holder = first.endpoint.clone().expect("served by an endpoint");
    // The router reads the answer's start for its id: the engines are never asked to compress (the SDKs ask).
    assert!(eng
        .iter()
        .flat_map(|e| e.requests())
        .all(|r| r.header("accept-encoding").is_none()));
    let mut previous = id_of(&first);
    // Streamed and not, in turn: the id is learned from both shapes.
    for i in 0..6 {
        let a = respond(
            &router,
            &format!("and then {i}?"),
            Some(&previous),
            i % 2 == 0,
        )
        .await;
        assert_eq!(
            a.status, 200,
            "turn {i}: {} (the other engine does not have the response)",
            a.body
        );
        assert_eq!(a.endpoint.as_deref(), Some(holder.as_str()), "turn {i}");
        previous = id_of(&a);
    }
    assert_eq!(
        router
            .metric_sum(
                "infergate_placements_total",
                &["reason=\"stored_response\""]
            )
            .await,
        6.0
    );
    // A turn that stores nothing is not remembered: retrieving it is the router's 404.
    let unstored =
        json!({"input": "x", "max_output_tokens": 2, "model": "sim-model", "store": false});
    let a = send(&router, "POST", "/v1/responses", Some(unstored)).await;
    assert_eq!(a.status, 200);
    let gone = send(
        &router,
        "GET",
        &format!("/v1/responses/{}", id_of(&a)),
        None,
    )
    .await;
    assert_eq!(gone.status, 404);
    assert_eq!(gone.body["error"]["code"], "response_not_found");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retrieval_and_cancel_go_to_the_holder_and_unknown_ids_are_404s() {
    let (eng, router) = two_storing_engines().await;
    let made = respond(&router, "hi", None, true).await;
    assert_eq!(made.status, 200);
    let id = id_of(&made);
    for _ in 0..4 {
        let got = send(&router, "GET", &format!("/v1/responses/{id}"), None).await;
        assert_eq!(got.status, 200, "{}", got.body);
        assert_eq!(got.body["id"], json!(id));
        assert_eq!(got.endpoint, made.endpoint);
    }
    // The holder's own answer to cancelling a finished synchronous response (another engine would say 404).
    let cancel = send(&router, "POST", &format!("/v1/responses/{id}/cancel"), None).await;
    assert_eq!(cancel.status, 400, "{}", cancel.body);
    assert_eq!(cancel.endpoint, made.endpoint);

    let unknown = send(&router, "GET", "/v1/responses/resp_0123456789abcdef", None).await;
    assert_eq!(unknown.status, 404);
    assert_eq!(
        unknown.body["error"]["message"],
        "Response with id 'resp_0123456789abcdef' not found."
    );
    let odd = send(&router, "POST", "/v1/responses/%3Cb%3E/cancel", None).await;
    assert_eq!(odd.status, 404);
    assert!(!odd.body.to_string().contains("<b>"), "{}", odd.body);
    let asked = |path: &str| -> usize {
        eng.iter()
            .map(|e| e.requests().iter().filter(|r| r.path == path).count())
            .sum()
    };
    // Each engine was asked once whether it has the unknown id; the malformed one was not looked for.
    assert_eq!(asked("/v1/responses/resp_0123456789abcdef"), 2);
    let seen: usize = eng.iter().map(|e| e.requests().len()).sum();
    let sent_on: usize = eng
        .iter()
        .flat_map(|e| e.requests())
        .filter(|r| r.path.starts_with("/v1/responses/") && !r.path.contains("resp_"))
        .count();
    assert_eq!(sent_on, 0, "of {seen} requests, one named the malformed id");
    let m = router.metrics_text().await;
    let lookups = |source: &str| {
        let label = format!("source=\"{source}\"");
        metric_sum(&m, "infergate_stored_response_lookups_total", &[&label])
    };
    assert_eq!(lookups("local"), 5.0, "four retrievals and the cancel");
    assert_eq!(lookups("unknown"), 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_response_ids_do_not_flood_the_engines() {
    let (eng, router) = two_storing_engines().await;
    let probes = || -> usize {
        eng.iter()
            .flat_map(|e| e.requests())
            .filter(|r| r.path.starts_with("/v1/responses/"))
            .count()
    };
    // A client polling a lost id: the engines are asked once, then the miss is remembered.
    for _ in 0..30 {
        let got = send(&router, "GET", "/v1/responses/resp_feedfacefeedface", None).await;
        assert_eq!(got.status, 404, "{}", got.body);
    }
    assert_eq!(probes(), 2, "one question per engine");
    // Ids no engine makes are not asked about at all.
    for id in ["foo", "resp_1", "chatcmpl-0123456789abcdef"] {
        let got = send(&router, "GET", &format!("/v1/responses/{id}"), None).await;
        assert_eq!(got.status, 404, "{id}: {}", got.body);
    }
    assert_eq!(probes(), 2);
    // Made-up ids as fast as a client can send them: the probe budget holds (a burst, then ten a second).
    let start = std::time::Instant::now();
    let paths: Vec<String> = (0..100)
        .map(|i| format!("/v1/responses/resp_{i:016x}"))
        .collect();
    let answers =
        futures_util::future::join_all(paths.iter().map(|p| send(&router, "GET", p, None))).await;
    assert!(answers.iter().all(|a| a.status == 404));
    let rounds = (probes() - 2) / 2;
    let allowed = 20.0 + 10.0 * start.elapsed().as_secs_f64();
    assert!(
        (rounds as f64) <= allowed.ceil(),
        "{rounds} probe rounds for 100 made-up ids in {:?}",
        start.elapsed()
    );
    let m = router.metrics_text().await;
    let lookups = |source: &str| {
        let label = format!("source=\"{source}\"");
        metric_sum(&m, "infergate_stored_response_lookups_total", &[&label])
    };
    assert_eq!(lookups("remembered_unknown"), 29.0);
    assert_eq!(lookups("not_an_id"), 3.0);
    assert_eq!(lookups("throttled") + lookups("unknown"), 101.0);
    assert!(lookups("throttled") > 0.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_whose_engine_is_down_gets_a_503_not_another_engines_404() {
    let (eng, router) = two_storing_engines().await;
    let made = respond(&router, "hi", None, false).await;
    assert_eq!(made.status, 200);
    let holder = eng
        .iter()
        .position(|e| Some(e.url().trim_start_matches("http://").to_string()) == made.endpoint)
        .expect("the holder is one of the engines");
    eng[holder].control.set_health_status(503);
    router
        .wait_for("the holder is unhealthy", Duration::from_secs(10), |r| {
            r.state.pools.pools[0]
                .endpoints()
                .iter()
                .any(|e| !e.health.is_healthy())
        })
        .await;
    let other = &eng[1 - holder];
    let seen = other.requests().len();
    let a = respond(&router, "still there?", Some(&id_of(&made)), false).await;
    assert_eq!(a.status, 503, "{}", a.body);
    assert_eq!(a.body["error"]["code"], "response_holder_unavailable");
    let sent_there = other.requests()[seen..]
        .iter()
        .filter(|r| r.path.starts_with("/v1/responses"))
        .count();
    assert_eq!(sent_there, 0, "the other engine cannot have the response");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_the_router_never_saw_made_is_found_by_asking_the_engines() {
    // Made straight at the second engine: as before a router restart, through another router, or forgotten.
    let (eng, router) = two_storing_engines().await;
    let direct = client()
        .post(format!("{}/v1/responses", eng[1].url()))
        .body(turn("made elsewhere", None, false).to_string())
        .header("content-type", "application/json")
        .send()
        .await
        .expect("engine answers");
    assert_eq!(direct.status(), 200);
    let made: Value = direct.json().await.expect("JSON");
    let id = made["id"].as_str().expect("an id").to_string();
    let holder = eng[1].url().trim_start_matches("http://").to_string();

    let got = send(&router, "GET", &format!("/v1/responses/{id}"), None).await;
    assert_eq!(got.status, 200, "{}", got.body);
    assert_eq!(got.endpoint.as_deref(), Some(holder.as_str()));
    // The chain continues there (round_robin alone would alternate).
    let mut previous = id;
    for i in 0..4 {
        let a = respond(&router, &format!("more {i}"), Some(&previous), false).await;
        assert_eq!(a.status, 200, "turn {i}: {}", a.body);
        assert_eq!(a.endpoint.as_deref(), Some(holder.as_str()), "turn {i}");
        previous = id_of(&a);
    }
    let engine_found = router
        .metric_sum(
            "infergate_stored_response_lookups_total",
            &["source=\"engine\""],
        )
        .await;
    assert_eq!(engine_found, 1.0, "asked once, then remembered");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_background_response_keeps_its_prefill_counted_after_its_answer() {
    // One storing engine prefilling 25k tokens/s: 20k tokens are 0.8 s of work after the `queued` answer.
    let eng = engines(
        1,
        SimConfig {
            prefill_tokens_per_sec: 25_000.0,
            ..storing()
        },
    )
    .await;
    let router = start_router(&pool_yaml("load_aware", &urls(&eng), "")).await;
    router.ready().await;
    // The endpoint's prefill speed, learned from a streamed request.
    assert_eq!(
        post_chat(&router.url(), chat_body(100_000, true, 4)).await,
        200
    );
    router.wait_idle().await;
    let body = json!({"input": "word ".repeat(20_000), "max_output_tokens": 4, "model": "sim-model",
                      "background": true});
    let queued = send(&router, "POST", "/v1/responses", Some(body)).await;
    assert_eq!(queued.status, 200, "{}", queued.body);
    assert_eq!(queued.body["status"], "queued");
    let (held, requests) = router.totals();
    assert!(
        held > 10_000 && requests == 1,
        "the engine is prefilling, the router holds {held} tokens and {requests} requests"
    );
    router.wait_idle().await;
}
