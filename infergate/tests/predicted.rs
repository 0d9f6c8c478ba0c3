//! predicted_ttft end to end with engine-sim: it learns each endpoint's prefill throughput, then places by
//! predicted time to first token, keeps sessions where their cache is, and exports how far off its predictions
//! were.

mod common;

use std::time::Duration;

use common::*;
use infergate_sim::SimConfig;

fn body(system: &str, user: &str, max_tokens: u32) -> String {
    serde_json::json!({
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
        "model": "sim-model", "stream": true, "max_tokens": max_tokens,
    })
    .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_stay_with_their_cache_and_predictions_are_measured() {
    let eng = engines(2, slow_prefill()).await;
    let extra = format!("{}{ENGINE_STATS}", sessions_yaml(1000));
    let router = start_router(&pool_yaml("predicted_ttft", &urls(&eng), &extra)).await;
    router.all_healthy().await;
    router.learn_both_throughputs().await;
    let learned = |m: &str| {
        eng.iter().all(|e| {
            let ep = format!("endpoint=\"{}\"", e.addr);
            metric_value(
                m,
                "infergate_endpoint_ttft_throughput_tokens_per_second",
                &[&ep],
            )
            .is_some_and(|t| t > 0.0)
        })
    };
    router.metrics_when(learned).await;
    let system = "You are a coding agent with these tools: read, write, run. ".repeat(200);
    // Six sessions of three turns, one after another, every one placed by prediction.
    for s in 0..6 {
        let mut history = format!("session {s}: ") + &"the task at hand in detail; ".repeat(150);
        for turn in 0..3 {
            history.push_str(&format!(" turn {turn} adds more words to the conversation"));
            let status =
                post_chat_in_session(&router.url(), &format!("s{s}"), body(&system, &history, 4))
                    .await;
            assert_eq!(status, 200);
        }
    }
    let m = router
        .metrics_when(|m| {
            metric_sum(m, "infergate_placements_total", &[]) >= 20.0
                && metric_sum(m, "infergate_ttft_prediction_error_seconds_count", &[]) >= 1.0
        })
        .await;
    let reason = |r: &str| {
        metric_sum(
            &m,
            "infergate_placements_total",
            &[&format!("reason=\"{r}\"")],
        )
    };
    assert_eq!(reason("new_session"), 6.0, "{m}");
    assert_eq!(
        reason("sticky"),
        12.0,
        "idle engines: no session moves\n{m}"
    );
    // Once both throughputs were learned, placements were predicted and their error observed.
    let predicted = metric_sum(&m, "infergate_ttft_prediction_error_seconds_count", &[]);
    assert!(predicted >= 18.0, "{m}");
    // With sequential traffic the prediction is a prefill time: off by well under a second either way.
    let sum = metric_sum(&m, "infergate_ttft_prediction_error_seconds_sum", &[]);
    assert!(
        (sum / predicted).abs() < 1.0,
        "mean error {}",
        sum / predicted
    );
    // The line it predicts with, per endpoint: a throughput and a non-negative overhead.
    for e in &eng {
        let ep = format!("endpoint=\"{}\"", e.addr);
        let tps = metric_value(
            &m,
            "infergate_endpoint_ttft_throughput_tokens_per_second",
            &[&ep],
        );
        assert!(tps.is_some_and(|t| t > 0.0), "{m}");
        let overhead = metric_value(&m, "infergate_endpoint_ttft_overhead_seconds", &[&ep]);
        assert!(overhead.is_some_and(|o| (0.0..10.0).contains(&o)), "{m}");
    }
    router.wait_idle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_prediction_error_series_exist_from_start() {
    let eng = engines(2, time_scaled(0.1)).await;
    let router = start_router(&pool_yaml("predicted_ttft", &urls(&eng), "")).await;
    router.all_healthy().await;
    let m = router.metrics_text().await;
    for e in &eng {
        let ep = format!("endpoint=\"{}\"", e.addr);
        assert_eq!(
            metric_value(&m, "infergate_ttft_prediction_error_seconds_count", &[&ep]),
            Some(0.0),
            "{m}"
        );
        // Nothing learned yet: no line to show (not a zero that reads as an infinitely slow engine); no engine
        // stats: no load placed elsewhere to show (unknown, not zero).
        for name in [
            "infergate_endpoint_ttft_throughput_tokens_per_second",
            "infergate_endpoint_ttft_overhead_seconds",
            "infergate_endpoint_foreign_requests",
        ] {
            assert_eq!(metric_value(&m, name, &[&ep]), None, "{name}");
        }
        for r in ["predicted", "load_aware"] {
            assert_eq!(
                metric_value(
                    &m,
                    "infergate_placements_total",
                    &[&ep, &format!("reason=\"{r}\"")]
                ),
                Some(0.0)
            );
        }
    }
    // Without sessions, before throughputs are learned: placed as load_aware.
    assert_eq!(
        post_chat(&router.url(), chat_body(2000, true, 4)).await,
        200
    );
    let m = router
        .metrics_when(|m| metric_sum(m, "infergate_placements_total", &[]) >= 1.0)
        .await;
    assert_eq!(
        metric_sum(&m, "infergate_placements_total", &["reason=\"load_aware\""]),
        1.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_leaves_an_engine_another_tenant_floods() {
    // Two running sequences per engine, so that a flood queues where the engine stats show it.
    let cfg = SimConfig {
        max_num_seqs: 2,
        ..slow_prefill()
    };
    let eng = engines(2, cfg).await;
    let extra = format!("{}{ENGINE_STATS}", sessions_yaml(1000));
    let router = start_router(&pool_yaml("predicted_ttft", &urls(&eng), &extra)).await;
    router.all_healthy().await;
    router.learn_both_throughputs().await;
    let url = router.url();
    let system = "You are a coding agent with these tools: read, write, run. ".repeat(200);
    let mut history = "the task at hand in detail; ".repeat(150);
    let before: Vec<usize> = eng.iter().map(chat_requests).collect();
    let turn = |history: &str| post_chat_in_session(&url, "s", body(&system, history, 4));
    assert_eq!(turn(&history).await, 200);
    let bound = (0..2)
        .find(|&i| chat_requests(&eng[i]) > before[i])
        .unwrap();
    // Another tenant sends five ~25k-token requests straight to the session's engine: two run, three wait.
    let c = client();
    let mut flood = tokio::task::JoinSet::new();
    for k in 0..5 {
        let req = post_json(&c, &eng[bound].url(), CHAT).body(body(
            "another tenant",
            &(format!("flood {k} ") + &"words from elsewhere ".repeat(5000)),
            2000,
        ));
        flood.spawn(async move {
            finish(req.send().await?).await;
            Ok::<(), reqwest::Error>(())
        });
    }
    router
        .wait_for(
            "the router's engine stats see the queue",
            Duration::from_secs(10),
            |r| {
                let now = std::time::Instant::now();
                r.state.pools.pools[0].endpoints()[bound]
                    .stats
                    .fresh(now)
                    .is_some_and(|l| l.waiting >= 2)
            },
        )
        .await;
    // The load placed elsewhere is exported per endpoint.
    let bound_ep = format!("endpoint=\"{}\"", eng[bound].addr);
    router
        .metrics_when(|m| {
            metric_value(m, "infergate_endpoint_foreign_requests", &[&bound_ep])
                .is_some_and(|n| n >= 4.0)
        })
        .await;
    // The next turn would wait behind the flood's prefill: it moves, and its conversation is recomputed there.
    history.push_str(" one more turn");
    let before: Vec<usize> = eng.iter().map(chat_requests).collect();
    assert_eq!(turn(&history).await, 200);
    assert_eq!(chat_requests(&eng[1 - bound]), before[1 - bound] + 1);
    let m = router.metrics_text().await;
    assert_eq!(
        metric_sum(&m, "infergate_placements_total", &["reason=\"migrate\""]),
        1.0,
        "{m}"
    );
    flood.abort_all();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn predicted_ttft_splits_a_burst_on_equally_busy_engines_evenly() {
    assert_bursts_split_evenly("predicted_ttft").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn predicted_ttft_sends_a_burst_to_the_engine_idle_of_load_placed_elsewhere() {
    // 4/4 before load placed elsewhere counted as prefill ahead: the streams were decoding.
    assert_bursts_prefer_the_idle_engine("predicted_ttft").await;
}
