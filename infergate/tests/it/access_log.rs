//! Request tracing end to end: the access log's lines (JSON and text) for served, failed and refused requests,
//! request ids taken from the client or generated and seen by the engine and the client, W3C trace context passed
//! through, the serving endpoint's header on and off; nothing secret in the log.

use std::path::PathBuf;
use std::time::Duration;

use crate::common::*;
use infergate_sim::{self as sim, SimConfig};
use serde_json::Value;

/// A log file path unique to this test process and `name`.
fn log_path(name: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!(
        "infergate-access-{}-{name}.log",
        std::process::id()
    ));
    let _ = std::fs::remove_file(&p);
    p
}

fn is_generated_id(id: &str) -> bool {
    id.len() == 32 && id.bytes().all(|b| b.is_ascii_hexdigit())
}

const PROMPT_MARKER: &str = "PROMPT-MARKER-7f3a";
const CLIENT_TOKEN: &str = "sk-client-SECRET-91c2";
const QUERY_TOKEN: &str = "QUERY-SECRET-55d1";
const SESSION_ID: &str = "session-RAW-VALUE-0b9e";

fn marked_body(stream: bool) -> String {
    serde_json::json!({
        "model": "sim-model",
        "stream": stream,
        "max_tokens": 4,
        "messages": [{"role": "user", "content": format!("{PROMPT_MARKER} {}", "word ".repeat(400))}],
    })
    .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_lines_for_a_streamed_a_failed_and_a_refused_request() {
    let eng = sim::spawn_engine(SimConfig::default()).await.unwrap();
    let label = eng.url().trim_start_matches("http://").to_string();
    let path = log_path("json");
    // Health checks once a minute: the engine keeps looking healthy after it stops accepting.
    let yaml = format!(
        "{}access_log: {{ format: json, path: \"{}\" }}\n",
        slow_health_checks(&pool_yaml("load_aware", &[eng.url()], &sessions_yaml(100))),
        path.display()
    );
    let router = start_router(&yaml).await;
    router.ready().await;

    // 1. A streamed session turn, with a client token and a token in the query string.
    let body = marked_body(true);
    let resp = client()
        .post(format!("{}{CHAT}?api_key={QUERY_TOKEN}", router.url()))
        .header("content-type", "application/json")
        .header("authorization", format!("Bearer {CLIENT_TOKEN}"))
        .header(SESSION_HEADER, SESSION_ID)
        .header("user-agent", "claude-cli/2.1.332 (external, sdk-cli)")
        .body(body.clone())
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let id1 = header(&resp, "x-request-id").expect("a request id");
    assert!(is_generated_id(&id1), "{id1}");
    let streamed = resp.bytes().await.unwrap();

    // 2. The engine stops accepting: the connect fails, nowhere else to go.
    eng.control.refuse_connections(true).unwrap();
    eng.control.drop_idle_connections();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let resp = send_chat(&router.url(), marked_body(false)).await;
    let failed_status = resp.status().as_u16();
    assert!(failed_status >= 500, "{failed_status}");
    let id2 = header(&resp, "x-request-id").expect("an error answer has a request id too");
    let _ = resp.bytes().await;

    // 3. A path the router refuses itself.
    let resp = client()
        .get(format!("{}/metrics?token={QUERY_TOKEN}", router.url()))
        .header("x-request-id", "client-chosen-id")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 404);
    assert_eq!(
        header(&resp, "x-request-id").as_deref(),
        Some("client-chosen-id")
    );
    let _ = resp.bytes().await;

    let got = log_lines(&path, 3).await;
    assert_eq!(got.len(), 3, "one line per request: {got:?}");
    let v: Vec<Value> = got
        .iter()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();

    let s = &v[0];
    assert_eq!(s["request_id"], id1.as_str());
    assert_eq!(s["user_agent"], "claude-cli/2.1.332 (external, sdk-cli)");
    assert_eq!(s["method"], "POST");
    assert_eq!(s["path"], CHAT, "normalised path, no query string");
    assert_eq!(s["model"], "sim-model");
    assert_eq!(s["pool"], "default");
    assert_eq!(s["endpoint"], label.as_str());
    assert_eq!(s["reason"], "new_session");
    assert_eq!(s["status"], 200);
    assert_eq!(
        s["tokens"].as_u64(),
        Some(infergate::placement::estimate_tokens(
            body.len() as u64,
            4.0,
            262_144
        ))
    );
    let (ttfb, duration) = (
        s["ttfb_ms"].as_f64().unwrap(),
        s["duration_ms"].as_f64().unwrap(),
    );
    assert!(ttfb > 0.0 && ttfb <= duration, "{ttfb} {duration}");
    assert_eq!(s["bytes_in"].as_u64(), Some(body.len() as u64));
    assert_eq!(s["bytes_out"].as_u64(), Some(streamed.len() as u64));
    assert_eq!(s["retries"], 0);
    assert_eq!(s["client_key"], Value::Null);
    let hash = s["session"].as_str().unwrap();
    assert!(
        hash.len() == 16 && hash.bytes().all(|b| b.is_ascii_hexdigit()),
        "{hash}"
    );
    assert_eq!(s["error"], Value::Null);
    assert!(s["client"].as_str().unwrap().starts_with("127.0.0.1:"));
    let time = s["time"].as_str().unwrap();
    assert!(humantime::parse_rfc3339(time).is_ok(), "{time}");

    let f = &v[1];
    assert_eq!(f["request_id"], id2.as_str());
    assert_eq!(f["status"], failed_status);
    assert_eq!(f["endpoint"], label.as_str(), "the endpoint that failed");
    assert_eq!(f["reason"], "headerless");
    // One retry at least: elsewhere (nowhere left), maybe first over a fresh connection if the pooled one was stale.
    assert!(f["retries"].as_u64() >= Some(1), "{f}");
    assert_eq!(f["ttfb_ms"], Value::Null);
    assert_eq!(f["session"], Value::Null);
    assert_eq!(f["error"], "upstream:ConnectRefused");

    let r = &v[2];
    assert_eq!(r["request_id"], "client-chosen-id");
    assert_eq!(r["method"], "GET");
    assert_eq!(r["path"], "/metrics");
    assert_eq!(r["status"], 404);
    assert_eq!(r["pool"], Value::Null);
    assert_eq!(r["endpoint"], Value::Null);

    let text = std::fs::read_to_string(&path).unwrap();
    for secret in [
        PROMPT_MARKER,
        CLIENT_TOKEN,
        QUERY_TOKEN,
        SESSION_ID,
        "word word",
    ] {
        assert!(
            !text.contains(secret),
            "`{secret}` in the access log:\n{text}"
        );
    }
    drop(router);
    let _ = std::fs::remove_file(&path);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_the_engine_ends_with_its_error_is_logged_as_its_failure() {
    let eng = sim::spawn_engine(SimConfig::default()).await.unwrap();
    let path = log_path("stream-error");
    let yaml = format!(
        "{}access_log: {{ format: json, path: \"{}\" }}\n",
        pool_yaml("load_aware", &[eng.url()], ""),
        path.display()
    );
    let router = start_router(&yaml).await;
    router.ready().await;
    eng.control.set_error_mid_stream_after(Some(0));
    let resp = send_chat(&router.url(), marked_body(true)).await;
    assert_eq!(resp.status(), 200);
    let text = resp.text().await.unwrap();
    assert!(text.contains("\"InternalServerError\""), "{text}");
    let got = log_lines(&path, 1).await;
    let v: Value = serde_json::from_str(&got[0]).unwrap();
    assert_eq!(v["status"], 200, "{v}");
    assert_eq!(v["error"], "upstream:stream_error", "{v}");
    assert_eq!(
        v["ttft_ms"],
        Value::Null,
        "an error is no first output: {v}"
    );
    drop(router);
    let _ = std::fs::remove_file(&path);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_ids_and_trace_context_reach_the_engine_and_come_back() {
    let eng = sim::spawn_engine(SimConfig::default()).await.unwrap();
    let label = eng.url().trim_start_matches("http://").to_string();
    let path = log_path("text");
    let yaml = format!(
        "{}access_log: {{ format: text, path: \"{}\" }}\n",
        pool_yaml("load_aware", &[eng.url()], ""),
        path.display()
    );
    let router = start_router(&yaml).await;
    router.ready().await;
    let post = |headers: Vec<(&'static str, &'static str)>| {
        let mut req = post_json(&client(), &router.url(), CHAT).body(marked_body(true));
        for (k, v) in headers {
            req = req.header(k, v);
        }
        req.send()
    };

    // No id: one is generated, sent to the engine, returned; the endpoint is named.
    let resp = post(vec![]).await.unwrap();
    assert_eq!(resp.status(), 200);
    let generated = header(&resp, "x-request-id").unwrap();
    assert!(is_generated_id(&generated), "{generated}");
    assert_eq!(header(&resp, "x-infergate-endpoint"), Some(label.clone()));
    drain(resp).await.unwrap();
    let seen = last_generate(&eng).unwrap();
    assert_eq!(seen.header("x-request-id"), Some(generated.as_str()));

    // The client's id and W3C trace context pass through untouched.
    let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let tracestate = "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE";
    let resp = post(vec![
        ("x-request-id", "client:42/abc"),
        ("traceparent", traceparent),
        ("tracestate", tracestate),
    ])
    .await
    .unwrap();
    assert_eq!(
        header(&resp, "x-request-id").as_deref(),
        Some("client:42/abc")
    );
    drain(resp).await.unwrap();
    let seen = last_generate(&eng).unwrap();
    assert_eq!(seen.header("x-request-id"), Some("client:42/abc"));
    assert_eq!(seen.header("traceparent"), Some(traceparent));
    assert_eq!(seen.header("tracestate"), Some(tracestate));
    let ids: Vec<&str> = seen
        .headers
        .iter()
        .filter(|(k, _)| k == "x-request-id")
        .map(|(_, v)| v.as_str())
        .collect();
    assert_eq!(ids, ["client:42/abc"], "exactly one id upstream");

    // An id that is not a sane token is replaced, everywhere.
    let resp = post(vec![("x-request-id", "two words")]).await.unwrap();
    let replaced = header(&resp, "x-request-id").unwrap();
    assert!(is_generated_id(&replaced), "{replaced}");
    drain(resp).await.unwrap();
    assert_eq!(
        last_generate(&eng).unwrap().header("x-request-id"),
        Some(replaced.as_str())
    );

    let got = log_lines(&path, 3).await;
    assert!(got[0].starts_with("time="), "{}", got[0]);
    assert!(
        got[0].contains(&format!(" request_id={generated}")),
        "{}",
        got[0]
    );
    assert!(
        got[0].contains(&format!(" endpoint={label} ")),
        "{}",
        got[0]
    );
    assert!(
        got[0].contains(" status=200 ") && got[0].contains(" client_key=- "),
        "{}",
        got[0]
    );
    assert!(got[1].contains(" request_id=client:42/abc"), "{}", got[1]);
    assert!(
        got[2].contains(&format!(" request_id={replaced}")),
        "{}",
        got[2]
    );
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(!text.contains("two words") && !text.contains(PROMPT_MARKER));
    drop(router);
    let _ = std::fs::remove_file(&path);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_endpoint_header_can_be_turned_off() {
    let eng = sim::spawn_engine(SimConfig::default()).await.unwrap();
    let yaml = format!(
        "{}endpoint_header: false\n",
        pool_yaml("load_aware", &[eng.url()], "")
    );
    let router = start_router(&yaml).await;
    router.ready().await;
    let resp = send_chat(&router.url(), marked_body(false)).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(header(&resp, "x-infergate-endpoint"), None);
    assert!(header(&resp, "x-request-id").is_some());
    drain(resp).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_key_is_named_never_shown() {
    const ALICE: &str = "sk-alice-access-log-5e1f9a";
    let eng = sim::spawn_engine(SimConfig::default()).await.unwrap();
    let keys = log_path("keys");
    std::fs::write(&keys, format!("alice:{ALICE}\n")).unwrap();
    let path = log_path("keys-json");
    let yaml = format!(
        "auth:\n  keys_file: {}\naccess_log: {{ format: json, path: \"{}\" }}\n{}",
        keys.display(),
        path.display(),
        pool_yaml("load_aware", &[eng.url()], "")
    );
    let router = start_router(&yaml).await;
    router.ready().await;
    for (token, want) in [(ALICE, 200), ("sk-not-a-key-0000", 401)] {
        let resp = post_json(&client(), &router.url(), CHAT)
            .header("authorization", format!("Bearer {token}"))
            .body(marked_body(false))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), want);
        assert!(header(&resp, "x-request-id").is_some());
        let _ = resp.bytes().await;
    }
    let got = log_lines(&path, 2).await;
    let v: Vec<Value> = got
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(
        (&v[0]["client_key"], &v[0]["status"]),
        (&Value::from("alice"), &Value::from(200))
    );
    assert_eq!(
        (&v[1]["client_key"], &v[1]["status"]),
        (&Value::Null, &Value::from(401))
    );
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(
        !text.contains(ALICE) && !text.contains("sk-not-a-key"),
        "{text}"
    );
    drop(router);
    let _ = std::fs::remove_file(&path);
    let _ = std::fs::remove_file(&keys);
}
