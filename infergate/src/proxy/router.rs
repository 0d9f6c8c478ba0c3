//! The router's own steps on the request path, called from the hooks: placement, the upstream peer, retries and
//! failures, reading the body; and the small header rules they use.

use std::sync::Arc;
use std::time::{Duration, Instant};

use pingora_core::upstreams::peer::HttpPeer;
use pingora_error::Result;
use pingora_http::RequestHeader;
use pingora_proxy::Session;

use super::body::{self, BodyError, BodyLimits};
use super::ctx::Learned;
use super::{Ctx, Router};
use crate::config::UPSTREAM_IDLE_TIMEOUT;
use crate::errors::ApiError;
use crate::ledger::{ReleaseCause, ReleaseHook};
use crate::placement::policy::{PlaceRequest, Placement, Snapshot};
use crate::placement::{self, Reason};
use crate::pool::{Endpoint, Pool, PrefillSample};
use crate::request::CallKind;

/// Whom a placement is for: the request's own attempt, or its prefill leg (prefill_leg), each with the endpoints it
/// already failed on and the session key its pool's `sessions` give.
#[derive(Clone, Copy)]
pub(super) struct Leg<'a> {
    pub(super) tried: &'a [u64],
    pub(super) session_key: Option<&'a [u8]>,
}

impl<'a> Leg<'a> {
    /// The request's own attempt.
    pub(super) fn of(ctx: &'a Ctx) -> Leg<'a> {
        Leg {
            tried: &ctx.tried,
            session_key: ctx.session_key.as_deref(),
        }
    }
}

/// A placement and where it goes.
pub(super) struct Placed {
    pub(super) ep: Arc<Endpoint>,
    pub(super) placement: Placement,
    /// Tokens the endpoint's KV index said it holds of a generate request.
    pub(super) kv_held: Option<u64>,
}

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

    /// Choose an endpoint of `pool` for this attempt of `leg` (no side effects: `note_kv_dispatch` once it is
    /// dispatched). None when no eligible endpoint exists.
    pub(super) fn place(
        &self,
        pool: &Pool,
        ctx: &Ctx,
        leg: Leg<'_>,
        now: Instant,
    ) -> Option<Placed> {
        let endpoints = pool.endpoints();
        let req = PlaceRequest {
            session_key: leg.session_key,
            model: ctx.scan.model.as_deref().unwrap_or(""),
            prompt: &ctx.scan.prompt,
            conversation_at: ctx.scan.conversation_at,
            body_bytes: ctx.prompt_bytes(&pool.cfg().prefill),
            tokens: ctx.prompt_tokens.as_ref().map(|t| t.count),
            output_tokens: pool.answers.expected(ctx.scan.max_tokens),
            ttft_budget: ctx.budget.map(|b| b.seconds()),
        };
        if let Some(pin) = &ctx.pinned {
            // Only this endpoint has the stored response: there or nowhere (the caller answers 503).
            let i = endpoints.iter().position(|e| e.label == pin.endpoint)?;
            let ep = &endpoints[i];
            if !pool.health_gate(&endpoints).available(ep) || leg.tried.contains(&ep.id) {
                return None;
            }
            let placement = Placement::whole(i, Reason::StoredResponse, &req);
            return Some(Placed {
                ep: ep.clone(),
                placement,
                kv_held: None,
            });
        }
        let mut cands = pool.candidates(&endpoints, leg.tried, now);
        if ctx.prefill.is_some() {
            // A decode leg: an engine whose KV cache is full would preempt to take the pulled prompt.
            placement::decode_leg::spare_full_kv(&mut cands);
        }
        if let Some(tokens) = &ctx.prompt_tokens {
            pool.fill_kv_held(&endpoints, &mut cands, &tokens.ids, now);
        }
        let ids: Vec<u64> = endpoints.iter().map(|e| e.id).collect();
        let mut rng = fastrand::Rng::new();
        let mut placement = if ctx.kind == CallKind::Generate {
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
        let ep = endpoints.get(placement.index)?.clone();
        let held = cands.get(placement.index).and_then(|c| c.kv_held_tokens);
        if let (CallKind::Generate, Some(held)) = (ctx.kind, held) {
            placement.estimate_tokens =
                placement::uncached_by_kv(placement.estimate_tokens, req.tokens, held);
        }
        Some(Placed {
            ep,
            placement,
            kv_held: held.filter(|_| ctx.kind == CallKind::Generate),
        })
    }

    /// A generate placement is being dispatched to `p.ep`: its engine will publish what it stores (the KV index's
    /// silence clock starts) and what the index said it holds is counted.
    pub(super) fn note_kv_dispatch(&self, p: &Placed, now: Instant) {
        p.ep.kv.note_dispatch(now);
        if let Some(held) = p.kv_held {
            p.ep.kv
                .counters
                .predicted_cached_tokens
                .fetch_add(held, std::sync::atomic::Ordering::Relaxed);
        }
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

    /// The prefill tokens a placement holds: its exact tokens when the request was counted, else its bytes over
    /// `bytes_per_token`; capped at `prefill.max_tokens` either way.
    pub(super) fn placed_tokens(&self, pool: &Pool, p: &Placement) -> u64 {
        match p.estimate_tokens {
            Some(t) => t.min(pool.cfg().prefill.max_tokens),
            None => self.estimate(pool, p.estimate_bytes),
        }
    }

    /// The whole prompt's tokens, for the client key's token limits: exact or estimated as `placed_tokens`.
    pub(super) fn prompt_tokens(&self, pool: &Pool, ctx: &Ctx) -> u64 {
        let prefill = pool.cfg().prefill;
        match &ctx.prompt_tokens {
            Some(t) => t.count.min(prefill.max_tokens),
            None => self.estimate(pool, ctx.prompt_bytes(&prefill)),
        }
    }

    /// Count a generate request's prompt tokens when its pool has a tokenizer (off the async threads; a body
    /// that cannot be counted is estimated from bytes, and counted as a fallback).
    pub(super) async fn count_tokens(&self, pool: &Pool, ctx: &mut Ctx) {
        if ctx.kind != CallKind::Generate {
            return;
        }
        let (Some(tok), Some(body)) = (pool.cfg().tokenizer.clone(), &ctx.body) else {
            return;
        };
        let api = ctx
            .target
            .as_ref()
            .and_then(|t| crate::tokens::Api::of_path(&t.target.path));
        let body = body.bytes.clone();
        ctx.prompt_tokens = self
            .tokens
            .count(&pool.name, tok.model, api, body, tok.max_bytes)
            .await;
    }

    pub(super) fn peer(&self, ep: &Endpoint, fresh: bool) -> HttpPeer {
        let target = ep.target();
        let mut peer = match &target.tls {
            None => HttpPeer::new(target.addr, false, String::new()),
            Some(tls) => {
                let mut peer = HttpPeer::new(target.addr, true, tls.server_name.clone());
                peer.options.ca.clone_from(&tls.ca);
                // HTTP/1.1 as to plain engines (vLLM's server speaks no HTTP/2 over TLS by default).
                peer.options.alpn = pingora_core::protocols::ALPN::H1;
                peer
            }
        };
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
        if let Some(t) = &mut ctx.trace {
            t.attempt_failed(why);
        }
        if let (Some(pool), Some(ep)) = (&ctx.pool, ctx.endpoint.take()) {
            ctx.tried.push(ep.id);
            self.retried(pool, &ep, why);
            ctx.last_endpoint = Some(ep);
        }
    }

    /// A request of `pool` sent again after an attempt on `ep`: `infergate_retries_total`.
    pub(super) fn count_retry(&self, pool: &str, ep: &Endpoint) {
        self.metrics.unless_removed(&ep.removed, || {
            self.metrics
                .retries_total
                .with_label_values(&[pool, &ep.label])
                .inc();
        });
    }

    /// An attempt of `pool` failed on `ep` and goes elsewhere: counted and logged.
    pub(super) fn retried(&self, pool: &Pool, ep: &Endpoint, why: &str) {
        self.count_retry(&pool.name, ep);
        log::warn!(
            "pool {} endpoint {}: {why}; trying another endpoint",
            pool.name,
            ep.label
        );
    }

    /// Count a failure the engine owns against the attempt's endpoint (once per attempt), with the attempt's
    /// tokens as its debt; outlier detection may eject it.
    pub(super) fn record_failure(&self, ctx: &mut Ctx, kind: &'static str) {
        if std::mem::replace(&mut ctx.attempt.failed, true) {
            return;
        }
        if let (Some(pool), Some(ep)) = (&ctx.pool, &ctx.endpoint) {
            let tokens = ctx.hold.as_ref().map_or(0, |h| h.estimate());
            count_failure(&self.metrics, pool, ep, kind, tokens);
        }
    }

    /// The client left before the engine answered: before its headers, or a stream's before its first output
    /// (see [`Router::abandoned`]).
    pub(super) fn record_abandoned(&self, ctx: &Ctx) {
        let (Some(pool), Some(ep)) = (&ctx.pool, &ctx.endpoint) else {
            return;
        };
        let now = Instant::now();
        let waited = ctx
            .attempt
            .dispatched_at
            .map_or(Duration::ZERO, |t| now.saturating_duration_since(t));
        let (tokens, late) = ctx
            .hold
            .as_ref()
            .map_or((0, false), |h| (h.estimate(), h.was_late()));
        // After a stream's headers, its first output is due after the prefill ahead of it and its own: a client
        // that leaves a long prefill is no evidence until it has waited twice what the endpoint's speed predicts.
        let due = match ctx.attempt.upstream_status {
            Some(_) => ep
                .prefill_speed
                .estimate(ep.load.prefill_tokens().saturating_add(tokens))
                .map_or(Duration::ZERO, |d| d.saturating_mul(2)),
            None => Duration::ZERO,
        };
        self.abandoned(
            pool,
            ep,
            tokens,
            waited.checked_sub(due).unwrap_or_default(),
            late,
        );
    }

    /// A client left `waited` after its request (of `tokens` prefill) went to `ep`, which had not answered (beyond
    /// the time its answer was due): no fault of the engine's proven, but the request keeps weighing on the
    /// endpoint until it serves again (a wedged engine must not look idle). When the client had waited
    /// `outlier_detection.stream_headers_within` for any answer, streamed or not, it counts toward
    /// [`crate::outlier::UNANSWERED_IN_A_ROW`], after which the endpoint is set aside as a hung stream sets it (a
    /// non-streamed request sends no headers until its answer ends, and a wedged vLLM still sends a stream's, so
    /// only the client's leaving can tell). `late`: a stream whose overdue headers were counted already.
    pub(super) fn abandoned(
        &self,
        pool: &Pool,
        ep: &Endpoint,
        tokens: u64,
        waited: Duration,
        late: bool,
    ) {
        let cfg = &pool.cfg().outlier;
        let now = Instant::now();
        ep.outlier.record_abandoned(cfg, now, tokens);
        if cfg.stream_headers_within.is_zero() || late || waited < cfg.stream_headers_within {
            return;
        }
        if ep.outlier.record_unanswered(cfg, now) {
            log::warn!(
                "pool {} endpoint {}: {} requests in a row got no answer within {} before their clients left; \
                 counted as a failure, set aside while others can take the work",
                pool.name,
                ep.label,
                crate::outlier::UNANSWERED_IN_A_ROW,
                humantime::format_duration(cfg.stream_headers_within)
            );
            count_failure(
                &self.metrics,
                pool,
                ep,
                crate::metrics::FAILURE_UNANSWERED,
                0,
            );
        }
    }

    /// A streamed generation's response headers are due within `outlier_detection.stream_headers_within`: past
    /// it, the janitor counts a failure and sets the endpoint aside (`outlier::Outlier::record_hung`).
    pub(super) fn watch_headers(&self, ctx: &Ctx, now: Instant) {
        let (Some(pool), Some(ep), Some(hold)) = (&ctx.pool, &ctx.endpoint, &ctx.hold) else {
            return;
        };
        let within = pool.cfg().outlier.stream_headers_within;
        if within.is_zero() || !ctx.is_stream() || ctx.kind != CallKind::Generate {
            return;
        }
        let (metrics, pool, ep) = (self.metrics.clone(), pool.clone(), ep.clone());
        hold.headers_due(
            now + within,
            Arc::new(move |tokens| {
                log::warn!(
                    "pool {} endpoint {}: no response headers for a stream within {}; counted as a failure",
                    pool.name,
                    ep.label,
                    humantime::format_duration(within)
                );
                ep.outlier
                    .record_hung(&pool.cfg().outlier, Instant::now());
                count_failure(&metrics, &pool, &ep, crate::metrics::FAILURE_NO_HEADERS, tokens);
            }),
        );
    }

    /// Apply what the attempt taught once the request has ended: a success clears the endpoint's failures, a
    /// stream's prefill speed is learned unless the engine failed it, and its decode speed and answer length when
    /// it ended well.
    pub(super) fn settle(&self, ctx: &mut Ctx, e: Option<&pingora_error::Error>) {
        let (Some(pool), Some(ep)) = (&ctx.pool, &ctx.endpoint) else {
            return;
        };
        if ctx.attempt.failed {
            return;
        }
        let answered = ctx.attempt.upstream_status.is_some_and(|s| s < 500);
        if e.is_none() && answered {
            pool.record_success(ep, Instant::now());
        }
        let now = Instant::now();
        let decode = if e.is_none()
            && ctx
                .attempt
                .upstream_status
                .is_some_and(|s| (200..300).contains(&s))
        {
            let peers = ep.peers.get().0;
            let elsewhere = peers + ep.stats.fresh(now).map_or(0, |l| l.foreign_beyond(peers));
            ctx.attempt
                .timing
                .sample(elsewhere, ctx.attempt.reported.count())
        } else {
            None
        };
        let prefill = ctx
            .attempt
            .learned
            .take()
            .map(|l| self.prefill_sample(ep, l));
        if prefill.is_some() || decode.is_some() {
            pool.learn_stream(ep, prefill, decode, now);
        }
    }

    /// What a prefill that ended well teaches `ep` of `pool` (a prefill leg's, which has no decode to time).
    pub(super) fn learn(&self, pool: &Pool, ep: &Endpoint, l: Learned) {
        let sample = self.prefill_sample(ep, l);
        pool.learn_stream(ep, Some(sample), None, Instant::now());
    }

    /// A prefill's sample: its tokens and time to first token, and for predicted_ttft the prefill that was ahead
    /// (ahead plus this one's over the wait is the throughput it predicts with); how far off its prediction was is
    /// observed here.
    fn prefill_sample(&self, ep: &Endpoint, l: Learned) -> PrefillSample {
        if let Some((Some(p), _)) = l.prediction {
            self.metrics.observe_ttft_prediction(ep.series(), p, l.ttft);
        }
        PrefillSample {
            tokens: l.tokens,
            ahead: l.prediction.map(|(_, ahead)| ahead),
            ttft: l.ttft,
        }
    }

    /// A generate request's placement: counted by reason, shown on the status page, told to the policy.
    pub(super) fn count_placement(&self, pool: &Pool, ep: &Endpoint, p: &Placement, now: Instant) {
        self.metrics.count_placement(ep.series(), p.reason);
        pool.recent.record(ep.id, p.reason, now);
        pool.policy.dispatched(ep.id, &p.ticket, now);
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

/// Count an engine-owned failure of `ep` (`infergate_endpoint_failures_total{kind}`) and the ejection it may
/// cause.
pub(super) fn count_failure(
    metrics: &crate::metrics::Metrics,
    pool: &Pool,
    ep: &Endpoint,
    kind: &str,
    tokens: u64,
) {
    let ejected = pool.record_failure(ep, Instant::now(), tokens).is_some();
    metrics.unless_removed(&ep.removed, || {
        let l = [&*pool.name, ep.label.as_str()];
        metrics
            .failures_total
            .with_label_values(&[l[0], l[1], kind])
            .inc();
        if ejected {
            metrics.ejections_total.with_label_values(&l).inc();
        }
    });
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

/// The validated `Content-Length`: None for chunked bodies; several identical headers count as one.
pub(super) fn content_length(req: &RequestHeader) -> std::result::Result<Option<u64>, ApiError> {
    let mut value = None;
    for v in req.headers.get_all(http::header::CONTENT_LENGTH) {
        let n = decimal(v.as_bytes()).ok_or_else(ApiError::invalid_content_length)?;
        if value.is_some_and(|prev| prev != n) {
            return Err(ApiError::invalid_content_length());
        }
        value = Some(n);
    }
    Ok(value)
}

/// A length as `str::parse::<u64>` reads it from the trimmed value, without validating the value as text first.
fn decimal(v: &[u8]) -> Option<u64> {
    let v = v.trim_ascii();
    let digits = v.strip_prefix(b"+").unwrap_or(v);
    if digits.is_empty() {
        return None;
    }
    digits.iter().try_fold(0u64, |n, &b| {
        b.is_ascii_digit()
            .then(|| n.checked_mul(10)?.checked_add(u64::from(b - b'0')))
            .flatten()
    })
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
        // Read as `str::parse::<u64>` reads the trimmed text.
        for v in [
            "0",
            "12",
            "+12",
            "007",
            "18446744073709551615",
            "",
            "+",
            "-1",
            "1 2",
            "1_0",
            "18446744073709551616",
            "١٢",
        ] {
            let want = v.trim().parse::<u64>().ok();
            assert_eq!(decimal(v.as_bytes()), want, "{v:?}");
        }
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
