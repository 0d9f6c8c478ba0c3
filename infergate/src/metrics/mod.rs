//! The registry and the series of every endpoint with their lifecycle: created at 0 with a pool or an endpoint
//! (`add_pool`, `add_endpoint`, so `rate()` sees the first event) and deleted when an endpoint departs
//! (`remove_endpoint`), plus the router's own series (build, up, reloads, its own answers). A module whose series
//! are not per endpoint defines them itself and registers them here (`add`, `register`: admission, clients, the
//! access log, cluster, stored responses); the live gauges are read at scrape time (`live`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};

use std::time::{Duration, Instant};

use prometheus::core::{Collector, MetricVec, MetricVecBuilder};
use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

use crate::placement::Reason;

mod live;

use live::LiveCollector;
pub use live::{EndpointSample, HealthCounts, LiveSource, PoolSample, STATS_STATES};

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

/// The `kind` label of `infergate_endpoint_failures_total`: what an engine-owned failure was.
pub const FAILURE_KINDS: [&str; 7] = [
    "connect",
    "status_5xx",
    "reset",
    "cut",
    "timeout",
    "protocol",
    "stream_error",
];

/// The kind of a stream whose headers were overdue (counted apart from `FAILURE_KINDS`' request endings: the
/// request may still end in one of those).
pub const FAILURE_NO_HEADERS: &str = "no_headers";

/// The kind of the request that made an endpoint's requests unanswered `outlier::UNANSWERED_IN_A_ROW` times in a
/// row (their clients left after waiting `stream_headers_within`): counted apart from `FAILURE_KINDS` likewise.
pub const FAILURE_UNANSWERED: &str = "unanswered";

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

/// The labels of one endpoint's series and the flag its pool sets when it leaves (its series are then deleted).
#[derive(Debug, Clone, Copy)]
pub struct EndpointSeries<'a> {
    pub pool: &'a str,
    pub endpoint: &'a str,
    pub removed: &'a AtomicBool,
    /// The endpoint's most written series, looked up on first use (see [`EndpointHandles`]).
    pub handles: &'a OnceLock<EndpointHandles>,
}

/// One endpoint's series written by every request, looked up once: `with_label_values` hashes the labels at each
/// call. Looked up inside [`Metrics::unless_removed`] only, so a departed endpoint's deleted series are never
/// created again; kept by the endpoint, and used only with the registry they came from.
#[derive(Debug)]
pub struct EndpointHandles {
    /// The [`Metrics`] they belong to.
    metrics: u64,
    /// `infergate_requests_total{code="200"}`.
    ok: IntCounter,
    request_duration: Histogram,
    time_to_first_byte: Histogram,
    /// `infergate_placements_total{reason}`, by `Reason::index`, each on its first placement.
    placements: [OnceLock<IntCounter>; Reason::ALL.len()],
}

/// Tells one [`Metrics`] from another (tests build several), for [`EndpointHandles`].
static NEXT_METRICS_ID: AtomicU64 = AtomicU64::new(1);

pub struct Metrics {
    /// From [`NEXT_METRICS_ID`]: which registry an endpoint's [`EndpointHandles`] belong to.
    id: u64,
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
    /// {pool, endpoint, kind}: failures the engine owns, which feed outlier detection.
    pub failures_total: IntCounterVec,
    pub config_info: IntGauge,
    /// SIGHUP reloads by result (`RELOAD_RESULTS`).
    pub config_reloads_total: IntCounterVec,
    /// Unix time of the configuration in effect: the start, then each reload that applied anything.
    pub config_last_reload_success_timestamp_seconds: prometheus::Gauge,
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
            id: NEXT_METRICS_ID.fetch_add(1, Ordering::Relaxed),
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
                "Endpoints ejected by outlier detection (consecutive failures or a failure rate).",
                &["pool", "endpoint"],
            ),
            failures_total: counter(
                &registry,
                "infergate_endpoint_failures_total",
                "Failures the engine owns, which feed outlier detection, by kind: connect (refused or reset), \
                 status_5xx, reset (closed before any answer), cut (the answer ended early), stream_error (a 2xx \
                 stream the engine ended with its own error event), timeout, protocol \
                 (an answer no API call may get: a 101 switching protocols), no_headers (a stream's headers later \
                 than outlier_detection.stream_headers_within), unanswered (two requests in a row whose clients left after \
                 waiting that long with no answer, or a stream with its headers and no output).",
                &["pool", "endpoint", "kind"],
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
            registry,
        })
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

    /// Register a family built from a static definition by the module that produces it, and hand it back.
    pub fn add<M: Collector + Clone + 'static>(&self, m: prometheus::Result<M>) -> M {
        let m = m.expect("static metric definition");
        self.register(Box::new(m.clone()));
        m
    }

    /// Register a series defined by another module (e.g. `crate::clients`) in this router's registry.
    pub fn register(&self, collector: Box<dyn Collector>) {
        if let Err(e) = self.registry.register(collector) {
            log::error!("cannot register a metric: {e}");
        }
    }

    /// Register the scrape-time collector for live gauges. Holds the source weakly: a dropped router exports none.
    pub fn register_live(&self, source: Weak<dyn LiveSource>) {
        let collector = LiveCollector::new(source);
        if let Err(e) = self.registry.register(Box::new(collector)) {
            log::error!("cannot register live gauges: {e}");
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
        for kind in FAILURE_KINDS
            .iter()
            .chain([&FAILURE_NO_HEADERS, &FAILURE_UNANSWERED])
        {
            self.failures_total
                .with_label_values(&[pool, endpoint, kind]);
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
            &self.failures_total,
        ] {
            remove_series_matching(vec, &[("pool", pool), ("endpoint", endpoint)]);
        }
        for h in [
            &self.time_to_first_byte,
            &self.request_duration,
            &self.ttft_prediction_error,
        ] {
            remove_series_matching(h, &[("pool", pool), ("endpoint", endpoint)]);
        }
    }

    /// `ep`'s [`EndpointHandles`], looked up on first use; None if they belong to another registry. Only inside
    /// [`Metrics::unless_removed`]: the lookup creates the series.
    fn handles<'a>(&self, ep: &EndpointSeries<'a>) -> Option<&'a EndpointHandles> {
        let l = [ep.pool, ep.endpoint];
        let h = ep.handles.get_or_init(|| EndpointHandles {
            metrics: self.id,
            ok: self
                .requests_total
                .with_label_values(&[ep.pool, ep.endpoint, "200"]),
            request_duration: self.request_duration.with_label_values(&l),
            time_to_first_byte: self.time_to_first_byte.with_label_values(&l),
            placements: std::array::from_fn(|_| OnceLock::new()),
        });
        (h.metrics == self.id).then_some(h)
    }

    /// Time to first byte of a successful answer from `ep` (not for a departed endpoint: its series are gone).
    pub fn observe_ttfb(&self, ep: EndpointSeries, elapsed: Duration) {
        self.unless_removed(ep.removed, || {
            let seconds = elapsed.as_secs_f64();
            match self.handles(&ep) {
                Some(h) => h.time_to_first_byte.observe(seconds),
                None => self
                    .time_to_first_byte
                    .with_label_values(&[ep.pool, ep.endpoint])
                    .observe(seconds),
            }
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

    /// A placement on `ep` for `reason` (`infergate_placements_total`; not for a departed endpoint).
    pub fn count_placement(&self, ep: EndpointSeries, reason: Reason) {
        self.unless_removed(ep.removed, || {
            let series = || {
                self.placements_total
                    .with_label_values(&[ep.pool, ep.endpoint, reason.as_str()])
            };
            match self.handles(&ep) {
                Some(h) => h.placements[reason.index()].get_or_init(series).inc(),
                None => series().inc(),
            }
        });
    }

    /// Count a finished request of `ep` by its final status `code` and observe its duration since `started`.
    /// Not for a departed endpoint: a stream that outlived its endpoint must not bring the deleted series back.
    pub fn request_done(&self, ep: EndpointSeries, code: u16, started: Instant) {
        self.unless_removed(ep.removed, || {
            let h = self.handles(&ep);
            match h {
                Some(h) if code == 200 => h.ok.inc(),
                _ => self
                    .requests_total
                    .with_label_values(&[ep.pool, ep.endpoint, code.to_string().as_str()])
                    .inc(),
            }
            let seconds = started.elapsed().as_secs_f64();
            match h {
                Some(h) => h.request_duration.observe(seconds),
                None => self
                    .request_duration
                    .with_label_values(&[ep.pool, ep.endpoint])
                    .observe(seconds),
            }
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
}

/// Remove every series of `vec` whose labels include all of `labels` (name, value), whatever its other labels
/// (a departed endpoint's or client key's series).
pub fn remove_series_matching<T: MetricVecBuilder>(vec: &MetricVec<T>, labels: &[(&str, &str)]) {
    for family in vec.collect() {
        for m in family.get_metric() {
            let have: HashMap<&str, &str> = m
                .get_label()
                .iter()
                .map(|l| (l.name(), l.value()))
                .collect();
            if labels.iter().all(|(n, v)| have.get(n) == Some(v)) {
                let _ = vec.remove(&have);
            }
        }
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

    #[test]
    fn cached_handles_write_the_labelled_series_and_only_for_their_registry() {
        let (a, b) = (Metrics::new(), Metrics::new());
        let removed = AtomicBool::new(false);
        let handles = OnceLock::new();
        let ep = EndpointSeries {
            pool: "p",
            endpoint: "10.0.0.1:8000",
            removed: &removed,
            handles: &handles,
        };
        a.request_done(ep, 200, Instant::now());
        a.request_done(ep, 503, Instant::now());
        a.observe_ttfb(ep, Duration::from_millis(5));
        // The handles are a's: b writes its own series.
        b.request_done(ep, 200, Instant::now());
        let l = ["p", "10.0.0.1:8000"];
        let count = |m: &Metrics, code: &str| {
            m.requests_total
                .with_label_values(&["p", "10.0.0.1:8000", code])
                .get()
        };
        assert_eq!((count(&a, "200"), count(&a, "503")), (1, 1));
        assert_eq!((count(&b, "200"), count(&b, "503")), (1, 0));
        let durations = |m: &Metrics| m.request_duration.with_label_values(&l).get_sample_count();
        assert_eq!((durations(&a), durations(&b)), (2, 1));
        assert_eq!(
            a.time_to_first_byte
                .with_label_values(&l)
                .get_sample_count(),
            1
        );
    }
}
