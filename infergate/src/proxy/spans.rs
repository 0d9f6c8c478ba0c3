//! The request's spans on the request path (`traces`): started once the call is classified, one child per
//! forwarding attempt, ended with the access log's facts. Nothing here runs with `tracing` off.

use std::time::Duration;

use opentelemetry::KeyValue;
use pingora_proxy::Session;

use super::{Ctx, Router};
use crate::access_log::Line;
use crate::pool::Endpoint;
use crate::request::CallKind;
use crate::traces::RequestTrace;

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

impl Router {
    /// Start the request's span (not for the router's own `/health`), continuing the client's `traceparent`.
    pub(super) fn start_trace(&self, session: &Session, ctx: &mut Ctx) {
        if ctx.kind == CallKind::RouterHealth {
            return;
        }
        let req = session.req_header();
        let path = ctx.target.as_ref().map_or("", |t| t.target.path.as_str());
        let describe = || {
            let mut attributes = vec![
                KeyValue::new("http.request.method", req.method.as_str().to_string()),
                KeyValue::new("url.path", path.to_string()),
            ];
            if let Some(id) = req
                .headers
                .get(crate::request_id::HEADER)
                .and_then(|v| v.to_str().ok())
            {
                attributes.push(KeyValue::new("infergate.request_id", id.to_string()));
            }
            if let Some(a) = session.client_addr().and_then(|a| a.as_inet()) {
                attributes.push(KeyValue::new("client.address", a.ip().to_string()));
            }
            (format!("{} {path}", req.method), attributes)
        };
        ctx.trace = self
            .tracing
            .start(&req.headers, ctx.log.start_wall, describe);
    }

    /// A forwarding attempt to `ep` begins (its span is the engine's parent).
    pub(super) fn trace_attempt(&self, ctx: &mut Ctx, ep: &Endpoint, fresh: bool, tokens: u64) {
        let Some(t) = &mut ctx.trace else {
            return;
        };
        let reason = ctx.placement.as_ref().map(|p| p.reason.as_str());
        let addr = ep.addr();
        let mut attributes = vec![
            KeyValue::new("infergate.endpoint", ep.label.clone()),
            KeyValue::new("server.address", addr.ip().to_string()),
            KeyValue::new("server.port", i64::from(addr.port())),
            KeyValue::new("infergate.prefill_tokens", tokens as i64),
            KeyValue::new("infergate.fresh_connection", fresh),
        ];
        if let Some(r) = reason {
            attributes.push(KeyValue::new("infergate.placement.reason", r));
        }
        t.begin_attempt(attributes);
    }

    /// End the request's spans with what its access-log line says.
    pub(super) fn finish_trace(&self, t: Box<RequestTrace>, line: &Line<'_>) {
        let mut a = Vec::with_capacity(12);
        let text = |k: &'static str, v: Option<&str>, a: &mut Vec<KeyValue>| {
            if let Some(v) = v {
                a.push(KeyValue::new(k, v.to_string()));
            }
        };
        text("infergate.pool", line.pool, &mut a);
        text("infergate.endpoint", line.endpoint, &mut a);
        text("infergate.placement.reason", line.reason, &mut a);
        text("gen_ai.request.model", line.model, &mut a);
        text("infergate.client_key", line.client_key, &mut a);
        if let Some(p) = line.predicted_ttft {
            a.push(KeyValue::new("infergate.ttft.predicted_ms", ms(p)));
        }
        if let Some(m) = line.ttft {
            a.push(KeyValue::new("infergate.ttft.measured_ms", ms(m)));
        }
        if let Some(tokens) = line.tokens {
            a.push(KeyValue::new("infergate.prefill_tokens", tokens as i64));
        }
        a.push(KeyValue::new("infergate.retries", i64::from(line.retries)));
        t.set(a);
        let end = line
            .time
            .map_or_else(std::time::SystemTime::now, |start| start + line.duration);
        t.finish(line.status, line.error, end);
    }
}
