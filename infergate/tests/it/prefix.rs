//! prefix_aware end to end with engine-sim, and engine-stats states as the router exports them.

use std::time::Duration;

use crate::common::*;
use infergate_sim::SimConfig;

fn body(system: &str, user: &str, max_tokens: u32) -> String {
    serde_json::json!({
        "model": "sim-model", "stream": true, "max_tokens": max_tokens,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
    })
    .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_system_prompt_does_not_pin_all_traffic_to_one_endpoint() {
    let eng = engines(2, time_scaled(0.2)).await;
    let extra = format!("{PREFIX}{ENGINE_STATS}");
    let router = start_router(&pool_yaml("prefix_aware", &urls(&eng), &extra)).await;
    router.all_healthy().await;
    let system =
        "You are a helpful assistant that answers questions about the codebase. ".repeat(20);
    let c = client();
    let mut tasks = tokio::task::JoinSet::new();
    // Each answer lasts about 1.5 s (400 steps of 3.6 ms), several times the 0.5 s it takes to send all 16, so
    // the prefix holder's load passes the gate however slowly the machine runs the sends. With 40 tokens
    // (0.15 s) the holder had about five in flight, on the gate's edge, and a slow CI machine saw [14, 2].
    for i in 0..16 {
        let req = post_json(&c, &router.url(), CHAT)
            .header("x-test", format!("shared-{i}"))
            .body(body(&system, &format!("question {i}"), 400));
        tasks.spawn(async move {
            let r = req.send().await?;
            r.bytes().await.map(|_| ())
        });
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
    while let Some(r) = tasks.join_next().await {
        r.unwrap().unwrap();
    }
    let split: Vec<usize> = eng.iter().map(|e| tagged(e, "shared")).collect();
    assert_eq!(split.iter().sum::<usize>(), 16);
    assert!(
        split.iter().all(|&n| n >= 3),
        "a hot prefix pinned the traffic: {split:?}"
    );
    let m = router.metrics_text().await;
    assert!(
        metric_sum(
            &m,
            "infergate_placements_total",
            &["reason=\"prefix_gated\""]
        ) >= 1.0,
        "{m}"
    );
    router.wait_idle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_turn_sessions_keep_prefix_affinity_while_load_is_even() {
    let eng = engines(2, time_scaled(0.2)).await;
    let extra = format!("{PREFIX}{ENGINE_STATS}");
    let router = start_router(&pool_yaml("prefix_aware", &urls(&eng), &extra)).await;
    router.all_healthy().await;
    let c = client();
    for s in 0..4 {
        let mut history =
            format!("session {s} opening context: ") + &"details of the task at hand; ".repeat(30);
        for turn in 0..4 {
            history.push_str(&format!(" turn {turn} more words"));
            let r = post_json(&c, &router.url(), CHAT)
                .header("x-test", format!("s{s}"))
                .body(body("agent", &history, 2))
                .send()
                .await
                .unwrap();
            assert_eq!(finish(r).await, 200);
        }
        let per_engine: Vec<usize> = eng.iter().map(|e| tagged(e, &format!("s{s}"))).collect();
        assert!(
            per_engine.contains(&4),
            "session {s} lost its affinity: {per_engine:?}"
        );
    }
    assert_eq!(
        router
            .metric_sum("infergate_placements_total", &["reason=\"prefix_hit\""])
            .await,
        12.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_system_prompt_sent_after_the_messages_still_matches_across_sessions() {
    // As the anthropic SDK serialises a request (keys in alphabetical order): `system` after `messages`. The
    // engine renders the system prompt first, so sessions sharing it share a cached prefix. Claude Code opens the
    // system prompt with an attribution block whose hashes change per conversation and per request (vLLM drops
    // it before rendering).
    let eng = engines(2, time_scaled(0.2)).await;
    let router = start_router(&pool_yaml("prefix_aware", &urls(&eng), PREFIX)).await;
    router.all_healthy().await;
    let system = "You are a coding agent working in a large repository. ".repeat(20);
    let c = client();
    for i in 0..6 {
        let body = serde_json::json!({
            "max_tokens": 2,
            "messages": [{"role": "user", "content": format!("task {i}: fix the failing test number {i}")}],
            "model": "sim-model",
            "stream": true,
            "system": [
                {"type": "text", "text": format!(
                    "x-anthropic-billing-header: cc_version=2.1.119.{i:03x}; cc_entrypoint=cli; cch={:05x};",
                    fastrand::u32(..0xfffff)
                )},
                {"type": "text", "text": system, "cache_control": {"type": "ephemeral"}},
            ],
        });
        let r = post_json(&c, &router.url(), "/v1/messages")
            .body(body.to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(finish(r).await, 200);
    }
    let reason = |r: &'static str| {
        let router = &router;
        async move {
            router
                .metric_sum("infergate_placements_total", &[&format!("reason=\"{r}\"")])
                .await
        }
    };
    assert_eq!(
        (reason("prefix_hit").await, reason("prefix_miss").await),
        (5.0, 1.0),
        "the sessions after the first did not find the shared system prompt"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mis_prefixed_engine_is_missing_not_idle() {
    let good = engine(SimConfig::default()).await;
    let bad = engine(SimConfig {
        metric_prefix: "vllm_".into(),
        ..SimConfig::default()
    })
    .await;
    let router = start_router(&pool_yaml(
        "load_aware",
        &[good.url(), bad.url()],
        ENGINE_STATS,
    ))
    .await;
    router.all_healthy().await;
    let (g, b) = (good.addr.to_string(), bad.addr.to_string());
    router
        .wait_for("stats states settle", Duration::from_secs(10), |r| {
            let now = std::time::Instant::now();
            let eps = r.state.pools.pools[0].endpoints();
            eps[0].stats.state(now).as_str() == "fresh"
                && eps[1].stats.state(now).as_str() == "missing"
        })
        .await;
    let m = router.metrics_text().await;
    let state = |ep: &str, st: &str| {
        metric_value(
            &m,
            "infergate_engine_stats_state",
            &[&format!("endpoint=\"{ep}\""), &format!("state=\"{st}\"")],
        )
    };
    assert_eq!(state(&g, "fresh"), Some(1.0));
    assert_eq!(state(&b, "missing"), Some(1.0));
    assert_eq!(state(&b, "fresh"), Some(0.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_on_equally_busy_engines_splits_evenly() {
    // 4/4 every time: placements hold the pool's placing lock from snapshot to hold, so two on the router's two
    // worker threads cannot read the same counts (before that lock a loaded full-suite run once gave 5/3).
    assert_bursts_split_evenly("prefix_aware").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_burst_goes_to_the_engine_idle_of_load_placed_elsewhere() {
    // 4/4 before seed 003's fix.
    assert_bursts_prefer_the_idle_engine("prefix_aware").await;
}
