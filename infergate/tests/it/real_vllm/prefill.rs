//! The prefill ledger on a real engine: held across vLLM's early headers, released at its first data chunk or
//! when the client leaves (and vLLM aborts the generation), and the prefill speed predicted_ttft learns from it.

use std::time::{Duration, Instant};

use super::*;
use tokio::io::AsyncWriteExt;

/// A raw streaming chat request to the router (so the test sees exactly when headers and data arrive).
async fn send_raw(addr: std::net::SocketAddr, body: &str) -> tokio::net::TcpStream {
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let head = format!(
        "POST {CHAT} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).await.expect("write head");
    s.write_all(body.as_bytes()).await.expect("write body");
    s
}

fn has(bytes: &[u8], what: &str) -> bool {
    bytes.windows(what.len()).any(|w| w == what.as_bytes())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs real vLLM engines: scripts/real-vllm.sh runs it"]
async fn the_prefill_hold_outlasts_vllms_early_headers_and_ends_at_its_first_token() {
    let f = fleet();
    let router = start_router(&fleet_yaml(&f, "load_aware", "")).await;
    router.all_healthy().await;
    // ~10k cold tokens: about 2 s of prefill on this engine, its headers within milliseconds.
    let body = chat(&f, user(&cold_text(10_000)), true, 8);
    let t0 = Instant::now();
    let mut s = send_raw(router.addr, &body).await;
    let head = read_raw_until(&mut s, Duration::from_secs(30), |b| has(b, "\r\n\r\n")).await;
    let headers_at = t0.elapsed();
    assert!(has(&head, " 200 "), "{}", String::from_utf8_lossy(&head));
    assert!(
        !has(&head, "data:"),
        "the first token came with the headers: no prefill to observe"
    );
    let (held, requests) = router.totals();
    // bytes / 4 of a 10 kB body: digits are one token each, so the estimate is a quarter of the truth.
    assert!(
        held > 2_000 && requests == 1,
        "held {held} tokens, {requests} requests after the headers"
    );
    let first = read_raw_until(&mut s, Duration::from_secs(60), |b| has(b, "data:")).await;
    let data_at = t0.elapsed();
    assert!(has(&first, "data:"), "no data chunk");
    router
        .wait_for(
            "the hold released at the first chunk",
            Duration::from_secs(2),
            |r| r.totals().0 == 0,
        )
        .await;
    assert!(
        data_at > headers_at + Duration::from_millis(300),
        "headers {headers_at:?}, data {data_at:?}"
    );
    eprintln!(
        "headers after {headers_at:?}, first data after {data_at:?}, {held} tokens held between"
    );
    drop(s);
    router.wait_idle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs real vLLM engines: scripts/real-vllm.sh runs it"]
async fn a_client_leaving_aborts_the_generation_in_vllm() {
    let f = fleet();
    let router = start_router(&fleet_yaml(&f, "load_aware", "")).await;
    router.all_healthy().await;
    let running = |f: &Fleet| {
        let urls = f.urls.clone();
        async move {
            let mut n = 0.0;
            for u in &urls {
                n += engine_metric(u, "vllm:num_requests_running").await;
            }
            n
        }
    };
    // Mid-stream: a long generation, left after its first chunk.
    let mut s = send_raw(router.addr, &chat(&f, user("Go on forever."), true, 4_000)).await;
    let got = read_raw_until(&mut s, Duration::from_secs(30), |b| has(b, "data:")).await;
    assert!(has(&got, "data:"));
    let start = Instant::now();
    while running(&f).await < 1.0 {
        assert!(
            start.elapsed() < Duration::from_secs(5),
            "the generation never showed as running"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    drop(s);
    for u in &f.urls {
        wait_engine_metric(
            u,
            "vllm:num_requests_running",
            Duration::from_secs(5),
            |v| v == 0.0,
        )
        .await;
    }
    // During prefill: left after the headers, before the first token.
    let mut s = send_raw(
        router.addr,
        &chat(&f, user(&cold_text(10_000)), true, 4_000),
    )
    .await;
    read_raw_until(&mut s, Duration::from_secs(30), |b| has(b, "\r\n\r\n")).await;
    assert!(router.totals().0 > 0, "the prefill is held");
    drop(s);
    router.wait_idle().await;
    for u in &f.urls {
        wait_engine_metric(
            u,
            "vllm:num_requests_running",
            Duration::from_secs(5),
            |v| v == 0.0,
        )
        .await;
        wait_engine_metric(
            u,
            "vllm:num_requests_waiting",
            Duration::from_secs(5),
            |v| v == 0.0,
        )
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs real vLLM engines: scripts/real-vllm.sh runs it"]
async fn engine_stats_come_fresh_from_vllms_metrics() {
    let f = fleet();
    let router = start_router(&fleet_yaml(&f, "load_aware", "")).await;
    router.all_healthy().await;
    for i in 0..f.urls.len() {
        router
            .wait_engine_stats(i, "fresh idle stats", |run, wait| run == 0 && wait == 0)
            .await;
    }
    let m = router.metrics_text().await;
    assert_eq!(
        metric_sum(&m, "infergate_engine_stats_state", &["state=\"fresh\""]),
        f.urls.len() as f64,
        "{m}"
    );
    // A running generation shows in the router's view of the engine's own counters.
    let mut s = send_raw(router.addr, &chat(&f, user("Keep talking."), true, 2_000)).await;
    read_raw_until(&mut s, Duration::from_secs(30), |b| has(b, "data:")).await;
    router
        .wait_for(
            "a running request in some engine's stats",
            Duration::from_secs(5),
            |r| {
                r.state.pools.pools[0].endpoints().iter().any(|e| {
                    e.stats
                        .fresh(Instant::now())
                        .is_some_and(|l| l.running == 1)
                })
            },
        )
        .await;
    drop(s);
    router.wait_idle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs real vLLM engines: scripts/real-vllm.sh runs it"]
async fn predicted_ttft_learns_the_real_prefill_speed_and_measures_its_error() {
    let f = fleet();
    let router = start_router(&fleet_yaml(&f, "predicted_ttft", "")).await;
    router.all_healthy().await;
    // Cold prompts of several sizes, two at a time so that both engines get some.
    let url = router.url();
    for tokens in [2_000, 4_000, 6_000, 8_000] {
        let (a, b) = tokio::join!(
            post_chat(&url, chat(&f, user(&cold_text(tokens)), true, 2)),
            post_chat(&url, chat(&f, user(&cold_text(tokens)), true, 2)),
        );
        assert_eq!((a, b), (200, 200));
    }
    // Now learned: these are placed by prediction, and each prediction is checked against its first byte.
    for tokens in [3_000, 5_000] {
        assert_eq!(
            post_chat(&router.url(), chat(&f, user(&cold_text(tokens)), true, 2)).await,
            200
        );
    }
    // What a stream teaches is applied once it has ended well (in `logging`, just after its last byte).
    router.wait_idle().await;
    let m = router.metrics_text().await;
    let speeds: Vec<f64> = f
        .urls
        .iter()
        .filter_map(|u| {
            let ep = format!("endpoint=\"{}\"", u.trim_start_matches("http://"));
            metric_value(
                &m,
                "infergate_endpoint_ttft_throughput_tokens_per_second",
                &[&ep],
            )
        })
        .collect();
    // Both engines learned a speed. How fast is the machine's business (a CPU without AVX512 prefills ~6× slower
    // than one with it), so no floor is asserted: the figures are printed.
    assert!(
        speeds.len() == f.urls.len() && speeds.iter().all(|&s| s.is_finite() && s > 0.0),
        "learned {speeds:?}\n{m}"
    );
    let predicted = metric_sum(&m, "infergate_ttft_prediction_error_seconds_count", &[]);
    let err_sum = metric_sum(&m, "infergate_ttft_prediction_error_seconds_sum", &[]);
    assert!(predicted >= 2.0, "{predicted} predictions checked\n{m}");
    eprintln!("learned prefill speeds {speeds:?} tokens/s; {predicted} predictions, error sum {err_sum:.3} s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs real vLLM engines: scripts/real-vllm.sh runs it"]
async fn a_ttft_budget_no_engine_can_meet_is_refused_or_placed_as_configured() {
    let f = fleet();
    for (when_over, status, outcome) in [("reject", 429, "rejected"), ("place", 200, "over")] {
        let extra = format!("    ttft_budget: {{ when_over: {when_over} }}\n");
        let router = start_router(&fleet_yaml(&f, "predicted_ttft", &extra)).await;
        router.all_healthy().await;
        let url = router.url();
        // Learn both engines' prefill speeds (nothing is predicted, nor enforced, before).
        for tokens in [2_000, 4_000, 6_000] {
            let (a, b) = tokio::join!(
                post_chat(&url, chat(&f, user(&cold_text(tokens)), true, 2)),
                post_chat(&url, chat(&f, user(&cold_text(tokens)), true, 2)),
            );
            assert_eq!((a, b), (200, 200));
        }
        router.wait_idle().await;
        // 1 ms: no real prefill of 3,000 tokens fits it, on any engine, busy or idle.
        let r = post_json(&client(), &url, CHAT)
            .header("x-infergate-ttft-budget-ms", "1")
            .body(chat(&f, user(&cold_text(3_000)), true, 2))
            .send()
            .await
            .expect("response");
        assert_eq!(r.status(), status, "when_over: {when_over}");
        let body = r.text().await.unwrap_or_default();
        if status == 429 {
            assert!(body.contains("ttft_budget_exceeded"), "{body}");
        } else {
            assert!(body.contains("[DONE]"), "{body}");
        }
        let m = router
            .metrics_when(|m| {
                metric_sum(
                    m,
                    "infergate_ttft_budget_total",
                    &[&format!("outcome=\"{outcome}\"")],
                ) >= 1.0
            })
            .await;
        assert_eq!(
            metric_sum(
                &m,
                "infergate_ttft_budget_total",
                &[&format!("outcome=\"{outcome}\"")]
            ),
            1.0,
            "when_over: {when_over}\n{m}"
        );
        router.wait_idle().await;
    }
}
