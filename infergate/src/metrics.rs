//! Every Prometheus series infergate exports and its lifecycle: created with an endpoint, deleted when it leaves.
//!
//! Gauges of live state (requests and prefill tokens in flight, health, engine-stats state) are read from the
//! pools at scrape time by a collector, so the request path only touches atomics and a removed endpoint's gauges
//! vanish with it. Counters live in vectors whose series are removed when an endpoint departs.

use std::collections::HashMap;
use std::sync::{Arc, Weak};

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry, TextEncoder,
};

/// One endpoint's live values for the scrape-time collector.
#[derive(Debug, Clone)]
pub struct EndpointSample {
    pub pool: String,
    pub endpoint: String,
    pub requests_in_flight: u64,
    pub prefill_tokens: u64,
    pub healthy: bool,
    /// Ejected by outlier detection.
    pub ejected: bool,
    /// Engine stats state name (fresh, stale, missing, down, off).
    pub stats_state: &'static str,
}

/// Live state the collector reads at scrape time.
pub trait LiveSource: Send + Sync {
    fn endpoint_samples(&self) -> Vec<EndpointSample>;
    /// (pool, sessions bound)
    fn session_counts(&self) -> Vec<(String, u64)>;
}

/// All engine-stats states, so every endpoint exports one series per state (1 for its current state).
pub const STATS_STATES: [&str; 5] = ["fresh", "stale", "missing", "down", "off"];

pub struct Metrics {
    registry: Registry,
    pub prefill_tokens_estimated_total: IntCounterVec,
    pub placements_total: IntCounterVec,
    pub requests_total: IntCounterVec,
    pub time_to_first_byte: HistogramVec,
    pub janitor_released_total: IntCounterVec,
    pub retries_total: IntCounterVec,
    pub ejections_total: IntCounterVec,
    pub session_evictions_total: IntCounterVec,
    pub router_responses_total: IntCounterVec,
    pub config_info: IntGauge,
    /// Client keys and the pools' wait queues (`admission`).
    pub client_requests_total: IntCounterVec,
    pub client_rate_limited_total: IntCounterVec,
    pub queue_length: IntGaugeVec,
    pub queue_wait_seconds: HistogramVec,
    pub queue_rejected_total: IntCounterVec,
}

fn counter(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let c = IntCounterVec::new(Opts::new(name, help), labels).expect("static metric definition");
    registry
        .register(Box::new(c.clone()))
        .expect("unique metric name");
    c
}

impl Metrics {
    /// A fresh registry with every infergate series. Called once per router at start (not on a request path).
    pub fn new() -> Arc<Metrics> {
        let registry = Registry::new();
        let ttfb = HistogramVec::new(
            HistogramOpts::new(
                "infergate_time_to_first_byte_seconds",
                "Time from dispatch to the first response body byte (covers the engine's prefill).",
            )
            .buckets(vec![
                0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0,
                128.0,
            ]),
            &["pool"],
        )
        .expect("static metric definition");
        registry
            .register(Box::new(ttfb.clone()))
            .expect("unique metric name");
        let config_info = IntGauge::new("infergate_up", "1 while the router runs.")
            .expect("static metric definition");
        config_info.set(1);
        registry
            .register(Box::new(config_info.clone()))
            .expect("unique metric name");
        Arc::new(Metrics {
            prefill_tokens_estimated_total: counter(
                &registry,
                "infergate_prefill_tokens_estimated_total",
                "Estimated uncached prompt tokens dispatched and served, per endpoint \
                 (compare with vllm:prompt_tokens_by_source_total{source=\"local_compute\"}).",
                &["pool", "endpoint"],
            ),
            placements_total: counter(
                &registry,
                "infergate_placements_total",
                "Placement decisions by reason.",
                &["pool", "endpoint", "reason"],
            ),
            requests_total: counter(
                &registry,
                "infergate_requests_total",
                "Proxied requests by endpoint and final status code (0 = no response, e.g. client gone).",
                &["pool", "endpoint", "code"],
            ),
            time_to_first_byte: ttfb,
            janitor_released_total: counter(
                &registry,
                "infergate_prefill_janitor_released_total",
                "Prefill holds released by the janitor because they outlived response_header + stream_idle.",
                &["pool", "endpoint"],
            ),
            retries_total: counter(
                &registry,
                "infergate_retries_total",
                "Requests retried on another endpoint after a failed connect or a stale connection, by the endpoint that failed.",
                &["pool", "endpoint"],
            ),
            ejections_total: counter(
                &registry,
                "infergate_endpoint_ejections_total",
                "Endpoints ejected by outlier detection (consecutive 5xx answers or refused connects).",
                &["pool", "endpoint"],
            ),
            session_evictions_total: counter(
                &registry,
                "infergate_session_evictions_total",
                "Session bindings evicted, by cause (ttl, capacity).",
                &["pool", "cause"],
            ),
            router_responses_total: counter(
                &registry,
                "infergate_router_responses_total",
                "Responses the router answered itself (errors, /health, /v1/models), by status code.",
                &["code"],
            ),
            config_info,
            client_requests_total: counter(
                &registry,
                "infergate_client_requests_total",
                "Requests by client key name (\"-\": auth off or no valid key) and final status code (0 = no response).",
                &["key", "code"],
            ),
            client_rate_limited_total: counter(
                &registry,
                "infergate_client_rate_limited_total",
                "Requests refused with 429 by a client key's limit, by key name and limit.",
                &["key", "limit"],
            ),
            queue_length: registered(
                &registry,
                IntGaugeVec::new(
                    Opts::new("infergate_queue_length", "Requests waiting in the pool's wait queue."),
                    &["pool"],
                ),
            ),
            queue_wait_seconds: registered(
                &registry,
                HistogramVec::new(
                    HistogramOpts::new(
                        "infergate_queue_wait_seconds",
                        "Time requests waited for room (every endpoint at max_in_flight_per_endpoint) in the pool's wait queue, until placed or timed out.",
                    )
                    .buckets(vec![
                        0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0,
                    ]),
                    &["pool"],
                ),
            ),
            queue_rejected_total: counter(
                &registry,
                "infergate_queue_rejected_total",
                "Requests answered 503 by the pool's wait queue, by reason (full, timeout).",
                &["pool", "reason"],
            ),
            registry,
        })
    }

    /// Register a series defined by another module (e.g. `crate::clients`) in this router's registry.
    pub fn register(&self, collector: Box<dyn Collector>) {
        if let Err(e) = self.registry.register(collector) {
            log::error!("cannot register a metric: {e}");
        }
    }

    /// Delete every series of a client key that left the keys file.
    pub fn remove_client(&self, key: &str) {
        for vec in [&self.client_requests_total, &self.client_rate_limited_total] {
            remove_series_where(vec, "key", key);
        }
    }

    /// Register the scrape-time collector for live gauges. Holds the source weakly: a dropped router exports none.
    pub fn register_live(&self, source: Weak<dyn LiveSource>) {
        let collector = LiveCollector::new(source);
        if let Err(e) = self.registry.register(Box::new(collector)) {
            log::error!("cannot register live gauges: {e}");
        }
    }

    /// Delete every counter series of an endpoint that left its pool.
    pub fn remove_endpoint(&self, pool: &str, endpoint: &str) {
        for vec in [
            &self.prefill_tokens_estimated_total,
            &self.placements_total,
            &self.requests_total,
            &self.janitor_released_total,
            &self.retries_total,
            &self.ejections_total,
        ] {
            remove_series_of(vec, pool, endpoint);
        }
    }

    /// The text exposition of every series.
    pub fn render(&self) -> Vec<u8> {
        let mut buf = Vec::with_capacity(16 * 1024);
        if let Err(e) = TextEncoder::new().encode(&self.registry.gather(), &mut buf) {
            log::error!("cannot encode metrics: {e}");
        }
        buf
    }

    /// Export a session table's evictions since the last call (`SessionTable::take_evictions`).
    pub fn count_session_evictions(&self, pool: &str, (ttl, capacity): (u64, u64)) {
        for (cause, n) in [("ttl", ttl), ("capacity", capacity)] {
            if n > 0 {
                self.session_evictions_total
                    .with_label_values(&[pool, cause])
                    .inc_by(n);
            }
        }
    }

    pub fn ttfb(&self, pool: &str) -> Histogram {
        self.time_to_first_byte.with_label_values(&[pool])
    }
}

/// Register a metric built from a static definition.
fn registered<M: Collector + Clone + 'static>(registry: &Registry, m: prometheus::Result<M>) -> M {
    let m = m.expect("static metric definition");
    registry
        .register(Box::new(m.clone()))
        .expect("unique metric name");
    m
}

/// Remove every series of `vec` whose label `name` is `value`.
fn remove_series_where(vec: &IntCounterVec, name: &str, value: &str) {
    for family in vec.collect() {
        for m in family.get_metric() {
            let labels: HashMap<&str, &str> = m
                .get_label()
                .iter()
                .map(|l| (l.name(), l.value()))
                .collect();
            if labels.get(name) == Some(&value) {
                let _ = vec.remove(&labels);
            }
        }
    }
}

/// Remove every series of `vec` whose `pool` and `endpoint` labels match, whatever its other labels.
fn remove_series_of(vec: &IntCounterVec, pool: &str, endpoint: &str) {
    for family in vec.collect() {
        for m in family.get_metric() {
            let labels: HashMap<&str, &str> = m
                .get_label()
                .iter()
                .map(|l| (l.name(), l.value()))
                .collect();
            if labels.get("pool") == Some(&pool) && labels.get("endpoint") == Some(&endpoint) {
                let _ = vec.remove(&labels);
            }
        }
    }
}

struct LiveCollector {
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
}

impl LiveCollector {
    fn new(source: Weak<dyn LiveSource>) -> Self {
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
        let sessions = gauge("infergate_sessions", "Session bindings held.", &["pool"]);
        let descs = [
            &prefill,
            &requests,
            &healthy,
            &ejected,
            &stats_state,
            &sessions,
        ]
        .iter()
        .flat_map(|g| g.desc().into_iter().cloned())
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
        ] {
            g.reset();
        }
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
                self.ejected.with_label_values(&l).set(i64::from(s.ejected));
                for state in STATS_STATES {
                    self.stats_state
                        .with_label_values(&[l[0], l[1], state])
                        .set(i64::from(state == s.stats_state));
                }
            }
            for (pool, n) in src.session_counts() {
                self.sessions
                    .with_label_values(&[pool.as_str()])
                    .set(n as i64);
            }
        }
        [
            &self.prefill,
            &self.requests,
            &self.healthy,
            &self.ejected,
            &self.stats_state,
            &self.sessions,
        ]
        .iter()
        .flat_map(|g| g.collect())
        .collect()
    }
}
