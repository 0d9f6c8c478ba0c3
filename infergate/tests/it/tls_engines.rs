//! TLS from the router to its engines: an engine behind a TLS terminator (rustls, as a sidecar in front of vLLM
//! would be) is reached over `https://`, its certificate checked against the pool's `tls.ca_file` and the name in
//! `tls.server_name` (sent as SNI), or the URL's IP address; a certificate from another CA or for another name is
//! refused, by the health checks, requests and the router's own requests (stats, model lists, stored-response
//! lookups, the prefill legs of a disaggregated pool) alike.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::common::*;
use infergate_sim::SimConfig;

/// A TLS terminator on a loopback port in front of a plain engine: what reached it (SNI of each completed
/// handshake, handshakes that failed).
struct Terminator {
    addr: SocketAddr,
    /// The certificate new connections get (`reissue`).
    acceptor: Arc<Mutex<tokio_rustls::TlsAcceptor>>,
    names: Arc<Mutex<Vec<Option<String>>>>,
    failed: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Terminator {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn acceptor(issued: &Issued) -> tokio_rustls::TlsAcceptor {
    let certs = CertificateDer::pem_slice_iter(issued.cert.as_bytes())
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let key = PrivateKeyDer::from_pem_slice(issued.key.as_bytes()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap();
    tokio_rustls::TlsAcceptor::from(Arc::new(cfg))
}

impl Terminator {
    async fn start(issued: &Issued, backend: SocketAddr) -> Terminator {
        let acceptor = Arc::new(Mutex::new(acceptor(issued)));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let names = Arc::new(Mutex::new(Vec::new()));
        let failed = Arc::new(AtomicUsize::new(0));
        let (n, f, a) = (names.clone(), failed.clone(), acceptor.clone());
        let task = tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let (acceptor, n, f) = (a.lock().clone(), n.clone(), f.clone());
                tokio::spawn(async move {
                    let mut tls = match acceptor.accept(tcp).await {
                        Ok(tls) => tls,
                        Err(_) => {
                            f.fetch_add(1, Ordering::Relaxed);
                            return;
                        }
                    };
                    n.lock()
                        .push(tls.get_ref().1.server_name().map(str::to_string));
                    let Ok(mut plain) = tokio::net::TcpStream::connect(backend).await else {
                        return;
                    };
                    let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
                });
            }
        });
        Terminator {
            addr,
            acceptor,
            names,
            failed,
            task,
        }
    }

    /// New connections get `issued` from now on.
    fn reissue(&self, issued: &Issued) {
        *self.acceptor.lock() = acceptor(issued);
    }

    fn served(&self) -> usize {
        self.names.lock().len()
    }

    /// Every handshake from the `from`-th on sent `sni`.
    fn assert_sni_since(&self, from: usize, sni: Option<&str>) {
        let names = self.names.lock();
        assert!(
            names[from..].iter().all(|n| n.as_deref() == sni),
            "SNI, want {sni:?}: {names:?}"
        );
    }
}

/// An engine behind a terminator whose certificate `ca` issued for `engine.internal` and 127.0.0.1, and its
/// `https://` URL.
async fn engine_behind_tls(ca: &TestCa) -> (infergate_sim::EngineHandle, Terminator, String) {
    engine_behind_tls_with(ca, SimConfig::default()).await
}

/// [`engine_behind_tls`] with the engine configured as `cfg` says.
async fn engine_behind_tls_with(
    ca: &TestCa,
    cfg: SimConfig,
) -> (infergate_sim::EngineHandle, Terminator, String) {
    let engine = engine(cfg).await;
    let term = Terminator::start(
        &ca.issue("engine", &["engine.internal", "127.0.0.1"]),
        engine_addr(&engine.url()),
    )
    .await;
    let url = format!("https://127.0.0.1:{}", term.addr.port());
    (engine, term, url)
}

fn engine_addr(url: &str) -> SocketAddr {
    url.trim_start_matches("http://").parse().unwrap()
}

/// The pool-level `tls` YAML (indented by 4): certificates checked against `ca_file` for `engine.internal`.
fn by_name(ca_file: &std::path::Path) -> String {
    format!(
        "    tls: {{ ca_file: \"{}\", server_name: engine.internal }}\n",
        ca_file.display()
    )
}

/// A router with one pool over `url` and the pool-level `tls` YAML `tls` (indented by 4).
async fn router(url: &str, tls: &str) -> TestRouter {
    start_router(&pool_yaml("load_aware", &[url.to_string()], tls)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_engines_are_checked_against_the_pool_ca_and_server_name() {
    let dir = tls_dir("engines");
    let ca = TestCa::new("engine CA");
    let ca_file = write(&dir, "engine-ca.pem", &ca.pem());
    let (engine, term, url) = engine_behind_tls(&ca).await;

    // By name: SNI sent, certificate checked against the pool's CA.
    let tls = by_name(&ca_file);
    let r = router(&url, &tls).await;
    r.ready().await;
    assert_eq!(post_chat(&r.url(), chat_body(2_000, true, 4)).await, 200);
    assert_eq!(post_chat(&r.url(), chat_body(2_000, false, 4)).await, 200);
    assert!(generate_requests(&engine) >= 2);
    term.assert_sni_since(0, Some("engine.internal"));
    drop(r);

    // By the URL's IP address: checked against the certificate's IP addresses, no SNI.
    let before = term.served();
    let tls = format!("    tls: {{ ca_file: \"{}\" }}\n", ca_file.display());
    let r = router(&url, &tls).await;
    r.ready().await;
    assert_eq!(post_chat(&r.url(), chat_body(2_000, true, 4)).await, 200);
    term.assert_sni_since(before, None);
    drop(r);
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engine_certificate_from_another_ca_or_for_another_name_is_refused() {
    let dir = tls_dir("engines-refused");
    let (ca, other) = (TestCa::new("engine CA"), TestCa::new("another CA"));
    let other_file = write(&dir, "other-ca.pem", &other.pem());
    let ca_file = write(&dir, "engine-ca.pem", &ca.pem());
    let engine = engine(SimConfig::default()).await;
    let term = Terminator::start(
        &ca.issue("engine", &["engine.internal"]),
        engine_addr(&engine.url()),
    )
    .await;
    let url = format!("https://127.0.0.1:{}", term.addr.port());

    for (tls, what) in [
        (by_name(&other_file), "a certificate from another CA"),
        (
            format!(
                "    tls: {{ ca_file: \"{}\", server_name: other.internal }}\n",
                ca_file.display()
            ),
            "a certificate for another name",
        ),
    ] {
        let failed_before = term.failed.load(Ordering::Relaxed);
        let r = router(&url, &tls).await;
        // The health checks fail their handshakes: the endpoint never turns healthy.
        r.wait_for(
            "refused health-check handshakes",
            std::time::Duration::from_secs(10),
            |_| term.failed.load(Ordering::Relaxed) >= failed_before + 2,
        )
        .await;
        assert!(!r.state.pools.any_healthy(), "{what}: endpoint healthy");
        // A request placed there anyway (every endpoint unhealthy: the pool's health panic) is not served.
        let status = post_chat(&r.url(), chat_body(2_000, false, 4)).await;
        assert_ne!(status, 200, "{what}: served");
        assert_eq!(term.served(), 0, "{what}: a handshake completed");
        assert_eq!(generate_requests(&engine), 0, "{what}: reached the engine");
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn engine_stats_and_the_model_list_of_https_engines_are_read_over_tls_checked_as_requests_are(
) {
    let dir = tls_dir("engines-stats");
    let (ca, other) = (TestCa::new("engine CA"), TestCa::new("another CA"));
    let ca_file = write(&dir, "engine-ca.pem", &ca.pem());
    let other_file = write(&dir, "other-ca.pem", &other.pem());
    let (_engine, term, url) = engine_behind_tls(&ca).await;
    let fresh = |m: &str| {
        metric_value(m, "infergate_engine_stats_state", &["state=\"fresh\""]) == Some(1.0)
    };

    // The pool's CA and server name: the scrapes are fresh, the model list is the engine's, all by that name.
    let tls = format!("{}{ENGINE_STATS}", by_name(&ca_file));
    let r = router(&url, &tls).await;
    r.ready().await;
    let m = r.metrics_when(fresh).await;
    assert!(fresh(&m), "engine stats over TLS are fresh");
    assert_eq!(
        get_json(&r.url(), "/v1/models").await["data"][0]["id"],
        "sim-model"
    );
    term.assert_sni_since(0, Some("engine.internal"));
    drop(r);

    // By the URL's IP address (no server name): checked against the certificate's IP addresses, no SNI.
    let before = term.served();
    let tls = format!(
        "    tls: {{ ca_file: \"{}\" }}\n{ENGINE_STATS}",
        ca_file.display()
    );
    let r = router(&url, &tls).await;
    r.ready().await;
    assert!(fresh(&r.metrics_when(fresh).await), "by IP address");
    term.assert_sni_since(before, None);
    drop(r);

    // A certificate the pool's CA did not issue: no scrape gets through, so the stats are never fresh.
    let failed = term.failed.load(Ordering::Relaxed);
    let tls = format!("{}{ENGINE_STATS}", by_name(&other_file));
    let r = router(&url, &tls).await;
    tokio::time::sleep(std::time::Duration::from_millis(600)).await;
    let m = r.metrics_text().await;
    assert!(!fresh(&m), "a refused certificate gives no stats");
    assert_eq!(
        metric_value(&m, "infergate_engine_stats_state", &["state=\"down\""]),
        Some(1.0)
    );
    assert!(
        term.failed.load(Ordering::Relaxed) > failed,
        "handshakes refused"
    );
    drop(r);
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stored_response_on_an_https_engine_is_found_over_tls_by_a_router_that_never_saw_it() {
    let dir = tls_dir("engines-stored");
    let (ca, other) = (TestCa::new("engine CA"), TestCa::new("another CA"));
    let ca_file = write(&dir, "engine-ca.pem", &ca.pem());
    let other_file = write(&dir, "other-ca.pem", &other.pem());
    let (_engine, term, url) = engine_behind_tls_with(
        &ca,
        SimConfig {
            responses_store: true,
            ..SimConfig::default()
        },
    )
    .await;
    let tls = by_name(&ca_file);
    let turn = |previous: Option<&str>| {
        let mut b =
            serde_json::json!({"input": "hi", "max_output_tokens": 4, "model": "sim-model"});
        if let Some(p) = previous {
            b["previous_response_id"] = p.into();
        }
        b.to_string()
    };
    let post = |base: String, body: String| async move {
        let resp = client()
            .post(format!("{base}/v1/responses"))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .expect("router answers");
        let status = resp.status().as_u16();
        (
            status,
            resp.json::<serde_json::Value>().await.unwrap_or_default(),
        )
    };
    let retrieve = |base: String, id: String| async move {
        let resp = client()
            .get(format!("{base}/v1/responses/{id}"))
            .send()
            .await
            .expect("router answers");
        resp.status().as_u16()
    };

    // Made through one router, over TLS.
    let made_by = router(&url, &tls).await;
    made_by.ready().await;
    let (status, made) = post(made_by.url(), turn(None)).await;
    assert_eq!(status, 200, "{made}");
    let id = made["id"].as_str().expect("a response id").to_string();
    drop(made_by);

    // Another router (a restart, a replica without `cluster`) has no record of it: it asks the engine, over TLS
    // checked against the pool's CA and name.
    let before = term.served();
    let r = router(&url, &tls).await;
    r.ready().await;
    assert_eq!(retrieve(r.url(), id.clone()).await, 200, "retrieved");
    let (status, next) = post(r.url(), turn(Some(&id))).await;
    assert_eq!(status, 200, "continued: {next}");
    assert_eq!(
        r.metric_sum(
            "infergate_stored_response_lookups_total",
            &["source=\"engine\""]
        )
        .await,
        1.0,
        "found by asking the engine, once"
    );
    term.assert_sni_since(before, Some("engine.internal"));
    drop(r);

    // A pool trusting another CA: the engine is never asked in the clear or over an unchecked connection.
    let before = term.served();
    let tls = by_name(&other_file);
    let r = router(&url, &tls).await;
    assert_eq!(retrieve(r.url(), id.clone()).await, 404, "not found");
    assert_eq!(term.served(), before, "a handshake completed");
    drop(r);
    let _ = std::fs::remove_dir_all(dir);
}

/// A router with one disaggregated pool `pd`: its decode engine `decode` (plain), its prefill set the one engine
/// `prefill` with the set's `tls` YAML `tls` (a flow mapping, or empty); no retries, so a leg that cannot be sent
/// shows how it failed; the prefill engine checked every `interval`.
async fn disagg_router(prefill: &str, decode: &str, tls: &str, interval: &str) -> TestRouter {
    start_router(&disagg_yaml(prefill, decode, tls, interval)).await
}

/// The configuration of [`disagg_router`] (`timeouts.connect` 1s).
fn disagg_yaml(prefill: &str, decode: &str, tls: &str, interval: &str) -> String {
    let checks =
        "{ path: /health, interval: 200ms, timeout: 500ms, healthy_after: 1, unhealthy_after: 1 }";
    let prefill_checks = checks.replace("200ms", interval);
    let tls = if tls.is_empty() {
        String::new()
    } else {
        format!("        tls: {tls}\n")
    };
    format!(
        "listen: \"{{listen}}\"\nmetrics_listen: \"{{metrics}}\"\nmax_retries: 0\n\
         timeouts: {{ connect: 1s, response_header: 30s, stream_idle: 30s }}\n\
         pools:\n  - name: pd\n    models: [\"*\"]\n    endpoints: [\"{decode}\"]\n    health_check: {checks}\n\
         \x20   disaggregation:\n      connector: nixl\n      prefill:\n        endpoints: [\"{prefill}\"]\n        \
         health_check: {prefill_checks}\n{tls}"
    )
}

fn nixl() -> SimConfig {
    SimConfig {
        kv_transfer: true,
        time_scale: 0.05,
        ..SimConfig::default()
    }
}

fn legs(m: &str, outcome: &str) -> Option<f64> {
    let outcome = format!("outcome=\"{outcome}\"");
    metric_value(
        m,
        "infergate_disagg_prefill_legs_total",
        &["pool=\"pd\"", &outcome],
    )
}

/// A disaggregated pool's engines for the TLS tests: (the folder of the CA file, a prefill engine, the terminator in
/// front of it with a certificate the CA issued for `engine.internal`, a plain decode engine, the prefill set's
/// `tls` flow mapping trusting that CA for that name).
async fn prefill_behind_tls(
    tag: &str,
) -> (
    std::path::PathBuf,
    infergate_sim::EngineHandle,
    Terminator,
    infergate_sim::EngineHandle,
    String,
) {
    let dir = tls_dir(tag);
    let ca = TestCa::new("engine CA");
    let ca_file = write(&dir, "engine-ca.pem", &ca.pem());
    let prefill = engine(nixl()).await;
    let term = Terminator::start(
        &ca.issue("engine", &["engine.internal"]),
        engine_addr(&prefill.url()),
    )
    .await;
    let decode = engine(nixl()).await;
    let tls = format!(
        "{{ ca_file: \"{}\", server_name: engine.internal }}",
        ca_file.display()
    );
    (dir, prefill, term, decode, tls)
}

/// How one chat request through a disaggregated router went, as far as its prefill leg shows.
#[derive(Debug, PartialEq)]
struct Leg {
    status: u16,
    /// The error code of the answer.
    code: serde_json::Value,
    /// Prefill legs counted unreachable and served.
    unreachable: Option<f64>,
    served: Option<f64>,
    /// `connect` failures counted against the prefill engine.
    connect_failures: f64,
}

/// Send one chat request through `r` ([`disagg_router`]) and read what its prefill leg left.
async fn send_leg(r: &TestRouter) -> Leg {
    let resp = send_chat(&r.url(), chat_body(2_000, false, 4)).await;
    let status = resp.status().as_u16();
    let v: serde_json::Value = resp.json().await.unwrap_or_default();
    let m = r.metrics_text().await;
    Leg {
        status,
        code: v["error"]["code"].clone(),
        unreachable: legs(&m, "unreachable"),
        served: legs(&m, "served"),
        connect_failures: metric_sum(
            &m,
            "infergate_endpoint_failures_total",
            &["pool=\"pd/prefill\"", "kind=\"connect\""],
        ),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_https_prefill_engine_serves_the_prefill_leg_over_tls_checked_as_requests_are() {
    let (dir, prefill, term, decode, tls) = prefill_behind_tls("engines-prefill").await;
    let prefill_url = format!("https://127.0.0.1:{}", term.addr.port());
    let r = disagg_router(&prefill_url, &decode.url(), &tls, "200ms").await;
    r.all_healthy().await;

    for stream in [false, true] {
        let resp = client()
            .post(format!("{}/v1/chat/completions", r.url()))
            .header("content-type", "application/json")
            .header("x-request-id", format!("prefill-over-tls-{stream}"))
            .body(chat_body(2_000, stream, 4))
            .send()
            .await
            .expect("router answers");
        assert_eq!(resp.status(), 200);
        assert_eq!(
            header(&resp, "x-infergate-prefill-endpoint"),
            Some(format!("127.0.0.1:{}", term.addr.port()))
        );
        drain(resp).await.unwrap();
    }
    // The prefill engine, reached through the terminator, issued the params; the decode engine pulled them.
    assert_eq!(prefill.stats().kv_params_issued, 2);
    assert_eq!(decode.stats().kv_pulls, 2);
    // The leg carried its headers as it does in the clear: the endpoint as Host, JSON, the request id.
    let legs_seen: Vec<_> = prefill
        .requests()
        .into_iter()
        .filter(|q| q.method == "POST")
        .collect();
    assert_eq!(legs_seen.len(), 2);
    let has = |q: &infergate_sim::RecordedRequest, k: &str, v: &str| {
        q.headers.iter().any(|(n, x)| n == k && x == v)
    };
    for (q, stream) in legs_seen.iter().zip([false, true]) {
        assert!(
            has(q, "host", &format!("127.0.0.1:{}", term.addr.port())),
            "{:?}",
            q.headers
        );
        assert!(
            has(q, "content-type", "application/json"),
            "{:?}",
            q.headers
        );
        assert!(
            has(q, "x-request-id", &format!("prefill-over-tls-{stream}")),
            "{:?}",
            q.headers
        );
    }
    let m = r.metrics_text().await;
    assert_eq!(legs(&m, "served"), Some(2.0));
    assert_eq!(legs(&m, "unreachable"), Some(0.0));
    assert_eq!(
        metric_sum(
            &m,
            "infergate_disagg_prefill_seconds_count",
            &["pool=\"pd\""]
        ),
        2.0
    );
    // Every handshake (health checks and legs) sent the set's server name.
    term.assert_sni_since(0, Some("engine.internal"));
    r.wait_idle().await;
    drop(r);
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefill_engine_certificate_from_another_ca_fails_the_leg_as_an_unreachable_engine_does()
{
    let (dir, prefill, term, decode, tls) = prefill_behind_tls("engines-prefill-refused").await;
    let other = TestCa::new("another CA");
    let plain_prefill = engine(nixl()).await;

    // Each prefill engine passes its first check, then (checked again only seconds later, so the leg is placed
    // there) turns unreachable: the terminator presents a certificate the set's CA did not issue; the plain
    // engine refuses connections.
    let cases = [
        (format!("https://127.0.0.1:{}", term.addr.port()), tls),
        (plain_prefill.url(), String::new()),
    ];
    let mut seen = Vec::new();
    let (mut served_before, mut failed_before) = (0, 0);
    for (i, (url, tls)) in cases.iter().enumerate() {
        let r = disagg_router(url, &decode.url(), tls, "5s").await;
        r.all_healthy().await;
        if i == 0 {
            term.reissue(&other.issue("engine", &["engine.internal"]));
            served_before = term.served();
            failed_before = term.failed.load(Ordering::Relaxed);
        } else {
            plain_prefill.control.refuse_connections(true).unwrap();
        }
        seen.push(send_leg(&r).await);
        r.wait_idle().await;
    }
    let want = Leg {
        status: 502,
        code: "upstream_unreachable".into(),
        unreachable: Some(1.0),
        served: Some(0.0),
        connect_failures: 1.0,
    };
    assert_eq!(seen[0], want, "a refused certificate");
    assert_eq!(seen[1], want, "a prefill engine that is not there");
    // The leg never went in the clear or over an unchecked connection: its handshake failed, nothing reached
    // either prefill engine or the decode engine.
    assert_eq!(term.served(), served_before, "a handshake completed");
    assert!(term.failed.load(Ordering::Relaxed) > failed_before);
    assert_eq!(generate_requests(&prefill), 0);
    assert_eq!(generate_requests(&plain_prefill), 0);
    assert_eq!(generate_requests(&decode), 0);
    let _ = std::fs::remove_dir_all(dir);
}

/// A TCP forwarder on a loopback port in front of `backend` that can stop accepting: its listener stays open, so
/// once its accept queue is full the kernel drops further SYNs and a connect to it hangs, as one to an engine
/// that is down behind a firewall, or whose accept queue a burst filled, does.
struct Gate {
    addr: SocketAddr,
    open: tokio::sync::watch::Sender<bool>,
    /// The connections that fill its accept queue (`hang`).
    queued: Vec<tokio::net::TcpStream>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Gate {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Gate {
    async fn start(backend: SocketAddr) -> Gate {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (open, mut rx) = tokio::sync::watch::channel(true);
        let task = tokio::spawn(async move {
            loop {
                if !*rx.borrow_and_update() {
                    if rx.changed().await.is_err() {
                        return;
                    }
                    continue;
                }
                tokio::select! {
                    accepted = listener.accept() => {
                        let Ok((mut down, _)) = accepted else { return };
                        tokio::spawn(async move {
                            if let Ok(mut up) = tokio::net::TcpStream::connect(backend).await {
                                let _ = tokio::io::copy_bidirectional(&mut down, &mut up).await;
                            }
                        });
                    }
                    _ = rx.changed() => {}
                }
            }
        });
        Gate {
            addr,
            open,
            queued: Vec::new(),
            task,
        }
    }

    /// Stop accepting and fill the accept queue: from now on a connect to it hangs.
    async fn hang(&mut self) {
        self.open.send_replace(false);
        for _ in 0..8192 {
            let connect = tokio::net::TcpStream::connect(self.addr);
            match tokio::time::timeout(std::time::Duration::from_millis(200), connect).await {
                Ok(Ok(s)) => self.queued.push(s),
                Ok(Err(e)) => panic!("connect to the gate: {e}"),
                Err(_) => return,
            }
        }
        panic!("the gate's accept queue took 8192 connections and is not full");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefill_engine_that_never_answers_the_connect_times_out_after_timeouts_connect_over_tls_as_in_the_clear(
) {
    let (dir, prefill, term, decode, tls) = prefill_behind_tls("engines-prefill-hung").await;
    // The prefill engine behind a gate: over TLS (through the terminator), and in the clear.
    let cases = [
        ("https", term.addr, tls),
        ("http", engine_addr(&prefill.url()), String::new()),
    ];
    for (scheme, backend, tls) in cases {
        let mut gate = Gate::start(backend).await;
        let url = format!("{scheme}://127.0.0.1:{}", gate.addr.port());
        let log = dir.join(format!("access-{scheme}.log"));
        // Checked once, at start: the leg is placed on it after it hangs. Started with a long connect timeout,
        // then reloaded to a short one (neither the 2 s default): the leg must give up after the reloaded one.
        let yaml = format!(
            "{}access_log: {{ format: json, path: \"{}\" }}\n",
            disagg_yaml(&url, &decode.url(), &tls, "60s").replace("connect: 1s", "connect: 10s"),
            log.display()
        );
        let r = start_router(&yaml).await;
        r.all_healthy().await;
        r.reload(&r.config_text.replace("connect: 10s", "connect: 300ms"));
        gate.hang().await;

        let started = std::time::Instant::now();
        let seen = send_leg(&r).await;
        let took = started.elapsed();
        let line: serde_json::Value =
            serde_json::from_str(&log_lines(&log, 1).await[0]).unwrap_or_default();
        // Unreachable (nothing was sent) after the reloaded connect timeout; not counted against the engine (a
        // burst overflowing an accept queue looks the same), as a proxied attempt's connect timeout is not.
        let want = Leg {
            status: 502,
            code: "upstream_unreachable".into(),
            unreachable: Some(1.0),
            served: Some(0.0),
            connect_failures: 0.0,
        };
        assert_eq!(
            (seen, line["error"].as_str()),
            (want, Some("upstream:ConnectTimedout")),
            "{scheme}: took {took:?}"
        );
        assert!(
            took < std::time::Duration::from_millis(1500),
            "{scheme}: the leg gave up after {took:?}, not the reloaded 300ms"
        );
        r.wait_idle().await;
        drop(r);
        drop(gate);
    }
    assert_eq!(generate_requests(&prefill), 0);
    assert_eq!(generate_requests(&decode), 0);
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_engines_tls_client_trusts_the_ca_certificates_read_with_the_configuration() {
    let dir = tls_dir("engines-ca-once");
    let ca = TestCa::new("engine CA");
    let ca_file = write(&dir, "engine-ca.pem", &ca.pem());
    let (_engine, _term, url) = engine_behind_tls(&ca).await;
    let tls = format!("{}{ENGINE_STATS}", by_name(&ca_file));
    // The CA file is gone between reading the configuration and building the endpoint's client (a renewal
    // caught half-way): the client trusts what the configuration read, and the stats come over TLS.
    let aside = dir.join("engine-ca.pem.aside");
    let r = start_router_with(&pool_yaml("load_aware", &[url], &tls), || {
        std::fs::rename(&ca_file, &aside).unwrap()
    })
    .await;
    let ep = r.state.pools.pools[0].endpoints()[0].clone();
    assert!(ep.target().side().is_ok(), "{:?}", ep.target().side().err());
    r.wait_engine_stats(0, "engine stats over TLS with the CA file gone", |_, _| {
        true
    })
    .await;
    drop(r);
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefill_leg_on_a_pooled_tls_connection_the_engine_closed_is_sent_again() {
    let (dir, prefill, term, decode, tls) = prefill_behind_tls("engines-prefill-stale").await;
    let prefill_url = format!("https://127.0.0.1:{}", term.addr.port());
    // `max_retries: 0`: the resend is not a retry elsewhere.
    let r = disagg_router(&prefill_url, &decode.url(), &tls, "200ms").await;
    r.all_healthy().await;
    assert_eq!(post_chat(&r.url(), chat_body(2_000, false, 2)).await, 200);
    // The terminator's connection to the engine is the pooled TLS connection's: the engine resets it when the
    // next leg goes out on it, and the terminator closes the TLS connection without an answer.
    assert!(prefill.control.poison_idle_connections() >= 1);
    assert_eq!(post_chat(&r.url(), chat_body(2_100, true, 2)).await, 200);
    assert_eq!(prefill.stats().kv_params_issued, 2);
    let m = r.metrics_text().await;
    assert_eq!(retries_and_failures(&m, "pd/prefill"), (1.0, 0.0));
    r.wait_idle().await;
    drop(r);
    let _ = std::fs::remove_dir_all(dir);
}
