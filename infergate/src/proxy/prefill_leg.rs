//! The prefill leg of a disaggregated pool's request: run by the router itself, with its own HTTP client (for an
//! `https://` prefill engine, the endpoint's TLS client, checked as proxied requests are), in
//! `upstream_peer` before the decode endpoint is chosen; the ordinary proxied attempt that follows is the decode
//! leg, its body carrying the prefill's `kv_transfer_params` (request::kv_transfer).
//!
//! The leg is placed by the prefill set's own policy (its ledger, predicted TTFT, sessions, prefix index) and
//! holds its prefill tokens on the prefill endpoint from dispatch until the answer arrives (the answer of a
//! one-token request comes at the end of prefill), or until any error or the client's departure drops the hold.
//! A client that closes its connection meanwhile drops the request to the prefill engine, whose server then
//! aborts it. Retries follow the proxy's rule: a leg that never reached an engine (connect failure) or that an
//! engine refused (429/503) goes to another prefill engine; one that may have started work is not run again.
//! The prefill's answer never reaches the client, unless it is the engine's own error for the request.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use pingora_error::{Error, ErrorType, Result};
use pingora_proxy::Session;
use prometheus::{HistogramOpts, HistogramVec, IntCounterVec, Opts};

use super::admit::client_closed;
use super::ctx::Learned;
use super::intake::session_key;
use super::router::{count_failure, Leg};
use super::{Ctx, Router};
use crate::engine_stats::{plain_client, SideError};
use crate::errors::ApiError;
use crate::ledger::{Hold, ReleaseCause};
use crate::placement::policy::Placement;
use crate::pool::{Endpoint, Pool};
use crate::request::kv_transfer::{params_of, LegApi, Legs};
use crate::request::CallKind;

/// Largest prefill answer read (one token, unless the client asked prompt logprobs).
const MAX_ANSWER_BYTES: usize = 16 << 20;

/// What a served prefill leg leaves for the decode leg, the access log and the metrics.
#[derive(Debug, Clone)]
pub(crate) struct PrefillDone {
    /// The prefill endpoint's `host:port`.
    pub(super) endpoint: String,
    /// Dispatch of its first attempt to its answer.
    pub(super) took: Duration,
    /// Attempts after the first.
    pub(super) retries: u32,
}

/// The prefill legs' series (pool-level: the per-endpoint ones are the prefill set's own). A plain `http://` prefill
/// engine's leg goes through [`plain_client`], an `https://` one's through its endpoint's
/// [`crate::engine_stats::SideClient`].
pub(super) struct Disagg {
    /// `infergate_disagg_prefill_seconds{pool}`: a served prefill leg, first dispatch to answer.
    prefill_seconds: HistogramVec,
    /// `infergate_disagg_kv_transfer_seconds{pool}`: a streamed decode leg's dispatch to its first output (the
    /// KV cache's transfer and the first decode step).
    kv_transfer_seconds: HistogramVec,
    /// `infergate_disagg_prefill_legs_total{pool, outcome}`.
    legs_total: IntCounterVec,
}

/// How a prefill leg ended (`outcome` label).
pub(super) const OUTCOMES: [&str; 6] = [
    "served",
    "no_params",
    "refused",
    "engine_error",
    "unreachable",
    "client_gone",
];

impl Disagg {
    pub(super) fn new(state: &crate::state::RouterState) -> Disagg {
        let buckets = vec![
            0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
        ];
        let m = &state.metrics;
        let prefill_seconds = m.add(HistogramVec::new(
            HistogramOpts::new(
                "infergate_disagg_prefill_seconds",
                "Prefill legs of a disaggregated pool that served: first dispatch to the prefill engine's answer.",
            )
            .buckets(buckets.clone()),
            &["pool"],
        ));
        let kv_transfer_seconds = m.add(HistogramVec::new(
            HistogramOpts::new(
                "infergate_disagg_kv_transfer_seconds",
                "Streamed decode legs of a disaggregated pool: dispatch to the first output (KV transfer and first \
                 decode step).",
            )
            .buckets(buckets),
            &["pool"],
        ));
        let legs_total = m.add(IntCounterVec::new(
            Opts::new(
                "infergate_disagg_prefill_legs_total",
                "Prefill legs of a disaggregated pool by outcome (served, no_params, refused, engine_error, \
                 unreachable, client_gone).",
            ),
            &["pool", "outcome"],
        ));
        for p in state
            .cfg
            .pools
            .iter()
            .filter(|p| p.disaggregation.is_some())
        {
            for o in OUTCOMES {
                legs_total.with_label_values(&[p.name.as_str(), o]);
            }
            prefill_seconds.with_label_values(&[&p.name]);
            kv_transfer_seconds.with_label_values(&[&p.name]);
        }
        Disagg {
            prefill_seconds,
            kv_transfer_seconds,
            legs_total,
        }
    }

    fn count(&self, pool: &str, outcome: &str) {
        self.legs_total.with_label_values(&[pool, outcome]).inc();
    }

    /// A streamed decode leg's first output, `elapsed` after its dispatch.
    pub(super) fn observe_transfer(&self, pool: &str, elapsed: Duration) {
        self.kv_transfer_seconds
            .with_label_values(&[pool])
            .observe(elapsed.as_secs_f64());
    }
}

/// How one attempt of the leg went.
enum Sent {
    /// The engine answered (status, body).
    Answer(u16, Bytes),
    /// Nothing was sent: no connection (`timed_out`: its connect timed out), or its TLS handshake failed
    /// (`tls`: why; a certificate from another CA or for another name, a plain-HTTP engine).
    Unreachable {
        timed_out: bool,
        tls: Option<String>,
    },
    /// Sent, then no answer in time (`timed_out`), or cut; `answered`: after the answer's head.
    Failed { timed_out: bool, answered: bool },
}

impl Router {
    /// In a disaggregated pool, a generate request's prefill leg, once: afterwards `ctx.body` is the decode leg's.
    /// An error is the client's answer (left in `ctx.error` or `ctx.relay`), or the client is gone.
    pub(super) async fn prefill_first(
        &self,
        session: &mut Session,
        pool: &Arc<Pool>,
        ctx: &mut Ctx,
    ) -> Result<()> {
        let Some(d) = pool.cfg().disaggregation.clone() else {
            return Ok(());
        };
        if ctx.kind != CallKind::Generate || ctx.prefill.is_some() {
            return Ok(());
        }
        let set = self.pools.pools.iter().find(|p| *p.name == *d.prefill_pool);
        let (Some(set), Some(body)) = (set.cloned(), ctx.body.as_ref()) else {
            return answer(ctx, ApiError::internal());
        };
        let path = ctx
            .target
            .as_ref()
            .map_or("", |t| t.target.path.as_str())
            .to_string();
        let Some(api) = LegApi::of_path(&path) else {
            let msg = format!("{path} is not served by a disaggregated pool (chat, completions, responses and messages are)");
            return answer(
                ctx,
                ApiError::new(
                    400,
                    "invalid_request_error",
                    "unsupported_by_disaggregation",
                    msg,
                ),
            );
        };
        let legs = match Legs::split(api, &body.bytes) {
            Ok(l) => l,
            Err(e) => return answer(ctx, e),
        };
        let key = session_key(&set, &session.req_header().headers, &ctx.scan);
        let started = Instant::now();
        let mut tried: Vec<u64> = Vec::new();
        // Legs sent again to the same endpoint after a cut before any answer (see below).
        let mut resends: usize = 0;
        loop {
            let first = tried.is_empty();
            let placed = {
                // A prefill set's wait queue, like any pool's: its first placement waits for a turn.
                let _turn = if first {
                    self.wait_turn(session, &set, ctx).await?
                } else {
                    None
                };
                if let Some(cluster) = &self.cluster {
                    // What the other replicas sent to the prefill set since their last publish (bounded wait).
                    cluster.refresh_peer_load(&set).await;
                }
                let _placing = set.placing.lock();
                self.place_prefill(&set, ctx, &tried, key.as_deref())
            };
            let Some((ep, hold, placement)) = placed else {
                let e = if !set.any_healthy() || first {
                    ApiError::no_healthy_endpoint(&set.name)
                } else {
                    ApiError::upstream_unreachable(&set.name)
                };
                return answer(ctx, e);
            };
            let attempt_start = Instant::now();
            let request_id = session
                .req_header()
                .headers
                .get(crate::request_id::HEADER)
                .cloned();
            let mut resent = false;
            let sent = loop {
                let send = self.send_prefill(&ep, &path, legs.prefill.clone(), request_id.clone());
                let sent = tokio::select! {
                    sent = send => sent,
                    closed = client_closed(session) => {
                        // Dropping the request closes its connection: the engine aborts the prefill.
                        self.abandoned(&set, &ep, hold.estimate(), attempt_start.elapsed(), false);
                        self.disagg.count(&pool.name, "client_gone");
                        return Err(closed);
                    }
                };
                match sent {
                    // Cut before any answer: most often a pooled connection the engine closed as the leg went out
                    // (its keep-alive ran out), which the client cannot see coming. Sent again once, as the proxy
                    // resends a stale reuse; an engine that died meanwhile refuses the resend, and the leg goes to
                    // another prefill engine.
                    Sent::Failed {
                        timed_out: false,
                        answered: false,
                    } if !resent => {
                        resent = true;
                        resends += 1;
                        self.resent_leg(&set, &ep);
                    }
                    sent => break sent,
                }
            };
            let now = Instant::now();
            match sent {
                Sent::Answer(status, answer_body) => {
                    hold.release_prefill(ReleaseCause::FirstByte);
                    self.metrics
                        .request_done(ep.series(), status, attempt_start);
                    if (200..300).contains(&status) {
                        self.metrics
                            .observe_ttfb(ep.series(), attempt_start.elapsed());
                        hold.mark_served();
                        set.policy.served(ep.id, &placement.ticket, now);
                        let params = match params_of(&answer_body) {
                            Ok(p) => p,
                            Err(why) => {
                                log::warn!("pool {} endpoint {}: {why}", set.name, ep.label);
                                self.disagg.count(&pool.name, "no_params");
                                return answer(
                                    ctx,
                                    ApiError::new(502, "upstream_error", "prefill_failed", why),
                                );
                            }
                        };
                        set.record_success(&ep, now);
                        let prediction = placement.ticket.prediction();
                        self.learn(
                            &set,
                            &ep,
                            Learned {
                                tokens: hold.estimate(),
                                ttft: hold.age(),
                                prediction,
                            },
                        );
                        let took = started.elapsed();
                        self.disagg
                            .prefill_seconds
                            .with_label_values(&[&pool.name])
                            .observe(took.as_secs_f64());
                        self.disagg.count(&pool.name, "served");
                        if let Some(b) = ctx.body.as_mut() {
                            b.replace(legs.decode(&params));
                        }
                        ctx.prefill = Some(PrefillDone {
                            endpoint: ep.label.clone(),
                            took,
                            retries: u32::try_from(tried.len() + resends).unwrap_or(u32::MAX),
                        });
                        return Ok(());
                    }
                    if status == 429 || status == 503 {
                        ep.outlier
                            .record_refusal(now, set.cfg().outlier.saturation_cooldown);
                        if status == 503 {
                            count_failure(&self.metrics, &set, &ep, "status_5xx", hold.estimate());
                        }
                        tried.push(ep.id);
                        if tried.len() <= self.current().max_retries
                            && set.has_alternative(&tried, now)
                        {
                            self.retried(&set, &ep, "engine refused the prefill leg");
                            continue;
                        }
                        self.disagg.count(&pool.name, "refused");
                    } else if status >= 500 {
                        count_failure(&self.metrics, &set, &ep, "status_5xx", hold.estimate());
                        self.disagg.count(&pool.name, "engine_error");
                    } else {
                        // The request's fault (a prompt too long, a bad field): the engine works.
                        set.record_success(&ep, now);
                        self.disagg.count(&pool.name, "engine_error");
                    }
                    ctx.relay = Some((status, answer_body));
                    return Error::e_explain(ErrorType::HTTPStatus(status), "prefill leg answered");
                }
                Sent::Unreachable { timed_out, tls } => {
                    if !timed_out {
                        count_failure(&self.metrics, &set, &ep, "connect", hold.estimate());
                    }
                    if let Some(why) = &tls {
                        log::warn!(
                            "pool {} endpoint {}: prefill leg not sent: TLS handshake failed: {why}",
                            set.name,
                            ep.label
                        );
                    }
                    drop(hold);
                    tried.push(ep.id);
                    if tried.len() <= self.current().max_retries {
                        self.retried(&set, &ep, "cannot connect for the prefill leg");
                        continue;
                    }
                    self.disagg.count(&pool.name, "unreachable");
                    // As Pingora names a proxied attempt's.
                    ctx.log.upstream_error = Some(match (&tls, timed_out) {
                        (Some(_), _) => "TLSHandshakeFailure",
                        (None, true) => "ConnectTimedout",
                        (None, false) => "ConnectRefused",
                    });
                    return answer(ctx, ApiError::upstream_unreachable(&set.name));
                }
                Sent::Failed { timed_out, .. } => {
                    let kind = if timed_out { "timeout" } else { "reset" };
                    count_failure(&self.metrics, &set, &ep, kind, hold.estimate());
                    log::warn!(
                        "pool {} endpoint {}: prefill leg failed ({kind})",
                        set.name,
                        ep.label
                    );
                    self.disagg.count(&pool.name, "engine_error");
                    let e = if timed_out {
                        ApiError::upstream_timeout()
                    } else {
                        ApiError::upstream_failed()
                    };
                    return answer(ctx, e);
                }
            }
        }
    }

    /// Place the prefill leg on the prefill set and hold its tokens there (under the set's placing lock).
    fn place_prefill(
        &self,
        set: &Pool,
        ctx: &Ctx,
        tried: &[u64],
        key: Option<&[u8]>,
    ) -> Option<(Arc<Endpoint>, Hold, Placement)> {
        let now = Instant::now();
        let leg = Leg {
            tried,
            session_key: key,
        };
        let placed = self.place(set, ctx, leg, now)?;
        self.note_kv_dispatch(&placed, now);
        let (ep, placement) = (placed.ep, placed.placement);
        self.count_placement(set, &ep, &placement, now);
        let tokens = if set.policy.counts_tokens() {
            self.placed_tokens(set, &placement)
        } else {
            0
        };
        // Reserved in the cluster's store as a decode leg's dispatch is: the other replicas' next placements on
        // the prefill set see this prefill before this replica's next publish.
        let reserving = self.cluster.as_ref().map(|c| c.reserving());
        let mut hold = self
            .ledger
            .hold(ep.load.clone(), tokens, self.release_hook(&ep));
        if let Some(r) = reserving {
            r.reserve(&ep, tokens);
        }
        self.wake_queue_on_finish(set, &mut hold);
        Some((ep, hold, placement))
    }

    /// A prefill leg cut before any answer, sent again to the same endpoint: counted as a retry and logged, not as
    /// the engine's failure (as the proxy's resend of a stale pooled connection).
    fn resent_leg(&self, set: &Pool, ep: &Endpoint) {
        self.count_retry(&set.name, ep);
        log::info!(
            "pool {} endpoint {}: prefill leg cut before any answer (a pooled connection gone stale?); sending it again",
            set.name,
            ep.label
        );
    }

    /// Send the prefill leg to `ep` and read its answer: over TLS for an `https://` endpoint, else plain.
    async fn send_prefill(
        &self,
        ep: &Endpoint,
        path: &str,
        body: Bytes,
        request_id: Option<http::HeaderValue>,
    ) -> Sent {
        let t = self.current().timeouts;
        // The answer comes at the end of prefill: as long as a stream's first byte may take.
        let timeout = t.connect + t.response_header.max(t.stream_idle);
        let target = ep.target();
        if target.tls.is_some() {
            let side = match target.side() {
                Ok(side) => side,
                // Its client could not be built (warned when its target was): never sent in the clear.
                Err(why) => {
                    return Sent::Unreachable {
                        timed_out: false,
                        tls: Some(format!("no TLS client: {why}")),
                    }
                }
            };
            let mut headers = http::HeaderMap::new();
            headers.insert(
                http::header::CONTENT_TYPE,
                http::HeaderValue::from_static("application/json"),
            );
            if let Some(id) = request_id {
                headers.insert(&crate::request_id::NAME, id);
            }
            let key = target.api_key.as_deref();
            let sent = side
                .post(path, headers, key, body, timeout, MAX_ANSWER_BYTES)
                .await;
            return match sent {
                Ok((status, answer)) => Sent::Answer(status, answer),
                Err(SideError::Connect(_)) => Sent::Unreachable {
                    timed_out: false,
                    tls: None,
                },
                // As the plain client's connect timeout (`is_timeout`): not counted against the engine.
                Err(SideError::ConnectTimeout(_)) => Sent::Unreachable {
                    timed_out: true,
                    tls: None,
                },
                Err(SideError::Tls(why)) => Sent::Unreachable {
                    timed_out: false,
                    tls: Some(why),
                },
                Err(SideError::Timeout(_)) => Sent::Failed {
                    timed_out: true,
                    answered: false,
                },
                Err(SideError::NoAnswer(_)) => Sent::Failed {
                    timed_out: false,
                    answered: false,
                },
                Err(SideError::Failed(_) | SideError::TooLarge(_)) => Sent::Failed {
                    timed_out: false,
                    answered: true,
                },
            };
        }
        // `timeouts.connect` now: a reload that changes it gets another client, as the https endpoints do.
        let mut req = plain_client(t.connect)
            .post(format!("http://{}{path}", ep.addr()))
            .header(http::header::HOST, ep.label.as_str())
            .header(http::header::CONTENT_TYPE, "application/json")
            .timeout(timeout)
            .body(body);
        if let Some(key) = ep.api_key() {
            req = req.bearer_auth(key);
        }
        if let Some(id) = request_id {
            req = req.header(crate::request_id::HEADER, id);
        }
        let resp = match req.send().await {
            Ok(r) => r,
            Err(e) if e.is_connect() => {
                return Sent::Unreachable {
                    timed_out: e.is_timeout(),
                    tls: None,
                }
            }
            Err(e) => {
                return Sent::Failed {
                    timed_out: e.is_timeout(),
                    answered: false,
                }
            }
        };
        let status = resp.status().as_u16();
        match read_bounded(resp).await {
            Ok(b) => Sent::Answer(status, b),
            Err(e) => Sent::Failed {
                timed_out: e.is_timeout(),
                answered: true,
            },
        }
    }
}

/// The answer's body, cut at `MAX_ANSWER_BYTES`.
async fn read_bounded(mut resp: reqwest::Response) -> std::result::Result<Bytes, reqwest::Error> {
    let mut out = bytes::BytesMut::new();
    while let Some(chunk) = resp.chunk().await? {
        let room = MAX_ANSWER_BYTES.saturating_sub(out.len());
        out.extend_from_slice(&chunk[..chunk.len().min(room)]);
    }
    Ok(out.freeze())
}

/// Leave `e` for `fail_to_proxy` to answer.
fn answer(ctx: &mut Ctx, e: ApiError) -> Result<()> {
    let status = e.status;
    ctx.error = Some(e);
    Error::e_explain(ErrorType::HTTPStatus(status), "prefill leg")
}
