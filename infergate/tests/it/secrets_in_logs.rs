//! Keys are never logged: the real binary at `RUST_LOG=trace`, with an engine key and clients sending their own
//! tokens (also in a query string), through a retried request, a failed one and a refused path, prints none of
//! them anywhere. The same run
//! with the cap lifted shows the check can see a leak: Pingora then prints the engine key.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{free_port, wait_listening, KillOnDrop};
use infergate_sim::{self as sim, SimConfig};

const ENGINE_KEY: &str = "engine-key-7f3a9c1e5b";
const CLIENT_TOKEN: &str = "client-token-4d8e2a6f0c";
const CLIENT_X_API_KEY: &str = "client-xapikey-9b1c3e5a7d";

fn conf(listen: u16, metrics: u16, key_file: &str, engines: &[String]) -> String {
    let eps: String = engines
        .iter()
        .map(|u| format!("      - url: \"{u}\"\n        api_key_file: \"{key_file}\"\n"))
        .collect();
    format!(
        "listen: \"127.0.0.1:{listen}\"\nmetrics_listen: \"127.0.0.1:{metrics}\"\n\
         server: {{ grace_period_seconds: 0, graceful_shutdown_timeout_seconds: 1, \
         pid_file: /tmp/infergate-keys-{listen}.pid, upgrade_sock: /tmp/infergate-keys-{listen}.sock }}\n\
         timeouts: {{ connect: 1s, response_header: 700ms, stream_idle: 700ms }}\n\
         pools:\n  - name: default\n    policy: round_robin\n    endpoints:\n{eps}\
         \x20   health_check: {{ interval: 200ms, timeout: 500ms, healthy_after: 1, unhealthy_after: 1 }}\n\
         \x20   engine_stats: {{ interval: 200ms }}\n"
    )
}

async fn healthy_endpoints(metrics: u16) -> usize {
    let Ok(resp) = reqwest::get(format!("http://127.0.0.1:{metrics}/metrics")).await else {
        return 0;
    };
    let text = resp.text().await.unwrap_or_default();
    text.lines()
        .filter(|l| l.starts_with("infergate_endpoint_healthy{") && l.ends_with(" 1"))
        .count()
}

async fn send(listen: u16, path: &str, stream: bool) -> u16 {
    let body = format!(
        r#"{{"model":"sim-model","stream":{stream},"max_tokens":3,"messages":[{{"role":"user","content":"hello"}}]}}"#
    );
    let resp = reqwest::Client::new()
        .post(format!("http://127.0.0.1:{listen}{path}"))
        .header("content-type", "application/json")
        .header("authorization", format!("Bearer {CLIENT_TOKEN}"))
        .header("x-api-key", CLIENT_X_API_KEY)
        .body(body)
        .send()
        .await
        .expect("response");
    let status = resp.status().as_u16();
    let _ = resp.bytes().await;
    status
}

/// Run the binary at `RUST_LOG=trace` (cap lifted if `uncap`) through the scenario; its stdout and stderr.
async fn run_at_trace(uncap: bool) -> String {
    let eng = [
        sim::spawn_engine(SimConfig::default()).await.unwrap(),
        sim::spawn_engine(SimConfig::default()).await.unwrap(),
    ];
    let (listen, metrics) = (free_port(), free_port());
    let dir = std::env::temp_dir().join(format!("infergate-secrets-{listen}"));
    std::fs::create_dir_all(&dir).unwrap();
    let key_file = dir.join("engine.key");
    std::fs::write(&key_file, format!("{ENGINE_KEY}\n")).unwrap();
    let urls: Vec<String> = eng.iter().map(|e| e.url()).collect();
    let path = dir.join("infergate.yaml");
    std::fs::write(
        &path,
        conf(listen, metrics, key_file.to_str().unwrap(), &urls),
    )
    .unwrap();
    let (out_path, err_path) = (dir.join("stdout.log"), dir.join("stderr.log"));
    let mut child = KillOnDrop(
        Command::new(env!("CARGO_BIN_EXE_infergate"))
            .args(["-c", path.to_str().unwrap()])
            .env("RUST_LOG", "trace")
            .env(infergate::logging::UNCAP_ENV, if uncap { "1" } else { "0" })
            .stdout(Stdio::from(std::fs::File::create(&out_path).unwrap()))
            .stderr(Stdio::from(std::fs::File::create(&err_path).unwrap()))
            .spawn()
            .unwrap(),
    );

    let start = Instant::now();
    while healthy_endpoints(metrics).await < 2 {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "endpoints never healthy"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The client port opens once the first health checks are done, which can be after the metrics port shows them.
    wait_listening(([127, 0, 0, 1], listen).into()).await;
    // Retried: round_robin tries engine 0 first, which refuses; engine 1 serves.
    eng[0].control.set_fail_status(Some(503));
    assert_eq!(send(listen, "/v1/chat/completions", false).await, 200);
    assert_eq!(
        eng[0]
            .requests()
            .iter()
            .filter(|r| r.refused == Some(503))
            .count(),
        1,
        "the first attempt was refused and retried"
    );
    assert_eq!(send(listen, "/v1/chat/completions", true).await, 200);
    // Failed: the engine does not answer within response_header. Pingora logs it with a request summary, which
    // would show a token put in the query string.
    eng[1].control.set_slow_headers(Duration::from_secs(3));
    let path = format!("/v1/chat/completions?api_key={CLIENT_TOKEN}");
    assert_eq!(send(listen, &path, false).await, 504);
    eng[1].control.set_slow_headers(Duration::ZERO);
    // Refused by the router.
    assert_eq!(send(listen, "/sleep", false).await, 404);
    // The key was in play: the engines received it (and never the client's token).
    let seen = eng[1]
        .requests()
        .into_iter()
        .find(|r| r.method == "POST")
        .expect("engine 1 served");
    assert_eq!(
        seen.header("authorization"),
        Some(format!("Bearer {ENGINE_KEY}").as_str())
    );
    // A few more health checks and stats scrapes (they carry the key too).
    tokio::time::sleep(Duration::from_millis(600)).await;

    let _ = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status();
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > Duration::from_secs(10) {
            let _ = child.kill();
            let _ = child.wait();
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = std::fs::read_to_string(&out_path).unwrap_or_default()
        + &std::fs::read_to_string(&err_path).unwrap_or_default();
    let _ = std::fs::remove_dir_all(dir);
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_key_or_token_appears_in_the_output_at_trace() {
    let out = run_at_trace(false).await;
    assert!(
        out.contains("pingora_proxy") && out.contains("Fail to proxy"),
        "Pingora's own warn/error lines still appear:\n{out}"
    );
    for secret in [ENGINE_KEY, CLIENT_TOKEN, CLIENT_X_API_KEY] {
        let hits: Vec<&str> = out.lines().filter(|l| l.contains(secret)).collect();
        assert!(
            hits.is_empty(),
            "`{secret}` was logged ({} lines), e.g.: {}",
            hits.len(),
            hits[0]
        );
    }
    for capped in ["pingora", "reqwest", "hyper", "h2"] {
        for level in ["DEBUG", "TRACE"] {
            let tag = format!(" {level} {capped}");
            assert!(
                !out.lines().any(|l| l.contains(&tag)),
                "a {level} line from {capped} got through"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_cap_lifted_pingora_prints_the_engine_key() {
    let out = run_at_trace(true).await;
    assert!(
        out.contains("WARNING") && out.contains(infergate::logging::UNCAP_ENV),
        "the lifted cap is announced"
    );
    assert!(
        out.lines()
            .any(|l| l.contains(" DEBUG pingora") || l.contains(" TRACE pingora")),
        "RUST_LOG=trace reached Pingora"
    );
    assert!(
        out.contains(ENGINE_KEY),
        "the scenario exercises Pingora's header logging (else the capped run proves nothing)"
    );
}
