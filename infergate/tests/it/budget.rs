//! TTFT budgets end to end with engine-sim: a request no endpoint is predicted to serve within its budget gets 429
//! with Retry-After from the prediction (`when_over: reject`) or waits at the router until one is
//! (`when_over: wait`), or is placed anyway (`when_over: place`); the header can only tighten the budget; outcomes
//! are counted per pool and key.

use std::time::{Duration, Instant};

use crate::common::*;

/// A streamed chat request with `bytes` of prompt and the budget header, if any.
async fn send(url: &str, bytes: usize, budget_ms: Option<&str>) -> reqwest::Response {
    let mut req = post_json(&client(), url, CHAT).body(chat_body(bytes, true, 4));
    if let Some(b) = budget_ms {
        req = req.header("x-infergate-ttft-budget-ms", b);
    }
    req.send().await.expect("response")
}

fn budget_count(m: &str, outcome: &str) -> f64 {
    metric_sum(
        m,
        "infergate_ttft_budget_total",
        &[&format!("outcome=\"{outcome}\"")],
    )
}

/// Two engines of slow prefill behind a healthy predicted_ttft pool whose `ttft_budget` is `budget` (a YAML flow
/// mapping).
async fn budget_pool(budget: &str) -> (Vec<infergate_sim::EngineHandle>, TestRouter) {
    let eng = engines(2, slow_prefill()).await;
    let extra = format!("    ttft_budget: {budget}\n");
    let router = start_router(&pool_yaml("predicted_ttft", &urls(&eng), &extra)).await;
    router.all_healthy().await;
    (eng, router)
}

/// Start two long prefills (about 3 s each on `slow_prefill` engines), one per endpoint, and return once both
/// hold their tokens.
async fn occupy_both(router: &TestRouter) -> Vec<tokio::task::JoinHandle<u16>> {
    let url = router.url();
    let long: Vec<_> = (0..2)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(async move { post_chat(&url, chat_body(300_000, true, 4)).await })
        })
        .collect();
    let start = std::time::Instant::now();
    let eps = || router.state.pools.pools[0].endpoints();
    while !eps().iter().all(|e| e.load.prefill_tokens() > 50_000) {
        // Which endpoints the two went to, and the speeds placement priced them with.
        let seen: Vec<String> = eps()
            .iter()
            .map(|e| {
                format!(
                    "{}: {} prefill tokens, {} requests, throughput {:?}",
                    e.label,
                    e.load.prefill_tokens(),
                    e.load.requests(),
                    e.prefill_speed.throughput()
                )
            })
            .collect();
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "both prefills not held within 10 s: {seen:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    long
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_no_endpoint_can_serve_in_time_is_refused_with_the_prediction() {
    let (eng, router) = budget_pool("{ default: 20s, when_over: reject }").await;
    // Before the speeds are learned nothing is predicted and nothing enforced.
    assert_eq!(
        finish(send(&router.url(), 2_000, Some("1")).await).await,
        200
    );
    router.learn_both_throughputs().await;
    // Idle engines: a short prompt fits a 2 s budget.
    assert_eq!(
        finish(send(&router.url(), 2_000, Some("2000")).await).await,
        200
    );
    // A malformed header is the client's error.
    let r = send(&router.url(), 2_000, Some("soon")).await;
    assert_eq!(r.status(), 400);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "invalid_ttft_budget");
    // Both engines are busy with a 3 s prefill: a 500 ms budget fits nowhere.
    let before = chat_requests(&eng[0]) + chat_requests(&eng[1]);
    let long = occupy_both(&router).await;
    let r = send(&router.url(), 2_000, Some("500")).await;
    assert_eq!(r.status(), 429);
    let retry: u64 = header(&r, "retry-after").unwrap().parse().unwrap();
    assert!((1..=10).contains(&retry), "{retry}");
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "ttft_budget_exceeded");
    for h in long {
        assert_eq!(h.await.unwrap(), 200);
    }
    assert_eq!(
        chat_requests(&eng[0]) + chat_requests(&eng[1]),
        before + 2,
        "the engines saw the two long requests only"
    );
    let m = router
        .metrics_when(|m| budget_count(m, "rejected") >= 1.0)
        .await;
    // The first request and the two that taught the speeds.
    assert_eq!(budget_count(&m, "unpredicted"), 3.0, "{m}");
    assert!(budget_count(&m, "met") >= 1.0, "{m}");
    assert_eq!(
        metric_value(
            &m,
            "infergate_ttft_budget_total",
            &["pool=\"default\"", "key=\"-\"", "outcome=\"rejected\""]
        ),
        Some(1.0),
        "{m}"
    );
    router.wait_idle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_waits_at_the_router_until_a_prediction_fits() {
    let (_eng, router) = budget_pool("{ when_over: wait, max_wait: 20s }").await;
    router.learn_both_throughputs().await;
    let long = occupy_both(&router).await;
    let t0 = Instant::now();
    // 1 s: it waits until an engine's queue has drained enough, then goes, while the long prompt there is still
    // prefilling (what the engine has computed of it is no longer ahead).
    let r = send(&router.url(), 2_000, Some("1000")).await;
    assert_eq!(r.status(), 200);
    assert!(t0.elapsed() > Duration::from_millis(300), "it waited");
    let held: Vec<u64> = router.state.pools.pools[0]
        .endpoints()
        .iter()
        .map(|e| e.load.prefill_tokens())
        .collect();
    assert!(
        held.iter().all(|&t| t > 50_000),
        "it went before the prompts ahead reached their first byte: {held:?} after {:?}",
        t0.elapsed()
    );
    assert_eq!(finish(r).await, 200);
    // A new prompt (no endpoint holds any of it) whose own prefill, about 3 s, can never fit 1.5 s is refused at
    // once, without Retry-After.
    let fresh = serde_json::json!({
        "model": "sim-model", "stream": true, "max_tokens": 4,
        "messages": [{"role": "user", "content": "quite another text ".repeat(16_000)}],
    });
    let r = post_json(&client(), &router.url(), CHAT)
        .header("x-infergate-ttft-budget-ms", "1500")
        .body(fresh.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 429);
    assert_eq!(header(&r, "retry-after"), None);
    for h in long {
        assert_eq!(h.await.unwrap(), 200);
    }
    let m = router
        .metrics_when(|m| budget_count(m, "waited") >= 1.0)
        .await;
    assert_eq!(budget_count(&m, "rejected"), 1.0, "{m}");
    assert_eq!(budget_count(&m, "timed_out"), 0.0, "{m}");
    router.wait_idle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_when_over_place_a_request_no_endpoint_fits_is_served_and_counted_over() {
    let (_eng, router) = budget_pool("{ default: 20s, when_over: place }").await;
    router.learn_both_throughputs().await;
    // Idle engines: it fits and is met.
    assert_eq!(
        finish(send(&router.url(), 2_000, Some("2000")).await).await,
        200
    );
    // Both engines busy with a 3 s prefill: 500 ms fits nowhere; it is placed anyway and served.
    let long = occupy_both(&router).await;
    let r = send(&router.url(), 2_000, Some("500")).await;
    assert_eq!(r.status(), 200);
    assert_eq!(finish(r).await, 200);
    for h in long {
        assert_eq!(h.await.unwrap(), 200);
    }
    let m = router
        .metrics_when(|m| budget_count(m, "over") >= 1.0)
        .await;
    assert_eq!(budget_count(&m, "over"), 1.0, "{m}");
    assert!(budget_count(&m, "met") >= 1.0, "{m}");
    assert_eq!(budget_count(&m, "rejected"), 0.0, "{m}");
    router.wait_idle().await;
}
