//! Pools and their endpoints: membership (pingora-load-balancing discovery), health checks, API keys, endpoint
//! identity and labels. A pool turns its live endpoints into placement candidates.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use async_trait::async_trait;
use parking_lot::{Mutex, RwLock};
use pingora_load_balancing::discovery::ServiceDiscovery;
use pingora_load_balancing::health_check::{HealthCheck, HttpHealthCheck};
use pingora_load_balancing::selection::RoundRobin;
use pingora_load_balancing::{Backend, Backends, LoadBalancer};

use crate::config::{Config, EndpointConfig, HealthCheckConfig, PoolConfig};
use crate::engine_stats::StatsCell;
use crate::ledger::EndpointLoad;
use crate::metrics::{EndpointSample, LiveSource, Metrics, PoolSample};
use crate::outlier::Outlier;
use crate::placement::throughput::{Fitted, ThroughputFit};
use crate::placement::Candidate;
use crate::placement::{factory, policy::PlacementPolicy};

static NEXT_ENDPOINT_ID: AtomicU64 = AtomicU64::new(1);

/// Health as infergate sees it. Endpoints start `Unknown` and get no traffic until a check passes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Health {
    Unknown = 0,
    Healthy = 1,
    Unhealthy = 2,
}

/// Consecutive-result tracking with the pool's thresholds.
#[derive(Debug, Default)]
pub struct HealthTracker {
    state: AtomicU8,
    /// (consecutive successes, consecutive failures)
    streak: Mutex<(usize, usize)>,
    /// Since the start: checks failed, and changes to each state (the first result included).
    failed_checks: AtomicU64,
    became_healthy: AtomicU64,
    became_unhealthy: AtomicU64,
    /// The last check reached the engine: it answered, wrongly or too slowly, rather than refuse the connect.
    last_check_reached: AtomicBool,
}

/// What [`HealthTracker::counts`] reports.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HealthCounts {
    pub failed_checks: u64,
    pub became_healthy: u64,
    pub became_unhealthy: u64,
}

impl HealthTracker {
    pub fn get(&self) -> Health {
        match self.state.load(Ordering::Relaxed) {
            1 => Health::Healthy,
            2 => Health::Unhealthy,
            _ => Health::Unknown,
        }
    }

    pub fn is_healthy(&self) -> bool {
        self.get() == Health::Healthy
    }

    /// Record one check. The first result decides at once (an endpoint must not wait `healthy_after` intervals
    /// after a router start); afterwards the thresholds apply. Returns the new state if it changed.
    pub fn record(&self, ok: bool, healthy_after: usize, unhealthy_after: usize) -> Option<Health> {
        let mut streak = self.streak.lock();
        if ok {
            streak.0 += 1;
            streak.1 = 0;
        } else {
            streak.1 += 1;
            streak.0 = 0;
            self.failed_checks.fetch_add(1, Ordering::Relaxed);
        }
        let current = self.get();
        let next = match current {
            Health::Unknown => Some(if ok {
                Health::Healthy
            } else {
                Health::Unhealthy
            }),
            Health::Healthy if !ok && streak.1 >= unhealthy_after => Some(Health::Unhealthy),
            Health::Unhealthy if ok && streak.0 >= healthy_after => Some(Health::Healthy),
            _ => None,
        };
        let next = next.filter(|n| *n != current)?;
        self.state.store(next as u8, Ordering::Relaxed);
        let change = if next == Health::Healthy {
            &self.became_healthy
        } else {
            &self.became_unhealthy
        };
        change.fetch_add(1, Ordering::Relaxed);
        Some(next)
    }

    /// Note whether the latest check reached the engine (before `record`ing it).
    pub fn note_reach(&self, reached: bool) {
        self.last_check_reached.store(reached, Ordering::Relaxed);
    }

    /// The engine answers its checks, if wrongly: a failing one is a candidate in the pool's health panic.
    pub fn engine_answers(&self) -> bool {
        self.last_check_reached.load(Ordering::Relaxed)
    }

    pub fn counts(&self) -> HealthCounts {
        let read = |n: &AtomicU64| n.load(Ordering::Relaxed);
        HealthCounts {
            failed_checks: read(&self.failed_checks),
            became_healthy: read(&self.became_healthy),
            became_unhealthy: read(&self.became_unhealthy),
        }
    }
}

/// What a reload may change about an endpoint without changing its identity: where it resolves to and its key.
pub struct Target {
    pub addr: std::net::SocketAddr,
    pub api_key: Option<String>,
    checker: HttpHealthCheck,
    /// The `health_check` path and timeout the checker was built with.
    checked_as: (String, Duration),
}

impl Target {
    fn new(cfg: &EndpointConfig, hc: &HealthCheckConfig) -> Target {
        let mut checker = HttpHealthCheck::new(&cfg.label, false);
        // `new` builds a valid "GET /" header; set our path and headers on it.
        if let Ok(req) = pingora_http::RequestHeader::build("GET", hc.path.as_bytes(), None) {
            checker.req = req;
        }
        let _ = checker.req.insert_header("Host", cfg.label.as_str());
        if let Some(key) = &cfg.api_key {
            let _ = checker
                .req
                .insert_header("Authorization", format!("Bearer {key}"));
        }
        checker.peer_template.options.connection_timeout = Some(hc.timeout);
        checker.peer_template.options.read_timeout = Some(hc.timeout);
        checker.peer_template.options.write_timeout = Some(hc.timeout);
        Target {
            addr: cfg.addr,
            api_key: cfg.api_key.clone(),
            checker,
            checked_as: (hc.path.clone(), hc.timeout),
        }
    }

    fn backend(&self) -> Backend {
        Backend {
            addr: pingora_core::protocols::l4::socket::SocketAddr::Inet(self.addr),
            weight: 1,
            ext: http::Extensions::new(),
        }
    }
}

/// One engine endpoint of one pool. Its identity is its URL: a reload that changes only its key or resolved
/// address keeps its health, load, sessions, prefix entries and metric series.
pub struct Endpoint {
    /// Stable identity across reloads (session bindings and prefix entries refer to it).
    pub id: u64,
    pub pool: Arc<str>,
    /// "host:port", the `endpoint` metric label.
    pub label: String,
    pub host: String,
    target: ArcSwap<Target>,
    pub load: Arc<EndpointLoad>,
    /// Other router replicas' load on this endpoint (`cluster`), as last read from the shared store.
    pub peers: crate::cluster::PeerLoad,
    pub health: HealthTracker,
    pub outlier: Outlier,
    pub stats: StatsCell,
    /// Set when the endpoint left its pool; holds still release into it harmlessly.
    pub removed: AtomicBool,
    /// Observed prefill speed, for releasing non-streaming requests' tokens at their estimated prefill end.
    pub prefill_speed: PrefillSpeed,
    /// The metrics callback every hold on this endpoint shares (built once, on first use).
    pub release_hook: std::sync::OnceLock<crate::ledger::ReleaseHook>,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the API key.
        f.debug_struct("Endpoint")
            .field("pool", &self.pool)
            .field("label", &self.label)
            .finish()
    }
}

impl Endpoint {
    fn new(pool: Arc<str>, cfg: &EndpointConfig, hc: &HealthCheckConfig) -> Endpoint {
        Endpoint {
            id: NEXT_ENDPOINT_ID.fetch_add(1, Ordering::Relaxed),
            pool,
            label: cfg.label.clone(),
            host: cfg.host.clone(),
            target: ArcSwap::from_pointee(Target::new(cfg, hc)),
            load: Arc::new(EndpointLoad::default()),
            peers: crate::cluster::PeerLoad::default(),
            health: HealthTracker::default(),
            outlier: Outlier::default(),
            stats: StatsCell::default(),
            removed: AtomicBool::new(false),
            prefill_speed: PrefillSpeed::default(),
            release_hook: std::sync::OnceLock::new(),
        }
    }

    /// Where the endpoint is now and its key (a reload may swap both).
    pub fn target(&self) -> Arc<Target> {
        self.target.load_full()
    }

    pub fn addr(&self) -> std::net::SocketAddr {
        self.target.load().addr
    }

    pub fn api_key(&self) -> Option<String> {
        self.target.load().api_key.clone()
    }

    /// Apply a reloaded key, address or health-check path and timeout; true if the key or address changed.
    fn retarget(&self, cfg: &EndpointConfig, hc: &HealthCheckConfig) -> bool {
        let cur = self.target.load();
        let moved = cur.addr != cfg.addr || cur.api_key != cfg.api_key;
        let (path, timeout) = &cur.checked_as;
        if moved || *path != hc.path || *timeout != hc.timeout {
            self.target.store(Arc::new(Target::new(cfg, hc)));
        }
        moved
    }
}

/// Which of a pool's endpoints their health lets take work: the healthy ones; when every one fails its check,
/// those whose engine still answers it, wrongly or too slowly (`health_check.route_when_all_unhealthy`, the pool's
/// "health panic"): a check that times out under load, or a wrong `path`, must not stop a pool that serves. An
/// engine whose check cannot connect (down, restarting, unreachable) is never a candidate, so a pool of dead
/// engines answers 503 at once as without it. Until every endpoint was checked (start-up, an endpoint added)
/// there is no panic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HealthGate {
    pub panic: bool,
}

impl HealthGate {
    fn of(enabled: bool, endpoints: &[Arc<Endpoint>]) -> HealthGate {
        let panic = enabled
            && endpoints
                .iter()
                .all(|e| e.health.get() == Health::Unhealthy)
            && endpoints.iter().any(|e| e.health.engine_answers());
        HealthGate { panic }
    }

    pub fn admits(&self, e: &Endpoint) -> bool {
        match e.health.get() {
            Health::Healthy => true,
            Health::Unhealthy => self.panic && e.health.engine_answers(),
            Health::Unknown => false,
        }
    }

    /// Admitted and not ejected: may take work now.
    pub fn available(&self, e: &Endpoint) -> bool {
        self.admits(e) && !e.outlier.is_ejected()
    }
}

/// An endpoint's prefill speed, learned from streaming requests as two lines of time to first byte over
/// estimated tokens (`placement::throughput`): one over the request's own tokens (which includes queueing, so it
/// errs slow and releases non-streaming holds late rather than early), one over the tokens ahead plus its own (what
/// `predicted_ttft` predicts with).
#[derive(Debug, Default)]
pub struct PrefillSpeed {
    /// Over the request's own estimate (`observe`).
    own: Mutex<ThroughputFit>,
    /// The queue-inclusive line `predicted_ttft` predicts with (`observe_throughput`).
    fit: Mutex<ThroughputFit>,
}

impl PrefillSpeed {
    /// Own-token samples smaller than this are ignored: a line learned from small prompts only is mostly overhead
    /// noise, and extrapolated to a long prompt it can say "prefilled in 10 ms" and release a non-streaming hold
    /// at once.
    const MIN_OWN_TOKENS: u64 = 1024;

    /// A sample of the endpoint's prefill speed: `tokens` is the request's own estimate, `elapsed` its time to
    /// first byte.
    pub fn observe(&self, tokens: u64, elapsed: Duration) {
        if tokens < Self::MIN_OWN_TOKENS {
            return;
        }
        self.own
            .lock()
            .observe(tokens as f64, elapsed.as_secs_f64());
    }

    /// A sample of the endpoint's prefill throughput: `tokens` is the prefill that was ahead of a request at
    /// dispatch plus its own estimate, `elapsed` its time to first byte (what `predicted_ttft` predicts with).
    pub fn observe_throughput(&self, tokens: u64, elapsed: Duration) {
        self.fit
            .lock()
            .observe(tokens as f64, elapsed.as_secs_f64());
    }

    /// The learned queue-inclusive line (overhead, then tokens per second) from this endpoint's samples alone;
    /// None until observed. Placement reads `ttft_lines`, which lends a pool's shape to an endpoint without one.
    pub fn throughput(&self) -> Option<Fitted> {
        self.fit.lock().fitted()
    }

    /// The running sums behind `throughput`.
    pub fn throughput_fit(&self) -> ThroughputFit {
        *self.fit.lock()
    }

    /// The learned speed in estimated tokens per second; None until observed.
    pub fn tokens_per_sec(&self) -> Option<f64> {
        self.own.lock().fitted().map(|f| f.tokens_per_second)
    }

    /// Estimated time to first byte of `tokens` (overhead included), once a speed was observed.
    pub fn estimate(&self, tokens: u64) -> Option<Duration> {
        let f = self.own.lock().fitted()?;
        let secs = f.overhead_seconds + tokens as f64 / f.tokens_per_second;
        Duration::try_from_secs_f64(secs).ok()
    }
}

/// The pool's membership as pingora-load-balancing discovers it; `Pool::set_endpoints` replaces it (reload).
#[derive(Default)]
struct Membership {
    backends: RwLock<BTreeSet<Backend>>,
    /// Backend equality ignores `ext`, so the health check finds the current endpoint by address instead.
    by_addr: RwLock<HashMap<std::net::SocketAddr, Arc<Endpoint>>>,
}

impl Membership {
    fn endpoint(&self, target: &Backend) -> Option<Arc<Endpoint>> {
        let addr = target.addr.as_inet()?;
        self.by_addr.read().get(addr).cloned()
    }
}

#[async_trait]
impl ServiceDiscovery for Membership {
    async fn discover(&self) -> pingora_error::Result<(BTreeSet<Backend>, HashMap<u64, bool>)> {
        let set = self.backends.read().clone();
        Ok((set, HashMap::new()))
    }
}

/// How much longer a health check may take than its `timeout`: enough for the checker's connect timeout (the
/// same `timeout`) to fire first when the connect hangs.
const CONNECT_VERDICT_SLACK: Duration = Duration::from_millis(50);

/// The check never reached the engine: its connect failed (refused, timed out, no route).
fn is_connect_failure(e: &pingora_error::ErrorType) -> bool {
    use pingora_error::ErrorType::*;
    matches!(
        e,
        ConnectTimedout
            | ConnectRefused
            | ConnectNoRoute
            | ConnectError
            | ConnectProxyFailure
            | BindError
            | SocketError
            | TLSHandshakeFailure
            | TLSHandshakeTimedout
    )
}

/// Runs each endpoint's own HTTP check (its path, Host and API key) and keeps infergate's health state.
struct EndpointHealthCheck {
    /// The pool's settings, shared with it: a reload's `health_check` keys apply from the next check.
    pool_cfg: Arc<ArcSwap<PoolConfig>>,
    membership: Arc<Membership>,
    /// The pool's health panic as last logged, so that entering and leaving it are logged once each.
    panic_logged: AtomicBool,
}

impl EndpointHealthCheck {
    /// After an endpoint's health changed: log the pool entering or leaving its health panic.
    fn log_panic_change(&self, pool: &str) {
        let members: Vec<Arc<Endpoint>> =
            self.membership.by_addr.read().values().cloned().collect();
        let enabled = self.pool_cfg.load().health_check.route_when_all_unhealthy;
        let gate = HealthGate::of(enabled, &members);
        if self.panic_logged.swap(gate.panic, Ordering::Relaxed) == gate.panic {
            return;
        }
        if gate.panic {
            log::warn!(
                "pool {pool}: every endpoint fails its health check; placing across those that answer it until \
                 one passes (health_check.route_when_all_unhealthy)"
            );
        } else {
            log::info!("pool {pool}: an endpoint passes its health check again; placing on healthy ones only");
        }
    }
}

#[async_trait]
impl HealthCheck for EndpointHealthCheck {
    async fn check(&self, target: &Backend) -> pingora_error::Result<()> {
        let Some(ep) = self.membership.endpoint(target) else {
            return pingora_error::Error::e_explain(
                pingora_error::ErrorType::InternalError,
                "backend without endpoint",
            );
        };
        let current = ep.target();
        let hc = self.pool_cfg.load_full();
        let hc = &hc.health_check;
        // A little past the checker's own connect timeout (`timeout`), so that a connect that hangs is reported
        // as one, not as a slow answer.
        let limit = hc.timeout + CONNECT_VERDICT_SLACK;
        let result = match tokio::time::timeout(limit, current.checker.check(target)).await {
            Ok(r) => r,
            Err(_) => pingora_error::Error::e_explain(
                pingora_error::ErrorType::ReadTimedout,
                "health check timed out",
            ),
        };
        ep.health.note_reach(
            result
                .as_ref()
                .err()
                .is_none_or(|e| !is_connect_failure(e.etype())),
        );
        if result.is_ok() {
            ep.outlier.health_check_passed(Instant::now());
        }
        if let Some(new) = ep
            .health
            .record(result.is_ok(), hc.healthy_after, hc.unhealthy_after)
        {
            match (&result, new) {
                (Err(e), _) => log::warn!(
                    "pool {} endpoint {} is now {:?}: {}",
                    ep.pool,
                    ep.label,
                    new,
                    e
                ),
                (Ok(()), _) => {
                    log::info!("pool {} endpoint {} is now {:?}", ep.pool, ep.label, new)
                }
            }
            self.log_panic_change(&ep.pool);
        }
        result
    }

    fn health_threshold(&self, _success: bool) -> usize {
        // Pingora's own state mirrors each raw result; infergate's thresholds live in HealthTracker.
        1
    }
}

/// One configured pool at run time.
pub struct Pool {
    pub name: Arc<str>,
    /// The settings in effect, read per request and by the health checks; a reload swaps in new ones
    /// (`reconfigure`).
    cfg: Arc<ArcSwap<PoolConfig>>,
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
    pub recent: crate::status::RecentPlacements,
    /// Held from a placement's snapshot of the candidates until its hold is in the ledger, so that requests
    /// placed at the same moment on different worker threads see each other (a burst splits as planned).
    pub placing: Mutex<()>,
}

/// Forwards discovery to the shared membership so the pool can swap members.
struct SharedMembership(Arc<Membership>);

#[async_trait]
impl ServiceDiscovery for SharedMembership {
    async fn discover(&self) -> pingora_error::Result<(BTreeSet<Backend>, HashMap<u64, bool>)> {
        self.0.discover().await
    }
}

impl Pool {
    pub fn new(cfg: &PoolConfig) -> Arc<Pool> {
        let membership = Arc::new(Membership::default());
        let shared_cfg = Arc::new(ArcSwap::from_pointee(cfg.clone()));
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
            recent: crate::status::RecentPlacements::default(),
            placing: Mutex::new(()),
        });
        pool.set_endpoints(&cfg.endpoints, None);
        pool
    }

    /// The pool's settings in effect (cheap: no lock, no clone). Read them per request: a reload may swap them.
    pub fn cfg(&self) -> arc_swap::Guard<Arc<PoolConfig>> {
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
        let old = self.cfg.load_full();
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
        self.cfg.store(Arc::new(next));
        policy
    }

    /// The current endpoints (cheap: an Arc clone).
    pub fn endpoints(&self) -> Arc<Vec<Arc<Endpoint>>> {
        self.endpoints.load_full()
    }

    /// Replace the pool's endpoints (start and config reload): endpoints whose URL, address and key are unchanged
    /// keep their state; new ones get their metric series at 0; departing ones are marked removed and their metric
    /// series deleted. Returns the removed.
    pub fn set_endpoints(
        &self,
        wanted: &[EndpointConfig],
        metrics: Option<&Metrics>,
    ) -> Vec<Arc<Endpoint>> {
        let current = self.endpoints();
        let cfg = self.cfg();
        let mut next = Vec::with_capacity(wanted.len());
        for w in wanted {
            match current.iter().find(|e| e.label == w.label) {
                Some(e) => {
                    if e.retarget(w, &cfg.health_check) {
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
        let lines = ttft_lines(endpoints);
        let gate = self.health_gate(endpoints);
        let mut cands: Vec<Candidate> = endpoints
            .iter()
            .zip(lines)
            .map(|(e, line)| {
                let (peer_requests, peer_prefill_tokens) = e.peers.get();
                Candidate {
                    eligible: gate.admits(e) && !excluded.contains(&e.id),
                    requests: e.load.requests(),
                    prefill_tokens: e.load.prefill_tokens(),
                    peer_requests,
                    peer_prefill_tokens,
                    engine: e.stats.fresh(now),
                    max_in_flight,
                    prefill_speed: line,
                }
            })
            .collect();
        // Per endpoint: ejected, saturated. Each filter applies only if something eligible survives it.
        let state: Vec<(bool, bool)> = endpoints
            .iter()
            .map(|e| (e.outlier.is_ejected(), e.outlier.is_saturated(now)))
            .collect();
        for out in [|s: &(bool, bool)| s.0, |s: &(bool, bool)| s.1] {
            if cands.iter().zip(&state).any(|(c, s)| c.eligible && !out(s)) {
                for (c, s) in cands.iter_mut().zip(&state) {
                    c.eligible &= !out(s);
                }
            }
        }
        cands
    }

    /// Record a failure of `ep` (5xx answer, failed connect); ejects it when its streak is long enough and the
    /// pool's cap leaves room. Returns the ejection time if it was ejected now.
    pub fn record_failure(&self, ep: &Endpoint, now: Instant) -> Option<Duration> {
        let endpoints = self.endpoints();
        let ejected = endpoints.iter().filter(|e| e.outlier.is_ejected()).count();
        let cfg = self.cfg();
        let may_eject = ejected < cfg.outlier.max_ejected(endpoints.len());
        let d = ep.outlier.record_failure(&cfg.outlier, now, may_eject)?;
        log::warn!(
            "pool {} endpoint {}: ejected for {:?} after {} consecutive failures",
            self.name,
            ep.label,
            d,
            cfg.outlier.consecutive_failures
        );
        Some(d)
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

    /// Ask one healthy endpoint of a `"*"` pool which models it serves, for the router's `GET /v1/models`.
    pub async fn refresh_models(&self, client: &reqwest::Client, timeout: Duration) {
        let Some(ep) = self
            .endpoints()
            .iter()
            .find(|e| e.health.is_healthy())
            .cloned()
        else {
            return;
        };
        let mut req = client
            .get(format!("http://{}/v1/models", ep.label))
            .timeout(timeout);
        if let Some(key) = &ep.api_key() {
            req = req.bearer_auth(key);
        }
        let names = async {
            let v: serde_json::Value = req
                .send()
                .await
                .ok()?
                .error_for_status()
                .ok()?
                .json()
                .await
                .ok()?;
            let names: Vec<String> = v["data"]
                .as_array()?
                .iter()
                .filter_map(|m| m["id"].as_str().map(str::to_owned))
                .collect();
            Some(names)
        };
        if let Some(names) = names.await {
            *self.discovered_models.write() = names;
        }
    }
}

/// Every pool of the router.
pub struct Pools {
    pub pools: Vec<Arc<Pool>>,
    pub metrics: Arc<Metrics>,
}

impl Pools {
    pub fn new(cfg: &Config, metrics: Arc<Metrics>) -> Arc<Pools> {
        let pools = Arc::new(Pools {
            pools: cfg.pools.iter().map(Pool::new).collect(),
            metrics: metrics.clone(),
        });
        for p in &pools.pools {
            metrics.add_pool(&p.name);
            for e in p.endpoints().iter() {
                metrics.add_endpoint(&p.name, &e.label, p.reasons());
            }
        }
        let weak: std::sync::Weak<dyn LiveSource> =
            Arc::downgrade(&(pools.clone() as Arc<dyn LiveSource>));
        metrics.register_live(weak);
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
                p.refresh_models(
                    crate::engine_stats::shared_client(),
                    p.cfg().health_check.timeout,
                )
                .await;
            }
        }
    }
}

/// The queue-inclusive lines of one pool's endpoints, as placement reads them (`throughput::fleet_lines`).
fn ttft_lines(endpoints: &[Arc<Endpoint>]) -> Vec<Option<Fitted>> {
    let fits: Vec<ThroughputFit> = endpoints
        .iter()
        .map(|e| e.prefill_speed.throughput_fit())
        .collect();
    crate::placement::throughput::fleet_lines(&fits)
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

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    fn pool_cfg(extra: &str) -> PoolConfig {
        let text = format!("pools:\n  - name: a\n    endpoints: [\"http://127.0.0.1:9\"]\n{extra}");
        Config::parse(Path::new("t.yaml"), &text)
            .expect("valid")
            .pools[0]
            .clone()
    }

    #[test]
    fn health_counts_every_failed_check_and_every_change_of_state() {
        let h = HealthTracker::default();
        let record = |results: &[bool]| {
            for &ok in results {
                h.record(ok, 2, 3);
            }
        };
        // Down at the start (the first result decides), two passes to come back, three failures to leave.
        record(&[
            false, true, true, false, false, true, false, false, false, true,
        ]);
        assert_eq!(
            h.counts(),
            HealthCounts {
                failed_checks: 6,
                became_healthy: 1,
                became_unhealthy: 2,
            }
        );
        assert_eq!(h.get(), Health::Unhealthy);
    }

    #[test]
    fn the_health_gate_admits_failing_endpoints_only_when_none_passes() {
        let cfg = pool_cfg("");
        let endpoints: Vec<Arc<Endpoint>> = (0..3)
            .map(|_| {
                Arc::new(Endpoint::new(
                    Arc::from("a"),
                    &cfg.endpoints[0],
                    &cfg.health_check,
                ))
            })
            .collect();
        // Each endpoint's last check.
        #[derive(Clone, Copy)]
        enum Last {
            Unchecked,
            Passed,
            Answered,
            Unreachable,
        }
        use Last::*;
        let set = |states: [Last; 3]| {
            for (e, s) in endpoints.iter().zip(states) {
                *e.health.streak.lock() = (0, 0);
                e.health
                    .state
                    .store(Health::Unknown as u8, Ordering::Relaxed);
                let (ok, reached) = match s {
                    Unchecked => continue,
                    Passed => (true, true),
                    Answered => (false, true),
                    Unreachable => (false, false),
                };
                e.health.note_reach(reached);
                e.health.record(ok, 1, 1);
            }
        };
        let gate = |enabled| HealthGate::of(enabled, &endpoints);
        let admitted = |g: HealthGate| endpoints.iter().map(|e| g.admits(e)).collect::<Vec<_>>();
        // One healthy: only it.
        set([Passed, Answered, Unchecked]);
        assert_eq!(gate(true), HealthGate { panic: false });
        assert_eq!(admitted(gate(true)), [true, false, false]);
        // Every one failing: those whose engine answers, unless turned off.
        set([Answered, Unreachable, Answered]);
        assert_eq!(gate(true), HealthGate { panic: true });
        assert_eq!(admitted(gate(true)), [true, false, true]);
        assert_eq!(admitted(gate(false)), [false, false, false]);
        // None answers (all down): no panic, nothing admitted.
        set([Unreachable, Unreachable, Unreachable]);
        assert_eq!(gate(true), HealthGate { panic: false });
        assert_eq!(admitted(gate(true)), [false, false, false]);
        // Two failing, one not checked yet (start-up, an endpoint just added): no panic until it is.
        set([Answered, Answered, Unchecked]);
        assert_eq!(gate(true), HealthGate { panic: false });
        assert_eq!(admitted(gate(true)), [false, false, false]);
        assert_eq!(HealthGate::of(true, &[]), HealthGate { panic: false });
    }

    /// Twin engines (30 ms overhead, 100k tokens/s) fed the same mix of 2k and 100k prompts through `observe`;
    /// then the first serves a long prompt last, the second a short one.
    fn twins(observe: impl Fn(&PrefillSpeed, u64, Duration)) -> (PrefillSpeed, PrefillSpeed) {
        let ttft = |tokens: u64| Duration::from_secs_f64(0.03 + tokens as f64 / 100_000.0);
        let (a, b) = (PrefillSpeed::default(), PrefillSpeed::default());
        for i in 0..40u64 {
            for s in [&a, &b] {
                let tokens = if i % 4 == 0 { 100_000 } else { 2_000 + 50 * i };
                observe(s, tokens, ttft(tokens));
            }
        }
        observe(&a, 120_000, ttft(120_000));
        observe(&b, 1_500, ttft(1_500));
        (a, b)
    }

    #[test]
    fn twin_endpoints_learn_the_same_speed_whichever_served_the_last_long_prompt() {
        // The old ratio average read the first twin as about twice as fast, and `predicted_ttft` sent it every
        // long prompt after (the herding seen in the agent bench).
        let (a, b) = twins(PrefillSpeed::observe_throughput);
        let (fa, fb) = (a.throughput().unwrap(), b.throughput().unwrap());
        let ratio = fa.tokens_per_second / fb.tokens_per_second;
        assert!((0.95..=1.05).contains(&ratio), "{fa:?} {fb:?}");
        assert!(
            (fa.tokens_per_second / 100_000.0 - 1.0).abs() < 0.02,
            "{fa:?}"
        );
    }

    #[test]
    fn the_own_token_speed_and_its_estimates_do_not_swing_with_the_last_sample_either() {
        // The speed non-streaming holds are released by (and the status page shows).
        let small = PrefillSpeed::default();
        small.observe(500, Duration::from_millis(3));
        assert_eq!(
            small.estimate(1000),
            None,
            "small prompts alone teach no speed"
        );
        let (a, b) = twins(PrefillSpeed::observe);
        let (sa, sb) = (a.tokens_per_sec().unwrap(), b.tokens_per_sec().unwrap());
        assert!((0.95..=1.05).contains(&(sa / sb)), "{sa} {sb}");
        // A 50k-token prefill takes 0.53 s on this line; the old ratio average said 0.72 s after these samples.
        let e = a.estimate(50_000).unwrap().as_secs_f64();
        assert!((e - 0.53).abs() < 0.02, "{e}");
    }

    #[test]
    fn placement_reads_an_unlearned_twin_with_the_pools_shape() {
        let text = "pools:\n  - name: a\n    policy: predicted_ttft\n    endpoints: [\"http://127.0.0.1:9\", \"http://127.0.0.1:10\"]\n";
        let cfg = Config::parse(Path::new("t.yaml"), text)
            .expect("valid")
            .pools[0]
            .clone();
        let pool = Pool::new(&cfg);
        let endpoints = pool.endpoints();
        let ttft = |tokens: u64| Duration::from_secs_f64(0.03 + tokens as f64 / 100_000.0);
        for i in 0..100u64 {
            let wide = if i % 5 == 0 { 100_000 } else { 2_000 };
            endpoints[0]
                .prefill_speed
                .observe_throughput(wide, ttft(wide));
            let short = 1_500 + 10 * i;
            endpoints[1]
                .prefill_speed
                .observe_throughput(short, ttft(short));
        }
        let at =
            |f: Option<Fitted>, t: f64| f.map(|f| f.overhead_seconds + t / f.tokens_per_second);
        // Alone, the twin that served only short prompts reads a 100k prompt as about 2.5 s, not 1.03.
        assert!(at(endpoints[1].prefill_speed.throughput(), 100_000.0) > Some(2.0));
        let cands = pool.candidates(&endpoints, &[], Instant::now());
        for c in &cands {
            let t = at(c.prefill_speed, 100_000.0).unwrap();
            assert!((t - 1.03).abs() < 0.03, "{:?}", c.prefill_speed);
        }
    }

    #[test]
    fn reconfigure_swaps_the_settings_and_keeps_the_policy_settings_a_policy_refuses() {
        let pool = Pool::new(&pool_cfg("    sessions: { ttl: 1h }\n"));
        let now = Instant::now();
        let next = pool_cfg("    sessions: { ttl: 5m }\n    max_in_flight_per_endpoint: 3\n");
        assert_eq!(pool.reconfigure(&next, now), Ok(None));
        assert_eq!(pool.cfg().max_in_flight_per_endpoint, Some(3));
        assert_eq!(pool.cfg().policy, next.policy);
        let cands = pool.candidates(&pool.endpoints(), &[], now);
        assert_eq!(cands[0].max_in_flight, Some(3));
        // Sessions off is not a parameter change: refused, the rest still taken.
        let off = pool_cfg("    max_in_flight_per_endpoint: 5\n");
        assert!(pool.reconfigure(&off, now).is_err());
        assert_eq!(pool.cfg().policy, next.policy);
        assert_eq!(pool.cfg().max_in_flight_per_endpoint, Some(5));
    }
}
