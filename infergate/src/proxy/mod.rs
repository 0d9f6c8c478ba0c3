//! The Pingora glue: one `ProxyHttp` implementation that classifies each call, picks its pool, asks the pool's
//! policy for an endpoint, holds the prefill estimate in the request context and releases it at the first output
//! byte.
//!
//! Which hook does what, in the order Pingora calls them:
//!
//! ```text
//! early_request_filter     header deadline off, keep-alive idle limit on (crate::clients); serve pipelined
//!                          requests in order; the request id (request_id: the client's or new)
//! request_filter           a CORS preflight, with cors_allowed_origins on, answered first (cors: before any
//!                          key check); screen the path (exposure: 400/404 unless served); classify; answer
//!                          /health; client key (401) and key limits (429, `admit`); answer /v1/models; read
//!                          the whole body (bounded), pick the pool (a stored response's: the pool of the
//!                          engine holding it, else 404), charge the key's tokens; pin a request for a stored
//!                          response to its engine (stored_responses); for a session, the binding another
//!                          replica stored (cluster, bounded wait)
//! upstream_peer            (per attempt) the pool's wait queue (first attempt) → snapshot → policy.place (a pinned
//!                          request: its engine, or 503) → ledger hold → peer; a stale pooled connection is
//!                          retried once on the same endpoint over a fresh connection
//! upstream_request_filter  Host, the engine's key (never the client's Authorization or x-api-key), one
//!                          Content-Length, no Expect, no Accept-Encoding, the normalised path,
//!                          X-Forwarded-For / Forwarded / X-Real-IP (forwarded)
//! request_body_filter      hand the held body to this attempt (every retry resends all of it)
//! upstream_response_filter 2xx: served (policy learns, tokens count, the binding is queued for the replicas'
//!                          store); 429/503: refused → retry elsewhere (not a pinned request);
//!                          5xx: failure (outlier detection); any 4xx/5xx releases the tokens at once
//! response_filter          while draining (upgrade, stop): `Connection: close` (lifecycle)
//! response_filter          x-request-id, x-infergate-endpoint and the router's CORS headers (not the engine's)
//!                          on the client's response (access, cors)
//! response_body_filter     a created stored response's id, from the answer's start (stored_responses);
//!                          first body byte: TTFB; first output byte (past the events an engine sends before
//!                          prefill: first_output): release the prefill tokens, learn prefill speed
//! fail_to_connect /        decide retries (only where the engine cannot have started the work)
//!   error_while_proxy
//! fail_to_proxy            answer an OpenAI-style error
//! logging                  count the request, write its access-log line (access; also for the router's own
//!                          answers); the hold's Drop releases whatever is left on every path (a background
//!                          Responses answer's hold lives on to its estimated prefill end)
//! request_summary          what Pingora's warn/error lines show: method, normalised path, Host (no query)
//! persist_connection_context
//!                          the connection waits for another request: header deadline on (crate::clients)
//! ```

mod access;
mod admit;
mod body;
mod first_output;
mod router;

use std::ops::Deref;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use pingora_core::upstreams::peer::HttpPeer;
use pingora_error::{Error, ErrorSource, ErrorType, Result, RetryType};
use pingora_http::{RequestHeader, ResponseHeader};
use pingora_proxy::{FailToProxy, ProxyHttp, Session};

pub use crate::errors::ApiError;
pub use body::{BodyBudget, BodyLimits};

use crate::exposure::{self, Exposure, Screened};
use crate::forwarded;
use crate::ledger::{Hold, ReleaseCause};
use crate::placement::policy::{Placement, Ticket};
use crate::pool::{Endpoint, Pool};
use crate::request::{self, CallKind};
use crate::state::RouterState;
use body::HeldBody;
use router::{non_streaming_release, remove_if_present};

/// Prompt bytes collected from the body for prefix hashing and session lineages (the prefix index hashes at
/// most 4096 blocks of 64 bytes).
const MAX_PROMPT_SCAN: usize = 256 * 1024;

/// How long an idle upstream connection stays pooled: below the engine's keep-alive (uvicorn closes idle ones
/// after 5 s), so a stale reuse is the exception the retry handles, not the rule.
pub const UPSTREAM_IDLE_TIMEOUT: Duration = Duration::from_secs(4);

/// Per-request state. `Default` is the state before `request_filter`.
#[derive(Default)]
pub struct Ctx {
    kind: CallKind,
    /// The screened request: its normalised target and how it is allowed.
    target: Option<Screened>,
    pool: Option<Arc<Pool>>,
    /// The whole request body, held for routing and for every forwarding attempt.
    body: Option<HeldBody>,
    scan: request::BodyScan,
    session_key: Option<Vec<u8>>,
    /// The engine holding the stored response this request needs (stored_responses): it goes there or nowhere.
    pinned: Option<Pinned>,
    /// This request may create a stored response: learn its id from the answer (stored_responses).
    stores_response: bool,
    /// Endpoints this request already failed on (ids): later attempts go elsewhere.
    tried: Vec<u64>,
    endpoint: Option<Arc<Endpoint>>,
    /// The endpoint of the last attempt, kept after a failure so the request is counted against it.
    last_endpoint: Option<Arc<Endpoint>>,
    placement: Option<Placement>,
    /// Retry this endpoint over a fresh connection (its pooled one went stale), keeping the placement.
    fresh_retry: Option<u64>,
    fresh_retry_used: bool,
    hold: Option<Hold>,
    /// What the current forwarding attempt has seen; a new attempt starts afresh.
    attempt: Attempt,
    /// The current attempt was refused (429/503) and is being retried elsewhere.
    refused: bool,
    /// An error the router answers with in `fail_to_proxy`.
    error: Option<ApiError>,
    /// The status the router answered with itself (counted instead of the absent upstream status).
    answered: Option<u16>,
    /// The client key and its concurrency slot (given back when the context drops).
    admission: crate::admission::Pass,
    /// Timing and client facts for the access log; its `start` also times `infergate_request_duration_seconds`.
    log: crate::access_log::RequestLog,
}

/// The part of the request context that belongs to one forwarding attempt: `upstream_peer` replaces it whole, so
/// nothing of a failed attempt leaks into the next.
#[derive(Debug, Default)]
struct Attempt {
    /// The held body was handed to this attempt.
    body_sent: bool,
    upstream_status: Option<u16>,
    dispatched_at: Option<Instant>,
    first_byte_seen: bool,
    /// The stream opened with the events an engine sends before its prefill (first_output).
    preamble: first_output::Preamble,
    first_output_seen: bool,
    /// The id of a stored response this answer creates (stored_responses).
    id_capture: crate::stored_responses::IdCapture,
    /// A background Responses request (answered at once, generated afterwards): its hold outlives the answer until
    /// this estimated prefill end.
    background_until: Option<Instant>,
}

impl Ctx {
    fn release_prefill(&self, cause: ReleaseCause) {
        if let Some(h) = &self.hold {
            h.release_prefill(cause);
        }
    }

    fn finish_hold(&mut self) {
        if let Some(mut h) = self.hold.take() {
            h.finish();
        }
    }

    fn is_stream(&self) -> bool {
        self.scan.stream == Some(true)
    }

    /// The held body's size as its prefill estimate counts it: inline attachments at `prefill.tokens_per_image`.
    fn prompt_bytes(&self, prefill: &crate::config::PrefillConfig) -> u64 {
        let body = self.body.as_ref().map_or(0, |b| b.bytes.len() as u64);
        let media = (self.scan.media_bytes, self.scan.media_items);
        crate::placement::prompt_bytes(
            body,
            media,
            prefill.bytes_per_token,
            prefill.tokens_per_image,
        )
    }

    fn ticket(&self) -> &Ticket {
        static NONE: Ticket = Ticket::NONE;
        self.placement.as_ref().map_or(&NONE, |p| &p.ticket)
    }
}

/// A request bound to the endpoint holding a stored response.
pub(crate) struct Pinned {
    response_id: String,
    endpoint: String,
}

/// The router: the shared state plus what only the request path needs.
pub struct Router {
    state: RouterState,
    body_budget: BodyBudget,
    exposure: Exposure,
    stored_responses: crate::stored_responses::StoredResponses,
    access_log: Option<crate::access_log::AccessLog>,
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
        Router {
            state,
            body_budget,
            exposure,
            stored_responses,
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
    type CTX = Ctx;

    fn new_ctx(&self) -> Ctx {
        Ctx::default()
    }

    async fn early_request_filter(&self, session: &mut Session, _ctx: &mut Ctx) -> Result<()> {
        // The header is in: its deadline is off, a kept-alive connection may idle timeouts.client_idle, and a
        // write to a client that stopped reading gives up after timeouts.client_write.
        let t = &self.current().timeouts;
        crate::clients::header_received(session, t.client_idle, t.client_write);
        crate::request_id::assign(session.req_header_mut());
        // A client may send the next request before reading this response (RFC 9112 §9.3.2): serve them in
        // order instead of dropping the connection and the requests behind it.
        if let pingora_core::protocols::http::ServerSession::H1(s) = session.as_downstream_mut() {
            s.set_pipelining_enabled(true);
        }
        crate::lifecycle::close_if_draining(session);
        Ok(())
    }

    async fn request_filter(&self, session: &mut Session, ctx: &mut Ctx) -> Result<bool> {
        // A browser asking whether a page of another origin may call (CORS), before any key check: preflights
        // carry none.
        if let Some(method) = crate::cors::preflight_method(session.req_header()) {
            if !self.current().cors_allowed_origins.is_off() {
                let method = method.to_string();
                self.answer_preflight(session, &method).await?;
                return Ok(true);
            }
        }
        // Only the inference API and `expose_paths`, matched on the normalised path; nothing else reaches an engine.
        match self.exposure.screen_request(session.req_header()) {
            Ok(screened) => {
                ctx.kind = screened.kind;
                ctx.target = Some(screened);
            }
            Err(e) => {
                self.respond_error(session, &e).await?;
                return Ok(true);
            }
        }
        if !self.admit_before_body(session, ctx).await? {
            return Ok(true);
        }
        match ctx.kind {
            CallKind::RouterHealth => {
                let (status, body) = crate::clients::health(&self.pools);
                let retry_after = (status == 503).then_some(2);
                self.respond(
                    session,
                    status,
                    Bytes::from_static(body.as_bytes()),
                    retry_after,
                )
                .await?;
                return Ok(true);
            }
            CallKind::RouterModels => {
                let body = self.models_body();
                self.respond(session, 200, body, None).await?;
                return Ok(true);
            }
            CallKind::Generate | CallKind::Passive => {}
        }
        // `GET /v1/models/{id}` (the SDKs' `models.retrieve`): answered from the router's model list, since the
        // model may live in any pool (and vLLM itself serves only the list).
        if let Some(id) = ctx.target.as_ref().and_then(Screened::model_id) {
            match self.model_body(id) {
                Some(body) => self.respond(session, 200, body, None).await?,
                None => {
                    self.respond_error(session, &ApiError::model_not_found(Some(id)))
                        .await?
                }
            }
            return Ok(true);
        }

        if !self.take_body(session, ctx).await? {
            return Ok(true);
        }
        if let Some(b) = &ctx.body {
            ctx.scan = request::scan(&b.bytes, MAX_PROMPT_SCAN);
        }
        let pool = match self.stored_response_pool(ctx).await {
            Some(found) => found,
            None => self.pool_for(ctx),
        };
        let pool = match pool {
            Ok(pool) => pool,
            Err(e) => {
                self.respond_error(session, &e).await?;
                return Ok(true);
            }
        };
        if !self.admit_with_body(session, ctx, &pool).await? {
            return Ok(true);
        }
        // After the key's limits: a refused request makes no engine look for a stored response.
        self.pin_continued_response(ctx, &pool).await;
        if let Some(s) = pool.cfg().policy.sessions() {
            let headers = &session.req_header().headers;
            let body_key = || {
                let key = ctx.scan.prompt_cache_key.as_deref()?;
                (s.prompt_cache_key && !key.is_empty()).then_some(key.as_bytes())
            };
            ctx.session_key = s
                .headers
                .iter()
                .filter_map(|h| headers.get(h.as_str()))
                .map(|v| v.as_bytes())
                .find(|v| !v.is_empty())
                .or_else(body_key)
                .map(<[u8]>::to_vec);
        }
        if let (Some(cluster), Some(key)) = (&self.cluster, &ctx.session_key) {
            // Another replica may have served this session: its binding, before placement (bounded wait).
            cluster.lookup_binding(&pool, key).await;
        }
        ctx.pool = Some(pool);
        Ok(false)
    }

    async fn upstream_peer(&self, session: &mut Session, ctx: &mut Ctx) -> Result<Box<HttpPeer>> {
        let Some(pool) = ctx.pool.clone() else {
            return Error::e_explain(ErrorType::InternalError, "no pool chosen");
        };
        // A retry: the previous attempt's hold was finished when it failed.
        ctx.finish_hold();
        let path = ctx.target.as_ref().map_or("", |t| t.target.path.as_str());
        let preamble = if ctx.is_stream() {
            first_output::preamble_events(path)
        } else {
            0
        };
        ctx.attempt = Attempt {
            preamble: first_output::Preamble::new(preamble),
            ..Attempt::default()
        };
        // Held until this attempt's hold exists (end of this function).
        let _turn = self.wait_turn(session, &pool, ctx).await?;
        // From the snapshot to the hold (no await in between): concurrent placements see each other's holds.
        let _placing = pool.placing.lock();
        let now = Instant::now();

        let fresh = ctx.fresh_retry.take();
        let same = fresh.and_then(|id| self.same_endpoint(&pool, id));
        let (ep, fresh) = match (same, ctx.placement.take()) {
            (Some(ep), Some(placement)) => {
                ctx.placement = Some(placement);
                (ep, true)
            }
            (_, previous) => {
                let Some((ep, placement)) = self.place(&pool, ctx, now) else {
                    // The last attempt's placement stays for the access log.
                    ctx.placement = previous;
                    let e = if let Some(pin) = &ctx.pinned {
                        ApiError::response_holder_unavailable(&pin.response_id, &pin.endpoint)
                    } else if !pool.any_healthy() || ctx.tried.is_empty() {
                        ApiError::no_healthy_endpoint(&pool.name)
                    } else {
                        ApiError::upstream_unreachable(&pool.name)
                    };
                    let status = e.status;
                    ctx.error = Some(e);
                    return Error::e_explain(
                        ErrorType::HTTPStatus(status),
                        "no endpoint available",
                    );
                };
                let generating = ctx.kind == CallKind::Generate;
                if generating {
                    self.metrics.unless_removed(&ep.removed, || {
                        self.metrics
                            .placements_total
                            .with_label_values(&[&*pool.name, &ep.label, placement.reason.as_str()])
                            .inc();
                    });
                    pool.recent.record(ep.id, placement.reason, now);
                    pool.policy.dispatched(ep.id, &placement.ticket, now);
                }
                ctx.placement = Some(placement);
                (ep, false)
            }
        };

        let counts_tokens = ctx.kind == CallKind::Generate && pool.policy.counts_tokens();
        let estimate_bytes = ctx.placement.as_ref().map_or(0, |p| p.estimate_bytes);
        let tokens = if counts_tokens {
            self.estimate(&pool, estimate_bytes)
        } else {
            0
        };
        let mut hold = self
            .ledger
            .hold(ep.load.clone(), tokens, self.release_hook(&ep));
        self.wake_queue_on_finish(&pool, &mut hold);
        if tokens > 0 && !ctx.is_stream() {
            let estimate = ep.prefill_speed.estimate(tokens);
            let after = non_streaming_release(estimate, &self.current().timeouts);
            hold.release_at(now + after);
            // The answer comes before the work: keep the tokens to the estimated prefill end, if there is one.
            if ctx.scan.background == Some(true) {
                ctx.attempt.background_until = estimate.map(|d| now + d);
            }
        }
        ctx.hold = Some(hold);
        ctx.attempt.dispatched_at = Some(now);
        let peer = self.peer(&ep, fresh);
        ctx.endpoint = Some(ep);
        Ok(Box::new(peer))
    }

    async fn upstream_request_filter(
        &self,
        session: &mut Session,
        req: &mut RequestHeader,
        ctx: &mut Ctx,
    ) -> Result<()> {
        // Header edits are costly in Pingora's case-preserving map: touch only what must change.
        if let Some(ep) = &ctx.endpoint {
            if req.headers.get(http::header::HOST).map(|h| h.as_bytes())
                != Some(ep.label.as_bytes())
            {
                req.insert_header("host", ep.label.as_str())?;
            }
            match ep.api_key() {
                Some(key) => req.insert_header("authorization", format!("Bearer {key}"))?,
                // The client's key is for the router, never for the engine.
                None => remove_if_present(req, "authorization"),
            }
        }
        // The client's Anthropic-style key is for the router too.
        remove_if_present(req, "x-api-key");
        // The router answered `Expect` itself and holds the whole body: send it with one exact length.
        remove_if_present(req, "expect");
        // The router reads the start of answers (the first output, a stored response's id): plain bytes, always.
        remove_if_present(req, "accept-encoding");
        if let Some(b) = &ctx.body {
            remove_if_present(req, "transfer-encoding");
            let len = b.bytes.len().to_string();
            let same = req
                .headers
                .get_all(http::header::CONTENT_LENGTH)
                .iter()
                .count()
                == 1
                && req
                    .headers
                    .get(http::header::CONTENT_LENGTH)
                    .map(|v| v.as_bytes())
                    == Some(len.as_bytes());
            if !same {
                req.insert_header("content-length", len)?;
            }
        }
        if let Some(t) = &ctx.target {
            t.set_upstream_target(req)?;
        }
        let peer = forwarded::peer_ip(session.client_addr());
        forwarded::apply(req, peer, &self.current().trusted_proxies)?;
        Ok(())
    }

    async fn request_body_filter(
        &self,
        _session: &mut Session,
        body: &mut Option<Bytes>,
        _end_of_stream: bool,
        ctx: &mut Ctx,
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
        ctx: &mut Ctx,
    ) -> Result<()> {
        let status = resp.status.as_u16();
        if status < 200 {
            return Ok(()); // informational
        }
        ctx.attempt.upstream_status = Some(status);
        let (Some(pool), Some(ep)) = (ctx.pool.clone(), ctx.endpoint.clone()) else {
            return Ok(());
        };
        let now = Instant::now();
        if (200..300).contains(&status) {
            ep.outlier.record_success();
            if let Some(h) = &ctx.hold {
                // Headers arrive before prefill (vLLM): tokens stay held until the first body byte.
                h.mark_served();
            }
            pool.policy.served(ep.id, ctx.ticket(), now);
            if let Some(cluster) = &self.cluster {
                let sessions = pool.policy.sessions();
                if let Some(saved) = sessions.and_then(|s| s.served_binding(ctx.ticket(), now)) {
                    cluster.share_binding(&pool, &saved);
                }
            }
            return Ok(());
        }
        // Anything else: the engine will not prefill this request.
        ctx.release_prefill(ReleaseCause::Aborted);
        if status == 429 || status == 503 {
            // Refused: no room now. Retry elsewhere before the client sees it, if anywhere can take it.
            ep.outlier
                .record_refusal(now, pool.cfg().outlier.saturation_cooldown);
            if status == 503 {
                self.record_failure(ctx);
            }
            let mut excluded = ctx.tried.clone();
            excluded.push(ep.id);
            // A pinned request has nowhere else to go: the engine's own answer reaches the client.
            if ctx.pinned.is_none()
                && self.retries_left(ctx)
                && pool.has_alternative(&excluded, now)
            {
                ctx.refused = true;
                return Error::e_explain(
                    ErrorType::HTTPStatus(status),
                    "engine refused the request",
                );
            }
        } else if status >= 500 {
            self.record_failure(ctx);
        } else {
            // A 4xx is the client's: the engine works.
            ep.outlier.record_success();
        }
        Ok(())
    }

    async fn response_filter(
        &self,
        session: &mut Session,
        resp: &mut ResponseHeader,
        ctx: &mut Ctx,
    ) -> Result<()> {
        // A request in flight when a drain starts: its client reconnects instead of reusing this connection.
        crate::lifecycle::close_if_draining(session);
        self.trace_headers(session, resp, ctx)
    }

    fn response_body_filter(
        &self,
        _session: &mut Session,
        body: &mut Option<Bytes>,
        _end_of_stream: bool,
        ctx: &mut Ctx,
    ) -> Result<Option<Duration>> {
        let chunk = body.as_deref().unwrap_or_default();
        ctx.log.body_chunk(chunk.len());
        if chunk.is_empty() {
            return Ok(None);
        }
        let success = ctx
            .attempt
            .upstream_status
            .is_some_and(|s| (200..300).contains(&s));
        if !ctx.attempt.first_byte_seen {
            ctx.attempt.first_byte_seen = true;
            if let (Some(t0), Some(ep), true) = (ctx.attempt.dispatched_at, &ctx.endpoint, success)
            {
                self.metrics.observe_ttfb(ep.series(), t0.elapsed());
            }
        }
        if success && ctx.stores_response {
            if let Some(id) = ctx.attempt.id_capture.feed(chunk) {
                self.remember_response(ctx, id);
            }
        }
        // An error body has no preamble: its first byte ends the hold. A background answer precedes the work.
        let work_follows = success && ctx.attempt.background_until.is_some();
        if !ctx.attempt.first_output_seen
            && !work_follows
            && (!success || ctx.attempt.preamble.output_in(chunk))
        {
            ctx.attempt.first_output_seen = true;
            if let (Some(h), Some(ep)) = (&ctx.hold, &ctx.endpoint) {
                // A successful stream's first output marks the end of prefill: learn the endpoint's speed from it.
                if h.release_prefill(ReleaseCause::FirstByte) && success && ctx.is_stream() {
                    ep.prefill_speed.observe(h.estimate(), h.age());
                    // predicted_ttft: the prefill that was ahead plus this one's, over the wait, is the
                    // throughput it predicts with; and how far off its prediction was.
                    let ticket = ctx.placement.as_ref().map(|p| &p.ticket);
                    if let Some((predicted, ahead)) = ticket.and_then(|t| t.prediction()) {
                        ep.prefill_speed
                            .observe_throughput(ahead.saturating_add(h.estimate()), h.age());
                        if let Some(p) = predicted {
                            self.metrics
                                .observe_ttft_prediction(ep.series(), p, h.age());
                        }
                    }
                }
            }
        }
        Ok(None)
    }

    fn fail_to_connect(
        &self,
        _session: &mut Session,
        _peer: &HttpPeer,
        ctx: &mut Ctx,
        mut e: Box<Error>,
    ) -> Box<Error> {
        // Refused or reset: the engine is not there. A connect timeout is not counted: a burst of connections
        // overflowing an engine's accept queue looks the same, and ejecting for it would shrink the pool under load.
        if *e.etype() != ErrorType::ConnectTimedout {
            self.record_failure(ctx);
        }
        ctx.log.upstream_error = Some(e.etype().as_str());
        // Nothing was sent: always safe to try elsewhere.
        self.note_failed_attempt(ctx, "connect failed");
        e.set_retry(ctx.tried.len() <= self.current().max_retries);
        e
    }

    fn error_while_proxy(
        &self,
        _peer: &HttpPeer,
        session: &mut Session,
        mut e: Box<Error>,
        ctx: &mut Ctx,
        client_reused: bool,
    ) -> Box<Error> {
        if std::mem::take(&mut ctx.refused) {
            // Our own retry of a 429/503 (upstream_response_filter checked that another endpoint can take it).
            self.note_failed_attempt(ctx, "engine refused the request");
            e.set_retry(true);
            return e;
        }
        let downstream_gone = *e.esource() == ErrorSource::Downstream;
        let timed_out = matches!(
            e.etype(),
            ErrorType::ReadTimedout | ErrorType::WriteTimedout | ErrorType::ConnectTimedout
        );
        // Pingora's own reuse rule: a reused pooled connection that hit EOF or a reset before any response byte
        // (it marks those ReusedOnly), or could not take the request at all. The engine cannot have started.
        let stale_reuse = client_reused
            && (matches!(e.retry, RetryType::ReusedOnly) || *e.etype() == ErrorType::WriteError);
        let nothing_back =
            ctx.attempt.upstream_status.is_none() && session.response_written().is_none();
        if stale_reuse && nothing_back && !downstream_gone && !timed_out && !ctx.fresh_retry_used {
            // Same endpoint, fresh connection: the session keeps its engine and KV cache.
            ctx.fresh_retry_used = true;
            ctx.finish_hold();
            if let (Some(pool), Some(ep)) = (&ctx.pool, &ctx.endpoint) {
                self.metrics.unless_removed(&ep.removed, || {
                    self.metrics
                        .retries_total
                        .with_label_values(&[&*pool.name, &ep.label])
                        .inc();
                });
                log::info!(
                    "pool {} endpoint {}: pooled connection went stale; retrying on a fresh connection",
                    pool.name,
                    ep.label
                );
                ctx.fresh_retry = Some(ep.id);
            }
            e.set_retry(true);
            return e;
        }
        if !downstream_gone && !timed_out && nothing_back {
            self.record_failure(ctx);
        }
        e.set_retry(false);
        ctx.release_prefill(ReleaseCause::Aborted);
        e
    }

    async fn fail_to_proxy(&self, session: &mut Session, e: &Error, ctx: &mut Ctx) -> FailToProxy {
        ctx.release_prefill(ReleaseCause::Aborted);
        let api = ctx.error.take().or_else(|| ApiError::from_proxy_error(e));
        ctx.log.router_error = api.as_ref().map(|a| a.code);
        let code = match api {
            Some(api) if session.response_written().is_none() => {
                if let Err(err) = self.respond_error(session, &api).await {
                    log::debug!("cannot send error response: {err}");
                }
                api.status
            }
            // The client is gone, or already has a status line and a cut body.
            _ => 0,
        };
        ctx.answered = Some(code);
        FailToProxy {
            error_code: code,
            can_reuse_downstream: false,
        }
    }

    async fn logging(&self, session: &mut Session, e: Option<&Error>, ctx: &mut Ctx) {
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

    fn request_summary(&self, session: &Session, ctx: &Ctx) -> String {
        exposure::request_summary(session.req_header(), ctx.target.as_ref())
    }

    fn persist_connection_context(
        &self,
        session: &Session,
        _ctx: &Ctx,
    ) -> Option<Box<dyn std::any::Any + Send + Sync>> {
        // The connection will wait for another request: its header gets timeouts.request_header again.
        crate::clients::awaiting_next_request(session);
        None
    }
}
