//! The proxy's side of admission: 401 and 429 answered in `request_filter`, the wait for a pool's turn in
//! `upstream_peer`, and the wake-up a finished request gives the queue.

use std::sync::Arc;
use std::time::Instant;

use pingora_error::{Error, ErrorType, Result};
use pingora_proxy::Session;

use super::{Ctx, Router};
use crate::admission::queue::{self, Refusal, Turn};
use crate::ledger::Hold;
use crate::placement::Candidate;
use crate::pool::Pool;
use crate::request::CallKind;

use super::ApiError;

impl Router {
    /// Before the body is read: the client key (every call but `/health`), then, for proxied calls, the key's
    /// concurrency and requests-per-minute limits. Ok(false) when the router has answered (401, 429).
    pub(super) async fn admit_before_body(
        &self,
        session: &mut Session,
        ctx: &mut Ctx,
    ) -> Result<bool> {
        if ctx.kind == CallKind::RouterHealth {
            return Ok(true);
        }
        let mut r = self
            .admission
            .authenticate(&session.req_header().headers, &mut ctx.admission);
        if r.is_ok() && matches!(ctx.kind, CallKind::Generate | CallKind::Passive) {
            r = self.admission.begin(&mut ctx.admission);
        }
        self.answer_refusal(session, r).await
    }

    /// Once the body and pool are known: charge the key one request and the body's prompt tokens, exact when the
    /// pool has a tokenizer (generate calls only). Ok(false) when the router has answered 429.
    pub(super) async fn admit_with_body(
        &self,
        session: &mut Session,
        ctx: &mut Ctx,
        pool: &Pool,
    ) -> Result<bool> {
        let tokens = match ctx.kind {
            CallKind::Generate => self.prompt_tokens(pool, ctx),
            _ => 0,
        };
        let r = self.admission.charge(&ctx.admission, tokens);
        self.answer_refusal(session, r).await
    }

    async fn answer_refusal(
        &self,
        session: &mut Session,
        r: std::result::Result<(), ApiError>,
    ) -> Result<bool> {
        match r {
            Ok(()) => Ok(true),
            Err(e) => {
                self.respond_error(session, &e).await?;
                Ok(false)
            }
        }
    }

    /// In a pool with a wait queue, a generate request's first placement waits for its turn (see
    /// `admission::queue`); keep the turn until the request's hold exists. Retries and passive calls do not wait.
    /// A refusal is left in `ctx.error` for `fail_to_proxy` (503 with Retry-After).
    /// A client that closes its connection while waiting leaves the queue at once.
    pub(super) async fn wait_turn(
        &self,
        session: &mut Session,
        pool: &Pool,
        ctx: &mut Ctx,
    ) -> Result<Option<Turn>> {
        let Some(q) = self.admission.queue(&pool.name) else {
            return Ok(None);
        };
        if ctx.kind != CallKind::Generate || !ctx.tried.is_empty() || ctx.fresh_retry.is_some() {
            return Ok(None);
        }
        let key: Arc<str> = Arc::from(ctx.admission.key());
        let room = || queue::room(&pool.candidates(&pool.endpoints(), &[], Instant::now()));
        let waited = tokio::select! {
            biased;
            waited = q.turn(key, room) => waited,
            closed = client_closed(session) => {
                // Dropping the turn's future took its ticket out of the queue.
                q.count_abandoned();
                return Err(closed);
            }
        };
        match waited {
            Ok(turn) => Ok(Some(turn)),
            Err(refusal) => {
                let secs = q.config().max_wait.as_secs_f64().ceil().max(1.0) as u32;
                let e = match refusal {
                    Refusal::Full => ApiError::queue_full(&pool.name, secs),
                    Refusal::Timeout => ApiError::queue_timeout(&pool.name, secs),
                };
                let status = e.status;
                ctx.error = Some(e);
                Error::e_explain(ErrorType::HTTPStatus(status), "wait queue")
            }
        }
    }

    /// With a wait queue the in-flight limit is hard: when the policy picked an endpoint at its limit while another
    /// has room, the candidates to place among again (those below the limit).
    pub(super) fn below_limit(
        &self,
        pool: &Pool,
        cands: &[Candidate],
        picked: usize,
    ) -> Option<Vec<Candidate>> {
        self.admission.queue(&pool.name)?;
        if !cands.get(picked)?.at_limit() {
            return None;
        }
        queue::below_limit(cands)
    }

    /// Wake the pool's queue when this hold gives its request slot back.
    pub(super) fn wake_queue_on_finish(&self, pool: &Pool, hold: &mut Hold) {
        if let Some(q) = self.admission.queue(&pool.name) {
            let q = q.clone();
            hold.on_finish(Arc::new(move || q.wake()));
        }
    }
}

/// Resolves when the client closes its connection (the body is read whole before routing, so the only thing left
/// to read is the end of the connection). Bytes of a pipelined next request are kept for it by Pingora, and this
/// stays pending.
pub(super) async fn client_closed(session: &mut Session) -> Box<Error> {
    loop {
        match session.as_downstream_mut().read_body_or_idle(true).await {
            Err(e) => return e.into_down(),
            Ok(_) => std::future::pending::<()>().await,
        }
    }
}
