//! `prefix_aware`: the longest cached prompt prefix, gated against load (see `prefix`); owns the prefix index and,
//! for the legacy `qps` fallback only, the per-endpoint arrival window.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::policy::{PlaceRequest, Placement, PlacementPolicy, Snapshot, Ticket};
use super::prefix::PrefixIndex;
use crate::config::{PrefixConfig, PrefixFallback};

/// The window of the legacy `qps` fallback (production-stack's request-stats window).
pub const QPS_WINDOW: Duration = Duration::from_secs(60);

pub struct PrefixAware {
    cfg: PrefixConfig,
    index: Mutex<PrefixIndex>,
    /// Arrival times per endpoint over the last minute; kept only for the `qps` fallback.
    arrivals: Option<Mutex<HashMap<u64, VecDeque<Instant>>>>,
}

impl PrefixAware {
    pub fn new(cfg: &PrefixConfig, bytes_per_token: f64) -> PrefixAware {
        PrefixAware {
            cfg: cfg.clone(),
            index: Mutex::new(PrefixIndex::new(cfg, bytes_per_token)),
            arrivals: (cfg.fallback == PrefixFallback::Qps).then(|| Mutex::new(HashMap::new())),
        }
    }

    /// Placements on `id` within the last minute (0 unless the `qps` fallback is configured).
    fn arrivals(&self, id: u64, now: Instant) -> u64 {
        let Some(a) = &self.arrivals else { return 0 };
        a.lock().get(&id).map_or(0, |q| {
            q.iter()
                .filter(|t| now.saturating_duration_since(**t) <= QPS_WINDOW)
                .count() as u64
        })
    }
}

impl PlacementPolicy for PrefixAware {
    fn place(
        &self,
        req: &PlaceRequest,
        snap: &Snapshot,
        rng: &mut fastrand::Rng,
    ) -> Option<Placement> {
        // Hash before taking the index lock: the prompt may be long.
        let hashes = PrefixIndex::hash_blocks(&self.cfg, req.model, req.prompt);
        let arrivals: Vec<u64> = snap
            .ids
            .iter()
            .map(|&id| self.arrivals(id, snap.now))
            .collect();
        let d = self
            .index
            .lock()
            .place(&hashes, snap.cands, snap.ids, &arrivals, rng)?;
        Some(Placement {
            index: d.index,
            reason: d.reason,
            estimate_bytes: req.body_bytes,
            ticket: Ticket::Prefix(hashes),
        })
    }

    fn dispatched(&self, endpoint: u64, _ticket: &Ticket, now: Instant) {
        if let Some(a) = &self.arrivals {
            let mut a = a.lock();
            let q = a.entry(endpoint).or_default();
            q.push_back(now);
            while q
                .front()
                .is_some_and(|t| now.saturating_duration_since(*t) > QPS_WINDOW)
            {
                q.pop_front();
            }
        }
    }

    fn served(&self, endpoint: u64, ticket: &Ticket, now: Instant) {
        // Only an engine that accepted the prompt caches it: a refused or failed attempt leaves no trace. A gated
        // placement inserts too, so a hot prefix replicates.
        if let Ticket::Prefix(hashes) = ticket {
            self.index.lock().insert(endpoint, hashes, now);
        }
    }

    fn endpoint_removed(&self, endpoint: u64) {
        self.index.lock().remove_endpoint(endpoint);
        if let Some(a) = &self.arrivals {
            a.lock().remove(&endpoint);
        }
    }
}
