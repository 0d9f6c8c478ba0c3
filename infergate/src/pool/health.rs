//! Endpoint health: the tracker with its thresholds, the gate that says who may take work (the health panic),
//! and the HTTP check that feeds them.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use parking_lot::Mutex;
use pingora_load_balancing::health_check::HealthCheck;
use pingora_load_balancing::Backend;

use super::membership::Membership;
use super::Endpoint;
use crate::config::PoolConfig;
use crate::metrics::HealthCounts;

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
    pub(super) state: AtomicU8,
    /// (consecutive successes, consecutive failures)
    pub(super) streak: Mutex<(usize, usize)>,
    /// Since the start: checks failed, and changes to each state (the first result included).
    failed_checks: AtomicU64,
    became_healthy: AtomicU64,
    became_unhealthy: AtomicU64,
    /// The last check reached the engine: it answered, wrongly or too slowly, rather than refuse the connect.
    last_check_reached: AtomicBool,
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
    pub(super) fn of(enabled: bool, endpoints: &[Arc<Endpoint>]) -> HealthGate {
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
pub(super) struct EndpointHealthCheck {
    /// The pool's settings, shared with it: a reload's `health_check` keys apply from the next check.
    pub(super) pool_cfg: Arc<crate::live::Live<PoolConfig>>,
    pub(super) membership: Arc<Membership>,
    /// The pool's health panic as last logged, so that entering and leaving it are logged once each.
    pub(super) panic_logged: AtomicBool,
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
        let hc = self.pool_cfg.load();
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
