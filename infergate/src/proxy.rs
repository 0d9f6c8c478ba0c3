//! The Pingora glue: one `ProxyHttp` implementation that classifies each call, picks its pool, asks placement for an
//! endpoint, holds the prefill estimate in the request context and releases it at the first response byte.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use bytes::Bytes;
use pingora_core::upstreams::peer::HttpPeer;
use pingora_error::{Error, ErrorSource, ErrorType, Result};
use pingora_http::{RequestHeader, ResponseHeader};
use pingora_proxy::{FailToProxy, ProxyHttp, Session};

use crate::config::{Config, Policy};
use crate::ledger::{Hold, Ledger, ReleaseCause, ReleaseHook};
use crate::metrics::Metrics;
use crate::placement::{self, Reason};
use crate::pool::{Endpoint, Pool, Pools};
use crate::request::{self, CallKind};

/// Pingora replays at most this much of a request body read before the upstream is chosen.
pub const REPLAY_LIMIT: usize = 64 * 1024;
/// Prompt bytes collected from the body prefix for prefix hashing and session lineages.
const MAX_PROMPT_SCAN: usize = REPLAY_LIMIT;
/// Seconds a client is told to wait when a pool has no healthy endpoint.
const RETRY_AFTER_SECS: &str = "2";

/// An OpenAI-style error: `{"error":{"message","type","code"}}`.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: u16,
    pub message: String,
    pub kind: &'static str,
    pub code: &'static str,
}

impl ApiError {
    pub fn new(
        status: u16,
        kind: &'static str,
        code: &'static str,
        message: impl Into<String>,
    ) -> Self {
        ApiError {
            status,
            message: message.into(),
            kind,
            code,
        }
    }

    pub fn body(&self) -> Bytes {
        let v = serde_json::json!({"error": {"message": self.message, "type": self.kind, "code": self.code}});
        Bytes::from(v.to_string())
    }
}

/// Per-request state.
pub struct Ctx {
    kind: CallKind,
    pool: Option<Arc<Pool>>,
    /// Body bytes read before choosing the upstream (≤ 64 KiB; replayed by Pingora).
    body_prefix: Vec<u8>,
    scan: request::BodyScan,
    content_length: Option<u64>,
    /// Body bytes seen by `request_body_filter` for the current attempt (chunked uploads grow the estimate).
    body_bytes_streamed: u64,
    session_key: Option<Vec<u8>>,
    /// Endpoints tried by this request (ids), for retries.
    tried: Vec<u64>,
    endpoint: Option<Arc<Endpoint>>,
    /// Bytes the estimate is computed from: the whole body or, for a sticky session turn, its growth.
    estimate_bytes: u64,
    /// The body grew past the first estimate only for whole-body estimates (not growth-only ones).
    estimate_grows: bool,
    hold: Option<Hold>,
    reason: Option<Reason>,
    session_commit: Option<placement::sessions::SessionCommit>,
    prefix_hashes: Vec<u64>,
    dispatched_at: Option<Instant>,
    upstream_status: Option<u16>,
    first_byte_seen: bool,
    /// An error the router itself answers with in `fail_to_proxy`.
    error: Option<ApiError>,
    retry_after: bool,
}

impl Ctx {
    fn release_prefill(&mut self, cause: ReleaseCause) {
        if let Some(h) = &self.hold {
            h.release_prefill(cause);
        }
    }

    fn finish_hold(&mut self) {
        if let Some(mut h) = self.hold.take() {
            h.finish();
        }
    }
}

/// The router: shared, immutable per process apart from the live state inside pools and ledger.
pub struct Router {
    pub cfg: Arc<Config>,
    pub pools: Arc<Pools>,
    pub ledger: Arc<Ledger>,
    pub metrics: Arc<Metrics>,
}

impl Router {
    fn pool_by_model(&self, model: Option<&str>) -> Option<Arc<Pool>> {
        self.cfg
            .pool_for_model(model)
            .and_then(|i| self.pools.pools.get(i).cloned())
    }

    /// The endpoint's shared release callback: counts served estimates and janitor releases.
    fn release_hook(&self, ep: &Arc<Endpoint>) -> ReleaseHook {
        ep.release_hook
            .get_or_init(|| self.build_release_hook(ep))
            .clone()
    }

    fn build_release_hook(&self, ep: &Arc<Endpoint>) -> ReleaseHook {
        let metrics = self.metrics.clone();
        let (pool, label) = (ep.pool.clone(), ep.label.clone());
        let endpoint = Arc::downgrade(ep);
        Arc::new(move |tokens, served, cause| {
            // A late release on a departed endpoint must not bring its deleted series back.
            if endpoint
                .upgrade()
                .is_none_or(|e| e.removed.load(std::sync::atomic::Ordering::Relaxed))
            {
                return;
            }
            if served && tokens > 0 {
                metrics
                    .prefill_tokens_estimated_total
                    .with_label_values(&[&*pool, &label])
                    .inc_by(tokens);
            }
            if cause == ReleaseCause::Janitor {
                metrics
                    .janitor_released_total
                    .with_label_values(&[&*pool, &label])
                    .inc();
                log::warn!("pool {pool} endpoint {label}: janitor released {tokens} prefill tokens of an overdue request");
            }
        })
    }

    /// Write a JSON response the router answers itself.
    async fn respond(
        &self,
        session: &mut Session,
        status: u16,
        body: Bytes,
        retry_after: bool,
    ) -> Result<()> {
        let mut resp = ResponseHeader::build(status, Some(4))?;
        resp.insert_header("content-type", "application/json")?;
        resp.insert_header("content-length", body.len().to_string())?;
        if retry_after {
            resp.insert_header("retry-after", RETRY_AFTER_SECS)?;
        }
        self.metrics
            .router_responses_total
            .with_label_values(&[status.to_string().as_str()])
            .inc();
        if status >= 400 {
            // The request body may be unread: do not reuse the connection.
            session
                .as_downstream_mut()
                .write_error_response(resp, body)
                .await
        } else {
            session.write_response_header(Box::new(resp), false).await?;
            session.write_response_body(Some(body), true).await
        }
    }

    async fn respond_error(
        &self,
        session: &mut Session,
        e: &ApiError,
        retry_after: bool,
    ) -> Result<()> {
        self.respond(session, e.status, e.body(), retry_after).await
    }

    fn models_body(&self) -> Bytes {
        let data: Vec<_> = self
            .pools
            .model_names()
            .into_iter()
            .map(|m| serde_json::json!({"id": m, "object": "model", "owned_by": "infergate"}))
            .collect();
        Bytes::from(serde_json::json!({"object": "list", "data": data}).to_string())
    }

    /// Read the body prefix per Pingora's replay rule: all of it when Content-Length ≤ 64 KiB, else one chunk.
    async fn read_body_prefix(&self, session: &mut Session, ctx: &mut Ctx) -> Result<()> {
        if session.as_downstream_mut().is_body_empty() {
            return Ok(());
        }
        session.as_downstream_mut().enable_retry_buffering(); // must precede the first read
        let read_all = ctx
            .content_length
            .is_some_and(|n| n as usize <= REPLAY_LIMIT);
        while let Some(chunk) = session.as_downstream_mut().read_request_body().await? {
            ctx.body_prefix.extend_from_slice(&chunk);
            // A chunk is at most 64 KiB, so one read always fits the replay buffer; a second might not.
            if !read_all || ctx.body_prefix.len() >= REPLAY_LIMIT {
                break;
            }
        }
        Ok(())
    }

    /// Choose an endpoint for this attempt. Returns None when no eligible endpoint exists.
    fn place(&self, pool: &Pool, ctx: &mut Ctx, now: Instant) -> Option<(Arc<Endpoint>, Reason)> {
        let endpoints = pool.endpoints();
        let cands = pool.candidates(&endpoints, &ctx.tried, now);
        let mut rng = fastrand::Rng::new();
        let whole = ctx.content_length.unwrap_or(ctx.body_prefix.len() as u64);
        ctx.estimate_bytes = whole;
        ctx.estimate_grows = ctx.content_length.is_none();
        ctx.session_commit = None;
        if ctx.kind != CallKind::Generate {
            // Passive calls go to the least busy endpoint and count as no placement.
            let i = placement::least_request(&cands, &mut rng)?;
            return Some((endpoints[i].clone(), Reason::LeastRequest));
        }
        let (index, reason) = match pool.cfg.policy {
            Policy::RoundRobin => (
                placement::round_robin(&cands, pool.next_round_robin())?,
                Reason::RoundRobin,
            ),
            Policy::LeastRequest => (
                placement::least_request(&cands, &mut rng)?,
                Reason::LeastRequest,
            ),
            Policy::LoadAware => match (&pool.sessions, &ctx.session_key) {
                (Some(table), Some(key)) => {
                    let ids: Vec<u64> = endpoints.iter().map(|e| e.id).collect();
                    let req = placement::sessions::SessionRequest {
                        key,
                        lineage: placement::sessions::lineage_of(&ctx.scan.prompt),
                        body_bytes: whole,
                        bytes_per_token: pool.cfg.prefill.bytes_per_token,
                    };
                    let mut table = table.lock().unwrap_or_else(|p| p.into_inner());
                    let p = table.place(&req, &cands, &ids, now, &mut rng)?;
                    self.metrics
                        .count_session_evictions(&pool.name, table.take_evictions());
                    ctx.estimate_bytes = p.estimate_bytes;
                    ctx.estimate_grows = ctx.estimate_grows && p.estimate_bytes == whole;
                    ctx.session_commit = Some(p.commit);
                    (p.index, p.reason)
                }
                (Some(_), None) => (placement::load_aware(&cands, &mut rng)?, Reason::Headerless),
                (None, _) => (placement::load_aware(&cands, &mut rng)?, Reason::LoadAware),
            },
            Policy::PrefixAware => {
                if ctx.prefix_hashes.is_empty() {
                    // Hash before taking the index lock: up to 64 KiB of prompt per request.
                    let model = ctx.scan.model.as_deref().unwrap_or("");
                    ctx.prefix_hashes = placement::prefix::PrefixIndex::hash_blocks(
                        &pool.cfg.prefix,
                        model,
                        &ctx.scan.prompt,
                    );
                }
                let index = pool.prefix.as_ref()?;
                let mut index = index.lock().unwrap_or_else(|p| p.into_inner());
                let ids: Vec<u64> = endpoints.iter().map(|e| e.id).collect();
                let arrivals: Vec<u64> =
                    endpoints.iter().map(|e| pool.arrivals(e.id, now)).collect();
                let d = index.place(&ctx.prefix_hashes, &cands, &ids, &arrivals, &mut rng)?;
                (d.index, d.reason)
            }
        };
        Some((endpoints[index].clone(), reason))
    }

    fn estimate(&self, pool: &Pool, bytes: u64) -> u64 {
        placement::estimate_tokens(
            bytes,
            pool.cfg.prefill.bytes_per_token,
            pool.cfg.prefill.max_tokens,
        )
    }

    fn peer(&self, ep: &Endpoint) -> HttpPeer {
        let mut peer = HttpPeer::new(ep.addr, false, String::new());
        let t = &self.cfg.timeouts;
        peer.options.connection_timeout = Some(t.connect);
        // Per read, not per response (pingora-notes.md): the longest legitimate silence is the wait for the first
        // byte (prefill), bounded by response_header, or a gap between chunks, bounded by stream_idle.
        peer.options.read_timeout = Some(t.response_header.max(t.stream_idle));
        peer.options.write_timeout = Some(t.stream_idle);
        // Drop pooled connections before the engine's keep-alive does (uvicorn closes idle ones after 5 s), so a
        // stale reuse is the exception the retry handles, not the rule.
        peer.options.idle_timeout = Some(UPSTREAM_IDLE_TIMEOUT);
        peer
    }
}

/// How long an idle upstream connection stays pooled.
pub const UPSTREAM_IDLE_TIMEOUT: Duration = Duration::from_secs(4);

#[async_trait]
impl ProxyHttp for Router {
    type CTX = Ctx;

    fn new_ctx(&self) -> Ctx {
        Ctx {
            kind: CallKind::Passive,
            pool: None,
            body_prefix: Vec::new(),
            scan: request::BodyScan::default(),
            content_length: None,
            body_bytes_streamed: 0,
            session_key: None,
            tried: Vec::new(),
            endpoint: None,
            estimate_bytes: 0,
            estimate_grows: false,
            hold: None,
            reason: None,
            session_commit: None,
            prefix_hashes: Vec::new(),
            dispatched_at: None,
            upstream_status: None,
            first_byte_seen: false,
            error: None,
            retry_after: false,
        }
    }

    async fn request_filter(&self, session: &mut Session, ctx: &mut Ctx) -> Result<bool> {
        let (method, path) = {
            let req = session.req_header();
            (req.method.as_str().to_owned(), req.uri.path().to_owned())
        };
        ctx.kind = request::classify(&method, &path);
        match ctx.kind {
            CallKind::RouterHealth => {
                let (status, body) = if self.pools.any_healthy() {
                    (200, r#"{"status":"ok"}"#)
                } else {
                    (
                        503,
                        r#"{"status":"unavailable","reason":"no healthy endpoint in any pool"}"#,
                    )
                };
                self.respond(
                    session,
                    status,
                    Bytes::from_static(body.as_bytes()),
                    status == 503,
                )
                .await?;
                return Ok(true);
            }
            CallKind::RouterModels => {
                let body = self.models_body();
                self.respond(session, 200, body, false).await?;
                return Ok(true);
            }
            CallKind::Generate | CallKind::Passive => {}
        }

        let content_length = session
            .req_header()
            .headers
            .get(http::header::CONTENT_LENGTH)
            .map(|v| v.to_str().ok().and_then(|s| s.trim().parse::<u64>().ok()));
        match content_length {
            Some(None) => {
                let e = ApiError::new(
                    400,
                    "invalid_request_error",
                    "invalid_content_length",
                    "invalid Content-Length header",
                );
                self.respond_error(session, &e, false).await?;
                return Ok(true);
            }
            Some(Some(n)) if n > self.cfg.max_body_bytes as u64 => {
                let e = ApiError::new(
                    413,
                    "invalid_request_error",
                    "request_too_large",
                    format!(
                        "request body of {n} bytes exceeds the limit of {} bytes",
                        self.cfg.max_body_bytes
                    ),
                );
                self.respond_error(session, &e, false).await?;
                return Ok(true);
            }
            Some(Some(n)) => ctx.content_length = Some(n),
            None => {}
        }

        self.read_body_prefix(session, ctx).await?;
        if !ctx.body_prefix.is_empty() {
            ctx.scan = request::scan(&ctx.body_prefix, MAX_PROMPT_SCAN);
        }
        let Some(pool) = self.pool_by_model(ctx.scan.model.as_deref()) else {
            let message = match ctx.scan.model.as_deref() {
                Some(model) => format!("The model `{model}` does not exist or is not served by this router."),
                None => "The request names no `model` (in its first 64 KiB) and this router has no `*` pool."
                    .to_string(),
            };
            let e = ApiError::new(404, "invalid_request_error", "model_not_found", message);
            self.respond_error(session, &e, false).await?;
            return Ok(true);
        };
        if let Some(s) = &pool.cfg.sessions {
            ctx.session_key = session
                .req_header()
                .headers
                .get(s.header.as_str())
                .map(|v| v.as_bytes().to_vec())
                .filter(|v| !v.is_empty());
        }
        ctx.pool = Some(pool);
        Ok(false)
    }

    async fn upstream_peer(&self, _session: &mut Session, ctx: &mut Ctx) -> Result<Box<HttpPeer>> {
        let Some(pool) = ctx.pool.clone() else {
            return Error::e_explain(ErrorType::InternalError, "no pool chosen");
        };
        // A retry: the previous attempt's hold was finished in fail_to_connect / error_while_proxy.
        ctx.finish_hold();
        ctx.body_bytes_streamed = 0;
        let now = Instant::now();
        let Some((ep, reason)) = self.place(&pool, ctx, now) else {
            let none_healthy = !pool.any_healthy();
            ctx.error = Some(if none_healthy || ctx.tried.is_empty() {
                ctx.retry_after = true;
                ApiError::new(
                    503,
                    "service_unavailable",
                    "no_healthy_endpoint",
                    format!("pool `{}` has no healthy endpoint; retry later", pool.name),
                )
            } else {
                ApiError::new(
                    502,
                    "upstream_error",
                    "upstream_unreachable",
                    format!(
                        "every healthy endpoint of pool `{}` failed to connect",
                        pool.name
                    ),
                )
            });
            let status = ctx.error.as_ref().map_or(503, |e| e.status);
            return Error::e_explain(ErrorType::HTTPStatus(status), "no endpoint available");
        };
        let generating = ctx.kind == CallKind::Generate;
        let counts_tokens = generating && pool.cfg.policy != Policy::RoundRobin;
        // Only a counted whole-body estimate grows while a chunked body streams in.
        ctx.estimate_grows &= counts_tokens;
        let tokens = if counts_tokens {
            self.estimate(&pool, ctx.estimate_bytes)
        } else {
            0
        };
        let hold = self
            .ledger
            .hold(ep.load.clone(), tokens, self.release_hook(&ep));
        if tokens > 0 && ctx.scan.stream != Some(true) {
            // A non-streaming response starts only when generation ends: release at the estimated prefill end.
            if let Some(d) = ep.prefill_speed.estimate(tokens) {
                hold.release_at(now + d);
            }
        }
        ctx.hold = Some(hold);
        if generating {
            self.metrics
                .placements_total
                .with_label_values(&[&*pool.name, &ep.label, reason.as_str()])
                .inc();
            pool.record_arrival(ep.id, now);
            if let Some(index) = &pool.prefix {
                // Right after dispatch the engine starts caching this prompt: later requests (even concurrent
                // ones) can match it. A gated placement inserts too, so a hot prefix replicates.
                index.lock().unwrap_or_else(|p| p.into_inner()).insert(
                    ep.id,
                    &ctx.prefix_hashes,
                    now,
                );
            }
        }
        ctx.reason = Some(reason);
        ctx.dispatched_at = Some(now);
        let peer = self.peer(&ep);
        ctx.endpoint = Some(ep);
        Ok(Box::new(peer))
    }

    async fn upstream_request_filter(
        &self,
        _session: &mut Session,
        req: &mut RequestHeader,
        ctx: &mut Ctx,
    ) -> Result<()> {
        if let Some(ep) = &ctx.endpoint {
            req.insert_header("host", ep.label.as_str())?;
            if let Some(key) = &ep.api_key {
                req.insert_header("authorization", format!("Bearer {key}"))?;
            }
        }
        Ok(())
    }

    async fn request_body_filter(
        &self,
        _session: &mut Session,
        body: &mut Option<Bytes>,
        _end_of_stream: bool,
        ctx: &mut Ctx,
    ) -> Result<()> {
        let Some(chunk) = body else { return Ok(()) };
        ctx.body_bytes_streamed += chunk.len() as u64;
        if ctx.content_length.is_none() {
            if ctx.body_bytes_streamed > self.cfg.max_body_bytes as u64 {
                ctx.error = Some(ApiError::new(
                    413,
                    "invalid_request_error",
                    "request_too_large",
                    format!(
                        "request body exceeds the limit of {} bytes",
                        self.cfg.max_body_bytes
                    ),
                ));
                return Error::e_explain(ErrorType::HTTPStatus(413), "chunked body over the limit");
            }
            // A chunked upload: the whole-body estimate grows as bytes stream in.
            if ctx.estimate_grows {
                if let (Some(h), Some(pool)) = (&ctx.hold, &ctx.pool) {
                    h.grow_to(self.estimate(pool, ctx.body_bytes_streamed));
                }
            }
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
        ctx.upstream_status = Some(status);
        if let Some(h) = &ctx.hold {
            if status >= 500 {
                // The engine will not prefill this request.
                h.release_prefill(ReleaseCause::Aborted);
            } else {
                // Headers arrive before prefill (vLLM): tokens stay held until the first body byte.
                h.mark_served();
            }
        }
        Ok(())
    }

    fn response_body_filter(
        &self,
        _session: &mut Session,
        body: &mut Option<Bytes>,
        _end_of_stream: bool,
        ctx: &mut Ctx,
    ) -> Result<Option<Duration>> {
        if !ctx.first_byte_seen && body.as_ref().is_some_and(|b| !b.is_empty()) {
            ctx.first_byte_seen = true;
            if let (Some(h), Some(ep)) = (&ctx.hold, &ctx.endpoint) {
                // A streaming first byte marks the end of prefill: learn the endpoint's speed from it.
                if h.release_prefill(ReleaseCause::FirstByte) && ctx.scan.stream == Some(true) {
                    ep.prefill_speed.observe(h.estimate(), h.age());
                }
            }
            if let (Some(t0), Some(pool)) = (ctx.dispatched_at, &ctx.pool) {
                self.metrics
                    .ttfb(&pool.name)
                    .observe(t0.elapsed().as_secs_f64());
            }
        }
        Ok(None)
    }

    fn fail_to_connect(
        &self,
        _session: &mut Session,
        peer: &HttpPeer,
        ctx: &mut Ctx,
        mut e: Box<Error>,
    ) -> Box<Error> {
        self.note_failed_attempt(ctx, peer);
        if ctx.tried.len() <= self.cfg.max_retries {
            e.set_retry(true);
        }
        e
    }

    fn error_while_proxy(
        &self,
        peer: &HttpPeer,
        session: &mut Session,
        mut e: Box<Error>,
        ctx: &mut Ctx,
        client_reused: bool,
    ) -> Box<Error> {
        // Safe to resend only if nothing came back yet and Pingora still holds the whole body.
        let replayable =
            ctx.upstream_status.is_none() && !session.as_downstream().retry_buffer_truncated();
        if replayable && ctx.tried.len() < self.cfg.max_retries {
            if client_reused {
                // A stale pooled connection (closed or reset by the engine while idle) fails on reuse, while
                // writing the body or reading headers alike: nothing came back, so resend elsewhere.
                e.set_retry(true);
            } else {
                e.retry.decide_reuse(false);
            }
        } else {
            e.set_retry(false);
        }
        if e.retry() {
            self.note_failed_attempt(ctx, peer);
        } else {
            ctx.release_prefill(ReleaseCause::Aborted);
        }
        e
    }

    async fn fail_to_proxy(&self, session: &mut Session, e: &Error, ctx: &mut Ctx) -> FailToProxy {
        ctx.release_prefill(ReleaseCause::Aborted);
        let code = match ctx.error.take() {
            Some(api) => {
                let code = api.status;
                if let Err(err) = self.respond_error(session, &api, ctx.retry_after).await {
                    log::debug!("cannot send error response: {err}");
                }
                code
            }
            None => {
                let (code, api) = classify_proxy_error(e);
                if code > 0 && session.response_written().is_none() {
                    if let Err(err) = self.respond_error(session, &api, false).await {
                        log::debug!("cannot send error response: {err}");
                    }
                }
                code
            }
        };
        FailToProxy {
            error_code: code,
            can_reuse_downstream: false,
        }
    }

    async fn logging(&self, session: &mut Session, e: Option<&Error>, ctx: &mut Ctx) {
        let served_ok = e.is_none() && ctx.upstream_status.is_some_and(|s| s < 500);
        if let (Some(pool), Some(ep)) = (&ctx.pool, &ctx.endpoint) {
            let code = match e {
                // Client gone or stream broken: the status line may say 200, but the request failed.
                Some(_) => ctx.upstream_status.filter(|s| *s >= 500).unwrap_or(0),
                None => session.response_written().map_or(0, |r| r.status.as_u16()),
            };
            self.metrics
                .requests_total
                .with_label_values(&[&*pool.name, &ep.label, code.to_string().as_str()])
                .inc();
            if let (Some(commit), Some(table)) = (&ctx.session_commit, &pool.sessions) {
                if served_ok {
                    table
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .commit(commit, Instant::now());
                }
            }
        }
        ctx.finish_hold();
    }
}

impl Router {
    /// An attempt failed before anything was sent back: release its hold and exclude the endpoint.
    fn note_failed_attempt(&self, ctx: &mut Ctx, peer: &HttpPeer) {
        ctx.finish_hold();
        if let (Some(pool), Some(ep)) = (&ctx.pool, ctx.endpoint.take()) {
            ctx.tried.push(ep.id);
            self.metrics
                .retries_total
                .with_label_values(&[&*pool.name, &ep.label])
                .inc();
            log::warn!(
                "pool {} endpoint {}: attempt failed ({peer}); trying another endpoint",
                pool.name,
                ep.label
            );
        }
    }
}

/// Map a proxy error to a status and an OpenAI-style body.
fn classify_proxy_error(e: &Error) -> (u16, ApiError) {
    use ErrorType::*;
    match e.etype() {
        HTTPStatus(code) => (
            *code,
            ApiError::new(*code, "upstream_error", "http_error", "request failed"),
        ),
        _ => match e.esource() {
            ErrorSource::Upstream => match e.etype() {
                ConnectTimedout | ReadTimedout | WriteTimedout | TLSHandshakeTimedout => (
                    504,
                    ApiError::new(
                        504,
                        "upstream_error",
                        "upstream_timeout",
                        "the engine did not answer in time",
                    ),
                ),
                _ => (
                    502,
                    ApiError::new(
                        502,
                        "upstream_error",
                        "upstream_unreachable",
                        "the engine connection failed",
                    ),
                ),
            },
            ErrorSource::Downstream => match e.etype() {
                WriteError | ReadError | ConnectionClosed => (
                    0,
                    ApiError::new(
                        0,
                        "client_error",
                        "client_closed",
                        "client closed the connection",
                    ),
                ),
                ReadTimedout => (
                    408,
                    ApiError::new(
                        408,
                        "invalid_request_error",
                        "request_timeout",
                        "request body timed out",
                    ),
                ),
                _ => (
                    400,
                    ApiError::new(
                        400,
                        "invalid_request_error",
                        "bad_request",
                        "malformed request",
                    ),
                ),
            },
            ErrorSource::Internal | ErrorSource::Unset => (
                500,
                ApiError::new(
                    500,
                    "internal_error",
                    "internal_error",
                    "internal router error",
                ),
            ),
        },
    }
}
