//! What the proxy adds for request tracing: the request id on every response, the serving endpoint's header, and
//! the access-log line written from the `logging` hook (for proxied requests and the router's own answers alike),
//! whose facts also end the request's spans.

use pingora_error::{Error, ErrorSource, ErrorType, Result};
use pingora_proxy::Session;

use super::{Ctx, Router};
use crate::access_log::Line;
use crate::header_case::Headers;
use crate::placement::sessions::session_hash;
use crate::request_id;

/// The response header naming the endpoint that served the request (`host:port`); `endpoint_header: false` drops it.
pub const ENDPOINT_HEADER: &str = "x-infergate-endpoint";

/// In a disaggregated pool, the header naming the endpoint that ran the prefill leg (`endpoint_header` too).
pub const PREFILL_ENDPOINT_HEADER: &str = "x-infergate-prefill-endpoint";

static ENDPOINT_NAME: http::HeaderName = http::HeaderName::from_static(ENDPOINT_HEADER);
static PREFILL_ENDPOINT_NAME: http::HeaderName =
    http::HeaderName::from_static(PREFILL_ENDPOINT_HEADER);

/// Set the request's id on a response: the value `request_id::assign` left in the request header.
pub(super) fn echo_request_id(session: &Session, resp: &mut (impl Headers + ?Sized)) -> Result<()> {
    if let Some(id) = session.req_header().headers.get(&request_id::NAME) {
        resp.set(&request_id::NAME, id.clone())?;
    }
    Ok(())
}

impl Router {
    /// Headers of a proxied response: the request id, the router's CORS headers (not the engine's) and, unless
    /// turned off, the serving endpoint.
    pub(super) fn trace_headers(
        &self,
        session: &Session,
        resp: &mut dyn Headers,
        ctx: &Ctx,
        cfg: &crate::config::Config,
    ) -> Result<()> {
        echo_request_id(session, resp)?;
        crate::cors::apply(&cfg.cors_allowed_origins, session.req_header(), resp)?;
        if cfg.endpoint_header {
            if let Some(ep) = &ctx.endpoint {
                resp.set(&ENDPOINT_NAME, ep.label_value.clone())?;
            }
            if let Some(p) = &ctx.prefill {
                let v = http::HeaderValue::from_str(&p.endpoint).map_err(|_| {
                    Error::explain(ErrorType::InvalidHTTPHeader, "invalid endpoint label")
                })?;
                resp.set(&PREFILL_ENDPOINT_NAME, v)?;
            }
        }
        Ok(())
    }

    /// Write the request's access-log line (when the log is on) and end its spans (when it has them).
    pub(super) fn log_request(&self, session: &Session, e: Option<&Error>, ctx: &mut Ctx) {
        let trace = ctx.trace.take();
        if self.access_log.is_none() && trace.is_none() {
            return;
        }
        let req = session.req_header();
        let path = match &ctx.target {
            Some(s) => s.target.path.clone(),
            None => crate::paths::normalize(req.raw_path())
                .map_or_else(|_| "(invalid path)".to_string(), |t| t.path),
        };
        let route = self.route(ctx);
        let ttft = match (ctx.attempt.dispatched_at, ctx.attempt.first_output_at) {
            (Some(t0), Some(t1)) => Some(t1.duration_since(t0)),
            _ => None,
        };
        let error = e.map(
            |e| match (e.etype(), ctx.log.upstream_error, ctx.log.router_error) {
                // The router's own answer after failed attempts: say why they failed.
                (ErrorType::HTTPStatus(_), Some(why), _) => format!("upstream:{why}"),
                // The router's own decision (no healthy endpoint, ...): its error code.
                (ErrorType::HTTPStatus(_), None, Some(code)) => code.to_string(),
                _ => match e.esource() {
                    ErrorSource::Unset => e.etype().as_str().to_string(),
                    s => format!("{}:{}", s.as_str().to_ascii_lowercase(), e.etype().as_str()),
                },
            },
        );
        // A 2xx stream the engine ended with its error event: the client has a 200 and the error.
        let error = error.or_else(|| {
            ctx.attempt
                .in_band_error
                .then(|| "upstream:stream_error".to_string())
        });
        let id = req
            .headers
            .get(&request_id::NAME)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("-");
        let downstream = session.as_downstream();
        let prefill_retries = ctx.prefill.as_ref().map_or(0, |p| p.retries as usize);
        let retries = ctx.tried.len() + usize::from(ctx.fresh_retry_used) + prefill_retries;
        let trace_id = trace.as_ref().map(|t| t.trace_id());
        let line = Line {
            time: Some(ctx.log.start_wall),
            client: session.client_addr().and_then(|a| a.as_inet()).copied(),
            method: req.method.as_str(),
            path: &path,
            model: ctx.scan.model.as_deref(),
            pool: route.map(|r| r.pool),
            endpoint: route.and_then(|r| r.endpoint),
            reason: route.and_then(|r| r.reason),
            status: session.response_written().map_or(0, |r| r.status.as_u16()),
            tokens: route.and_then(|r| r.tokens),
            predicted_ttft: route.and_then(|r| r.predicted_ttft),
            ttfb: ctx.log.first_byte.map(|t| t.duration_since(ctx.log.start)),
            ttft,
            duration: ctx.log.start.elapsed(),
            bytes_in: downstream.body_bytes_read() as u64,
            bytes_out: downstream.body_bytes_sent() as u64,
            retries: u32::try_from(retries).unwrap_or(u32::MAX),
            client_key: Some(ctx.admission.key()).filter(|k| *k != crate::admission::NO_KEY),
            session: ctx.session_key.as_deref().map(session_hash),
            request_id: id,
            trace_id: trace_id.as_deref(),
            error: error.as_deref(),
            user_agent: req
                .headers
                .get(http::header::USER_AGENT)
                .and_then(|v| v.to_str().ok()),
            prefill_endpoint: ctx.prefill.as_ref().map(|p| p.endpoint.as_str()),
            prefill: ctx.prefill.as_ref().map(|p| p.took),
        };
        if let Some(log) = &self.access_log {
            log.write(&line);
        }
        if let Some(t) = trace {
            self.finish_trace(t, &line);
        }
    }
}
