//! Sessions end to end: sticky turns with growth-only estimates, migration under real pressure, count_tokens
//! leaving no binding, non-streaming release at the estimated prefill end.

use std::time::Duration;

use crate::common::*;
use infergate::placement::estimate_tokens;

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_sticks_then_moves_only_under_real_pressure() {
    let eng = engines(3, time_scaled(0.1)).await;
    let stats = format!("{}{ENGINE_STATS}", sessions_yaml(1000));
    let router = start_router(&pool_yaml("load_aware", &urls(&eng), &stats)).await;
    router.all_healthy().await;

    // Five turns of one growing conversation: one endpoint serves them all while the others idle.
    let bodies: Vec<String> = (1..=6).map(conversation).collect();
    for b in &bodies[..5] {
        assert_eq!(
            post_chat_in_session(&router.url(), "agent-1", b.clone()).await,
            200
        );
    }
    let counts: Vec<usize> = eng.iter().map(chat_requests).collect();
    let bound = counts
        .iter()
        .position(|&c| c == 5)
        .unwrap_or_else(|| panic!("not sticky: {counts:?}"));

    // A count_tokens call with the session header creates or resizes nothing.
    let r = post_json(&client(), &router.url(), COUNT_TOKENS)
        .header(SESSION_HEADER, "agent-2")
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
    router
        .wait_engine_stats(
            bound,
            "the router's scrapes see the queue",
            |running, waiting| running >= 6 && waiting >= 2,
        )
        .await;
    assert_eq!(
        post_chat_in_session(&router.url(), "agent-1", bodies[5].clone()).await,
        200
    );
    let after: Vec<usize> = eng.iter().map(chat_requests).collect();
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
    assert_load_gauges_at_zero(&m);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_streaming_tokens_are_released_at_the_estimated_prefill_end() {
    let eng = engine(slow_prefill()).await;
    let router = start_router(&pool_yaml("load_aware", &[eng.url()], "")).await;
    router.ready().await;
    // A streaming request teaches the router this endpoint's prefill speed.
    post_chat(&router.url(), chat_body(60_000, true, 1)).await;
    // Learned once the request has ended (its logging hook), just after the client has the whole answer.
    router
        .wait_for("the prefill speed learned", Duration::from_secs(5), |r| {
            r.state.pools.pools[0].endpoints()[0]
                .prefill_speed
                .estimate(1000)
                .is_some()
        })
        .await;
    // A non-streaming request with a long generation: its body comes only at the end.
    let req = post_json(&client(), &router.url(), CHAT).body(chat_body(60_000, false, 150));
    let pending = tokio::spawn(async move {
        let r = req.send().await.unwrap();
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_listed_session_header_a_request_carries_names_its_session() {
    let eng = engines(2, time_scaled(0.1)).await;
    // SDK clients send x-session-id; Claude Code sends x-claude-code-session-id on every request.
    let sessions = "    sessions: { header: [x-session-id, X-Claude-Code-Session-Id], ttl: 1h }\n";
    let router = start_router(&pool_yaml("load_aware", &urls(&eng), sessions)).await;
    router.all_healthy().await;
    let send = |headers: &'static [(&'static str, &'static str)]| {
        let mut req = post_json(&client(), &router.url(), CHAT).body(conversation(1));
        for (name, value) in headers {
            req = req.header(*name, *value);
        }
        async move { finish(req.send().await.expect("response")).await }
    };

    // The second listed header alone names a session.
    assert_eq!(send(&[("x-claude-code-session-id", "cc-1")]).await, 200);
    // Both: the first listed wins, a second session.
    const BOTH: &[(&str, &str)] = &[
        ("x-claude-code-session-id", "cc-1"),
        ("x-session-id", "sdk-1"),
    ];
    assert_eq!(send(BOTH).await, 200);
    // An empty first header is no session id: the next listed one names it (cc-1 again, sticky).
    const EMPTY_FIRST: &[(&str, &str)] =
        &[("x-session-id", ""), ("x-claude-code-session-id", "cc-1")];
    assert_eq!(send(EMPTY_FIRST).await, 200);
    router.wait_idle().await;

    let m = router.metrics_text().await;
    assert_eq!(metric_value(&m, "infergate_sessions", &[]), Some(2.0));
    let reason = |r: &str| {
        let label = format!("reason=\"{r}\"");
        metric_sum(&m, "infergate_placements_total", &[&label])
    };
    assert_eq!(
        [
            reason("new_session"),
            reason("sticky"),
            reason("headerless")
        ],
        [2.0, 1.0, 0.0]
    );
}

/// `conversation(turns)` with a top-level `prompt_cache_key`, first or last in the body.
fn keyed_conversation(turns: usize, key: &str, key_first: bool) -> String {
    let body = conversation(turns);
    let key = serde_json::to_string(key).unwrap();
    if key_first {
        body.replacen('{', &format!("{{\"prompt_cache_key\":{key},"), 1)
    } else {
        format!("{},\"prompt_cache_key\":{key}}}", &body[..body.len() - 1])
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prompt_cache_key_names_the_session_of_a_request_without_a_session_header() {
    let eng = engines(3, time_scaled(0.1)).await;
    let on = "    sessions: { prompt_cache_key: true }\n";
    let router = start_router(&pool_yaml("predicted_ttft", &urls(&eng), on)).await;
    router.all_healthy().await;
    let send = |body: String, header: Option<&'static str>| {
        let mut req = post_json(&client(), &router.url(), CHAT).body(body);
        if let Some(h) = header {
            req = req.header(SESSION_HEADER, h);
        }
        async move { finish(req.send().await.expect("response")).await }
    };

    // Five turns of one conversation keyed in the body (the key before and after `messages`): one engine.
    for turn in 1..=5 {
        let body = keyed_conversation(turn, "thread-7", turn % 2 == 0);
        assert_eq!(send(body, None).await, 200);
    }
    let counts: Vec<usize> = eng.iter().map(chat_requests).collect();
    assert!(counts.contains(&5), "not one engine: {counts:?}");
    // A session header wins over the body's key: a second session.
    assert_eq!(
        send(keyed_conversation(1, "thread-7", false), Some("sdk-9")).await,
        200
    );
    // An empty key names nothing.
    assert_eq!(send(keyed_conversation(1, "", false), None).await, 200);
    router.wait_idle().await;
    let m = router.metrics_text().await;
    assert_eq!(metric_value(&m, "infergate_sessions", &[]), Some(2.0));
    let reason = |r: &str| {
        let label = format!("reason=\"{r}\"");
        metric_sum(&m, "infergate_placements_total", &[&label])
    };
    assert_eq!(reason("new_session"), 2.0);
    assert_eq!(reason("headerless"), 1.0);

    // Off (the default): the key is not a session.
    let off = start_router(&pool_yaml(
        "predicted_ttft",
        &urls(&eng),
        &sessions_yaml(100),
    ))
    .await;
    off.all_healthy().await;
    let req = post_json(&client(), &off.url(), CHAT).body(keyed_conversation(1, "thread-8", true));
    assert_eq!(finish(req.send().await.expect("response")).await, 200);
    off.wait_idle().await;
    let m = off.metrics_text().await;
    assert_eq!(metric_value(&m, "infergate_sessions", &[]), Some(0.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claude_code_turn_counts_its_growth_although_its_attribution_block_changes() {
    let eng = engines(2, time_scaled(0.1)).await;
    // The default session headers, Claude Code's among them.
    let sessions = "    sessions: { ttl: 1h }\n";
    let router = start_router(&pool_yaml("load_aware", &urls(&eng), sessions)).await;
    router.all_healthy().await;
    let system = "You are Claude Code, working in a large repository. ".repeat(400);
    // Claude Code's request shape: model first, then messages, then system blocks, the first of which carries a
    // hash that changes with every request.
    let turn = |messages: serde_json::Value, cch: &str| {
        serde_json::json!({
            "model": "sim-model", "messages": messages, "stream": true, "max_tokens": 2,
            "system": [
                {"type": "text", "text": format!("x-anthropic-billing-header: cc_version=2.1.119.af2; cc_entrypoint=cli; cch={cch};")},
                {"type": "text", "text": system, "cache_control": {"type": "ephemeral"}},
            ],
        })
        .to_string()
    };
    let first = turn(
        serde_json::json!([{"role": "user", "content": "fix the failing test"}]),
        "97bd6",
    );
    let second = turn(
        serde_json::json!([
            {"role": "user", "content": "fix the failing test"},
            {"role": "assistant", "content": "done"},
            {"role": "user", "content": "now run it"},
        ]),
        "24c2d",
    );
    for (body, session) in [(&first, "cc-1"), (&second, "cc-1")] {
        let r = post_json(&client(), &router.url(), "/v1/messages")
            .header("x-claude-code-session-id", session)
            .body(body.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(finish(r).await, 200);
    }
    router.wait_idle().await;
    let total = router
        .metric_sum("infergate_prefill_tokens_estimated_total", &[])
        .await;
    // The first turn whole, the second only its growth: about the second body's size in all, not both bodies.
    let growth_only = (second.len() as f64 / 4.0).ceil();
    assert!(
        total <= growth_only + 16.0,
        "estimated {total} tokens for turns of {} and {} bytes: the second turn was counted whole",
        first.len(),
        second.len()
    );
    assert_eq!(
        router
            .metric_sum("infergate_placements_total", &["reason=\"sticky\""])
            .await,
        1.0
    );
}
