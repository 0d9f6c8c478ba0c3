//! Discovery and health checks of every pool, each on its own interval, and a `"*"` pool's model list.

use std::time::Duration;

use async_trait::async_trait;
use pingora_core::server::ShutdownWatch;
use pingora_core::services::background::BackgroundService;
use pingora_core::services::ServiceReadyNotifier;

use crate::state::RouterState;

/// A `"*"` pool re-reads its engines' model list every this many health-check rounds.
const MODELS_REFRESH_CHECKS: u32 = 15;

/// Runs one round of checks before it is ready, then each pool's checks on its interval.
pub(super) struct HealthChecks {
    pub(super) state: RouterState,
}

#[async_trait]
impl BackgroundService for HealthChecks {
    async fn start_with_ready_notifier(
        &self,
        shutdown: ShutdownWatch,
        ready: ServiceReadyNotifier,
    ) {
        // One round of checks before the proxy accepts: endpoints start unknown, so this is what lets the first
        // requests through. Bounded by the slowest configured timeout.
        let first_round_limit = self
            .state
            .cfg
            .pools
            .iter()
            .map(|p| p.health_check.timeout)
            .max()
            .unwrap_or(Duration::from_secs(1))
            + Duration::from_secs(1);
        if tokio::time::timeout(first_round_limit, self.state.pools.refresh_now())
            .await
            .is_err()
        {
            log::warn!(
                "first health-check round did not finish in {first_round_limit:?}; starting anyway"
            );
        }
        ready.notify_ready();

        let mut tasks = tokio::task::JoinSet::new();
        for pool in &self.state.pools.pools {
            let pool = pool.clone();
            let mut stop = shutdown.clone();
            tasks.spawn(async move {
                let mut tick = tokio::time::interval(pool.cfg().health_check.interval);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                tick.tick().await;
                let mut models_due = MODELS_REFRESH_CHECKS;
                loop {
                    tokio::select! {
                        _ = tick.tick() => {}
                        _ = stop.changed() => return,
                    }
                    if let Err(e) = pool.lb.update().await {
                        log::warn!("pool {}: discovery failed: {e}", pool.name);
                    }
                    pool.lb.backends().run_health_check(true).await;
                    models_due = models_due.saturating_sub(1);
                    if models_due == 0 && pool.serves_any_model() {
                        models_due = MODELS_REFRESH_CHECKS;
                        pool.refresh_models(pool.cfg().health_check.timeout).await;
                    }
                }
            });
        }
        let mut stop = shutdown;
        let _ = stop.changed().await;
        tasks.shutdown().await;
    }
}
