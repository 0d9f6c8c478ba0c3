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

/// Send `body` to `path` and return vLLM's `usage.prompt_tokens` and what the router charged the endpoint for it
/// (`infergate_prefill_tokens_estimated_total`, the hold's tokens once served).
async fn prompt_and_charged(router: &TestRouter, path: &str, body: String) -> (f64, f64) {
    let (prompt, charged, _) = answer_and_charged(router, path, body).await;
    (prompt, charged)
}

/// `prompt_and_charged`, with vLLM's answer.
async fn answer_and_charged(
    router: &TestRouter,
    path: &str,
    body: String,
) -> (f64, f64, serde_json::Value) {
    let before = router
        .metric_sum("infergate_prefill_tokens_estimated_total", &[])
        .await;
    let resp = post_json(&client(), &router.url(), path)
        .body(body)
        .send()
        .await
        .expect("a response");
    assert_eq!(resp.status(), 200);
    let v: serde_json::Value = resp.json().await.expect("JSON");
    let prompt = v["usage"]["prompt_tokens"].as_u64().expect("usage") as f64;
    router.wait_idle().await;
    let after = router
        .metric_sum("infergate_prefill_tokens_estimated_total", &[])
        .await;
    (prompt, after - before, v)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs real vLLM engines: scripts/real-vllm.sh runs it"]
async fn with_a_tokenizer_the_held_prompt_tokens_are_vllms_own_count() {
    let f = fleet();
    let tokenizer = format!("    tokenizer: {{ path: \"{}\" }}\n", f.model_dir.display());
    // prefix_aware places a request where the most of it is held (by the KV index when it is trusted), from the
    // first request on; predicted_ttft does so only once it learned both engines' speeds.
    let router = start_router(&kv_fleet_yaml(&f, "prefix_aware", &tokenizer)).await;
    router.all_healthy().await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let messages = serde_json::json!([
        {"role": "system", "content": "You answer in one word."},
        {"role": "user", "content": cold_text(1_000)},
        {"role": "assistant", "content": "Noted."},
        {"role": "user", "content": "And again, please?"},
    ]);
    let (prompt, charged) =
        prompt_and_charged(&router, CHAT, chat(&f, messages.clone(), false, 2)).await;
    assert_eq!(
        charged, prompt,
        "the chat's hold is vLLM's own prompt_tokens"
    );
    let completion =
        serde_json::json!({"model": f.model, "prompt": cold_text(300), "max_tokens": 2})
            .to_string();
    let (prompt, charged) = prompt_and_charged(&router, "/v1/completions", completion).await;
    assert_eq!(
        charged, prompt,
        "a completion's hold is vLLM's own prompt_tokens (BOS included)"
    );
    // The same conversation again: what the engine's KV events say it holds of the exact ids is what vLLM
    // then serves from its cache (both count whole 128-token blocks).
    let m = router.metrics_text().await;
    let before = metric_sum(&m, "infergate_kv_predicted_cached_tokens_total", &[]);
    let (prompt, charged, v) =
        answer_and_charged(&router, CHAT, chat(&f, messages, false, 2)).await;
    let m = router.metrics_text().await;
    let predicted = metric_sum(&m, "infergate_kv_predicted_cached_tokens_total", &[]) - before;
    let cached = v["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_f64()
        .unwrap_or(-1.0);
    eprintln!(
        "second turn: {prompt} prompt tokens, predicted cached {predicted}, vLLM cached {cached}, charged {charged}"
    );
    assert!(
        cached >= 1_024.0,
        "vLLM served {cached} of {prompt} from its cache"
    );
    assert_eq!(
        predicted, cached,
        "the KV index predicted what vLLM served from cache"
    );
    assert_eq!(
        metric_sum(&m, "infergate_tokenizer_fallbacks_total", &[]),
        0.0,
        "{m}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs real vLLM engines: scripts/real-vllm.sh runs it"]
async fn a_growing_conversation_counts_what_vllm_tokenises_with_earlier_turns_reused() {
    use infergate::tokens::{load, Api};
    let f = fleet();
    let model = load(&f.model_dir).expect("the engines' model directory loads");
    let mixed = "naïve café — “quoted” text, tabs\tand\n\nblank lines; code: fn main() { println!(\"{}\", 42); } ";
    let mut messages = vec![serde_json::json!({"role": "system", "content": cold_text(3_000)})];
    for turn in 0..5 {
        let user = format!("{mixed}{}", cold_text(300));
        messages.push(serde_json::json!({"role": "user", "content": user}));
        let body = serde_json::json!({"model": f.model, "messages": messages});
        let ours = model
            .count(Api::Chat, body.to_string().as_bytes())
            .expect("counted");
        let req = serde_json::json!({"model": f.model, "messages": messages, "add_generation_prompt": true});
        let theirs: serde_json::Value = post_json(&client(), &f.urls[0], "/tokenize")
            .body(req.to_string())
            .send()
            .await
            .expect("vLLM's /tokenize answers")
            .json()
            .await
            .expect("JSON");
        let ids: Vec<u32> = theirs["tokens"]
            .as_array()
            .expect("tokens")
            .iter()
            .filter_map(|t| t.as_u64().map(|t| t as u32))
            .collect();
        eprintln!(
            "turn {turn}: {} tokens, {} reused from the turn before",
            ours.count, ours.reused
        );
        assert_eq!(ours.ids, ids, "turn {turn}: our ids are vLLM's");
        if turn > 0 {
            assert!(ours.reused > 1_000, "turn {turn} reused {}", ours.reused);
        }
        messages
            .push(serde_json::json!({"role": "assistant", "content": format!("{mixed} {turn}")}));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs real vLLM engines: scripts/real-vllm.sh runs it"]
async fn a_router_started_after_its_engine_learns_what_it_holds_from_the_replay_socket() {
    let f = fleet();
    let prompt_of = |v: serde_json::Value| v["usage"]["prompt_tokens"].as_f64().expect("usage");
    // Blocks stored before any router here listens: a cold prompt straight to engine 0.
    let before: serde_json::Value = post_json(&client(), &f.urls[0], CHAT)
        .body(chat(&f, user(&cold_text(2_000)), false, 2))
        .send()
        .await
        .expect("a response")
        .json()
        .await
        .expect("JSON");
    let early = (prompt_of(before) / 128.0).floor();
    // A router over engine 0 alone, subscribed with its replay socket.
    let u = &f.urls[0];
    let yaml = pool_yaml("load_aware", std::slice::from_ref(u), "").replace(
        &format!("- url: \"{u}\"\n"),
        &format!(
            "- url: \"{u}\"\n        kv_events: {{ endpoint: \"{}\", replay: \"{}\" }}\n",
            f.kv_events[0], f.kv_replay[0]
        ),
    );
    let router = start_router(&yaml).await;
    router.all_healthy().await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    // Its first message comes with the next store: it joins there and asks the replay socket for the rest.
    let resp = post_json(&client(), &router.url(), CHAT)
        .body(chat(&f, user(&cold_text(1_000)), false, 2))
        .send()
        .await
        .expect("a response");
    let late = (prompt_of(resp.json().await.expect("JSON")) / 128.0).floor();
    let m = router
        .metrics_when(|m| index_blocks(m, u) >= early + late)
        .await;
    assert!(
        index_blocks(&m, u) >= early + late,
        "{early} blocks stored before the router, {late} after: the index has {}\n{m}",
        index_blocks(&m, u)
    );
    assert_eq!(
        metric_sum(&m, "infergate_kv_event_gaps_total", &[]),
        0.0,
        "{m}"
    );
    router.wait_idle().await;
}
