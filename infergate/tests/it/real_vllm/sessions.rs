//! Sessions and health on real engines: growing turns stay on one engine and vLLM's own prefix-cache counters
//! show the hits; `/health` checks and `models: ["*"]` discovery against the real server.

use std::time::Duration;

use super::*;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs real vLLM engines: scripts/real-vllm.sh runs it"]
async fn a_sessions_growing_turns_stay_on_one_engine_and_hit_its_prefix_cache() {
    let f = fleet();
    let router = start_router(&fleet_yaml(&f, "predicted_ttft", &sessions_yaml(1000))).await;
    router.all_healthy().await;
    let hits = |u: String| async move { engine_metric(&u, "vllm:prefix_cache_hits_total").await };
    let mut before = Vec::new();
    for u in &f.urls {
        before.push(hits(u.clone()).await);
    }
    let mut messages = vec![json!({"role": "system", "content": cold_text(3_000)})];
    let mut served = Vec::new();
    for turn in 0..5 {
        messages.push(json!({"role": "user", "content": cold_text(600)}));
        let resp = post_json(&client(), &router.url(), CHAT)
            .header(SESSION_HEADER, "real-session-1")
            .body(chat(&f, json!(messages), false, 16))
            .send()
            .await
            .expect("a response");
        assert_eq!(resp.status(), 200, "turn {turn}");
        served.push(served_by(&resp).expect("served by an engine"));
        let v: serde_json::Value = resp.json().await.expect("JSON");
        let reply = v["choices"][0]["message"]["content"]
            .as_str()
            .unwrap_or("")
            .to_string();
        let cached = v["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap_or(0);
        let prompt = v["usage"]["prompt_tokens"].as_u64().unwrap_or(0);
        eprintln!(
            "turn {turn}: {prompt} prompt tokens, {cached} from vLLM's cache, on {}",
            served[turn]
        );
        if turn > 0 {
            // Everything but the new user turn (and a partial block) was cached.
            assert!(
                cached + 128 + 700 >= prompt,
                "turn {turn}: {cached} of {prompt} cached"
            );
        }
        messages.push(json!({"role": "assistant", "content": reply}));
    }
    assert!(
        served.iter().all(|s| *s == served[0]),
        "the session moved: {served:?}"
    );
    let home = f
        .urls
        .iter()
        .position(|u| u.ends_with(&served[0]))
        .expect("a fleet engine");
    let after = hits(f.urls[home].clone()).await;
    // vLLM counts hits in tokens of whole 128-token blocks: four follow-ups each reusing ≥ 3k tokens.
    assert!(
        after - before[home] >= 4.0 * 3_000.0,
        "vLLM's hits {} → {after}",
        before[home]
    );
    router.wait_idle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs real vLLM engines: scripts/real-vllm.sh runs it"]
async fn health_checks_and_model_discovery_work_against_the_real_server() {
    let f = fleet();
    // A third endpoint where nothing listens: checked unhealthy, never served.
    let mut urls = f.urls.clone();
    urls.push(format!("http://127.0.0.1:{}", free_port()));
    let extra = "    engine_stats: { kind: vllm, path: /metrics, interval: 200ms }\n";
    let router = start_router(&pool_yaml("load_aware", &urls, extra)).await;
    router
        .wait_for("the real engines healthy", Duration::from_secs(10), |r| {
            let eps = r.state.pools.pools[0].endpoints();
            eps[..f.urls.len()].iter().all(|e| e.health.is_healthy())
        })
        .await;
    let models = get_json(&router.url(), "/v1/models").await;
    let ids: Vec<&str> = models["data"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| m["id"].as_str())
        .collect();
    assert_eq!(ids, [f.model.as_str()], "{models}");
    for i in 0..6 {
        let text = cold_text(50);
        assert_eq!(
            post_chat(&router.url(), chat(&f, user(&text), i % 2 == 0, 2)).await,
            200
        );
    }
    let eps = router.state.pools.pools[0].endpoints();
    assert!(!eps[f.urls.len()].health.is_healthy());
    router.wait_idle().await;
}
