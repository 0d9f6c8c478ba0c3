//! Disaggregated pools: a prefill leg on the prefill set, then the decode leg with the prefill's
//! `kv_transfer_params`, against engine-sim playing both roles of vLLM's NixlConnector.

use std::time::Duration;

use infergate_sim::{EngineHandle, SimConfig};

use crate::common::*;

/// Engines that speak the NixlConnector round trip, at `time_scale`.
fn nixl(time_scale: f64) -> SimConfig {
    SimConfig {
        kv_transfer: true,
        time_scale,
        ..SimConfig::default()
    }
}

/// A router with one disaggregated pool `pd` (every model): `decode` are its endpoints, `prefill` its prefill
/// set; `prefill_extra` and `extra` are appended to the prefill set and the pool (indented as their keys).
fn disagg_yaml(prefill: &[String], decode: &[String], prefill_extra: &str, extra: &str) -> String {
    let list = |urls: &[String]| {
        urls.iter()
            .map(|u| format!("\"{u}\""))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let checks =
        "{ path: /health, interval: 200ms, timeout: 500ms, healthy_after: 1, unhealthy_after: 1 }";
    format!(
        "listen: \"{{listen}}\"\nmetrics_listen: \"{{metrics}}\"\n\
         timeouts: {{ connect: 1s, response_header: 30s, stream_idle: 30s }}\n\
         pools:\n  - name: pd\n    models: [\"*\"]\n    endpoints: [{}]\n    health_check: {checks}\n{extra}\
         \x20   disaggregation:\n      connector: nixl\n      prefill:\n        endpoints: [{}]\n        \
         health_check: {checks}\n{prefill_extra}",
        list(decode),
        list(prefill)
    )
}

struct Fleet {
    prefill: Vec<EngineHandle>,
    decode: Vec<EngineHandle>,
    router: TestRouter,
}

async fn fleet(p: usize, d: usize, cfg: SimConfig, prefill_extra: &str, extra: &str) -> Fleet {
    fleet_with(p, d, cfg, prefill_extra, extra, "").await
}

/// `fleet`, with `top` appended at the config's top level.
async fn fleet_with(
    p: usize,
    d: usize,
    cfg: SimConfig,
    prefill_extra: &str,
    extra: &str,
    top: &str,
) -> Fleet {
    let prefill = engines(p, cfg.clone()).await;
    let decode = engines(d, cfg).await;
    let yaml = disagg_yaml(&urls(&prefill), &urls(&decode), prefill_extra, extra);
    let router = start_router(&format!("{yaml}{top}")).await;
    router.all_healthy().await;
    Fleet {
        prefill,
        decode,
        router,
    }
}

/// The prefill set's pool (the router keeps it after the configured pools).
fn prefill_set(r: &TestRouter) -> std::sync::Arc<infergate::pool::Pool> {
    r.state.pools.pools[1].clone()
}

fn sum(engines: &[EngineHandle], f: impl Fn(&infergate_sim::EngineTotals) -> u64) -> u64 {
    engines.iter().map(|e| f(&e.stats())).sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_legs_serve_streamed_and_whole_answers() {
    let f = fleet(2, 1, nixl(0.05), "", "").await;
    let base = f.router.url();
    for stream in [false, true] {
        let resp = send_chat(&base, chat_body(20_000, stream, 8)).await;
        assert_eq!(resp.status(), 200);
        let prefill_ep =
            header(&resp, "x-infergate-prefill-endpoint").expect("prefill endpoint named");
        assert!(f.prefill.iter().any(|e| e.url().ends_with(&prefill_ep)));
        assert_eq!(
            served_by(&resp).as_deref(),
            Some(f.decode[0].addr.to_string().as_str())
        );
        let text = resp.text().await.unwrap();
        if stream {
            // Every decoded token, streamed by the decode engine; the prefill's one token never reached the client.
            assert_eq!(text.matches("data: {").count(), 8, "{text}");
            assert!(text.ends_with("data: [DONE]\n\n"));
        } else {
            let v: serde_json::Value = serde_json::from_str(&text).unwrap();
            assert_eq!(v["usage"]["completion_tokens"], 8, "{text}");
        }
    }
    // The prefill engines computed the prompts and issued params for them; one token each.
    assert_eq!(sum(&f.prefill, |t| t.kv_params_issued), 2);
    assert_eq!(sum(&f.prefill, |t| t.generation_tokens), 2);
    // The decode engine pulled both and computed almost nothing of the ~3.7k-token prompt (the second time it
    // held the blocks already: a pull of nothing new).
    let d = f.decode[0].stats();
    assert_eq!(d.kv_pulls, 2);
    assert_eq!(d.generation_tokens, 16);
    assert!(d.external_prompt_tokens > 3_000, "{d:?}");
    assert_eq!(
        d.prompt_tokens,
        d.external_prompt_tokens + d.cached_prompt_tokens + d.computed_prompt_tokens
    );
    assert!(d.computed_prompt_tokens <= 2, "{d:?}");
    let m = f.router.metrics_text().await;
    assert_eq!(
        metric_value(
            &m,
            "infergate_disagg_prefill_legs_total",
            &["pool=\"pd\"", "outcome=\"served\""]
        ),
        Some(2.0)
    );
    assert_eq!(
        metric_sum(&m, "infergate_placements_total", &["pool=\"pd/prefill\""]),
        2.0
    );
    assert_eq!(
        metric_sum(&m, "infergate_placements_total", &["pool=\"pd\""]),
        2.0
    );
    assert_eq!(
        metric_sum(
            &m,
            "infergate_disagg_kv_transfer_seconds_count",
            &["pool=\"pd\""]
        ),
        1.0
    );
    f.router.wait_idle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_prefill_tokens_are_held_on_the_prefill_engine_only() {
    // A 100 KB prompt prefills in about a second on the prefill engine.
    let cfg = SimConfig {
        prefill_tokens_per_sec: 25_000.0,
        ..nixl(1.0)
    };
    let f = fleet(1, 1, cfg, "", "").await;
    let base = f.router.url();
    let task = tokio::spawn(async move { post_chat(&base, chat_body(100_000, true, 4)).await });
    let p = prefill_set(&f.router);
    let d = f.router.state.pools.pools[0].clone();
    f.router
        .wait_for("the prefill held", Duration::from_secs(5), |_| {
            p.endpoints()[0].load.prefill_tokens() > 20_000
        })
        .await;
    // Nothing on the decode engine yet: its leg has not started.
    assert_eq!(
        (
            d.endpoints()[0].load.requests(),
            d.endpoints()[0].load.prefill_tokens()
        ),
        (0, 0)
    );
    f.router
        .wait_for("the decode leg in flight", Duration::from_secs(10), |_| {
            d.endpoints()[0].load.requests() == 1
        })
        .await;
    // The prefill answered: its tokens and request are released; the decode leg holds a request, no tokens.
    assert_eq!(p.endpoints()[0].load.prefill_tokens(), 0);
    assert_eq!(p.endpoints()[0].load.requests(), 0);
    assert_eq!(d.endpoints()[0].load.prefill_tokens(), 0);
    assert_eq!(task.await.unwrap(), 200);
    f.router.wait_idle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_or_unreachable_prefill_leg_goes_to_another_prefill_engine() {
    let f = fleet(2, 1, nixl(0.05), "", "").await;
    f.prefill[0].control.set_fail_status(Some(503));
    let base = f.router.url();
    for _ in 0..4 {
        let resp = send_chat(&base, chat_body(2_000, false, 2)).await;
        assert_eq!(resp.status(), 200);
        assert_eq!(
            header(&resp, "x-infergate-prefill-endpoint"),
            Some(f.prefill[1].addr.to_string())
        );
        drain(resp).await.unwrap();
    }
    assert_eq!(f.prefill[1].stats().kv_params_issued, 4);
    // An engine that went away: the connection is refused, the leg goes to the other engine.
    f.prefill[0].control.set_fail_status(None);
    f.prefill[0].control.refuse_connections(true).unwrap();
    for _ in 0..4 {
        assert_eq!(post_chat(&base, chat_body(2_000, true, 2)).await, 200);
    }
    assert_eq!(f.prefill[1].stats().kv_params_issued, 8);
    assert_eq!(f.decode[0].stats().kv_pulls, 8);
    f.router.wait_idle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_prefill_engines_own_error_reaches_the_client_and_no_decode_runs() {
    let cfg = SimConfig {
        max_model_len: 1_000,
        ..nixl(0.05)
    };
    let f = fleet(1, 1, cfg, "", "").await;
    let resp = send_chat(&f.router.url(), chat_body(20_000, true, 4)).await;
    assert_eq!(resp.status(), 400);
    let v: serde_json::Value = resp.json().await.unwrap();
    let msg = v["error"]["message"].as_str().unwrap_or_default();
    assert!(msg.contains("maximum context length is 1000 tokens"), "{v}");
    assert_eq!(generate_requests(&f.decode[0]), 0);
    f.router.wait_idle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefill_engine_without_a_connector_is_a_clear_502() {
    // A prefill engine started without --kv-transfer-config: it serves the request and returns no params.
    let prefill = engines(1, time_scaled(0.05)).await;
    let decode = engines(1, nixl(0.05)).await;
    let r = start_router(&disagg_yaml(&urls(&prefill), &urls(&decode), "", "")).await;
    r.all_healthy().await;
    let resp = send_chat(&r.url(), chat_body(2_000, false, 4)).await;
    assert_eq!(resp.status(), 502);
    let v: serde_json::Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["code"], "prefill_failed");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("no kv_transfer_params"),
        "{v}"
    );
    assert_eq!(generate_requests(&decode[0]), 0);
    let m = r.metrics_text().await;
    assert_eq!(
        metric_value(
            &m,
            "infergate_disagg_prefill_legs_total",
            &["outcome=\"no_params\""]
        ),
        Some(1.0)
    );
    r.wait_idle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_gone_during_the_prefill_leg_aborts_it() {
    let cfg = SimConfig {
        prefill_tokens_per_sec: 20_000.0,
        ..nixl(1.0)
    };
    let f = fleet(1, 1, cfg, "", "").await;
    let base = f.router.url();
    let p = prefill_set(&f.router);
    let task = tokio::spawn(async move { send_chat(&base, chat_body(200_000, true, 4)).await });
    // Wait for the engine's scheduler, not only the router's hold: a client gone while the router still sends the
    // body leaves the engine nothing to abort.
    let engine = &f.prefill[0];
    f.router
        .wait_for("the prefill running", Duration::from_secs(5), |_| {
            p.endpoints()[0].load.prefill_tokens() > 0 && engine.stats().requests > 0
        })
        .await;
    task.abort();
    let _ = task.await;
    // The router closed its connection to the prefill engine: the engine aborted the prefill.
    let start = std::time::Instant::now();
    while engine.stats().aborted == 0 {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "the prefill engine did not abort: {:?}",
            engine.stats()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(engine.stats().kv_params_issued, 0);
    assert_eq!(generate_requests(&f.decode[0]), 0);
    f.router.wait_idle().await;
    let m = f.router.metrics_text().await;
    assert_eq!(
        metric_value(
            &m,
            "infergate_disagg_prefill_legs_total",
            &["outcome=\"client_gone\""]
        ),
        Some(1.0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_generation_api_goes_through_both_legs() {
    let f = fleet(1, 1, nixl(0.05), "", "").await;
    let c = client();
    let base = f.router.url();
    let bodies = [
        (
            "/v1/completions",
            serde_json::json!({"model": "m", "prompt": "hello there", "max_tokens": 3}),
        ),
        (
            "/v1/responses",
            serde_json::json!({"model": "m", "input": "hello there", "max_output_tokens": 3}),
        ),
        (
            "/v1/messages",
            serde_json::json!({"model": "m", "max_tokens": 3, "messages": [{"role": "user", "content": "hi"}]}),
        ),
        (
            "/v1/messages",
            serde_json::json!({"model": "m", "max_tokens": 3, "stream": true, "messages": [{"role": "user", "content": "hi"}]}),
        ),
    ];
    for (path, body) in &bodies {
        let resp = post_json(&c, &base, path)
            .body(body.to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200, "{path}");
        assert!(
            header(&resp, "x-infergate-prefill-endpoint").is_some(),
            "{path}"
        );
        drain(resp).await.unwrap();
    }
    assert_eq!(f.decode[0].stats().kv_pulls, 4);
    // What the protocol cannot carry is refused before any engine sees it.
    let refused = [
        (
            "/v1/responses",
            serde_json::json!({"input": "x", "previous_response_id": "resp_1"}),
            "previous_response_id",
        ),
        (
            "/v1/chat/completions",
            serde_json::json!({"messages": [], "n": 3}),
            "`n` above 1",
        ),
        (
            "/v1/chat/completions",
            serde_json::json!({"messages": [], "kv_transfer_params": {"do_remote_prefill": true}}),
            "set by the router",
        ),
    ];
    for (path, body, needle) in &refused {
        let resp = post_json(&c, &base, path)
            .body(body.to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 400, "{path}");
        let v: serde_json::Value = resp.json().await.unwrap();
        assert!(
            v["error"]["message"].as_str().unwrap().contains(needle),
            "{v}"
        );
    }
    assert_eq!(f.prefill[0].stats().kv_params_issued, 4);
    f.router.wait_idle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_decode_leg_that_cannot_be_served_is_an_openai_error() {
    // The decode engine is gone (its port refuses) and there is no other: the client gets the router's 502.
    let prefill = engines(1, nixl(0.05)).await;
    let decode = engines(1, nixl(0.05)).await;
    let r = start_router(&disagg_yaml(&urls(&prefill), &urls(&decode), "", "")).await;
    r.all_healthy().await;
    decode[0].control.refuse_connections(true).unwrap();
    let resp = send_chat(&r.url(), chat_body(2_000, true, 4)).await;
    assert!(resp.status().is_server_error(), "{}", resp.status());
    let v: serde_json::Value = resp.json().await.unwrap();
    assert!(v["error"]["message"].is_string(), "{v}");
    assert_eq!(prefill[0].stats().kv_params_issued, 1);
    r.wait_idle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_keeps_its_prefill_engine_and_its_decode_engine() {
    let sessions =
        "        sessions: { header: x-session-id, ttl: 1h }\n        policy: load_aware\n";
    let f = fleet(
        2,
        2,
        nixl(0.05),
        sessions,
        &sessions_yaml(100).replace("    sessions", "    policy: load_aware\n    sessions"),
    )
    .await;
    let base = f.router.url();
    let c = client();
    let mut seen = std::collections::HashSet::new();
    for turn in 0..4 {
        let resp = post_json(&c, &base, CHAT)
            .header(SESSION_HEADER, "s-1")
            .body(chat_body(3_000 + turn * 500, false, 2))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        seen.insert((
            header(&resp, "x-infergate-prefill-endpoint"),
            served_by(&resp),
        ));
        drain(resp).await.unwrap();
    }
    assert_eq!(seen.len(), 1, "{seen:?}");
    f.router.wait_idle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefill_leg_on_a_pooled_connection_the_engine_closed_is_sent_again() {
    let log = std::env::temp_dir().join(format!("infergate-resent-leg-{}.log", std::process::id()));
    let _ = std::fs::remove_file(&log);
    let access_log = format!(
        "access_log: {{ format: json, path: \"{}\" }}\n",
        log.display()
    );
    let f = fleet_with(1, 1, nixl(0.05), "", "", &access_log).await;
    let base = f.router.url();
    assert_eq!(post_chat(&base, chat_body(2_000, false, 2)).await, 200);
    // The leg's connection stays pooled; the engine closes it (reading nothing) when the next leg goes out on it.
    let poisoned = f.prefill[0].control.poison_idle_connections();
    assert!(poisoned >= 1, "an idle pooled connection to poison");
    // Before: 502 upstream_failed and a `reset` counted against the engine.
    for stream in [false, true] {
        assert_eq!(post_chat(&base, chat_body(2_100, stream, 2)).await, 200);
        f.prefill[0].control.poison_idle_connections();
    }
    assert_eq!(f.prefill[0].stats().kv_params_issued, 3);
    let m = f.router.metrics_text().await;
    assert_eq!(
        retries_and_failures(&m, "pd/prefill"),
        (2.0, 0.0),
        "one resend per cut leg, no failure counted"
    );
    assert_eq!(
        metric_value(
            &m,
            "infergate_disagg_prefill_legs_total",
            &["pool=\"pd\"", "outcome=\"served\""]
        ),
        Some(3.0)
    );
    f.router.wait_idle().await;
    // The access log counts the resend among the request's retries, as the metric does.
    let retries: Vec<u64> = log_lines(&log, 3)
        .await
        .iter()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap_or_default()["retries"]
                .as_u64()
                .unwrap_or(u64::MAX)
        })
        .collect();
    assert_eq!(retries, [0, 1, 1]);
    let _ = std::fs::remove_file(&log);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_leaves_a_prefill_engine_that_leaves_two_legs_unanswered() {
    let sessions =
        "        sessions: { header: x-session-id, ttl: 1h }\n        policy: load_aware\n        \
                    outlier_detection: { stream_headers_within: 500ms }\n";
    let f = fleet(
        2,
        1,
        nixl(0.05),
        sessions,
        &sessions_yaml(100).replace("    sessions", "    policy: load_aware\n    sessions"),
    )
    .await;
    let base = f.router.url();
    let c = client();
    let first = post_json(&c, &base, CHAT)
        .header(SESSION_HEADER, "s-1")
        .body(chat_body(3_000, false, 2))
        .send()
        .await
        .unwrap();
    assert_eq!(first.status(), 200);
    let bound =
        header(&first, "x-infergate-prefill-endpoint").expect("the prefill endpoint header");
    drain(first).await.unwrap();
    let wedged = f
        .prefill
        .iter()
        .position(|e| e.addr.to_string() == bound)
        .expect("the prefill endpoint is one of the set");
    // Wedged: it takes legs and never answers, while its /health still says 200.
    f.prefill[wedged]
        .control
        .set_slow_headers(Duration::from_secs(60));
    let mut statuses = Vec::new();
    for turn in 1..7 {
        let req = post_json(&c, &base, CHAT)
            .header(SESSION_HEADER, "s-1")
            .body(chat_body(3_000 + turn * 500, false, 2));
        // Past the 500 ms deadline even when a loaded machine is slow to dispatch the leg.
        let status = tokio::time::timeout(Duration::from_millis(2500), async {
            let resp = req.send().await.ok()?;
            let status = resp.status().as_u16();
            drain(resp).await.ok()?;
            Some(status)
        })
        .await
        .ok()
        .flatten()
        .unwrap_or(0);
        statuses.push(status);
        // The router has seen this client leave before the next turn (see black_holes' prefix_aware test).
        f.router.wait_idle().await;
    }
    // Two legs go unanswered, then the session's legs go to the other prefill engine (without the rule every turn
    // is lost).
    assert_eq!(&statuses, &[0, 0, 200, 200, 200, 200]);
    f.prefill[wedged].control.set_slow_headers(Duration::ZERO);
    f.router.wait_idle().await;
}
