//! OpenTelemetry traces (`tracing`) received by a real OTLP/HTTP receiver (`common::otlp`, the official protobuf
//! definitions): the router's span continues the client's `traceparent`, each forwarding attempt is its child and
//! the engine gets the attempt's context; sampling; a collector that is down or hangs costs spans, never a request;
//! the daemonized binary exports, and SIGHUP turns tracing on, changes and off.

use std::process::{Command, Stdio};
use std::time::Duration;

use crate::common::*;
use infergate_sim::{EngineHandle, SimConfig};

const CLIENT_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CLIENT_SPAN: &str = "00f067aa0ba902b7";

fn traced(receiver: &OtlpReceiver, extra: &str) -> String {
    format!(
        "tracing: {{ endpoint: \"{}\", export_interval: 100ms{extra} }}\n",
        receiver.endpoint()
    )
}

/// A router over `eng` exporting to `receiver` (`extra`: more `tracing` keys), its endpoints healthy.
async fn traced_router(
    receiver: &OtlpReceiver,
    eng: &[EngineHandle],
    policy: &str,
    extra: &str,
) -> TestRouter {
    let yaml = format!(
        "{}{}",
        pool_yaml(policy, &urls(eng), ""),
        traced(receiver, extra)
    );
    let router = start_router(&yaml).await;
    router.all_healthy().await;
    router
}

/// Sends `n` requests one after the other and returns their statuses; the caller bounds how long it may take.
async fn requests(url: &str, n: usize) -> Vec<u16> {
    let mut out = Vec::new();
    for i in 0..n {
        out.push(post_chat(url, chat_body(200 + i, false, 1)).await);
    }
    out
}

/// `traceparent`'s parts: (trace id, span id, flags).
fn parts(tp: &str) -> (String, String, String) {
    let p: Vec<&str> = tp.split('-').collect();
    assert_eq!((p.len(), p[0]), (4, "00"), "{tp}");
    (p[1].to_string(), p[2].to_string(), p[3].to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_routers_span_continues_the_client_and_each_attempt_is_the_engines_parent() {
    let receiver = OtlpReceiver::start().await;
    let eng = engines(1, SimConfig::default()).await;
    let label = eng[0].url().trim_start_matches("http://").to_string();
    let router = traced_router(&receiver, &eng, "load_aware", "").await;

    // A client in a trace of its own: the router's span is its child, the engine's parent is the attempt.
    let resp = post_json(&client(), &router.url(), CHAT)
        .header("traceparent", format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"))
        .header("tracestate", "congo=t61rcWkgMzE")
        .body(chat_body(2000, true, 4))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let request_id = header(&resp, "x-request-id").unwrap();
    drain(resp).await.unwrap();
    let seen = last_generate(&eng[0]).unwrap();
    let (trace, engine_parent, flags) = parts(seen.header("traceparent").unwrap());
    assert_eq!((trace.as_str(), flags.as_str()), (CLIENT_TRACE, "01"));
    assert_eq!(seen.header("tracestate"), Some("congo=t61rcWkgMzE"));

    let spans = receiver.spans_when(|s| s.len() >= 2).await;
    let server = spans
        .iter()
        .find(|s| s.kind == 2)
        .expect("the router's span");
    let attempt = spans.iter().find(|s| s.kind == 3).expect("an attempt span");
    assert_eq!(server.service, "infergate");
    assert_eq!(server.name, "POST /v1/chat/completions");
    assert_eq!(server.trace_id, CLIENT_TRACE);
    assert_eq!(server.parent_span_id, CLIENT_SPAN);
    assert_eq!(attempt.trace_id, CLIENT_TRACE);
    assert_eq!(attempt.parent_span_id, server.span_id);
    assert_eq!(
        attempt.span_id, engine_parent,
        "the engine continues the attempt"
    );
    assert_eq!(attempt.name, "attempt");

    // What the router decided, on its span.
    assert_eq!(server.attr("infergate.pool").as_deref(), Some("default"));
    assert_eq!(server.attr("infergate.endpoint"), Some(label.clone()));
    assert!(
        server.attr("infergate.placement.reason").is_some(),
        "{server:#?}"
    );
    assert!(
        server.int("infergate.prefill_tokens").unwrap() > 0,
        "{server:#?}"
    );
    assert_eq!(server.int("infergate.retries"), Some(0));
    assert_eq!(server.int("infergate.attempts"), Some(1));
    assert_eq!(server.int("http.response.status_code"), Some(200));
    assert_eq!(server.attr("infergate.request_id"), Some(request_id));
    assert_eq!(
        server.attr("gen_ai.request.model").as_deref(),
        Some("sim-model")
    );
    assert!(
        server.double("infergate.ttft.measured_ms").unwrap() > 0.0,
        "{server:#?}"
    );
    assert_eq!(server.status, 0);
    // And on the attempt's.
    assert_eq!(attempt.attr("infergate.endpoint"), Some(label));
    assert_eq!(attempt.int("infergate.attempt"), Some(1));
    assert_eq!(attempt.int("http.response.status_code"), Some(200));
    assert_eq!(attempt.attr("server.address").as_deref(), Some("127.0.0.1"));

    // A client without a trace: the router's span is a root of a new one.
    let resp = send_chat(&router.url(), chat_body(500, false, 2)).await;
    assert_eq!(resp.status(), 200);
    drain(resp).await.unwrap();
    let (trace, _, flags) = parts(
        last_generate(&eng[0])
            .unwrap()
            .header("traceparent")
            .unwrap(),
    );
    assert_eq!(flags, "01");
    let spans = receiver.spans_when(|s| s.len() >= 4).await;
    let root = spans
        .iter()
        .find(|s| s.kind == 2 && s.trace_id == trace)
        .expect("the second request's span");
    assert_eq!(root.parent_span_id, "");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_attempt_and_its_retry_are_two_children_of_one_request() {
    let receiver = OtlpReceiver::start().await;
    let eng = engines(2, SimConfig::default()).await;
    eng[0].control.set_fail_status(Some(503));
    let router = traced_router(&receiver, &eng, "round_robin", "").await;
    // Round robin: one of two requests starts on the refusing engine and is retried on the other.
    assert_eq!(requests(&router.url(), 2).await, [200, 200]);
    let spans = receiver
        .spans_when(|s| s.iter().filter(|x| x.kind == 3).count() >= 3)
        .await;
    let retried = spans
        .iter()
        .find(|s| s.kind == 2 && s.int("infergate.retries") == Some(1))
        .expect("a request retried once");
    assert_eq!(retried.int("infergate.attempts"), Some(2));
    assert_eq!(retried.int("http.response.status_code"), Some(200));
    let mut attempts: Vec<_> = spans
        .iter()
        .filter(|s| s.parent_span_id == retried.span_id)
        .collect();
    attempts.sort_by_key(|s| s.int("infergate.attempt"));
    assert_eq!(attempts.len(), 2, "{spans:#?}");
    let bad = eng[0].url().trim_start_matches("http://").to_string();
    assert_eq!(attempts[0].attr("infergate.endpoint"), Some(bad));
    assert_eq!(attempts[0].int("http.response.status_code"), Some(503));
    assert_eq!(
        attempts[0].attr("error.type").as_deref(),
        Some("engine refused the request")
    );
    assert_eq!(attempts[0].status, 2);
    assert_eq!(attempts[1].int("http.response.status_code"), Some(200));
    assert_eq!(attempts[1].status, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attempt_the_engine_failed_in_band_is_an_error_span() {
    let receiver = OtlpReceiver::start().await;
    let eng = engines(1, SimConfig::default()).await;
    eng[0].control.set_error_mid_stream_after(Some(1));
    let router = traced_router(&receiver, &eng, "load_aware", "").await;
    let resp = send_chat(&router.url(), chat_body(500, true, 4)).await;
    assert_eq!(resp.status(), 200);
    drain(resp).await.unwrap();
    let spans = receiver.spans_when(|s| s.iter().any(|x| x.kind == 3)).await;
    let attempt = spans.iter().find(|s| s.kind == 3).expect("the attempt");
    assert_eq!(attempt.int("http.response.status_code"), Some(200));
    assert_eq!(
        attempt.attr("error.type").as_deref(),
        Some("the engine ended the stream with an error event")
    );
    assert_eq!(attempt.status, 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sampling_records_a_share_and_follows_the_clients_decision() {
    let receiver = OtlpReceiver::start().await;
    let eng = engines(1, SimConfig::default()).await;
    let router = traced_router(&receiver, &eng, "load_aware", ", sample_ratio: 0").await;
    // Started here, not sampled: nothing recorded, but the engine is told so in its traceparent.
    assert_eq!(requests(&router.url(), 5).await, [200; 5]);
    let (_, _, flags) = parts(
        last_generate(&eng[0])
            .unwrap()
            .header("traceparent")
            .unwrap(),
    );
    assert_eq!(flags, "00");
    // A client's sampled trace is recorded whatever the ratio.
    let resp = post_json(&client(), &router.url(), CHAT)
        .header("traceparent", format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"))
        .body(chat_body(400, false, 2))
        .send()
        .await
        .unwrap();
    drain(resp).await.unwrap();
    let spans = receiver.spans_when(|s| s.len() >= 2).await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    let spans_later = receiver.spans();
    assert_eq!(spans_later.len(), spans.len(), "{spans_later:#?}");
    assert!(
        spans.iter().all(|s| s.trace_id == CLIENT_TRACE),
        "{spans:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collector_that_is_gone_costs_spans_not_requests() {
    let eng = engines(1, SimConfig::default()).await;
    // Nothing listens there.
    let gone = format!("http://127.0.0.1:{}/v1/traces", free_port());
    let yaml = format!(
        "{}tracing: {{ endpoint: \"{gone}\", export_interval: 50ms, export_timeout: 1s }}\n",
        pool_yaml("load_aware", &urls(&eng), "")
    );
    let router = start_router(&yaml).await;
    router.ready().await;
    let statuses = tokio::time::timeout(Duration::from_secs(60), requests(&router.url(), 30))
        .await
        .expect("requests are not held up by the collector");
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    let m = router
        .metrics_when(|m| {
            metric_value(m, "infergate_tracing_spans_total", &["outcome=\"failed\""])
                .is_some_and(|v| v >= 1.0)
        })
        .await;
    assert_eq!(
        metric_value(
            &m,
            "infergate_tracing_spans_total",
            &["outcome=\"exported\""]
        ),
        Some(0.0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collector_that_hangs_fills_the_queue_and_spans_are_dropped_not_waited_for() {
    let receiver = OtlpReceiver::start().await;
    receiver.hang();
    let eng = engines(1, SimConfig::default()).await;
    // An export waits up to ten minutes: were a request to wait for room in the queue, it would wait that long.
    let router = traced_router(
        &receiver,
        &eng,
        "load_aware",
        ", queue_spans: 8, batch_spans: 4, export_timeout: 10m",
    )
    .await;
    let statuses = tokio::time::timeout(Duration::from_secs(60), requests(&router.url(), 30))
        .await
        .expect("requests are not held up by the hanging collector");
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    assert!(
        receiver.exports() >= 1,
        "the exporter reached the collector"
    );
    // 30 requests make 60 spans (the last ones end just after their answers); at most 8 wait in the queue, the
    // rest are dropped and counted.
    let m = router
        .metrics_when(|m| {
            metric_value(m, "infergate_tracing_spans_total", &["outcome=\"dropped\""])
                .is_some_and(|d| d >= 52.0)
        })
        .await;
    assert_eq!(
        metric_value(&m, "infergate_tracing_queue_spans", &[]),
        Some(8.0),
        "{m}"
    );
    let dropped = metric_value(
        &m,
        "infergate_tracing_spans_total",
        &["outcome=\"dropped\""],
    )
    .unwrap();
    assert!(dropped >= 52.0, "dropped {dropped}");
}

/// A daemon's pid, killed when dropped (a failed assertion leaves nothing running).
struct Daemon(u32);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-KILL", &self.0.to_string()])
            .status();
    }
}

/// For a test of the binary: a receiver, one engine, a client and a metrics port, and an empty directory `name`.
async fn for_the_binary(
    name: &str,
) -> (
    OtlpReceiver,
    Vec<EngineHandle>,
    u16,
    u16,
    std::path::PathBuf,
) {
    let receiver = OtlpReceiver::start().await;
    let eng = engines(1, SimConfig::default()).await;
    let (listen, metrics) = (free_port(), free_port());
    let dir = std::env::temp_dir().join(format!("infergate-{name}-{listen}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    (receiver, eng, listen, metrics, dir)
}

/// The daemonized binary (`-d`: its export thread starts after the fork) traces; SIGHUP changes tracing in place
/// and turns it off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_daemon_exports_and_sighup_changes_tracing_in_place() {
    let (receiver, eng, listen, metrics, dir) = for_the_binary("traces").await;
    let conf = |tracing: &str| {
        format!(
            "listen: \"127.0.0.1:{listen}\"\nmetrics_listen: \"127.0.0.1:{metrics}\"\n\
             server:\n  pid_file: {d}/infergate.pid\n  upgrade_sock: {d}/upgrade.sock\n  \
             daemon_wait_for_ready: true\n  daemon_ready_timeout_seconds: 30\n  grace_period_seconds: 0\n  \
             graceful_shutdown_timeout_seconds: 1\n{tracing}\
             pools:\n  - name: default\n    endpoints:\n      - url: {u}\n    health_check: {{ interval: 200ms, timeout: 500ms }}\n",
            d = dir.display(),
            u = eng[0].url(),
        )
    };
    let path = dir.join("infergate.yaml");
    std::fs::write(&path, conf(&traced(&receiver, ""))).unwrap();
    let log = std::fs::File::create(dir.join("router.log")).unwrap();
    let status = Command::new(env!("CARGO_BIN_EXE_infergate"))
        .args(["-d", "-c", path.to_str().unwrap()])
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(log)
        .status()
        .unwrap();
    assert!(status.success(), "the daemon started");
    let pid: u32 = std::fs::read_to_string(dir.join("infergate.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let daemon = Daemon(pid);
    let url = format!("http://127.0.0.1:{listen}");
    let sighup = || {
        assert!(Command::new("kill")
            .args(["-HUP", &pid.to_string()])
            .status()
            .unwrap()
            .success());
    };
    let reloads = |n: f64| async move {
        wait_metrics(metrics, "the reload", |m| {
            metric_value(m, "infergate_config_reloads_total", &["result=\"applied\""]) == Some(n)
        })
        .await;
    };

    assert_eq!(post_chat(&url, chat_body(300, false, 2)).await, 200);
    receiver
        .spans_when(|s| s.iter().any(|x| x.kind == 2 && x.service == "infergate"))
        .await;

    // Another service name: the pipeline is rebuilt in place.
    std::fs::write(&path, conf(&traced(&receiver, ", service_name: node-7"))).unwrap();
    sighup();
    reloads(1.0).await;
    assert_eq!(post_chat(&url, chat_body(310, false, 2)).await, 200);
    receiver
        .spans_when(|s| s.iter().any(|x| x.kind == 2 && x.service == "node-7"))
        .await;

    // Off: the engine gets the client's headers as they were, nothing more is exported.
    std::fs::write(&path, conf("")).unwrap();
    sighup();
    reloads(2.0).await;
    let before = receiver.spans().len();
    assert_eq!(post_chat(&url, chat_body(320, false, 2)).await, 200);
    assert_eq!(last_generate(&eng[0]).unwrap().header("traceparent"), None);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(receiver.spans().len(), before);
    let text = std::fs::read_to_string(dir.join("router.log")).unwrap_or_default();
    assert!(text.contains("applied tracing"), "{text}");
    drop(daemon);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The span of a request in flight at SIGTERM ends with the request, after the listeners stopped: the pipeline
/// used to be shut down when the stop began, and that span was lost. It is exported before the process exits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_in_flight_at_sigterm_is_exported_before_the_exit() {
    // About 100 decode steps of 18 ms: an answer of nearly 2 s.
    let (receiver, eng, listen, metrics, dir) = for_the_binary("traces-stop").await;
    let pool = pool_yaml("load_aware", &urls(&eng), "");
    let child = serving_binary(&dir, (listen, metrics), &pool, &traced(&receiver, ""), 30).await;
    let url = format!("http://127.0.0.1:{listen}");
    let in_flight = tokio::spawn({
        let url = url.clone();
        async move { post_chat(&url, chat_body(64, false, 100)).await }
    });
    wait_metrics(metrics, "the request in flight", |m| {
        metric_value(m, "infergate_endpoint_requests_in_flight", &[]) == Some(1.0)
    })
    .await;
    signal(child.id(), "TERM");
    assert_eq!(in_flight.await.unwrap(), 200, "answered after SIGTERM");
    let status = exit_status(child).await;
    assert!(status.success(), "{status:?}");
    let spans = receiver.spans();
    assert_eq!(
        spans.iter().filter(|s| s.kind == 2).count(),
        1,
        "the request's server span, exported before the exit: {spans:?}"
    );
    let text = std::fs::read_to_string(dir.join("stderr")).unwrap_or_default();
    assert!(
        text.contains("graceful shutdown: no client connection open"),
        "{text}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
