//! The router's `/metrics` in the Prometheus text exposition, and the samples in it.

use std::time::Duration;

use super::requests::client;
use super::router::TestRouter;

impl TestRouter {
    pub fn metrics_url(&self) -> String {
        format!("http://{}/metrics", self.metrics_addr)
    }

    /// One scrape of `/metrics`.
    pub async fn metrics_text(&self) -> String {
        reqwest::get(self.metrics_url())
            .await
            .expect("metrics")
            .text()
            .await
            .expect("metrics text")
    }

    /// Scrape until `counted(text)` holds, at most 100 times 20 ms apart, and return the last scrape (which the
    /// caller asserts on). For counters of an answer just received: Pingora writes the answer before its
    /// logging hook counts it.
    pub async fn metrics_when(&self, counted: impl Fn(&str) -> bool) -> String {
        let mut m = String::new();
        for _ in 0..100 {
            m = self.metrics_text().await;
            if counted(&m) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        m
    }

    /// One scrape, summed over the samples of `name` matching `labels` (see `metric_sum`).
    pub async fn metric_sum(&self, name: &str, labels: &[&str]) -> f64 {
        metric_sum(&self.metrics_text().await, name, labels)
    }
}

/// A scrape of `url` (a `/metrics` URL); None while nothing answers there.
pub async fn try_metrics(url: &str) -> Option<String> {
    reqwest::get(url).await.ok()?.text().await.ok()
}

/// Scrape the `/metrics` of a router on loopback port `port` (a router binary started by the test) until `f(text)`
/// holds, every 50 ms; panics naming `what` after 20 s.
pub async fn wait_metrics(port: u16, what: &str, f: impl Fn(&str) -> bool) {
    let start = std::time::Instant::now();
    loop {
        if let Some(m) = try_metrics(&format!("http://127.0.0.1:{port}/metrics")).await {
            if f(&m) {
                return;
            }
        }
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Wait until the client port `listen` of a router binary answers `/health` with 200, every 50 ms; panics after
/// `within`. The metrics port can be up first: it does not wait for the first health checks, the client port does.
pub async fn wait_serving(listen: u16, within: Duration) {
    let start = std::time::Instant::now();
    loop {
        let status = client()
            .get(format!("http://127.0.0.1:{listen}/health"))
            .timeout(Duration::from_secs(2))
            .send()
            .await
            .map(|r| r.status().as_u16());
        if status.ok() == Some(200) {
            return;
        }
        assert!(
            start.elapsed() < within,
            "the client port {listen} did not answer /health with 200 within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
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

/// `pool`'s requests sent again and engine-owned failures in `text`: (`infergate_retries_total`,
/// `infergate_endpoint_failures_total`), summed over its endpoints.
pub fn retries_and_failures(text: &str, pool: &str) -> (f64, f64) {
    let label = format!("pool=\"{pool}\"");
    (
        metric_sum(text, "infergate_retries_total", &[&label]),
        metric_sum(text, "infergate_endpoint_failures_total", &[&label]),
    )
}

/// Every endpoint's exported load gauges (prefill tokens, requests in flight) sum to zero.
#[track_caller]
pub fn assert_load_gauges_at_zero(text: &str) {
    assert_eq!(
        metric_sum(text, "infergate_endpoint_prefill_tokens", &[]),
        0.0
    );
    assert_eq!(
        metric_sum(text, "infergate_endpoint_requests_in_flight", &[]),
        0.0
    );
}
