//! Browsers calling the client port from a page of another origin (`cors_allowed_origins`): preflights answered
//! before any key check, the answers readable by the allowed origins only, and off by default. Headless Chromium
//! (Debian `chromium`, installed by `scripts/ensure-test-tools.sh`) loads such a page and calls the router.

use std::io::{Read, Write};
use std::net::TcpListener;
use std::path::PathBuf;

use crate::common::*;
use infergate_sim::SimConfig;

const KEY: &str = "sk-browser-0123456789abcdef";

fn keys_file() -> PathBuf {
    let p = std::env::temp_dir().join(format!(
        "infergate-cors-{}-{}",
        std::process::id(),
        fastrand::u64(..)
    ));
    std::fs::write(&p, format!("web:{KEY}\n")).unwrap();
    p
}

/// A router that requires a key, over one engine, allowing `origins` (a YAML list, or "" for the default).
async fn router(origins: &str) -> (infergate_sim::EngineHandle, TestRouter) {
    let eng = engine(SimConfig::default()).await;
    let cors = if origins.is_empty() {
        String::new()
    } else {
        format!("cors_allowed_origins: {origins}\n")
    };
    let yaml = format!(
        "{cors}auth:\n  keys_file: {}\n{}",
        keys_file().display(),
        pool_yaml("load_aware", &[eng.url()], "")
    );
    let router = start_router(&yaml).await;
    router.ready().await;
    (eng, router)
}

/// A small chat completion from a page of `origin`, with the key or without.
async fn chat_from(router: &TestRouter, origin: &str, key: Option<&str>) -> reqwest::Response {
    let req = post_json(&client(), &router.url(), CHAT)
        .header("origin", origin)
        .body(chat_body(200, false, 2));
    let req = match key {
        Some(k) => req.bearer_auth(k),
        None => req,
    };
    req.send().await.expect("router answers")
}

async fn preflight(
    router: &TestRouter,
    origin: &str,
    method: &str,
    path: &str,
) -> reqwest::Response {
    client()
        .request(reqwest::Method::OPTIONS, format!("{}{path}", router.url()))
        .header("origin", origin)
        .header("access-control-request-method", method)
        .header(
            "access-control-request-headers",
            "authorization, content-type",
        )
        .send()
        .await
        .expect("router answers")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_allowed_origin_passes_its_preflight_without_a_key_and_reads_every_answer() {
    const APP: &str = "http://app.example:8080";
    let (eng, router) = router(&format!("[\"{APP}\"]")).await;

    let ok = preflight(&router, APP, "POST", CHAT).await;
    assert_eq!(ok.status(), 204);
    assert_eq!(
        header(&ok, "access-control-allow-origin").as_deref(),
        Some(APP)
    );
    assert_eq!(
        header(&ok, "access-control-allow-methods").as_deref(),
        Some("POST")
    );
    assert_eq!(
        header(&ok, "access-control-allow-headers").as_deref(),
        Some("authorization, content-type")
    );
    assert_eq!(header(&ok, "vary").as_deref(), Some("Origin"));
    assert!(header(&ok, "access-control-max-age").is_some());

    let other = preflight(&router, "https://evil.example", "POST", CHAT).await;
    assert_eq!(other.status(), 403);
    assert_eq!(header(&other, "access-control-allow-origin"), None);
    let closed = preflight(&router, APP, "POST", "/sleep").await;
    assert_eq!(closed.status(), 404, "only what the client port serves");

    // The engine's answer and the router's own errors are readable by the allowed origin alone.
    let served = chat_from(&router, APP, Some(KEY)).await;
    assert_eq!(served.status(), 200);
    assert_eq!(
        header(&served, "access-control-allow-origin").as_deref(),
        Some(APP)
    );
    assert!(header(&served, "access-control-expose-headers")
        .is_some_and(|h| h.contains("x-request-id")));
    let refused = chat_from(&router, APP, None).await;
    assert_eq!(refused.status(), 401);
    assert_eq!(
        header(&refused, "access-control-allow-origin").as_deref(),
        Some(APP)
    );
    let foreign = chat_from(&router, "https://evil.example", Some(KEY)).await;
    assert_eq!(foreign.status(), 200);
    assert_eq!(header(&foreign, "access-control-allow-origin"), None);
    // Preflights never reached the engine.
    assert!(eng.requests().iter().all(|r| r.method != "OPTIONS"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cors_is_off_by_default() {
    let (_eng, router) = router("").await;
    let pre = preflight(&router, "http://app.example", "POST", CHAT).await;
    assert_eq!(pre.status(), 404);
    assert_eq!(header(&pre, "access-control-allow-origin"), None);
}

/// Serve `html` to every GET on a loopback port (its own origin) until the test ends; the page's URL.
fn serve_page(html: String) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/", listener.local_addr().unwrap());
    std::thread::spawn(move || {
        for mut conn in listener.incoming().flatten() {
            let mut buf = [0u8; 4096];
            let _ = conn.read(&mut buf);
            let head = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: text/html\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                html.len()
            );
            let _ = conn.write_all(head.as_bytes());
            let _ = conn.write_all(html.as_bytes());
        }
    });
    url
}

/// What a page of its own origin got when it called the router's chat completions with a key, in Chromium.
fn browser_calls(router: &TestRouter) -> String {
    let chrome = match tool("chromium") {
        Some(c) => c,
        None => return "skipped".into(),
    };
    let page = format!(
        r#"<html><body><script>
fetch("{}/v1/chat/completions", {{method: "POST",
  headers: {{"Authorization": "Bearer {KEY}", "Content-Type": "application/json"}},
  body: JSON.stringify({{model: "sim-model", messages: [{{role: "user", content: "hi"}}], max_tokens: 2}})}})
  .then(r => r.json().then(j => {{ document.body.id = "ok-" + r.status + "-" + (j.choices ? "choices" : "other"); }}))
  .catch(e => {{ document.body.id = "blocked"; }});
</script></body></html>"#,
        router.url()
    );
    let url = serve_page(page);
    chromium(&chrome, &url, &["--dump-dom"])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_page_of_an_allowed_origin_calls_the_router_from_chromium_and_others_are_blocked() {
    // Page origins are their own loopback ports: allow any origin here, none in the second router.
    let (_eng, open) = router("[\"*\"]").await;
    let dom = tokio::task::block_in_place(|| browser_calls(&open));
    if dom != "skipped" {
        assert!(dom.contains("id=\"ok-200-choices\""), "{dom}");
    }
    let (_eng2, closed) = router("").await;
    let dom = tokio::task::block_in_place(|| browser_calls(&closed));
    if dom != "skipped" {
        assert!(dom.contains("id=\"blocked\""), "{dom}");
    }
}
