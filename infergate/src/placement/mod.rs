//! Placement policies: pure functions from a snapshot of candidate endpoints to a decision with a reason.
//!
//! Nothing here does I/O, reads a clock or knows Pingora: the proxy builds the snapshot from live counters and
//! passes time and randomness in, so every rule is a plain unit test.

pub mod least_request;
pub mod load_aware;
pub mod policy;
pub mod prefix;
pub mod prefix_aware;
pub mod round_robin;
pub mod sessions;

/// What one request costs in the load score, in prefill-token units: a request in flight weighs as much as a
/// 16k-token prompt, so requests dominate unless a prefill is really long (the LLMKube design).
pub const REQUEST_WEIGHT_TOKENS: u64 = 16_384;

/// Engine-reported load, only ever passed in when fresh.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct EngineLoad {
    pub running: u64,
    pub waiting: u64,
    /// KV cache usage, 0..=1.
    pub kv_usage: f64,
}

/// KV usage at or above which an endpoint is "full" and is no migration target.
pub const KV_FULL: f64 = 0.98;

/// One endpoint as placement sees it.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Candidate {
    /// Healthy and not excluded (e.g. already tried by this request).
    pub eligible: bool,
    /// infergate's own requests in flight to this endpoint.
    pub requests: u64,
    /// infergate's estimated prefill tokens in flight.
    pub prefill_tokens: u64,
    /// Other router replicas' requests in flight to this endpoint (`cluster`; 0 without).
    pub peer_requests: u64,
    /// Other router replicas' estimated prefill tokens in flight (`cluster`; 0 without).
    pub peer_prefill_tokens: u64,
    /// Fresh engine stats, if any.
    pub engine: Option<EngineLoad>,
    /// Per-endpoint in-flight limit from the config.
    pub max_in_flight: Option<u64>,
}

impl Candidate {
    /// Requests in flight from this replica and its peers (live counts, exact up to a publish interval).
    pub fn live_requests(&self) -> u64 {
        self.requests.saturating_add(self.peer_requests)
    }

    /// Estimated prefill tokens in flight from this replica and its peers.
    pub fn live_prefill_tokens(&self) -> u64 {
        self.prefill_tokens.saturating_add(self.peer_prefill_tokens)
    }

    /// Requests in flight, counting traffic from other routers: the engine's running + waiting includes the
    /// routers' own requests, so take the larger of the two instead of adding them.
    pub fn request_load(&self) -> u64 {
        match self.engine {
            Some(e) => self.live_requests().max(e.running + e.waiting),
            None => self.live_requests(),
        }
    }

    /// The load_aware score: requests × 16384 + prefill tokens in flight. Lower is better.
    pub fn score(&self) -> u64 {
        self.request_load()
            .saturating_mul(REQUEST_WEIGHT_TOKENS)
            .saturating_add(self.live_prefill_tokens())
    }

    /// Fresh stats show a queue, or our own in-flight count reached the configured limit.
    pub fn has_queue(&self) -> bool {
        self.engine.is_some_and(|e| e.waiting > 0) || self.at_limit()
    }

    /// This replica's own requests reached `max_in_flight_per_endpoint`. Peers' requests do not count: the wait
    /// queue is woken by this replica's own releases, and each replica's limit is its share.
    pub fn at_limit(&self) -> bool {
        self.max_in_flight.is_some_and(|m| self.requests >= m)
    }

    pub fn kv_full(&self) -> bool {
        self.engine.is_some_and(|e| e.kv_usage >= KV_FULL)
    }
}

/// Why a request went where it went: the `reason` label of `infergate_placements_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    RoundRobin,
    LeastRequest,
    LoadAware,
    NewSession,
    Sticky,
    Migrate,
    Spill,
    Fallback,
    Headerless,
    PrefixHit,
    PrefixMiss,
    PrefixGated,
}

impl Reason {
    /// Every reason, in declaration order (`index` is the position here).
    pub const ALL: [Reason; 12] = [
        Reason::RoundRobin,
        Reason::LeastRequest,
        Reason::LoadAware,
        Reason::NewSession,
        Reason::Sticky,
        Reason::Migrate,
        Reason::Spill,
        Reason::Fallback,
        Reason::Headerless,
        Reason::PrefixHit,
        Reason::PrefixMiss,
        Reason::PrefixGated,
    ];

    /// Position in `ALL`.
    pub fn index(self) -> usize {
        self as usize
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Reason::RoundRobin => "round_robin",
            Reason::LeastRequest => "least_request",
            Reason::LoadAware => "load_aware",
            Reason::NewSession => "new_session",
            Reason::Sticky => "sticky",
            Reason::Migrate => "migrate",
            Reason::Spill => "spill",
            Reason::Fallback => "fallback",
            Reason::Headerless => "headerless",
            Reason::PrefixHit => "prefix_hit",
            Reason::PrefixMiss => "prefix_miss",
            Reason::PrefixGated => "prefix_gated",
        }
    }
}

/// A placement: the index into the candidate slice and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    pub index: usize,
    pub reason: Reason,
}

/// Estimated prompt tokens for a body of `bytes` bytes: bytes / bytes_per_token, capped.
pub fn estimate_tokens(bytes: u64, bytes_per_token: f64, max_tokens: u64) -> u64 {
    if bytes == 0 || bytes_per_token.is_nan() || bytes_per_token <= 0.0 {
        return 0;
    }
    ((bytes as f64 / bytes_per_token).ceil() as u64).min(max_tokens)
}

/// Uniform pick among the eligible indices whose key is minimal (exact ties), never "first in the list".
pub fn pick_min_by_key(
    cands: &[Candidate],
    rng: &mut fastrand::Rng,
    key: impl Fn(&Candidate) -> u64,
) -> Option<usize> {
    pick_within(cands, rng, 0, key)
}

/// Uniform pick among eligible indices whose key is within `slack` of the minimum.
pub fn pick_within(
    cands: &[Candidate],
    rng: &mut fastrand::Rng,
    slack: u64,
    key: impl Fn(&Candidate) -> u64,
) -> Option<usize> {
    let min = cands.iter().filter(|c| c.eligible).map(&key).min()?;
    let limit = min.saturating_add(slack);
    // Reservoir sampling: one pass, no allocation on the request path.
    let mut chosen = None;
    let mut seen = 0u32;
    for (i, c) in cands.iter().enumerate() {
        if c.eligible && key(c) <= limit {
            seen += 1;
            if rng.u32(0..seen) == 0 {
                chosen = Some(i);
            }
        }
    }
    chosen
}

/// `least_inflight`: the endpoints within +1 of the minimum combined load (engine stats can lag by a scrape
/// interval, so their exact minimum means little), and among those the fewest of the routers' own requests in
/// flight (live: this replica's and its peers'), random ties. A burst inside one scrape interval neither dogpiles one endpoint nor drifts:
/// 8 new sessions on 2 equally busy endpoints split 4/4.
pub fn least_inflight(cands: &[Candidate], rng: &mut fastrand::Rng) -> Option<usize> {
    let min = cands
        .iter()
        .filter(|c| c.eligible)
        .map(Candidate::request_load)
        .min()?;
    let near = |c: &Candidate| c.eligible && c.request_load() <= min.saturating_add(1);
    let own_min = cands
        .iter()
        .filter(|c| near(c))
        .map(Candidate::live_requests)
        .min()?;
    let mut chosen = None;
    let mut seen = 0u32;
    for (i, c) in cands.iter().enumerate() {
        if near(c) && c.live_requests() == own_min {
            seen += 1;
            if rng.u32(0..seen) == 0 {
                chosen = Some(i);
            }
        }
    }
    chosen
}

/// `load_aware`: minimise requests × 16384 + prefill tokens; exact ties at random.
pub fn load_aware(cands: &[Candidate], rng: &mut fastrand::Rng) -> Option<usize> {
    pick_min_by_key(cands, rng, Candidate::score)
}

/// `load_aware` without the prefill term (benchmark baseline): requests only, random ties.
pub fn least_request(cands: &[Candidate], rng: &mut fastrand::Rng) -> Option<usize> {
    pick_min_by_key(cands, rng, Candidate::request_load)
}

/// `round_robin`: the next eligible endpoint after `counter` (the caller increments it per request).
pub fn round_robin(cands: &[Candidate], counter: usize) -> Option<usize> {
    let n = cands.len();
    (0..n)
        .map(|k| (counter + k) % n)
        .find(|&i| cands[i].eligible)
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn cand(requests: u64, prefill: u64) -> Candidate {
        Candidate {
            eligible: true,
            requests,
            prefill_tokens: prefill,
            ..Default::default()
        }
    }

    #[test]
    fn endpoint_mid_cold_prefill_loses_a_tie() {
        let cands = [cand(2, 140_000), cand(2, 0)];
        let mut rng = fastrand::Rng::with_seed(1);
        for _ in 0..100 {
            assert_eq!(load_aware(&cands, &mut rng), Some(1));
        }
    }

    #[test]
    fn fewer_requests_plus_cold_prefill_loses_to_more_warm_requests() {
        // 1 request with a 140k cold prefill vs 5 warm decoding requests: 16384+140000 > 5*16384.
        let cands = [cand(1, 140_000), cand(5, 2_000)];
        let mut rng = fastrand::Rng::with_seed(2);
        assert_eq!(load_aware(&cands, &mut rng), Some(1));
        // least_request would have picked the busy one.
        assert_eq!(least_request(&cands, &mut rng), Some(0));
    }

    #[test]
    fn estimate_is_capped_and_zero_for_empty() {
        assert_eq!(estimate_tokens(0, 4.0, 262_144), 0);
        assert_eq!(estimate_tokens(4000, 4.0, 262_144), 1000);
        assert_eq!(estimate_tokens(4001, 4.0, 262_144), 1001);
        assert_eq!(estimate_tokens(10 << 20, 4.0, 262_144), 262_144);
    }

    #[test]
    fn random_ties_spread_a_burst() {
        let cands = [cand(0, 0), cand(0, 0), cand(0, 0), cand(0, 0)];
        let mut rng = fastrand::Rng::with_seed(3);
        let mut counts = [0u32; 4];
        for _ in 0..4000 {
            counts[load_aware(&cands, &mut rng).unwrap()] += 1;
        }
        for c in counts {
            assert!((800..1200).contains(&c), "{counts:?}");
        }
    }

    #[test]
    fn ineligible_endpoints_are_never_picked() {
        let mut cands = [cand(10, 0), cand(0, 0)];
        cands[1].eligible = false;
        let mut rng = fastrand::Rng::with_seed(4);
        assert_eq!(load_aware(&cands, &mut rng), Some(0));
        cands[0].eligible = false;
        assert_eq!(load_aware(&cands, &mut rng), None);
        assert_eq!(round_robin(&cands, 0), None);
    }

    #[test]
    fn round_robin_rotates_over_eligible() {
        let mut cands = [cand(0, 0), cand(0, 0), cand(0, 0)];
        cands[1].eligible = false;
        let picks: Vec<_> = (0..4).map(|k| round_robin(&cands, k).unwrap()).collect();
        assert_eq!(picks, vec![0, 2, 2, 0]);
    }

    #[test]
    fn least_inflight_uses_the_slack_for_stale_stats_and_live_counts_for_the_rest() {
        let mut rng = fastrand::Rng::with_seed(5);
        // Stats say 5 vs 6 (within +1); our own live counts say 3 vs 1: the live count decides.
        let mut a = cand(3, 0);
        a.engine = Some(EngineLoad {
            running: 5,
            waiting: 0,
            kv_usage: 0.1,
        });
        let mut b = cand(1, 0);
        b.engine = Some(EngineLoad {
            running: 6,
            waiting: 0,
            kv_usage: 0.1,
        });
        assert_eq!(least_inflight(&[a, b], &mut rng), Some(1));
        // Outside the slack the combined load excludes an endpoint whatever our own count says.
        b.engine = Some(EngineLoad {
            running: 7,
            waiting: 0,
            kv_usage: 0.1,
        });
        assert_eq!(least_inflight(&[a, b], &mut rng), Some(0));
        // Equal everything: random.
        let mut seen = [0; 2];
        for _ in 0..200 {
            seen[least_inflight(&[cand(2, 0), cand(2, 0)], &mut rng).unwrap()] += 1;
        }
        assert!(seen[0] > 50 && seen[1] > 50, "{seen:?}");
    }

    #[test]
    fn engine_stats_add_foreign_load_without_double_counting() {
        let mut c = cand(3, 0);
        c.engine = Some(EngineLoad {
            running: 2,
            waiting: 0,
            kv_usage: 0.1,
        });
        assert_eq!(c.request_load(), 3, "our 3 requests include the engine's 2");
        c.engine = Some(EngineLoad {
            running: 7,
            waiting: 2,
            kv_usage: 0.1,
        });
        assert_eq!(c.request_load(), 9, "another router's traffic counts");
    }

    #[test]
    fn peers_load_adds_to_the_live_figures_and_the_engine_stats_still_do_not_double_count() {
        let mut rng = fastrand::Rng::with_seed(6);
        // Another replica holds a 100k-token prefill on endpoint 0: this replica's own figures are equal.
        let mut held = cand(0, 0);
        held.peer_requests = 1;
        held.peer_prefill_tokens = 100_000;
        for _ in 0..50 {
            assert_eq!(load_aware(&[held, cand(0, 0)], &mut rng), Some(1));
            assert_eq!(least_request(&[held, cand(0, 0)], &mut rng), Some(1));
            assert_eq!(least_inflight(&[held, cand(0, 0)], &mut rng), Some(1));
        }
        assert_eq!(held.score(), REQUEST_WEIGHT_TOKENS + 100_000);
        // Engine stats count every router's requests: the larger of the two, never the sum.
        let mut c = cand(2, 0);
        c.peer_requests = 3;
        c.engine = Some(EngineLoad {
            running: 4,
            waiting: 0,
            kv_usage: 0.1,
        });
        assert_eq!(c.request_load(), 5);
        // The limit is this replica's own.
        c.max_in_flight = Some(3);
        assert!(!c.at_limit());
    }

    #[test]
    fn every_reason_is_listed_once_at_its_index() {
        for (i, r) in Reason::ALL.iter().enumerate() {
            assert_eq!(r.index(), i, "{}", r.as_str());
        }
        let mut names: Vec<&str> = Reason::ALL.iter().map(|r| r.as_str()).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), Reason::ALL.len());
    }
}
