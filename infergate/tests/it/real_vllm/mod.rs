//! The real-engine suite: routers in front of real vLLM engines (its CPU build) that `scripts/real-vllm.sh`
//! starts and names in the environment. Ignored in a plain `cargo test`; the script runs these alone, one at a
//! time (they share the engines, so each uses prompts no other test sends).

mod apis;
mod dead;
mod disagg;
mod exact;
mod parity;
mod prefill;
mod sessions;
mod wedged;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::common::*;

/// Why every test here is ignored in a plain `cargo test`.
pub const NEEDS_VLLM: &str = "needs real vLLM engines: scripts/real-vllm.sh runs it";

/// The engines `scripts/real-vllm.sh` started.
pub struct Fleet {
    /// Each engine's base URL.
    pub urls: Vec<String>,
    /// Each engine's KV-cache event publisher (a ZMQ address vLLM binds: the router connects).
    pub kv_events: Vec<String>,
    /// Each engine's KV-event replay socket (vLLM's `replay_endpoint`, a ROUTER it binds).
    pub kv_replay: Vec<String>,
    /// The model directory the engines serve (config.json, tokenizer.json, the chat template).
    pub model_dir: PathBuf,
    /// The engines' Python (it has the openai SDK, a vLLM dependency).
    pub python: PathBuf,
    /// The served model name.
    pub model: String,
    /// Each engine's API-server process (its engine core is a child of it).
    pub pids: Vec<u32>,
}

pub fn var(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set: {NEEDS_VLLM}"))
}

/// The running engines, from the environment the script sets.
pub fn fleet() -> Fleet {
    let list = |v: String| v.split(',').map(str::to_string).collect::<Vec<_>>();
    Fleet {
        urls: list(var("INFERGATE_VLLM_ENGINES")),
        kv_events: list(var("INFERGATE_VLLM_KV_EVENTS")),
        kv_replay: list(var("INFERGATE_VLLM_KV_REPLAY")),
        model_dir: var("INFERGATE_VLLM_MODEL_DIR").into(),
        python: var("INFERGATE_VLLM_PYTHON").into(),
        model: var("INFERGATE_VLLM_MODEL"),
        pids: list(var("INFERGATE_VLLM_PIDS"))
            .iter()
            .map(|p| p.parse().expect("INFERGATE_VLLM_PIDS: process ids"))
            .collect(),
    }
}

/// `kill -SIGNAL pid`; whether it was sent.
pub fn signal(pid: u32, signal: &str) -> bool {
    std::process::Command::new("kill")
        .args([format!("-{signal}"), pid.to_string()])
        .status()
        .is_ok_and(|s| s.success())
}

/// The engine-core process of the vLLM API server `api` (vLLM titles it `VLLM::EngineCore`).
pub fn engine_core(api: u32) -> u32 {
    let cores: Vec<u32> = std::fs::read_dir("/proc")
        .expect("/proc")
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            // pid (comm) state ppid ...: the command may hold spaces, the fields after its ')' do not.
            let ppid = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<u32>().ok());
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            ppid == Some(api) && comm.starts_with("VLLM::Engine")
        })
        .collect();
    assert_eq!(cores.len(), 1, "engine cores of {api}: {cores:?}");
    cores[0]
}

/// An engine's own `/metrics` text.
pub async fn engine_metrics(url: &str) -> String {
    try_metrics(&format!("{url}/metrics"))
        .await
        .unwrap_or_else(|| panic!("{url}/metrics answers"))
}

/// The sum of an engine's series `name` (vLLM labels them `engine` and `model_name`).
pub async fn engine_metric(url: &str, name: &str) -> f64 {
    metric_sum(&engine_metrics(url).await, name, &[])
}

/// Wait (`limit` at most) until the engine's `name` satisfies `f`; its last value.
pub async fn wait_engine_metric(
    url: &str,
    name: &str,
    limit: Duration,
    f: impl Fn(f64) -> bool,
) -> f64 {
    let start = Instant::now();
    loop {
        let v = engine_metric(url, name).await;
        if f(v) {
            return v;
        }
        assert!(start.elapsed() < limit, "{url}: {name} stayed at {v}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A router config over the fleet: one pool serving every model the engines list (`models: ["*"]`), health
/// checked every 200 ms, engine stats scraped every 200 ms; `extra` goes into the pool (indented four spaces).
pub fn fleet_yaml(f: &Fleet, policy: &str, extra: &str) -> String {
    let extra =
        format!("    engine_stats: {{ kind: vllm, path: /metrics, interval: 200ms }}\n{extra}");
    pool_yaml(policy, &f.urls, &extra).replace("response_header: 30s", "response_header: 60s")
}

/// `fleet_yaml`'s pool with each endpoint subscribed to its engine's KV-cache events.
pub fn kv_fleet_yaml(f: &Fleet, policy: &str, extra: &str) -> String {
    let mut yaml = fleet_yaml(f, policy, extra);
    for (u, kv) in f.urls.iter().zip(&f.kv_events) {
        yaml = yaml.replace(
            &format!("- url: \"{u}\"\n"),
            &format!("- url: \"{u}\"\n        kv_events: \"{kv}\"\n"),
        );
    }
    yaml
}

/// Text no earlier request sent, about `tokens` tokens long for the engines' tokenizer (digits are one token each
/// there): a unique head, then numbers.
pub fn cold_text(tokens: usize) -> String {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let nonce = std::process::id() as u64 * 1_000_000
        + N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        + std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_micros() as u64 % 1_000_000);
    let mut s = format!("Request {nonce}. ");
    let mut x = nonce
        .wrapping_mul(6_364_136_223_846_793_005)
        .wrapping_add(1);
    // " 12345" is six tokens: a space and five digits.
    while s.len() < tokens {
        x = x
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        s.push_str(&format!(" {:05}", (x >> 33) % 100_000));
    }
    s
}

/// A chat body for the fleet's model: `messages`, streamed or not, `max_tokens` generated exactly.
pub fn chat(f: &Fleet, messages: serde_json::Value, stream: bool, max_tokens: u32) -> String {
    serde_json::json!({
        "model": f.model, "messages": messages, "stream": stream, "max_tokens": max_tokens, "ignore_eos": true,
    })
    .to_string()
}

/// One user message.
pub fn user(text: &str) -> serde_json::Value {
    serde_json::json!([{"role": "user", "content": text}])
}
