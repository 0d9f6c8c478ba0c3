//! Every Prometheus series infergate exports and its lifecycle: created with an endpoint, deleted when it leaves.
//!
//! Gauges of live state (requests and prefill tokens in flight, health, engine-stats state) are read from the
//! pools at scrape time by a collector, so the request path only touches atomics and a removed endpoint's gauges
//! vanish with it. Counters and histograms live in vectors: their series are created at 0 when a pool or an
//! endpoint is added (`add_pool`, `add_endpoint`, so `rate()` sees the first event) and removed when an endpoint
//! departs (`remove_endpoint`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};

use std::time::{Duration, Instant};

use prometheus::core::{Collector, Desc, MetricVec, MetricVecBuilder};
use prometheus::proto::MetricFamily;
use prometheus::{
    Encoder, GaugeVec, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Opts,
    Registry, TextEncoder,
};

use crate::placement::Reason;

/// The crate version, `infergate_build_info{version}`.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
/// The commit the binary was built from (build.rs), `infergate_build_info{commit}`.
pub const COMMIT: &str = env!("INFERGATE_COMMIT");

/// `code` series of `infergate_requests_total` created with each endpoint: success, no response (client gone or
/// stream broken), the client's errors that matter, refusals and the engine's or the router's 5xx.
pub const REQUEST_CODES: [&str; 8] = ["200", "0", "400", "429", "500", "502", "503", "504"];

/// `code` series of `infergate_router_responses_total` created at start: `/health` and `/v1/models`, refused
/// requests (bad request, unknown path or model, body too large) and the router's own 5xx.
pub const ROUTER_CODES: [&str; 7] = ["200", "400", "404", "413", "502", "503", "504"];

/// Results of `infergate_config_reloads_total`: everything applied, some settings left for a restart or upgrade,
/// the file rejected.
pub const RELOAD_RESULTS: [&str; 3] = ["applied", "partial", "failed"];

/// Sources of `infergate_stored_response_lookups_total`: this router's record, the cluster's store, the engine that
/// answered it has the response, none (`unknown`).
pub const STORED_RESPONSE_SOURCES: [&str; 4] = ["local", "cluster", "engine", "unknown"];

/// Causes of `infergate_session_evictions_total`.
pub const EVICTION_CAUSES: [&str; 2] = ["ttl", "capacity"];

/// Buckets of the latency histograms (seconds): 5 ms to about two minutes, roughly doubling.
const LATENCY_BUCKETS: [f64; 15] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0,
];

/// Buckets of `infergate_ttft_prediction_error_seconds` (predicted minus measured, seconds): symmetric around 0,
/// 10 ms to 30 s either way.
const PREDICTION_ERROR_BUCKETS: [f64; 19] = [
    -30.0, -8.0, -4.0, -2.0, -1.0, -0.5, -0.25, -0.1, -0.01, 0.0, 0.01, 0.1, 0.25, 0.5, 1.0, 2.0,
    4.0, 8.0, 30.0,
];

/// What an endpoint's health tracker reports.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HealthCounts {
    pub failed_checks: u64,
    pub became_healthy: u64,
    pub became_unhealthy: u64,
}

/// The labels of one endpoint's series and the flag its pool sets when it leaves (its series are then deleted).
#[derive(Debug, Clone, Copy)]
pub struct EndpointSeries<'a> {
    pub pool: &'a str,
    pub endpoint: &'a str,
    pub removed: &'a AtomicBool,
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

pub struct Metrics {
    registry: Registry,
    /// Held shared while a series of one endpoint is written (after checking the endpoint is still a member)
    /// and exclusively while a departed endpoint's series are deleted: a write that passed the check cannot
    /// land after the deletion and bring the series back.
    endpoint_series: parking_lot::RwLock<()>,
    pub prefill_tokens_estimated_total: IntCounterVec,
    pub placements_total: IntCounterVec,
    pub requests_total: IntCounterVec,
    /// {pool, endpoint}: dispatch to the first response body byte of a successful answer.
    pub time_to_first_byte: HistogramVec,
    /// `predicted_ttft`'s predicted time to first byte minus the measured one.
    pub ttft_prediction_error: HistogramVec,
    /// {pool, endpoint}: request head read to response end, of every request sent to an endpoint.
    pub request_duration: HistogramVec,
    /// {version, commit}, always 1.
    pub build_info: IntGaugeVec,
    /// When this router's metrics were created (its start), for the status page's uptime.
    pub started: Instant,
    pub janitor_released_total: IntCounterVec,
    pub retries_total: IntCounterVec,
    pub ejections_total: IntCounterVec,
    pub session_evictions_total: IntCounterVec,
    pub router_responses_total: IntCounterVec,
    pub config_info: IntGauge,
    /// SIGHUP reloads by result (`RELOAD_RESULTS`).
    pub config_reloads_total: IntCounterVec,
    /// Requests naming a stored response, by where its engine was found (`stored_responses`).
    pub stored_response_lookups_total: IntCounterVec,
    /// Unix time of the configuration in effect: the start, then each reload that applied anything.
    pub config_last_reload_success_timestamp_seconds: prometheus::Gauge,
    /// Client keys and the pools' wait queues (`admission`).
    pub client_requests_total: IntCounterVec,
    pub client_rate_limited_total: IntCounterVec,
    pub queue_length: IntGaugeVec,
    pub queue_wait_seconds: HistogramVec,
    pub queue_rejected_total: IntCounterVec,
    pub queue_abandoned_total: IntCounterVec,
}

fn histogram(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> HistogramVec {
    let h = HistogramVec::new(
        HistogramOpts::new(name, help).buckets(LATENCY_BUCKETS.to_vec()),
        labels,
    )
    .expect("static metric definition");
    registry
        .register(Box::new(h.clone()))
        .expect("unique metric name");
    h
}

/// `vec` (labelled `code` only) with a series at 0 for each of `codes`.
fn with_codes(vec: IntCounterVec, codes: &[&str]) -> IntCounterVec {
    for code in codes {
        vec.with_label_values(&[code]);
    }
    vec
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
        let ttfb = histogram(
            &registry,
            "infergate_time_to_first_byte_seconds",
            "Time from dispatch to the first response body byte of a successful answer (covers the engine's \
             prefill), per endpoint.",
            &["pool", "endpoint"],
        );
        let ttft_prediction_error = HistogramVec::new(
            HistogramOpts::new(
                "infergate_ttft_prediction_error_seconds",
                "Policy predicted_ttft: predicted minus measured time from dispatch to the first body byte of a \
                 successful streamed answer, per endpoint (negative: the answer came later than predicted).",
            )
            .buckets(PREDICTION_ERROR_BUCKETS.to_vec()),
            &["pool", "endpoint"],
        )
        .expect("static metric definition");
        registry
            .register(Box::new(ttft_prediction_error.clone()))
            .expect("unique metric name");
        let request_duration = histogram(
            &registry,
            "infergate_request_duration_seconds",
            "Time from the request head to the end of the response (or the failure), of every request sent to \
             an endpoint.",
            &["pool", "endpoint"],
        );
        let build_info = IntGaugeVec::new(
            Opts::new(
                "infergate_build_info",
                "Always 1; the labels say which build runs.",
            ),
            &["version", "commit"],
        )
        .expect("static metric definition");
        build_info.with_label_values(&[VERSION, COMMIT]).set(1);
        registry
            .register(Box::new(build_info.clone()))
            .expect("unique metric name");
        // CPU seconds, resident and virtual memory, open and maximum file descriptors, threads, start time.
        #[cfg(target_os = "linux")]
        if let Err(e) = registry.register(Box::new(
            prometheus::process_collector::ProcessCollector::for_self(),
        )) {
            log::error!("cannot register process metrics: {e}");
        }
        let config_info = IntGauge::new("infergate_up", "1 while the router runs.")
            .expect("static metric definition");
        config_info.set(1);
        registry
            .register(Box::new(config_info.clone()))
            .expect("unique metric name");
        let last_reload = prometheus::Gauge::new(
            "infergate_config_last_reload_success_timestamp_seconds",
            "Unix time the configuration in effect was loaded: the start, then each SIGHUP reload that was applied \
             (fully or partly).",
        )
        .expect("static metric definition");
        last_reload.set(unix_now());
        registry
            .register(Box::new(last_reload.clone()))
            .expect("unique metric name");
        Arc::new(Metrics {
            endpoint_series: parking_lot::RwLock::new(()),
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
            ttft_prediction_error,
            request_duration,
            build_info,
            started: Instant::now(),
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
            router_responses_total: with_codes(
                counter(
                    &registry,
                    "infergate_router_responses_total",
                    "Responses the router answered itself (errors, /health, /v1/models), by status code.",
                    &["code"],
                ),
                &ROUTER_CODES,
            ),
            config_info,
            config_reloads_total: {
                let c = counter(
                    &registry,
                    "infergate_config_reloads_total",
                    "SIGHUP reloads by result: applied (everything), partial (some settings need a restart or \
                     `systemctl reload`), failed (the file was rejected; nothing changed).",
                    &["result"],
                );
                for r in RELOAD_RESULTS {
                    c.with_label_values(&[r]);
                }
                c
            },
            config_last_reload_success_timestamp_seconds: last_reload,
            stored_response_lookups_total: {
                let c = counter(
                    &registry,
                    "infergate_stored_response_lookups_total",
                    "Requests naming a stored Responses API object (previous_response_id, retrieve, cancel) by where \
                     the engine holding it was found: local (this router saw it made), cluster (another replica \
                     did), engine (the engines were asked), unknown (none has it).",
                    &["source"],
                );
                for s in STORED_RESPONSE_SOURCES {
                    c.with_label_values(&[s]);
                }
                c
            },
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
            queue_abandoned_total: counter(
                &registry,
                "infergate_queue_abandoned_total",
                "Requests whose client closed its connection while waiting in the pool's wait queue; none reached an engine.",
                &["pool"],
            ),
            registry,
        })
    }

    /// Count one lookup of a stored response's engine by where it was found (one of `STORED_RESPONSE_SOURCES`).
    pub fn stored_response_lookup(&self, source: &str) {
        self.stored_response_lookups_total
            .with_label_values(&[source])
            .inc();
    }

    /// Count one reload by its result (one of `RELOAD_RESULTS`); a reload that applied anything moves the
    /// timestamp.
    pub fn count_reload(&self, result: &str) {
        self.config_reloads_total.with_label_values(&[result]).inc();
        if result != "failed" {
            self.config_last_reload_success_timestamp_seconds
                .set(unix_now());
        }
    }

    /// Register a series defined by another module (e.g. `crate::clients`) in this router's registry.
    pub fn register(&self, collector: Box<dyn Collector>) {
        if let Err(e) = self.registry.register(collector) {
            log::error!("cannot register a metric: {e}");
        }
    }

    /// Create a client key's series at 0: requests by each of `REQUEST_CODES` (and `401` for the anonymous `-`,
    /// which counts requests without a valid key) and, for a named key, 429s by each of `limits`.
    pub fn add_client(&self, key: &str, anonymous: bool, limits: &[&str]) {
        for code in REQUEST_CODES {
            self.client_requests_total.with_label_values(&[key, code]);
        }
        if anonymous {
            self.client_requests_total.with_label_values(&[key, "401"]);
        } else {
            for limit in limits {
                self.client_rate_limited_total
                    .with_label_values(&[key, limit]);
            }
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

    /// Create a configured pool's series at 0 (session evictions by cause).
    pub fn add_pool(&self, pool: &str) {
        for cause in EVICTION_CAUSES {
            self.session_evictions_total
                .with_label_values(&[pool, cause]);
        }
    }

    /// Create every counter and histogram series of an endpoint at 0: placements by each reason its pool's policy
    /// can give (`reasons`) and `stored_response`, requests by each of `REQUEST_CODES`, and the rest.
    pub fn add_endpoint(&self, pool: &str, endpoint: &str, reasons: &[Reason]) {
        let l = [pool, endpoint];
        for vec in [
            &self.prefill_tokens_estimated_total,
            &self.janitor_released_total,
            &self.retries_total,
            &self.ejections_total,
        ] {
            vec.with_label_values(&l);
        }
        for h in [
            &self.time_to_first_byte,
            &self.request_duration,
            &self.ttft_prediction_error,
        ] {
            h.with_label_values(&l);
        }
        // Any pool may continue a stored response (`previous_response_id`), whatever its policy.
        for r in reasons.iter().chain([&Reason::StoredResponse]) {
            self.placements_total
                .with_label_values(&[pool, endpoint, r.as_str()]);
        }
        for code in REQUEST_CODES {
            self.requests_total
                .with_label_values(&[pool, endpoint, code]);
        }
    }

    /// Run `write` (which writes series of one endpoint) unless the endpoint has left its pool (`removed`). The
    /// pool sets `removed` before it calls `remove_endpoint`.
    pub fn unless_removed(&self, removed: &AtomicBool, write: impl FnOnce()) {
        let _shared = self.endpoint_series.read();
        if !removed.load(Ordering::Acquire) {
            write();
        }
    }

    /// Delete every counter and histogram series of an endpoint that left its pool (after its `removed` flag was
    /// set: writes that saw the flag unset finish first).
    pub fn remove_endpoint(&self, pool: &str, endpoint: &str) {
        let _exclusive = self.endpoint_series.write();
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
        for h in [
            &self.time_to_first_byte,
            &self.request_duration,
            &self.ttft_prediction_error,
        ] {
            remove_series_of(h, pool, endpoint);
        }
    }

    /// Time to first byte of a successful answer from `ep` (not for a departed endpoint: its series are gone).
    pub fn observe_ttfb(&self, ep: EndpointSeries, elapsed: Duration) {
        self.unless_removed(ep.removed, || {
            self.time_to_first_byte
                .with_label_values(&[ep.pool, ep.endpoint])
                .observe(elapsed.as_secs_f64());
        });
    }

    /// A prediction of the time to first byte against the measured one (not for a departed endpoint).
    pub fn observe_ttft_prediction(&self, ep: EndpointSeries, predicted: f64, measured: Duration) {
        if predicted.is_finite() {
            self.unless_removed(ep.removed, || {
                self.ttft_prediction_error
                    .with_label_values(&[ep.pool, ep.endpoint])
                    .observe(predicted - measured.as_secs_f64());
            });
        }
    }

    /// Count a finished request of `ep` by its final status `code` and observe its duration since `started`.
    /// Not for a departed endpoint: a stream that outlived its endpoint must not bring the deleted series back.
    pub fn request_done(&self, ep: EndpointSeries, code: u16, started: Instant) {
        self.unless_removed(ep.removed, || {
            self.requests_total
                .with_label_values(&[ep.pool, ep.endpoint, code.to_string().as_str()])
                .inc();
            self.request_duration
                .with_label_values(&[ep.pool, ep.endpoint])
                .observe(started.elapsed().as_secs_f64());
        });
    }

    /// The values of gauge `name` by its `pool` label, if the registry has such a gauge (the status page reads
    /// `infergate_queue_length` this way where the wait queue exists).
    pub fn gauge_by_pool(&self, name: &str) -> Option<HashMap<String, f64>> {
        let family = self
            .registry
            .gather()
            .into_iter()
            .find(|f| f.name() == name)?;
        Some(
            family
                .get_metric()
                .iter()
                .filter_map(|m| {
                    let pool = m.get_label().iter().find(|l| l.name() == "pool")?;
                    Some((pool.value().to_string(), m.get_gauge().value()))
                })
                .collect(),
        )
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
fn remove_series_of<T: MetricVecBuilder>(vec: &MetricVec<T>, pool: &str, endpoint: &str) {
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
    health_panic: IntGaugeVec,
    prefill_speed: GaugeVec,
    ttft_overhead: GaugeVec,
    ttft_throughput: GaugeVec,
    foreign: IntGaugeVec,
    failed_checks: IntCounterVec,
    health_changes: IntCounterVec,
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

/// Seconds since the Unix epoch, for timestamp gauges.
fn unix_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_that_saw_the_endpoint_present_cannot_outlive_its_deletion() {
        let metrics = Metrics::new();
        let removed = Arc::new(AtomicBool::new(false));
        let (checked_tx, checked_rx) = std::sync::mpsc::channel();
        let writer = {
            let (metrics, removed) = (metrics.clone(), removed.clone());
            std::thread::spawn(move || {
                metrics.unless_removed(&removed, || {
                    // The endpoint leaves between the check and the write.
                    let _ = checked_tx.send(());
                    std::thread::sleep(Duration::from_millis(100));
                    metrics
                        .retries_total
                        .with_label_values(&["p", "10.0.0.1:8000"])
                        .inc();
                });
            })
        };
        checked_rx.recv().unwrap();
        removed.store(true, Ordering::Release);
        metrics.remove_endpoint("p", "10.0.0.1:8000");
        writer.join().unwrap();
        let text = String::from_utf8(metrics.render()).unwrap();
        assert!(!text.contains("10.0.0.1:8000"), "{text}");
        // Once removed, nothing is written.
        metrics.unless_removed(&removed, || panic!("written after removal"));
    }
}
