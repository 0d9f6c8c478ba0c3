//! Simulated engines (infergate-sim, in-process) and what they received.

use infergate_sim::{self as sim, EngineHandle, RecordedRequest, SimConfig};

/// Start one engine.
pub async fn engine(cfg: SimConfig) -> EngineHandle {
    sim::spawn_engine(cfg).await.expect("engine starts")
}

/// Start `n` engines with the same configuration.
pub async fn engines(n: usize, cfg: SimConfig) -> Vec<EngineHandle> {
    let mut v = Vec::new();
    for _ in 0..n {
        v.push(engine(cfg.clone()).await);
    }
    v
}

pub fn urls(e: &[EngineHandle]) -> Vec<String> {
    e.iter().map(|e| e.url()).collect()
}

/// Engines whose prefill of a ~100 KB prompt takes long enough to observe (about a second).
pub fn slow_prefill() -> SimConfig {
    SimConfig {
        prefill_tokens_per_sec: 25_000.0,
        ..SimConfig::default()
    }
}

/// Default engines running `time_scale` times their simulated durations.
pub fn time_scaled(time_scale: f64) -> SimConfig {
    SimConfig {
        time_scale,
        ..SimConfig::default()
    }
}

/// A request the router forwarded for generation: a `POST /v1/...` (the router's own `GET /v1/models`
/// discovery, health checks and stats scrapes are not).
pub fn is_generate(r: &RecordedRequest) -> bool {
    r.method == "POST" && r.path.starts_with("/v1/")
}

/// How many generate requests (`is_generate`) `e` received.
pub fn generate_requests(e: &EngineHandle) -> usize {
    e.requests().iter().filter(|r| is_generate(r)).count()
}

/// How many `POST /v1/chat/completions` `e` received (not count_tokens, which is a generate request too).
pub fn chat_requests(e: &EngineHandle) -> usize {
    e.requests()
        .iter()
        .filter(|r| r.method == "POST" && r.path == "/v1/chat/completions")
        .count()
}

/// The last generate request `e` received.
pub fn last_generate(e: &EngineHandle) -> Option<RecordedRequest> {
    e.requests().into_iter().rev().find(is_generate)
}

/// How many requests `e` received tagged `x-test: {tag}...`.
pub fn tagged(e: &EngineHandle, tag: &str) -> usize {
    e.requests()
        .iter()
        .filter(|r| {
            r.headers
                .iter()
                .any(|(k, v)| k == "x-test" && v.starts_with(tag))
        })
        .count()
}
