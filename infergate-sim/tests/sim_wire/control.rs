//! Runtime control (failure injection, refusing connections, idle connections), `/sim/*` and shutdown.

use std::time::{Duration, Instant};

use futures_util::StreamExt;
use infergate_sim::{fnv64, spawn_engine, spawn_engine_blocking};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::common::*;

#[tokio::test(flavor = "multi_thread")]
async fn fail_status_health_status_and_slow_headers() {
    let e = spawn_engine(scaled(0.1)).await.unwrap();
    let c = reqwest::Client::new();
    let url = format!("{}/v1/chat/completions", e.url());
    e.control.set_fail_status(Some(503));
    let r = c.post(&url).json(&chat("x", 1, true)).send().await.unwrap();
    assert_eq!(r.status(), 503);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], 503);
    assert!(v["error"]["message"].is_string());
    // Health is separate.
    assert_eq!(
        c.get(format!("{}/health", e.url()))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    e.control.set_health_status(500);
    assert_eq!(
        c.get(format!("{}/health", e.url()))
            .send()
            .await
            .unwrap()
            .status(),
        500
    );
    e.control.set_fail_status(None);
    assert_eq!(
        c.post(&url)
            .json(&chat("x", 1, false))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );

    // The same through /sim/control (what scripts use on a child process).
    let ctl = format!("{}/sim/control", e.url());
    let v: Value = c
        .post(&ctl)
        .json(&json!({"fail_status": 429, "health_status": 200}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["fail_status"], 429);
    assert_eq!(
        c.post(&url)
            .json(&chat("x", 1, false))
            .send()
            .await
            .unwrap()
            .status(),
        429
    );
    assert_eq!(
        c.get(format!("{}/health", e.url()))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    c.post(&ctl)
        .json(&json!({"fail_status": null, "slow_headers_ms": 300}))
        .send()
        .await
        .unwrap();
    assert_eq!(e.control.fail_status(), None);
    let t0 = Instant::now();
    let r = c.post(&url).json(&chat("x", 1, true)).send().await.unwrap();
    assert!(
        t0.elapsed() >= Duration::from_millis(280),
        "headers after {:?}",
        t0.elapsed()
    );
    assert_eq!(r.status(), 200);
    r.text().await.unwrap();
    assert_eq!(
        c.post(&ctl)
            .json(&json!({"bogus": 1}))
            .send()
            .await
            .unwrap()
            .status(),
        400
    );
    c.post(&ctl)
        .json(&json!({"reset": true}))
        .send()
        .await
        .unwrap();
    assert_eq!(e.control.slow_headers(), Duration::ZERO);
}

#[tokio::test(flavor = "multi_thread")]
async fn close_mid_stream_cuts_the_connection_and_aborts() {
    let e = spawn_engine(scaled(0.2)).await.unwrap();
    e.control.set_close_mid_stream_after(Some(2));
    let resp = reqwest::Client::new()
        .post(format!("{}/v1/chat/completions", e.url()))
        .json(&chat("cut me", 10, true))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let mut stream = resp.bytes_stream();
    let mut got = Vec::new();
    let mut failed = false;
    while let Some(b) = stream.next().await {
        match b {
            Ok(b) => got.extend_from_slice(&b),
            Err(_) => {
                failed = true;
                break;
            }
        }
    }
    assert!(
        failed,
        "the stream ended cleanly: {}",
        String::from_utf8_lossy(&got)
    );
    let text = String::from_utf8(got).unwrap();
    assert_eq!(text.matches("data: ").count(), 2, "{text}");
    assert!(!text.contains("[DONE]"));
    wait_until("the abort", Duration::from_secs(3), || {
        e.stats().aborted == 1 && e.stats().running == 0
    })
    .await;
}

#[tokio::test(flavor = "multi_thread")]
async fn error_mid_stream_ends_the_stream_with_vllms_error_event() {
    let e = spawn_engine(scaled(0.2)).await.unwrap();
    e.control.set_error_mid_stream_after(Some(2));
    let c = reqwest::Client::new();
    let text = c
        .post(format!("{}/v1/chat/completions", e.url()))
        .json(&chat("fail me", 10, true))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    // Two events of output, the error (as vLLM 0.32 words it when its engine core dies), [DONE], a clean end.
    let events: Vec<&str> = text.split("\n\n").filter(|e| !e.is_empty()).collect();
    assert_eq!(events.len(), 4, "{text}");
    let err: Value = serde_json::from_str(events[2].trim_start_matches("data: ")).unwrap();
    assert_eq!(err["error"]["code"], 500, "{text}");
    assert_eq!(err["error"]["type"], "InternalServerError");
    assert_eq!(events[3], "data: [DONE]");
    // Before any output, and Anthropic's shape for messages.
    e.control.set_error_mid_stream_after(Some(0));
    let text = c
        .post(format!("{}/v1/messages", e.url()))
        .json(
            &json!({"model": "sim-model", "max_tokens": 5, "stream": true,
                      "messages": [{"role": "user", "content": "fail me"}]}),
        )
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        text.starts_with("event: error\ndata: ") && text.contains("\"internal_error\""),
        "{text}"
    );
    e.control.reset();
    assert_eq!(e.control.error_mid_stream_after(), None);
}

#[tokio::test(flavor = "multi_thread")]
async fn refuse_connections_refuses_then_serves_again_on_the_same_port() {
    let e = spawn_engine(scaled(0.1)).await.unwrap();
    let addr = e.addr;
    // An established keep-alive connection survives the listener closing. Wait until the engine has accepted
    // it: a connection still in the kernel's accept queue is reset when the listener closes.
    let mut kept = TcpStream::connect(addr).await.unwrap();
    wait_until(
        "the connection to be accepted",
        Duration::from_secs(5),
        || e.control.open_connections() == 1,
    )
    .await;
    e.control.refuse_connections(true).unwrap();
    assert!(e.control.is_refusing());
    let err = TcpStream::connect(addr).await.unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionRefused);
    kept.write_all(b"GET /health HTTP/1.1\r\n\r\n")
        .await
        .unwrap();
    assert_eq!(read_response(&mut kept).await.unwrap().0, 200);

    e.control.refuse_connections(false).unwrap();
    let r = reqwest::get(format!("{}/health", e.url())).await.unwrap();
    assert_eq!(r.status(), 200);
    // Toggling twice in a row is harmless.
    e.control.refuse_connections(false).unwrap();
    e.control.refuse_connections(true).unwrap();
    e.control.refuse_connections(true).unwrap();
    assert!(TcpStream::connect(addr).await.is_err());
    e.control.refuse_connections(false).unwrap();
    assert!(TcpStream::connect(addr).await.is_ok());

    // Scripts do the same through /sim/control: refuse for a while, then listen again by themselves.
    let r = reqwest::Client::new()
        .post(format!("{}/sim/control", e.url()))
        .json(&json!({"refuse_connections_ms": 300}))
        .send()
        .await
        .unwrap();
    assert_eq!(
        r.json::<Value>().await.unwrap()["refusing_connections"],
        true
    );
    assert!(TcpStream::connect(addr).await.is_err());
    wait_until("listening again", Duration::from_secs(3), || {
        !e.control.is_refusing()
    })
    .await;
    assert!(TcpStream::connect(addr).await.is_ok());
}

#[tokio::test(flavor = "multi_thread")]
async fn idle_connections_can_be_dropped_or_poisoned() {
    let e = spawn_engine(scaled(0.1)).await.unwrap();
    // drop: the idle connection gets a FIN right away.
    let mut s = TcpStream::connect(e.addr).await.unwrap();
    s.write_all(b"GET /health HTTP/1.1\r\n\r\n").await.unwrap();
    assert_eq!(read_response(&mut s).await.unwrap().0, 200);
    assert_eq!(e.control.drop_idle_connections(), 1);
    let mut b = [0u8; 16];
    let n = tokio::time::timeout(Duration::from_secs(1), s.read(&mut b))
        .await
        .unwrap();
    assert!(matches!(n, Ok(0) | Err(_)), "{n:?}");
    wait_until("the registry to empty", Duration::from_secs(1), || {
        e.control.open_connections() == 0
    })
    .await;

    // poison: the connection stays open, the next request on it is reset without an answer.
    let mut s = TcpStream::connect(e.addr).await.unwrap();
    s.write_all(b"GET /health HTTP/1.1\r\n\r\n").await.unwrap();
    assert_eq!(read_response(&mut s).await.unwrap().0, 200);
    assert_eq!(e.control.poison_idle_connections(), 1);
    tokio::time::sleep(Duration::from_millis(20)).await;
    s.write_all(b"GET /health HTTP/1.1\r\n\r\n").await.unwrap();
    let r = tokio::time::timeout(Duration::from_secs(1), read_response(&mut s))
        .await
        .unwrap();
    assert!(r.is_err(), "got an answer on a poisoned connection");

    // A connection busy with a request is neither dropped nor poisoned.
    let c = reqwest::Client::new();
    let resp = c
        .post(format!("{}/v1/chat/completions", e.url()))
        .json(&chat("busy", 50, true))
        .send()
        .await
        .unwrap();
    assert_eq!(e.control.drop_idle_connections(), 0);
    assert_eq!(e.control.poison_idle_connections(), 0);
    let text = resp.text().await.unwrap();
    assert!(text.ends_with("data: [DONE]\n\n"));
    // Once the response is complete the connection is idle at once.
    assert_eq!(e.control.drop_idle_connections(), 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn stats_endpoint_and_shutdown() {
    let e = spawn_engine(scaled(0.1)).await.unwrap();
    let c = reqwest::Client::new();
    c.post(format!("{}/v1/completions", e.url()))
        .json(&json!({"prompt": "a b c", "max_tokens": 2}))
        .send()
        .await
        .unwrap();
    let v: Value = c
        .get(format!("{}/sim/stats", e.url()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    for k in [
        "requests",
        "prompt_tokens",
        "computed_prompt_tokens",
        "cached_prompt_tokens",
        "generation_tokens",
        "running",
        "waiting",
        "kv_cache_usage",
    ] {
        assert!(v.get(k).is_some(), "{k} missing from {v}");
    }
    assert_eq!(v["requests"], 1);
    assert_eq!(v["generation_tokens"], 2);
    assert_eq!(v["prompt_tokens"], 3);
    // The recorded requests, as scripts read them: the completion, the stats call and this call itself.
    let body = serde_json::to_vec(&json!({"prompt": "a b c", "max_tokens": 2})).unwrap();
    let v: Value = c
        .get(format!("{}/sim/requests", e.url()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let recorded = v.as_array().unwrap();
    assert_eq!(recorded.len(), 3, "{v}");
    assert_eq!(recorded[0]["path"], "/v1/completions");
    assert_eq!(recorded[0]["body_len"], body.len());
    assert_eq!(recorded[0]["body_fnv64"], format!("{:016x}", fnv64(&body)));
    assert_eq!(recorded[1]["path"], "/sim/stats");
    assert_eq!(recorded[2]["path"], "/sim/requests");
    let addr = e.addr;
    e.shutdown().await;
    assert!(TcpStream::connect(addr).await.is_err());
}

#[test]
fn blocking_engine_from_a_plain_thread() {
    use std::io::{Read, Write};
    let e = spawn_engine_blocking(scaled(0.1)).unwrap();
    let mut s = std::net::TcpStream::connect(e.addr).unwrap();
    s.write_all(b"GET /sim/stats HTTP/1.1\r\nconnection: close\r\n\r\n")
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    assert!(out.starts_with("HTTP/1.1 200 OK\r\n"));
    assert!(out.contains("\"http_requests\":1"));
    e.control.refuse_connections(true).unwrap();
    e.control.refuse_connections(false).unwrap();
    assert!(std::net::TcpStream::connect(e.addr).is_ok());
    let addr = e.addr;
    e.shutdown_blocking();
    assert!(std::net::TcpStream::connect(addr).is_err());
}
