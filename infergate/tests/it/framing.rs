//! The request framing the router refuses (issue 27), on raw sockets as an attacker would send it: HTTP/1.1 without
//! Host, transfer codings other than chunked, protocol upgrades on an API call, oversized session keys; and an
//! engine that answers 101 unasked.

use std::time::Duration;

use tokio::io::AsyncWriteExt;

use crate::common::*;
use infergate_sim::SimConfig;

/// Send `head` (without its blank line) and `body` raw; the router's answer: status and body text.
async fn raw(router: &TestRouter, head: &str, body: &str) -> (u16, String) {
    let mut s = tokio::net::TcpStream::connect(router.addr).await.unwrap();
    s.write_all(format!("{head}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    s.write_all(body.as_bytes()).await.unwrap();
    let got = read_raw_until(&mut s, Duration::from_secs(10), |b| {
        let text = String::from_utf8_lossy(b);
        text.split_once("\r\n\r\n").is_some_and(|(h, rest)| {
            let len = h
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length:")
                        .map(|v| v.trim().to_string())
                })
                .and_then(|v| v.parse::<usize>().ok());
            len.is_some_and(|n| rest.len() >= n)
        })
    })
    .await;
    let text = String::from_utf8_lossy(&got).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_string();
    (status, body)
}

fn error_code(body: &str) -> String {
    serde_json::from_str::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["error"]["code"].as_str().map(str::to_string))
        .unwrap_or_else(|| format!("not an OpenAI error: {body}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broken_framing_is_refused_before_it_reaches_an_engine() {
    let eng = engines(1, SimConfig::default()).await;
    let router = start_router(&pool_yaml("load_aware", &urls(&eng), "")).await;
    router.all_healthy().await;
    let body = chat_body(200, false, 2);
    let len = body.len();
    let cases = [
        (
            format!("POST {CHAT} HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: {len}"),
            400,
            "bad_request",
        ),
        (
            format!("POST {CHAT} HTTP/1.1\r\nHost: a\r\nHost: b\r\nContent-Length: {len}"),
            400,
            "bad_request",
        ),
        (
            format!("POST {CHAT} HTTP/1.1\r\nHost: x\r\nConnection: keep-alive, Upgrade\r\nUpgrade: websocket\r\nContent-Length: {len}"),
            400,
            "bad_request",
        ),
    ];
    for (head, status, code) in &cases {
        let (got, text) = raw(&router, head, &body).await;
        assert_eq!(
            (got, error_code(&text).as_str()),
            (*status, *code),
            "{head}"
        );
    }
    // A transfer coding the router does not implement before a final chunked: 501. One that does not end in
    // chunked leaves the body's length unknown: 400 (RFC 9112 §6.3; Pingora refuses it while reading).
    let chunked = format!("{:x}\r\n{body}\r\n0\r\n\r\n", body.len());
    for (te, status, code) in [
        ("gzip, chunked", 501, "unsupported_transfer_coding"),
        ("deflate, chunked", 501, "unsupported_transfer_coding"),
        ("gzip", 400, "bad_request"),
        ("chunked, gzip", 400, "bad_request"),
        ("identity", 400, "bad_request"),
    ] {
        let head = format!("POST {CHAT} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: {te}");
        let (got, text) = raw(&router, &head, &chunked).await;
        assert_eq!(
            (got, error_code(&text).as_str()),
            (status, code),
            "{te}: {text}"
        );
    }
    assert_eq!(generate_requests(&eng[0]), 0, "nothing reached the engine");
    // Plain chunked and HTTP/1.0 without Host are served.
    let head = format!("POST {CHAT} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked");
    assert_eq!(raw(&router, &head, &chunked).await.0, 200);
    let head = format!("POST {CHAT} HTTP/1.0\r\nContent-Length: {len}");
    assert_eq!(raw(&router, &head, &body).await.0, 200);
    router.wait_idle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_keys_are_bounded() {
    let eng = engines(1, SimConfig::default()).await;
    let yaml = pool_yaml(
        "load_aware",
        &urls(&eng),
        "    sessions: { header: x-session-id, prompt_cache_key: true }\n",
    )
    .replace("pools:", "max_session_key_bytes: 64\npools:");
    let router = start_router(&yaml).await;
    router.all_healthy().await;
    let send = |key: String, in_body: bool| {
        let url = router.url();
        async move {
            let mut body: serde_json::Value =
                serde_json::from_str(&chat_body(200, false, 2)).unwrap();
            let mut req = post_json(&client(), &url, CHAT);
            if in_body {
                body["prompt_cache_key"] = key.into();
            } else {
                req = req.header(SESSION_HEADER, key);
            }
            let resp = req.body(body.to_string()).send().await.unwrap();
            let status = resp.status().as_u16();
            let code = error_code(&resp.text().await.unwrap());
            (status, code)
        }
    };
    assert_eq!(send("k".repeat(64), false).await.0, 200);
    assert_eq!(
        send("k".repeat(65), false).await,
        (431, "session_key_too_large".to_string())
    );
    assert_eq!(send("k".repeat(64), true).await.0, 200);
    assert_eq!(
        send("k".repeat(65), true).await,
        (400, "session_key_too_large".to_string())
    );
    assert_eq!(
        generate_requests(&eng[0]),
        2,
        "only the bounded keys were served"
    );
    router.wait_idle().await;
}

/// An engine whose health check passes and which answers every other request with 101 and raw bytes.
async fn switching_engine() -> String {
    raw_engine(|_| RawAnswer {
        wait: Duration::ZERO,
        bytes: b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\nRAW TUNNEL BYTES"
            .to_vec(),
        close: false,
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engines_unasked_101_never_reaches_the_client() {
    let url = switching_engine().await;
    let router = start_router(&pool_yaml("round_robin", &[url], "")).await;
    router.all_healthy().await;
    let resp = post_json(&client(), &router.url(), CHAT)
        .body(chat_body(200, true, 2))
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let text = resp.text().await.unwrap_or_default();
    assert_eq!(status, 502, "{text}");
    assert!(!text.contains("RAW TUNNEL"), "{text}");
    let m = router
        .metrics_when(|m| {
            metric_sum(
                m,
                "infergate_endpoint_failures_total",
                &["kind=\"protocol\""],
            ) > 0.0
        })
        .await;
    assert_eq!(
        metric_sum(
            &m,
            "infergate_endpoint_failures_total",
            &["kind=\"protocol\""]
        ),
        1.0
    );
    router.wait_idle().await;
}
