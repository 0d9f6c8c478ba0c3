//! Sessions end to end: sticky turns with growth-only estimates, migration under real pressure, count_tokens
//! leaving no binding, non-streaming release at the estimated prefill end.

mod common;

use std::time::Duration;

use common::*;
use infergate::placement::estimate_tokens;
use infergate_sim::{self as sim, SimConfig};

const STATS: &str = "    sessions: { header: x-session-id, ttl: 1h, max_sessions: 1000 }\n    \
                     engine_stats: { path: /metrics, interval: 100ms }\n";

fn conversation(turns: usize) -> String {
    let mut messages =
        vec![serde_json::json!({"role": "system", "content": "You are a coding agent."})];
    for t in 0..turns {
        let words = "fn main() { println!(\"turn\"); } ".repeat(40 + t * 25);
        messages.push(serde_json::json!({"role": "user", "content": format!("turn {t}: {words}")}));
        messages.push(serde_json::json!({"role": "assistant", "content": format!("ok {t}")}));
    }
    serde_json::json!({"model": "sim-model", "stream": true, "max_tokens": 2, "messages": messages})
        .to_string()
}

async fn send_turn(router: &TestRouter, session: &str, body: &str) -> u16 {
    let r = client()
        .post(format!("{}/v1/chat/completions", router.url()))
        .header("x-session-id", session)
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    let status = r.status().as_u16();
    let _ = r.bytes().await;
    status
}

fn served_by(engines: &[sim::EngineHandle]) -> Vec<usize> {
    engines
        .iter()
        .map(|e| {
            e.requests()
                .iter()
                .filter(|r| r.path == "/v1/chat/completions")
                .count()
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_sticks_then_moves_only_under_real_pressure() {
    let mut eng = Vec::new();
    for _ in 0..3 {
        eng.push(
            sim::spawn_engine(SimConfig {
                time_scale: 0.1,
                ..SimConfig::default()
            })
            .await
            .unwrap(),
        );
    }
    let urls: Vec<String> = eng.iter().map(|e| e.url()).collect();
    let router = start_router(&pool_yaml("load_aware", &urls, STATS)).await;
    router
        .wait_for("all healthy", Duration::from_secs(10), |r| {
            r.state.pools.pools[0]
                .endpoints()
                .iter()
                .all(|e| e.health.is_healthy())
        })
        .await;

    // Five turns of one growing conversation: one endpoint serves them all while the others idle.
    let bodies: Vec<String> = (1..=6).map(conversation).collect();
    for b in &bodies[..5] {
        assert_eq!(send_turn(&router, "agent-1", b).await, 200);
    }
    let counts = served_by(&eng);
    let bound = counts
        .iter()
        .position(|&c| c == 5)
        .unwrap_or_else(|| panic!("not sticky: {counts:?}"));

    // A count_tokens call with the session header creates or resizes nothing.
    let r = client()
        .post(format!("{}/v1/messages/count_tokens", router.url()))
        .header("x-session-id", "agent-2")
        .body(bodies[5].clone())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let m = router.metrics_text().await;
    assert_eq!(
        metric_value(&m, "infergate_sessions", &["pool=\"default\""]),
        Some(1.0)
    );

    // Give the bound engine a queue with a gap of 8 requests: the next turn migrates.
    eng[bound].control.set_extra_running(6);
    eng[bound].control.set_extra_waiting(2);
    tokio::time::sleep(Duration::from_millis(500)).await; // a few scrape intervals
    assert_eq!(send_turn(&router, "agent-1", &bodies[5]).await, 200);
    let after = served_by(&eng);
    assert_eq!(
        after[bound], 5,
        "the sixth turn left the queued endpoint: {after:?}"
    );
    router.wait_idle().await;

    let m = router.metrics_text().await;
    let reason = |r: &str| {
        metric_sum(
            &m,
            "infergate_placements_total",
            &[&format!("reason=\"{r}\"")],
        )
    };
    assert_eq!(
        (reason("new_session"), reason("sticky"), reason("migrate")),
        (1.0, 4.0, 1.0)
    );
    // Growth-only estimates: the first turn whole, then each turn's growth, then the migrated turn whole.
    let est = |b: usize| estimate_tokens(b as u64, 4.0, 262_144);
    let mut expected = est(bodies[0].len());
    for w in bodies[..5].windows(2) {
        expected += est(w[1].len() - w[0].len());
    }
    expected += est(bodies[5].len());
    assert_eq!(
        metric_sum(&m, "infergate_prefill_tokens_estimated_total", &[]),
        expected as f64
    );
    assert_eq!(
        metric_sum(&m, "infergate_endpoint_prefill_tokens", &[]),
        0.0
    );
    assert_eq!(
        metric_sum(&m, "infergate_endpoint_requests_in_flight", &[]),
        0.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_streaming_tokens_are_released_at_the_estimated_prefill_end() {
    let cfg = SimConfig {
        prefill_tokens_per_sec: 25_000.0,
        ..SimConfig::default()
    };
    let eng = sim::spawn_engine(cfg).await.unwrap();
    let router = start_router(&pool_yaml("load_aware", &[eng.url()], "")).await;
    router
        .wait_for("healthy", Duration::from_secs(10), |r| {
            r.state.pools.any_healthy()
        })
        .await;
    // A streaming request teaches the router this endpoint's prefill speed.
    let r = client()
        .post(format!("{}/v1/chat/completions", router.url()))
        .body(chat_body(60_000, true, 1))
        .send()
        .await
        .unwrap();
    let _ = r.bytes().await;
    assert!(router.state.pools.pools[0].endpoints()[0]
        .prefill_speed
        .estimate(1000)
        .is_some());
    // A non-streaming request with a long generation: its body comes only at the end.
    let c = client();
    let url = format!("{}/v1/chat/completions", router.url());
    let pending = tokio::spawn(async move {
        let r = c
            .post(url)
            .body(chat_body(60_000, false, 150))
            .send()
            .await
            .unwrap();
        r.bytes().await.map(|b| b.len())
    });
    router
        .wait_for("tokens held", Duration::from_secs(5), |r| {
            r.endpoint_load(0).0 > 0
        })
        .await;
    router
        .wait_for("tokens released", Duration::from_secs(20), |r| {
            r.endpoint_load(0).0 == 0
        })
        .await;
    assert_eq!(
        router.endpoint_load(0).1,
        1,
        "released while the response is still being generated"
    );
    assert!(pending.await.unwrap().unwrap() > 0);
    router.wait_idle().await;
}
