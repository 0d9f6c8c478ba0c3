//! Shared harness for the integration tests: real routers and simulated engines on ephemeral loopback ports.
#![allow(dead_code)]

use std::net::{SocketAddr, TcpListener};
use std::path::Path;
use std::time::{Duration, Instant};

use infergate::config::Config;
use infergate::server::{build_server, run_with_channel, RouterState};
use pingora_core::server::configuration::Opt;
use pingora_core::server::ShutdownSignal;

/// A free loopback port (bound then released; a tiny race is acceptable on loopback).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// A router running in-process on its own thread; stopped on drop.
pub struct TestRouter {
    pub addr: SocketAddr,
    pub metrics_addr: SocketAddr,
    pub state: RouterState,
    stop: Option<tokio::sync::mpsc::Sender<ShutdownSignal>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl TestRouter {
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn metrics_url(&self) -> String {
        format!("http://{}/metrics", self.metrics_addr)
    }

    /// Sum of every endpoint's prefill tokens and requests in flight, read from the live counters.
    pub fn totals(&self) -> (u64, u64) {
        let mut t = (0, 0);
        for p in &self.state.pools.pools {
            for e in p.endpoints().iter() {
                t.0 += e.load.prefill_tokens();
                t.1 += e.load.requests();
            }
        }
        t
    }

    /// (prefill tokens, requests in flight) of pool 0's endpoint `i`.
    pub fn endpoint_load(&self, i: usize) -> (u64, u64) {
        let eps = self.state.pools.pools[0].endpoints();
        (eps[i].load.prefill_tokens(), eps[i].load.requests())
    }

    /// Wait until `f` holds, polling; panics with `what` after `limit`.
    pub async fn wait_for(
        &self,
        what: &str,
        limit: Duration,
        mut f: impl FnMut(&TestRouter) -> bool,
    ) {
        let start = Instant::now();
        while !f(self) {
            assert!(start.elapsed() < limit, "timed out waiting for: {what}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    pub async fn wait_idle(&self) {
        self.wait_for("every gauge back to 0", Duration::from_secs(20), |r| {
            r.totals() == (0, 0)
        })
        .await;
    }

    pub async fn metrics_text(&self) -> String {
        reqwest::get(self.metrics_url())
            .await
            .expect("metrics")
            .text()
            .await
            .expect("metrics text")
    }
}

impl Drop for TestRouter {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.try_send(ShutdownSignal::FastShutdown);
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Start a router from YAML. `{listen}` and `{metrics}` are replaced with free loopback addresses; the
/// server section is added (fast shutdown, temp pid/socket files) unless present.
pub async fn start_router(yaml: &str) -> TestRouter {
    let listen: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let metrics: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let mut text = yaml
        .replace("{listen}", &listen.to_string())
        .replace("{metrics}", &metrics.to_string());
    if !text.contains("\nserver:") && !text.starts_with("server:") {
        let tag = listen.port();
        text.push_str(&format!(
            "\nserver:\n  threads: 2\n  grace_period_seconds: 0\n  graceful_shutdown_timeout_seconds: 1\n  \
             pid_file: /tmp/infergate-test-{tag}.pid\n  upgrade_sock: /tmp/infergate-test-{tag}.sock\n"
        ));
    }
    let cfg = Config::parse(Path::new("test.yaml"), &text)
        .unwrap_or_else(|e| panic!("test config: {e}\n{text}"));
    let (server, state) = build_server(cfg, Opt::default()).expect("server builds");
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    let thread = std::thread::spawn(move || run_with_channel(server, rx));
    let router = TestRouter {
        addr: listen,
        metrics_addr: metrics,
        state,
        stop: Some(tx),
        thread: Some(thread),
    };
    wait_listening(router.addr).await;
    router
}

/// Poll until something accepts on `addr`.
pub async fn wait_listening(addr: SocketAddr) {
    let start = Instant::now();
    while tokio::net::TcpStream::connect(addr).await.is_err() {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "nothing listens on {addr}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A pool YAML over the given engine URLs.
pub fn pool_yaml(policy: &str, urls: &[String], extra: &str) -> String {
    let eps: String = urls
        .iter()
        .map(|u| format!("      - url: \"{u}\"\n"))
        .collect();
    format!(
        "listen: \"{{listen}}\"\nmetrics_listen: \"{{metrics}}\"\n\
         timeouts: {{ connect: 1s, response_header: 30s, stream_idle: 30s }}\n\
         pools:\n  - name: default\n    models: [\"*\"]\n    policy: {policy}\n    endpoints:\n{eps}\
         \x20   health_check: {{ path: /health, interval: 200ms, timeout: 500ms, healthy_after: 1, unhealthy_after: 1 }}\n{extra}"
    )
}

/// A chat body of about `bytes` bytes (one user message), streaming or not.
pub fn chat_body(bytes: usize, stream: bool, max_tokens: u32) -> String {
    let filler = "lorem ipsum dolor sit amet ".repeat(bytes / 27 + 1);
    let content = &filler[..bytes.min(filler.len())];
    serde_json::json!({
        "model": "sim-model",
        "stream": stream,
        "max_tokens": max_tokens,
        "messages": [{"role": "user", "content": content}],
    })
    .to_string()
}

/// A metric's value from the text exposition: the sample whose name matches and whose labels include all of
/// `labels` (`k="v"` fragments). None when absent.
pub fn metric_value(text: &str, name: &str, labels: &[&str]) -> Option<f64> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.split(['{', ' ']).next() == Some(name))
        .find(|l| labels.iter().all(|f| l.contains(f)))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}

/// Sum of every sample of `name` matching `labels`.
pub fn metric_sum(text: &str, name: &str, labels: &[&str]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.split(['{', ' ']).next() == Some(name))
        .filter(|l| labels.iter().all(|f| l.contains(f)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

pub fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .pool_max_idle_per_host(64)
        .build()
        .expect("client")
}
