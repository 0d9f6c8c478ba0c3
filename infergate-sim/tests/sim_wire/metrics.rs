//! `/metrics`: vLLM's metric names and types, split over engine labels, and a mis-prefixed engine.

use infergate_sim::{spawn_engine, SimConfig};

use super::common::*;

#[tokio::test(flavor = "multi_thread")]
async fn metrics_carry_vllm_names_split_over_engine_labels() {
    let cfg = SimConfig {
        engine_label_count: 3,
        ..scaled(0.1)
    };
    let e = spawn_engine(cfg).await.unwrap();
    let c = reqwest::Client::new();
    let p = words(500, "m");
    for _ in 0..2 {
        let r = c
            .post(format!("{}/v1/chat/completions", e.url()))
            .json(&chat(&p, 3, false))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
    }
    e.control.set_extra_waiting(7);
    e.control.set_extra_running(2);
    let r = c.get(format!("{}/metrics", e.url())).send().await.unwrap();
    assert!(r.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/plain"));
    let text = r.text().await.unwrap();
    for (name, kind) in [
        ("vllm:num_requests_running", "gauge"),
        ("vllm:num_requests_waiting", "gauge"),
        ("vllm:kv_cache_usage_perc", "gauge"),
        ("vllm:prompt_tokens_total", "counter"),
        ("vllm:generation_tokens_total", "counter"),
        ("vllm:prompt_tokens_by_source_total", "counter"),
        ("vllm:prefix_cache_queries_total", "counter"),
        ("vllm:prefix_cache_hits_total", "counter"),
        ("vllm:request_success_total", "counter"),
    ] {
        assert!(text.contains(&format!("# TYPE {name} {kind}\n")), "{name}");
        assert!(text.contains(&format!("# HELP {name} ")), "{name}");
        for i in 0..3 {
            assert!(
                text.contains(&format!("{name}{{engine=\"{i}\",model_name=\"sim-model\"")),
                "{name} engine {i}"
            );
        }
    }
    let st = e.stats();
    assert_eq!(metric_sum(&text, "vllm:num_requests_waiting"), 7.0);
    assert_eq!(metric_sum(&text, "vllm:num_requests_running"), 2.0);
    assert_eq!(
        metric_sum(&text, "vllm:prompt_tokens_total"),
        st.prompt_tokens as f64
    );
    assert_eq!(metric_sum(&text, "vllm:generation_tokens_total"), 6.0);
    assert_eq!(metric_sum(&text, "vllm:request_success_total"), 2.0);
    assert_eq!(
        metric_sum(&text, "vllm:prefix_cache_hits_total"),
        st.prefix_cache_hits as f64
    );
    let hit: f64 = text
        .lines()
        .filter(|l| {
            l.starts_with("vllm:prompt_tokens_by_source_total") && l.contains("local_cache_hit")
        })
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
        .sum();
    assert_eq!(hit, st.cached_prompt_tokens as f64);
    assert!(hit > 0.0);

    // A mis-prefixed engine.
    let bad = spawn_engine(SimConfig {
        metric_prefix: "vllm_".into(),
        ..scaled(0.1)
    })
    .await
    .unwrap();
    let text = metrics(&bad).await;
    assert!(text.contains("vllm_num_requests_running{engine=\"0\",model_name=\"sim-model\"} 0.0"));
    assert!(!text.contains("vllm:"));
}
