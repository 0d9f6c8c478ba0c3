//! The HTTP/1.1 layer: big and chunked bodies, `Expect: 100-continue`, pipelining, keep-alive timeout.

use std::time::{Duration, Instant};

use infergate_sim::{fnv64, spawn_engine, SimConfig};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::common::*;

#[tokio::test(flavor = "multi_thread")]
async fn big_bodies_with_content_length_and_chunked() {
    let e = spawn_engine(scaled(0.002)).await.unwrap();
    let c = reqwest::Client::new();
    let prompt = words(560_000, "wor"); // ~4.7 MiB
    let body = serde_json::to_vec(&json!({"prompt": prompt, "max_tokens": 1})).unwrap();
    assert!(body.len() >= 4 << 20);
    let r = c
        .post(format!("{}/v1/completions", e.url()))
        .header("content-type", "application/json")
        .body(body.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["usage"]["prompt_tokens"], 560_000);

    // The same body as a chunked stream of 64 KiB pieces.
    let pieces: Vec<Result<Vec<u8>, std::io::Error>> =
        body.chunks(64 * 1024).map(|c| Ok(c.to_vec())).collect();
    let r = c
        .post(format!("{}/v1/completions", e.url()))
        .header("content-type", "application/json")
        .body(reqwest::Body::wrap_stream(futures_util::stream::iter(
            pieces,
        )))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let reqs = e.requests();
    assert_eq!(reqs.len(), 2);
    assert_eq!(
        reqs[0].header("content-length").unwrap(),
        body.len().to_string()
    );
    assert_eq!(reqs[1].header("transfer-encoding"), Some("chunked"));
    for r in &reqs {
        assert_eq!(r.method, "POST");
        assert_eq!(r.path, "/v1/completions");
        assert_eq!(r.body_len, body.len());
        assert_eq!(r.body_fnv64, fnv64(&body));
    }
    // The second prefill hit the cache for all but the last (partial) block.
    assert!(e.stats().cached_prompt_tokens >= 559_000);
}

#[tokio::test(flavor = "multi_thread")]
async fn raw_chunked_body_with_expect_continue_and_pipelining() {
    let e = spawn_engine(scaled(0.1)).await.unwrap();
    let mut s = TcpStream::connect(e.addr).await.unwrap();
    let body = serde_json::to_vec(&chat("raw chunked request", 2, false)).unwrap();
    let head =
        "POST /v1/chat/completions?x=1 HTTP/1.1\r\nhost: sim\r\ncontent-type: application/json\r\n\
                transfer-encoding: chunked\r\nexpect: 100-continue\r\n\r\n";
    s.write_all(head.as_bytes()).await.unwrap();
    let mut cont = [0u8; 25];
    s.read_exact(&mut cont).await.unwrap();
    assert_eq!(&cont, b"HTTP/1.1 100 Continue\r\n\r\n");
    let (a, b) = body.split_at(10);
    s.write_all(format!("{:x};ext=1\r\n", a.len()).as_bytes())
        .await
        .unwrap();
    s.write_all(a).await.unwrap();
    s.write_all(format!("\r\n{:X}\r\n", b.len()).as_bytes())
        .await
        .unwrap();
    s.write_all(b).await.unwrap();
    s.write_all(b"\r\n0\r\ntrailer: x\r\n\r\n").await.unwrap();
    let (status, _, resp) = read_response(&mut s).await.unwrap();
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&resp));
    let v: Value = serde_json::from_slice(&resp).unwrap();
    assert_eq!(v["usage"]["completion_tokens"], 2);
    let rec = e.requests();
    assert_eq!(rec[0].path, "/v1/chat/completions");
    assert_eq!(rec[0].body_fnv64, fnv64(&body));

    // Two pipelined requests on the same keep-alive connection; the second asks to close.
    s.write_all(b"GET /health HTTP/1.1\r\nhost: x\r\n\r\nGET /v1/models HTTP/1.1\r\nconnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut rest = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut rest))
        .await
        .unwrap()
        .unwrap();
    let text = String::from_utf8(rest).unwrap();
    assert_eq!(text.matches("HTTP/1.1 200 OK\r\n").count(), 2, "{text}");
    assert!(text.contains("connection: close\r\n"));
    assert!(text.ends_with("}") && text.contains("sim-model"));
    assert_eq!(e.requests().len(), 3);
}

#[tokio::test(flavor = "multi_thread")]
async fn keep_alive_timeout_closes_idle_connections() {
    let cfg = SimConfig {
        keep_alive_timeout: Some(Duration::from_millis(100)),
        ..scaled(0.1)
    };
    let e = spawn_engine(cfg).await.unwrap();
    let mut s = TcpStream::connect(e.addr).await.unwrap();
    s.write_all(b"GET /health HTTP/1.1\r\n\r\n").await.unwrap();
    assert_eq!(read_response(&mut s).await.unwrap().0, 200);
    let t0 = Instant::now();
    let mut b = [0u8; 8];
    let n = tokio::time::timeout(Duration::from_secs(2), s.read(&mut b))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(n, 0);
    assert!(
        t0.elapsed() >= Duration::from_millis(80),
        "closed after {:?}",
        t0.elapsed()
    );
}
