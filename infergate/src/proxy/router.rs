//! The router's own steps on the request path, called from the hooks in `mod.rs`: placement, the upstream peer,
//! retries and failures, the answers it writes itself, reading the body; and the small header rules they use.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use pingora_core::upstreams::peer::HttpPeer;
use pingora_error::Result;
use pingora_http::{RequestHeader, ResponseHeader};
use pingora_proxy::Session;

use super::access;
use super::body::{self, BodyError, BodyLimits};
use super::Pinned;
use super::{Ctx, Router, UPSTREAM_IDLE_TIMEOUT};
use crate::errors::ApiError;
use crate::ledger::{ReleaseCause, ReleaseHook};
use crate::placement::policy::{PlaceRequest, Placement, Snapshot};
use crate::placement::{self, Reason};
use crate::pool::{Endpoint, Pool};
use crate::request::CallKind;
use crate::stored_responses::{self, Holder};

impl Router {
    pub(super) fn body_limits(&self) -> BodyLimits {
        let cfg = self.current();
        BodyLimits {
            max_bytes: cfg.max_body_bytes,
            deadline: cfg.timeouts.request_body,
            budget_wait: cfg.body_budget_wait,
        }
    }

    /// The pool for the body's model and the screened path (exposure.rs).
    pub(super) fn pool_for(&self, ctx: &Ctx) -> std::result::Result<Arc<Pool>, ApiError> {
        let target = ctx.target.as_ref().ok_or_else(ApiError::internal)?;
        let i = self
            .exposure
            .pool(&self.current(), ctx.scan.model.as_deref(), target)?;
        self.pools
            .pools
            .get(i)
            .cloned()
            .ok_or_else(ApiError::internal)
    }

    /// For a retrieval or cancel of a stored response (`/v1/responses/{id}`): the pool of the engine holding it,
    /// with the request pinned there, or a 404 when this router knows no holder. None for any other request.
    pub(super) async fn stored_response_pool(
        &self,
        ctx: &mut Ctx,
    ) -> Option<std::result::Result<Arc<Pool>, ApiError>> {
        let id = ctx.target.as_ref()?.stored_response_id()?.to_string();
        let found = self.response_holder(&id, None).await.and_then(|h| {
            let pool = self.pools.pools.iter().find(|p| p.name == h.pool)?.clone();
            has_endpoint(&pool, &h.endpoint).then_some((pool, h.endpoint))
        });
        Some(match found {
            Some((pool, endpoint)) => {
                ctx.pinned = Some(Pinned {
                    response_id: id,
                    endpoint,
                });
                Ok(pool)
            }
            None => Err(ApiError::response_not_found(&id)),
        })
    }

    /// A Responses API turn: pin it to the engine holding the response it continues (`previous_response_id`) when
    /// this router knows it and it is in the request's pool (else it is placed as any request: the engine answers
    /// if it does not have it), and note whether its own answer will be stored (`store` absent or true).
    pub(super) async fn pin_continued_response(&self, ctx: &mut Ctx, pool: &Pool) {
        let creates = ctx.kind == CallKind::Generate
            && ctx
                .target
                .as_ref()
                .is_some_and(|t| t.target.path == "/v1/responses");
        if !creates {
            return;
        }
        ctx.stores_response = ctx.scan.store != Some(false);
        let Some(prev) = ctx.scan.previous_response_id.as_deref() else {
            return;
        };
        if let Some(h) = self.response_holder(prev, Some(pool)).await {
            if h.pool == pool.name && has_endpoint(pool, &h.endpoint) {
                ctx.pinned = Some(Pinned {
                    response_id: prev.to_string(),
                    endpoint: h.endpoint,
                });
            }
        }
    }

    /// The engine holding stored response `id`: this replica's record, else the one another replica shared, else
    /// the engine that says it has it when asked (in `pool`, or in any pool when the request names none).
    async fn response_holder(&self, id: &str, pool: Option<&Pool>) -> Option<Holder> {
        if !crate::paths::is_valid_response_id(id) {
            return None;
        }
        if let Some(h) = self.stored_responses.lookup(id) {
            self.stored_responses.count_lookup("local");
            return Some(h);
        }
        let shared = match &self.cluster {
            Some(cluster) => cluster.lookup_response(id).await,
            None => None,
        };
        let (found, source) = match shared {
            Some(h) => (Some(h), "cluster"),
            None => match self.ask_engines(id, pool).await {
                Some(h) => {
                    if let Some(cluster) = &self.cluster {
                        cluster.share_response(id, &h);
                    }
                    (Some(h), "engine")
                }
                None => (None, "unknown"),
            },
        };
        self.stored_responses.count_lookup(source);
        let h = found?;
        self.stored_responses.record(id, h.clone());
        Some(h)
    }

    /// The available engine of `pool` (of every pool without one) that says it holds stored response `id`.
    async fn ask_engines(&self, id: &str, pool: Option<&Pool>) -> Option<Holder> {
        let pools: Vec<&Pool> = match pool {
            Some(p) => vec![p],
            None => self.pools.pools.iter().map(|p| &**p).collect(),
        };
        let candidates = pools
            .iter()
            .flat_map(|p| {
                let endpoints = p.endpoints();
                let gate = p.health_gate(&endpoints);
                endpoints
                    .iter()
                    .filter(|e| gate.available(e))
                    .cloned()
                    .collect::<Vec<_>>()
            })
            .map(|e| stored_responses::Candidate {
                api_key: e.api_key(),
                holder: Holder {
                    pool: e.pool.clone(),
                    endpoint: e.label.clone(),
                },
            })
            .collect();
        stored_responses::probe(id, candidates, stored_responses::PROBE_TIMEOUT).await
    }

    /// A stored response was created on this request's endpoint: remember it holds `id`, and tell the replicas.
    pub(super) fn remember_response(&self, ctx: &Ctx, id: String) {
        if let Some(ep) = &ctx.endpoint {
            let holder = Holder {
                pool: ep.pool.clone(),
                endpoint: ep.label.clone(),
            };
            if let Some(cluster) = &self.cluster {
                cluster.share_response(&id, &holder);
            }
            self.stored_responses.record(&id, holder);
        }
    }

    /// The endpoint's shared release callback: counts served estimates and janitor releases.
    pub(super) fn release_hook(&self, ep: &Arc<Endpoint>) -> ReleaseHook {
        ep.release_hook
            .get_or_init(|| {
                let metrics = self.metrics.clone();
                let (pool, label) = (ep.pool.clone(), ep.label.clone());
                let endpoint = Arc::downgrade(ep);
                Arc::new(move |tokens, served, cause| {
                    // A late release on a departed endpoint must not bring its deleted series back.
                    let Some(e) = endpoint.upgrade() else { return };
                    metrics.unless_removed(&e.removed, || {
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
                        }
                    });
                    if cause == ReleaseCause::Janitor {
                        log::warn!("pool {pool} endpoint {label}: janitor released {tokens} prefill tokens of an overdue request");
                    }
                })
            })
            .clone()
    }

    /// Write a JSON response the router answers itself.
    pub(super) async fn respond(
        &self,
        session: &mut Session,
        status: u16,
        body: Bytes,
        retry_after: Option<u32>,
    ) -> Result<()> {
        let mut resp = ResponseHeader::build(status, Some(4))?;
        resp.insert_header("content-type", "application/json")?;
        resp.insert_header("content-length", body.len().to_string())?;
        if let Some(secs) = retry_after {
            resp.insert_header("retry-after", secs.to_string())?;
        }
        access::echo_request_id(session, &mut resp)?;
        crate::cors::apply(
            &self.current().cors_allowed_origins,
            session.req_header(),
            &mut resp,
        )?;
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

    /// Answer a CORS preflight (`cors_allowed_origins` is on): 204 when the origin is allowed and the client port
    /// serves the method and path asked about, else the error the request itself would get (403 for the origin).
    pub(super) async fn answer_preflight(&self, session: &mut Session, method: &str) -> Result<()> {
        let cfg = self.current();
        let req = session.req_header();
        let refusal = match crate::cors::allow_origin(&cfg.cors_allowed_origins, req) {
            None => Some(ApiError::cors_origin_not_allowed()),
            Some(_) => match self.exposure.screen(method, req.raw_path()) {
                Err(e) => Some(e),
                Ok(_) => match crate::cors::requested_headers(req) {
                    crate::cors::RequestedHeaders::Malformed => {
                        Some(ApiError::cors_bad_request_headers())
                    }
                    _ => None,
                },
            },
        };
        if let Some(e) = refusal {
            return self.respond_error(session, &e).await;
        }
        let allow = crate::cors::allow_origin(&cfg.cors_allowed_origins, req).unwrap_or("*");
        let headers = match crate::cors::requested_headers(req) {
            crate::cors::RequestedHeaders::Names(h) => Some(h),
            _ => None,
        };
        let mut resp = crate::cors::preflight_answer(allow, method, headers)?;
        access::echo_request_id(session, &mut resp)?;
        self.metrics
            .router_responses_total
            .with_label_values(&["204"])
            .inc();
        session.write_response_header(Box::new(resp), true).await
    }

    pub(super) async fn respond_error(&self, session: &mut Session, e: &ApiError) -> Result<()> {
        self.respond(session, e.status, e.body(), e.retry_after)
            .await
    }

    pub(super) fn models_body(&self) -> Bytes {
        let data: Vec<_> = self
            .pools
            .model_names()
            .into_iter()
            .map(|m| serde_json::json!({"id": m, "object": "model", "owned_by": "infergate"}))
            .collect();
        Bytes::from(serde_json::json!({"object": "list", "data": data}).to_string())
    }

    /// One model as `GET /v1/models/{id}` answers it; None when no pool serves it.
    pub(super) fn model_body(&self, id: &str) -> Option<Bytes> {
        let known = self.pools.model_names().iter().any(|m| m == id);
        known.then(|| {
            Bytes::from(
                serde_json::json!({"id": id, "object": "model", "owned_by": "infergate"})
                    .to_string(),
            )
        })
    }

    /// Choose an endpoint for this attempt. None when no eligible endpoint exists.
    pub(super) fn place(
        &self,
        pool: &Pool,
        ctx: &Ctx,
        now: Instant,
    ) -> Option<(Arc<Endpoint>, Placement)> {
        let endpoints = pool.endpoints();
        let req = PlaceRequest {
            session_key: ctx.session_key.as_deref(),
            model: ctx.scan.model.as_deref().unwrap_or(""),
            prompt: &ctx.scan.prompt,
            conversation_at: ctx.scan.conversation_at,
            body_bytes: ctx.prompt_bytes(&pool.cfg().prefill),
        };
        if let Some(pin) = &ctx.pinned {
            // Only this endpoint has the stored response: there or nowhere (the caller answers 503).
            let i = endpoints.iter().position(|e| e.label == pin.endpoint)?;
            let ep = &endpoints[i];
            if !pool.health_gate(&endpoints).available(ep) || ctx.tried.contains(&ep.id) {
                return None;
            }
            let placement = Placement::whole(i, Reason::StoredResponse, &req);
            return Some((ep.clone(), placement));
        }
        let cands = pool.candidates(&endpoints, &ctx.tried, now);
        let ids: Vec<u64> = endpoints.iter().map(|e| e.id).collect();
        let mut rng = fastrand::Rng::new();
        let placement = if ctx.kind == CallKind::Generate {
            let snap = Snapshot {
                cands: &cands,
                ids: &ids,
                now,
            };
            let p = pool.policy.place(&req, &snap, &mut rng)?;
            match self.below_limit(pool, &cands, p.index) {
                Some(room) => {
                    let snap = Snapshot {
                        cands: &room,
                        ..snap
                    };
                    pool.policy.place(&req, &snap, &mut rng).unwrap_or(p)
                }
                None => p,
            }
        } else {
            // Passive calls go to the least busy endpoint and count as no placement.
            let i = placement::least_request(&cands, &mut rng)?;
            Placement::whole(i, Reason::LeastRequest, &req)
        };
        Some((endpoints[placement.index].clone(), placement))
    }

    /// The same endpoint again for a fresh-connection retry, if it can still take work.
    pub(super) fn same_endpoint(&self, pool: &Pool, id: u64) -> Option<Arc<Endpoint>> {
        let endpoints = pool.endpoints();
        let gate = pool.health_gate(&endpoints);
        endpoints
            .iter()
            .find(|e| e.id == id && gate.available(e))
            .cloned()
    }

    pub(super) fn estimate(&self, pool: &Pool, bytes: u64) -> u64 {
        let prefill = pool.cfg().prefill;
        placement::estimate_tokens(bytes, prefill.bytes_per_token, prefill.max_tokens)
    }

    pub(super) fn peer(&self, ep: &Endpoint, fresh: bool) -> HttpPeer {
        let mut peer = HttpPeer::new(ep.addr(), false, String::new());
        let t = self.current().timeouts;
        peer.options.connection_timeout = Some(t.connect);
        // Per read, not per response (pingora-notes.md): the longest legitimate silence is the wait for the first
        // byte (prefill), bounded by response_header, or a gap between chunks, bounded by stream_idle.
        peer.options.read_timeout = Some(t.response_header.max(t.stream_idle));
        peer.options.write_timeout = Some(t.stream_idle);
        peer.options.idle_timeout = Some(UPSTREAM_IDLE_TIMEOUT);
        if fresh {
            // A group of its own: no pooled connection matches, so this attempt connects anew.
            peer.group_key = fastrand::u64(1..);
        }
        peer
    }

    /// An attempt failed before the engine could have started the work: release its hold, remember the endpoint.
    pub(super) fn note_failed_attempt(&self, ctx: &mut Ctx, why: &str) {
        ctx.finish_hold();
        if let (Some(pool), Some(ep)) = (&ctx.pool, ctx.endpoint.take()) {
            ctx.tried.push(ep.id);
            self.metrics.unless_removed(&ep.removed, || {
                self.metrics
                    .retries_total
                    .with_label_values(&[&*pool.name, &ep.label])
                    .inc();
            });
            log::warn!(
                "pool {} endpoint {}: {why}; trying another endpoint",
                pool.name,
                ep.label
            );
            ctx.last_endpoint = Some(ep);
        }
    }

    /// Count a failure of the attempt's endpoint for outlier detection (and the ejection it may cause).
    pub(super) fn record_failure(&self, ctx: &Ctx) {
        if let (Some(pool), Some(ep)) = (&ctx.pool, &ctx.endpoint) {
            if pool.record_failure(ep, Instant::now()).is_some() {
                self.metrics.unless_removed(&ep.removed, || {
                    self.metrics
                        .ejections_total
                        .with_label_values(&[&*pool.name, &ep.label])
                        .inc();
                });
            }
        }
    }

    /// Retries left for this request (the fresh-connection retry on the same endpoint is not counted).
    pub(super) fn retries_left(&self, ctx: &Ctx) -> bool {
        ctx.tried.len() < self.current().max_retries
    }

    /// Read the whole body; Ok(false) when the router has answered (or the client is gone).
    pub(super) async fn take_body(&self, session: &mut Session, ctx: &mut Ctx) -> Result<bool> {
        let content_length = match content_length(session.req_header()) {
            Ok(n) => n,
            Err(e) => {
                self.respond_error(session, &e).await?;
                return Ok(false);
            }
        };
        let max_body_bytes = self.current().max_body_bytes;
        if let Some(n) = content_length.filter(|&n| n > max_body_bytes as u64) {
            let e = ApiError::body_too_large(max_body_bytes, Some(n));
            self.respond_error(session, &e).await?;
            return Ok(false);
        }
        if session.as_downstream_mut().is_body_empty() {
            return Ok(true);
        }
        if expects_continue(session.req_header()) {
            // The client waits for this before sending the body (curl: one second).
            session
                .as_downstream_mut()
                .write_continue_response()
                .await?;
        }
        match body::read_whole(
            session,
            content_length,
            self.body_limits(),
            &self.body_budget,
        )
        .await
        {
            Ok(held) => {
                ctx.body = Some(held);
                Ok(true)
            }
            Err(BodyError::Answer(e)) => {
                self.respond_error(session, &e).await?;
                Ok(false)
            }
            Err(BodyError::ClientGone(e)) => Err(e),
        }
    }
}

/// Whether `pool` still has the endpoint `label` (a reload may have removed the engine holding a response).
fn has_endpoint(pool: &Pool, label: &str) -> bool {
    pool.endpoints().iter().any(|e| e.label == label)
}

/// When a non-streaming request's tokens are released: its response starts only when generation ends, so at the
/// estimated prefill end; before a speed is learned, just before the janitor would (an ordinary long generation
/// is no overdue request, and must not be logged as one).
pub(super) fn non_streaming_release(
    estimated_prefill: Option<Duration>,
    t: &crate::config::Timeouts,
) -> Duration {
    let janitor_age = t.response_header + t.stream_idle;
    estimated_prefill.unwrap_or(janitor_age.saturating_sub(janitor_age / 10))
}

pub(super) fn remove_if_present(req: &mut RequestHeader, name: &str) {
    if req.headers.contains_key(name) {
        req.remove_header(name);
    }
}

/// The validated `Content-Length`: None for chunked bodies; several identical headers count as one.
pub(super) fn content_length(req: &RequestHeader) -> std::result::Result<Option<u64>, ApiError> {
    let mut value = None;
    for v in req.headers.get_all(http::header::CONTENT_LENGTH) {
        let n = v
            .to_str()
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
            .ok_or_else(ApiError::invalid_content_length)?;
        if value.is_some_and(|prev| prev != n) {
            return Err(ApiError::invalid_content_length());
        }
        value = Some(n);
    }
    Ok(value)
}

pub(super) fn expects_continue(req: &RequestHeader) -> bool {
    req.headers
        .get(http::header::EXPECT)
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"100-continue"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(headers: &[(&str, &str)]) -> RequestHeader {
        let mut r = RequestHeader::build("POST", b"/v1/chat/completions", None).unwrap();
        for (k, v) in headers {
            r.append_header(k.to_string(), *v).unwrap();
        }
        r
    }

    #[test]
    fn content_length_is_validated_and_duplicates_must_agree() {
        assert_eq!(content_length(&req(&[])), Ok(None));
        assert_eq!(
            content_length(&req(&[("content-length", "12")])),
            Ok(Some(12))
        );
        assert_eq!(
            content_length(&req(&[("content-length", "12"), ("content-length", "12")])),
            Ok(Some(12))
        );
        assert!(
            content_length(&req(&[("content-length", "12"), ("content-length", "13")])).is_err()
        );
        assert!(content_length(&req(&[("content-length", "x")])).is_err());
    }

    #[test]
    fn non_streaming_holds_release_before_the_janitor_looks() {
        let t = crate::config::Timeouts::default();
        let janitor_age = t.response_header + t.stream_idle;
        assert!(non_streaming_release(None, &t) < janitor_age);
        let short = crate::config::Timeouts {
            response_header: Duration::from_millis(300),
            stream_idle: Duration::from_millis(300),
            ..t
        };
        assert!(non_streaming_release(None, &short) < Duration::from_millis(600));
        let d = Duration::from_millis(1500);
        assert_eq!(non_streaming_release(Some(d), &t), d);
    }

    #[test]
    fn expect_continue_is_recognised() {
        assert!(expects_continue(&req(&[("expect", "100-Continue")])));
        assert!(!expects_continue(&req(&[])));
    }
}
