//! The spans of one request: the router's (kind server, from arrival to the end of the answer) and one child per
//! forwarding attempt (kind client), whose context the engine gets as its `traceparent`.

use std::time::SystemTime;

use opentelemetry::trace::{Span, SpanKind, Status, TraceContextExt, Tracer};
use opentelemetry::{Context, KeyValue};
use opentelemetry_sdk::trace::{SdkTracer, Span as SdkSpan};

/// A request's trace, kept in the proxy's request context.
pub struct RequestTrace {
    /// Holds the router's span.
    cx: Context,
    tracer: SdkTracer,
    /// The attempt in progress, or the last one (ended when the request ends).
    attempt: Option<SdkSpan>,
    attempts: u32,
}

impl RequestTrace {
    pub(super) fn new(cx: Context, tracer: SdkTracer) -> RequestTrace {
        RequestTrace {
            cx,
            tracer,
            attempt: None,
            attempts: 0,
        }
    }

    /// The trace's id (32 hex digits), for the access log.
    pub fn trace_id(&self) -> String {
        self.cx.span().span_context().trace_id().to_string()
    }

    /// Add attributes to the router's span.
    pub fn set(&self, attributes: impl IntoIterator<Item = KeyValue>) {
        self.cx.span().set_attributes(attributes);
    }

    /// A forwarding attempt starts now: the previous one, if still open, ends with it.
    pub fn begin_attempt(&mut self, attributes: Vec<KeyValue>) {
        self.end_attempt(None);
        self.attempts += 1;
        let mut attrs = attributes;
        attrs.push(KeyValue::new("infergate.attempt", i64::from(self.attempts)));
        let span = self.tracer.build_with_context(
            self.tracer
                .span_builder("attempt")
                .with_kind(SpanKind::Client)
                .with_attributes(attrs),
            &self.cx,
        );
        self.attempt = Some(span);
    }

    /// The engine's status line for the attempt in progress.
    pub fn attempt_status(&mut self, status: u16) {
        if let Some(a) = &mut self.attempt {
            a.set_attribute(KeyValue::new(
                "http.response.status_code",
                i64::from(status),
            ));
            if status >= 500 {
                a.set_status(Status::error(format!("engine answered {status}")));
            }
        }
    }

    /// The attempt in progress failed (`why`: refused, connect failed, a stale connection, ...) and ends now.
    pub fn attempt_failed(&mut self, why: &str) {
        self.end_attempt(Some(why));
    }

    fn end_attempt(&mut self, error: Option<&str>) {
        let Some(mut a) = self.attempt.take() else {
            return;
        };
        if let Some(why) = error {
            a.set_attribute(KeyValue::new("error.type", why.to_string()));
            a.set_status(Status::error(why.to_string()));
        }
        a.end();
    }

    /// The `traceparent` the engine gets: the attempt's context (the router's before any attempt).
    pub fn traceparent(&self) -> String {
        let sc = match &self.attempt {
            Some(a) => a.span_context().clone(),
            None => self.cx.span().span_context().clone(),
        };
        format!(
            "00-{}-{}-{:02x}",
            sc.trace_id(),
            sc.span_id(),
            sc.trace_flags().to_u8()
        )
    }

    /// The request ended at `end` with `status` (0: none sent) and `error` (why it failed, if it did): the last
    /// attempt and the router's span end.
    pub fn finish(mut self, status: u16, error: Option<&str>, end: SystemTime) {
        if let Some(a) = &mut self.attempt {
            if let Some(why) = error {
                a.set_attribute(KeyValue::new("error.type", why.to_string()));
                a.set_status(Status::error(why.to_string()));
            }
            a.end_with_timestamp(end);
        }
        self.attempt = None;
        let span = self.cx.span();
        span.set_attribute(KeyValue::new(
            "infergate.attempts",
            i64::from(self.attempts),
        ));
        if status > 0 {
            span.set_attribute(KeyValue::new(
                "http.response.status_code",
                i64::from(status),
            ));
        }
        if let Some(why) = error {
            span.set_attribute(KeyValue::new("error.type", why.to_string()));
        }
        if status >= 500 || (status == 0 && error.is_some()) {
            span.set_status(Status::error(error.unwrap_or("server error").to_string()));
        }
        span.end_with_timestamp(end);
    }
}
