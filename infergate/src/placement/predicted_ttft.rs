//! `predicted_ttft`: the endpoint where the request costs everyone least: its own predicted time to first token
//! and decode, and the delay it adds to the streams decoding there and the session turns arriving there (see
//! `predicted`), where a session moves only when that saves more than its recompute costs and shortens its own
//! time. Owns a session table (with `sessions`) and a prefix index (what each endpoint holds of a prompt, across
//! sessions).
//!
//! Until every eligible endpoint's prefill throughput is learned, it places as `load_aware` does.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use parking_lot::Mutex;

use super::arrivals::Arrivals;
use super::ladder::{Bound, Ladder};
use super::policy::{
    Evictions, PlaceRequest, Placement, PlacementPolicy, Prediction, SessionHooks, Snapshot, Ticket,
};
use super::predicted::{
    all_decode_learned, all_learned, should_move, should_rescue, tokens_ahead, Cost, Pricing,
    TIE_SECONDS,
};
use super::prefix::PrefixIndex;
use super::sessions::{lineage_of, SessionCommit, SessionRequest, SessionSlot};
use super::Reason;
use crate::config::{
    Policy, PolicyConfig, PoolConfig, PrefixConfig, SessionsConfig, DEFAULT_MOVE_MARGIN,
};

/// The reasons it gives with sessions, in the order the metrics and the status page list them: the session
/// table's and its own `rescue`.
const REASONS: [Reason; 7] = [
    Reason::NewSession,
    Reason::Sticky,
    Reason::Migrate,
    Reason::Rescue,
    Reason::Spill,
    Reason::Fallback,
    Reason::Headerless,
];

pub struct PredictedTtft {
    sessions: SessionSlot,
    prefix: PrefixConfig,
    index: Mutex<PrefixIndex>,
    bytes_per_token: f64,
    /// `sessions.move_margin` (an f64's bits): a reload changes it in place.
    move_margin: AtomicU64,
    /// How often turns of the sessions bound to each endpoint arrive (the turns a prefill there delays).
    arrivals: Mutex<Arrivals>,
}

impl PredictedTtft {
    pub fn new(
        sessions: Option<&SessionsConfig>,
        prefix: &PrefixConfig,
        bytes_per_token: f64,
    ) -> PredictedTtft {
        PredictedTtft {
            sessions: SessionSlot::new(sessions),
            prefix: prefix.clone(),
            index: Mutex::new(PrefixIndex::new(prefix, bytes_per_token)),
            bytes_per_token,
            move_margin: AtomicU64::new(move_margin(sessions).to_bits()),
            arrivals: Mutex::new(Arrivals::default()),
        }
    }

    fn move_margin(&self) -> f64 {
        f64::from_bits(self.move_margin.load(Ordering::Relaxed))
    }
}

/// Prompt bytes of `tokens` tokens at `bytes_per_token` (the request's own when its tokens are exact): what the
/// policy's byte measures (prefix index, session sizes) compare with.
fn bytes_of(tokens: u64, bytes_per_token: f64) -> u64 {
    let b = tokens as f64 * bytes_per_token;
    if b.is_finite() && b > 0.0 {
        b.ceil() as u64
    } else {
        0
    }
}

fn move_margin(sessions: Option<&SessionsConfig>) -> f64 {
    sessions.map_or(DEFAULT_MOVE_MARGIN, |s| s.move_margin)
}

/// One decision before it becomes a `Placement`.
struct Pick {
    index: usize,
    reason: Reason,
    /// Bytes of the body the chosen endpoint must compute.
    uncached_bytes: u64,
    cost: Option<Cost>,
    /// No endpoint's predicted time to first token fits the request's budget: the least of them.
    over_budget: Option<f64>,
    /// Not even idle.
    beyond_budget: bool,
}

impl PlacementPolicy for PredictedTtft {
    fn name(&self) -> &'static str {
        Policy::PredictedTtft.as_str()
    }

    fn reasons(&self) -> &'static [Reason] {
        if self.sessions.is_on() {
            &REASONS
        } else {
            &[Reason::Predicted, Reason::LoadAware]
        }
    }

    fn place(
        &self,
        req: &PlaceRequest,
        snap: &Snapshot,
        rng: &mut fastrand::Rng,
    ) -> Option<Placement> {
        let (cands, ids) = (snap.cands, snap.ids);
        let n = cands.len().min(ids.len());
        let hashes = PrefixIndex::hash_blocks(&self.prefix, req.model, req.prompt);
        let block = self.prefix.block_bytes.max(1) as u64;
        let body = req.body_bytes;
        // What each endpoint holds of this prompt, by the prefix index.
        let mut uncached_bytes: Vec<u64> = self
            .index
            .lock()
            .matched_blocks(&hashes, &ids[..n])
            .iter()
            .map(|&m| body.saturating_sub(m as u64 * block))
            .collect();
        let sreq = req.session_key.map(|key| SessionRequest {
            key,
            lineage: lineage_of(req.prompt, req.conversation_at),
            body_bytes: body,
            bytes_per_token: req.bytes_per_token(self.bytes_per_token),
        });
        let table = self.sessions.table();
        let binding = match (table, &sreq) {
            (Some(t), Some(r)) => t.lock().bound(r, snap.now),
            _ => None,
        };
        // The bound endpoint holds the session up to its recorded size.
        if let Some((id, Some(last))) = binding {
            if let Some(b) = ids[..n]
                .iter()
                .position(|&i| i == id)
                .filter(|_| body >= last)
            {
                uncached_bytes[b] = uncached_bytes[b].min(body - last);
            }
        }
        // What an engine holds by its own KV events is exact: it wins over both guesses above.
        for (u, c) in uncached_bytes.iter_mut().zip(&cands[..n]) {
            if let Some(held) = c.kv_held_tokens {
                *u = body.saturating_sub(bytes_of(held, req.bytes_per_token(self.bytes_per_token)));
            }
        }
        let bound = Bound::of(binding.map(|(id, _)| id), &cands[..n], &ids[..n]);

        let pick = if all_learned(&cands[..n]) {
            let uncached: Vec<u64> = uncached_bytes
                .iter()
                .map(|&b| req.tokens_of(b, self.bytes_per_token))
                .collect();
            let arrivals: Vec<f64> = {
                let a = self.arrivals.lock();
                ids[..n].iter().map(|&id| a.rate(id, snap.now)).collect()
            };
            let output_tokens = match req.output_tokens {
                Some(t) if all_decode_learned(&cands[..n]) => t,
                _ => 0.0,
            };
            let pricing = Pricing {
                uncached: &uncached,
                arrivals: &arrivals,
                output_tokens,
                stall_free: 0,
            };
            let budget = req.ttft_budget.filter(|b| b.is_finite() && *b >= 0.0);
            self.by_cost(
                &cands[..n],
                &pricing,
                &uncached_bytes,
                bound,
                &sreq,
                budget,
                rng,
            )?
        } else {
            return self.as_load_aware(req, snap, sreq, hashes, rng);
        };
        let session = match (&sreq, table) {
            (Some(r), Some(_)) => Some(SessionCommit::for_reason(
                r,
                pick.reason,
                ids[pick.index],
                binding.map(|(id, _)| id),
            )),
            _ => None,
        };
        Some(Placement {
            index: pick.index,
            reason: pick.reason,
            estimate_bytes: pick.uncached_bytes,
            estimate_tokens: req.exact_tokens(pick.uncached_bytes),
            ticket: Ticket {
                session,
                hashes,
                predicted: Some(Prediction {
                    ttft: pick.cost.map(|c| c.ttft),
                    tokens_ahead: tokens_ahead(&cands[pick.index]),
                    over_budget: pick.over_budget,
                    beyond_budget: pick.beyond_budget,
                }),
            },
        })
    }

    fn served(&self, endpoint: u64, ticket: &Ticket, now: Instant) {
        if let Some(commit) = &ticket.session {
            self.sessions.commit(commit, now);
            // The session's next turns go where it is bound (a spilled turn's binding stays).
            self.arrivals.lock().tick(commit.endpoint(), now);
        }
        if !ticket.hashes.is_empty() {
            self.index.lock().insert(endpoint, &ticket.hashes, now);
        }
    }

    fn endpoint_removed(&self, endpoint: u64) {
        self.index.lock().remove_endpoint(endpoint);
        self.sessions.endpoint_removed(endpoint);
        self.arrivals.lock().remove(endpoint);
    }

    fn sessions(&self) -> Option<&dyn SessionHooks> {
        self.sessions.hooks()
    }

    fn expire(&self, now: Instant) -> Evictions {
        self.sessions.expire(now)
    }

    /// The session table's ttl and size (as in `load_aware`) and the move margin change in place; the prefix
    /// settings and `bytes_per_token` shape the prefix index's hashes and are taken at start.
    fn reconfigure(&self, cfg: &PoolConfig, now: Instant) -> Result<Option<String>, &'static str> {
        let PolicyConfig::PredictedTtft { sessions, prefix } = &cfg.policy else {
            return Err(super::policy::CANNOT_RECONFIGURE);
        };
        if *prefix != self.prefix || cfg.prefill.bytes_per_token != self.bytes_per_token {
            return Err("predicted_ttft's prefix settings and bytes_per_token shape its prefix index at start");
        }
        let note = self.sessions.reconfigure(sessions.as_ref(), now)?;
        self.move_margin
            .store(move_margin(sessions.as_ref()).to_bits(), Ordering::Relaxed);
        Ok(note)
    }
}

impl PredictedTtft {
    /// The cost-based decision (every eligible endpoint's throughput is learned): the session ladder ranked by
    /// predicted cost, where a turn spills off a bound endpoint at its limit and otherwise moves only when that
    /// saves more than the move margin, or when it is stuck there and its rescue does (`predicted`).
    #[allow(clippy::too_many_arguments)]
    fn by_cost(
        &self,
        cands: &[super::Candidate],
        pricing: &Pricing,
        uncached_bytes: &[u64],
        bound: Bound,
        sreq: &Option<SessionRequest>,
        budget: Option<f64>,
        rng: &mut fastrand::Rng,
    ) -> Option<Pick> {
        // With a TTFT budget, only endpoints whose predicted time to first token fits it are ranked, if any does.
        let fits = |i: usize, c: &super::Candidate| {
            budget.is_none_or(|b| pricing.cost(i, c).is_some_and(|k| k.ttft <= b))
        };
        let any_fits = cands
            .iter()
            .enumerate()
            .any(|(i, c)| c.eligible && fits(i, c));
        let least = |ttft: fn(&Cost) -> f64| {
            cands
                .iter()
                .enumerate()
                .filter(|(_, c)| c.eligible)
                .filter_map(|(i, c)| pricing.cost(i, c).map(|k| ttft(&k)))
                .min_by(f64::total_cmp)
        };
        let (over_budget, beyond_budget) = match budget {
            Some(b) if !any_fits => (
                least(|k| k.ttft),
                least(|k| k.ttft - k.queued_ahead).is_some_and(|idle| idle > b),
            ),
            _ => (None, false),
        };
        let ranked = |p: &Pricing, i: usize, c: &super::Candidate| {
            if any_fits && !fits(i, c) {
                return None;
            }
            p.total()(i, c)
        };
        let ladder = Ladder::new(cands, TIE_SECONDS, |i, c| ranked(pricing, i, c));
        let sessions = self.sessions.is_on();
        let (index, reason) = match sreq.as_ref().filter(|_| sessions) {
            None => {
                let reason = if sessions {
                    Reason::Headerless
                } else {
                    Reason::Predicted
                };
                (ladder.cheapest(rng, |_, _| true)?, reason)
            }
            Some(_) => ladder.climb(rng, bound, |l, rng, b| {
                if cands[b].at_limit() {
                    if let Some(t) = l.spill_at_limit(rng, b) {
                        return Some((t, Reason::Spill));
                    }
                }
                if any_fits && !fits(b, &cands[b]) {
                    // The bound endpoint cannot serve this turn within its budget: one turn elsewhere, the
                    // binding kept.
                    return Some((l.cheapest(rng, |i, _| i != b)?, Reason::Spill));
                }
                let stay = pricing.cost(b, &cands[b])?;
                let best = l.cheapest(rng, |i, c| i == b || !c.kv_full())?;
                let saves = pricing.cost(best, &cands[best])?;
                if best != b
                    && should_move(stay, saves, self.move_margin())
                    && pricing.shortens_own_time((&cands[b], stay), (&cands[best], saves))
                {
                    return Some((best, Reason::Migrate));
                }
                // Not worth a move by the totals: a stuck turn whose recompute is short stalls no one there.
                let rescue = pricing.rescue();
                if !(0..cands.len()).any(|i| i != b && rescue.stalls_no_one(i)) {
                    return None; // no short recompute anywhere: skip repricing (most turns of long sessions)
                }
                let best = Ladder::new(cands, TIE_SECONDS, |i, c| ranked(&rescue, i, c))
                    .cheapest(rng, |i, c| i == b || !c.kv_full())?;
                let stay = rescue.cost(b, &cands[b])?;
                let there = rescue.cost(best, &cands[best])?;
                (best != b
                    && rescue.stalls_no_one(best)
                    && should_rescue(stay, there, self.move_margin()))
                .then_some((best, Reason::Rescue))
            })?,
        };
        Some(Pick {
            index,
            reason,
            uncached_bytes: uncached_bytes[index],
            cost: pricing.cost(index, &cands[index]),
            over_budget,
            beyond_budget,
        })
    }

    /// Before every throughput is learned: `load_aware`'s decisions (the session table's rules for session
    /// requests), the prefix index still learning from what is served.
    fn as_load_aware(
        &self,
        req: &PlaceRequest,
        snap: &Snapshot,
        sreq: Option<SessionRequest>,
        hashes: Vec<u64>,
        rng: &mut fastrand::Rng,
    ) -> Option<Placement> {
        let ticket = |session, index: usize| Ticket {
            session,
            hashes,
            predicted: Some(Prediction {
                ttft: None,
                tokens_ahead: tokens_ahead(&snap.cands[index]),
                over_budget: None,
                beyond_budget: false,
            }),
        };
        match (self.sessions.table(), sreq) {
            (Some(table), Some(sreq)) => {
                let p = table
                    .lock()
                    .place(&sreq, snap.cands, snap.ids, snap.now, rng)?;
                Some(Placement {
                    index: p.index,
                    reason: p.reason,
                    estimate_bytes: p.estimate_bytes,
                    estimate_tokens: req.exact_tokens(p.estimate_bytes),
                    ticket: ticket(Some(p.commit), p.index),
                })
            }
            (sessions, _) => {
                let index = super::load_aware(snap.cands, rng)?;
                let reason = if sessions.is_some() {
                    Reason::Headerless
                } else {
                    Reason::LoadAware
                };
                Some(Placement {
                    index,
                    reason,
                    estimate_bytes: req.body_bytes,
                    estimate_tokens: req.tokens,
                    ticket: ticket(None, index),
                })
            }
        }
    }
}

#[cfg(test)]
mod tests;
