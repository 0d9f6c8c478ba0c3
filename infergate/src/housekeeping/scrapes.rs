//! Engine-stats scrapes: one loop per endpoint of every pool that reads its engines' `/metrics`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use pingora_core::server::ShutdownWatch;
use pingora_core::services::background::BackgroundService;

use crate::pool::Pools;

pub(super) struct Scrapes {
    pub(super) pools: Arc<Pools>,
}

#[async_trait]
impl BackgroundService for Scrapes {
    async fn start(&self, mut stop: ShutdownWatch) {
        let mut tasks = tokio::task::JoinSet::new();
        for pool in &self.pools.pools {
            if let Some(stats_cfg) = pool.cfg().engine_stats.clone() {
                tasks.spawn(run_pool_scrapes(pool.clone(), stats_cfg, stop.clone()));
            }
        }
        let _ = stop.changed().await;
        tasks.shutdown().await;
    }
}

/// Keep one scrape loop per current endpoint of a pool (endpoints may come and go on reload, and a reload may
/// rotate an endpoint's key or change the scrape settings: its loop restarts with the new ones); each records its
/// outcome in the endpoint's stats cell.
async fn run_pool_scrapes(
    pool: Arc<crate::pool::Pool>,
    mut cfg: crate::config::EngineStatsConfig,
    mut stop: ShutdownWatch,
) {
    use std::collections::HashMap;
    type Loop = (tokio::sync::watch::Sender<bool>, Arc<crate::pool::Target>);
    let mut loops: HashMap<u64, Loop> = HashMap::new();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        let endpoints = pool.endpoints();
        let changed = match &pool.cfg().engine_stats {
            Some(now) if *now != cfg => {
                cfg = now.clone();
                for e in endpoints.iter() {
                    e.stats.enable(cfg.interval);
                }
                true
            }
            _ => false,
        };
        loops.retain(|id, (tx, target)| {
            let keep = !changed
                && endpoints
                    .iter()
                    .any(|e| e.id == *id && Arc::ptr_eq(&e.target(), target));
            if !keep {
                let _ = tx.send(true);
            }
            keep
        });
        for ep in endpoints.iter() {
            if loops.contains_key(&ep.id) {
                continue;
            }
            let (tx, rx) = tokio::sync::watch::channel(false);
            let current = ep.target();
            let api_key = current.api_key.clone();
            let side = current.side().ok().cloned();
            loops.insert(ep.id, (tx, current));
            let Some(side) = side else {
                // Its target warned when it was built; every reload tries again (a new target restarts this).
                // Placement reads its stats as down.
                continue;
            };
            let sink_ep = ep.clone();
            let sent_ep = ep.clone();
            let target = crate::engine_stats::ScrapeTarget {
                pool: pool.name.to_string(),
                endpoint: ep.label.clone(),
                client: side,
                api_key,
                cfg: cfg.clone(),
                cell: Arc::new(move |mut outcome| {
                    // Our own count while the scrape was under way (its most): the engine's figure less it is the
                    // foreign load.
                    if let crate::engine_stats::ScrapeOutcome::Good(load) = &mut outcome {
                        load.own_at_sample = sink_ep.load.requests_since_mark();
                    }
                    sink_ep.stats.record_outcome(Instant::now(), &outcome)
                }),
                on_send: Arc::new(move || sent_ep.load.mark_requests()),
            };
            tokio::spawn(crate::engine_stats::scrape_loop(target, rx));
        }
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => break,
        }
    }
    for (tx, _) in loops.values() {
        let _ = tx.send(true);
    }
}
