//! The cost model: what placing a request on each endpoint costs everyone, in seconds, and when a session should
//! move.
//!
//! Pure: the caller passes the candidates (with their learned prefill and decode lines), each one's uncached
//! tokens for this request, the rate at which session turns reach each one, and the answer length it expects;
//! nothing here reads a clock or does I/O.
//!
//! For endpoint `e` with its learned prefill line (`throughput::Fitted`: an overhead `o` and a throughput `s`,
//! queue included) and decode line (`decode`: seconds per output token over the sequences running there):
//!
//! * **wait** `W = o + ahead / s`: chunked prefill is FIFO, so the request waits for the prefill tokens in flight
//!   there (ours, our peers', and the requests placed elsewhere that fresh engine stats show, at
//!   [`FOREIGN_REQUEST_TOKENS`] each: the ledger cannot see them), less what the engine has computed of ours since
//!   the prefill at the head of the queue began: a long prompt half done is half as far ahead, and a line learned
//!   over whole counts would read every turn queued behind one as a faster engine.
//! * **own prefill** `P = uncached / s`: the body less what `e` holds of it (the session's recorded size where it
//!   is bound, the prefix index or the engine's own KV events elsewhere); a session move recomputes its context.
//! * **ttft** `W + P`; **own decode** `D = answer tokens × seconds per token at the sequences there plus one`.
//! * **stall** `running × P × (1 + κ·A)`: every step that carries this prefill is longer for each stream decoding
//!   there, by about the prefill's share of the step, so each of them finishes about `P` later; the requests still
//!   in their prefill count too (chunked prefill is FIFO: they finish theirs first and decode beside this one).
//!   `A` is the prefill queued ahead, in seconds: the streams there are stalled by it already, and a stream stalled
//!   by several long prefills is the slowest decode of all, so stacking prefill on prefill costs more than its sum
//!   ([`STACKED_STALL_PER_SECOND`]).
//! * **batch** `decoding × answer tokens × per-sequence step cost`: one more sequence in their steps.
//! * **queued** `turns/s × P × (W + P / 2)`: session turns bound to `e` that arrive while this prefill waits or
//!   runs queue behind it: those arriving during `W` wait all of `P`, those arriving during `P` half of it.
//!
//! * **failed** `F = (debt requests × FOREIGN_REQUEST_TOKENS − debt tokens) / s`, at least 0: requests that failed
//!   there (or whose client left unanswered) since it last served one weigh as unknown requests do, however
//!   little of their prompts it had to compute, so an engine that takes cached follow-ups and never answers does
//!   not look idle.
//!
//! `total = ttft + F + D + stall + batch + queued`: the seconds this placement adds to everyone's completion,
//! including its own. The endpoint with the lowest total wins (ties at random). A session stays on its bound
//! endpoint unless another one's total is lower by more than the move margin (`sessions.move_margin`) of
//! staying's: the recompute of the whole context elsewhere, and the stall and queue it causes there, are inside
//! that total, so a move is taken only when the saving exceeds its cost. And only when the turn's own time is
//! shorter there, `ttft + F` and its decode read at the batch running at home on both
//! ([`Pricing::shortens_own_time`]): the stall and batch terms, and the decode's dependence on the batch, are read
//! off the streams running at this instant, which turn over within the turn's own answer, while the recompute is
//! paid in full (BENCHMARKS.md, "A move must shorten the moved turn's own time").
//!
//! A turn **stuck** on its bound endpoint, one that would wait there at least [`STUCK_RATIO`] times as long as its
//! whole recompute takes elsewhere, is in the time-to-first-token tail wherever the totals put it. It moves where
//! that recompute is at most [`RESCUE_FREE_TOKENS`], priced as stalling no one ([`Pricing::rescue`]), when that
//! saves more than the margin: a prefill of a step or two lengthens a step or two of the streams beside it, while
//! the slowest decodes are the streams that sat beside long prefills for seconds (BENCHMARKS.md, "A stuck turn's
//! short recompute").
//!
//! What is unknown is not free: without fresh engine stats the live counts stand (our requests and our peers'),
//! and until every eligible endpoint's decode line is learned the decode terms are left out for all of them (the
//! caller passes no answer length).

use super::decode::seconds_per_token;
use super::throughput::Fitted;
use super::Candidate;

/// Prefill tokens a request placed elsewhere is taken to carry: its prompt and progress (waiting, prefilling
/// or decoding) are unknown, and unknown is not idle, so the weight `load_aware` gives any request.
pub const FOREIGN_REQUEST_TOKENS: u64 = super::REQUEST_WEIGHT_TOKENS;

/// κ of the stall: a prefill behind `A` seconds of queued prefill stalls the streams there `1 + κ·A` times as
/// much as behind none. Measured on the agent scenario at 4 equal engines (BENCHMARKS.md, "Stacked long first
/// turns"): the slowest-5% decode is set by the few streams that sat beside several long first turns sent to one
/// engine within a second.
pub const STACKED_STALL_PER_SECOND: f64 = 4.0;

/// A turn is stuck on its bound endpoint when its predicted time to first token there is at least this many times
/// its time to first token where it would be rescued. Measured on the agent scenario (BENCHMARKS.md): 3 takes the
/// follow-ups queued behind a long prompt out of the TTFT tail; 6 rescues next to none.
pub const STUCK_RATIO: f64 = 3.0;

/// The longest recompute a stuck turn is rescued by, priced as stalling no one: two steps of vLLM's default
/// 8,192-token batch.
pub const RESCUE_FREE_TOKENS: u64 = 16_384;

/// Costs within this many seconds of each other are ties (broken at random).
pub const TIE_SECONDS: f64 = 1e-6;

/// What a request would cost on one endpoint, in seconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Cost {
    /// Predicted time to first token.
    pub ttft: f64,
    /// Of it, the wait for the prefill queued ahead (what an idle endpoint would not have).
    pub queued_ahead: f64,
    /// Its own predicted decode time (0 when the decode terms are left out).
    pub decode: f64,
    /// The delay it adds to others: streams decoding there stalled by its prefill and slowed by its sequence,
    /// and session turns arriving behind its prefill.
    pub harm: f64,
    /// The weight of the requests that failed there (**failed**; not in `ttft`: no wait is known).
    pub failed: f64,
    /// All of it.
    pub total: f64,
}

impl Cost {
    /// The request's own wait for its first token, the failed requests' weight counted as wait.
    pub fn own_wait(&self) -> f64 {
        self.ttft + self.failed
    }
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
/// `cluster`), and the engine's requests placed elsewhere at [`FOREIGN_REQUEST_TOKENS`] each, less what the engine
/// has computed of ours ([`prefill_done`]). The learned line's samples are taken over the same figure, so that a
/// flood sent around the router is counted once (here), not also learned as a slower engine, and a turn queued
/// behind a half-done prompt is not learned as a faster one.
pub fn tokens_ahead(c: &Candidate) -> u64 {
    let foreign = c.foreign_requests().saturating_mul(FOREIGN_REQUEST_TOKENS);
    c.live_prefill_tokens()
        .saturating_sub(prefill_done(c))
        .saturating_add(foreign)
}

/// Of our prefill tokens in flight on `c`, those computed since the prefill at the head of the queue began, at
/// its learned speed: chunked prefill is first come, first served, so a long prompt half done is half as far
/// ahead of the next request. None once the engine is past the time all of ours should have taken without a
/// first byte (it is slower than learned, a GPU that throttles: what it has done is unknown, and unknown is not
/// idle), and none until the line is learned.
fn prefill_done(c: &Candidate) -> u64 {
    let t = c.prefill_busy_seconds;
    match speed(c) {
        Some(f) if t.is_finite() && t > 0.0 => {
            let ours = c.prefill_tokens as f64;
            if t > f.overhead_seconds + ours / f.tokens_per_second {
                0
            } else {
                (f.tokens_per_second * t).min(ours) as u64
            }
        }
        _ => 0,
    }
}

/// The failed requests' weight beyond their own prefill tokens (**failed** above), in tokens. Placement only: the
/// prediction and its learning sample take the tokens there are ([`tokens_ahead`]).
fn debt_beyond_tokens(c: &Candidate) -> u64 {
    c.debt_requests
        .saturating_mul(FOREIGN_REQUEST_TOKENS)
        .saturating_sub(c.debt_tokens)
}

/// What the model needs of one request besides the candidates: `uncached[i]` tokens to compute on `cands[i]`,
/// `arrivals[i]` session turns per second reaching it (missing: none), the answer length expected (0: the decode
/// terms are left out), and how many of its prefill tokens stall no one (0 but for a stuck turn's rescue).
#[derive(Debug, Clone, Copy)]
pub struct Pricing<'a> {
    pub uncached: &'a [u64],
    pub arrivals: &'a [f64],
    pub output_tokens: f64,
    pub stall_free: u64,
}

impl<'a> Pricing<'a> {
    /// Prefill only: no turns arriving, no decode terms.
    pub fn prefill(uncached: &'a [u64]) -> Self {
        Pricing {
            uncached,
            arrivals: &[],
            output_tokens: 0.0,
            stall_free: 0,
        }
    }

    /// The same request priced as a stuck turn's rescue: its first [`RESCUE_FREE_TOKENS`] stall no one.
    pub fn rescue(&self) -> Self {
        Pricing {
            stall_free: RESCUE_FREE_TOKENS,
            ..*self
        }
    }

    /// Whether the whole prefill on `cands[i]` is within the stall-free tokens (false for an unknown index).
    pub fn stalls_no_one(&self, i: usize) -> bool {
        self.uncached.get(i).is_some_and(|&u| u <= self.stall_free)
    }

    /// The cost of candidate `i`; None when it has no learned prefill line (or is out of range).
    pub fn cost(&self, i: usize, c: &Candidate) -> Option<Cost> {
        let uncached = *self.uncached.get(i)?;
        let arrivals = self.arrivals.get(i).copied().unwrap_or(0.0);
        cost(c, uncached, arrivals, self.output_tokens, self.stall_free)
    }

    /// Whether the request's own time is shorter on `to` than on `home` (each an endpoint and its cost, as priced
    /// here): its wait for the first token (the failed requests' weight counted as wait) and its decode, the decode
    /// read at the batch running at home on both, so that an endpoint's speed counts and not how many streams happen
    /// to run on it now.
    pub fn shortens_own_time(&self, home: (&Candidate, Cost), to: (&Candidate, Cost)) -> bool {
        let batch = home.0.request_load();
        let own = |(c, k): (&Candidate, Cost)| {
            let decode = match c.decode.filter(|_| self.output_tokens > 0.0) {
                Some(line) => self.output_tokens * seconds_per_token(&line, batch),
                None => 0.0,
            };
            k.own_wait() + decode
        };
        let (h, t) = (own(home), own(to));
        h.is_finite() && t.is_finite() && t < h
    }

    /// The key candidates are ranked by: the total; None for a candidate without a learned prefill line.
    pub fn total(&self) -> impl Fn(usize, &Candidate) -> Option<f64> + '_ {
        |i, c| Some(self.cost(i, c)?.total).filter(|t| t.is_finite())
    }
}

/// The cost of placing `uncached` prefill tokens and an answer of `output_tokens` on `c`, with `arrivals` session
/// turns per second reaching it and the first `stall_free` prefill tokens left out of the stall; None until `c`'s
/// prefill line is learned.
pub fn cost(
    c: &Candidate,
    uncached: u64,
    arrivals: f64,
    output_tokens: f64,
    stall_free: u64,
) -> Option<Cost> {
    let fit = speed(c)?;
    let s = fit.tokens_per_second;
    let own = uncached as f64 / s;
    let ahead = tokens_ahead(c) as f64 / s;
    let wait = fit.overhead_seconds + ahead;
    let ttft = wait + own;
    let failed = debt_beyond_tokens(c) as f64 / s;
    let running = c.request_load();
    let decoding = running.saturating_sub(c.prefilling) as f64;
    let (decode, batch) = match c.decode.filter(|_| output_tokens > 0.0) {
        Some(line) => (
            output_tokens * seconds_per_token(&line, running),
            decoding * output_tokens * line.slope,
        ),
        None => (0.0, 0.0),
    };
    let stalling = uncached.saturating_sub(stall_free) as f64 / s;
    let stall = running as f64 * stalling * (1.0 + STACKED_STALL_PER_SECOND * ahead);
    let queued = arrivals.max(0.0) * own * (wait + own / 2.0);
    let harm = stall + batch + queued;
    Some(Cost {
        ttft,
        queued_ahead: ahead,
        decode,
        harm,
        failed,
        total: ttft + failed + decode + harm,
    })
}

/// Every eligible candidate has a learned prefill line (otherwise the caller places as `load_aware` does).
pub fn all_learned(cands: &[Candidate]) -> bool {
    cands
        .iter()
        .filter(|c| c.eligible)
        .all(|c| speed(c).is_some())
}

/// Every eligible candidate has a decode line (otherwise the decode terms are left out for all).
pub fn all_decode_learned(cands: &[Candidate]) -> bool {
    cands.iter().filter(|c| c.eligible).all(|c| {
        c.decode
            .is_some_and(|l| l.intercept.is_finite() && l.slope.is_finite())
    })
}

/// The cheapest eligible candidate that `allow` accepts, by `total`; ties (within [`TIE_SECONDS`]) uniformly at
/// random. None when nothing qualifies or a qualifying candidate has no learned prefill line.
pub fn cheapest(
    cands: &[Candidate],
    pricing: &Pricing,
    rng: &mut fastrand::Rng,
    allow: impl Fn(usize, &Candidate) -> bool,
) -> Option<(usize, Cost)> {
    let ok = |i: usize, c: &Candidate| c.eligible && i < pricing.uncached.len() && allow(i, c);
    if cands
        .iter()
        .enumerate()
        .any(|(i, c)| ok(i, c) && speed(c).is_none())
    {
        return None;
    }
    let total = pricing.total();
    let i = super::pick_min(cands, rng, TIE_SECONDS, |i, c| {
        ok(i, c).then(|| total(i, c)).flatten()
    })?;
    Some((i, pricing.cost(i, &cands[i])?))
}

/// Whether a session bound where it would cost `stay` should move to where it would cost `best`: only when that
/// saves more than `margin` (0..=1) of staying's cost; with 1 it never does. (A migration must also shorten the
/// turn's own time: [`Pricing::shortens_own_time`].)
pub fn should_move(stay: Cost, best: Cost, margin: f64) -> bool {
    best.total + margin * stay.total < stay.total
}

/// Whether a turn that would cost `stay` on its bound endpoint is stuck there and should be rescued to where it
/// would cost `there`, both priced as a rescue ([`Pricing::rescue`]): it waits at home at least [`STUCK_RATIO`]
/// times as long for its first token, and the move saves more than `margin` of staying's cost.
pub fn should_rescue(stay: Cost, there: Cost, margin: f64) -> bool {
    stay.ttft >= STUCK_RATIO * there.ttft && should_move(stay, there, margin)
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
        // Nothing queued ahead: each of the 10 streams there finishes 0.5 s later.
        let c = cand(10, 0, 10_000.0);
        let k = cost(&c, 5_000, 0.0, 0.0, 0).unwrap();
        assert!((k.ttft - 0.5).abs() < 1e-9, "{k:?}");
        assert!((k.harm - 5.0).abs() < 1e-9, "{k:?}");
        assert!((k.total - 5.5).abs() < 1e-9, "{k:?}");
        // Requests still in their own prefill count: they finish it first (FIFO) and decode beside this one.
        let mut c = c;
        c.prefilling = 4;
        let k = cost(&c, 5_000, 0.0, 0.0, 0).unwrap();
        assert!((k.harm - 5.0).abs() < 1e-9, "{k:?}");
        // Behind 2 s of queued prefill: 1 + 4/s × 2 s = 9 times the stall, for streams that queue stalls already.
        let c = cand(10, 20_000, 10_000.0);
        let k = cost(&c, 5_000, 0.0, 0.0, 0).unwrap();
        assert!((k.ttft - 2.5).abs() < 1e-9, "{k:?}");
        assert!((k.harm - 45.0).abs() < 1e-9, "{k:?}");
        assert!((k.total - 47.5).abs() < 1e-9, "{k:?}");
        assert_eq!(
            cost(&Candidate::default(), 5, 0.0, 0.0, 0),
            None,
            "no speed, no cost"
        );
    }

    #[test]
    fn cached_tokens_beat_an_idle_endpoint_until_the_queue_outweighs_them() {
        let mut rng = fastrand::Rng::with_seed(1);
        // 40k-token body: endpoint 0 holds 36k of it but has 10k prefill queued; endpoint 1 is idle and cold.
        let cands = [cand(2, 10_000, 20_000.0), cand(0, 0, 20_000.0)];
        assert_eq!(
            cheapest(
                &cands,
                &Pricing::prefill(&[4_000, 40_000]),
                &mut rng,
                |_, _| true
            )
            .unwrap()
            .0,
            0
        );
        // With 50k queued ahead, the cold idle endpoint wins.
        let cands = [cand(2, 50_000, 20_000.0), cand(0, 0, 20_000.0)];
        assert_eq!(
            cheapest(
                &cands,
                &Pricing::prefill(&[4_000, 40_000]),
                &mut rng,
                |_, _| true
            )
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
            cheapest(
                &cands,
                &Pricing::prefill(&[9_000, 9_000]),
                &mut rng,
                |_, _| true
            )
            .unwrap()
            .0,
            1
        );
        // Same speed and queue; 30 requests decoding on endpoint 0: the stall sends the prefill elsewhere.
        let cands = [cand(30, 0, 10_000.0), cand(2, 0, 10_000.0)];
        assert_eq!(
            cheapest(
                &cands,
                &Pricing::prefill(&[9_000, 9_000]),
                &mut rng,
                |_, _| true
            )
            .unwrap()
            .0,
            1
        );
    }

    #[test]
    fn a_long_prompt_is_not_stacked_behind_another_where_fewer_streams_decode() {
        let mut rng = fastrand::Rng::with_seed(4);
        // A 130k-token first turn (1.3 s). Endpoint 0: 4 streams and a 120k-token prompt queued (1.2 s); endpoint
        // 1: 12 streams, nothing queued. Summed delay alone: 2.5 + 4 × 1.3 = 7.7 s against 1.3 + 12 × 1.3 = 16.9 s,
        // and the four streams on 0 would sit beside both long prompts. With the queued 1.2 s weighing on the stall
        // (× 5.8): 32.7 s against 16.9 s.
        let cands = [cand(4, 120_000, 100_000.0), cand(12, 0, 100_000.0)];
        let pricing = Pricing::prefill(&[130_000, 130_000]);
        let (best, k) = cheapest(&cands, &pricing, &mut rng, |_, _| true).unwrap();
        assert_eq!(best, 1);
        assert!((k.total - 16.9).abs() < 1e-9, "{k:?}");
        let there = cost(&cands[0], 130_000, 0.0, 0.0, 0).unwrap();
        assert!((there.total - 32.66).abs() < 1e-9, "{there:?}");
    }

    #[test]
    fn the_move_rule_charges_the_recompute() {
        let mut rng = fastrand::Rng::with_seed(3);
        // Bound endpoint 0: 1k growth behind 30k queued (1.55 s). Endpoint 1 idle but must recompute 60k (3 s).
        let cands = [cand(3, 30_000, 20_000.0), cand(0, 0, 20_000.0)];
        let stay = cost(&cands[0], 1_000, 0.0, 0.0, 0).unwrap();
        let (best, k) = cheapest(
            &cands,
            &Pricing::prefill(&[1_000, 60_000]),
            &mut rng,
            |_, _| true,
        )
        .unwrap();
        assert_eq!(best, 0);
        assert!(!should_move(stay, k, MARGIN));
        // A short conversation (4k) behind the same queue: moving saves more than it costs.
        let (best, k) = cheapest(
            &cands,
            &Pricing::prefill(&[1_000, 4_000]),
            &mut rng,
            |_, _| true,
        )
        .unwrap();
        assert_eq!(best, 1);
        assert!(should_move(stay, k, MARGIN));
        // A saving inside the margin is no move.
        let saving = |total: f64| Cost {
            ttft: total,
            queued_ahead: 0.0,
            decode: 0.0,
            harm: 0.0,
            failed: 0.0,
            total,
        };
        let a = saving(1.0);
        assert!(!should_move(a, saving(0.95), MARGIN));
        assert!(should_move(a, saving(0.8), MARGIN));
        // The operator's margin: 0 moves on any saving, 1 never moves.
        assert!(should_move(a, saving(0.95), 0.0));
        assert!(!should_move(a, saving(0.8), 0.5));
        assert!(!should_move(a, saving(0.0), 1.0));
    }

    #[test]
    fn a_move_must_shorten_the_turns_own_time_not_only_the_others() {
        // Home: 10 streams decoding, nothing queued, 1k tokens of growth (0.05 s, stalling the 10 by 0.5 s). There:
        // idle, 4k tokens to recompute (0.2 s, stalling no one). By the totals (0.55 s against 0.2 s) it would move,
        // for a stall read off streams that will have finished long before the session's next turn.
        let mut cands = [cand(10, 0, 20_000.0), cand(0, 0, 20_000.0)];
        let pricing = Pricing::prefill(&[1_000, 4_000]);
        let (stay, go) = (
            pricing.cost(0, &cands[0]).unwrap(),
            pricing.cost(1, &cands[1]).unwrap(),
        );
        assert!(should_move(stay, go, MARGIN), "{stay:?} {go:?}");
        // Each one priced as the policy prices it.
        let shortens = |p: &Pricing, cands: &[Candidate], home: usize, to: usize| {
            let priced = |i: usize| (&cands[i], p.cost(i, &cands[i]).unwrap());
            p.shortens_own_time(priced(home), priced(to))
        };
        assert!(!shortens(&pricing, &cands, 0, 1));
        assert!(
            shortens(&pricing, &cands, 1, 0),
            "the other way round it would"
        );
        // Requests that failed at home weigh as wait there: an engine that never answers is left.
        cands[0].debt_requests = 2;
        let stay = pricing.cost(0, &cands[0]).unwrap();
        assert!(
            stay.ttft < go.ttft && stay.own_wait() > go.own_wait(),
            "{stay:?}"
        );
        assert!(shortens(&pricing, &cands, 0, 1));
        cands[0].debt_requests = 0;
        // The decode counts at the same batch on both: a busier batch at home is no reason to leave, a slower
        // engine is. 100 tokens to answer; both decode at 20 ms a token plus 1 ms a sequence.
        let with = |c: Candidate, base: f64| decoding_at(c, base, 0.001);
        let answer = Pricing {
            output_tokens: 100.0,
            ..pricing
        };
        let busy = [with(cands[0], 0.02), with(cands[1], 0.02)];
        assert!(
            answer.cost(0, &busy[0]).unwrap().decode
                > answer.cost(1, &busy[1]).unwrap().decode + 0.9
        );
        assert!(!shortens(&answer, &busy, 0, 1));
        // Home has slowed to 30 ms a token: 1 s more of its own decode outweighs the 0.15 s longer first token.
        let slow = [with(cands[0], 0.03), with(cands[1], 0.02)];
        assert!(shortens(&answer, &slow, 0, 1));
        // Unpriced (no learned prefill line there): no cost, so nothing to move to.
        let mut unknown = cands;
        unknown[1].prefill_speed = None;
        assert_eq!(pricing.cost(1, &unknown[1]), None);
    }

    #[test]
    fn a_stuck_turn_is_rescued_when_it_waits_three_times_as_long_at_home() {
        // Home: 2 s of prefill queued, 2 streams; 1k tokens of growth. There: 20 streams, idle queue, 8k to recompute.
        let home = cand(2, 40_000, 20_000.0);
        let there = cand(20, 0, 20_000.0);
        let pricing = Pricing::prefill(&[1_000, 8_000]);
        let (stay, go) = (
            pricing.cost(0, &home).unwrap(),
            pricing.cost(1, &there).unwrap(),
        );
        // By the totals the 8k recompute's stall (20 × 0.4 s) outweighs the 2.05 s wait: no move.
        assert!(!should_move(stay, go, MARGIN), "{stay:?} {go:?}");
        // As a rescue its 8k tokens stall no one there, nor the 1k at home.
        let rescue = pricing.rescue();
        let (stay, go) = (
            rescue.cost(0, &home).unwrap(),
            rescue.cost(1, &there).unwrap(),
        );
        assert!((go.harm - 0.0).abs() < 1e-9 && (stay.harm - 0.0).abs() < 1e-9);
        assert!(should_rescue(stay, go, MARGIN), "{stay:?} {go:?}");
        // Beyond the free tokens the stall is priced again: 40k to recompute there.
        let k = Pricing::prefill(&[1_000, 40_000])
            .rescue()
            .cost(1, &there)
            .unwrap();
        let stalling = (40_000 - RESCUE_FREE_TOKENS) as f64 / 20_000.0;
        assert!((k.harm - 20.0 * stalling).abs() < 1e-9, "{k:?}");
        // Only a recompute within the free tokens is a rescue.
        assert!(rescue.stalls_no_one(1) && rescue.stalls_no_one(0) && !rescue.stalls_no_one(2));
        assert!(!Pricing::prefill(&[1_000, 40_000]).rescue().stalls_no_one(1));
        assert!(!pricing.stalls_no_one(1));
        // Home only twice as slow as there: not stuck, whatever the totals.
        let half = cand(2, 7_000, 20_000.0);
        let stay = rescue.cost(0, &half).unwrap();
        assert!(stay.ttft < STUCK_RATIO * go.ttft && !should_rescue(stay, go, MARGIN));
    }

    fn decoding_at(mut c: Candidate, base: f64, per_seq: f64) -> Candidate {
        c.decode = Some(crate::placement::line::Line {
            intercept: base,
            slope: per_seq,
        });
        c
    }

    #[test]
    fn a_long_answer_goes_where_it_decodes_fastest() {
        let mut rng = fastrand::Rng::with_seed(6);
        // Twin prefill speeds; endpoint 0 decodes at 40 ms per token, endpoint 1 at 20 ms; endpoint 1 has 1k of
        // prefill queued (50 ms).
        let cands = [
            decoding_at(cand(0, 0, 20_000.0), 0.04, 0.0),
            decoding_at(cand(0, 1_000, 20_000.0), 0.02, 0.0),
        ];
        let priced = |out: f64| Pricing {
            uncached: &[2_000, 2_000],
            arrivals: &[],
            output_tokens: out,
            stall_free: 0,
        };
        // Prefill alone: the idle one. A 100-token answer: 2 s more on endpoint 0.
        assert_eq!(
            cheapest(&cands, &priced(0.0), &mut rng, |_, _| true)
                .unwrap()
                .0,
            0
        );
        let (i, k) = cheapest(&cands, &priced(100.0), &mut rng, |_, _| true).unwrap();
        assert_eq!(i, 1);
        assert!((k.decode - 2.0).abs() < 1e-9, "{k:?}");
        // The batch it joins: 0.25 ms per sequence, read at the sequences running there plus one.
        let c = decoding_at(cand(7, 0, 20_000.0), 0.02, 0.00025);
        let k = cost(&c, 0, 0.0, 100.0, 0).unwrap();
        assert!(
            (k.decode - 100.0 * (0.02 + 0.00025 * 8.0)).abs() < 1e-9,
            "{k:?}"
        );
        // ...and the 7 streams there each step 0.25 ms longer for its 100 tokens.
        assert!((k.harm - 7.0 * 100.0 * 0.00025).abs() < 1e-9, "{k:?}");
        // One endpoint without a decode line: the caller leaves the decode terms out for all.
        let mut partial = cands;
        partial[0].decode = None;
        assert!(all_decode_learned(&cands) && !all_decode_learned(&partial));
    }

    #[test]
    fn a_long_prefill_avoids_the_endpoint_whose_sessions_will_queue_behind_it() {
        let mut rng = fastrand::Rng::with_seed(7);
        // Twins, equally loaded; turns of the sessions bound to endpoint 0 arrive 3 times a second.
        let cands = [cand(2, 0, 20_000.0), cand(2, 0, 20_000.0)];
        let priced = |uncached: &'static [u64]| Pricing {
            uncached,
            arrivals: &[3.0, 0.0],
            output_tokens: 0.0,
            stall_free: 0,
        };
        // 100k tokens, 5 s: about 15 turns would queue behind it, 2.5 s each on average.
        let (i, k) = cheapest(&cands, &priced(&[100_000, 100_000]), &mut rng, |_, _| true).unwrap();
        assert_eq!(i, 1, "{k:?}");
        let k0 = priced(&[100_000, 100_000]).cost(0, &cands[0]).unwrap();
        assert!(
            (k0.harm - (2.0 * 5.0 + 3.0 * 5.0 * 2.5)).abs() < 1e-9,
            "{k0:?}"
        );
        // Its own cached context on endpoint 0 outweighs that for a short turn: 1k there, 20k on the other.
        let (i, _) = cheapest(&cands, &priced(&[1_000, 20_000]), &mut rng, |_, _| true).unwrap();
        assert_eq!(i, 0);
    }

    #[test]
    fn unlearned_speed_is_reported_not_guessed() {
        let mut rng = fastrand::Rng::with_seed(4);
        let mut cands = [cand(0, 0, 20_000.0), cand(0, 0, 20_000.0)];
        cands[1].prefill_speed = None;
        assert!(!all_learned(&cands));
        assert_eq!(
            cheapest(&cands, &Pricing::prefill(&[1, 1]), &mut rng, |_, _| true),
            None
        );
        // An ineligible endpoint's missing speed does not matter.
        cands[1].eligible = false;
        assert!(all_learned(&cands));
        assert_eq!(
            cheapest(&cands, &Pricing::prefill(&[1, 1]), &mut rng, |_, _| true)
                .unwrap()
                .0,
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
        assert!(
            cost(&busy, 10_000, 0.0, 0.0, 0).unwrap().total
                > cost(&fresh, 10_000, 0.0, 0.0, 0).unwrap().total
        );
        // Load placed elsewhere counts: 30 foreign requests on endpoint 1 make it the costlier one.
        fresh.engine = Some(EngineLoad {
            running: 32,
            waiting: 0,
            kv_usage: 0.1,
            own_at_sample: 2,
        });
        assert!(
            cost(&busy, 10_000, 0.0, 0.0, 0).unwrap().total
                < cost(&fresh, 10_000, 0.0, 0.0, 0).unwrap().total
        );
    }

    #[test]
    fn a_session_leaves_an_engine_flooded_from_elsewhere() {
        let mut rng = fastrand::Rng::with_seed(4);
        // Bound endpoint 0 (1k of growth to compute); endpoint 1 idle, where the 20k conversation is recomputed.
        let mut cands = [cand(1, 0, 20_000.0), cand(0, 0, 20_000.0)];
        let uncached = [1_000, 20_000];
        let stay = cost(&cands[0], uncached[0], 0.0, 0.0, 0).unwrap();
        let (best, k) =
            cheapest(&cands, &Pricing::prefill(&uncached), &mut rng, |_, _| true).unwrap();
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
        let stay = cost(&cands[0], uncached[0], 0.0, 0.0, 0).unwrap();
        // Their prefill is taken to be ahead of the turn: 7 × 16384 tokens at 20k/s, about 5.8 s.
        assert!(
            (stay.ttft - (1_000.0 + 7.0 * 16_384.0) / 20_000.0).abs() < 1e-9,
            "{stay:?}"
        );
        let (best, k) =
            cheapest(&cands, &Pricing::prefill(&uncached), &mut rng, |_, _| true).unwrap();
        assert!(best == 1 && should_move(stay, k, MARGIN), "{stay:?} {k:?}");
    }

    #[test]
    fn what_the_engine_computed_of_the_head_prefill_is_not_ahead() {
        // 120k tokens of ours in flight at 200k tokens/s: 0.6 s of prefill, 0.5 s of it done.
        let mut c = cand(3, 120_000, 200_000.0);
        assert_eq!(tokens_ahead(&c), 120_000);
        c.prefill_busy_seconds = 0.5;
        assert_eq!(tokens_ahead(&c), 20_000);
        let k = cost(&c, 2_000, 0.0, 0.0, 0).unwrap();
        assert!((k.ttft - 0.11).abs() < 1e-9, "{k:?}");
        // The stall of the three streams there stacks on what is left ahead, 0.1 s.
        assert!(
            (k.harm - 3.0 * 0.01 * (1.0 + STACKED_STALL_PER_SECOND * 0.1)).abs() < 1e-9,
            "{k:?}"
        );
        // What others hold stays ahead.
        c.peer_prefill_tokens = 4_000;
        assert_eq!(tokens_ahead(&c), 24_000);
        // Past the time all of ours should take without a first byte, the engine is slower than learned: none of
        // it is taken as done.
        c.prefill_busy_seconds = 0.61;
        assert_eq!(tokens_ahead(&c), 124_000);
        // Not learned: nothing is taken as done.
        c.prefill_speed = None;
        assert_eq!(tokens_ahead(&c), 124_000);
        c.prefill_speed = Some(Fitted::ratio(200_000.0));
        c.prefill_busy_seconds = f64::NAN;
        assert_eq!(tokens_ahead(&c), 124_000);
    }

    #[test]
    fn ties_are_random() {
        let mut rng = fastrand::Rng::with_seed(5);
        let cands = [cand(1, 100, 20_000.0); 3];
        let mut seen = [0; 3];
        for _ in 0..600 {
            seen[cheapest(&cands, &Pricing::prefill(&[500; 3]), &mut rng, |_, _| true)
                .unwrap()
                .0] += 1;
        }
        assert!(seen.iter().all(|&n| n > 120), "{seen:?}");
    }
}
