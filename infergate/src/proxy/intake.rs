//! Taking a request in: screen, classify, admit, read the body, pick the pool (`request_filter`).

use bytes::Bytes;
use pingora_error::Result;
use pingora_proxy::Session;

use crate::errors::ApiError;

use super::Ctx;
use super::{Router, MAX_PROMPT_SCAN};
use crate::exposure::Screened;
use crate::request::{self, CallKind};

impl Router {
    pub(super) async fn take_request(&self, session: &mut Session, ctx: &mut Ctx) -> Result<bool> {
        // Host, transfer codings, upgrades: what Pingora lets through and RFC 9112 tells a server to refuse.
        if let Err(e) = crate::framing::screen(session.req_header()) {
            self.respond_error(session, &e).await?;
            return Ok(true);
        }
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
                self.start_trace(session, ctx);
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
        // The session key before anything is charged to the client's key: a key too long is refused first.
        let limit = self.current().max_session_key_bytes;
        let key = find_session_key(&pool, &session.req_header().headers, &ctx.scan)
            .map(|(k, header)| {
                crate::framing::check_session_key(k, limit, header).map(|()| k.to_vec())
            })
            .transpose();
        match key {
            Ok(key) => ctx.session_key = key,
            Err(e) => {
                self.respond_error(session, &e).await?;
                return Ok(true);
            }
        }
        // Exact prompt tokens (a pool with a tokenizer) before the key's token limits and placement use them.
        self.count_tokens(&pool, ctx).await;
        if !self.admit_with_body(session, ctx, &pool).await? {
            return Ok(true);
        }
        // After the key's limits: a refused request makes no engine look for a stored response.
        self.pin_continued_response(ctx, &pool).await;
        if !self.read_budget(session, ctx, &pool).await? {
            return Ok(true);
        }
        if let (Some(cluster), Some(key)) = (&self.cluster, &ctx.session_key) {
            // Another replica may have served this session: its binding, before placement (bounded wait).
            cluster.lookup_binding(&pool, key).await;
        }
        ctx.pool = Some(pool);
        Ok(false)
    }
}

/// The request's session key under `pool`'s `sessions`: the first configured header with a value, else the body's
/// `prompt_cache_key` where allowed; None without sessions.
pub(super) fn session_key(
    pool: &crate::pool::Pool,
    headers: &http::HeaderMap,
    scan: &request::BodyScan,
) -> Option<Vec<u8>> {
    find_session_key(pool, headers, scan).map(|(k, _)| k.to_vec())
}

/// The session key as [`session_key`] finds it, and whether it came from a header (else the body).
fn find_session_key<'a>(
    pool: &crate::pool::Pool,
    headers: &'a http::HeaderMap,
    scan: &'a request::BodyScan,
) -> Option<(&'a [u8], bool)> {
    let cfg = pool.cfg();
    let s = cfg.policy.sessions()?;
    let header = s
        .headers
        .iter()
        .filter_map(|h| headers.get(h))
        .map(|v| v.as_bytes())
        .find(|v| !v.is_empty());
    if let Some(v) = header {
        return Some((v, true));
    }
    let key = scan.prompt_cache_key.as_deref()?;
    (s.prompt_cache_key && !key.is_empty()).then_some((key.as_bytes(), false))
}
