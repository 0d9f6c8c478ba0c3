//! `prefix_aware`: the longest cached prompt prefix, gated against load (see `prefix`); owns the prefix index and,
//! for the legacy `qps` fallback only, the per-endpoint arrival window.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use parking_lot::Mutex;

use super::policy::{PlaceRequest, Placement, PlacementPolicy, Snapshot, Ticket};
use super::prefix::PrefixIndex;
use super::Reason;
use crate::config::{Policy, PolicyConfig, PoolConfig, PrefixConfig, PrefixFallback};

/// The window of the legacy `qps` fallback (production-stack's request-stats window).
pub const QPS_WINDOW: Duration = Duration::from_secs(60);

pub struct PrefixAware {
    /// The settings in effect (a reload may swap them); the index keeps its own copy.
    cfg: ArcSwap<PrefixConfig>,
    index: Mutex<PrefixIndex>,
    /// Arrival times per endpoint over the last minute; recorded only while the fallback is `qps`.
    arrivals: Mutex<HashMap<u64, VecDeque<Instant>>>,
}

impl PrefixAware {
    pub fn new(cfg: &PrefixConfig, bytes_per_token: f64) -> PrefixAware {
        PrefixAware {
            cfg: ArcSwap::from_pointee(cfg.clone()),
            index: Mutex::new(PrefixIndex::new(cfg, bytes_per_token)),
            arrivals: Mutex::new(HashMap::new()),
        }
    }

    /// Placements on `id` within the last minute (0 unless the `qps` fallback is configured).
    fn arrivals(&self, id: u64, now: Instant) -> u64 {
        self.arrivals.lock().get(&id).map_or(0, |q| {
            q.iter()
                .filter(|t| now.saturating_duration_since(**t) <= QPS_WINDOW)
                .count() as u64
        })
    }
}

impl PlacementPolicy for PrefixAware {
    fn name(&self) -> &'static str {
        Policy::PrefixAware.as_str()
    }

    fn reasons(&self) -> &'static [Reason] {
        &[Reason::PrefixHit, Reason::PrefixMiss, Reason::PrefixGated]
    }

    fn place(
        &self,
        req: &PlaceRequest,
        snap: &Snapshot,
        rng: &mut fastrand::Rng,
    ) -> Option<Placement> {
        // Hash before taking the index lock: the prompt may be long.
        let cfg = self.cfg.load();
        let hashes = PrefixIndex::hash_blocks(&cfg, req.model, req.prompt);
        let arrivals: Vec<u64> = match cfg.fallback {
            PrefixFallback::Qps => snap
                .ids
                .iter()
                .map(|&id| self.arrivals(id, snap.now))
                .collect(),
            PrefixFallback::LeastInflight => vec![0; snap.ids.len()],
        };
        let d = self
            .index
            .lock()
            .place(&hashes, snap.cands, snap.ids, &arrivals, rng)?;
        Some(Placement {
            index: d.index,
            reason: d.reason,
            estimate_bytes: req.body_bytes,
            estimate_tokens: req.tokens,
            ticket: Ticket {
                hashes,
                ..Ticket::NONE
            },
        })
    }

    fn dispatched(&self, endpoint: u64, _ticket: &Ticket, now: Instant) {
        if self.cfg.load().fallback == PrefixFallback::Qps {
            let mut a = self.arrivals.lock();
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
        if !ticket.hashes.is_empty() {
            self.index.lock().insert(endpoint, &ticket.hashes, now);
        }
    }

    fn endpoint_removed(&self, endpoint: u64) {
        self.index.lock().remove_endpoint(endpoint);
        self.arrivals.lock().remove(&endpoint);
    }

    fn reconfigure(&self, cfg: &PoolConfig, _now: Instant) -> Result<Option<String>, &'static str> {
        let PolicyConfig::PrefixAware { prefix } = &cfg.policy else {
            return Err("the pool's policy is not prefix_aware");
        };
        let rehash = prefix.block_bytes != self.cfg.load().block_bytes;
        // The index first: a request hashing with the new block size meanwhile only misses.
        let dropped = self
            .index
            .lock()
            .reconfigure(prefix, cfg.prefill.bytes_per_token);
        self.cfg.store(std::sync::Arc::new(prefix.clone()));
        if prefix.fallback != PrefixFallback::Qps {
            self.arrivals.lock().clear();
        }
        Ok((dropped > 0).then(|| {
            if rehash {
                format!(
                    "prefix index cleared ({dropped} blocks): block_bytes changes every block hash"
                )
            } else {
                format!("{dropped} prefix blocks beyond the new capacity dropped")
            }
        }))
    }
}
