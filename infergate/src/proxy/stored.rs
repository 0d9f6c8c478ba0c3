//! Requests that name a stored Responses API object: the engine holding it, found, pinned and remembered.

use std::sync::Arc;

use super::Pinned;
use super::{Ctx, Router};
use crate::errors::ApiError;
use crate::pool::Pool;
use crate::request::CallKind;
use crate::stored_responses::{self, Holder};

impl Router {
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
            None => match self.may_ask_engines(id) {
                Err(why) => (None, why),
                Ok(()) => match self.ask_engines(id, pool).await {
                    Some(h) => {
                        if let Some(cluster) = &self.cluster {
                            cluster.share_response(id, &h);
                        }
                        (Some(h), "engine")
                    }
                    None => {
                        self.stored_responses
                            .unknown
                            .remember(id, std::time::Instant::now());
                        (None, "unknown")
                    }
                },
            },
        };
        self.stored_responses.count_lookup(source);
        let h = found?;
        self.stored_responses.record(id, h.clone());
        Some(h)
    }

    /// Whether the engines may be asked about `id`: only a response-shaped id that none had lately, within the
    /// probe budget; else the lookup source that says why not.
    fn may_ask_engines(&self, id: &str) -> std::result::Result<(), &'static str> {
        let now = std::time::Instant::now();
        let unknown = &self.stored_responses.unknown;
        if !stored_responses::is_probed_shape(id) {
            Err("not_an_id")
        } else if unknown.is_remembered(id, now) {
            Err("remembered_unknown")
        } else if !unknown.may_probe(now) {
            Err("throttled")
        } else {
            Ok(())
        }
    }

    /// The available engine of `pool` (of every pool without one) that says it holds stored response `id`, asked
    /// over its endpoint's own client (TLS for an `https://` one); one without a client does not have it.
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
            .filter_map(|e| {
                let target = e.target();
                let client = match target.side() {
                    Ok(c) => c.clone(),
                    Err(why) => {
                        // Warned when the target was built.
                        log::debug!(
                            "pool {} endpoint {}: not asked for a stored response: {why}",
                            e.pool,
                            e.label
                        );
                        return None;
                    }
                };
                Some(stored_responses::Candidate {
                    client,
                    api_key: target.api_key.clone(),
                    holder: Holder {
                        pool: e.pool.clone(),
                        endpoint: e.label.clone(),
                    },
                })
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
}

/// Whether `pool` still has the endpoint `label` (a reload may have removed the engine holding a response).
fn has_endpoint(pool: &Pool, label: &str) -> bool {
    pool.endpoints().iter().any(|e| e.label == label)
}
