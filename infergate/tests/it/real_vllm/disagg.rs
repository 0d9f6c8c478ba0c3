//! A disaggregated pool in front of two real vLLM engines speaking NixlConnector over CPU buffers (UCX on
//! loopback): the prefill engine computes the prompt, the decode engine pulls its KV cache and answers the openai
//! SDK, streamed and not. `scripts/real-vllm.sh` starts this pair after the other real-engine tests (their own two
//! engines stopped) and names them in `INFERGATE_VLLM_PD_PREFILL` and `INFERGATE_VLLM_PD_DECODE`.

use super::*;

fn pd_var(name: &str) -> String {
    std::env::var(name)
        .unwrap_or_else(|_| panic!("{name} is not set: scripts/real-vllm.sh disagg runs this"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs real vLLM engines: scripts/real-vllm.sh runs it"]
async fn the_openai_sdk_is_served_through_a_prefill_and_a_decode_engine() {
    let (prefill, decode) = (
        pd_var("INFERGATE_VLLM_PD_PREFILL"),
        pd_var("INFERGATE_VLLM_PD_DECODE"),
    );
    let python = pd_var("INFERGATE_VLLM_PYTHON");
    let model = pd_var("INFERGATE_VLLM_MODEL");
    let checks =
        "{ path: /health, interval: 200ms, timeout: 2s, healthy_after: 1, unhealthy_after: 3 }";
    let yaml = format!(
        "listen: \"{{listen}}\"\nmetrics_listen: \"{{metrics}}\"\n\
         timeouts: {{ connect: 2s, response_header: 60s, stream_idle: 60s }}\n\
         pools:\n  - name: pd\n    models: [\"{model}\"]\n    endpoints: [\"{decode}\"]\n    health_check: {checks}\n\
         \x20   disaggregation:\n      connector: nixl\n      prefill:\n        policy: predicted_ttft\n        \
         endpoints: [\"{prefill}\"]\n        health_check: {checks}\n"
    );
    let router = start_router(&yaml).await;
    router.all_healthy().await;
    let source = |url: &str, source: &str| {
        let url = url.to_string();
        let label = format!("source=\"{source}\"");
        async move {
            metric_sum(
                &engine_metrics(&url).await,
                "vllm:prompt_tokens_by_source_total",
                &[&label],
            )
        }
    };
    let (pulled0, computed0) = (
        source(&decode, "external_kv_transfer").await,
        source(&decode, "local_compute").await,
    );
    let prefilled0 = source(&prefill, "local_compute").await;
    // About 600 prompt tokens each (a cold prompt, unique to this run): small enough for a CPU prefill.
    let script = r#"
import sys, openai
c = openai.OpenAI(base_url=sys.argv[1] + "/v1", api_key="unused", max_retries=0, timeout=120)
m, text = sys.argv[2], sys.argv[3]
raw = c.chat.completions.with_raw_response.create(model=m, messages=[{"role": "user", "content": "A " + text}],
        max_tokens=6, extra_body={"ignore_eos": True})
assert raw.headers.get("x-infergate-prefill-endpoint") == sys.argv[4], dict(raw.headers)
assert raw.headers.get("x-infergate-endpoint") == sys.argv[5], dict(raw.headers)
r = raw.parse()
assert r.usage.completion_tokens == 6, r
p = r.usage.prompt_tokens
chunks = [ch for ch in c.chat.completions.create(model=m, messages=[{"role": "user", "content": "B " + text}],
          max_tokens=5, stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True})]
# Dummy weights pick random tokens, and a lone byte-fallback token decodes to no text: count tokens by usage.
assert any(ch.choices and ch.choices[0].finish_reason == "length" for ch in chunks), chunks
assert chunks[-1].usage.completion_tokens == 5, chunks[-1]
print("sdk ok", openai.__version__, "prompt", p)
"#;
    let host = |u: &str| u.trim_start_matches("http://").to_string();
    let out = tools::run(
        std::process::Command::new(&python).args([
            "-c",
            script,
            &router.url(),
            &model,
            &cold_text(3_000),
            &host(&prefill),
            &host(&decode),
        ]),
        300,
    );
    assert!(out.contains("sdk ok"), "{out}");
    let prompt: f64 = out
        .split("prompt ")
        .nth(1)
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or_else(|| panic!("{out}"));
    // The decode engine pulled both prompts (all but the tokens it computes itself) and computed almost nothing;
    // the prefill engine computed them.
    let pulled = source(&decode, "external_kv_transfer").await - pulled0;
    let computed = source(&decode, "local_compute").await - computed0;
    let prefilled = source(&prefill, "local_compute").await - prefilled0;
    assert!(
        pulled >= 2.0 * (prompt - 128.0),
        "pulled {pulled} of 2 × {prompt}"
    );
    assert!(
        computed <= 2.0 * 128.0,
        "the decode engine computed {computed} prompt tokens"
    );
    assert!(
        prefilled >= 2.0 * (prompt - 128.0),
        "the prefill engine computed {prefilled}"
    );
    let m = router.metrics_text().await;
    assert_eq!(
        metric_value(
            &m,
            "infergate_disagg_prefill_legs_total",
            &["outcome=\"served\""]
        ),
        Some(2.0),
        "{m}"
    );
    assert_eq!(
        metric_sum(&m, "infergate_disagg_kv_transfer_seconds_count", &[]),
        1.0
    );
    router.wait_idle().await;
    assert_load_gauges_at_zero(&router.metrics_text().await);
}
