//! A pool's wait queue on real sockets: a request waits while every endpoint is at max_in_flight_per_endpoint and is
//! placed when a slot frees; a full queue and a wait past max_wait answer 503 with Retry-After; two keys take turns.

use std::time::{Duration, Instant};

use crate::common::*;
use infergate_sim::{self as sim, SimConfig};

const ALICE: &str = "sk-alice-0123456789abcdef";
const BOB: &str = "sk-bob-fedcba9876543210";

async fn engine(slow: Duration) -> sim::EngineHandle {
    let e = sim::spawn_engine(SimConfig::default())
        .await
        .expect("engine");
    e.control.set_slow_headers(slow);
    e
}

/// One engine, at most one request in flight, and the given queue.
async fn router(eng: &sim::EngineHandle, queue: &str, auth: &str) -> TestRouter {
    let extra = format!("    max_in_flight_per_endpoint: 1\n    queue: {queue}\n");
    let r = start_router(&format!(
        "{auth}{}",
        pool_yaml("load_aware", &[eng.url()], &extra)
    ))
    .await;
    r.wait_for("healthy", Duration::from_secs(10), |r| {
        r.state.pools.any_healthy()
    })
    .await;
    r
}

struct Answer {
    status: u16,
    retry_after: Option<String>,
    code: String,
    took: Duration,
}

async fn send(url: String, key: Option<&'static str>, body: String) -> Answer {
    let t0 = Instant::now();
    let mut req = client()
        .post(format!("{url}/v1/chat/completions"))
        .body(body);
    if let Some(k) = key {
        req = req.bearer_auth(k);
    }
    let resp = req.send().await.expect("response");
    let status = resp.status().as_u16();
    let retry_after = resp
        .headers()
        .get("retry-after")
        .map(|v| v.to_str().unwrap().to_string());
    let v: serde_json::Value =
        serde_json::from_slice(&resp.bytes().await.unwrap()).unwrap_or_default();
    Answer {
        status,
        retry_after,
        code: v["error"]["code"].as_str().unwrap_or("").to_string(),
        took: t0.elapsed(),
    }
}

fn spawn(url: &str, key: Option<&'static str>, body: String) -> tokio::task::JoinHandle<Answer> {
    tokio::spawn(send(url.to_string(), key, body))
}

fn generate_requests(e: &sim::EngineHandle) -> Vec<sim::RecordedRequest> {
    e.requests()
        .into_iter()
        .filter(|r| r.method == "POST" && r.path.starts_with("/v1/"))
        .collect()
}

async fn queued(router: &TestRouter, n: usize) {
    router
        .wait_for(&format!("{n} waiting"), Duration::from_secs(5), |r| {
            r.state
                .admission
                .queue("default")
                .is_some_and(|q| q.len() == n)
        })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_request_is_placed_when_the_slot_frees() {
    let eng = engine(Duration::from_millis(500)).await;
    let router = router(&eng, "{ max_length: 8, max_wait: 10s }", "").await;
    let first = spawn(&router.url(), None, chat_body(300, false, 1));
    router
        .wait_for("first in flight", Duration::from_secs(5), |r| {
            r.totals().1 == 1
        })
        .await;
    let second = spawn(&router.url(), None, chat_body(400, false, 1));
    queued(&router, 1).await;
    let m = router.metrics_text().await;
    assert_eq!(
        metric_value(&m, "infergate_queue_length", &["pool=\"default\""]),
        Some(1.0)
    );
    assert_eq!(
        generate_requests(&eng).len(),
        1,
        "the second waits in the router"
    );
    let (a, b) = (first.await.unwrap(), second.await.unwrap());
    assert_eq!((a.status, b.status), (200, 200));
    // The engine never had two: the second arrived after the first was answered.
    let reqs = generate_requests(&eng);
    assert_eq!(reqs.len(), 2);
    let gap = reqs[1].received_at.duration_since(reqs[0].received_at);
    assert!(gap >= Duration::from_millis(480), "{gap:?}");
    assert!(b.took >= Duration::from_millis(900), "{:?}", b.took);
    let m = router.metrics_text().await;
    assert_eq!(
        metric_value(
            &m,
            "infergate_queue_wait_seconds_count",
            &["pool=\"default\""]
        ),
        Some(1.0)
    );
    let waited = metric_value(
        &m,
        "infergate_queue_wait_seconds_sum",
        &["pool=\"default\""],
    )
    .unwrap();
    assert!(waited > 0.3, "{waited}");
    assert_eq!(
        metric_value(&m, "infergate_queue_length", &["pool=\"default\""]),
        Some(0.0)
    );
    router.wait_idle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_and_a_long_wait_answer_503_with_retry_after() {
    let eng = engine(Duration::from_millis(1500)).await;
    let router = router(&eng, "{ max_length: 1, max_wait: 400ms }", "").await;
    let first = spawn(&router.url(), None, chat_body(300, false, 1));
    router
        .wait_for("first in flight", Duration::from_secs(5), |r| {
            r.totals().1 == 1
        })
        .await;
    let waiting = spawn(&router.url(), None, chat_body(400, false, 1));
    queued(&router, 1).await;
    let full = send(router.url(), None, chat_body(500, false, 1)).await;
    assert_eq!(full.status, 503);
    assert_eq!(full.code, "queue_full");
    assert_eq!(full.retry_after.as_deref(), Some("1"));
    assert!(full.took < Duration::from_millis(300), "{:?}", full.took);
    let timed_out = waiting.await.unwrap();
    assert_eq!(timed_out.status, 503);
    assert_eq!(timed_out.code, "queue_timeout");
    assert_eq!(timed_out.retry_after.as_deref(), Some("1"));
    assert!(
        timed_out.took >= Duration::from_millis(400)
            && timed_out.took < Duration::from_millis(1400),
        "{:?}",
        timed_out.took
    );
    assert_eq!(first.await.unwrap().status, 200);
    assert_eq!(
        generate_requests(&eng).len(),
        1,
        "the refused never reached the engine"
    );
    let m = router.metrics_text().await;
    assert_eq!(
        metric_value(&m, "infergate_queue_rejected_total", &["reason=\"full\""]),
        Some(1.0)
    );
    assert_eq!(
        metric_value(
            &m,
            "infergate_queue_rejected_total",
            &["reason=\"timeout\""]
        ),
        Some(1.0)
    );
    router.wait_idle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_keys_take_turns_instead_of_first_come_first_served() {
    let eng = engine(Duration::from_millis(500)).await;
    let dir = std::env::temp_dir().join(format!("infergate-queue-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let keys = dir.join("keys");
    std::fs::write(&keys, format!("alice:{ALICE}\nbob:{BOB}\n")).unwrap();
    let auth = format!("auth: {{ keys_file: {} }}\n", keys.display());
    let router = router(&eng, "{ max_length: 16, max_wait: 20s }", &auth).await;
    // alice's six requests arrive first (the first is placed at once), then bob's two.
    let mut tasks = Vec::new();
    for i in 0..6 {
        tasks.push(spawn(
            &router.url(),
            Some(ALICE),
            chat_body(1000 + i, false, 1),
        ));
        if i == 0 {
            router
                .wait_for("first in flight", Duration::from_secs(5), |r| {
                    r.totals().1 == 1
                })
                .await;
        } else {
            queued(&router, i).await;
        }
    }
    for i in 0..2 {
        tasks.push(spawn(
            &router.url(),
            Some(BOB),
            chat_body(3000 + i, false, 1),
        ));
        queued(&router, 6 + i).await;
    }
    for t in tasks {
        assert_eq!(t.await.unwrap().status, 200);
    }
    let order: String = generate_requests(&eng)
        .iter()
        .map(|r| if r.body_len < 2000 { 'a' } else { 'b' })
        .collect();
    // First come, first served would be "aaaaaabb".
    assert_eq!(order, "aababaaa");
    router.wait_idle().await;
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_a_queue_the_in_flight_limit_is_hard_across_endpoints() {
    let engs = [
        engine(Duration::from_millis(300)).await,
        engine(Duration::from_millis(300)).await,
    ];
    let urls: Vec<String> = engs.iter().map(|e| e.url()).collect();
    let extra = "    max_in_flight_per_endpoint: 2\n    queue: { max_length: 32, max_wait: 10s }\n";
    let router = start_router(&pool_yaml("round_robin", &urls, extra)).await;
    router
        .wait_for("both healthy", Duration::from_secs(10), |r| {
            r.state.pools.pools[0]
                .endpoints()
                .iter()
                .all(|e| e.health.is_healthy())
        })
        .await;
    let mut tasks = Vec::new();
    for i in 0..12 {
        tasks.push(spawn(&router.url(), None, chat_body(300 + i, false, 1)));
    }
    // Sample the per-endpoint counts while the twelve pass through four slots.
    let mut max_seen = 0;
    let start = Instant::now();
    while !tasks.iter().all(|t| t.is_finished()) && start.elapsed() < Duration::from_secs(10) {
        for i in 0..2 {
            max_seen = max_seen.max(router.endpoint_load(i).1);
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    for t in tasks {
        assert_eq!(t.await.unwrap().status, 200);
    }
    assert!(
        max_seen <= 2,
        "an endpoint had {max_seen} requests in flight"
    );
    let m = router.metrics_text().await;
    let waited = metric_value(&m, "infergate_queue_wait_seconds_count", &[]).unwrap();
    assert!(waited >= 8.0, "{waited} requests waited");
    router.wait_idle().await;
}

/// A client that closes its connection while waiting leaves the queue at once: it neither keeps its place (the
/// request behind it moves up) nor reaches an engine when a slot frees.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_closes_while_waiting_leaves_the_queue_and_never_reaches_an_engine() {
    use tokio::io::AsyncWriteExt;
    let eng = engine(Duration::from_millis(1500)).await;
    let router = router(&eng, "{ max_length: 8, max_wait: 10s }", "").await;
    let first = spawn(&router.url(), None, chat_body(300, false, 1));
    router
        .wait_for("first in flight", Duration::from_secs(5), |r| {
            r.totals().1 == 1
        })
        .await;
    let body = chat_body(500, false, 1);
    let mut gone = tokio::net::TcpStream::connect(router.addr).await.unwrap();
    gone.write_all(
        format!(
            "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    queued(&router, 1).await;
    let third = spawn(&router.url(), None, chat_body(700, false, 1));
    queued(&router, 2).await;
    let closed_at = Instant::now();
    drop(gone);
    queued(&router, 1).await;
    assert!(
        closed_at.elapsed() < Duration::from_secs(1),
        "left the queue {:?} after closing, while the slot was still taken",
        closed_at.elapsed()
    );
    let (a, c) = (first.await.unwrap(), third.await.unwrap());
    assert_eq!((a.status, c.status), (200, 200));
    let sizes: Vec<usize> = generate_requests(&eng).iter().map(|r| r.body_len).collect();
    assert_eq!(
        sizes.len(),
        2,
        "the engine got only the live requests: {sizes:?}"
    );
    let m = router.metrics_text().await;
    assert_eq!(
        metric_value(&m, "infergate_queue_abandoned_total", &["pool=\"default\""]),
        Some(1.0)
    );
    // Counted as "no response" (code 0), not as an error the router answered.
    assert_eq!(
        metric_value(&m, "infergate_client_requests_total", &["code=\"0\""]),
        Some(1.0),
        "{m}"
    );
    router.wait_idle().await;
}
