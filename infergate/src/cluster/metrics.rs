//! The `infergate_cluster_*` series: store state, publish and read latency, peers seen, where bindings came from.
//! Registered on every router (state `off` without `cluster`), so dashboards and alerts find them from the start.

use prometheus::{
    Histogram, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Opts,
};

use crate::metrics::Metrics;

/// Values of the `state` label of `infergate_cluster_state`: exactly one is 1.
pub const STATES: [&str; 3] = ["off", "connected", "down"];

/// Values of the `source` label of `infergate_cluster_binding_lookups_total`.
pub const SOURCES: [&str; 4] = ["local", "store", "miss", "unavailable"];

/// Values of the `op` label of `infergate_cluster_errors_total`.
pub const OPS: [&str; 5] = [
    "publish",
    "read_binding",
    "write_binding",
    "reserve",
    "read_reservations",
];

/// Store round trips are sub-millisecond on a LAN; the request path gives up after a few milliseconds.
const BUCKETS: [f64; 12] = [
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0,
];

pub struct ClusterMetrics {
    pub state: IntGaugeVec,
    pub publish_seconds: Histogram,
    pub read_seconds: HistogramVec,
    pub write_seconds: Histogram,
    pub peers: IntGauge,
    pub binding_lookups_total: IntCounterVec,
    pub errors_total: IntCounterVec,
}

impl ClusterMetrics {
    /// Create and register every series; `pools` are the pools that keep sessions (their lookup series start at 0).
    pub fn register(metrics: &Metrics, pools: &[&str], enabled: bool) -> ClusterMetrics {
        let state = IntGaugeVec::new(
            Opts::new(
                "infergate_cluster_state",
                "Shared-state store (Redis) of the router replicas: 1 for the current state (off, connected, down).",
            ),
            &["state"],
        )
        .expect("static metric definition");
        for s in STATES {
            state.with_label_values(&[s]).set(0);
        }
        state
            .with_label_values(&[if enabled { "down" } else { "off" }])
            .set(1);
        let publish_seconds = Histogram::with_opts(
            HistogramOpts::new(
                "infergate_cluster_publish_seconds",
                "Time to publish this replica's load and list the replicas (one store round trip).",
            )
            .buckets(BUCKETS.to_vec()),
        )
        .expect("static metric definition");
        let read_seconds = HistogramVec::new(
            HistogramOpts::new(
                "infergate_cluster_read_seconds",
                "Time to read from the store: the peers' load (background), a session binding or the peers' \
                 reservations (request path, before placement).",
            )
            .buckets(BUCKETS.to_vec()),
            &["what"],
        )
        .expect("static metric definition");
        for w in ["load", "binding", "reservations"] {
            read_seconds.with_label_values(&[w]);
        }
        let write_seconds = Histogram::with_opts(
            HistogramOpts::new(
                "infergate_cluster_write_seconds",
                "Time to write a served session turn's binding, before its answer goes to the client.",
            )
            .buckets(BUCKETS.to_vec()),
        )
        .expect("static metric definition");
        let peers = IntGauge::new(
            "infergate_cluster_peers",
            "Other router replicas whose load is fresh in the store.",
        )
        .expect("static metric definition");
        let binding_lookups_total = IntCounterVec::new(
            Opts::new(
                "infergate_cluster_binding_lookups_total",
                "Session requests by where their binding came from: local table, the store (another replica \
                 served or moved the session more recently), miss (a new session), unavailable (no local binding, and the \
                 store down or slower than cluster.read_timeout).",
            ),
            &["pool", "source"],
        )
        .expect("static metric definition");
        for p in pools {
            for s in SOURCES {
                binding_lookups_total.with_label_values(&[*p, s]);
            }
        }
        let errors_total = IntCounterVec::new(
            Opts::new(
                "infergate_cluster_errors_total",
                "Store operations that failed or timed out (placement went on with local state), by operation: \
                 publish, read_binding, write_binding, reserve (a dispatch counted for the peers), \
                 read_reservations.",
            ),
            &["op"],
        )
        .expect("static metric definition");
        for op in OPS {
            errors_total.with_label_values(&[op]);
        }
        metrics.register(Box::new(state.clone()));
        metrics.register(Box::new(publish_seconds.clone()));
        metrics.register(Box::new(read_seconds.clone()));
        metrics.register(Box::new(write_seconds.clone()));
        metrics.register(Box::new(peers.clone()));
        metrics.register(Box::new(binding_lookups_total.clone()));
        metrics.register(Box::new(errors_total.clone()));
        ClusterMetrics {
            state,
            publish_seconds,
            read_seconds,
            write_seconds,
            peers,
            binding_lookups_total,
            errors_total,
        }
    }

    pub fn set_state(&self, connected: bool) {
        self.state
            .with_label_values(&["connected"])
            .set(i64::from(connected));
        self.state
            .with_label_values(&["down"])
            .set(i64::from(!connected));
    }

    pub fn lookup(&self, pool: &str, source: &str) {
        self.binding_lookups_total
            .with_label_values(&[pool, source])
            .inc();
    }

    pub fn error(&self, op: &str) {
        self.errors_total.with_label_values(&[op]).inc();
    }
}
