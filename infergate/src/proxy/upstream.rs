//! One forwarding attempt: the queue and the placement, the request the engine gets, and the head of its answer.

use std::sync::Arc;
use std::time::Instant;

use pingora_core::upstreams::peer::HttpPeer;
use pingora_error::{Error, ErrorType, Result};
use pingora_http::{RequestHeader, ResponseHeader};
use pingora_proxy::Session;

use crate::errors::ApiError;

use super::ctx::Attempt;
use super::router::{non_streaming_release, Leg};
use super::Ctx;
use super::{first_output, reported_tokens, token_events, Router};
use crate::admission::X_API_KEY;
use crate::forwarded;
use crate::header_case::Headers;
use crate::ledger::ReleaseCause;
use crate::pool::Pool;
use crate::request::CallKind;

static TRACEPARENT: http::HeaderName = http::HeaderName::from_static("traceparent");

impl Router {
    pub(super) async fn choose_peer(
        &self,
        session: &mut Session,
        ctx: &mut Ctx,
    ) -> Result<Box<HttpPeer>> {
        let Some(pool) = ctx.pool.clone() else {
            return Error::e_explain(ErrorType::InternalError, "no pool chosen");
        };
        // A retry: the previous attempt's hold was finished when it failed.
        ctx.finish_hold();
        // A disaggregated pool: the prefill leg first (once), then this attempt is the decode leg.
        self.prefill_first(session, &pool, ctx).await?;
        let path = ctx.target.as_ref().map_or("", |t| t.target.path.as_str());
        let preamble = if ctx.is_stream() {
            first_output::preamble_events(path)
        } else {
            0
        };
        ctx.attempt = Attempt {
            preamble: first_output::Preamble::new(preamble),
            tokens: token_events::TokenEvents::for_path(path),
            reported: reported_tokens::ReportedTokens::for_path(path),
            ..Attempt::default()
        };
        loop {
            // Held until this attempt's hold exists.
            let _turn = self.wait_turn(session, &pool, ctx).await?;
            if let (Some(cluster), CallKind::Generate) = (&self.cluster, ctx.kind) {
                // What the other replicas dispatched since their last publish (bounded wait).
                cluster.refresh_peer_load(&pool).await;
            }
            if let Some(peer) = self.place_and_hold(&pool, ctx)? {
                return Ok(peer);
            }
            // No endpoint's predicted time to first token fits the request's budget yet: wait at the router.
            drop(_turn);
            self.budget_nap(session).await?;
        }
    }

    /// Place this attempt and take its hold; Ok(None) when the request is to wait for its TTFT budget.
    fn place_and_hold(&self, pool: &Arc<Pool>, ctx: &mut Ctx) -> Result<Option<Box<HttpPeer>>> {
        // From the snapshot to the hold (no await in between): concurrent placements see each other's holds.
        let _placing = pool.placing.lock();
        let now = Instant::now();

        let fresh = ctx.fresh_retry.take();
        let same = fresh.and_then(|id| self.same_endpoint(pool, id));
        let (ep, fresh) = match (same, ctx.placement.take()) {
            (Some(ep), Some(placement)) => {
                ctx.placement = Some(placement);
                (ep, true)
            }
            (_, previous) => {
                let Some(placed) = self.place(pool, ctx, Leg::of(ctx), now) else {
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
                if !self.within_budget(pool, ctx, &placed.placement, now)? {
                    ctx.placement = previous;
                    return Ok(None);
                }
                let generating = ctx.kind == CallKind::Generate;
                let (ep, placement) = (&placed.ep, &placed.placement);
                if generating {
                    self.note_kv_dispatch(&placed, now);
                    self.count_placement(pool, ep, placement, now);
                }
                ctx.placement = Some(placed.placement);
                (placed.ep, false)
            }
        };

        // A decode leg computes no prompt: its load is its request (prefill_leg held the prefill set's tokens).
        let counts_tokens =
            ctx.kind == CallKind::Generate && pool.policy.counts_tokens() && ctx.prefill.is_none();
        let tokens = match &ctx.placement {
            Some(p) if counts_tokens => self.placed_tokens(pool, p),
            _ => 0,
        };
        let reserving = self.cluster.as_ref().map(|c| c.reserving());
        let mut hold = self
            .ledger
            .hold(ep.load.clone(), tokens, self.release_hook(&ep));
        if let Some(r) = reserving {
            r.reserve(&ep, tokens);
        }
        self.wake_queue_on_finish(pool, &mut hold);
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
        self.trace_attempt(ctx, &ep, fresh, tokens);
        let peer = self.peer(&ep, fresh);
        ctx.endpoint = Some(ep);
        self.watch_headers(ctx, now);
        Ok(Some(Box::new(peer)))
    }

    pub(super) async fn edit_upstream_request(
        &self,
        session: &mut Session,
        req: &mut RequestHeader,
        ctx: &mut Ctx,
    ) -> Result<()> {
        let peer = forwarded::peer_ip(session.client_addr());
        let cfg = self.current();
        // Every header edit in one pass over the map itself (header_case).
        crate::header_case::edit_request(req, |h| {
            upstream_headers(h, ctx, peer, &cfg.trusted_proxies)
        })?;
        if let Some(t) = &ctx.target {
            t.set_upstream_target(req)?;
        }
        Ok(())
    }

    pub(super) async fn on_upstream_head(
        &self,
        resp: &mut ResponseHeader,
        ctx: &mut Ctx,
    ) -> Result<()> {
        let status = resp.status.as_u16();
        if status == 101 {
            // The router never asks for an upgrade (framing refuses it, and an h2c offer is not passed on): an engine
            // switching protocols unasked would hand the client a raw tunnel.
            self.record_failure(ctx, "protocol");
            ctx.release_prefill(ReleaseCause::Aborted);
            return Err(Error::explain(
                ErrorType::InvalidHTTPHeader,
                "engine answered 101 Switching Protocols to an API call",
            )
            .into_up());
        }
        if status < 200 {
            return Ok(()); // informational
        }
        ctx.attempt.upstream_status = Some(status);
        if let Some(t) = &mut ctx.trace {
            t.attempt_status(status);
        }
        let (Some(pool), Some(ep)) = (ctx.pool.clone(), ctx.endpoint.clone()) else {
            return Ok(());
        };
        let now = Instant::now();
        if (200..300).contains(&status) {
            if let Some(h) = &ctx.hold {
                // Headers arrive before prefill (vLLM): tokens stay held until the first body byte.
                h.mark_served();
            }
            pool.policy.served(ep.id, ctx.ticket(), now);
            if let Some(cluster) = &self.cluster {
                let sessions = pool.policy.sessions();
                if let Some(saved) = sessions.and_then(|s| s.served_binding(ctx.ticket(), now)) {
                    // Before the client has the answer (bounded): its next turn, anywhere, finds the binding.
                    cluster.store_binding(&pool, &saved).await;
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
                self.record_failure(ctx, "status_5xx");
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
            self.record_failure(ctx, "status_5xx");
        }
        // A 4xx is the client's: the engine works (`settle` counts the success once the answer has ended).
        Ok(())
    }
}

/// The headers an engine gets: Host, the engine's key (never the client's), one Content-Length for the held
/// body, no hop-by-hop headers, the client-address headers and the attempt's traceparent.
fn upstream_headers(
    h: &mut dyn Headers,
    ctx: &Ctx,
    peer: Option<std::net::IpAddr>,
    trusted: &[crate::config::Cidr],
) -> Result<()> {
    let mut client_authorization = false;
    if let Some(ep) = &ctx.endpoint {
        if h.map().get(http::header::HOST) != Some(&ep.label_value) {
            h.set(&http::header::HOST, ep.label_value.clone())?;
        }
        match ep.api_key() {
            Some(key) => {
                let mut v = value(format!("Bearer {key}"))?;
                // Kept out of every Debug print of the request (Pingora's, ours).
                v.set_sensitive(true);
                h.set(&http::header::AUTHORIZATION, v)?
            }
            // The client's key is for the router, never for the engine.
            None => client_authorization = true,
        }
    }
    let held_body = ctx.body.is_some();
    // One pass over the client's header names: the hop-by-hop headers (the client's connection is not the
    // engine's: Connection, Upgrade (an ignored h2c offer), Keep-Alive, TE, Proxy-Authorization and whatever
    // Connection names); its Anthropic-style key is for the router too; the router answered `Expect` itself and
    // holds the whole body (sent with one exact length, no Transfer-Encoding); it reads the start of answers (the
    // first output, a stored response's id): plain bytes, always.
    crate::framing::strip_hop_by_hop(h, |name| {
        (client_authorization && *name == http::header::AUTHORIZATION)
            || *name == X_API_KEY
            || *name == http::header::EXPECT
            || *name == http::header::ACCEPT_ENCODING
            || (held_body && *name == http::header::TRANSFER_ENCODING)
    });
    if let Some(b) = &ctx.body {
        let len = b.bytes.len();
        let mut sent = h.map().get_all(http::header::CONTENT_LENGTH).iter();
        // Compared as digits: building the value to compare allocates on every request.
        let exact =
            matches!((sent.next(), sent.next()), (Some(v), None) if is_decimal(v.as_bytes(), len));
        if !exact {
            h.set(&http::header::CONTENT_LENGTH, http::HeaderValue::from(len))?;
        }
    }
    forwarded::apply(h, peer, trusted)?;
    if let Some(t) = &ctx.trace {
        // The engine continues the trace under this attempt (vLLM: --otlp-traces-endpoint).
        h.set(&TRACEPARENT, value(t.traceparent())?)?;
    }
    Ok(())
}

/// Whether `v` is `n` written in decimal, as `HeaderValue::from(n)` writes it (no sign, no leading zero).
fn is_decimal(v: &[u8], mut n: usize) -> bool {
    let mut digits = v.iter().rev();
    loop {
        if digits.next() != Some(&(b'0' + (n % 10) as u8)) {
            return false;
        }
        n /= 10;
        if n == 0 {
            return digits.next().is_none();
        }
    }
}

/// A header value the router built (a key, a trace id), without copying it.
fn value(v: String) -> Result<http::HeaderValue> {
    http::HeaderValue::from_maybe_shared(bytes::Bytes::from(v))
        .map_err(|_| Error::explain(ErrorType::InvalidHTTPHeader, "invalid header value"))
}

#[cfg(test)]
mod tests {
    use super::is_decimal;

    #[test]
    fn digits_compare_as_the_header_value_would() {
        for n in [0usize, 7, 10, 81, 1_048_576, usize::MAX] {
            let v = http::HeaderValue::from(n);
            assert!(is_decimal(v.as_bytes(), n), "{n}");
            assert!(!is_decimal(v.as_bytes(), n.wrapping_add(1)), "{n}");
        }
        for (v, n) in [
            ("081", 81),
            ("", 0),
            ("+81", 81),
            (" 81", 81),
            ("81 ", 81),
            ("8l", 81),
        ] {
            assert!(!is_decimal(v.as_bytes(), n), "{v:?}");
        }
    }
}
