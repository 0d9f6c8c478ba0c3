//! Connection-level behaviour real clients and operators rely on: pipelined requests, the final failed attempt
//! in the request counter, and a reload that rotates a key without resetting the endpoint.

use std::path::Path;
use std::time::Duration;

use crate::common::*;
use infergate::config::Config;
use infergate_sim::SimConfig;
use tokio::io::AsyncWriteExt;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_requests_are_all_answered_in_order() {
    let eng = engine(SimConfig::default()).await;
    let router = start_router(&pool_yaml("load_aware", &[eng.url()], "")).await;
    router.ready().await;
    let body =
        r#"{"model":"sim-model","messages":[{"role":"user","content":"hi"}],"max_tokens":2}"#;
    let one = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut s = tokio::net::TcpStream::connect(router.addr).await.unwrap();
    s.write_all(format!("{one}{one}GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let got = read_raw_until(&mut s, Duration::from_secs(5), |got| {
        String::from_utf8_lossy(got).matches("HTTP/1.1 200").count() == 3 && got.ends_with(b"]}")
    })
    .await;
    let text = String::from_utf8_lossy(&got);
    assert_eq!(text.matches("HTTP/1.1 200").count(), 3, "{text}");
    assert!(
        text.rfind("\"object\":\"list\"") > text.rfind("chat.completion"),
        "in order"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_final_failed_attempt_is_counted_against_its_endpoint() {
    let eng = engine(SimConfig::default()).await;
    let router = start_router(&pool_yaml("load_aware", &[eng.url()], "")).await;
    router.ready().await;
    eng.control.refuse_connections(true).unwrap();
    let resp = send_chat(&router.url(), chat_body(500, false, 2)).await;
    assert_eq!(resp.status(), 502);
    let label = format!("endpoint=\"{}\"", eng.url().trim_start_matches("http://"));
    // The answer goes out before Pingora's logging hook counts it: poll briefly.
    let counted = |m: &str| metric_value(m, "infergate_requests_total", &[&label, "code=\"502\""]);
    let m = router.metrics_when(|m| counted(m) == Some(1.0)).await;
    assert_eq!(counted(&m), Some(1.0));
    eng.control.refuse_connections(false).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_rotates_a_key_keeps_the_endpoint() {
    let eng = engine(SimConfig::default()).await;
    let dir = std::env::temp_dir().join(format!("infergate-keys-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let key = dir.join("engine.key");
    std::fs::write(&key, "first-key\n").unwrap();
    let yaml = pool_yaml("load_aware", &[eng.url()], "").replace(
        &format!("      - url: \"{}\"\n", eng.url()),
        &format!(
            "      - url: \"{}\"\n        api_key_file: \"{}\"\n",
            eng.url(),
            key.display()
        ),
    );
    let router = start_router(&yaml).await;
    router.ready().await;
    let before = router.state.pools.pools[0].endpoints()[0].clone();
    assert_eq!(before.api_key().as_deref(), Some("first-key"));
    // A long request in flight across the reload.
    let slow = post_json(&client(), &router.url(), CHAT)
        .body(chat_body(400, false, 200))
        .send();
    let slow = tokio::spawn(async move { slow.await.map(|r| r.status().as_u16()) });
    router
        .wait_for("one request in flight", Duration::from_secs(5), |r| {
            r.endpoint_load(0).1 == 1
        })
        .await;

    std::fs::write(&key, "second-key\n").unwrap();
    let text = yaml
        .replace("{listen}", &router.addr.to_string())
        .replace("{metrics}", &router.metrics_addr.to_string());
    let cfg = Config::parse(Path::new("test.yaml"), &text).unwrap();
    router.state.reload_endpoints(&cfg);

    let after = router.state.pools.pools[0].endpoints()[0].clone();
    assert_eq!(after.id, before.id, "same endpoint: identity is the URL");
    assert_eq!(after.api_key().as_deref(), Some("second-key"));
    assert!(
        after.health.is_healthy(),
        "health kept, not back to unknown"
    );
    assert_eq!(
        router.endpoint_load(0).1,
        1,
        "the in-flight request still counts"
    );
    assert_eq!(slow.await.unwrap().unwrap(), 200);
    let resp = send_chat(&router.url(), chat_body(300, false, 2)).await;
    assert_eq!(resp.status(), 200);
    let last = last_generate(&eng).unwrap();
    assert_eq!(last.header("authorization"), Some("Bearer second-key"));
    router.wait_idle().await;
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_request_head_gets_a_json_400() {
    let eng = engine(SimConfig::default()).await;
    let router = start_router(&pool_yaml("load_aware", &[eng.url()], "")).await;
    router.ready().await;
    let mut s = tokio::net::TcpStream::connect(router.addr).await.unwrap();
    s.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nHost x\r\nbad header line\r\n\r\n")
        .await
        .unwrap();
    let got = read_raw_until(&mut s, Duration::from_secs(5), |got| got.ends_with(b"}}")).await;
    let text = String::from_utf8_lossy(&got);
    assert!(text.starts_with("HTTP/1.1 400"), "{text}");
    assert!(text.contains(r#""error":{"#), "OpenAI-style body: {text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chunked_turn_records_its_whole_size_for_the_next_estimate() {
    let eng = engine(SimConfig::default()).await;
    let router = start_router(&pool_yaml("load_aware", &[eng.url()], &sessions_yaml(100))).await;
    router.ready().await;
    // Turn 1: 200 KB, chunked. Turn 2 grows it by about 1 KB: a sticky turn counts only the growth, which is
    // right only if turn 1 was recorded at its whole streamed size (not the first chunk's).
    let turn1 = chat_body(200_000, true, 2);
    let resp = post_json(&client(), &router.url(), "/v1/chat/completions")
        .header("x-session-id", "chunky")
        .body(chunked(&turn1, 16 * 1024))
        .send()
        .await
        .unwrap();
    assert_eq!(finish(resp).await, 200);
    router.wait_idle().await;
    let before = router
        .metric_sum("infergate_prefill_tokens_estimated_total", &[])
        .await;
    assert_eq!(
        post_chat_in_session(&router.url(), "chunky", chat_body(201_000, true, 2)).await,
        200
    );
    router.wait_idle().await;
    let m = router
        .metrics_when(|m| {
            metric_sum(m, "infergate_placements_total", &["reason=\"sticky\""]) == 1.0
        })
        .await;
    let growth = metric_sum(&m, "infergate_prefill_tokens_estimated_total", &[]) - before;
    assert!(
        (200.0..=400.0).contains(&growth),
        "the sticky turn counted {growth} tokens; its growth is about 250"
    );
}
