//! The HTTP scrape loop: fetch each endpoint's `/metrics` every interval, parse it, log changes of condition.

use std::sync::Arc;
use std::time::Duration;

use super::{parse, required_names, ParseError, ScrapeOutcome, SideClient, SideError, StatsState};
use crate::config::{EngineKind, EngineStatsConfig};

/// Where scrape outcomes go (typically `move |o| endpoint.stats.record_outcome(Instant::now(), &o)`).
pub type OutcomeSink = Arc<dyn Fn(ScrapeOutcome) + Send + Sync>;

/// One endpoint to scrape. Independent of `crate::pool` (which depends on this module).
#[derive(Clone)]
pub struct ScrapeTarget {
    pub pool: String,
    /// The endpoint label ("host:port"), for logs.
    pub endpoint: String,
    /// Plain, or TLS as the pool's `tls` says; it GETs `cfg.path`.
    pub client: SideClient,
    /// Sent as `Authorization: Bearer …`; never logged.
    pub api_key: Option<String>,
    pub cfg: EngineStatsConfig,
    pub cell: OutcomeSink,
    /// Called as each scrape is sent (the proxy starts tracking its own requests in flight, see `cell`).
    pub on_send: Arc<dyn Fn() + Send + Sync>,
}

impl std::fmt::Debug for ScrapeTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScrapeTarget")
            .field("pool", &self.pool)
            .field("endpoint", &self.endpoint)
            .field("url", &self.url())
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("cfg", &self.cfg)
            .finish()
    }
}

impl ScrapeTarget {
    /// What is scraped, as logs show it.
    pub fn url(&self) -> String {
        self.client.url(&self.cfg.path)
    }
}

/// Largest metrics body accepted (a vLLM dump is tens of KiB).
pub const MAX_METRICS_BYTES: usize = 16 << 20;

/// Scrape once: GET `path` (bearer key if any, whole-request timeout) and parse the body.
pub async fn scrape_once(
    client: &SideClient,
    path: &str,
    api_key: Option<&str>,
    timeout: Duration,
    kind: EngineKind,
    prefix: &str,
) -> ScrapeOutcome {
    const ACCEPT: &str = "text/plain;version=0.0.4;q=1,*/*;q=0.1";
    let body = match client
        .get(path, ACCEPT, api_key, timeout, MAX_METRICS_BYTES)
        .await
    {
        Ok((status, body)) if (200..300).contains(&status) => body,
        Ok((status, _)) => {
            let hint = if matches!(status, 401 | 403) {
                " (check the endpoint's api key)"
            } else {
                ""
            };
            return ScrapeOutcome::Down(format!("HTTP {status}{hint}"));
        }
        Err(SideError::TooLarge(n)) => {
            return ScrapeOutcome::Down(format!("metrics body larger than {n} bytes"))
        }
        Err(e) => return ScrapeOutcome::Down(e.to_string()),
    };
    match parse(&String::from_utf8_lossy(&body), kind, prefix) {
        Ok(load) => ScrapeOutcome::Good(load),
        Err(ParseError::Missing { close }) => ScrapeOutcome::Missing { close },
        Err(e @ ParseError::Garbage(_)) => ScrapeOutcome::Down(e.to_string()),
    }
}

/// What the log gate says about a new outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LogNote {
    /// Newly missing metrics (one warning until it recovers).
    Missing,
    /// Newly down (one warning until it recovers).
    Down,
    /// Good again after Missing/Down.
    Recovered,
}

/// Debounces scrape logs: one line per change of condition, not one per interval.
#[derive(Debug, Default)]
struct LogGate {
    broken: Option<StatsState>,
}

impl LogGate {
    fn observe(&mut self, outcome: &ScrapeOutcome) -> Option<LogNote> {
        let now = match outcome {
            ScrapeOutcome::Good(_) => None,
            other => Some(other.state()),
        };
        let prev = std::mem::replace(&mut self.broken, now);
        match (prev, now) {
            (a, b) if a == b => None,
            (Some(_), None) => Some(LogNote::Recovered),
            (_, Some(StatsState::Missing)) => Some(LogNote::Missing),
            (_, Some(_)) => Some(LogNote::Down),
            (None, None) => None,
        }
    }
}

/// Scrape `target` every `cfg.interval` (timeout = interval) until `stop` becomes true or its sender is dropped,
/// passing each outcome to `target.cell`. Logs once per change of condition: a Missing endpoint warns once,
/// naming the wanted and the similarly named metrics it found, and again only after it recovered and broke again.
pub async fn scrape_loop(target: ScrapeTarget, mut stop: tokio::sync::watch::Receiver<bool>) {
    let interval = target.cfg.interval.max(Duration::from_millis(10));
    let client = &target.client;
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut gate = LogGate::default();
    loop {
        if *stop.borrow_and_update() {
            return;
        }
        tokio::select! {
            _ = ticker.tick() => {}
            r = stop.changed() => { if r.is_err() { return; } continue; }
        }
        (target.on_send)();
        let scrape = scrape_once(
            client,
            &target.cfg.path,
            target.api_key.as_deref(),
            interval,
            target.cfg.kind,
            &target.cfg.metric_prefix,
        );
        let outcome = tokio::select! {
            o = scrape => o,
            r = stop.changed() => { if r.is_err() { return; } continue; }
        };
        if let Some(note) = gate.observe(&outcome) {
            log_note(&target, note, &outcome);
        }
        (target.cell)(outcome);
    }
}

fn log_note(t: &ScrapeTarget, note: LogNote, outcome: &ScrapeOutcome) {
    let who = format!("pool {} endpoint {}", t.pool, t.endpoint);
    match (note, outcome) {
        (LogNote::Missing, ScrapeOutcome::Missing { close }) => {
            let wanted = required_names(t.cfg.kind, &t.cfg.metric_prefix).join(", ");
            let found = if close.is_empty() {
                "none with a similar name".to_string()
            } else {
                format!("similarly named: {}", close.join(", "))
            };
            log::warn!(
                "{who}: engine stats missing from {}: wanted {wanted} (kind {}, metric_prefix \"{}\"); found {found}. \
                 Placement uses infergate's own in-flight counts for this endpoint until they appear",
                t.url(),
                t.cfg.kind.as_str(),
                t.cfg.metric_prefix,
            );
        }
        (LogNote::Down, ScrapeOutcome::Down(why)) => {
            log::warn!("{who}: engine stats scrape of {} failed: {why}", t.url());
        }
        (LogNote::Recovered, _) => log::info!("{who}: engine stats available again"),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine_stats::fixtures::{VLLM_V0, VLLM_V1};
    use crate::placement::EngineLoad;

    #[test]
    fn log_gate_warns_once_per_breakage() {
        let good = ScrapeOutcome::Good(EngineLoad::default());
        let missing = ScrapeOutcome::Missing { close: vec![] };
        let down = ScrapeOutcome::Down("x".into());
        let mut g = LogGate::default();
        let notes: Vec<_> = [
            &good, &missing, &missing, &missing, &good, &good, &missing, &down, &down, &good,
        ]
        .iter()
        .map(|o| g.observe(o))
        .collect();
        assert_eq!(
            notes,
            vec![
                None,
                Some(LogNote::Missing),
                None,
                None,
                Some(LogNote::Recovered),
                None,
                Some(LogNote::Missing),
                Some(LogNote::Down),
                None,
                Some(LogNote::Recovered),
            ]
        );
    }

    // --- scraping against a loopback HTTP server ---

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::sync::mpsc;

    /// Serve `status` + `body` to every connection; send each request head to `heads`.
    async fn serve(
        status: &'static str,
        body: String,
    ) -> (SideClient, mpsc::UnboundedReceiver<String>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            loop {
                let Ok((mut sock, _)) = listener.accept().await else {
                    return;
                };
                let tx = tx.clone();
                let body = body.clone();
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut buf = [0u8; 1024];
                    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                        match sock.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => head.extend_from_slice(&buf[..n]),
                        }
                    }
                    let _ = tx.send(String::from_utf8_lossy(&head).into_owned());
                    let resp = format!(
                        "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\n\
                         Connection: close\r\n\r\n{body}",
                        body.len()
                    );
                    let _ = sock.write_all(resp.as_bytes()).await;
                    let _ = sock.shutdown().await;
                });
            }
        });
        (
            SideClient::plain(&addr.to_string(), Duration::from_secs(2)),
            rx,
        )
    }

    fn target(
        client: SideClient,
        key: Option<&str>,
        prefix: &str,
    ) -> (ScrapeTarget, mpsc::UnboundedReceiver<ScrapeOutcome>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let t = ScrapeTarget {
            pool: "p".into(),
            endpoint: "e:1".into(),
            client,
            api_key: key.map(str::to_string),
            cfg: EngineStatsConfig {
                kind: EngineKind::Vllm,
                path: "/metrics".into(),
                interval: Duration::from_millis(50),
                metric_prefix: prefix.into(),
            },
            cell: Arc::new(move |o| {
                let _ = tx.send(o);
            }),
            on_send: Arc::new(|| {}),
        };
        (t, rx)
    }

    async fn next<T>(rx: &mut mpsc::UnboundedReceiver<T>) -> T {
        tokio::time::timeout(Duration::from_secs(5), rx.recv())
            .await
            .expect("in time")
            .expect("open")
    }

    #[tokio::test]
    async fn scrape_loop_reads_a_live_endpoint_with_the_key_and_stops() {
        let (client, mut heads) = serve("200 OK", VLLM_V1.to_string()).await;
        let (t, mut outcomes) = target(client, Some("s3cret"), "vllm:");
        assert!(!format!("{t:?}").contains("s3cret"));
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(scrape_loop(t, stop_rx));
        match next(&mut outcomes).await {
            ScrapeOutcome::Good(l) => assert_eq!((l.running, l.waiting), (5, 4)),
            other => panic!("{other:?}"),
        }
        let head = next(&mut heads).await.to_ascii_lowercase();
        assert!(head.starts_with("get /metrics http/1.1\r\n"), "{head}");
        assert!(head.contains("authorization: bearer s3cret\r\n"), "{head}");
        // Keeps scraping every interval.
        assert!(matches!(next(&mut outcomes).await, ScrapeOutcome::Good(_)));
        stop_tx.send(true).unwrap();
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .expect("stops promptly")
            .unwrap();
    }

    #[tokio::test]
    async fn scrape_reports_missing_down_and_http_errors() {
        let t = Duration::from_secs(2);
        let m = "/metrics";
        let (c, _h) = serve("200 OK", VLLM_V1.replace("vllm:", "vllm_")).await;
        match scrape_once(&c, m, None, t, EngineKind::Vllm, "vllm:").await {
            ScrapeOutcome::Missing { close } => {
                assert!(close.contains(&"vllm_num_requests_running".to_string()))
            }
            other => panic!("{other:?}"),
        }
        let (c, _h) = serve("401 Unauthorized", String::new()).await;
        match scrape_once(&c, m, Some("k3y"), t, EngineKind::Vllm, "vllm:").await {
            ScrapeOutcome::Down(why) => {
                assert!(why.contains("401") && !why.contains("k3y"), "{why}")
            }
            other => panic!("{other:?}"),
        }
        let (c, _h) = serve("200 OK", "<html>oops</html>".into()).await;
        assert!(matches!(
            scrape_once(&c, m, None, t, EngineKind::Vllm, "vllm:").await,
            ScrapeOutcome::Down(_)
        ));
        let (c, _h) = serve("200 OK", "x".repeat(MAX_METRICS_BYTES + 1)).await;
        match scrape_once(&c, m, None, t, EngineKind::Vllm, "vllm:").await {
            ScrapeOutcome::Down(why) => {
                assert!(why.starts_with("metrics body larger than"), "{why}")
            }
            other => panic!("{other:?}"),
        }
        // Nothing listening.
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let c = SideClient::plain(&l.local_addr().unwrap().to_string(), Duration::from_secs(2));
        drop(l);
        match scrape_once(&c, m, Some("k3y"), t, EngineKind::Vllm, "vllm:").await {
            ScrapeOutcome::Down(why) => {
                assert!(
                    why.starts_with("connect failed: ") && !why.contains("k3y"),
                    "{why}"
                )
            }
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test]
    async fn scrape_times_out_after_the_interval() {
        // Accepts and never answers.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let c = SideClient::plain(
            &listener.local_addr().unwrap().to_string(),
            Duration::from_secs(2),
        );
        let hold = tokio::spawn(async move {
            let mut socks = Vec::new();
            while let Ok((s, _)) = listener.accept().await {
                socks.push(s);
            }
        });
        let start = std::time::Instant::now();
        let o = scrape_once(
            &c,
            "/metrics",
            None,
            Duration::from_millis(200),
            EngineKind::Vllm,
            "vllm:",
        )
        .await;
        assert!(
            matches!(&o, ScrapeOutcome::Down(why) if why.contains("timed out")),
            "{o:?}"
        );
        assert!(start.elapsed() < Duration::from_secs(3));
        hold.abort();
    }

    #[tokio::test]
    async fn dropped_stop_sender_ends_the_loop() {
        let (client, _h) = serve("200 OK", VLLM_V0.to_string()).await;
        let (t, mut outcomes) = target(client, None, "vllm:");
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(scrape_loop(t, stop_rx));
        assert!(matches!(next(&mut outcomes).await, ScrapeOutcome::Good(_)));
        drop(stop_tx);
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .expect("stops")
            .unwrap();
    }
}
