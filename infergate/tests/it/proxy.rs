//! End-to-end tests of the router core through real sockets: engine-sim engines and a router on loopback.

use std::time::Duration;

use crate::common::*;
use futures_util::StreamExt;
use infergate_sim::{self as sim, SimConfig};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_are_held_after_headers_and_released_at_the_first_byte() {
    let eng = engines(1, slow_prefill()).await;
    let router = start_router(&pool_yaml("load_aware", &urls(&eng), "")).await;
    router.ready().await;
    let expected = 100_000u64.div_ceil(4); // bytes / 4; the JSON wrapper adds a little
    let resp = send_chat(&router.url(), chat_body(100_000, true, 4)).await;
    assert_eq!(resp.status(), 200);
    // Headers are here, the engine is still prefilling: the estimate must still be held.
    let (prefill, requests) = router.endpoint_load(0);
    assert!(
        prefill >= expected,
        "held {prefill} tokens after headers, expected >= {expected}"
    );
    assert_eq!(requests, 1);
    let mut stream = resp.bytes_stream();
    let first = stream.next().await.expect("a first chunk").expect("chunk");
    assert!(!first.is_empty());
    // Released before the first chunk was written to us.
    assert_eq!(
        router.endpoint_load(0).0,
        0,
        "tokens released at the first body byte"
    );
    while stream.next().await.is_some() {}
    router.wait_idle().await;
    let m = router.metrics_text().await;
    let counted = metric_sum(&m, "infergate_prefill_tokens_estimated_total", &[]);
    assert!(counted >= expected as f64, "estimated_total {counted}");
    assert!(metric_sum(&m, "infergate_time_to_first_byte_seconds_count", &[]) >= 1.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_responses_api_stream_holds_its_tokens_until_the_first_output_not_the_announcement() {
    let eng = engines(1, slow_prefill()).await;
    let router = start_router(&pool_yaml("load_aware", &urls(&eng), "")).await;
    router.ready().await;
    // As the openai SDK's responses.create sends it: `input` items, then `instructions`, then `model`. About 20k
    // tokens: 0.8 s of prefill at 25k tokens/s.
    let body = serde_json::json!({
        "input": [{"role": "user", "content": [{"type": "input_text", "text": "word ".repeat(20_000)}]}],
        "instructions": "be brief", "max_output_tokens": 4, "model": "sim-model", "stream": true,
    });
    let resp = post_json(&client(), &router.url(), "/v1/responses")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let mut stream = resp.bytes_stream();
    let mut seen = String::new();
    let mut read_until = async |event: &str| {
        while !seen.contains(event) {
            let chunk = stream.next().await.expect("more events").expect("chunk");
            seen.push_str(&String::from_utf8_lossy(&chunk));
        }
    };
    // vLLM announces the response before its prefill runs: the estimate stays held.
    read_until("event: response.in_progress").await;
    assert!(
        router.endpoint_load(0).0 > 0,
        "tokens released at the announcement, before the prefill ran"
    );
    read_until("event: response.output_text.delta").await;
    assert_eq!(
        router.endpoint_load(0).0,
        0,
        "tokens held past the first output"
    );
    read_until("event: response.completed").await;
    router.wait_idle().await;
    // The endpoint's speed was learned from the first output, not from the announcement (a few ms).
    assert_learned_20k_tokens_take_their_time(&router);
    assert_eq!(
        router
            .metric_sum("infergate_placements_total", &["reason=\"load_aware\""])
            .await,
        1.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_screenshot_counts_as_an_images_tokens_not_its_base64_size() {
    let eng = engines(1, slow_prefill()).await;
    let router = start_router(&pool_yaml("load_aware", &urls(&eng), "")).await;
    router.ready().await;
    // A coding agent's tool result with a 2 MB screenshot, and 20k tokens of text (0.8 s of prefill).
    let screenshot = format!(
        "data:image/png;base64,{}",
        "iVBORw0KGgoAAAANSUhEUg".repeat(95_000)
    );
    let body = serde_json::json!({
        "model": "sim-model", "stream": true, "max_tokens": 4,
        "messages": [{"role": "user", "content": [
            {"type": "text", "text": "word ".repeat(20_000)},
            {"type": "image_url", "image_url": {"url": screenshot}},
        ]}],
    })
    .to_string();
    let resp = send_chat(&router.url(), body.clone()).await;
    assert_eq!(resp.status(), 200);
    // 100 KB of text over 4 bytes per token, plus one image at the default 1,500 tokens.
    let (held, _) = router.endpoint_load(0);
    assert!(
        (25_000..30_000).contains(&held),
        "held {held} tokens for a {} byte body",
        body.len()
    );
    let _ = resp.bytes().await;
    router.wait_idle().await;
    // The speed learned from it is the text's.
    assert_learned_20k_tokens_take_their_time(&router);
}

/// The first endpoint's learned speed says what `slow_prefill` does: 20k tokens take about 0.8 s (at least 0.3 s;
/// a speed learned from a wrong moment or a wrong size predicts a few milliseconds).
fn assert_learned_20k_tokens_take_their_time(router: &TestRouter) {
    let learned = router.state.pools.pools[0].endpoints()[0]
        .prefill_speed
        .estimate(20_000)
        .expect("a speed learned");
    assert!(
        learned >= Duration::from_millis(300),
        "20k tokens predicted to prefill in {learned:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn released_when_the_client_closes_without_reading() {
    let eng = engines(1, slow_prefill()).await;
    let router = start_router(&pool_yaml("load_aware", &urls(&eng), "")).await;
    router.ready().await;
    let resp = send_chat(&router.url(), chat_body(100_000, true, 64)).await;
    assert!(router.endpoint_load(0).0 > 0);
    drop(resp);
    router.wait_idle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn released_when_the_client_cancels_before_headers() {
    let eng = engines(1, SimConfig::default()).await;
    eng[0].control.set_slow_headers(Duration::from_secs(3));
    let router = start_router(&pool_yaml("load_aware", &urls(&eng), "")).await;
    router.ready().await;
    let url = router.url();
    let req = send_chat(&url, chat_body(20_000, true, 4));
    assert!(tokio::time::timeout(Duration::from_millis(300), req)
        .await
        .is_err());
    router.wait_idle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn released_on_upstream_5xx_and_the_status_passes_through() {
    let eng = engines(1, SimConfig::default()).await;
    eng[0].control.set_fail_status(Some(500));
    let router = start_router(&pool_yaml("load_aware", &urls(&eng), "")).await;
    router.ready().await;
    assert_eq!(
        post_chat(&router.url(), chat_body(10_000, true, 4)).await,
        500
    );
    router.wait_idle().await;
    let m = router.metrics_text().await;
    assert_eq!(
        metric_sum(&m, "infergate_prefill_tokens_estimated_total", &[]),
        0.0,
        "a 5xx did no prefill"
    );
    assert_eq!(
        metric_sum(&m, "infergate_requests_total", &["code=\"500\""]),
        1.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_error_retries_elsewhere_and_counts_the_estimate_once() {
    let eng = engines(2, SimConfig::default()).await;
    // Slow health checks so the refusing endpoint still looks healthy when the requests arrive.
    let yaml = slow_health_checks(&pool_yaml("load_aware", &urls(&eng), ""));
    let router = start_router(&yaml).await;
    router.all_healthy().await;
    eng[0].control.refuse_connections(true).unwrap();
    let body = chat_body(8_000, false, 2);
    for _ in 0..4 {
        assert_eq!(post_chat(&router.url(), body.clone()).await, 200);
    }
    router.wait_idle().await;
    assert_eq!(generate_requests(&eng[1]), 4);
    let per_request = infergate::placement::estimate_tokens(body.len() as u64, 4.0, 262_144) as f64;
    assert_eq!(
        router
            .metric_sum("infergate_prefill_tokens_estimated_total", &[])
            .await,
        4.0 * per_request
    );
    eng[0].control.refuse_connections(false).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_error_with_no_other_endpoint_is_a_json_502() {
    let eng = engines(1, SimConfig::default()).await;
    let yaml = slow_health_checks(&pool_yaml("load_aware", &urls(&eng), ""));
    let router = start_router(&yaml).await;
    router.ready().await;
    eng[0].control.refuse_connections(true).unwrap();
    let resp = send_chat(&router.url(), chat_body(1000, false, 2)).await;
    assert_eq!(resp.status(), 502);
    let v: serde_json::Value = resp.json().await.expect("JSON error body");
    assert!(v["error"]["message"].is_string() && v["error"]["type"].is_string());
    router.wait_idle().await;
    eng[0].control.refuse_connections(false).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_pooled_connection_is_retried_and_counted_once() {
    let _ = env_logger::builder().is_test(true).try_init();
    let eng = engines(2, SimConfig::default()).await;
    let router = start_router(&pool_yaml("load_aware", &urls(&eng), "")).await;
    router.all_healthy().await;
    let body = chat_body(4_000, false, 2);
    let c = client();
    let send = |c: reqwest::Client| {
        let (url, body) = (router.url(), body.clone());
        async move { finish(post_json(&c, &url, CHAT).body(body).send().await.unwrap()).await }
    };
    // Warm pooled connections to both engines.
    let warm: Vec<_> = (0..8).map(|_| send(c.clone())).collect();
    for s in futures_util::future::join_all(warm).await {
        assert_eq!(s, 200);
    }
    let mut stale = 0;
    for _ in 0..12 {
        // The engine leaves its idle connections open but resets the next request on them: the router
        // cannot see the staleness in advance and must retry on the other endpoint.
        stale += eng[0].control.poison_idle_connections();
        assert_eq!(send(c.clone()).await, 200);
    }
    assert!(stale > 0);
    router.wait_idle().await;
    let m = router.metrics_text().await;
    assert!(
        metric_sum(&m, "infergate_retries_total", &[]) >= 1.0,
        "the stale path was exercised"
    );
    let per_request = infergate::placement::estimate_tokens(body.len() as u64, 4.0, 262_144) as f64;
    assert_eq!(
        metric_sum(&m, "infergate_prefill_tokens_estimated_total", &[]),
        20.0 * per_request
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn round_robin_and_empty_bodies_hold_no_tokens() {
    let eng = engines(2, slow_prefill()).await;
    let router = start_router(&pool_yaml("round_robin", &urls(&eng), "")).await;
    router.ready().await;
    let resp = send_chat(&router.url(), chat_body(100_000, true, 4)).await;
    let t = router.totals();
    assert_eq!(t, (0, 1), "round_robin counts the request but no tokens");
    drop(resp);
    router.wait_idle().await;

    let router = start_router(&pool_yaml("load_aware", &urls(&eng), "")).await;
    router.ready().await;
    eng[0].control.set_slow_headers(Duration::from_millis(500));
    eng[1].control.set_slow_headers(Duration::from_millis(500));
    let empty = tokio::spawn(post_json(&client(), &router.url(), CHAT).send());
    router
        .wait_for("request in flight", Duration::from_secs(5), |r| {
            r.totals().1 == 1
        })
        .await;
    assert_eq!(router.totals().0, 0, "an empty body counts nothing");
    let _ = empty.await;
    router.wait_idle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn janitor_releases_overdue_tokens_once() {
    let eng = engines(1, slow_prefill()).await;
    let router = start_router(&pool_yaml("load_aware", &urls(&eng), "")).await;
    router.ready().await;
    let resp = send_chat(&router.url(), chat_body(100_000, true, 4)).await;
    assert!(router.endpoint_load(0).0 > 0);
    // Everything older than zero is overdue: the janitor path releases it.
    let released = router
        .state
        .ledger
        .expire(Duration::ZERO, std::time::Instant::now());
    assert_eq!(released, 1);
    assert_eq!(
        router.endpoint_load(0),
        (0, 1),
        "tokens gone, the request still in flight"
    );
    let _ = resp.bytes().await; // the first byte must not release a second time
    router.wait_idle().await;
    assert_eq!(
        router
            .metric_sum("infergate_prefill_janitor_released_total", &[])
            .await,
        1.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousand_concurrent_streams_end_with_every_gauge_at_zero() {
    let eng = engines(2, time_scaled(0.05)).await;
    let router = start_router(&pool_yaml("load_aware", &urls(&eng), "")).await;
    router.ready().await;
    let c = reqwest::Client::builder()
        .pool_max_idle_per_host(1000)
        .build()
        .unwrap();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..1000 {
        let req = post_json(&c, &router.url(), CHAT).body(chat_body(200 + (i % 7) * 300, true, 3));
        tasks.spawn(async move {
            let resp = req.send().await?;
            let status = resp.status();
            let mut s = resp.bytes_stream();
            // A tenth of the clients walk away after the first chunk.
            let mut n = 0;
            while let Some(chunk) = s.next().await {
                chunk?;
                n += 1;
                if i % 10 == 0 && n == 1 {
                    break;
                }
            }
            Ok::<_, reqwest::Error>(status)
        });
    }
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    let mut ok = 0;
    while let Some(r) = tokio::time::timeout_at(deadline, tasks.join_next())
        .await
        .expect("bounded in time")
    {
        if matches!(r, Ok(Ok(s)) if s == 200) {
            ok += 1;
        }
    }
    assert!(ok >= 990, "{ok} of 1000 succeeded");
    router.wait_idle().await;
    assert_eq!(router.state.ledger.outstanding(), 0);
    let m = router.metrics_text().await;
    assert_load_gauges_at_zero(&m);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn count_tokens_holds_nothing_and_counts_no_placement() {
    let eng = engines(1, SimConfig::default()).await;
    let router = start_router(&pool_yaml("load_aware", &urls(&eng), "")).await;
    router.ready().await;
    let resp = post_json(&client(), &router.url(), COUNT_TOKENS)
        .body(chat_body(50_000, false, 1))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let v: serde_json::Value = resp.json().await.unwrap();
    assert!(v["input_tokens"].as_u64().unwrap() > 0);
    router.wait_idle().await;
    let m = router.metrics_text().await;
    assert_eq!(metric_sum(&m, "infergate_placements_total", &[]), 0.0);
    assert_eq!(
        metric_sum(&m, "infergate_prefill_tokens_estimated_total", &[]),
        0.0
    );
    assert_eq!(
        metric_sum(&m, "infergate_requests_total", &["code=\"200\""]),
        1.0
    );
    // A "*" pool lists the models its engines report.
    let v = get_json(&router.url(), "/v1/models").await;
    assert_eq!(v["data"][0]["id"], "sim-model");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_bodies_arrive_byte_for_byte() {
    let eng = engines(1, time_scaled(0.01)).await;
    let router = start_router(&pool_yaml("load_aware", &urls(&eng), "")).await;
    router.ready().await;
    for size in [100 * 1024, 4 * 1024 * 1024] {
        let body = chat_body(size, false, 1);
        assert_eq!(
            post_chat(&router.url(), body.clone()).await,
            200,
            "size {size}"
        );
        let got = last_generate(&eng[0]).unwrap();
        assert_eq!(got.body_len, body.len());
        assert_eq!(
            got.body_fnv64,
            sim::fnv64(body.as_bytes()),
            "size {size} arrived intact"
        );
    }
    // A chunked upload (no Content-Length) of 1 MiB: intact, and its estimate grew as it streamed.
    let body = chat_body(1024 * 1024, false, 1);
    assert_eq!(
        post_chat(&router.url(), chunked(&body, 16 * 1024)).await,
        200
    );
    let got = last_generate(&eng[0]).unwrap();
    assert_eq!(
        (got.body_len, got.body_fnv64),
        (body.len(), sim::fnv64(body.as_bytes()))
    );
    router.wait_idle().await;
    let whole = infergate::placement::estimate_tokens(body.len() as u64, 4.0, 262_144) as f64;
    let total = router
        .metric_sum("infergate_prefill_tokens_estimated_total", &[])
        .await;
    assert!(
        total >= whole,
        "chunked estimate grew to the whole body: {total} < {whole}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn router_answers_errors_models_and_health_in_openai_style() {
    let eng = engines(1, SimConfig::default()).await;
    let yaml = format!(
        "{}  - name: other\n    models: [\"big-model\"]\n    endpoints:\n      - url: \"http://127.0.0.1:{}\"\n",
        pool_yaml("load_aware", &urls(&eng), "").replace("models: [\"*\"]", "models: [\"sim-model\"]"),
        free_port()
    );
    let router = start_router(&yaml).await;
    router.ready().await;
    // Unknown model: 404.
    let r = send_chat(&router.url(), r#"{"model":"nope","messages":[]}"#).await;
    assert_eq!(r.status(), 404);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "model_not_found");
    // A pool with no healthy endpoint: 503 with Retry-After.
    let r = send_chat(&router.url(), r#"{"model":"big-model","messages":[]}"#).await;
    assert_eq!(r.status(), 503);
    assert!(r.headers().get("retry-after").is_some());
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "no_healthy_endpoint");
    // Body over the limit: 413.
    let r = post_json(&client(), &router.url(), CHAT)
        .header("content-length", (64u64 << 20).to_string())
        .body(vec![b' '; 10])
        .send()
        .await;
    if let Ok(r) = r {
        assert_eq!(r.status(), 413);
    }
    // The union of models, and health.
    let v = get_json(&router.url(), "/v1/models").await;
    let ids: Vec<&str> = v["data"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["id"].as_str())
        .collect();
    assert_eq!(ids, vec!["big-model", "sim-model"]);
    assert_eq!(
        client()
            .get(format!("{}/health", router.url()))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_key_is_sent_upstream_and_health_gates_traffic() {
    let eng = engines(2, SimConfig::default()).await;
    let key_file = std::env::temp_dir().join(format!("infergate-test-key-{}", free_port()));
    std::fs::write(&key_file, "sk-test-123\n").unwrap();
    let yaml = pool_yaml("load_aware", &urls(&eng), "").replacen(
        &format!("url: \"{}\"\n", eng[0].url()),
        &format!(
            "url: \"{}\"\n        api_key_file: \"{}\"\n",
            eng[0].url(),
            key_file.display()
        ),
        1,
    );
    eng[1].control.set_health_status(503);
    let router = start_router(&yaml).await;
    router.ready().await;
    for _ in 0..6 {
        assert_eq!(
            post_chat(&router.url(), chat_body(1000, false, 1)).await,
            200
        );
    }
    assert_eq!(
        generate_requests(&eng[1]),
        0,
        "an unhealthy endpoint gets no requests"
    );
    let auth: Vec<String> = eng[0]
        .requests()
        .iter()
        .filter_map(|r| r.header("authorization").map(str::to_owned))
        .collect();
    assert!(
        auth.iter().any(|a| a == "Bearer sk-test-123"),
        "health checks and requests carry the key"
    );
    // The endpoint recovers after healthy_after successes and gets traffic again.
    eng[1].control.set_health_status(200);
    router
        .wait_for("endpoint 1 healthy again", Duration::from_secs(10), |r| {
            r.state.pools.pools[0].endpoints()[1].health.is_healthy()
        })
        .await;
    assert_eq!(
        router.metric_sum("infergate_endpoint_healthy", &[]).await,
        2.0
    );
    // What happened, between any two scrapes: the second endpoint failed checks, entered unhealthy at its first
    // check and healthy once back; the first passed every check.
    let m = router.metrics_text().await;
    let of = |name: &str, ep: &sim::EngineHandle, to: Option<&str>| {
        let e = format!("endpoint=\"{}\"", ep.addr);
        let to = to.map(|t| format!("to=\"{t}\""));
        let labels: Vec<&str> = [Some(e.as_str()), to.as_deref()]
            .into_iter()
            .flatten()
            .collect();
        metric_value(&m, name, &labels).unwrap_or_else(|| panic!("no {name} {labels:?}:\n{m}"))
    };
    let failures = "infergate_endpoint_health_check_failures_total";
    let changes = "infergate_endpoint_health_changes_total";
    assert!(of(failures, &eng[1], None) >= 1.0);
    assert_eq!(of(changes, &eng[1], Some("unhealthy")), 1.0);
    assert_eq!(of(changes, &eng[1], Some("healthy")), 1.0);
    assert_eq!(of(failures, &eng[0], None), 0.0);
    assert_eq!(of(changes, &eng[0], Some("unhealthy")), 0.0);
    assert_eq!(of(changes, &eng[0], Some("healthy")), 1.0);
    let _ = std::fs::remove_file(key_file);
}

/// Every engine of the pool fails its health check (a check that times out under load, a wrong `path`) while
/// it still serves: the pool places across those that answer it (its "health panic") instead of refusing
/// everything, never on one whose check cannot connect; shows it in a gauge and on the status page, and leaves it
/// when one passes again. Off, the pool answers 503.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_whose_every_health_check_fails_still_serves_through_its_engines() {
    let eng = engines(2, SimConfig::default()).await;
    for e in &eng {
        e.control.set_health_status(503);
    }
    // A third endpoint nothing listens on: its checks (and requests) are refused.
    let mut all = urls(&eng);
    all.push(format!("http://127.0.0.1:{}", free_port()));
    let router = start_router(&pool_yaml("load_aware", &all, "")).await;
    let all_unhealthy = |r: &TestRouter| {
        r.state.pools.pools[0]
            .endpoints()
            .iter()
            .all(|e| e.health.get() == infergate::pool::Health::Unhealthy)
    };
    router
        .wait_for(
            "every endpoint unhealthy",
            Duration::from_secs(10),
            all_unhealthy,
        )
        .await;
    // One at a time, so each placement is a tie the policy breaks at random: 24 requests leave a chance of 2^-23
    // that one engine gets them all (8 did once in CI: 1 in 128).
    for _ in 0..24 {
        assert_eq!(
            post_chat(&router.url(), chat_body(1000, false, 1)).await,
            200
        );
    }
    assert!(
        eng.iter().all(|e| generate_requests(e) > 0),
        "placed across both answering endpoints: {:?}",
        eng.iter().map(generate_requests).collect::<Vec<_>>()
    );
    assert_eq!(
        router.metric_sum("infergate_retries_total", &[]).await,
        0.0,
        "nothing placed on the endpoint whose check cannot connect"
    );
    let panic = "infergate_pool_health_panic";
    assert_eq!(router.metric_sum(panic, &["pool=\"default\""]).await, 1.0);
    let status = get_json(&format!("http://{}", router.metrics_addr), "/status.json").await;
    assert_eq!(status["pools"][0]["health_panic"], true);
    let available: Vec<bool> = (0..3)
        .map(|i| status["pools"][0]["endpoints"][i]["available"] == true)
        .collect();
    assert_eq!(available, [true, true, false]);

    // One passes again: the panic ends and the failing one gets nothing more.
    eng[0].control.set_health_status(200);
    router
        .wait_for("endpoint 0 healthy again", Duration::from_secs(10), |r| {
            r.state.pools.pools[0].endpoints()[0].health.is_healthy()
        })
        .await;
    let before = generate_requests(&eng[1]);
    for _ in 0..6 {
        assert_eq!(
            post_chat(&router.url(), chat_body(1000, false, 1)).await,
            200
        );
    }
    assert_eq!(
        generate_requests(&eng[1]),
        before,
        "no panic, no traffic to the failing one"
    );
    assert_eq!(router.metric_sum(panic, &[]).await, 0.0);

    // Turned off: a pool without a healthy endpoint refuses, as before.
    let off = pool_yaml("load_aware", &all, "").replace(
        "unhealthy_after: 1 }",
        "unhealthy_after: 1, route_when_all_unhealthy: false }",
    );
    eng[0].control.set_health_status(503);
    let strict = start_router(&off).await;
    strict
        .wait_for(
            "every endpoint unhealthy",
            Duration::from_secs(10),
            all_unhealthy,
        )
        .await;
    let served = eng.iter().map(generate_requests).sum::<usize>();
    let r = send_chat(&strict.url(), chat_body(1000, false, 1)).await;
    assert_eq!(r.status(), 503);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "no_healthy_endpoint");
    assert_eq!(eng.iter().map(generate_requests).sum::<usize>(), served);
    assert_eq!(strict.metric_sum(panic, &[]).await, 0.0);
}

/// A pool of engines that are all down (their checks cannot connect) has no health panic: 503 at once, no
/// connect attempted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_of_dead_engines_answers_503_without_trying_them() {
    let dead: Vec<String> = (0..2)
        .map(|_| format!("http://127.0.0.1:{}", free_port()))
        .collect();
    let router = start_router(&pool_yaml("load_aware", &dead, "")).await;
    router
        .wait_for("every endpoint unhealthy", Duration::from_secs(10), |r| {
            r.state.pools.pools[0]
                .endpoints()
                .iter()
                .all(|e| e.health.get() == infergate::pool::Health::Unhealthy)
        })
        .await;
    let r = send_chat(&router.url(), chat_body(1000, false, 1)).await;
    assert_eq!(r.status(), 503);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "no_healthy_endpoint");
    assert_eq!(router.metric_sum("infergate_retries_total", &[]).await, 0.0);
    assert_eq!(
        router.metric_sum("infergate_pool_health_panic", &[]).await,
        0.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn departed_endpoint_series_are_deleted() {
    let eng = engines(2, SimConfig::default()).await;
    let router = start_router(&pool_yaml("load_aware", &urls(&eng), "")).await;
    router.all_healthy().await;
    for _ in 0..8 {
        post_chat(&router.url(), chat_body(1000, false, 1)).await;
    }
    let gone = eng[1].addr.to_string();
    let m = router.metrics_text().await;
    assert!(m.contains(&format!("endpoint=\"{gone}\"")));
    // The reload path: the same config without the second endpoint.
    let reduced = pool_yaml("load_aware", &urls(&eng[..1]), "")
        .replace("{listen}", &router.addr.to_string())
        .replace("{metrics}", &router.metrics_addr.to_string());
    let cfg =
        infergate::config::Config::parse(std::path::Path::new("reload.yaml"), &reduced).unwrap();
    router.state.reload_endpoints(&cfg);
    let m = router.metrics_text().await;
    assert!(
        !m.contains(&format!("endpoint=\"{gone}\"")),
        "series of {gone} remain:\n{m}"
    );
    assert!(m.contains(&format!("endpoint=\"{}\"", eng[0].addr)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chunked_body_over_the_limit_is_a_json_413_and_releases_everything() {
    let eng = engines(1, SimConfig::default()).await;
    let yaml = pool_yaml("load_aware", &urls(&eng), "")
        .replace("pools:", "max_body_bytes: 256KiB\npools:");
    let router = start_router(&yaml).await;
    router.ready().await;
    let body = chat_body(1024 * 1024, false, 1);
    let resp = post_json(&client(), &router.url(), CHAT)
        .body(chunked(&body, 16 * 1024))
        .send()
        .await;
    // The router answers 413 as soon as the stream passes the limit; the client may still be uploading.
    if let Ok(resp) = resp {
        assert_eq!(resp.status(), 413);
        let v: serde_json::Value = resp.json().await.unwrap();
        assert_eq!(v["error"]["code"], "request_too_large");
    }
    router.wait_idle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_h2c_upgrade_offer_is_ignored_and_never_reaches_the_engine() {
    use tokio::io::AsyncWriteExt;
    let eng = engines(1, SimConfig::default()).await;
    let router = start_router(&pool_yaml("load_aware", &urls(&eng), "")).await;
    router.all_healthy().await;
    let body = chat_body(200, false, 2);
    let mut s = tokio::net::TcpStream::connect(router.addr).await.unwrap();
    let head = format!(
        "POST {CHAT} HTTP/1.1\r\nHost: x\r\nConnection: keep-alive, Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n\
         HTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).await.unwrap();
    s.write_all(body.as_bytes()).await.unwrap();
    let got = read_raw_until(&mut s, Duration::from_secs(10), |b| {
        b.windows(4).any(|w| w == b"\r\n\r\n")
    })
    .await;
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    let seen = last_generate(&eng[0]).expect("the engine got the call");
    for (name, value) in &seen.headers {
        assert_ne!(name, "upgrade", "{:?}", seen.headers);
        assert_ne!(name, "http2-settings", "{:?}", seen.headers);
        assert!(
            !(name == "connection" && value.to_ascii_lowercase().contains("upgrade")),
            "{:?}",
            seen.headers
        );
    }
}
