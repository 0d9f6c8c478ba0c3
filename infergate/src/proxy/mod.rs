//! The Pingora glue: one `ProxyHttp` implementation that classifies each call, picks its pool, asks the pool's
//! policy for an endpoint, holds the prefill estimate in the request context and releases it at the first output
//! byte.
//!
//! Which hook does what, in the order Pingora calls them (the longer bodies live in `intake`, `upstream`, `output`
//! and `failure`; the request context in `ctx`):
//!
//! ```text
//! early_request_filter     header deadline off, keep-alive idle limit on (crate::clients); serve pipelined
//!                          requests in order; the request id (request_id: the client's or new)
//! request_filter           a CORS preflight, with cors_allowed_origins on, answered first (cors: before any
//!                          key check); screen the path (exposure: 400/404 unless served); classify; the
//!                          request's span, with `tracing` on (spans: the client's traceparent continued); answer
//!                          /health; client key (401) and key limits (429, `admit`); answer /v1/models; read
//!                          the whole body (bounded), pick the pool (a stored response's: the pool of the
//!                          engine holding it, else 404), charge the key's tokens; pin a request for a stored
//!                          response to its engine (stored_responses); for a session, the binding another
//!                          replica stored (cluster, bounded wait)
//! upstream_peer            (per attempt) a disaggregated pool's prefill leg first, once (prefill_leg: the router's
//!                          own request to a prefill engine; the body becomes the decode leg's), then
//!                          the pool's wait queue (first attempt) → snapshot → policy.place (a pinned
//!                          request: its engine, or 503) → ledger hold → the attempt's span → peer; a stale
//!                          pooled connection is retried once on the same endpoint over a fresh connection
//! upstream_request_filter  Host, the engine's key (never the client's Authorization or x-api-key), one
//!                          Content-Length, no Expect, no Accept-Encoding, the normalised path,
//!                          X-Forwarded-For / Forwarded / X-Real-IP (forwarded); traceparent: the attempt's span
//! request_body_filter      hand the held body to this attempt (every retry resends all of it)
//! upstream_response_filter 2xx: served (policy learns, tokens count, the binding is queued for the replicas'
//!                          store); 429/503: refused → retry elsewhere (not a pinned request);
//!                          5xx: failure (outlier detection); any 4xx/5xx releases the tokens at once; a
//!                          stream's headers later than stream_headers_within: failure (the janitor)
//! response_filter          while draining (upgrade, stop): `Connection: close` (lifecycle)
//! response_filter          x-request-id, x-infergate-endpoint and the router's CORS headers (not the engine's)
//!                          on the client's response (access, cors); x-infergate-route where `route_receipt`
//!                          lets the client see it (receipt)
//! response_body_filter     a created stored response's id, from the answer's start (stored_responses);
//!                          first body byte: TTFB; first output byte (past the events an engine sends before
//!                          prefill: first_output): release the prefill tokens, learn prefill speed
//! fail_to_connect /        decide retries (only where the engine cannot have started the work); what the
//!   error_while_proxy      engine owns (refused, reset, cut, timed out) is a failure, a client gone before
//!                          any answer leaves the request's cost on the endpoint (outlier)
//! fail_to_proxy            answer an OpenAI-style error
//! logging                  settle the attempt (a whole answer is the endpoint's success; a stream that ended
//!                          well teaches its prefill speed), count the request, write its access-log line and
//!                          end its spans (access; also for the router's own answers); the hold's Drop
//!                          releases whatever is left on every path (a background Responses answer's hold
//!                          lives on to its estimated prefill end)
//! request_summary          what Pingora's warn/error lines show: method, normalised path, Host (no query)
//! persist_connection_context
//!                          the connection waits for another request: header deadline on (crate::clients)
//! ```

mod access;
mod admit;
mod answers;
mod body;
mod budget;
mod ctx;
mod failure;
mod first_output;
mod intake;
mod output;
mod prefill_leg;
mod receipt;
mod reported_tokens;
mod router;
mod spans;
mod stored;
mod stream_error;
mod stream_timing;
mod token_events;
mod upstream;

use std::ops::Deref;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use pingora_core::upstreams::peer::HttpPeer;
use pingora_error::{Error, Result};
use pingora_http::{RequestHeader, ResponseHeader};
use pingora_proxy::{FailToProxy, ProxyHttp, Session};

pub use crate::errors::ApiError;
pub use body::{BodyBudget, BodyLimits};

use crate::exposure::{self, Exposure};
use crate::request::CallKind;
use crate::state::RouterState;
pub use ctx::Ctx;
use ctx::Pinned;

/// Prompt bytes collected from the body for prefix hashing and session lineages (the prefix index hashes at
/// most 4096 blocks of 64 bytes).
pub(super) const MAX_PROMPT_SCAN: usize = 256 * 1024;

/// The router: the shared state plus what only the request path needs.
pub struct Router {
    state: RouterState,
    body_budget: BodyBudget,
    exposure: Exposure,
    stored_responses: crate::stored_responses::StoredResponses,
    /// `infergate_router_responses_total{code}`: the answers the router writes itself (`answers`).
    answered: prometheus::IntCounterVec,
    /// `infergate_ttft_budget_total{pool, key, outcome}` (`budget`).
    budgets: prometheus::IntCounterVec,
    access_log: Option<crate::access_log::AccessLog>,
    /// The prefill legs of disaggregated pools: their HTTP client and series.
    disagg: prefill_leg::Disagg,
}

impl Deref for Router {
    type Target = RouterState;
    fn deref(&self) -> &RouterState {
        &self.state
    }
}

impl Router {
    pub fn new(state: RouterState) -> Router {
        let body_budget = BodyBudget::new(state.cfg.body_budget_bytes as u64);
        let exposure = Exposure::new(&state.cfg);
        let stored_responses = crate::stored_responses::StoredResponses::new(&state.metrics);
        let answered = answers::counter(&state.metrics);
        let disagg = prefill_leg::Disagg::new(&state);
        let budgets = budget::counter(&state.metrics);
        Router {
            disagg,
            state,
            body_budget,
            exposure,
            stored_responses,
            answered,
            budgets,
            access_log: None,
        }
    }

    /// Write one line per request to `log`.
    pub fn with_access_log(mut self, log: Option<crate::access_log::AccessLog>) -> Router {
        self.access_log = log;
        self
    }
}

#[async_trait]
impl ProxyHttp for Router {
    /// Boxed: Pingora keeps the context inside the request's future, which is moved (copied) whole into its box,
    /// and the context by value appears there more than once; boxed it is one pointer.
    type CTX = Box<Ctx>;

    fn new_ctx(&self) -> Box<Ctx> {
        Box::default()
    }

    async fn early_request_filter(&self, session: &mut Session, _ctx: &mut Box<Ctx>) -> Result<()> {
        // The header is in: its deadline is off, a kept-alive connection may idle timeouts.client_idle, and a
        // write to a client that stopped reading gives up after timeouts.client_write.
        let t = &self.current().timeouts;
        crate::clients::header_received(session, t.client_idle, t.client_write);
        // The case map goes (header_case) and the request id is set in the same edit.
        crate::header_case::edit_request(session.req_header_mut(), crate::request_id::assign);
        // A client may send the next request before reading this response (RFC 9112 §9.3.2): serve them in
        // order instead of dropping the connection and the requests behind it.
        if let pingora_core::protocols::http::ServerSession::H1(s) = session.as_downstream_mut() {
            s.set_pipelining_enabled(true);
        }
        crate::lifecycle::close_if_draining(session);
        Ok(())
    }

    async fn request_filter(&self, session: &mut Session, ctx: &mut Box<Ctx>) -> Result<bool> {
        self.take_request(session, ctx).await
    }

    async fn upstream_peer(
        &self,
        session: &mut Session,
        ctx: &mut Box<Ctx>,
    ) -> Result<Box<HttpPeer>> {
        self.choose_peer(session, ctx).await
    }

    async fn upstream_request_filter(
        &self,
        session: &mut Session,
        req: &mut RequestHeader,
        ctx: &mut Box<Ctx>,
    ) -> Result<()> {
        self.edit_upstream_request(session, req, ctx).await
    }

    async fn request_body_filter(
        &self,
        _session: &mut Session,
        body: &mut Option<Bytes>,
        _end_of_stream: bool,
        ctx: &mut Box<Ctx>,
    ) -> Result<()> {
        if let Some(held) = &ctx.body {
            // Read whole in request_filter: Pingora asks once per attempt (vendor/pingora-proxy.patch).
            *body = (!ctx.attempt.body_sent).then(|| held.bytes.clone());
            ctx.attempt.body_sent = true;
        }
        Ok(())
    }

    async fn upstream_response_filter(
        &self,
        _session: &mut Session,
        resp: &mut ResponseHeader,
        ctx: &mut Box<Ctx>,
    ) -> Result<()> {
        crate::header_case::plain_response(resp);
        self.on_upstream_head(resp, ctx).await
    }

    async fn response_filter(
        &self,
        session: &mut Session,
        resp: &mut ResponseHeader,
        ctx: &mut Box<Ctx>,
    ) -> Result<()> {
        // A request in flight when a drain starts: its client reconnects instead of reusing this connection.
        crate::lifecycle::close_if_draining(session);
        let cfg = self.current();
        // Every header edit in one pass over the map itself (header_case).
        crate::header_case::edit_response(resp, |h| {
            self.trace_headers(session, h, ctx, &cfg)?;
            self.route_receipt(ctx, h, &cfg)
        })
    }

    fn response_body_filter(
        &self,
        _session: &mut Session,
        body: &mut Option<Bytes>,
        _end_of_stream: bool,
        ctx: &mut Box<Ctx>,
    ) -> Result<Option<Duration>> {
        self.on_body_chunk(body, ctx)
    }

    fn fail_to_connect(
        &self,
        _session: &mut Session,
        _peer: &HttpPeer,
        ctx: &mut Box<Ctx>,
        e: Box<Error>,
    ) -> Box<Error> {
        self.connect_failed(ctx, e)
    }

    fn error_while_proxy(
        &self,
        _peer: &HttpPeer,
        session: &mut Session,
        e: Box<Error>,
        ctx: &mut Box<Ctx>,
        client_reused: bool,
    ) -> Box<Error> {
        self.proxy_error(session, e, ctx, client_reused)
    }

    async fn fail_to_proxy(
        &self,
        session: &mut Session,
        e: &Error,
        ctx: &mut Box<Ctx>,
    ) -> FailToProxy {
        self.answer_failure(session, e, ctx).await
    }

    async fn logging(&self, session: &mut Session, e: Option<&Error>, ctx: &mut Box<Ctx>) {
        let code = match (ctx.answered, e) {
            (Some(code), _) => code,
            // Stream broken or client gone: the status line may say 200, but the request failed.
            (None, Some(_)) => ctx
                .attempt
                .upstream_status
                .filter(|s| *s >= 500)
                .unwrap_or(0),
            (None, None) => session.response_written().map_or(0, |r| r.status.as_u16()),
        };
        if ctx.kind != CallKind::RouterHealth {
            self.admission.count(&ctx.admission, code);
        }
        self.settle(ctx, e);
        let ep = ctx.endpoint.as_ref().or(ctx.last_endpoint.as_ref());
        if let (Some(_), Some(ep)) = (&ctx.pool, ep) {
            self.metrics.request_done(ep.series(), code, ctx.log.start);
        }
        self.log_request(session, e, ctx);
        match (ctx.attempt.background_until, ctx.hold.take()) {
            // The engine runs it now: its tokens and request count stay until the estimated prefill end.
            (Some(until), Some(hold)) if (200..300).contains(&code) => {
                tokio::spawn(async move {
                    tokio::time::sleep_until(until.into()).await;
                    drop(hold);
                });
            }
            (_, hold) => drop(hold),
        }
    }

    fn request_summary(&self, session: &Session, ctx: &Box<Ctx>) -> String {
        exposure::request_summary(session.req_header(), ctx.target.as_ref())
    }

    fn persist_connection_context(
        &self,
        session: &Session,
        _ctx: &Box<Ctx>,
    ) -> Option<Box<dyn std::any::Any + Send + Sync>> {
        // The connection will wait for another request: its header gets timeouts.request_header again.
        crate::clients::awaiting_next_request(session);
        None
    }
}
