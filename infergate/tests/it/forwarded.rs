//! What an engine receives about the client: `X-Forwarded-For` and `Forwarded` extended with the client address
//! (once, also on a retried request), `X-Real-IP` set to it unless the peer is a trusted proxy.

use std::time::Duration;

use crate::common::*;
use infergate_sim::{self as sim, RecordedRequest, SimConfig};

const CHAT: &str =
    r#"{"model":"sim-model","messages":[{"role":"user","content":"hi"}],"max_tokens":2}"#;

async fn ready(router: &TestRouter, n: usize) {
    router
        .wait_for("endpoints healthy", Duration::from_secs(10), |r| {
            r.state.pools.pools[0]
                .endpoints()
                .iter()
                .filter(|e| e.health.is_healthy())
                .count()
                == n
        })
        .await;
}

fn last_generation(e: &sim::EngineHandle) -> RecordedRequest {
    e.requests()
        .into_iter()
        .rev()
        .find(|r| r.method == "POST")
        .expect("a generation request reached the engine")
}

async fn post(router: &TestRouter, headers: &[(&str, &str)]) -> u16 {
    let mut req = client()
        .post(format!("{}/v1/chat/completions", router.url()))
        .header("content-type", "application/json")
        .body(CHAT);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = req.send().await.expect("response");
    let status = resp.status().as_u16();
    let _ = resp.bytes().await;
    status
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_address_is_appended_and_is_the_real_ip() {
    let eng = sim::spawn_engine(SimConfig::default()).await.unwrap();
    // A trusted network the test client is not in.
    let yaml = pool_yaml("load_aware", &[eng.url()], "")
        .replace("pools:", "trusted_proxies: [\"10.0.0.0/8\"]\npools:");
    let router = start_router(&yaml).await;
    ready(&router, 1).await;

    assert_eq!(post(&router, &[]).await, 200);
    let r = last_generation(&eng);
    assert_eq!(r.header("x-forwarded-for"), Some("127.0.0.1"));
    assert_eq!(r.header("forwarded"), Some("for=127.0.0.1"));
    assert_eq!(r.header("x-real-ip"), Some("127.0.0.1"));

    let sent = [
        ("x-forwarded-for", "198.51.100.1, 192.0.2.4"),
        ("forwarded", "for=198.51.100.1;proto=https"),
        ("x-real-ip", "198.51.100.1"),
    ];
    assert_eq!(post(&router, &sent).await, 200);
    let r = last_generation(&eng);
    assert_eq!(
        r.header("x-forwarded-for"),
        Some("198.51.100.1, 192.0.2.4, 127.0.0.1")
    );
    assert_eq!(
        r.header("forwarded"),
        Some("for=198.51.100.1;proto=https, for=127.0.0.1")
    );
    assert_eq!(
        r.header("x-real-ip"),
        Some("127.0.0.1"),
        "an untrusted peer's X-Real-IP is replaced"
    );
    router.wait_idle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trusted_proxy_keeps_its_real_ip_and_a_retry_appends_once() {
    let eng = [
        sim::spawn_engine(SimConfig::default()).await.unwrap(),
        sim::spawn_engine(SimConfig::default()).await.unwrap(),
    ];
    // round_robin places the first request on engine 0, which refuses it: it is retried on engine 1.
    eng[0].control.set_fail_status(Some(503));
    let urls: Vec<String> = eng.iter().map(|e| e.url()).collect();
    let yaml = pool_yaml("round_robin", &urls, "")
        .replace("pools:", "trusted_proxies: [\"127.0.0.0/8\"]\npools:");
    let router = start_router(&yaml).await;
    ready(&router, 2).await;

    let sent = [
        ("x-forwarded-for", "198.51.100.1"),
        ("x-real-ip", "198.51.100.1"),
    ];
    assert_eq!(post(&router, &sent).await, 200);
    let refused = last_generation(&eng[0]);
    assert_eq!(
        refused.refused,
        Some(503),
        "the first attempt went to engine 0"
    );
    let served = last_generation(&eng[1]);
    for r in [&refused, &served] {
        assert_eq!(r.header("x-forwarded-for"), Some("198.51.100.1, 127.0.0.1"));
        assert_eq!(r.header("forwarded"), Some("for=127.0.0.1"));
        assert_eq!(
            r.header("x-real-ip"),
            Some("198.51.100.1"),
            "kept: the peer is trusted"
        );
        assert_eq!(
            r.headers
                .iter()
                .filter(|(n, _)| n == "x-forwarded-for")
                .count(),
            1
        );
    }
    let m = router.metrics_text().await;
    assert_eq!(metric_sum(&m, "infergate_retries_total", &[]), 1.0);
    router.wait_idle().await;
}
