//! Client keys and their limits on real sockets: 401 before the body is read, both header forms, the client's key
//! never reaching an engine, keys reloaded in place and by SIGHUP, and each limit's 429 with Retry-After.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::*;
use infergate::config::Config;
use infergate_sim::{self as sim, SimConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const ALICE: &str = "sk-alice-0123456789abcdef";
const BOB: &str = "sk-bob-fedcba9876543210";

fn temp_path(tag: &str) -> PathBuf {
    std::env::temp_dir().join(format!("infergate-auth-{}-{tag}", std::process::id()))
}

fn keys_file(tag: &str, text: &str) -> PathBuf {
    let p = temp_path(tag);
    std::fs::write(&p, text).unwrap();
    p
}

/// A router config over `urls` with `auth` reading `keys` and the given `limits:` YAML (indented by 2, or "").
fn auth_yaml(keys: &Path, limits: &str, urls: &[String], pool_extra: &str) -> String {
    format!(
        "auth:\n  keys_file: {}\n{limits}{}",
        keys.display(),
        pool_yaml("load_aware", urls, pool_extra)
    )
}

async fn engine() -> sim::EngineHandle {
    sim::spawn_engine(SimConfig::default())
        .await
        .expect("engine")
}

async fn healthy(router: &TestRouter) {
    router
        .wait_for("healthy", Duration::from_secs(10), |r| {
            r.state.pools.any_healthy()
        })
        .await;
}

struct Answer {
    status: u16,
    retry_after: Option<String>,
    body: serde_json::Value,
}

/// The status of a small chat request carrying one header (a key).
async fn chat_as(router: &TestRouter, header: (&str, &str)) -> u16 {
    call(router, &[header], chat_body(100, false, 1))
        .await
        .status
}

async fn call(router: &TestRouter, headers: &[(&str, &str)], body: String) -> Answer {
    let mut req = client()
        .post(format!("{}/v1/chat/completions", router.url()))
        .header("content-type", "application/json")
        .body(body);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = req.send().await.expect("response");
    let status = resp.status().as_u16();
    let retry_after = resp
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_string());
    let bytes = resp.bytes().await.expect("body");
    let body = serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null);
    Answer {
        status,
        retry_after,
        body,
    }
}

fn bearer(key: &str) -> String {
    format!("Bearer {key}")
}

fn generate_requests(e: &sim::EngineHandle) -> Vec<sim::RecordedRequest> {
    e.requests()
        .into_iter()
        .filter(|r| r.method == "POST" && r.path.starts_with("/v1/"))
        .collect()
}

/// Send only a request head announcing a 100 kB body and return what the router answers within 3 s: an answer
/// here was given before the body was read.
async fn head_only(router: &TestRouter, headers: &str) -> String {
    let mut s = tokio::net::TcpStream::connect(router.addr).await.unwrap();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n\
         content-length: 100000\r\n{headers}\r\n"
    );
    s.write_all(head.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(3);
    while !String::from_utf8_lossy(&buf).contains("}}") {
        let left = deadline.saturating_duration_since(Instant::now());
        let mut chunk = [0u8; 4096];
        match tokio::time::timeout(left, s.read(&mut chunk)).await {
            Ok(Ok(n)) if n > 0 => buf.extend_from_slice(&chunk[..n]),
            _ => break,
        }
    }
    String::from_utf8_lossy(&buf).into_owned()
}

async fn metrics_until(router: &TestRouter, name: &str, labels: &[&str], want: f64) -> String {
    // The answer goes out before Pingora's logging hook counts it: poll briefly.
    let mut m = String::new();
    for _ in 0..100 {
        m = router.metrics_text().await;
        if metric_sum(&m, name, labels) == want {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    m
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_or_wrong_keys_get_401_before_the_body_and_reach_no_engine() {
    let eng = engine().await;
    let keys = keys_file("401", &format!("# clients\nalice:{ALICE}\nbob:{BOB}\n"));
    let router = start_router(&auth_yaml(&keys, "", &[eng.url()], "")).await;
    healthy(&router).await;

    for headers in [
        vec![],
        vec![("authorization", bearer("sk-wrong-0123456789abcdef"))],
        vec![("authorization", format!("Basic {ALICE}"))],
        vec![("x-api-key", format!("{ALICE}x"))],
        vec![("authorization", ALICE.to_string())],
    ] {
        let h: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let a = call(&router, &h, chat_body(200, false, 2)).await;
        assert_eq!(a.status, 401, "{headers:?}");
        assert_eq!(a.body["error"]["code"], "invalid_api_key");
        assert_eq!(a.body["error"]["type"], "invalid_request_error");
        let msg = a.body["error"]["message"].as_str().unwrap();
        assert!(
            !msg.contains("0123456789"),
            "the key is never echoed: {msg}"
        );
    }
    // Answered from the head alone: the 100 kB body was never sent.
    let raw = head_only(&router, "").await;
    assert!(raw.starts_with("HTTP/1.1 401"), "{raw}");
    assert!(raw.contains("invalid_api_key"), "{raw}");
    let raw = head_only(
        &router,
        "authorization: Bearer sk-nope-0123456789abcdef\r\n",
    )
    .await;
    assert!(raw.starts_with("HTTP/1.1 401"), "{raw}");
    assert!(
        generate_requests(&eng).is_empty(),
        "nothing reached the engine"
    );

    // /health stays open; /v1/models needs a key.
    let health = client()
        .get(format!("{}/health", router.url()))
        .send()
        .await
        .unwrap();
    assert_eq!(health.status(), 200);
    let models = |key: Option<&str>| {
        let mut r = client().get(format!("{}/v1/models", router.url()));
        if let Some(k) = key {
            r = r.bearer_auth(k);
        }
        r.send()
    };
    assert_eq!(models(None).await.unwrap().status(), 401);
    assert_eq!(models(Some(BOB)).await.unwrap().status(), 200);

    // A request is counted once its answer is sent: wait for the last one too.
    metrics_until(
        &router,
        "infergate_client_requests_total",
        &["code=\"200\""],
        1.0,
    )
    .await;
    let m = metrics_until(
        &router,
        "infergate_client_requests_total",
        &["key=\"-\"", "code=\"401\""],
        8.0,
    )
    .await;
    assert_eq!(
        metric_sum(
            &m,
            "infergate_client_requests_total",
            &["key=\"-\"", "code=\"401\""]
        ),
        8.0
    );
    assert_eq!(
        metric_sum(&m, "infergate_client_requests_total", &["code=\"200\""]),
        1.0,
        "/health is not counted; /v1/models with bob's key is"
    );
    let _ = std::fs::remove_file(keys);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_header_forms_work_and_no_client_key_is_forwarded() {
    let eng = engine().await;
    let keys = keys_file("forms", &format!("alice:{ALICE}\nbob:{BOB}\n"));
    let engine_key = keys_file("engine-key", "sk-engine-key\n");
    // The second pool's endpoint has its own key: it replaces the client's Authorization.
    let yaml = format!(
        "auth:\n  keys_file: {}\nlisten: \"{{listen}}\"\nmetrics_listen: \"{{metrics}}\"\n\
         pools:\n  - name: open\n    models: [\"sim-model\"]\n    endpoints: [\"{url}\"]\n    \
         health_check: {{ interval: 200ms, timeout: 500ms, healthy_after: 1 }}\n  \
         - name: keyed\n    models: [\"keyed-model\"]\n    endpoints:\n      - url: \"{url}\"\n        \
         api_key_file: {}\n    health_check: {{ interval: 200ms, timeout: 500ms, healthy_after: 1 }}\n",
        keys.display(),
        engine_key.display(),
        url = eng.url(),
    );
    let router = start_router(&yaml).await;
    router
        .wait_for("both pools healthy", Duration::from_secs(10), |r| {
            r.state.pools.pools.iter().all(|p| p.any_healthy())
        })
        .await;
    let bob = bearer(BOB);
    for headers in [
        vec![("authorization", bob.as_str())],
        vec![("authorization", "bearer sk-bob-fedcba9876543210")],
        vec![("x-api-key", ALICE)],
        vec![
            ("x-api-key", ALICE),
            ("authorization", "Bearer not-a-key-at-all"),
        ],
    ] {
        let a = call(&router, &headers, chat_body(200, false, 2)).await;
        assert_eq!(a.status, 200, "{headers:?}");
    }
    let keyed = chat_body(200, false, 2).replace("\"sim-model\"", "\"keyed-model\"");
    for headers in [
        vec![("authorization", bob.as_str())],
        vec![("x-api-key", ALICE)],
    ] {
        assert_eq!(call(&router, &headers, keyed.clone()).await.status, 200);
    }
    let reqs = generate_requests(&eng);
    assert_eq!(reqs.len(), 6);
    for r in &reqs {
        assert_eq!(r.header("x-api-key"), None, "x-api-key is never forwarded");
        let auth = r.header("authorization");
        assert!(
            auth.is_none() || auth == Some("Bearer sk-engine-key"),
            "only the engine's own key: {auth:?}"
        );
    }
    assert_eq!(
        reqs.iter()
            .filter(|r| r.header("authorization") == Some("Bearer sk-engine-key"))
            .count(),
        2
    );
    let m = metrics_until(
        &router,
        "infergate_client_requests_total",
        &["code=\"200\""],
        6.0,
    )
    .await;
    assert_eq!(
        metric_value(
            &m,
            "infergate_client_requests_total",
            &["key=\"bob\"", "code=\"200\""]
        ),
        Some(3.0)
    );
    assert_eq!(
        metric_value(
            &m,
            "infergate_client_requests_total",
            &["key=\"alice\"", "code=\"200\""]
        ),
        Some(3.0)
    );
    router.wait_idle().await;
    let _ = std::fs::remove_file(keys);
    let _ = std::fs::remove_file(engine_key);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_auth_every_request_is_counted_under_dash_and_x_api_key_is_still_stripped() {
    let eng = engine().await;
    let router = start_router(&pool_yaml("load_aware", &[eng.url()], "")).await;
    healthy(&router).await;
    let a = call(
        &router,
        &[("x-api-key", "whatever")],
        chat_body(200, false, 2),
    )
    .await;
    assert_eq!(a.status, 200);
    assert_eq!(generate_requests(&eng)[0].header("x-api-key"), None);
    let m = metrics_until(&router, "infergate_client_requests_total", &[], 1.0).await;
    assert_eq!(
        metric_value(
            &m,
            "infergate_client_requests_total",
            &["key=\"-\"", "code=\"200\""]
        ),
        Some(1.0)
    );
    router.wait_idle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reloading_keys_rotates_them_and_keeps_the_buckets() {
    let eng = engine().await;
    let keys = keys_file("reload", &format!("alice:{ALICE}\n"));
    let limits = "  limits: { requests_per_minute: 2 }\n";
    let yaml = auth_yaml(&keys, limits, &[eng.url()], "");
    let router = start_router(&yaml).await;
    healthy(&router).await;
    let (alice, bob) = (bearer(ALICE), bearer(BOB));
    assert_eq!(chat_as(&router, ("authorization", &alice)).await, 200);
    assert_eq!(chat_as(&router, ("authorization", &bob)).await, 401);

    // alice's key is rotated; bob is added.
    let alice2 = "sk-alice-rotated-0000000000";
    std::fs::write(&keys, format!("alice:{alice2}\nbob:{BOB}\n")).unwrap();
    let text = yaml
        .replace("{listen}", &router.addr.to_string())
        .replace("{metrics}", &router.metrics_addr.to_string());
    let cfg = Config::parse(Path::new("test.yaml"), &text).unwrap();
    router.state.reload_keys(&cfg);
    assert_eq!(chat_as(&router, ("authorization", &alice)).await, 401);
    assert_eq!(chat_as(&router, ("authorization", &bob)).await, 200);
    let a2 = bearer(alice2);
    assert_eq!(chat_as(&router, ("authorization", &a2)).await, 200);
    // alice spent one request before the reload and one after: the bucket was kept, so the third is refused.
    let a = call(&router, &[("authorization", &a2)], chat_body(100, false, 1)).await;
    assert_eq!(a.status, 429);

    // A bad keys file is a config error that never shows a key; applying nothing keeps the running keys.
    std::fs::write(&keys, format!("alice:{alice2}\nbob:{alice2}\n")).unwrap();
    let e = Config::parse(Path::new("test.yaml"), &text).unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("line 2"), "{msg}");
    assert!(!msg.contains("rotated"), "key text in `{msg}`");
    assert_eq!(chat_as(&router, ("authorization", &bob)).await, 200);

    // bob leaves: his series go with him.
    std::fs::write(&keys, format!("alice:{alice2}\n")).unwrap();
    router
        .state
        .reload_keys(&Config::parse(Path::new("test.yaml"), &text).unwrap());
    assert_eq!(chat_as(&router, ("authorization", &bob)).await, 401);
    let m = router.metrics_text().await;
    assert!(!m.contains("key=\"bob\""), "{m}");
    router.wait_idle().await;
    let _ = std::fs::remove_file(keys);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_keys_and_a_bad_keys_file_keeps_the_old_ones_without_logging_keys() {
    let eng = engine().await;
    let (listen, mport) = (free_port(), free_port());
    let dir = temp_path(&format!("sighup-{listen}"));
    std::fs::create_dir_all(&dir).unwrap();
    let keys = dir.join("keys");
    std::fs::write(&keys, format!("alice:{ALICE}\n")).unwrap();
    let conf = dir.join("infergate.yaml");
    std::fs::write(
        &conf,
        format!(
            "listen: \"127.0.0.1:{listen}\"\nmetrics_listen: \"127.0.0.1:{mport}\"\n\
             auth: {{ keys_file: {} }}\n\
             server: {{ grace_period_seconds: 0, graceful_shutdown_timeout_seconds: 1, \
             pid_file: {d}/pid, upgrade_sock: {d}/sock }}\n\
             pools:\n  - name: default\n    endpoints: [\"{}\"]\n    \
             health_check: {{ interval: 200ms, timeout: 500ms, healthy_after: 1 }}\n",
            keys.display(),
            eng.url(),
            d = dir.display(),
        ),
    )
    .unwrap();
    let mut child = spawn_router(&dir, &[]);
    let url = format!("http://127.0.0.1:{listen}/v1/chat/completions");
    let status = |key: &'static str| {
        let url = url.clone();
        async move {
            client()
                .post(url)
                .bearer_auth(key)
                .body(chat_body(100, false, 1))
                .send()
                .await
                .map(|r| r.status().as_u16())
                .unwrap_or(0)
        }
    };
    let until = |key: &'static str, want: u16, what: &'static str| async move {
        let start = Instant::now();
        while status(key).await != want {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "timed out: {what}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    until(ALICE, 200, "alice served").await;
    let hup = || {
        let _ = Command::new("kill")
            .args(["-HUP", &child.id().to_string()])
            .status();
    };
    // A keys file with a duplicate key: rejected, alice keeps working, bob stays out.
    let secret = "sk-leak-check-9999999999";
    std::fs::write(&keys, format!("alice:{secret}\nbob:{secret}\n")).unwrap();
    hup();
    wait_metrics(mport, "the keys file with a duplicate key rejected", |m| {
        metric_value(m, "infergate_config_reloads_total", &["result=\"failed\""]) == Some(1.0)
    })
    .await;
    assert_eq!(status(ALICE).await, 200);
    std::fs::write(&keys, format!("bob:{BOB}\n")).unwrap();
    hup();
    until(BOB, 200, "bob's key after SIGHUP").await;
    assert_eq!(status(ALICE).await, 401);
    assert!(child.try_wait().unwrap().is_none(), "still running");
    let _ = child.kill();
    let _ = child.wait();
    let logged = std::fs::read_to_string(dir.join("stderr")).unwrap();
    assert!(logged.contains("reload rejected"), "{logged}");
    assert!(logged.contains("client keys reloaded"), "{logged}");
    for key in [secret, ALICE, BOB] {
        assert!(!logged.contains(key), "a key was logged:\n{logged}");
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_per_minute_gives_429_with_retry_after_before_the_body() {
    let eng = engine().await;
    let keys = keys_file("rpm", &format!("alice:{ALICE}\nbob:{BOB}\n"));
    let limits = "  limits:\n    per_key: [ { name: alice, requests_per_minute: 2 } ]\n";
    let router = start_router(&auth_yaml(&keys, limits, &[eng.url()], "")).await;
    healthy(&router).await;
    let alice = bearer(ALICE);
    for _ in 0..2 {
        assert_eq!(chat_as(&router, ("authorization", &alice)).await, 200);
    }
    let a = call(
        &router,
        &[("authorization", &alice)],
        chat_body(100, false, 1),
    )
    .await;
    assert_eq!(a.status, 429);
    assert_eq!(a.body["error"]["code"], "rate_limit_exceeded");
    assert_eq!(a.body["error"]["type"], "requests");
    // 2 a minute: the next one in 30 s (a little less by now).
    let secs: u32 = a.retry_after.unwrap().parse().unwrap();
    assert!((29..=30).contains(&secs), "{secs}");
    let raw = head_only(&router, &format!("x-api-key: {ALICE}\r\n")).await;
    assert!(
        raw.starts_with("HTTP/1.1 429"),
        "refused before the body: {raw}"
    );
    assert!(raw.to_ascii_lowercase().contains("retry-after: "), "{raw}");
    // bob has no limits.
    for _ in 0..4 {
        assert_eq!(chat_as(&router, ("x-api-key", BOB)).await, 200);
    }
    assert_eq!(generate_requests(&eng).len(), 6);
    let m = metrics_until(
        &router,
        "infergate_client_requests_total",
        &["key=\"alice\"", "code=\"429\""],
        2.0,
    )
    .await;
    assert_eq!(
        metric_value(
            &m,
            "infergate_client_rate_limited_total",
            &["key=\"alice\"", "limit=\"requests_per_minute\""]
        ),
        Some(2.0)
    );
    router.wait_idle().await;
    let _ = std::fs::remove_file(keys);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prompt_tokens_per_minute_charges_the_estimate() {
    let eng = engine().await;
    let keys = keys_file("tpm", &format!("alice:{ALICE}\n"));
    let limits = "  limits: { prompt_tokens_per_minute: 1000 }\n";
    let router = start_router(&auth_yaml(&keys, limits, &[eng.url()], "")).await;
    healthy(&router).await;
    let alice = bearer(ALICE);
    // About 3,000 bytes: about 750 tokens at 4 bytes a token.
    let body = chat_body(2900, false, 1);
    let tokens = (body.len() as f64 / 4.0).ceil();
    assert_eq!(
        call(&router, &[("authorization", &alice)], body.clone())
            .await
            .status,
        200
    );
    let a = call(&router, &[("authorization", &alice)], body.clone()).await;
    assert_eq!(a.status, 429);
    assert_eq!(a.body["error"]["type"], "tokens");
    assert_eq!(a.body["error"]["code"], "rate_limit_exceeded");
    // 1000 a minute refill at 16.7 a second; the request needs `tokens` and 1000 - tokens are left.
    let want = ((2.0 * tokens - 1000.0) / (1000.0 / 60.0)).ceil() as u32;
    let secs: u32 = a.retry_after.unwrap().parse().unwrap();
    assert!(secs <= want && secs + 1 >= want, "{secs} vs {want}");
    // A small request still fits.
    assert_eq!(chat_as(&router, ("authorization", &alice)).await, 200);
    assert_eq!(generate_requests(&eng).len(), 2);
    router.wait_idle().await;
    let _ = std::fs::remove_file(keys);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_requests_are_limited_per_key() {
    let eng = engine().await;
    eng.control.set_slow_headers(Duration::from_millis(800));
    let keys = keys_file("conc", &format!("alice:{ALICE}\nbob:{BOB}\n"));
    let limits = "  limits: { concurrent_requests: 1 }\n";
    let router = start_router(&auth_yaml(&keys, limits, &[eng.url()], "")).await;
    healthy(&router).await;
    let url = router.url();
    let first = tokio::spawn(async move {
        client()
            .post(format!("{url}/v1/chat/completions"))
            .bearer_auth(ALICE)
            .body(chat_body(100, false, 1))
            .send()
            .await
            .map(|r| r.status().as_u16())
    });
    router
        .wait_for(
            "alice's first request in flight",
            Duration::from_secs(5),
            |r| r.totals().1 == 1,
        )
        .await;
    let a = call(&router, &[("x-api-key", ALICE)], chat_body(100, false, 1)).await;
    assert_eq!(a.status, 429);
    assert_eq!(a.retry_after.as_deref(), Some("1"));
    assert_eq!(a.body["error"]["type"], "requests");
    assert!(a.body["error"]["message"]
        .as_str()
        .unwrap()
        .contains("concurrent requests"));
    // Another key is not affected.
    assert_eq!(chat_as(&router, ("x-api-key", BOB)).await, 200);
    assert_eq!(first.await.unwrap().unwrap(), 200);
    // The slot came back with the first request.
    assert_eq!(chat_as(&router, ("x-api-key", ALICE)).await, 200);
    eng.control.set_slow_headers(Duration::ZERO);
    router.wait_idle().await;
    let _ = std::fs::remove_file(keys);
}
