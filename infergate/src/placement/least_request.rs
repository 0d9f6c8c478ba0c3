//! `least_request`: fewest requests in flight, random ties (load_aware without the prefill term).

use super::policy::{PlaceRequest, Placement, PlacementPolicy, Snapshot};
use super::Reason;

#[derive(Debug, Default)]
pub struct LeastRequest;

impl PlacementPolicy for LeastRequest {
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
