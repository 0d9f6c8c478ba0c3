//! `least_request`: fewest requests in flight, random ties (load_aware without the prefill term).

use super::policy::{PlaceRequest, Placement, PlacementPolicy, Snapshot};
use super::Reason;
use crate::config::Policy;

#[derive(Debug, Default)]
pub struct LeastRequest;

impl PlacementPolicy for LeastRequest {
    fn name(&self) -> &'static str {
        Policy::LeastRequest.as_str()
    }

    fn reasons(&self) -> &'static [Reason] {
        &[Reason::LeastRequest]
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
        rng: &mut fastrand::Rng,
    ) -> Option<Placement> {
        let index = super::least_request(snap.cands, rng)?;
        Some(Placement::whole(index, Reason::LeastRequest, req))
    }
}
