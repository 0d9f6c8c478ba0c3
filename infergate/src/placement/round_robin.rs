//! `round_robin`: the next healthy endpoint in turn; holds no prefill tokens (the baseline).

use std::sync::atomic::{AtomicUsize, Ordering};

use super::policy::{PlaceRequest, Placement, PlacementPolicy, Snapshot};
use super::Reason;
use crate::config::Policy;

#[derive(Debug, Default)]
pub struct RoundRobin {
    next: AtomicUsize,
}

impl PlacementPolicy for RoundRobin {
    fn name(&self) -> &'static str {
        Policy::RoundRobin.as_str()
    }

    fn reasons(&self) -> &'static [Reason] {
        &[Reason::RoundRobin]
    }

    /// No parameters of its own: a reload has nothing to change.
    fn reconfigure(
        &self,
        _cfg: &crate::config::PoolConfig,
        _now: std::time::Instant,
    ) -> Result<Option<String>, &'static str> {
        Ok(None)
    }

    fn place(
        &self,
        req: &PlaceRequest,
        snap: &Snapshot,
        _rng: &mut fastrand::Rng,
    ) -> Option<Placement> {
        let counter = self.next.fetch_add(1, Ordering::Relaxed);
        let index = super::round_robin(snap.cands, counter)?;
        Some(Placement::whole(index, Reason::RoundRobin, req))
    }

    fn counts_tokens(&self) -> bool {
        false
    }
}
