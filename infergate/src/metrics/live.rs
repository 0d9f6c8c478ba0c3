//! The scrape-time collector: live gauges (requests and prefill tokens in flight, health, engine-stats state,
//! learned speeds, sessions) read from the pools when Prometheus scrapes, so the request path only touches atomics
//! and a removed endpoint's gauges vanish with it.

use std::sync::Weak;

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{GaugeVec, IntCounterVec, IntGaugeVec, Opts};

/// What an endpoint's health tracker reports.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HealthCounts {
    pub failed_checks: u64,
    pub became_healthy: u64,
    pub became_unhealthy: u64,
}

/// One endpoint's live values for the scrape-time collector.
#[derive(Debug, Clone)]
pub struct EndpointSample {
    pub pool: String,
    pub endpoint: String,
    pub requests_in_flight: u64,
    pub prefill_tokens: u64,
    pub healthy: bool,
    pub health_counts: HealthCounts,
    /// Ejected by outlier detection.
    pub ejected: bool,
    /// Engine stats state name (fresh, stale, missing, down, off).
    pub stats_state: &'static str,
    /// Learned prefill speed in estimated tokens per second; 0 until learned.
    pub prefill_tokens_per_sec: f64,
    /// The time-to-first-byte line `predicted_ttft` predicts with; None until learned.
    pub ttft_line: Option<crate::placement::throughput::Fitted>,
    /// Requests the engine reports beyond ours and our cluster peers' (load placed elsewhere); None without
    /// fresh engine stats.
    pub foreign_requests: Option<u64>,
}

/// One pool's live values for the scrape-time collector.
#[derive(Debug, Clone)]
pub struct PoolSample {
    pub pool: String,
    /// Session bindings held (0 without sessions).
    pub sessions: u64,
    /// Every endpoint fails its health check and the pool places across those whose engine answers it.
    pub health_panic: bool,
}

/// Live state the collector reads at scrape time.
pub trait LiveSource: Send + Sync {
    fn endpoint_samples(&self) -> Vec<EndpointSample>;
    fn pool_samples(&self) -> Vec<PoolSample>;
}

/// All engine-stats states, so every endpoint exports one series per state (1 for its current state).
pub const STATS_STATES: [&str; 5] = ["fresh", "stale", "missing", "down", "off"];

pub(super) struct LiveCollector {
    /// Scrapes may run concurrently; the vectors are reset and refilled per scrape.
    lock: parking_lot::Mutex<()>,
    source: Weak<dyn LiveSource>,
    descs: Vec<Desc>,
    prefill: IntGaugeVec,
    requests: IntGaugeVec,
    healthy: IntGaugeVec,
    ejected: IntGaugeVec,
    stats_state: IntGaugeVec,
    sessions: IntGaugeVec,
    health_panic: IntGaugeVec,
    prefill_speed: GaugeVec,
    ttft_overhead: GaugeVec,
    ttft_throughput: GaugeVec,
    foreign: IntGaugeVec,
    failed_checks: IntCounterVec,
    health_changes: IntCounterVec,
}

impl LiveCollector {
    pub(super) fn new(source: Weak<dyn LiveSource>) -> Self {
        let gauge = |name: &str, help: &str, labels: &[&str]| {
            IntGaugeVec::new(Opts::new(name, help), labels).expect("static metric definition")
        };
        let prefill = gauge(
            "infergate_endpoint_prefill_tokens",
            "Estimated prefill tokens in flight (dispatched, first response byte not yet seen).",
            &["pool", "endpoint"],
        );
        let requests = gauge(
            "infergate_endpoint_requests_in_flight",
            "Requests in flight through this router.",
            &["pool", "endpoint"],
        );
        let healthy = gauge(
            "infergate_endpoint_healthy",
            "1 if the endpoint passes health checks, 0 if failing or not yet checked.",
            &["pool", "endpoint"],
        );
        let ejected = gauge(
            "infergate_endpoint_ejected",
            "1 while outlier detection keeps the endpoint out of placement.",
            &["pool", "endpoint"],
        );
        let stats_state = gauge(
            "infergate_engine_stats_state",
            "1 for the endpoint's current engine-stats state (fresh, stale, missing, down, off).",
            &["pool", "endpoint", "state"],
        );
        let foreign = gauge(
            "infergate_endpoint_foreign_requests",
            "Requests the engine reports beyond this router's and its cluster peers' (load placed elsewhere), as of the last fresh engine-stats sample; absent without fresh stats.",
            &["pool", "endpoint"],
        );
        let sessions = gauge(
            "infergate_sessions",
            "Session bindings held (0 for a pool without sessions).",
            &["pool"],
        );
        let health_panic = gauge(
            "infergate_pool_health_panic",
            "1 while every endpoint of the pool fails its health check and the pool places across those whose engine answers it (health_check.route_when_all_unhealthy).",
            &["pool"],
        );
        let prefill_speed = GaugeVec::new(
            Opts::new(
                "infergate_endpoint_prefill_tokens_per_second",
                "Learned prefill speed (inverse slope of time to first byte over estimated tokens of streaming requests); 0 until learned.",
            ),
            &["pool", "endpoint"],
        )
        .expect("static metric definition");
        let ttft_overhead = GaugeVec::new(
            Opts::new(
                "infergate_endpoint_ttft_overhead_seconds",
                "predicted_ttft's learned time to first byte before any prefill progresses (the line's intercept); absent until learned.",
            ),
            &["pool", "endpoint"],
        )
        .expect("static metric definition");
        let ttft_throughput = GaugeVec::new(
            Opts::new(
                "infergate_endpoint_ttft_throughput_tokens_per_second",
                "predicted_ttft's learned prefill throughput, queue included (estimated tokens per second, the line's inverse slope); absent until learned.",
            ),
            &["pool", "endpoint"],
        )
        .expect("static metric definition");
        // Counters kept by each endpoint's health tracker, read at scrape time like the gauges: a flapping
        // endpoint shows between two scrapes of `infergate_endpoint_healthy`.
        let failed_checks = IntCounterVec::new(
            Opts::new(
                "infergate_endpoint_health_check_failures_total",
                "Health checks the endpoint failed (an error status, a refused connect or a timeout).",
            ),
            &["pool", "endpoint"],
        )
        .expect("static metric definition");
        let health_changes = IntCounterVec::new(
            Opts::new(
                "infergate_endpoint_health_changes_total",
                "Changes of the endpoint's health state, by the state entered (healthy, unhealthy); the first result after the start counts.",
            ),
            &["pool", "endpoint", "to"],
        )
        .expect("static metric definition");
        let descs = [
            &prefill,
            &requests,
            &healthy,
            &ejected,
            &stats_state,
            &sessions,
            &health_panic,
            &foreign,
        ]
        .iter()
        .flat_map(|g| g.desc().into_iter().cloned())
        .chain(
            [&prefill_speed, &ttft_overhead, &ttft_throughput]
                .into_iter()
                .flat_map(|g| g.desc().into_iter().cloned()),
        )
        .chain(
            [&failed_checks, &health_changes]
                .into_iter()
                .flat_map(|c| c.desc().into_iter().cloned()),
        )
        .collect();
        LiveCollector {
            lock: parking_lot::Mutex::new(()),
            source,
            descs,
            prefill,
            requests,
            healthy,
            ejected,
            stats_state,
            sessions,
            health_panic,
            prefill_speed,
            ttft_overhead,
            ttft_throughput,
            foreign,
            failed_checks,
            health_changes,
        }
    }
}

impl Collector for LiveCollector {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        let _guard = self.lock.lock();
        for g in [
            &self.prefill,
            &self.requests,
            &self.healthy,
            &self.ejected,
            &self.stats_state,
            &self.sessions,
            &self.health_panic,
            &self.foreign,
        ] {
            g.reset();
        }
        for g in [
            &self.prefill_speed,
            &self.ttft_overhead,
            &self.ttft_throughput,
        ] {
            g.reset();
        }
        self.failed_checks.reset();
        self.health_changes.reset();
        if let Some(src) = self.source.upgrade() {
            for s in src.endpoint_samples() {
                let l = [s.pool.as_str(), s.endpoint.as_str()];
                self.prefill
                    .with_label_values(&l)
                    .set(s.prefill_tokens as i64);
                self.requests
                    .with_label_values(&l)
                    .set(s.requests_in_flight as i64);
                self.healthy.with_label_values(&l).set(i64::from(s.healthy));
                let h = s.health_counts;
                self.failed_checks
                    .with_label_values(&l)
                    .inc_by(h.failed_checks);
                for (to, n) in [
                    ("healthy", h.became_healthy),
                    ("unhealthy", h.became_unhealthy),
                ] {
                    self.health_changes
                        .with_label_values(&[l[0], l[1], to])
                        .inc_by(n);
                }
                self.ejected.with_label_values(&l).set(i64::from(s.ejected));
                self.prefill_speed
                    .with_label_values(&l)
                    .set(s.prefill_tokens_per_sec);
                if let Some(line) = s.ttft_line {
                    self.ttft_overhead
                        .with_label_values(&l)
                        .set(line.overhead_seconds);
                    self.ttft_throughput
                        .with_label_values(&l)
                        .set(line.tokens_per_second);
                }
                if let Some(n) = s.foreign_requests {
                    self.foreign.with_label_values(&l).set(n as i64);
                }
                for state in STATS_STATES {
                    self.stats_state
                        .with_label_values(&[l[0], l[1], state])
                        .set(i64::from(state == s.stats_state));
                }
            }
            for p in src.pool_samples() {
                let l = [p.pool.as_str()];
                self.sessions.with_label_values(&l).set(p.sessions as i64);
                self.health_panic
                    .with_label_values(&l)
                    .set(i64::from(p.health_panic));
            }
        }
        [
            &self.prefill,
            &self.requests,
            &self.healthy,
            &self.ejected,
            &self.stats_state,
            &self.sessions,
            &self.health_panic,
            &self.foreign,
        ]
        .iter()
        .flat_map(|g| g.collect())
        .chain(
            [
                &self.prefill_speed,
                &self.ttft_overhead,
                &self.ttft_throughput,
            ]
            .into_iter()
            .flat_map(|g| g.collect()),
        )
        .chain(
            [&self.failed_checks, &self.health_changes]
                .into_iter()
                .flat_map(|c| c.collect()),
        )
        .collect()
    }
}
