//! The way out of a finished span: a bound in front of the SDK's batch processor, and a count of what the OTLP
//! exporter sent or failed to send.
//!
//! The SDK's `BatchSpanProcessor` already drops instead of blocking when its queue is full, but it only logs how
//! many. [`Bounded`] admits a span only while fewer than `limit` are waiting or being sent (counted until the
//! export that carries them returns), drops and counts the rest; the processor's own queue is as large as the
//! bound, so it never drops on its own.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use opentelemetry::Context;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{Span, SpanData, SpanExporter, SpanProcessor};
use opentelemetry_sdk::Resource;
use prometheus::{IntCounter, IntGauge};

/// The counters of one router's spans (shared by every pipeline it builds).
#[derive(Clone)]
pub(super) struct Counters {
    pub(super) exported: IntCounter,
    pub(super) failed: IntCounter,
    pub(super) dropped: IntCounter,
    pub(super) queued: IntGauge,
}

/// What one pipeline has in flight: spans admitted and not yet through an export.
pub(super) struct Gate {
    in_flight: AtomicUsize,
    limit: usize,
    /// Set once the pipeline is shut down: spans ending later have nowhere to go.
    closed: AtomicBool,
    counters: Counters,
}

impl Gate {
    pub(super) fn new(limit: usize, counters: Counters) -> Arc<Gate> {
        counters.queued.set(0);
        Arc::new(Gate {
            in_flight: AtomicUsize::new(0),
            limit,
            closed: AtomicBool::new(false),
            counters,
        })
    }

    pub(super) fn close(&self) {
        self.closed.store(true, Ordering::Release);
    }

    fn admit(&self) -> bool {
        if self.closed.load(Ordering::Acquire) {
            self.counters.dropped.inc();
            return false;
        }
        let before = self.in_flight.fetch_add(1, Ordering::AcqRel);
        if before >= self.limit {
            self.in_flight.fetch_sub(1, Ordering::AcqRel);
            self.counters.dropped.inc();
            return false;
        }
        self.counters.queued.set(gauge(before + 1));
        true
    }

    fn sent(&self, n: usize, ok: bool) {
        let left = self
            .in_flight
            .fetch_sub(n, Ordering::AcqRel)
            .saturating_sub(n);
        self.counters.queued.set(gauge(left));
        let c = if ok {
            &self.counters.exported
        } else {
            &self.counters.failed
        };
        c.inc_by(n as u64);
    }
}

fn gauge(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// A span processor that admits spans through a [`Gate`] before the batch processor `P` queues them.
#[derive(Debug)]
pub(super) struct Bounded<P> {
    pub(super) gate: Arc<Gate>,
    pub(super) inner: P,
}

impl std::fmt::Debug for Gate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gate")
            .field("in_flight", &self.in_flight.load(Ordering::Relaxed))
            .field("limit", &self.limit)
            .finish()
    }
}

impl<P: SpanProcessor> SpanProcessor for Bounded<P> {
    fn on_start(&self, span: &mut Span, cx: &Context) {
        self.inner.on_start(span, cx);
    }

    fn on_end(&self, span: SpanData) {
        if self.gate.admit() {
            self.inner.on_end(span);
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        let r = self.inner.shutdown_with_timeout(timeout);
        self.gate.close();
        r
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

/// An exporter that tells the gate how each batch went.
#[derive(Debug)]
pub(super) struct Counted<E> {
    pub(super) gate: Arc<Gate>,
    pub(super) inner: E,
}

impl<E: SpanExporter> SpanExporter for Counted<E> {
    async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
        let n = batch.len();
        let r = self.inner.export(batch).await;
        if let Err(e) = &r {
            log_failure(e);
        }
        self.gate.sent(n, r.is_ok());
        r
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

/// A failed export, logged at most once a minute (a collector that is down fails every batch).
fn log_failure(e: &opentelemetry_sdk::error::OTelSdkError) {
    static LAST: parking_lot::Mutex<Option<std::time::Instant>> = parking_lot::Mutex::new(None);
    let mut last = LAST.lock();
    if last.is_none_or(|t| t.elapsed() >= Duration::from_secs(60)) {
        *last = Some(std::time::Instant::now());
        log::warn!("tracing: cannot export spans to the collector, they are being dropped: {e}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus::Opts;

    fn counters() -> Counters {
        let c = |n: &str| IntCounter::with_opts(Opts::new(n, "t")).unwrap();
        Counters {
            exported: c("e"),
            failed: c("f"),
            dropped: c("d"),
            queued: IntGauge::new("q", "t").unwrap(),
        }
    }

    #[test]
    fn the_gate_admits_up_to_its_limit_and_counts_the_rest_and_the_outcomes() {
        let g = Gate::new(3, counters());
        assert!(g.admit() && g.admit() && g.admit());
        assert!(!g.admit());
        assert_eq!(g.counters.dropped.get(), 1);
        assert_eq!(g.counters.queued.get(), 3);
        g.sent(2, true);
        assert_eq!(g.counters.queued.get(), 1);
        assert!(g.admit());
        g.sent(2, false);
        assert_eq!((g.counters.exported.get(), g.counters.failed.get()), (2, 2));
        assert_eq!(g.counters.queued.get(), 0);
        g.close();
        assert!(!g.admit());
        assert_eq!(g.counters.dropped.get(), 2);
    }
}
