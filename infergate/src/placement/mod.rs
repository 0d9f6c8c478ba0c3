//! Placement policies: pure functions from a snapshot of candidate endpoints to a decision with a reason.
//!
//! Nothing here does I/O, reads a clock or knows Pingora: the proxy builds the snapshot from live counters and
//! passes time and randomness in, so every rule is a plain unit test.

pub mod arrivals;
pub mod decode;
pub mod decode_leg;
pub mod factory;
pub mod ladder;
pub mod least_request;
pub mod line;
pub mod load_aware;
pub mod policy;
pub mod predicted;
pub mod predicted_ttft;
pub mod prefix;
pub mod prefix_aware;
pub mod round_robin;
pub mod sessions;
pub mod throughput;

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
    /// infergate's own requests in flight to this endpoint while the sample was taken: the most between sending the
    /// scrape and its answer (set by the scraper; the parser leaves 0). The engine's running + waiting less this is
    /// the load placed elsewhere ("foreign").
    pub own_at_sample: u64,
}

impl EngineLoad {
    /// Requests the engine holds that infergate did not place (other routers, direct clients), as of the sample.
    pub fn foreign(&self) -> u64 {
        (self.running + self.waiting).saturating_sub(self.own_at_sample)
    }

    /// `foreign` less our cluster peers' requests, which the ledger already has.
    pub fn foreign_beyond(&self, peer_requests: u64) -> u64 {
        self.foreign().saturating_sub(peer_requests)
    }
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
    /// Learned time to first byte as a line over the prefill tokens to compute first (tokens ahead at dispatch
    /// plus the request's own): overhead and tokens per second; None until observed. Read by `predicted_ttft`.
    pub prefill_speed: Option<throughput::Fitted>,
    /// Tokens of this request the endpoint's engine holds, exactly, by its KV-cache events (`kv_events`): None
    /// when unknown (no events, an untrusted index, no token ids), and then the approximate prefix index stands.
    /// `predicted_ttft` and `prefix_aware` read it before their own index.
    pub kv_held_tokens: Option<u64>,
    /// Requests that failed on this endpoint (or whose client left before any answer) since it last served one:
    /// they weigh as requests in flight, so a fast failure never makes it look idle (`outlier`).
    pub debt_requests: u64,
    /// Their prefill tokens.
    pub debt_tokens: u64,
    /// Of `requests`, those still waiting for their first output (queued or prefilling): the others decode.
    pub prefilling: u64,
    /// Learned seconds per output token over the sequences running there (`decode`); None until observed. Read
    /// by `predicted_ttft`.
    pub decode: Option<line::Line>,
    /// Some(weight < 1) while the endpoint is a speed outlier (`pool::drift`): `load_aware` weighs its load by
    /// 1 / weight. (`predicted_ttft` reads the slowdown in its corrected lines instead.)
    pub speed_weight: Option<f64>,
    /// Seconds the engine has been on the prefill at the head of our queue there (since our prefill tokens in
    /// flight rose from none, or one of them was last released): what it computed meanwhile is no longer ahead of
    /// a new request. 0 when nothing of ours is prefilling there.
    pub prefill_busy_seconds: f64,
}

impl Candidate {
    /// Requests in flight from this replica and its peers (live counts, exact up to a publish interval), and the
    /// failed ones that still weigh on the endpoint.
    pub fn live_requests(&self) -> u64 {
        self.requests
            .saturating_add(self.peer_requests)
            .saturating_add(self.debt_requests)
    }

    /// Estimated prefill tokens in flight from this replica and its peers, and the failed requests' debt.
    pub fn live_prefill_tokens(&self) -> u64 {
        self.prefill_tokens
            .saturating_add(self.peer_prefill_tokens)
            .saturating_add(self.debt_tokens)
    }

    /// Requests in flight, counting traffic from other routers: the live count (ours and our peers') plus the
    /// engine's foreign load as of its last sample. Only the foreign part lags by a scrape interval: requests that
    /// finished since the sample leave at once (no phantom load), and a burst just sent counts at once (the stale
    /// sample does not hide it). The sample's foreign part includes our peers' requests, which the live count
    /// already has: they are taken off it (at their current count, the closest figure there is). Without fresh
    /// stats, the live count alone (never less: unknown is not idle).
    pub fn request_load(&self) -> u64 {
        self.live_requests().saturating_add(self.foreign_requests())
    }

    /// The engine's waiting queue corrected for our requests that finished since the sample: each one freed a
    /// slot, which the engine gave to a waiting request, so a queue that drained since the scrape is not read.
    pub fn waiting(&self) -> u64 {
        self.engine.map_or(0, |e| {
            let finished = e.own_at_sample.saturating_sub(self.requests);
            e.waiting.saturating_sub(finished)
        })
    }

    /// Requests the engine holds that were placed elsewhere (other routers, direct clients) as of its last fresh
    /// sample, less our cluster peers' (the ledger has theirs); 0 without fresh stats.
    pub fn foreign_requests(&self) -> u64 {
        self.engine
            .map_or(0, |e| e.foreign_beyond(self.peer_requests))
    }

    /// The load_aware score: requests × 16384 + prefill tokens in flight; a speed outlier's as its time to serve
    /// one more (`speed_weight`). Lower is better.
    pub fn score(&self) -> u64 {
        let load = self
            .request_load()
            .saturating_mul(REQUEST_WEIGHT_TOKENS)
            .saturating_add(self.live_prefill_tokens());
        match self.speed_weight {
            Some(w) if w > 0.0 && w < 1.0 => {
                // At relative speed w a new request is served in (load + itself) / w of the time it takes where the
                // same load runs at full speed: weighed so, an idle outlier at 40% counts as 1.5 requests. It still
                // takes some work at low concurrency, and that work is what shows it recovered.
                let one = REQUEST_WEIGHT_TOKENS as f64;
                let load = (load as f64 + one) / w - one;
                load.min(u64::MAX as f64) as u64
            }
            _ => load,
        }
    }

    /// Fresh stats show a queue, or our own in-flight count reached the configured limit.
    pub fn has_queue(&self) -> bool {
        self.waiting() > 0 || self.at_limit()
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

/// The one list of placement reasons: a row is a [`Reason`] variant and its `reason` label, so a new reason is
/// one row.
macro_rules! reasons {
    ($($(#[$doc:meta])* $variant:ident = $label:literal,)*) => {
        /// Why a request went where it went: the `reason` label of `infergate_placements_total`.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum Reason {
            $($(#[$doc])* $variant,)*
        }

        impl Reason {
            /// Every reason, in declaration order (`index` is the position here).
            pub const ALL: [Reason; [$(Reason::$variant),*].len()] = [$(Reason::$variant),*];

            pub fn as_str(self) -> &'static str {
                match self {
                    $(Reason::$variant => $label,)*
                }
            }
        }
    };
}

reasons! {
    RoundRobin = "round_robin",
    LeastRequest = "least_request",
    LoadAware = "load_aware",
    NewSession = "new_session",
    Sticky = "sticky",
    Migrate = "migrate",
    /// A turn stuck behind a long prefill on its bound endpoint, moved where its short recompute stalls no one
    /// (`predicted_ttft`): a move the totals alone would not make.
    Rescue = "rescue",
    Spill = "spill",
    Fallback = "fallback",
    Headerless = "headerless",
    PrefixHit = "prefix_hit",
    PrefixMiss = "prefix_miss",
    PrefixGated = "prefix_gated",
    Predicted = "predicted",
    /// The engine holding the stored response the request continues (`previous_response_id`): no other has it.
    StoredResponse = "stored_response",
}

impl Reason {
    /// Position in `ALL`.
    pub fn index(self) -> usize {
        self as usize
    }
}

/// A placement: the index into the candidate slice and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    pub index: usize,
    pub reason: Reason,
}

/// The body bytes a request's prefill estimate is made of: each inline attachment counts as `tokens_per_image`
/// tokens (in bytes at `bytes_per_token`) instead of its base64 size.
pub fn prompt_bytes(
    body_bytes: u64,
    (media_bytes, media_items): (u64, u64),
    bytes_per_token: f64,
    tokens_per_image: u64,
) -> u64 {
    let per_item = tokens_per_image as f64 * bytes_per_token;
    let per_item = if per_item.is_finite() && per_item > 0.0 {
        per_item.ceil() as u64
    } else {
        0
    };
    body_bytes
        .saturating_sub(media_bytes)
        .saturating_add(media_items.saturating_mul(per_item))
}

/// Estimated prompt tokens for a body of `bytes` bytes: bytes / bytes_per_token, capped.
/// The prefill a placement holds when the chosen engine's KV events say it has `held` of the request's exact
/// `tokens`: what is left to compute (at least one token: vLLM recomputes the last one of a full hit), or the
/// policy's own estimate when that is smaller (a session turn's growth). Unchanged without an exact count.
pub fn uncached_by_kv(estimate: Option<u64>, tokens: Option<u64>, held: u64) -> Option<u64> {
    let exact = tokens?.saturating_sub(held).max(1);
    Some(estimate.map_or(exact, |e| e.min(exact)))
}

pub fn estimate_tokens(bytes: u64, bytes_per_token: f64, max_tokens: u64) -> u64 {
    if bytes == 0 || bytes_per_token.is_nan() || bytes_per_token <= 0.0 {
        return 0;
    }
    ((bytes as f64 / bytes_per_token).ceil() as u64).min(max_tokens)
}

/// Uniform pick among the eligible candidates whose key is within `slack` of the least key (`key` None: not a
/// candidate), never "first in the list". Every random-tie minimum in placement is this function: one pass for the
/// least key, one of reservoir sampling (one draw per tied candidate, in order), no allocation on the request path.
pub fn pick_min<K>(
    cands: &[Candidate],
    rng: &mut fastrand::Rng,
    slack: K,
    key: impl Fn(usize, &Candidate) -> Option<K>,
) -> Option<usize>
where
    K: Copy + PartialOrd + std::ops::Add<Output = K>,
{
    let keyed = |i: usize, c: &Candidate| if c.eligible { key(i, c) } else { None };
    let mut min: Option<K> = None;
    for (i, c) in cands.iter().enumerate() {
        if let Some(k) = keyed(i, c) {
            if min.is_none_or(|m| k < m) {
                min = Some(k);
            }
        }
    }
    let limit = min? + slack;
    let mut chosen = None;
    let mut seen = 0u32;
    for (i, c) in cands.iter().enumerate() {
        if keyed(i, c).is_some_and(|k| k <= limit) {
            seen += 1;
            if rng.u32(0..seen) == 0 {
                chosen = Some(i);
            }
        }
    }
    chosen
}

/// Uniform pick among the eligible candidates whose key is minimal (exact ties).
pub fn pick_min_by_key(
    cands: &[Candidate],
    rng: &mut fastrand::Rng,
    key: impl Fn(&Candidate) -> u64,
) -> Option<usize> {
    pick_min(cands, rng, 0, |_, c| Some(key(c)))
}

/// `least_inflight`: the fewest requests in flight counting load placed elsewhere ([`Candidate::request_load`]:
/// our live count plus the engine's foreign load), random ties. A burst inside one scrape interval neither
/// dogpiles one endpoint nor drifts: 8 new sessions on 2 equally busy endpoints split 4/4, and with one endpoint
/// holding 4 requests from elsewhere and the other idle they split 2/6 (each request sees the ones before it).
///
/// Before the foreign load was separated from our own, this took the endpoints within +1 of `max(own, engine)`
/// and broke ties by our own count alone: the stale engine figure hid the burst, the own count hid the foreign
/// load, and the busy endpoint won as soon as the idle one had 3 (4/4 every time).
pub fn least_inflight(cands: &[Candidate], rng: &mut fastrand::Rng) -> Option<usize> {
    pick_min_by_key(cands, rng, Candidate::request_load)
}

/// `load_aware`: minimise requests × 16384 + prefill tokens; exact ties at random.
pub fn load_aware(cands: &[Candidate], rng: &mut fastrand::Rng) -> Option<usize> {
    pick_min_by_key(cands, rng, Candidate::score)
}

/// `least_request` (`load_aware` without the prefill term, the benchmark baseline) is `least_inflight` under the
/// policy's name.
pub use self::least_inflight as least_request;

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

    #[test]
    fn what_the_kv_index_says_is_held_is_not_held_as_prefill() {
        // 1,053 exact tokens, 1,024 of them in the engine's cache: 29 to compute.
        assert_eq!(uncached_by_kv(Some(1_053), Some(1_053), 1_024), Some(29));
        // A session turn's growth, smaller than that, stands.
        assert_eq!(uncached_by_kv(Some(10), Some(1_053), 1_024), Some(10));
        // A full hit still computes one token; without an exact count nothing changes.
        assert_eq!(uncached_by_kv(Some(1_024), Some(1_024), 1_024), Some(1));
        assert_eq!(uncached_by_kv(None, None, 1_024), None);
    }

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
    fn a_speed_outlier_is_weighed_by_its_time_to_serve_one_more() {
        let outlier = |requests| Candidate {
            speed_weight: Some(0.4),
            ..cand(requests, 0)
        };
        // Idle at 40%: one request's time over 0.4 = 2.5 requests' time, 1.5 more than an idle peer.
        assert_eq!(outlier(0).score(), REQUEST_WEIGHT_TOKENS * 3 / 2);
        let mut rng = fastrand::Rng::with_seed(3);
        for _ in 0..50 {
            assert_eq!(load_aware(&[outlier(0), cand(1, 0)], &mut rng), Some(1));
            assert_eq!(load_aware(&[outlier(0), cand(2, 0)], &mut rng), Some(0));
        }
        // Busy, the same rule: with 2 in flight at 40% a third is served after 7.5 requests' time (6.5 more).
        assert_eq!(outlier(2).score(), REQUEST_WEIGHT_TOKENS * 13 / 2);
        // Not an outlier: the plain score.
        assert_eq!(cand(2, 100).score(), 2 * REQUEST_WEIGHT_TOKENS + 100);
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
        // A 2 MB screenshot beside 4 KB of text: 4 KB plus 1,500 tokens' worth, not 2 MB.
        assert_eq!(
            prompt_bytes(2_004_000, (2_000_000, 1), 4.0, 1500),
            4_000 + 6_000
        );
        assert_eq!(prompt_bytes(4_000, (0, 0), 4.0, 1500), 4_000);
        assert_eq!(prompt_bytes(100, (500, 2), f64::NAN, 1500), 0);
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

    fn with_stats(mut c: Candidate, running: u64, waiting: u64, own_at_sample: u64) -> Candidate {
        c.engine = Some(EngineLoad {
            running,
            waiting,
            kv_usage: 0.1,
            own_at_sample,
        });
        c
    }

    /// Place `n` requests one after another with `pick`, each adding one to our own live count of its endpoint
    /// while the engine stats stay as they were (the burst lands inside one scrape interval); the split.
    fn burst(
        mut cands: Vec<Candidate>,
        n: usize,
        seed: u64,
        pick: fn(&[Candidate], &mut fastrand::Rng) -> Option<usize>,
    ) -> Vec<u64> {
        let mut rng = fastrand::Rng::with_seed(seed);
        let mut split = vec![0; cands.len()];
        for _ in 0..n {
            let i = pick(&cands, &mut rng).unwrap();
            cands[i].requests += 1;
            split[i] += 1;
        }
        split
    }

    #[test]
    fn a_burst_on_equally_busy_endpoints_splits_evenly() {
        for seed in 0..50 {
            // Busy with our own requests (the engines saw them at the last scrape)...
            let ours = vec![with_stats(cand(2, 0), 2, 0, 2); 2];
            assert_eq!(burst(ours, 8, seed, least_inflight), vec![4, 4]);
            // ...or with requests placed elsewhere.
            let foreign = vec![with_stats(cand(0, 0), 2, 0, 0); 2];
            assert_eq!(burst(foreign, 8, seed, least_inflight), vec![4, 4]);
        }
    }

    #[test]
    fn a_burst_goes_to_the_endpoint_idle_of_foreign_load() {
        // Endpoint 0 runs 4 requests another router placed; endpoint 1 is idle. Balanced end state: 2 / 6.
        for seed in 0..50 {
            let cands = vec![
                with_stats(cand(0, 0), 4, 0, 0),
                with_stats(cand(0, 0), 0, 0, 0),
            ];
            let split = burst(cands.clone(), 8, seed, least_inflight);
            assert_eq!(split, vec![2, 6], "seed {seed}");
            assert_eq!(burst(cands, 8, seed, load_aware), vec![2, 6], "seed {seed}");
        }
    }

    #[test]
    fn foreign_load_is_engine_load_less_ours_at_the_sample() {
        // Our 3 requests were all the engine had: no foreign load, no double counting.
        assert_eq!(with_stats(cand(3, 0), 3, 0, 3).request_load(), 3);
        // 7 running + 2 waiting of which 3 ours: 6 from elsewhere.
        assert_eq!(with_stats(cand(3, 0), 7, 2, 3).request_load(), 9);
        // Ours finished since the sample (stats lag): the phantom 3 are gone at once.
        assert_eq!(with_stats(cand(0, 0), 3, 0, 3).request_load(), 0);
        // Ours sent since the sample (a burst): counted at once.
        assert_eq!(with_stats(cand(5, 0), 1, 0, 1).request_load(), 5);
        // The engine saw fewer than we count (requests still in transit): foreign 0, never negative.
        assert_eq!(with_stats(cand(4, 0), 2, 0, 4).request_load(), 4);
        // No fresh stats: our own count, not zero.
        assert_eq!(cand(4, 0).request_load(), 4);
    }

    #[test]
    fn foreign_requests_leave_out_our_peers_and_need_fresh_stats() {
        let mut c = with_stats(cand(2, 0), 6, 1, 2);
        assert_eq!(c.foreign_requests(), 5);
        // 2 of the 5 came from a cluster peer: the ledger has them.
        c.peer_requests = 2;
        assert_eq!(c.foreign_requests(), 3);
        assert_eq!(c.request_load(), 2 + 2 + 3);
        // No fresh stats: nothing known about load placed elsewhere (the live count stands).
        assert_eq!(cand(2, 0).foreign_requests(), 0);
    }

    #[test]
    fn a_queue_that_drained_since_the_sample_is_not_read() {
        // The sample showed 2 waiting while 4 of ours ran; 2 of ours finished since: their slots took the queue.
        let c = with_stats(cand(2, 0), 4, 2, 4);
        assert_eq!(c.waiting(), 0);
        assert!(!c.has_queue());
        // Nothing of ours finished: the queue stands.
        let c = with_stats(cand(4, 0), 4, 2, 4);
        assert_eq!(c.waiting(), 2);
        assert!(c.has_queue());
    }

    #[test]
    fn least_inflight_ties_are_random() {
        let mut rng = fastrand::Rng::with_seed(5);
        let mut seen = [0; 2];
        for _ in 0..200 {
            seen[least_inflight(&[cand(2, 0), cand(2, 0)], &mut rng).unwrap()] += 1;
        }
        assert!(seen[0] > 50 && seen[1] > 50, "{seen:?}");
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
