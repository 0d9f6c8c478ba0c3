//! The answers the router writes itself: its JSON responses and errors, CORS preflights, the model list.

use bytes::Bytes;
use pingora_error::Result;
use pingora_http::ResponseHeader;
use pingora_proxy::Session;

use super::access;
use super::Router;
use prometheus::{IntCounterVec, Opts};

use crate::errors::ApiError;
use crate::metrics::{Metrics, ROUTER_CODES};

impl Router {
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
        self.answered
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
        self.answered.with_label_values(&["204"]).inc();
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
}

/// `infergate_router_responses_total`, with a series at 0 for each of `ROUTER_CODES`.
pub(super) fn counter(metrics: &Metrics) -> IntCounterVec {
    let c = metrics.add(IntCounterVec::new(
        Opts::new(
            "infergate_router_responses_total",
            "Responses the router answered itself (errors, /health, /v1/models), by status code.",
        ),
        &["code"],
    ));
    for code in ROUTER_CODES {
        c.with_label_values(&[code]);
    }
    c
}
