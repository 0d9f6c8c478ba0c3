//! A failed attempt or request: whether to retry, what the failure counts against, and the answer the client gets.

use pingora_error::{Error, ErrorSource, ErrorType, RetryType};
use pingora_proxy::{FailToProxy, Session};

use crate::errors::ApiError;

use super::Ctx;
use super::Router;
use crate::ledger::ReleaseCause;

impl Router {
    pub(super) fn connect_failed(&self, ctx: &mut Ctx, mut e: Box<Error>) -> Box<Error> {
        // Refused or reset: the engine is not there. A connect timeout is not counted: a burst of connections
        // overflowing an engine's accept queue looks the same, and ejecting for it would shrink the pool under load.
        if *e.etype() != ErrorType::ConnectTimedout {
            self.record_failure(ctx, "connect");
        }
        ctx.log.upstream_error = Some(e.etype().as_str());
        // Nothing was sent: always safe to try elsewhere.
        self.note_failed_attempt(ctx, "connect failed");
        e.set_retry(ctx.tried.len() <= self.current().max_retries);
        e
    }

    pub(super) fn proxy_error(
        &self,
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
            if let Some(t) = &mut ctx.trace {
                t.attempt_failed("stale pooled connection");
            }
            if let (Some(pool), Some(ep)) = (&ctx.pool, &ctx.endpoint) {
                self.count_retry(&pool.name, ep);
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
        if downstream_gone {
            // Gone before any answer: no headers, or a stream's headers (vLLM sends them before the prefill, and
            // still does with its engine core wedged) and no output after them.
            let no_output = match ctx.attempt.upstream_status {
                None => true,
                Some(s) => {
                    (200..300).contains(&s)
                        && ctx.is_stream()
                        && ctx.kind == crate::request::CallKind::Generate
                        && !ctx.attempt.first_output_seen
                }
            };
            if no_output {
                self.record_abandoned(ctx);
            }
        } else if *e.esource() == ErrorSource::Upstream || nothing_back {
            // The engine's: closed or reset before the answer ended, or no answer in time. A stream whose
            // headers were overdue was counted when they were (the janitor).
            let late = ctx.hold.as_ref().is_some_and(|h| h.was_late());
            let kind = match (timed_out, nothing_back) {
                (true, _) => "timeout",
                (false, true) => "reset",
                (false, false) => "cut",
            };
            if !(late && nothing_back) {
                self.record_failure(ctx, kind);
            }
        }
        e.set_retry(false);
        ctx.release_prefill(ReleaseCause::Aborted);
        e
    }

    pub(super) async fn answer_failure(
        &self,
        session: &mut Session,
        e: &Error,
        ctx: &mut Ctx,
    ) -> FailToProxy {
        ctx.release_prefill(ReleaseCause::Aborted);
        if let Some((status, body)) = ctx.relay.take() {
            // A prefill engine's own answer (a 4xx for the request, or a refusal no other engine could take).
            if session.response_written().is_none()
                && self.respond(session, status, body, None).await.is_ok()
            {
                ctx.answered = Some(status);
                return FailToProxy {
                    error_code: status,
                    can_reuse_downstream: false,
                };
            }
        }
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
}
