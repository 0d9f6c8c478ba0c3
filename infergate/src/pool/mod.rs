//! Pools and their endpoints: membership (pingora-load-balancing discovery), health checks, API keys, endpoint
//! identity and labels. A pool turns its live endpoints into placement candidates.

mod drift;
mod endpoint;
mod health;
mod learn;
mod membership;
mod recent;
mod speed;
mod speed_series;
#[cfg(test)]
mod tests;

pub use drift::{Correction, Drift};
pub use endpoint::{Endpoint, Target};
pub use health::{Health, HealthGate, HealthTracker};
pub use learn::{DecodeSample, PrefillSample};
pub use recent::RecentPlacements;
pub use speed::{AnswerLength, DecodeSpeed, PrefillSpeed};

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;

use crate::live::Live;
use parking_lot::{Mutex, RwLock};
use pingora_load_balancing::selection::RoundRobin;
use pingora_load_balancing::{Backend, Backends, LoadBalancer};

use crate::config::{Config, EndpointConfig, PoolConfig};
use prometheus::{IntCounterVec, Opts};

use crate::metrics::{EndpointSample, LiveSource, Metrics, PoolSample, EVICTION_CAUSES};
use crate::outlier::Ejection;
use crate::placement::decode::DecodeFit;
use crate::placement::line::Line;
use crate::placement::throughput::{Fitted, ThroughputFit};
use crate::placement::Candidate;
use crate::placement::{factory, policy::PlacementPolicy};
use health::EndpointHealthCheck;
use membership::{Membership, SharedMembership};

/// One configured pool at run time.
pub struct Pool {
    pub name: Arc<str>,
    /// The settings in effect, read per request and by the health checks; a reload swaps in new ones
    /// (`reconfigure`).
    cfg: Arc<Live<PoolConfig>>,
    /// The current endpoints: readers take a snapshot without a lock; a reload swaps in a new list.
    endpoints: ArcSwap<Vec<Arc<Endpoint>>>,
    membership: Arc<Membership>,
    /// Drives discovery and health checks (pingora-load-balancing); infergate scores placement itself.
    pub lb: Arc<LoadBalancer<RoundRobin>>,
    /// The pool's placement policy and its state (session table, prefix index, ...).
    pub policy: Box<dyn PlacementPolicy>,
    /// Models the engines of a `"*"` pool report on `GET /v1/models` (refreshed by housekeeping).
    discovered_models: RwLock<Vec<String>>,
    /// The latest placements and the reasons of the last minute, for the status page.
    pub recent: RecentPlacements,
    /// The typical answer length of the pool's streams (the cost model's expected decode).
    pub answers: AnswerLength,
    /// Held from a placement's snapshot of the candidates until its hold is in the ledger, so that requests
    /// placed at the same moment on different worker threads see each other (a burst splits as planned).
    pub placing: Mutex<()>,
}

impl Pool {
    /// `connect_timeout`: `timeouts.connect`, for its endpoints' own TLS clients.
    pub fn new(cfg: &PoolConfig, connect_timeout: Duration) -> Arc<Pool> {
        let membership = Arc::new(Membership::default());
        let shared_cfg = Arc::new(Live::new(cfg.clone()));
        let backends = Backends::new(Box::new(SharedMembership(membership.clone())));
        let mut lb = LoadBalancer::<RoundRobin>::from_backends(backends);
        lb.set_health_check(Box::new(EndpointHealthCheck {
            pool_cfg: shared_cfg.clone(),
            membership: membership.clone(),
            panic_logged: AtomicBool::new(false),
        }));
        lb.health_check_frequency = Some(cfg.health_check.interval);
        lb.parallel_health_check = true;
        let pool = Arc::new(Pool {
            name: Arc::from(cfg.name.as_str()),
            cfg: shared_cfg,
            endpoints: ArcSwap::from_pointee(Vec::new()),
            membership,
            lb: Arc::new(lb),
            policy: factory::build(cfg),
            discovered_models: RwLock::new(Vec::new()),
            recent: RecentPlacements::default(),
            answers: AnswerLength::default(),
            placing: Mutex::new(()),
        });
        pool.set_endpoints(&cfg.endpoints, connect_timeout, None);
        pool
    }

    /// The pool's settings in effect (cheap: no lock, no clone). Read them per request: a reload may swap them.
    pub fn cfg(&self) -> Arc<PoolConfig> {
        self.cfg.load()
    }

    /// Take reloaded settings (`reload` decided which of them may change in place; the rest are the running
    /// values): the policy updates its parameters, keeping its state. Returns what the policy reports (evictions)
    /// or why it could not take them; then the pool keeps the policy settings it had, so what it reports stays
    /// what the policy runs with.
    pub fn reconfigure(
        &self,
        new: &PoolConfig,
        now: Instant,
    ) -> Result<Option<String>, &'static str> {
        let old = self.cfg.load();
        let mut next = new.clone();
        let policy = if old.policy != new.policy
            || old.prefill.bytes_per_token != new.prefill.bytes_per_token
        {
            self.policy.reconfigure(new, now)
        } else {
            Ok(None)
        };
        if policy.is_err() {
            next.policy = old.policy.clone();
        }
        self.cfg.store(next);
        policy
    }

    /// The current endpoints (cheap: an Arc clone).
    pub fn endpoints(&self) -> Arc<Vec<Arc<Endpoint>>> {
        self.endpoints.load_full()
    }

    /// Replace the pool's endpoints (start and config reload): endpoints whose URL, address and key are unchanged
    /// keep their state; new ones get their metric series at 0; departing ones are marked removed and their metric
    /// series deleted. `connect_timeout` (`timeouts.connect`) is their own TLS clients'. Returns the removed.
    pub fn set_endpoints(
        &self,
        wanted: &[EndpointConfig],
        connect_timeout: Duration,
        metrics: Option<&Metrics>,
    ) -> Vec<Arc<Endpoint>> {
        let current = self.endpoints();
        let cfg = self.cfg();
        let mut next = Vec::with_capacity(wanted.len());
        for w in wanted {
            match current.iter().find(|e| e.label == w.label) {
                Some(e) => {
                    if e.retarget(w, &cfg.health_check, connect_timeout) {
                        log::info!(
                            "pool {}: endpoint {} now {} (key or address changed; state kept)",
                            self.name,
                            e.label,
                            w.addr
                        );
                    }
                    next.push(e.clone())
                }
                None => {
                    if let Some(m) = metrics {
                        m.add_endpoint(&self.name, &w.label, self.reasons());
                    }
                    next.push(Arc::new(Endpoint::new(
                        self.name.clone(),
                        w,
                        &cfg.health_check,
                        connect_timeout,
                    )))
                }
            }
        }
        let removed: Vec<Arc<Endpoint>> = current
            .iter()
            .filter(|e| !next.iter().any(|n| Arc::ptr_eq(n, e)))
            .cloned()
            .collect();
        if let Some(stats) = &cfg.engine_stats {
            for e in &next {
                e.stats.enable(stats.interval);
            }
        }
        let backends: BTreeSet<Backend> = next.iter().map(|e| e.target().backend()).collect();
        *self.membership.backends.write() = backends;
        *self.membership.by_addr.write() = next.iter().map(|e| (e.addr(), e.clone())).collect();
        self.endpoints.store(Arc::new(next));
        for e in &removed {
            e.removed.store(true, Ordering::Release);
            self.policy.endpoint_removed(e.id);
            if let Some(m) = metrics {
                m.remove_endpoint(&self.name, &e.label);
            }
            log::info!("pool {}: endpoint {} removed", self.name, e.label);
        }
        removed
    }

    /// Each current endpoint's decode line, as placement reads it before its drift correction.
    pub fn decode_lines_now(&self) -> Vec<Option<Line>> {
        decode_lines(&self.endpoints())
    }

    /// The placement reasons this pool's policy can give.
    pub fn reasons(&self) -> &'static [crate::placement::Reason] {
        self.policy.reasons()
    }

    /// Which of `endpoints` (this pool's) their health lets take work now.
    pub fn health_gate(&self, endpoints: &[Arc<Endpoint>]) -> HealthGate {
        HealthGate::of(self.cfg().health_check.route_when_all_unhealthy, endpoints)
    }

    /// Snapshot for placement. Ineligible: unhealthy (see `HealthGate`), `excluded` (already tried by this request), ejected unless
    /// nothing else is left (Envoy's panic mode: a possibly bad endpoint beats none), and saturated (it refused
    /// work a moment ago) while any other endpoint can take the work.
    pub fn candidates(
        &self,
        endpoints: &[Arc<Endpoint>],
        excluded: &[u64],
        now: Instant,
    ) -> Vec<Candidate> {
        let max_in_flight = self.cfg().max_in_flight_per_endpoint;
        let gate = self.health_gate(endpoints);
        // Each endpoint's own lines (the steady state); the pool's shapes are worked out only when one has none.
        let (mut fleet_ttft, mut fleet_decode) = (None, None);
        let mut states = Vec::with_capacity(endpoints.len());
        let mut cands = Vec::with_capacity(endpoints.len());
        // Alone in its pool an endpoint has no fleet to borrow a shape from: its own samples' line, which is what
        // the fleet's lines give it, without building them on every placement.
        let alone = endpoints.len() == 1;
        for (i, e) in endpoints.iter().enumerate() {
            let fit = e.prefill_speed.throughput_fit();
            let line = fit.own_line().or_else(|| {
                if alone {
                    return fit.fitted();
                }
                let fleet = fleet_ttft.get_or_insert_with(|| ttft_lines(endpoints));
                fleet.get(i).copied().flatten()
            });
            let decode_fit = e.decode_speed.fit();
            let decode = decode_fit.own_line().or_else(|| {
                if alone {
                    return decode_fit.line();
                }
                let fleet = fleet_decode.get_or_insert_with(|| decode_lines(endpoints));
                fleet.get(i).copied().flatten()
            });
            let v = e.outlier.view(now);
            states.push([v.ejected, v.saturated, v.hung]);
            let (peer_requests, peer_prefill_tokens) = e.peers.get();
            let k = e.drift.correction(now);
            let (debt_requests, debt_tokens) = v.debt;
            cands.push(Candidate {
                eligible: gate.admits(e) && !excluded.contains(&e.id),
                requests: e.load.requests(),
                prefill_tokens: e.load.prefill_tokens(),
                peer_requests,
                peer_prefill_tokens,
                engine: e.stats.fresh(now),
                max_in_flight,
                prefill_speed: line.map(|l| Fitted {
                    overhead_seconds: l.overhead_seconds * k.prefill,
                    tokens_per_second: l.tokens_per_second / k.prefill,
                }),
                kv_held_tokens: None,
                debt_requests,
                debt_tokens,
                prefilling: e.load.prefilling(),
                decode: decode.map(|l| Line {
                    intercept: l.intercept * k.decode,
                    slope: l.slope * k.decode,
                }),
                speed_weight: e.drift.weight(now),
                prefill_busy_seconds: e.load.prefill_busy(now).as_secs_f64(),
            });
        }
        // Per endpoint: ejected, saturated, hung (a stream got no headers in time). Each filter applies only if
        // something eligible survives it; in a health panic, ejected and hung endpoints are out regardless: the
        // checks fail and so do requests, and an engine that never answers must not hold clients for the whole
        // header timeout (they get a 503 at once).
        for which in 0..3 {
            let strict = gate.panic && which != 1;
            if strict
                || cands
                    .iter()
                    .zip(&states)
                    .any(|(c, s)| c.eligible && !s[which])
            {
                for (c, s) in cands.iter_mut().zip(&states) {
                    c.eligible &= !s[which];
                }
            }
        }
        cands
    }

    /// Fill each candidate's exact held tokens from its endpoint's KV index, for a request of `token_ids`
    /// (`candidates` leaves them None: the approximate index stands where this finds nothing trusted).
    pub fn fill_kv_held(
        &self,
        endpoints: &[Arc<Endpoint>],
        cands: &mut [Candidate],
        token_ids: &[u32],
        now: Instant,
    ) {
        // Keys per block size (one, in practice), computed once.
        let mut keys: Vec<(usize, Vec<u64>)> = Vec::new();
        for (e, c) in endpoints.iter().zip(cands.iter_mut()) {
            let Some(bs) = e.kv.block_size() else {
                continue;
            };
            let k = match keys.iter().position(|(b, _)| *b == bs) {
                Some(i) => &keys[i].1,
                None => {
                    keys.push((bs, crate::kv_events::block_keys(token_ids, bs)));
                    &keys[keys.len() - 1].1
                }
            };
            c.kv_held_tokens = e.kv.held_tokens(k, now);
        }
    }

    /// Record a failure of `ep` the engine owns, carrying `tokens` of debt; ejects it when its streak or its
    /// failure rate says so and the pool's cap leaves room. Returns the ejection if it was ejected now.
    pub fn record_failure(&self, ep: &Endpoint, now: Instant, tokens: u64) -> Option<Ejection> {
        let endpoints = self.endpoints();
        let ejected = endpoints.iter().filter(|e| e.outlier.is_ejected()).count();
        let cfg = self.cfg();
        let may_eject = ejected < cfg.outlier.max_ejected(endpoints.len());
        let e = ep
            .outlier
            .record_failure(&cfg.outlier, now, may_eject, tokens)?;
        log::warn!(
            "pool {} endpoint {}: ejected for {} after {}",
            self.name,
            ep.label,
            humantime::format_duration(e.duration),
            e.cause.describe(&cfg.outlier)
        );
        Some(e)
    }

    /// `ep` served a request to its end.
    pub fn record_success(&self, ep: &Endpoint, now: Instant) {
        ep.outlier.record_success(&self.cfg().outlier, now);
    }

    /// Another endpoint than `excluded` could take a request now.
    pub fn has_alternative(&self, excluded: &[u64], now: Instant) -> bool {
        let endpoints = self.endpoints();
        let gate = self.health_gate(&endpoints);
        endpoints
            .iter()
            .any(|e| gate.available(e) && !excluded.contains(&e.id) && !e.outlier.is_saturated(now))
    }

    pub fn any_healthy(&self) -> bool {
        self.endpoints().iter().any(|e| e.health.is_healthy())
    }

    pub fn serves_any_model(&self) -> bool {
        self.cfg().models.iter().any(|m| m == "*")
    }

    /// Ask one healthy endpoint of a `"*"` pool which models it serves, for the router's `GET /v1/models` (over TLS
    /// for an `https://` one, checked as requests are, on the endpoint's kept connections).
    pub async fn refresh_models(&self, timeout: Duration) {
        let Some(ep) = self
            .endpoints()
            .iter()
            .find(|e| e.health.is_healthy())
            .cloned()
        else {
            return;
        };
        let target = ep.target();
        let read = async {
            let side = target.side()?;
            let key = target.api_key.as_deref();
            let accept = "application/json";
            match side
                .get("/v1/models", accept, key, timeout, MAX_MODELS_BYTES)
                .await
            {
                Ok((status, body)) if (200..300).contains(&status) => model_ids(&body),
                Ok((status, _)) => Err(format!("HTTP {status}")),
                Err(e) => Err(e.to_string()),
            }
        };
        match read.await {
            Ok(names) => *self.discovered_models.write() = names,
            Err(why) => log::debug!(
                "pool {} endpoint {}: model list not read: {why}",
                self.name,
                ep.label
            ),
        }
    }
}

/// Largest `GET /v1/models` answer read (model ids, KiBs even with many LoRA adapters).
const MAX_MODELS_BYTES: usize = 4 << 20;

/// The model ids of a `GET /v1/models` answer.
fn model_ids(body: &[u8]) -> Result<Vec<String>, String> {
    let v: serde_json::Value = serde_json::from_slice(body).map_err(|e| e.to_string())?;
    let data = v["data"].as_array().ok_or("no `data` list")?;
    Ok(data
        .iter()
        .filter_map(|m| m["id"].as_str().map(str::to_owned))
        .collect())
}

/// Every pool of the router.
pub struct Pools {
    pub pools: Vec<Arc<Pool>>,
    pub metrics: Arc<Metrics>,
    /// `infergate_session_evictions_total{pool, cause}`.
    session_evictions: IntCounterVec,
}

impl Pools {
    /// Export a pool's session evictions since the last look (`PlacementPolicy::expire`): (ttl, capacity).
    pub fn count_session_evictions(&self, pool: &str, (ttl, capacity): (u64, u64)) {
        for (cause, n) in [("ttl", ttl), ("capacity", capacity)] {
            if n > 0 {
                self.session_evictions
                    .with_label_values(&[pool, cause])
                    .inc_by(n);
            }
        }
    }

    pub fn new(cfg: &Config, metrics: Arc<Metrics>) -> Arc<Pools> {
        let session_evictions = metrics.add(IntCounterVec::new(
            Opts::new(
                "infergate_session_evictions_total",
                "Session bindings evicted, by cause (ttl, capacity).",
            ),
            &["pool", "cause"],
        ));
        let pools = Arc::new(Pools {
            pools: cfg
                .pools
                .iter()
                .map(|p| Pool::new(p, cfg.timeouts.connect))
                .collect(),
            metrics: metrics.clone(),
            session_evictions,
        });
        for p in &pools.pools {
            for cause in EVICTION_CAUSES {
                pools
                    .session_evictions
                    .with_label_values(&[&*p.name, cause]);
            }
            for e in p.endpoints().iter() {
                metrics.add_endpoint(&p.name, &e.label, p.reasons());
            }
        }
        let weak: std::sync::Weak<dyn LiveSource> =
            Arc::downgrade(&(pools.clone() as Arc<dyn LiveSource>));
        metrics.register_live(weak);
        let kv: std::sync::Weak<dyn crate::kv_events::KvSource> =
            Arc::downgrade(&(pools.clone() as Arc<dyn crate::kv_events::KvSource>));
        metrics.register(Box::new(crate::kv_events::KvCollector::new(kv)));
        metrics.register(Box::new(speed_series::SpeedCollector::new(&pools)));
        pools
    }

    pub fn any_healthy(&self) -> bool {
        self.pools.iter().any(|p| p.any_healthy())
    }

    /// Model names the router serves: the pools' explicit names plus what the engines of a `"*"` pool report.
    pub fn model_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .pools
            .iter()
            .flat_map(|p| p.cfg().models.clone())
            .filter(|m| m.as_str() != "*")
            .collect();
        for p in &self.pools {
            names.extend(p.discovered_models.read().iter().cloned());
        }
        names.sort();
        names.dedup();
        names
    }

    /// Run discovery and one round of health checks on every pool now (start-up, tests).
    pub async fn refresh_now(&self) {
        for p in &self.pools {
            if let Err(e) = p.lb.update().await {
                log::warn!("pool {}: discovery failed: {e}", p.name);
            }
            p.lb.backends().run_health_check(true).await;
            if p.serves_any_model() {
                p.refresh_models(p.cfg().health_check.timeout).await;
            }
        }
    }
}

/// The queue-inclusive lines of one pool's endpoints, as placement reads them (`throughput::fleet_lines`).
pub(super) fn ttft_lines(endpoints: &[Arc<Endpoint>]) -> Vec<Option<Fitted>> {
    let fits: Vec<ThroughputFit> = endpoints
        .iter()
        .map(|e| e.prefill_speed.throughput_fit())
        .collect();
    crate::placement::throughput::fleet_lines(&fits)
}

/// The decode lines of one pool's endpoints, as placement reads them (`decode::fleet_decode_lines`).
pub(super) fn decode_lines(endpoints: &[Arc<Endpoint>]) -> Vec<Option<Line>> {
    let fits: Vec<DecodeFit> = endpoints.iter().map(|e| e.decode_speed.fit()).collect();
    crate::placement::decode::fleet_decode_lines(&fits)
}

impl LiveSource for Pools {
    fn endpoint_samples(&self) -> Vec<EndpointSample> {
        let now = Instant::now();
        self.pools
            .iter()
            .flat_map(|p| {
                let endpoints = p.endpoints();
                let lines = ttft_lines(&endpoints);
                endpoints.iter().cloned().zip(lines).collect::<Vec<_>>()
            })
            .map(|(e, ttft_line)| EndpointSample {
                pool: e.pool.to_string(),
                endpoint: e.label.clone(),
                requests_in_flight: e.load.requests(),
                prefill_tokens: e.load.prefill_tokens(),
                healthy: e.health.is_healthy(),
                health_counts: e.health.counts(),
                ejected: e.outlier.is_ejected(),
                stats_state: e.stats.state(now).as_str(),
                prefill_tokens_per_sec: e.prefill_speed.tokens_per_sec().unwrap_or(0.0),
                ttft_line,
                foreign_requests: e
                    .stats
                    .fresh(now)
                    .map(|l| l.foreign_beyond(e.peers.get().0)),
            })
            .collect()
    }

    fn pool_samples(&self) -> Vec<PoolSample> {
        self.pools
            .iter()
            .map(|p| PoolSample {
                pool: p.name.to_string(),
                sessions: p.policy.sessions().map_or(0, |s| s.session_count()) as u64,
                health_panic: p.health_gate(&p.endpoints()).panic,
            })
            .collect()
    }
}

/// How often the janitor looks for overdue holds.
pub const JANITOR_PERIOD: Duration = Duration::from_secs(1);

impl crate::kv_events::KvSource for Pools {
    fn kv_indexes(&self) -> Vec<Arc<crate::kv_events::KvIndex>> {
        self.pools
            .iter()
            .flat_map(|p| {
                p.endpoints()
                    .iter()
                    .map(|e| e.kv.clone())
                    .collect::<Vec<_>>()
            })
            .collect()
    }
}
