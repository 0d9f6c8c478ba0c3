//! The series admission produces: requests and 429s per client key, and each pool's wait queue.

use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::RwLock;
use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, IntGaugeVec, Opts};

use super::queue::QueueMetrics;
use crate::metrics::{remove_series_matching, Metrics, REQUEST_CODES};

pub(super) struct AdmissionMetrics {
    client_requests_total: IntCounterVec,
    client_rate_limited_total: IntCounterVec,
    queue_length: IntGaugeVec,
    queue_wait_seconds: HistogramVec,
    queue_rejected_total: IntCounterVec,
    queue_abandoned_total: IntCounterVec,
    /// Read-held while a key's series are written, write-held while a departed key's are deleted: a write that saw
    /// the key in force finishes before its series go, and none starts after.
    client_series: RwLock<()>,
}

impl AdmissionMetrics {
    pub(super) fn new(m: &Metrics) -> AdmissionMetrics {
        let counter = |name: &str, help: &str, labels: &[&str]| {
            m.add(IntCounterVec::new(Opts::new(name, help), labels))
        };
        AdmissionMetrics {
            client_requests_total: counter(
                "infergate_client_requests_total",
                "Requests by client key name (\"-\": auth off or no valid key) and final status code (0 = no response).",
                &["key", "code"],
            ),
            client_rate_limited_total: counter(
                "infergate_client_rate_limited_total",
                "Requests refused with 429 by a client key's limit, by key name and limit.",
                &["key", "limit"],
            ),
            queue_length: m.add(IntGaugeVec::new(
                Opts::new("infergate_queue_length", "Requests waiting in the pool's wait queue."),
                &["pool"],
            )),
            queue_wait_seconds: m.add(HistogramVec::new(
                HistogramOpts::new(
                    "infergate_queue_wait_seconds",
                    "Time requests waited for room (every endpoint at max_in_flight_per_endpoint) in the pool's wait queue, until placed or timed out.",
                )
                .buckets(vec![
                    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0,
                ]),
                &["pool"],
            )),
            queue_rejected_total: counter(
                "infergate_queue_rejected_total",
                "Requests answered 503 by the pool's wait queue, by reason (full, timeout).",
                &["pool", "reason"],
            ),
            queue_abandoned_total: counter(
                "infergate_queue_abandoned_total",
                "Requests whose client closed its connection while waiting in the pool's wait queue; none reached an engine.",
                &["pool"],
            ),
            client_series: RwLock::new(()),
        }
    }

    /// The series of pool `name`'s wait queue.
    pub(super) fn queue(&self, name: &str) -> QueueMetrics {
        QueueMetrics {
            length: self.queue_length.with_label_values(&[name]),
            wait: self.queue_wait_seconds.with_label_values(&[name]),
            full: self.queue_rejected_total.with_label_values(&[name, "full"]),
            timeout: self
                .queue_rejected_total
                .with_label_values(&[name, "timeout"]),
            abandoned: self.queue_abandoned_total.with_label_values(&[name]),
        }
    }

    /// Create a client key's series at 0: requests by each of `REQUEST_CODES` (and `401` for the anonymous `-`,
    /// which counts requests without a valid key) and, for a named key, 429s by each of `limits`.
    pub(super) fn add_client(&self, key: &str, anonymous: bool, limits: &[&str]) {
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

    /// Delete every series of a client key that left the keys file, first marking it `retired` so that no later
    /// write brings them back.
    pub(super) fn remove_client(&self, key: &str, retired: Option<&AtomicBool>) {
        let _exclusive = self.client_series.write();
        if let Some(r) = retired {
            r.store(true, Ordering::Release);
        }
        for vec in [&self.client_requests_total, &self.client_rate_limited_total] {
            remove_series_matching(vec, &[("key", key)]);
        }
    }

    /// Run `write` unless the key has left the keys file (`retired`; `None`: the anonymous `-`, never removed).
    fn unless_retired(&self, retired: Option<&AtomicBool>, write: impl FnOnce()) {
        let _shared = self.client_series.read();
        if !retired.is_some_and(|r| r.load(Ordering::Acquire)) {
            write();
        }
    }

    pub(super) fn rate_limited(&self, key: &str, retired: &AtomicBool, limit: &str) {
        self.unless_retired(Some(retired), || {
            self.client_rate_limited_total
                .with_label_values(&[key, limit])
                .inc()
        });
    }

    pub(super) fn request(&self, key: &str, retired: Option<&AtomicBool>, code: u16) {
        self.unless_retired(retired, || {
            self.client_requests_total
                .with_label_values(&[key, code.to_string().as_str()])
                .inc()
        });
    }
}
