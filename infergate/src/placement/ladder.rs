//! The session ladder both session-keeping policies climb: new session, fallback, the policy's pressure rules
//! (migrate, spill), sticky. A policy brings the cost that ranks endpoints for the request; the ladder keeps the
//! rungs and their order, and every pick on it is [`pick_min`] over that cost.

use std::ops::Add;

use super::{pick_min, Candidate, Reason};

/// Where a session request's binding stands before the ladder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bound {
    /// No live binding: a new session.
    None,
    /// The bound endpoint left the pool or is not eligible now.
    Gone,
    /// Bound to the eligible candidate at this index.
    At(usize),
}

impl Bound {
    /// The binding of a live bound endpoint id (None without a live binding), as a candidate index.
    pub fn of(endpoint: Option<u64>, cands: &[Candidate], ids: &[u64]) -> Bound {
        let Some(id) = endpoint else {
            return Bound::None;
        };
        match ids.iter().position(|&i| i == id) {
            Some(b) if cands.get(b).is_some_and(|c| c.eligible) => Bound::At(b),
            _ => Bound::Gone,
        }
    }
}

/// The candidates and the cost a policy ranks them by for one request: `cost(i, c)` of candidate `i` (None: it
/// cannot be ranked), ties within `slack` broken at random.
pub struct Ladder<'a, K, F> {
    pub cands: &'a [Candidate],
    slack: K,
    cost: F,
}

impl<'a, K, F> Ladder<'a, K, F>
where
    K: Copy + PartialOrd + Add<Output = K>,
    F: Fn(usize, &Candidate) -> Option<K>,
{
    pub fn new(cands: &'a [Candidate], slack: K, cost: F) -> Self {
        Ladder { cands, slack, cost }
    }

    /// The cheapest eligible candidate that `allow` accepts; ties at random.
    pub fn cheapest(
        &self,
        rng: &mut fastrand::Rng,
        allow: impl Fn(usize, &Candidate) -> bool,
    ) -> Option<usize> {
        pick_min(self.cands, rng, self.slack, |i, c| {
            allow(i, c).then(|| (self.cost)(i, c)).flatten()
        })
    }

    /// A turn whose bound endpoint `b` reached its limit: the cheapest other endpoint not at its own, one whose KV
    /// cache is not full preferred. A hard limit is a constraint, not a cost: the binding is kept.
    pub fn spill_at_limit(&self, rng: &mut fastrand::Rng, b: usize) -> Option<usize> {
        self.cheapest(rng, |i, c| i != b && !c.at_limit() && !c.kv_full())
            .or_else(|| self.cheapest(rng, |i, c| i != b && !c.at_limit()))
    }

    /// Climb for one session request: `NewSession` or `Fallback` to the cheapest endpoint; on a bound, eligible
    /// endpoint the policy's `pressure` rules, which may move this turn (`Migrate`, `Spill`), else `Sticky`. None
    /// when no candidate is eligible.
    pub fn climb(
        &self,
        rng: &mut fastrand::Rng,
        bound: Bound,
        pressure: impl FnOnce(&Self, &mut fastrand::Rng, usize) -> Option<(usize, Reason)>,
    ) -> Option<(usize, Reason)> {
        match bound {
            Bound::None => Some((self.cheapest(rng, |_, _| true)?, Reason::NewSession)),
            Bound::Gone => Some((self.cheapest(rng, |_, _| true)?, Reason::Fallback)),
            Bound::At(b) => Some(pressure(self, rng, b).unwrap_or((b, Reason::Sticky))),
        }
    }
}
