//! Real engines' faults: an engine that answers 503 is no blackhole, a slow engine never gets the same
//! generation twice, a stale pooled connection keeps a session on its engine, and only success teaches.

use std::time::Duration;

use crate::common::*;
use infergate_sim::SimConfig;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_answering_503_is_not_a_blackhole() {
    let eng = engines(3, SimConfig::default()).await;
    eng[0].control.set_fail_status(Some(503));
    let router = start_router(&pool_yaml("load_aware", &urls(&eng), "")).await;
    router.all_healthy().await;
    let mut tasks = tokio::task::JoinSet::new();
    for w in 0..4 {
        let url = router.url();
        tasks.spawn(async move {
            let mut statuses = Vec::new();
            for i in 0..15 {
                statuses.push(post_chat(&url, chat_body(300 + w * 10 + i, false, 2)).await);
            }
            statuses
        });
    }
    let mut failed = 0;
    while let Some(r) = tasks.join_next().await {
        failed += r.unwrap().iter().filter(|s| **s != 200).count();
    }
    assert_eq!(
        failed, 0,
        "no client request fails while other engines are healthy"
    );
    // Before: load_aware sent nearly all traffic to the engine that fails fastest.
    let to_bad = generate_requests(&eng[0]);
    assert!(
        to_bad <= 6,
        "the failing engine received {to_bad} of 60 requests"
    );
    router.wait_idle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_answering_500_is_ejected_after_three_failures() {
    let eng = engines(3, SimConfig::default()).await;
    eng[0].control.set_fail_status(Some(500));
    // Without the failures' debt, which would keep load_aware off it before a third failure (black_holes.rs).
    let no_debt = "    outlier_detection: { failure_penalty: 0s }\n";
    let router = start_router(&pool_yaml("load_aware", &urls(&eng), no_debt)).await;
    router.all_healthy().await;
    let mut failed = 0;
    for i in 0..40 {
        if post_chat(&router.url(), chat_body(300 + i, false, 2)).await != 200 {
            failed += 1;
        }
    }
    // A 500 is passed back (the engine may have started the work), but only until the endpoint is ejected.
    let to_bad = generate_requests(&eng[0]);
    assert!(
        to_bad <= 3,
        "the failing engine received {to_bad} of 40 requests"
    );
    assert_eq!(failed, to_bad);
    let m = router.metrics_text().await;
    assert_eq!(
        metric_sum(&m, "infergate_endpoint_ejections_total", &[]),
        1.0
    );
    assert_eq!(metric_sum(&m, "infergate_endpoint_ejected", &[]), 1.0);
    router.wait_idle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_generation_slower_than_the_timeout_reaches_exactly_one_engine() {
    let eng = engines(3, SimConfig::default()).await;
    let yaml = pool_yaml("load_aware", &urls(&eng), "").replace(
        "response_header: 30s, stream_idle: 30s",
        "response_header: 1s, stream_idle: 1s",
    );
    let router = start_router(&yaml).await;
    router.all_healthy().await;
    // Warm pooled connections to every engine, then make every engine slow to answer.
    for i in 0..6 {
        assert_eq!(
            post_chat(&router.url(), chat_body(100 + i, false, 1)).await,
            200
        );
    }
    for e in &eng {
        e.clear_requests();
        e.control.set_slow_headers(Duration::from_millis(2500));
    }
    assert_eq!(
        post_chat(&router.url(), chat_body(5000, false, 4)).await,
        504
    );
    let received: usize = eng.iter().map(generate_requests).sum();
    assert_eq!(received, 1, "a timed-out generation is never sent again");
    // The answer goes out before Pingora's logging hook counts it: poll briefly.
    let m = router
        .metrics_when(|m| metric_sum(m, "infergate_requests_total", &["code=\"504\""]) > 0.0)
        .await;
    assert_eq!(metric_sum(&m, "infergate_retries_total", &[]), 0.0);
    assert_eq!(
        metric_sum(&m, "infergate_requests_total", &["code=\"504\""]),
        1.0
    );
    for e in &eng {
        e.control.set_slow_headers(Duration::ZERO);
    }
    router.wait_idle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_giving_up_before_headers_reaches_one_engine() {
    let eng = engines(2, SimConfig::default()).await;
    let router = start_router(&pool_yaml("load_aware", &urls(&eng), "")).await;
    router.all_healthy().await;
    for i in 0..4 {
        post_chat(&router.url(), chat_body(100 + i, false, 1)).await;
    }
    for e in &eng {
        e.clear_requests();
        e.control.set_slow_headers(Duration::from_millis(1500));
    }
    let r = post_json(&client(), &router.url(), CHAT)
        .body(chat_body(2000, false, 4))
        .timeout(Duration::from_millis(300))
        .send()
        .await;
    assert!(r.is_err(), "the client gave up");
    tokio::time::sleep(Duration::from_millis(2000)).await;
    let received: usize = eng.iter().map(generate_requests).sum();
    assert_eq!(received, 1);
    router.wait_idle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_pooled_connection_is_retried_on_the_same_engine_and_the_session_stays() {
    let eng = engines(2, SimConfig::default()).await;
    let router = start_router(&pool_yaml("load_aware", &urls(&eng), &sessions_yaml(100))).await;
    router.all_healthy().await;
    assert_eq!(
        post_chat_in_session(&router.url(), "s1", chat_body(3000, true, 2)).await,
        200
    );
    let bound = if generate_requests(&eng[0]) == 1 {
        0
    } else {
        1
    };
    let poisoned: usize = eng
        .iter()
        .map(|e| e.control.poison_idle_connections())
        .sum();
    assert!(poisoned >= 1, "an idle pooled connection to poison");
    assert_eq!(
        post_chat_in_session(&router.url(), "s1", chat_body(3500, true, 2)).await,
        200
    );
    assert_eq!(
        generate_requests(&eng[bound]),
        2,
        "the turn stayed on its engine"
    );
    assert_eq!(generate_requests(&eng[1 - bound]), 0);
    assert_eq!(
        router
            .metric_sum("infergate_placements_total", &["reason=\"sticky\""])
            .await,
        1.0
    );
    router.wait_idle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_4xx_teaches_nothing() {
    let eng = vec![
        engine(SimConfig {
            max_model_len: 1000,
            ..SimConfig::default()
        })
        .await,
    ];
    let router = start_router(&pool_yaml("load_aware", &urls(&eng), &sessions_yaml(100))).await;
    router.all_healthy().await;
    // Far over the engine's context: it answers 400 at once.
    assert_eq!(
        post_chat_in_session(&router.url(), "s", chat_body(60_000, true, 2)).await,
        400
    );
    router.wait_idle().await;
    let ep = router.state.pools.pools[0].endpoints()[0].clone();
    assert!(
        ep.prefill_speed.estimate(1000).is_none(),
        "no prefill speed learned from a 400"
    );
    let sessions = router.state.pools.pools[0].policy.sessions();
    assert_eq!(sessions.map(|s| s.session_count()), Some(0));
    assert_eq!(
        router
            .metric_sum("infergate_prefill_tokens_estimated_total", &[])
            .await,
        0.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_on_an_ejected_engine_falls_back_and_is_served() {
    let eng = engines(2, SimConfig::default()).await;
    let router = start_router(&pool_yaml("load_aware", &urls(&eng), &sessions_yaml(100))).await;
    router.all_healthy().await;
    assert_eq!(
        post_chat_in_session(&router.url(), "s", chat_body(2000, true, 2)).await,
        200
    );
    let bound = if generate_requests(&eng[0]) == 1 {
        0
    } else {
        1
    };
    // Its engine starts failing (health still 200): 500s eject it.
    eng[bound].control.set_fail_status(Some(500));
    let mut statuses = Vec::new();
    for i in 0..4 {
        statuses.push(
            post_chat_in_session(&router.url(), "s", chat_body(2100 + i * 100, true, 2)).await,
        );
    }
    // At most the 3 failures that eject it; then the session is placed elsewhere and served.
    assert!(
        statuses.iter().filter(|s| **s == 500).count() <= 3,
        "{statuses:?}"
    );
    assert_eq!(statuses.last(), Some(&200), "{statuses:?}");
    assert!(
        generate_requests(&eng[1 - bound]) >= 1,
        "served by the other engine"
    );
    let m = router.metrics_text().await;
    assert!(metric_sum(&m, "infergate_placements_total", &["reason=\"fallback\""]) >= 1.0);
    eng[bound].control.set_fail_status(None);
    router.wait_idle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_idle_connection_going_stale_at_once_gives_no_502() {
    let eng = engines(3, SimConfig::default()).await;
    let router = start_router(&pool_yaml("load_aware", &urls(&eng), "")).await;
    router.all_healthy().await;
    // Warm a pool of idle connections to every engine.
    let mut warm = tokio::task::JoinSet::new();
    for i in 0..30 {
        let url = router.url();
        warm.spawn(async move { post_chat(&url, chat_body(200 + i, false, 1)).await });
    }
    while warm.join_next().await.is_some() {}
    let poisoned: usize = eng
        .iter()
        .map(|e| e.control.poison_idle_connections())
        .sum();
    assert!(
        poisoned >= 3,
        "idle pooled connections to poison: {poisoned}"
    );
    // Before: retries landed on other engines' stale connections and 4-7 of 30 got 502.
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..30 {
        let url = router.url();
        tasks.spawn(async move { post_chat(&url, chat_body(300 + i, false, 1)).await });
    }
    let mut statuses = Vec::new();
    while let Some(r) = tasks.join_next().await {
        statuses.push(r.unwrap());
    }
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    router.wait_idle().await;
}
