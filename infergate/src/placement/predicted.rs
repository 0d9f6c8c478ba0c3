//! The predicted-TTFT cost model: what a request would cost on each endpoint, in seconds, and when a session
//! should move.
//!
//! Pure: the caller passes the candidates (with their learned prefill throughput) and each one's uncached tokens
//! for this request; nothing here reads a clock or does I/O.
//!
//! For endpoint `e` with its learned line (`throughput::Fitted`: an overhead `o` in seconds and a throughput `s`
//! in estimated tokens per second, queue included):
//!
//! * `ttft = o + (prefill tokens in flight there + foreign queue + this request's uncached tokens there) / s`:
//!   chunked prefill is FIFO, so the request waits for what is ahead of it, then its own uncached part. Uncached
//!   is the body less what `e` holds of it (the session's recorded size where it is bound, the prefix index
//!   elsewhere). The foreign queue is the requests placed elsewhere that fresh engine stats show, at
//!   [`FOREIGN_REQUEST_TOKENS`] each: the ledger cannot see them, and a tenant flooding an engine directly would
//!   otherwise keep every session bound there waiting behind it.
//! * `total = ttft + DECODE_WEIGHT (0.3) × requests in flight there × own prefill seconds`: every step that carries
//!   this prefill also stalls the requests decoding there, so a prefill placed beside many decodes costs them.
//!
//! A session stays on its bound endpoint unless another one's `total` is lower by more than the move margin
//! (`sessions.move_margin`, default 0.1) of staying's: the recompute of its whole context elsewhere (that
//! endpoint's uncached tokens) and the stall it causes there are inside that `total`, so a move is taken only when
//! the predicted saving exceeds its cost.
//! The old token-only backlog spill is the case where the bound endpoint's queue ahead is long: it is this rule.

use super::throughput::Fitted;
use super::Candidate;

/// Weight of the decode stall a prefill causes, per request in flight on the endpoint, against the request's
/// own waiting time. 0.3: with ten requests decoding there, their stall weighs three times the request's own
/// prefill time. Chosen on the agent benchmark (2 engines, seeds 7 and 8): 0.1 gave the lowest TTFT p95 but ~10%
/// lower slowest-5% decode; 1.0 gave up TTFT without a consistent decode gain.
pub const DECODE_WEIGHT: f64 = 0.3;

/// Prefill tokens a request placed elsewhere is taken to carry: its prompt and progress (waiting, prefilling
/// or decoding) are unknown, and unknown is not idle, so the weight `load_aware` gives any request.
pub const FOREIGN_REQUEST_TOKENS: u64 = super::REQUEST_WEIGHT_TOKENS;

/// Costs within this many seconds of each other are ties (broken at random).
pub const TIE_SECONDS: f64 = 1e-6;

/// What a request would cost on one endpoint, in seconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Cost {
    /// Predicted time to first token.
    pub ttft: f64,
    /// `ttft` plus the decode stall it causes.
    pub total: f64,
}

/// The learned line, when usable.
fn speed(c: &Candidate) -> Option<Fitted> {
    c.prefill_speed.filter(|f| {
        f.tokens_per_second.is_finite()
            && f.tokens_per_second > 0.0
            && f.overhead_seconds.is_finite()
            && f.overhead_seconds >= 0.0
    })
}

/// Prefill tokens queued ahead of a request on `c`: ours and our peers' (replicas sharing the engine through
/// `cluster`), and the engine's requests placed elsewhere at [`FOREIGN_REQUEST_TOKENS`] each. The learned line's
/// samples are taken over the same figure, so that a flood sent around the router is counted once (here), not
/// also learned as a slower engine.
pub fn tokens_ahead(c: &Candidate) -> u64 {
    let foreign = c.foreign_requests().saturating_mul(FOREIGN_REQUEST_TOKENS);
    c.live_prefill_tokens().saturating_add(foreign)
}

/// The cost of `uncached` tokens on `c`; None until `c`'s throughput was learned.
pub fn cost(c: &Candidate, uncached: u64) -> Option<Cost> {
    let fit = speed(c)?;
    let s = fit.tokens_per_second;
    let own = uncached as f64 / s;
    let ttft = fit.overhead_seconds + tokens_ahead(c) as f64 / s + own;
    let total = ttft + DECODE_WEIGHT * c.request_load() as f64 * own;
    Some(Cost { ttft, total })
}

/// Every eligible candidate has a learned throughput (otherwise the caller places as `load_aware` does).
pub fn all_learned(cands: &[Candidate]) -> bool {
    cands
        .iter()
        .filter(|c| c.eligible)
        .all(|c| speed(c).is_some())
}

/// The key candidates are ranked by for a request with `uncached[i]` tokens to compute on `cands[i]`: its `total`
/// cost; None for a candidate without a learned throughput.
pub fn total_cost(uncached: &[u64]) -> impl Fn(usize, &Candidate) -> Option<f64> + '_ {
    |i, c| Some(cost(c, *uncached.get(i)?)?.total).filter(|t| t.is_finite())
}

/// The cheapest eligible candidate that `allow` accepts, by `total`; ties (within [`TIE_SECONDS`]) uniformly at
/// random. `uncached[i]` is the request's uncached tokens on `cands[i]`. None when nothing qualifies or a
/// qualifying candidate has no learned throughput.
pub fn cheapest(
    cands: &[Candidate],
    uncached: &[u64],
    rng: &mut fastrand::Rng,
    allow: impl Fn(usize, &Candidate) -> bool,
) -> Option<(usize, Cost)> {
    let ok = |i: usize, c: &Candidate| c.eligible && i < uncached.len() && allow(i, c);
    if cands
        .iter()
        .enumerate()
        .any(|(i, c)| ok(i, c) && speed(c).is_none())
    {
        return None;
    }
    let total = total_cost(uncached);
    let i = super::pick_min(cands, rng, TIE_SECONDS, |i, c| {
        ok(i, c).then(|| total(i, c)).flatten()
    })?;
    Some((i, cost(&cands[i], uncached[i])?))
}

/// Whether a session bound where it would cost `stay` should move to where it would cost `best`: only when that
/// saves more than `margin` (0..=1) of staying's cost; with 1 it never does.
pub fn should_move(stay: Cost, best: Cost, margin: f64) -> bool {
    best.total + margin * stay.total < stay.total
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::DEFAULT_MOVE_MARGIN as MARGIN;
    use crate::placement::EngineLoad;

    fn cand(requests: u64, prefill: u64, speed: f64) -> Candidate {
        Candidate {
            eligible: true,
            requests,
            prefill_tokens: prefill,
            prefill_speed: Some(Fitted::ratio(speed)),
            ..Default::default()
        }
    }

    #[test]
    fn cost_is_queue_plus_own_prefill_plus_decode_stall() {
        let c = cand(10, 20_000, 10_000.0);
        let k = cost(&c, 5_000).unwrap();
        assert!((k.ttft - 2.5).abs() < 1e-9, "{k:?}");
        // 0.3 × 10 requests × 0.5 s of own prefill.
        assert!((k.total - 4.0).abs() < 1e-9, "{k:?}");
        assert_eq!(cost(&Candidate::default(), 5), None, "no speed, no cost");
    }

    #[test]
    fn cached_tokens_beat_an_idle_endpoint_until_the_queue_outweighs_them() {
        let mut rng = fastrand::Rng::with_seed(1);
        // 40k-token body: endpoint 0 holds 36k of it but has 10k prefill queued; endpoint 1 is idle and cold.
        let cands = [cand(2, 10_000, 20_000.0), cand(0, 0, 20_000.0)];
        assert_eq!(
            cheapest(&cands, &[4_000, 40_000], &mut rng, |_, _| true)
                .unwrap()
                .0,
            0
        );
        // With 50k queued ahead, the cold idle endpoint wins.
        let cands = [cand(2, 50_000, 20_000.0), cand(0, 0, 20_000.0)];
        assert_eq!(
            cheapest(&cands, &[4_000, 40_000], &mut rng, |_, _| true)
                .unwrap()
                .0,
            1
        );
    }

    #[test]
    fn a_faster_endpoint_wins_equal_work_and_decodes_weigh_in() {
        let mut rng = fastrand::Rng::with_seed(2);
        let cands = [cand(0, 0, 10_000.0), cand(0, 0, 30_000.0)];
        assert_eq!(
            cheapest(&cands, &[9_000, 9_000], &mut rng, |_, _| true)
                .unwrap()
                .0,
            1
        );
        // Same speed and queue; 30 requests decoding on endpoint 0: the stall sends the prefill elsewhere.
        let cands = [cand(30, 0, 10_000.0), cand(2, 0, 10_000.0)];
        assert_eq!(
            cheapest(&cands, &[9_000, 9_000], &mut rng, |_, _| true)
                .unwrap()
                .0,
            1
        );
    }

    #[test]
    fn the_move_rule_charges_the_recompute() {
        let mut rng = fastrand::Rng::with_seed(3);
        // Bound endpoint 0: 1k growth behind 30k queued (1.55 s). Endpoint 1 idle but must recompute 60k (3 s).
        let cands = [cand(3, 30_000, 20_000.0), cand(0, 0, 20_000.0)];
        let stay = cost(&cands[0], 1_000).unwrap();
        let (best, k) = cheapest(&cands, &[1_000, 60_000], &mut rng, |_, _| true).unwrap();
        assert_eq!(best, 0);
        assert!(!should_move(stay, k, MARGIN));
        // A short conversation (4k) behind the same queue: moving saves more than it costs.
        let (best, k) = cheapest(&cands, &[1_000, 4_000], &mut rng, |_, _| true).unwrap();
        assert_eq!(best, 1);
        assert!(should_move(stay, k, MARGIN));
        // A saving inside the margin is no move.
        let a = Cost {
            ttft: 1.0,
            total: 1.0,
        };
        let saving = |total: f64| Cost { ttft: total, total };
        assert!(!should_move(a, saving(0.95), MARGIN));
        assert!(should_move(a, saving(0.8), MARGIN));
        // The operator's margin: 0 moves on any saving, 1 never moves.
        assert!(should_move(a, saving(0.95), 0.0));
        assert!(!should_move(a, saving(0.8), 0.5));
        assert!(!should_move(a, saving(0.0), 1.0));
    }

    #[test]
    fn unlearned_speed_is_reported_not_guessed() {
        let mut rng = fastrand::Rng::with_seed(4);
        let mut cands = [cand(0, 0, 20_000.0), cand(0, 0, 20_000.0)];
        cands[1].prefill_speed = None;
        assert!(!all_learned(&cands));
        assert_eq!(cheapest(&cands, &[1, 1], &mut rng, |_, _| true), None);
        // An ineligible endpoint's missing speed does not matter.
        cands[1].eligible = false;
        assert!(all_learned(&cands));
        assert_eq!(
            cheapest(&cands, &[1, 1], &mut rng, |_, _| true).unwrap().0,
            0
        );
        cands[0].prefill_speed = Some(Fitted::ratio(f64::NAN));
        assert!(!all_learned(&cands));
    }

    #[test]
    fn stale_or_missing_stats_are_not_zero_load() {
        // Endpoint 0: no fresh stats but 20 of our requests in flight; endpoint 1: fresh stats, 2 requests.
        let busy = cand(20, 0, 20_000.0);
        let mut fresh = cand(2, 0, 20_000.0);
        fresh.engine = Some(EngineLoad {
            running: 2,
            waiting: 0,
            kv_usage: 0.1,
            own_at_sample: 2,
        });
        assert!(cost(&busy, 10_000).unwrap().total > cost(&fresh, 10_000).unwrap().total);
        // Load placed elsewhere counts: 30 foreign requests on endpoint 1 make it the costlier one.
        fresh.engine = Some(EngineLoad {
            running: 32,
            waiting: 0,
            kv_usage: 0.1,
            own_at_sample: 2,
        });
        assert!(cost(&busy, 10_000).unwrap().total < cost(&fresh, 10_000).unwrap().total);
    }

    #[test]
    fn a_session_leaves_an_engine_flooded_from_elsewhere() {
        let mut rng = fastrand::Rng::with_seed(4);
        // Bound endpoint 0 (1k of growth to compute); endpoint 1 idle, where the 20k conversation is recomputed.
        let mut cands = [cand(1, 0, 20_000.0), cand(0, 0, 20_000.0)];
        let uncached = [1_000, 20_000];
        let stay = cost(&cands[0], uncached[0]).unwrap();
        let (best, k) = cheapest(&cands, &uncached, &mut rng, |_, _| true).unwrap();
        assert!(
            best == 0 && !should_move(stay, k, MARGIN),
            "idle engines: it stays"
        );
        // Another tenant sent 7 requests straight to endpoint 0 (the engine holds 8, one of them ours).
        cands[0].engine = Some(EngineLoad {
            running: 2,
            waiting: 6,
            kv_usage: 0.5,
            own_at_sample: 1,
        });
        let stay = cost(&cands[0], uncached[0]).unwrap();
        // Their prefill is taken to be ahead of the turn: 7 × 16384 tokens at 20k/s, about 5.8 s.
        assert!(
            (stay.ttft - (1_000.0 + 7.0 * 16_384.0) / 20_000.0).abs() < 1e-9,
            "{stay:?}"
        );
        let (best, k) = cheapest(&cands, &uncached, &mut rng, |_, _| true).unwrap();
        assert!(best == 1 && should_move(stay, k, MARGIN), "{stay:?} {k:?}");
    }

    #[test]
    fn ties_are_random() {
        let mut rng = fastrand::Rng::with_seed(5);
        let cands = [cand(1, 100, 20_000.0); 3];
        let mut seen = [0; 3];
        for _ in 0..600 {
            seen[cheapest(&cands, &[500; 3], &mut rng, |_, _| true)
                .unwrap()
                .0] += 1;
        }
        assert!(seen.iter().all(|&n| n > 120), "{seen:?}");
    }
}
