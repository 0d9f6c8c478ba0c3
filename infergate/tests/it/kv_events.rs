//! KV-cache events over real ZMQ sockets: engine-sim's publisher fills the router's index; a publisher written
//! here injects gaps, garbage, silence, removals and clears; a stale index leaves placement on its guess.

use std::time::{Duration, Instant};

use bytes::Bytes;
use infergate::kv_events::block_keys;
use infergate_sim::SimConfig;
use serde::Serialize;
use zeromq::{Socket, SocketSend, ZmqMessage};

use crate::common::*;

/// A pool whose endpoints subscribe to the given publishers (`kv_events` per endpoint).
fn kv_yaml(urls: &[String], publishers: &[String], pool_kv: &str) -> String {
    let eps: String = urls
        .iter()
        .zip(publishers)
        .map(|(u, p)| format!("      - url: \"{u}\"\n        kv_events: \"{p}\"\n"))
        .collect();
    format!(
        "listen: \"{{listen}}\"\nmetrics_listen: \"{{metrics}}\"\n\
         timeouts: {{ connect: 1s, response_header: 30s, stream_idle: 30s }}\n\
         pools:\n  - name: default\n    models: [\"*\"]\n    policy: predicted_ttft\n    endpoints:\n{eps}\
         \x20   health_check: {{ path: /health, interval: 200ms, timeout: 500ms, healthy_after: 1, unhealthy_after: 1 }}\n\
         \x20   kv_events: {pool_kv}\n"
    )
}

fn kv_gauge(m: &str, name: &str) -> f64 {
    metric_sum(m, name, &[])
}

async fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_sim_publishes_and_the_router_index_grows() {
    // vLLM given `tcp://127.0.0.1:P` connects: the router binds P.
    let port = free_port();
    let addr = format!("tcp://127.0.0.1:{port}");
    let router_first = kv_yaml(
        &["http://127.0.0.1:1".to_string()],
        std::slice::from_ref(&addr),
        "{ bind: true, block_size: 16, stale_after: 5s }",
    );
    // The router binds before the engine connects (its messages before that would be lost: a gap).
    let eng_port = free_port();
    let yaml = router_first.replace(
        "http://127.0.0.1:1",
        &format!("http://127.0.0.1:{eng_port}"),
    );
    let router = start_router(&yaml).await;
    let eng = infergate_sim::spawn_engine_on(
        format!("127.0.0.1:{eng_port}").parse().unwrap(),
        SimConfig {
            kv_events: Some(addr.clone()),
            ..time_scaled(0.05)
        },
    )
    .await
    .unwrap();
    router.all_healthy().await;
    let ep = router.state.pools.pools[0].endpoints()[0].clone();
    wait_until("the engine to connect", || {
        ep.kv.stale_reason(Instant::now()) == Some("no message yet")
    })
    .await;
    // 2,000-byte prompt: the sim's whole 16-token blocks are stored and published.
    assert_eq!(
        post_chat(&router.url(), chat_body(2_000, false, 4)).await,
        200
    );
    let text = router
        .metrics_when(|m| kv_gauge(m, "infergate_kv_index_blocks") > 0.0)
        .await;
    let blocks = kv_gauge(&text, "infergate_kv_index_blocks");
    assert_eq!(blocks as usize, ep.kv.blocks());
    assert!(
        metric_sum(
            &text,
            "infergate_kv_events_total",
            &["type=\"BlockStored\""]
        ) >= 1.0,
        "{text}"
    );
    assert_eq!(kv_gauge(&text, "infergate_kv_event_gaps_total"), 0.0);
    assert_eq!(kv_gauge(&text, "infergate_kv_index_stale"), 0.0);
    assert_eq!(
        metric_sum(&text, "infergate_kv_events_total", &["type=\"invalid\""]),
        0.0
    );
    // The same prompt again: a cache hit stores nothing new.
    assert_eq!(
        post_chat(&router.url(), chat_body(2_000, false, 4)).await,
        200
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(ep.kv.blocks() as f64, blocks);
    drop(eng);
}

#[derive(Serialize)]
#[serde(tag = "type")]
enum Ev {
    BlockStored {
        block_hashes: Vec<u64>,
        parent_block_hash: Option<u64>,
        token_ids: Vec<u32>,
        block_size: usize,
        lora_id: Option<u64>,
        lora_name: Option<String>,
        medium: &'static str,
        extra_keys: Vec<Option<()>>,
        group_idx: u32,
        kv_cache_spec_kind: &'static str,
    },
    BlockRemoved {
        block_hashes: Vec<u64>,
        medium: &'static str,
    },
    AllBlocksCleared {},
}

fn stored(hashes: &[u64], parent: Option<u64>, tokens: &[u32]) -> Ev {
    Ev::BlockStored {
        block_hashes: hashes.to_vec(),
        parent_block_hash: parent,
        token_ids: tokens.to_vec(),
        block_size: 4,
        lora_id: None,
        lora_name: None,
        medium: "GPU",
        extra_keys: vec![None; hashes.len()],
        group_idx: 0,
        kv_cache_spec_kind: "full_attention",
    }
}

async fn send(p: &mut zeromq::PubSocket, seq: u64, payload: Vec<u8>) {
    let msg = ZmqMessage::try_from(vec![
        Bytes::from_static(b"kv"),
        Bytes::copy_from_slice(&seq.to_be_bytes()),
        Bytes::from(payload),
    ])
    .unwrap();
    p.send(msg).await.unwrap();
}

fn batch(events: &[Ev]) -> Vec<u8> {
    rmp_serde::to_vec_named(&(1.5f64, events, Some(0u32))).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gaps_garbage_silence_removals_and_a_vanished_publisher() {
    // vLLM given `tcp://*:P` binds: the router connects.
    let port = free_port();
    let mut publisher = zeromq::PubSocket::new();
    publisher
        .bind(&format!("tcp://127.0.0.1:{port}"))
        .await
        .unwrap();
    let eng = engines(1, time_scaled(0.05)).await;
    let router = start_router(&kv_yaml(
        &urls(&eng),
        &[format!("tcp://127.0.0.1:{port}")],
        "{ block_size: 4, stale_after: 1s }",
    ))
    .await;
    router.all_healthy().await;
    let pool = router.state.pools.pools[0].clone();
    let ep = pool.endpoints()[0].clone();
    let prompt: Vec<u32> = (500..514).collect(); // 3 whole blocks and 2 tokens
    let keys = block_keys(&prompt, 4);
    let held = || ep.kv.held_tokens(&keys, Instant::now());

    // Seq 0, repeated until the subscription is through (repeats are duplicates and skipped).
    let first = batch(&[
        stored(&[0x11, 0x22], None, &prompt[..8]),
        stored(&[0x33], Some(0x22), &prompt[8..12]),
    ]);
    let deadline = Instant::now() + Duration::from_secs(15);
    while ep.kv.blocks() < 3 {
        assert!(Instant::now() < deadline, "no message got through");
        send(&mut publisher, 0, first.clone()).await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(held(), Some(12));
    // The glue fills each candidate's exact figure from the index.
    let eps = pool.endpoints();
    let mut cands = pool.candidates(&eps, &[], Instant::now());
    pool.fill_kv_held(&eps, &mut cands, &prompt, Instant::now());
    assert_eq!(cands[0].kv_held_tokens, Some(12));

    // Garbage: counted, skipped, the subscriber lives on.
    send(&mut publisher, 1, vec![0xc1, 0x00, 0xff]).await;
    send(&mut publisher, 2, b"not msgpack at all".to_vec()).await;
    let m = router
        .metrics_when(|m| metric_sum(m, "infergate_kv_events_total", &["type=\"invalid\""]) >= 2.0)
        .await;
    assert!(m.contains("infergate_kv_index_blocks"), "{m}");

    // A gap (3 and 4 lost): counted, stale, placement falls back (None, not "holds nothing").
    send(&mut publisher, 5, batch(&[])).await;
    router
        .metrics_when(|m| metric_sum(m, "infergate_kv_event_gaps_total", &[]) >= 1.0)
        .await;
    assert_eq!(held(), None);
    let mut cands = pool.candidates(&eps, &[], Instant::now());
    pool.fill_kv_held(&eps, &mut cands, &prompt, Instant::now());
    assert_eq!(cands[0].kv_held_tokens, None);
    let m = router.metrics_text().await;
    assert_eq!(metric_sum(&m, "infergate_kv_index_stale", &[]), 1.0, "{m}");
    // Trusted again after stale_after, the gap counted.
    wait_until("the gap to age out", || held() == Some(12)).await;

    // BlockRemoved (vLLM's hashes only) and AllBlocksCleared shrink it.
    send(
        &mut publisher,
        6,
        batch(&[Ev::BlockRemoved {
            block_hashes: vec![0x33],
            medium: "GPU",
        }]),
    )
    .await;
    wait_until("the removal", || ep.kv.blocks() == 2).await;
    assert_eq!(held(), Some(8));
    send(&mut publisher, 7, batch(&[Ev::AllBlocksCleared {}])).await;
    wait_until("the clear", || ep.kv.blocks() == 0).await;
    assert_eq!(held(), Some(0));
    let m = router.metrics_text().await;
    assert_eq!(
        metric_sum(&m, "infergate_kv_events_total", &["type=\"BlockRemoved\""]),
        1.0
    );
    assert_eq!(
        metric_sum(
            &m,
            "infergate_kv_events_total",
            &["type=\"AllBlocksCleared\""]
        ),
        1.0
    );

    // Silence: a request was sent to it and nothing came for stale_after.
    assert_eq!(
        post_chat(&router.url(), chat_body(400, false, 2)).await,
        200
    );
    wait_until("silence to make it stale", || held().is_none()).await;
    assert_eq!(ep.kv.stale_reason(Instant::now()), Some("silent publisher"));
    send(&mut publisher, 8, batch(&[])).await;
    wait_until("a message to end the silence", || held() == Some(0)).await;

    // The publisher vanishes.
    drop(publisher);
    wait_until("the publisher to be gone", || held().is_none()).await;
    assert_eq!(
        ep.kv.stale_reason(Instant::now()),
        Some("no publisher connected")
    );
    router.wait_idle().await;
}
