//! What each real engine holds, from vLLM's own KV-cache events, and exact prompt tokens from the model's own
//! tokenizer and chat template, checked against what vLLM counted and cached.

use std::time::Duration;

use super::*;

/// The router's index size for endpoint `url` (`infergate_kv_index_blocks`).
fn index_blocks(m: &str, url: &str) -> f64 {
    let ep = format!("endpoint=\"{}\"", url.trim_start_matches("http://"));
    metric_sum(m, "infergate_kv_index_blocks", &[&ep])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs real vLLM engines: scripts/real-vllm.sh runs it"]
async fn vllms_kv_events_fill_the_index_of_the_engine_that_served() {
    let f = fleet();
    let router = start_router(&kv_fleet_yaml(&f, "load_aware", "")).await;
    router.all_healthy().await;
    // A subscriber that connects after vLLM bound misses nothing it needs: every block below is new.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let resp = post_json(&client(), &router.url(), CHAT)
        .body(chat(&f, user(&cold_text(2_000)), false, 4))
        .send()
        .await
        .expect("a response");
    assert_eq!(resp.status(), 200);
    let served = served_by(&resp).expect("an engine served it");
    let v: serde_json::Value = resp.json().await.expect("JSON");
    let prompt = v["usage"]["prompt_tokens"].as_u64().expect("usage") as f64;
    let whole = (prompt / 128.0).floor();
    let m = router
        .metrics_when(|m| {
            f.urls
                .iter()
                .any(|u| u.ends_with(&served) && index_blocks(m, u) >= whole)
        })
        .await;
    let home = f
        .urls
        .iter()
        .find(|u| u.ends_with(&served))
        .expect("a fleet engine");
    assert!(
        index_blocks(&m, home) >= whole,
        "the index of {home} after {whole} blocks\n{m}"
    );
    let stored = metric_sum(&m, "infergate_kv_events_total", &["type=\"BlockStored\""]);
    eprintln!("{prompt} prompt tokens, {whole} whole blocks; BlockStored events {stored}");
    for u in f.urls.iter().filter(|u| !u.ends_with(&served)) {
        assert_eq!(index_blocks(&m, u), 0.0, "{u} served nothing\n{m}");
    }
    // Trusted once its publisher spoke (the other engine's has not yet: it is not trusted, and the approximate
    // index stands in for it).
    let ep = format!("endpoint=\"{}\"", home.trim_start_matches("http://"));
    assert_eq!(
        metric_sum(&m, "infergate_kv_index_stale", &[&ep]),
        0.0,
        "{m}"
    );
    assert_eq!(
        metric_sum(&m, "infergate_kv_events_total", &["type=\"invalid\""]),
        0.0,
        "{m}"
    );
    router.wait_idle().await;
}
