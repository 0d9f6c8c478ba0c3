//! OpenTelemetry traces of the requests (`tracing`): the export pipeline, built from the configuration and rebuilt
//! when a reload changes it, and the spans of one request ([`RequestTrace`]).
//!
//! Spans leave through the SDK's batch processor, which exports from a thread of its own over OTLP/HTTP: a request
//! only hands its finished spans to a bounded queue (`export`), so a collector that is down or hangs costs spans
//! (counted in `infergate_tracing_spans_total{outcome}`), never a request's time. With `tracing` off the request
//! path reads one pointer and starts nothing.
//!
//! The pipeline is built after the process has daemonized (its thread would not survive the fork): by the
//! housekeeping service at start, by `reload` on SIGHUP.

mod export;
mod request;

use std::sync::Arc;
use std::time::SystemTime;

use arc_swap::ArcSwapOption;
use opentelemetry::trace::{SpanKind, TraceContextExt, Tracer, TracerProvider};
use opentelemetry::{Context, KeyValue};
use opentelemetry_otlp::{Protocol, WithExportConfig};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, Sampler, SdkTracer, SdkTracerProvider,
};
use opentelemetry_sdk::Resource;
use prometheus::{IntCounterVec, IntGauge, Opts};

use crate::config::TracingConfig;
use crate::metrics::Metrics;

pub use request::RequestTrace;

/// `outcome` values of `infergate_tracing_spans_total`.
pub const SPAN_OUTCOMES: [&str; 3] = ["exported", "failed", "dropped"];

/// How long spans of requests that were in flight when the pipeline was replaced may still use the old one.
const RETIRE_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

/// The router's tracing: the pipeline in effect (None = off) and the counters every pipeline shares.
pub struct Tracing {
    pipeline: ArcSwapOption<Pipeline>,
    counters: export::Counters,
}

/// One configuration's provider and tracer.
struct Pipeline {
    cfg: TracingConfig,
    provider: SdkTracerProvider,
    tracer: SdkTracer,
}

impl Tracing {
    /// Off until [`Tracing::configure`]; the metric series are created at 0 now.
    pub fn new(metrics: &Metrics) -> Arc<Tracing> {
        let spans = metrics.add(IntCounterVec::new(
            Opts::new(
                "infergate_tracing_spans_total",
                "Request spans by what became of them: exported to the collector, failed to export (the \
                 collector is unreachable, slow or refusing), or dropped because the export queue was full.",
            ),
            &["outcome"],
        ));
        let queued = metrics.add(IntGauge::new(
            "infergate_tracing_queue_spans",
            "Spans waiting for export or being sent (at most tracing.queue_spans).",
        ));
        let [exported, failed, dropped] = SPAN_OUTCOMES.map(|o| spans.with_label_values(&[o]));
        Arc::new(Tracing {
            pipeline: ArcSwapOption::empty(),
            counters: export::Counters {
                exported,
                failed,
                dropped,
                queued,
            },
        })
    }

    /// Put `cfg` in effect: build a pipeline, replace the running one or turn tracing off; nothing when it is
    /// unchanged. Blocks briefly (threads start); a replaced pipeline is shut down in the background after
    /// [`RETIRE_GRACE`], so spans of requests in flight still leave through it.
    pub fn configure(&self, cfg: Option<&TracingConfig>) -> Result<(), String> {
        let running = self.pipeline.load();
        if running.as_ref().map(|p| &p.cfg) == cfg {
            return Ok(());
        }
        let next = match cfg {
            Some(c) => Some(Arc::new(self.build(c)?)),
            None => None,
        };
        match &next {
            Some(p) => log::info!(
                "tracing: exporting spans to {} (sample ratio {})",
                p.cfg.endpoint,
                p.cfg.sample_ratio
            ),
            None => log::info!("tracing: off"),
        }
        if let Some(old) = self.pipeline.swap(next) {
            retire(old, RETIRE_GRACE);
        }
        Ok(())
    }

    /// Export what is queued and stop (the router is stopping). Blocks up to the export timeout.
    pub fn shutdown(&self) {
        if let Some(p) = self.pipeline.swap(None) {
            let _ = p.provider.shutdown();
        }
    }

    fn build(&self, cfg: &TracingConfig) -> Result<Pipeline, String> {
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(cfg.endpoint.clone())
            .with_timeout(cfg.export_timeout)
            .build()
            .map_err(|e| format!("tracing: cannot build the OTLP exporter: {e}"))?;
        let gate = export::Gate::new(cfg.queue_spans, self.counters.clone());
        let batch = BatchSpanProcessor::builder(export::Counted {
            gate: gate.clone(),
            inner: exporter,
        })
        .with_batch_config(
            BatchConfigBuilder::default()
                .with_max_queue_size(cfg.queue_spans)
                .with_max_export_batch_size(cfg.batch_spans)
                .with_scheduled_delay(cfg.export_interval)
                .build(),
        )
        .build();
        let provider = SdkTracerProvider::builder()
            .with_span_processor(export::Bounded { gate, inner: batch })
            .with_sampler(Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
                cfg.sample_ratio,
            ))))
            .with_resource(
                Resource::builder_empty()
                    .with_service_name(cfg.service_name.clone())
                    .with_attribute(KeyValue::new("service.version", crate::metrics::VERSION))
                    .build(),
            )
            .build();
        let tracer = provider.tracer("infergate");
        Ok(Pipeline {
            cfg: cfg.clone(),
            provider,
            tracer,
        })
    }

    /// The span of a request that arrived at `start`, continuing the client's `traceparent` (and `tracestate`)
    /// when it sent a valid one; None when tracing is off (then `describe`, which gives the span's name and
    /// attributes, is not called).
    pub fn start(
        &self,
        headers: &http::HeaderMap,
        start: SystemTime,
        describe: impl FnOnce() -> (String, Vec<KeyValue>),
    ) -> Option<Box<RequestTrace>> {
        let guard = self.pipeline.load();
        let p = guard.as_ref()?;
        let (name, attributes) = describe();
        let parent = opentelemetry::propagation::TextMapPropagator::extract(
            &TraceContextPropagator::new(),
            &Headers(headers),
        );
        let span = p.tracer.build_with_context(
            p.tracer
                .span_builder(name)
                .with_kind(SpanKind::Server)
                .with_start_time(start)
                .with_attributes(attributes),
            &parent,
        );
        Some(Box::new(RequestTrace::new(
            Context::new().with_span(span),
            p.tracer.clone(),
        )))
    }
}

/// Shut `old` down after `grace`, on a thread of its own: its final export may wait on the collector. Until then
/// this thread holds it, so the last request to end under it never runs the shutdown on a proxy thread.
fn retire(old: Arc<Pipeline>, grace: std::time::Duration) {
    let spawned = std::thread::Builder::new()
        .name("infergate-tracing-retire".into())
        .spawn(move || {
            std::thread::sleep(grace);
            let _ = old.provider.shutdown();
        });
    if let Err(e) = spawned {
        log::warn!("tracing: cannot retire the previous span pipeline: {e}");
    }
}

/// A request's headers as the propagator reads them.
struct Headers<'a>(&'a http::HeaderMap);

impl opentelemetry::propagation::Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|k| k.as_str()).collect()
    }
}
