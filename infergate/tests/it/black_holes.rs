//! Engines that fail without failing their health check (issue 27): one that accepts requests and never answers,
//! one that drops every stream after its first chunk, one that resets it. None of them may draw the traffic, a
//! session bound to one moves (also when its turns are not streamed, and no stream's headers can be late, or when
//! the engine sends a stream's headers and nothing more, as a vLLM with a wedged engine core does), while clients
//! leaving long prefills are not held against a working engine; and a health panic over engines that never answer
//! fails fast. An engine that closes right after its headers leaves
//! the client the status line and a cut body, never an empty close.

use std::time::Duration;

use crate::common::*;
use infergate_sim::{EngineHandle, SimConfig};

/// Streams whose headers are later than this count as failures in these tests (the default is 3 s).
const WITHIN: &str = "    outlier_detection: { stream_headers_within: 500ms }\n";

/// How long the clients of the unanswered-request tests wait: past the 500 ms of `WITHIN` even when a loaded machine
/// takes a second or more to dispatch the request (a CI run dispatched one too late at 1.5 s).
const UNANSWERED_PATIENCE: Duration = Duration::from_millis(2500);

/// One request of a client that gives up after `patience`, as impatient agents do; its status (0: gave up).
async fn impatient(base: &str, session: Option<&str>, body: String, patience: Duration) -> u16 {
    let mut req = post_json(&client(), base, CHAT).body(body);
    if let Some(s) = session {
        req = req.header(SESSION_HEADER, s);
    }
    match tokio::time::timeout(patience, async {
        let resp = req.send().await.ok()?;
        let status = resp.status().as_u16();
        drain(resp).await.ok()?;
        Some(status)
    })
    .await
    {
        Ok(Some(status)) => status,
        _ => 0,
    }
}

/// `n` streamed requests from clients waiting up to `patience`, sent `spacing` apart; their statuses.
async fn patient_streams(
    router: &TestRouter,
    n: usize,
    spacing: Duration,
    patience: Duration,
) -> tokio::task::JoinSet<u16> {
    let mut waiting = tokio::task::JoinSet::new();
    for i in 0..n {
        let url = router.url();
        waiting.spawn(async move {
            impatient(&url, None, chat_body(2000 + i, true, 2), patience).await
        });
        tokio::time::sleep(spacing).await;
    }
    waiting
}

fn bound_engine(eng: &[EngineHandle]) -> usize {
    eng.iter()
        .position(|e| generate_requests(e) > 0)
        .expect("one engine served")
}

/// Two engines behind a router of `policy` with sessions (and pool lines `extra`), and session `s`'s first turn
/// (streamed or not) served: the engines, the router and the index of the engine the session is bound to.
async fn a_session_on_two_engines(
    policy: &str,
    extra: &str,
    stream: bool,
) -> (Vec<EngineHandle>, TestRouter, usize) {
    let eng = engines(2, SimConfig::default()).await;
    let yaml = pool_yaml(
        policy,
        &urls(&eng),
        &format!("{}{extra}", sessions_yaml(100)),
    );
    let router = start_router(&yaml).await;
    router.all_healthy().await;
    assert_eq!(
        post_chat_in_session(&router.url(), "s", chat_body(2000, stream, 2)).await,
        200
    );
    let bound = bound_engine(&eng);
    (eng, router, bound)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_engine_draws_no_traffic_from_impatient_clients() {
    for policy in ["load_aware", "predicted_ttft"] {
        let eng = engines(2, SimConfig::default()).await;
        let yaml = pool_yaml(
            policy,
            &urls(&eng),
            &format!("{}{WITHIN}", sessions_yaml(100)),
        );
        // One health check of the working engine late on a loaded machine must not leave the hung one alone in
        // the pool (a CI run sent it 4 of 30): this test is about the hung engine, not about the checks.
        let yaml = yaml.replace(
            "timeout: 500ms, healthy_after: 1, unhealthy_after: 1",
            "timeout: 2s, healthy_after: 1, unhealthy_after: 3",
        );
        let router = start_router(&yaml).await;
        router.all_healthy().await;
        // Three sessions open while both engines work.
        for s in 0..3 {
            let body = chat_body(3000 + s * 100, true, 2);
            assert_eq!(
                post_chat_in_session(&router.url(), &format!("s{s}"), body).await,
                200
            );
        }
        // Engine 0 wedges: it takes requests and never answers, while its /health still says 200.
        eng[0].control.set_slow_headers(Duration::from_secs(60));
        eng[0].clear_requests();
        let mut served = 0;
        // Each request's fate, for a failure to be read by.
        let mut trace = Vec::new();
        for i in 0..30usize {
            // Turns of bound sessions, new sessions, header-less calls; streamed and not.
            let session = match i % 3 {
                0 => Some(format!("s{}", i % 9 / 3)),
                1 => Some(format!("new{i}")),
                _ => None,
            };
            let body = chat_body(3000 + i * 37, i % 2 == 0, 2);
            // Patient enough for the 500 ms header deadline to pass while it waits, even on a loaded machine
            // where the request takes a second to reach its engine (a client gone before the deadline proves
            // nothing against the engine), and far less patient than the default timeouts.
            let sent = std::time::Instant::now();
            let status = impatient(
                &router.url(),
                session.as_deref(),
                body,
                Duration::from_millis(2500),
            )
            .await;
            served += usize::from(status == 200);
            trace.push(format!(
                "{i} session {session:?} stream {}: status {status} after {} ms, engine 0 has {}",
                i % 2 == 0,
                sent.elapsed().as_millis(),
                generate_requests(&eng[0])
            ));
        }
        let to_hung = generate_requests(&eng[0]);
        let base = format!("http://{}", router.metrics_addr);
        let status = get_json(&base, "/status.json").await;
        assert!(
            to_hung <= 3,
            "{policy}: the hung engine received {to_hung} of 30 requests; {}\n{}",
            status["pools"][0]["endpoints"],
            trace.join("\n")
        );
        assert!(
            served >= 27,
            "{policy}: {served} of 30 served\n{}",
            trace.join("\n")
        );
        // The status page shows why it is passed over.
        let hung = &status["pools"][0]["endpoints"][0];
        assert!(
            hung["hung"] == true || hung["failed_requests_weighing"].as_u64() > Some(0),
            "{policy}: {hung}"
        );
        eng[0].control.set_slow_headers(Duration::ZERO);
        router.wait_idle().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn patient_clients_do_not_queue_on_a_hung_engine() {
    let eng = engines(3, SimConfig::default()).await;
    let router = start_router(&pool_yaml("load_aware", &urls(&eng), WITHIN)).await;
    router.all_healthy().await;
    eng[0].control.set_slow_headers(Duration::from_secs(60));
    // Patient clients, 150 ms apart: one waits on the wedged engine; 500 ms later its stream counts as a failure
    // and the engine is set aside, so the others are served elsewhere. Idle engines tie and are picked at random,
    // so the streams go on until the wedged one has taken one and eight more have followed it.
    let mut waiting = tokio::task::JoinSet::new();
    let mut first_there = None;
    let mut sent = 0;
    while sent < 40 && first_there.is_none_or(|f| sent < 12.max(f + 8)) {
        let url = router.url();
        waiting.spawn(async move {
            impatient(
                &url,
                None,
                chat_body(2000 + sent, true, 2),
                Duration::from_secs(4),
            )
            .await
        });
        sent += 1;
        tokio::time::sleep(Duration::from_millis(150)).await;
        if first_there.is_none() && generate_requests(&eng[0]) > 0 {
            first_there = Some(sent);
        }
    }
    assert!(
        first_there.is_some(),
        "none of {sent} streams reached engine 0"
    );
    let base = format!("http://{}", router.metrics_addr);
    let hung_now = |status: &serde_json::Value| {
        status["pools"][0]["endpoints"]
            .as_array()
            .map(|a| a.iter().filter(|e| e["hung"] == true).count())
    };
    let mut status = get_json(&base, "/status.json").await;
    for _ in 0..30 {
        if hung_now(&status) == Some(1) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        status = get_json(&base, "/status.json").await;
    }
    assert_eq!(hung_now(&status), Some(1), "{status}");
    assert_eq!(status["pools"][0]["endpoints"][0]["hung"], true, "{status}");
    let to_hung = generate_requests(&eng[0]);
    assert!(to_hung <= 2, "the hung engine received {to_hung} of {sent}");
    let mut served = 0;
    while let Some(r) = waiting.join_next().await {
        served += usize::from(r.unwrap() == 200);
    }
    assert_eq!(served, sent - to_hung, "every request elsewhere is served");
    eng[0].control.set_slow_headers(Duration::ZERO);
    router.wait_idle().await;
}

/// Engine 0 cuts every stream after its first event (`how`); 30 streamed requests sent one at a time.
async fn cut_streams_draw_no_traffic(policy: &str, how: fn(&EngineHandle)) {
    let eng = engines(2, SimConfig::default()).await;
    let router = start_router(&pool_yaml(policy, &urls(&eng), "")).await;
    router.all_healthy().await;
    how(&eng[0]);
    let mut intact = 0;
    for i in 0..30 {
        let resp = send_chat(&router.url(), chat_body(4000 + i * 11, true, 4)).await;
        intact += usize::from(resp.status() == 200 && drain(resp).await.is_ok());
    }
    let to_bad = generate_requests(&eng[0]);
    assert!(
        to_bad <= 3,
        "{policy}: the engine cutting streams received {to_bad} of 30"
    );
    assert_eq!(
        intact,
        30 - to_bad,
        "{policy}: every other stream arrives whole"
    );
    let m = router.metrics_text().await;
    assert!(metric_sum(&m, "infergate_endpoint_failures_total", &[]) >= to_bad as f64);
    // A stream cut after its first chunk teaches no prefill speed.
    let ep0 = format!("endpoint=\"{}\"", eng[0].addr);
    assert_eq!(
        metric_sum(&m, "infergate_ttft_prediction_error_seconds_count", &[&ep0]),
        0.0,
        "{policy}"
    );
    let base = format!("http://{}", router.metrics_addr);
    let status = get_json(&base, "/status.json").await;
    let eps = status["pools"][0]["endpoints"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let bad = eps
        .iter()
        .find(|e| e["endpoint"].as_str() == Some(&eng[0].addr.to_string()))
        .cloned()
        .unwrap_or_default();
    assert!(
        bad["prefill_tokens_per_second"].is_null(),
        "{policy}: learned a speed from cut streams: {bad}"
    );
    router.wait_idle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_dropping_streams_after_the_first_chunk_draws_no_traffic() {
    for policy in ["load_aware", "predicted_ttft"] {
        cut_streams_draw_no_traffic(policy, |e| e.control.set_drop_mid_stream_after(Some(1))).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_resetting_streams_after_the_first_chunk_draws_no_traffic() {
    cut_streams_draw_no_traffic("load_aware", |e| {
        e.control.set_close_mid_stream_after(Some(1))
    })
    .await;
}

/// Engine 0 fails every stream in band after `after` events of output, as vLLM does when its engine core dies or
/// a generation fails after the headers went out: a 200 stream ending `data: {"error": {... "code": 500}}`,
/// `[DONE]`, whole. 30 streamed requests sent one at a time.
async fn in_band_errors_draw_no_traffic(policy: &str, after: usize) {
    let eng = engines(2, SimConfig::default()).await;
    let router = start_router(&pool_yaml(policy, &urls(&eng), "")).await;
    router.all_healthy().await;
    eng[0].control.set_error_mid_stream_after(Some(after));
    let mut errors = 0;
    for i in 0..30 {
        let resp = send_chat(&router.url(), chat_body(4000 + i * 11, true, 4)).await;
        assert_eq!(resp.status(), 200, "{policy}");
        let text = resp.text().await.unwrap_or_default();
        errors += usize::from(text.contains("\"error\""));
    }
    let to_bad = generate_requests(&eng[0]);
    assert!(
        to_bad <= 3,
        "{policy}, error after {after}: the engine failing streams in band received {to_bad} of 30"
    );
    assert_eq!(
        errors, to_bad,
        "{policy}: the engine's error reaches its client"
    );
    let m = router.metrics_text().await;
    let ep0 = format!("endpoint=\"{}\"", eng[0].addr);
    assert_eq!(
        metric_sum(
            &m,
            "infergate_endpoint_failures_total",
            &["kind=\"stream_error\"", &ep0]
        ),
        to_bad as f64,
        "{policy}"
    );
    // A failed stream teaches no prefill speed (its error came at once, a prefill far quicker than any).
    assert_eq!(
        metric_sum(&m, "infergate_ttft_prediction_error_seconds_count", &[&ep0]),
        0.0,
        "{policy}"
    );
    router.wait_idle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_failing_streams_in_band_draws_no_traffic() {
    for (policy, after) in [
        ("load_aware", 0),
        ("predicted_ttft", 0),
        ("predicted_ttft", 1),
    ] {
        in_band_errors_draw_no_traffic(policy, after).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_leaves_an_engine_that_fails_its_streams_in_band() {
    for policy in ["load_aware", "predicted_ttft"] {
        let (eng, router, bound) = a_session_on_two_engines(policy, "", true).await;
        eng[bound].control.set_error_mid_stream_after(Some(0));
        // Each turn: did its answer end in the engine's error event?
        let mut failed = Vec::new();
        for i in 0..8 {
            let resp = post_json(&client(), &router.url(), CHAT)
                .header(SESSION_HEADER, "s")
                .body(chat_body(2100 + i * 100, true, 2))
                .send()
                .await
                .expect("a response");
            assert_eq!(resp.status(), 200);
            failed.push(resp.text().await.unwrap_or_default().contains("\"error\""));
        }
        // Outlier detection's three failures in a row, then the other engine (every turn failed before).
        assert_eq!(
            failed,
            [true, true, true, false, false, false, false, false],
            "{policy}"
        );
        eng[bound].control.set_error_mid_stream_after(None);
        router.wait_idle().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_on_a_hung_engine_moves_to_a_working_one() {
    let (eng, router, bound) = a_session_on_two_engines("load_aware", WITHIN, true).await;
    eng[bound].control.set_slow_headers(Duration::from_secs(60));
    let mut statuses = Vec::new();
    for i in 0..4 {
        let body = chat_body(2100 + i * 100, true, 2);
        statuses.push(impatient(&router.url(), Some("s"), body, Duration::from_millis(1500)).await);
    }
    // The first turn waits on the wedged engine; the next ones are served elsewhere.
    assert_eq!(&statuses[1..], &[200, 200, 200], "{statuses:?}");
    assert!(generate_requests(&eng[1 - bound]) >= 3);
    eng[bound].control.set_slow_headers(Duration::ZERO);
    router.wait_idle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_health_panic_over_engines_that_never_answer_fails_fast() {
    let eng = engines(2, SimConfig::default()).await;
    let router = start_router(&pool_yaml("load_aware", &urls(&eng), WITHIN)).await;
    router.all_healthy().await;
    // Every engine fails its check (the pool's health panic routes to them anyway) and never answers.
    for e in &eng {
        e.control.set_slow_headers(Duration::from_secs(60));
        e.control.set_health_status(500);
    }
    router
        .wait_for("every endpoint unhealthy", Duration::from_secs(5), |r| {
            let eps = r.state.pools.pools[0].endpoints();
            eps.iter()
                .all(|e| e.health.get() == infergate::pool::Health::Unhealthy)
        })
        .await;
    let mut waiting = patient_streams(
        &router,
        2,
        Duration::from_millis(50),
        Duration::from_secs(20),
    )
    .await;
    router
        .metrics_when(|m| {
            metric_sum(
                m,
                "infergate_endpoint_failures_total",
                &["kind=\"no_headers\""],
            ) >= 2.0
        })
        .await;
    // Both engines are known not to answer: a new request gets a 503 now, not a 504 after the header timeout.
    for i in 0..5 {
        let status = impatient(
            &router.url(),
            None,
            chat_body(3000 + i, true, 2),
            Duration::from_secs(5),
        )
        .await;
        assert_eq!(status, 503);
    }
    assert_eq!(eng.iter().map(generate_requests).sum::<usize>(), 2);
    for e in &eng {
        e.control.set_slow_headers(Duration::ZERO);
        e.control.set_health_status(200);
    }
    while waiting.join_next().await.is_some() {}
    router.wait_idle().await;
}

/// An engine that answers every request (its health check aside) with a 200 head, every other one with the start
/// of a chunked body in the same write, then closes: it died right after its headers.
async fn dying_after_headers_engine() -> String {
    raw_engine(|seen| {
        let head: &[u8] =
            b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n";
        let piece: &[u8] = if seen.windows(7).any(|w| w == b"piece-1") {
            b"10\r\n{\"id\":\"chatcmpl-"
        } else {
            b""
        };
        // After the body has arrived.
        RawAnswer {
            wait: Duration::from_millis(50),
            bytes: [head, piece].concat(),
            close: true,
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_dying_after_its_headers_leaves_the_client_the_status_line_not_an_empty_close() {
    use tokio::io::AsyncWriteExt;
    let url = dying_after_headers_engine().await;
    let router = start_router(&pool_yaml("round_robin", &[url], "")).await;
    router.all_healthy().await;
    for i in 0..5 {
        let body = chat_body(200, false, 2);
        let mut s = tokio::net::TcpStream::connect(router.addr).await.unwrap();
        let head = format!(
            "POST {CHAT} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nx-test: piece-{}\r\n\
             Content-Length: {}\r\n\r\n",
            i % 2,
            body.len()
        );
        s.write_all(head.as_bytes()).await.unwrap();
        s.write_all(body.as_bytes()).await.unwrap();
        // Everything until the router closes the connection.
        let got = read_raw_until(&mut s, Duration::from_secs(10), |_| false).await;
        let text = String::from_utf8_lossy(&got);
        assert!(
            text.starts_with("HTTP/1.1 200"),
            "request {i}: the client got {} bytes and no status line: {text:?}",
            got.len()
        );
        assert!(
            text.to_ascii_lowercase().contains("x-request-id:"),
            "request {i}: no request id to report: {text:?}"
        );
        assert!(
            !text.ends_with("0\r\n\r\n"),
            "request {i}: the cut body must not look whole: {text:?}"
        );
    }
    router.wait_idle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_streamed_turns_of_a_session_on_a_hung_engine_move_after_two_go_unanswered() {
    for policy in ["load_aware", "predicted_ttft"] {
        let (eng, router, bound) = a_session_on_two_engines(policy, WITHIN, false).await;
        // Wedged: it takes requests and never answers, while its /health still says 200. No stream reaches it,
        // so no stream's headers can be late: only the clients' leaving tells.
        eng[bound].control.set_slow_headers(Duration::from_secs(60));
        let mut statuses = Vec::new();
        for i in 0..6 {
            let body = chat_body(2100 + i * 100, false, 2);
            statuses.push(impatient(&router.url(), Some("s"), body, UNANSWERED_PATIENCE).await);
            // The router has seen this client leave before the next turn (see the prefix_aware test below).
            router.wait_idle().await;
        }
        let base = format!("http://{}", router.metrics_addr);
        let status = get_json(&base, "/status.json").await;
        // Two turns go unanswered (one might be a long answer); then the session is served elsewhere.
        // (Without the rule every turn is lost.)
        assert_eq!(
            &statuses,
            &[0, 0, 200, 200, 200, 200],
            "{policy}: {}",
            status["pools"][0]["endpoints"][bound]
        );
        assert_eq!(
            status["pools"][0]["endpoints"][bound]["hung"], true,
            "{policy}"
        );
        let unanswered = metric_sum(
            &router.metrics_text().await,
            "infergate_endpoint_failures_total",
            &["kind=\"unanswered\""],
        );
        assert_eq!(unanswered, 1.0, "{policy}");
        eng[bound].control.set_slow_headers(Duration::ZERO);
        router.wait_idle().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prefix_aware_stops_sending_cached_non_streamed_prompts_to_a_hung_engine() {
    let eng = engines(2, SimConfig::default()).await;
    let router = start_router(&pool_yaml("prefix_aware", &urls(&eng), WITHIN)).await;
    router.all_healthy().await;
    assert_eq!(
        post_chat(&router.url(), chat_body(4000, false, 2)).await,
        200
    );
    let cached = bound_engine(&eng);
    eng[cached]
        .control
        .set_slow_headers(Duration::from_secs(60));
    eng[cached].clear_requests();
    let mut statuses = Vec::new();
    for i in 0..6 {
        // The same prompt, growing: the wedged engine holds most of it.
        let body = chat_body(4100 + i * 100, false, 2);
        statuses.push(impatient(&router.url(), None, body, UNANSWERED_PATIENCE).await);
        // The router has seen this client leave before the next one asks: a request sent the instant the last
        // client left may be placed before that leaving is counted (on a loaded machine, now and then), a race
        // between two connections this test is not about.
        router.wait_idle().await;
    }
    // Two go unanswered there (the load their debt adds may send one elsewhere between them); then it is set
    // aside and the rest are served.
    let to_wedged = generate_requests(&eng[cached]);
    let unanswered = statuses.iter().filter(|&&s| s != 200).count();
    assert!(
        to_wedged <= 2 && unanswered <= 2 && statuses[4..] == [200, 200],
        "{statuses:?}, {to_wedged} to the wedged engine: {}",
        get_json(&format!("http://{}", router.metrics_addr), "/status.json").await["pools"][0]
            ["endpoints"][cached]
    );
    eng[cached].control.set_slow_headers(Duration::ZERO);
    router.wait_idle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamed_turns_of_a_session_on_an_engine_that_sends_headers_and_nothing_more_move() {
    for policy in ["load_aware", "predicted_ttft"] {
        let (eng, router, bound) = a_session_on_two_engines(policy, WITHIN, true).await;
        // vLLM with a wedged engine core: its API server still answers a stream's headers at once (and /health),
        // and no event ever follows.
        eng[bound].control.set_speed(1e-4);
        let mut statuses = Vec::new();
        for i in 0..6 {
            let body = chat_body(2100 + i * 100, true, 2);
            statuses.push(impatient(&router.url(), Some("s"), body, UNANSWERED_PATIENCE).await);
            // The router has seen this client leave before the next turn (see the prefix_aware test below).
            router.wait_idle().await;
        }
        let status = get_json(&format!("http://{}", router.metrics_addr), "/status.json").await;
        // (Without the rule every turn is lost.)
        assert_eq!(
            &statuses,
            &[0, 0, 200, 200, 200, 200],
            "{policy}: {}",
            status["pools"][0]["endpoints"][bound]
        );
        eng[bound].control.set_speed(1.0);
        router.wait_idle().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_leaving_long_prefills_do_not_set_a_working_engine_aside() {
    // 25,000 tokens/s: a 400 KB prompt (~100k tokens) takes about four seconds to its first output.
    let eng = engines(1, slow_prefill()).await;
    let router = start_router(&pool_yaml("load_aware", &urls(&eng), WITHIN)).await;
    router.all_healthy().await;
    // Streams that end well teach the endpoint's prefill speed.
    for i in 0..4 {
        assert_eq!(
            post_chat_intact(&router.url(), chat_body(40_000 + i * 4_000, true, 2)).await,
            200
        );
    }
    // Two clients in a row give up on long prefills after 1.5 s: far less than twice what the speed predicts.
    for i in 0..2 {
        // Numbers, not the filler: nothing of it is in the engine's prefix cache.
        let text: String = (0..60_000).map(|n| format!("{i}-{n} ")).collect();
        let body = serde_json::json!({
            "model": "sim-model", "stream": true, "max_tokens": 2,
            "messages": [{"role": "user", "content": text}],
        })
        .to_string();
        assert_eq!(
            impatient(&router.url(), None, body, Duration::from_millis(1500)).await,
            0
        );
    }
    let status = get_json(&format!("http://{}", router.metrics_addr), "/status.json").await;
    let ep = &status["pools"][0]["endpoints"][0];
    assert_eq!(ep["hung"], false, "{ep}");
    router.wait_idle().await;
}
