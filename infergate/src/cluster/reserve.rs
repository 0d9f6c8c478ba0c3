//! Reservations: every dispatch counted for the other replicas at once (an atomic `HINCRBY` under a lease), not a
//! publish interval later, and read by their placements before they pick; the epoch that puts each dispatch in
//! either this replica's load record or its reservations, never both and never neither.
//!
//! Without them, a burst of new sessions spread over the replicas inside one publish interval is placed by each
//! replica on its own figures: every replica sees the same idle engines and the burst dogpiles them (the 4+4 split
//! of seed report 003, across replicas).
//!
//! The race with a publish: the publish bumps the epoch and snapshots the ledger under the write half of one lock;
//! a dispatch takes its hold and reads the epoch under the read half. So a dispatch tagged with epoch `E` is in the
//! record of epoch `E + 1` and later, not in `E`'s, and a reader counts a reservation exactly when its epoch is at
//! least the epoch of the record it holds for that replica (`wire::sum_peers`), whichever it read first.

use std::collections::HashMap;
use std::time::Instant;

use futures_util::future::join_all;
use parking_lot::RwLockReadGuard;

use super::wire::{self, PeerState};
use super::writer::Write;
use super::Cluster;
use crate::pool::{Endpoint, Pool};

/// A dispatch being made: holds off a publish's snapshot until [`Reserving::reserve`] (or drop).
pub struct Reserving<'a> {
    cluster: &'a Cluster,
    epoch: RwLockReadGuard<'a, u64>,
}

impl Reserving<'_> {
    /// The hold on `ep` exists (taken while this was held): reserve one request and `tokens` prefill tokens on it
    /// for the other replicas. Never waits; a down store or a full queue drops it (the next publish has it).
    pub fn reserve(self, ep: &Endpoint, tokens: u64) {
        let c = self.cluster;
        if !c.connected() {
            return;
        }
        let write = Write::Reserve {
            epoch: *self.epoch,
            url: crate::state_file::endpoint_url(ep),
            tokens,
        };
        drop(self.epoch);
        if c.writes.try_send(write).is_err() {
            c.metrics.error("reserve");
        }
    }
}

impl Cluster {
    /// Call before taking a dispatch's hold, and `reserve` once it is taken (no await in between).
    pub fn reserving(&self) -> Reserving<'_> {
        Reserving {
            cluster: self,
            epoch: self.epoch.read(),
        }
    }

    /// Bump the epoch and take this replica's load record for it, as one step for dispatches (see the module doc).
    pub(super) fn next_record(&self) -> wire::LoadRecord {
        let mut epoch = self.epoch.write();
        *epoch += 1;
        let mut rec = self.own_load();
        rec.epoch = *epoch;
        rec
    }

    /// Before placing a request in `pool`: read what the peers dispatched since their last records (one round
    /// trip, waiting at most `cluster.read_timeout`) and hand the sums to the pool's endpoints. Only peers whose
    /// record lists an endpoint of the pool are read (a replica lists every endpoint it has, busy or not). Never
    /// fails: on no answer the placement goes on with the figures of the last read.
    pub async fn refresh_peer_load(&self, pool: &Pool) {
        let urls: Vec<String> = pool
            .endpoints()
            .iter()
            .map(|e| crate::state_file::endpoint_url(e))
            .collect();
        let peers: Vec<String> = self
            .view
            .lock()
            .iter()
            .filter(|(_, p)| urls.iter().any(|u| p.record.endpoints.contains_key(u)))
            .map(|(name, _)| name.clone())
            .collect();
        if peers.is_empty() {
            return;
        }
        let Some(conn) = self.conn() else {
            return;
        };
        let reads = peers.iter().map(|p| {
            let mut conn = conn.clone();
            let key = self.keys.reserved(p);
            async move {
                redis::cmd("HGETALL")
                    .arg(key)
                    .query_async::<HashMap<String, String>>(&mut conn)
                    .await
            }
        });
        let t0 = Instant::now();
        let got = tokio::time::timeout(self.cfg.read_timeout, join_all(reads)).await;
        self.metrics
            .read_seconds
            .with_label_values(&["reservations"])
            .observe(t0.elapsed().as_secs_f64());
        let Ok(got) = got else {
            return self.metrics.error("read_reservations");
        };
        let mut view = self.view.lock();
        for (peer, fields) in peers.iter().zip(got) {
            let fields = match fields {
                Ok(f) => f,
                // A peer's key of another type: nothing reserved there (the peer replaces it).
                Err(e) if e.code() == Some("WRONGTYPE") => HashMap::new(),
                Err(e) => {
                    log::debug!("cluster: reading reservations failed: {e}");
                    self.metrics.error("read_reservations");
                    continue;
                }
            };
            if let Some(state) = view.get_mut(peer) {
                state.reserved = wire::parse_reservations(
                    fields
                        .into_iter()
                        .filter_map(|(k, v)| Some((k, v.parse().ok()?)))
                        .collect(),
                );
            }
        }
        self.apply_view(&view, [pool]);
    }

    /// Hand the peers' sums (records and the reservations they do not hold yet) to the endpoints of `pools`.
    pub(super) fn apply_view<'a>(
        &self,
        view: &HashMap<String, PeerState>,
        pools: impl IntoIterator<Item = &'a Pool>,
    ) {
        let sums = wire::sum_peers(view.values());
        for pool in pools {
            for e in pool.endpoints().iter() {
                let f = sums
                    .get(&crate::state_file::endpoint_url(e))
                    .copied()
                    .unwrap_or_default();
                e.peers.set(f.requests, f.prefill_tokens);
            }
        }
    }
}
