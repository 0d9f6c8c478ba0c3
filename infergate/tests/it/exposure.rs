//! Safe to expose: only the inference API reaches an engine unless `expose_paths` lists more; request paths are
//! normalised before matching and forwarded normalised; traversal and encoding tricks get a 400.

use std::net::SocketAddr;
use std::time::Duration;

use crate::common::*;
use infergate_sim::{self as sim, SimConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

async fn ready(router: &TestRouter) {
    router
        .wait_for("an endpoint healthy", Duration::from_secs(10), |r| {
            r.state.pools.any_healthy()
        })
        .await;
}

/// Send one request written by hand (reqwest would clean the path first); returns (status, body).
async fn raw(addr: SocketAddr, method: &str, target: &str, body: &str) -> (u16, String) {
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let head = format!(
        "{method} {target} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(head.as_bytes()).await.expect("write");
    let mut got = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), s.read_to_end(&mut got)).await;
    assert!(read.is_ok(), "{method} {target}: no complete answer");
    let text = String::from_utf8_lossy(&got).into_owned();
    let status = text
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (status, body)
}

/// The error code of an OpenAI-style error body, and its type.
fn error_code(body: &str) -> (String, String) {
    let v: serde_json::Value =
        serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"));
    (
        v["error"]["code"].as_str().unwrap_or_default().to_string(),
        v["error"]["type"].as_str().unwrap_or_default().to_string(),
    )
}

/// What an engine received other than the router's own calls (health checks, a `*` pool's model list):
/// (method, path).
fn received(e: &sim::EngineHandle) -> Vec<(String, String)> {
    e.requests()
        .into_iter()
        .filter(|r| !(r.method == "GET" && (r.path == "/health" || r.path == "/v1/models")))
        .map(|r| (r.method, r.path))
        .collect()
}

const CHAT: &str =
    r#"{"model":"sim-model","messages":[{"role":"user","content":"hi"}],"max_tokens":2}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_routes_and_unknown_paths_never_reach_an_engine() {
    let eng = sim::spawn_engine(SimConfig::default()).await.unwrap();
    let router = start_router(&pool_yaml("load_aware", &[eng.url()], "")).await;
    ready(&router).await;
    for (method, path) in [
        ("POST", "/sleep"),
        ("POST", "/wake_up"),
        ("POST", "/collective_rpc"),
        ("POST", "/reset_prefix_cache"),
        ("POST", "/v1/load_lora_adapter"),
        ("GET", "/metrics"),
        ("GET", "/version"),
        ("GET", "/sim/stats"),
        ("POST", "/sim/control"),
        ("GET", "/v1/chat/completions"),
        ("PUT", "/v1/completions"),
        ("DELETE", "/v1/models/sim-model"),
        ("POST", "/v1/models"),
        ("GET", "/"),
    ] {
        let (status, body) = raw(router.addr, method, path, CHAT).await;
        assert_eq!(status, 404, "{method} {path}: {body}");
        assert_eq!(
            error_code(&body),
            ("not_found".into(), "invalid_request_error".into()),
            "{method} {path}"
        );
    }
    for (method, target) in [
        ("GET", "/../../etc/passwd"),
        ("GET", "/v1/../metrics"),
        ("GET", "/%2e%2e/%2e%2e/etc/passwd"),
        ("GET", "/v1/%2E%2E/metrics"),
        ("POST", "/v1%2fchat%2fcompletions"),
        ("POST", "/v1/chat/completions%00"),
        ("POST", "/v1\\chat\\completions"),
        ("GET", "/%252e%252e/metrics"),
        ("POST", "/v1/./chat/completions"),
    ] {
        let (status, body) = raw(router.addr, method, target, CHAT).await;
        assert_eq!(status, 400, "{method} {target}: {body}");
        assert_eq!(
            error_code(&body),
            ("invalid_path".into(), "invalid_request_error".into()),
            "{method} {target}"
        );
    }
    // Absolute-form: a 400 (Pingora's own when the authority disagrees with Host, else ours).
    let (status, body) = raw(router.addr, "GET", "http://127.0.0.1/metrics", "").await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(
        received(&eng),
        Vec::<(String, String)>::new(),
        "nothing but health checks reached the engine"
    );
    // The API itself still works, and the router's own answers.
    let (status, _) = raw(router.addr, "POST", "/v1/chat/completions", CHAT).await;
    assert_eq!(status, 200);
    let (status, _) = raw(router.addr, "GET", "/v1/models", "").await;
    assert_eq!(status, 200);
    let (status, _) = raw(router.addr, "GET", "/health", "").await;
    assert_eq!(status, 200);
    assert_eq!(
        received(&eng),
        vec![("POST".to_string(), "/v1/chat/completions".to_string())]
    );
    router.wait_idle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_engine_receives_the_normalised_path() {
    let eng = sim::spawn_engine(SimConfig::default()).await.unwrap();
    let router = start_router(&pool_yaml("load_aware", &[eng.url()], "")).await;
    ready(&router).await;
    for target in [
        "//v1//chat/completions/?trace=1",
        "/v1/%63hat/completions",
        "/v1/chat/completions/",
    ] {
        eng.clear_requests();
        let (status, body) = raw(router.addr, "POST", target, CHAT).await;
        assert_eq!(status, 200, "{target}: {body}");
        let got = received(&eng);
        assert_eq!(
            got,
            vec![("POST".to_string(), "/v1/chat/completions".to_string())],
            "{target}"
        );
    }
    // GET /v1/models/{id} (models.retrieve) is answered by the router from its model list (vLLM serves only
    // the list); the path is matched normalised (trailing slash) and nothing reaches an engine.
    eng.clear_requests();
    let (status, body) = raw(router.addr, "GET", "/v1/models/sim-model/", "").await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains(r#""id":"sim-model""#), "{body}");
    let (status, body) = raw(router.addr, "GET", "/v1/models/other", "").await;
    assert_eq!(status, 404, "{body}");
    assert!(body.contains("model_not_found"), "{body}");
    assert_eq!(received(&eng), vec![]);
    router.wait_idle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expose_paths_open_engine_routes_for_every_pool_or_one() {
    let a = sim::spawn_engine(SimConfig::default()).await.unwrap();
    let b = sim::spawn_engine(SimConfig::default()).await.unwrap();
    let hc = "    health_check: { interval: 200ms, timeout: 500ms, healthy_after: 1, unhealthy_after: 1 }\n";
    let yaml = format!(
        "listen: \"{{listen}}\"\nmetrics_listen: \"{{metrics}}\"\nexpose_paths: [/metrics]\npools:\n\
         \x20 - name: a\n    models: [m1]\n    endpoints: [\"{}\"]\n    expose_paths: [/v1/load_lora_adapter]\n{hc}\
         \x20 - name: b\n    models: [\"*\"]\n    endpoints: [\"{}\"]\n{hc}",
        a.url(),
        b.url()
    );
    let router = start_router(&yaml).await;
    router
        .wait_for("both pools healthy", Duration::from_secs(10), |r| {
            r.state.pools.pools.iter().all(|p| p.any_healthy())
        })
        .await;

    // Top level: every pool; no model goes to the "*" pool, a model to its pool.
    let (status, body) = raw(router.addr, "GET", "/metrics", "").await;
    assert_eq!(status, 200);
    assert!(body.contains("vllm:"), "engine metrics: {body}");
    assert_eq!(received(&b), vec![("GET".into(), "/metrics".into())]);
    let (status, _) = raw(router.addr, "GET", "/metrics", r#"{"model":"m1"}"#).await;
    assert_eq!(status, 200);
    assert_eq!(received(&a), vec![("GET".into(), "/metrics".into())]);

    // Pool level: pool a only. Without a model it goes to the pool that lists it.
    let lora = r#"{"lora_name":"x","lora_path":"/tmp/x"}"#;
    raw(router.addr, "POST", "/v1/load_lora_adapter", lora).await;
    assert_eq!(
        received(&a).last(),
        Some(&("POST".into(), "/v1/load_lora_adapter".into()))
    );
    // A model served by a pool that does not list it: the router's 404.
    let (status, body) = raw(
        router.addr,
        "POST",
        "/v1/load_lora_adapter",
        r#"{"model":"other","lora_name":"x"}"#,
    )
    .await;
    assert_eq!(status, 404);
    assert_eq!(error_code(&body).0, "not_found");
    // Still closed: what no list names.
    let (status, _) = raw(router.addr, "POST", "/sleep", "").await;
    assert_eq!(status, 404);
    assert_eq!(received(&b), vec![("GET".into(), "/metrics".into())]);
    assert_eq!(received(&a).len(), 2);
    router.wait_idle().await;
}
