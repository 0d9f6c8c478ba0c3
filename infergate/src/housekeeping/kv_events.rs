//! KV-event subscribers: one loop per endpoint that names a publisher (`endpoints[N].kv_events`), each filling the
//! endpoint's index. Endpoints and their settings may change on reload: a changed subscription restarts its loop
//! with an empty index.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use pingora_core::server::ShutdownWatch;
use pingora_core::services::background::BackgroundService;

use crate::config::KvSubscription;
use crate::pool::Pools;

pub(super) struct KvEvents {
    pub(super) pools: Arc<Pools>,
}

#[async_trait]
impl BackgroundService for KvEvents {
    async fn start(&self, mut stop: ShutdownWatch) {
        // Per endpoint id: its loop's stop and what it follows.
        let mut loops: HashMap<u64, (tokio::sync::watch::Sender<bool>, KvSubscription)> =
            HashMap::new();
        let mut tick = tokio::time::interval(Duration::from_secs(1));
        loop {
            let mut seen = Vec::new();
            for pool in &self.pools.pools {
                let cfg = pool.cfg();
                for ep in pool.endpoints().iter() {
                    let want = cfg.kv_subscription(&ep.label);
                    let running = loops.get(&ep.id).map(|(_, s)| s);
                    if running != want.as_ref() {
                        if let Some((tx, _)) = loops.remove(&ep.id) {
                            let _ = tx.send(true);
                        }
                        ep.kv.configure(want.clone());
                        if let Some(sub) = want {
                            let (tx, rx) = tokio::sync::watch::channel(false);
                            tokio::spawn(crate::kv_events::subscribe_loop(
                                ep.kv.clone(),
                                sub.clone(),
                                rx,
                            ));
                            loops.insert(ep.id, (tx, sub));
                        }
                    }
                    seen.push(ep.id);
                }
            }
            loops.retain(|id, (tx, _)| {
                let keep = seen.contains(id);
                if !keep {
                    let _ = tx.send(true);
                }
                keep
            });
            tokio::select! {
                _ = tick.tick() => {}
                _ = stop.changed() => break,
            }
        }
        for (tx, _) in loops.values() {
            let _ = tx.send(true);
        }
    }
}
