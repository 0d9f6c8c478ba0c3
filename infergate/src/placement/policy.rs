//! The placement policy seam: one trait every policy implements, the session hooks of those that keep sessions,
//! and the per-request ticket a policy hands back (`factory` builds a pool's policy from its config).
//!
//! A policy owns its state (session table, prefix index, arrival window) and says which lifecycle hooks it needs;
//! the hooks default to doing nothing. `place` stays pure: it sees a snapshot, the time and a random source, and
//! does no I/O, so every rule is a unit test.

use std::time::Instant;

use super::sessions::{ImportOutcome, SavedSession, SessionCommit};
use super::{Candidate, Reason};
use crate::config::PoolConfig;

/// What placement needs to know of one generate request.
#[derive(Debug, Clone, Copy, Default)]
pub struct PlaceRequest<'a> {
    /// The session header's value, when the pool has sessions and the request carries one.
    pub session_key: Option<&'a [u8]>,
    /// The body's `model` ("" when absent).
    pub model: &'a str,
    /// Prompt text in order (see `request::BodyScan::prompt`).
    pub prompt: &'a [u8],
    /// Where the conversation starts in `prompt`, after a top-level system prompt (0 without one).
    pub conversation_at: usize,
    /// The whole body's size in bytes.
    pub body_bytes: u64,
    /// The prompt's exact token count, when the pool has a tokenizer and the body could be counted (`tokens`).
    /// Policies keep measuring prompts in bytes (the prefix index, session sizes) and turn a part of the body into
    /// tokens by this count's share of it ([`PlaceRequest::exact_tokens`]).
    pub tokens: Option<u64>,
    /// The answer length expected, in tokens: the pool's typical answer capped by the request's `max_tokens`
    /// (None: unknown; the cost model then leaves the decode terms out).
    pub output_tokens: Option<f64>,
    /// The request's TTFT budget in seconds (`ttft_budget`): a policy that predicts time to first token places
    /// only where the prediction fits it, if anywhere does.
    pub ttft_budget: Option<f64>,
}

impl PlaceRequest<'_> {
    /// The tokens of `bytes` of this body when its exact count is known: the count scaled by `bytes / body_bytes`
    /// (rounded up; the whole count for the whole body).
    pub fn exact_tokens(&self, bytes: u64) -> Option<u64> {
        let count = self.tokens?;
        if bytes >= self.body_bytes {
            return Some(count);
        }
        let scaled = (u128::from(count) * u128::from(bytes)).div_ceil(u128::from(self.body_bytes));
        Some(u64::try_from(scaled).unwrap_or(count))
    }

    /// The tokens of `bytes` of this body: exact when known, else `bytes / bytes_per_token` (rounded up).
    pub fn tokens_of(&self, bytes: u64, bytes_per_token: f64) -> u64 {
        self.exact_tokens(bytes).unwrap_or_else(|| {
            if bytes_per_token > 0.0 {
                (bytes as f64 / bytes_per_token).ceil() as u64
            } else {
                bytes
            }
        })
    }

    /// Bytes per token of this body: the body over its exact count when known, else `configured`.
    pub fn bytes_per_token(&self, configured: f64) -> f64 {
        match self.tokens {
            Some(t) if t > 0 && self.body_bytes > 0 => self.body_bytes as f64 / t as f64,
            _ => configured,
        }
    }
}

/// The live view of a pool: `cands[i]` describes endpoint `ids[i]`.
#[derive(Debug, Clone, Copy)]
pub struct Snapshot<'a> {
    pub cands: &'a [Candidate],
    pub ids: &'a [u64],
    pub now: Instant,
}

/// Policy state carried by one request from `place` to the lifecycle hooks and the proxy: plain optional parts that
/// any policy fills as it needs, so the seam names no policy and an unused part costs no allocation.
#[derive(Debug, Clone, Default)]
pub struct Ticket {
    /// What a sessions pool commits once the turn was served.
    pub session: Option<SessionCommit>,
    /// The prompt's block hashes, inserted into the prefix index once served (empty: nothing to insert).
    pub hashes: Vec<u64>,
    /// What a cost-predicting policy predicted on the chosen endpoint.
    pub predicted: Option<Prediction>,
}

/// A prediction made at placement, checked against the request's time to first byte.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Prediction {
    /// Predicted seconds to first token (None while the policy places without its cost model).
    pub ttft: Option<f64>,
    /// Prefill tokens ahead of this request on the chosen endpoint at placement (`predicted::tokens_ahead`): with
    /// the request's own estimate over its time to first byte, a sample of the endpoint's prefill throughput.
    pub tokens_ahead: u64,
    /// No endpoint's predicted time to first token fitted the request's TTFT budget: the least of them, seconds.
    pub over_budget: Option<f64>,
    /// Nor would any of them fit it idle (its own prefill alone takes longer): waiting cannot help.
    pub beyond_budget: bool,
}

impl Ticket {
    /// The empty ticket (a `const`, for a static default).
    pub const NONE: Ticket = Ticket {
        session: None,
        hashes: Vec::new(),
        predicted: None,
    };

    /// The predicted seconds to first token and the prefill tokens that were ahead of the request, for a
    /// placement that predicted them.
    pub fn prediction(&self) -> Option<(Option<f64>, u64)> {
        self.predicted.map(|p| (p.ttft, p.tokens_ahead))
    }
}

/// A placement decision.
#[derive(Debug, Clone)]
pub struct Placement {
    /// Index into the snapshot.
    pub index: usize,
    pub reason: Reason,
    /// Bytes the prefill estimate is computed from: the whole body or, for a sticky session turn, its growth.
    pub estimate_bytes: u64,
    /// The same part of the prompt in exact tokens ([`PlaceRequest::exact_tokens`]), when the request's count is
    /// known: the proxy holds these instead of `estimate_bytes / bytes_per_token`.
    pub estimate_tokens: Option<u64>,
    pub ticket: Ticket,
}

impl Placement {
    pub fn whole(index: usize, reason: Reason, req: &PlaceRequest) -> Placement {
        Placement {
            index,
            reason,
            estimate_bytes: req.body_bytes,
            estimate_tokens: req.tokens,
            ticket: Ticket::NONE,
        }
    }
}

/// Why a policy without its own `reconfigure` keeps its parameters.
pub const CANNOT_RECONFIGURE: &str = "this policy keeps the parameters it was built with";

/// Bindings a policy dropped since it was last asked: (idle past the TTL, over capacity).
pub type Evictions = (u64, u64);

/// One placement policy of one pool.
pub trait PlacementPolicy: Send + Sync {
    /// The policy's name in the config file and in logs.
    fn name(&self) -> &'static str;

    /// The reasons this policy can give for a generate request (the `reason` series of
    /// `infergate_placements_total` created at start, and the status page's order).
    fn reasons(&self) -> &'static [Reason];

    /// Choose an endpoint for a generate request; None when no candidate is eligible.
    fn place(
        &self,
        req: &PlaceRequest,
        snap: &Snapshot,
        rng: &mut fastrand::Rng,
    ) -> Option<Placement>;

    /// Whether requests placed by this policy hold prefill tokens on the ledger.
    fn counts_tokens(&self) -> bool {
        true
    }

    /// The request was sent to `endpoint`.
    fn dispatched(&self, _endpoint: u64, _ticket: &Ticket, _now: Instant) {}

    /// `endpoint` answered the request with a success status: what the policy learns, it learns here only.
    fn served(&self, _endpoint: u64, _ticket: &Ticket, _now: Instant) {}

    /// `endpoint` left the pool (or failed in a way that makes its cached state worthless).
    fn endpoint_removed(&self, _endpoint: u64) {}

    /// Housekeeping: drop state idle past its lifetime; returns the evictions since the last call.
    fn expire(&self, _now: Instant) -> Evictions {
        (0, 0)
    }

    /// The session hooks, for a policy that keeps sessions (None otherwise, and for a pool without `sessions`).
    fn sessions(&self) -> Option<&dyn SessionHooks> {
        None
    }

    /// Take a reloaded pool's new parameters (same policy kind; `cfg.policy` and `cfg.prefill` may differ) and keep
    /// the state: what the new limits no longer hold is dropped and counted as evictions. Ok carries a note for the
    /// reload's log line (what was dropped); Err says why this policy cannot change in place. The default cannot.
    fn reconfigure(
        &self,
        _cfg: &PoolConfig,
        _now: Instant,
    ) -> Result<Option<String>, &'static str> {
        Err(CANNOT_RECONFIGURE)
    }
}

/// What a policy that keeps session bindings answers besides placing: counting, saving, adopting and sharing them.
pub trait SessionHooks: Send + Sync {
    /// Session bindings held.
    fn session_count(&self) -> usize;

    /// The live session bindings, least recently served first, for the next instance (`state_file`).
    fn export_sessions(&self, now: Instant) -> Vec<SavedSession>;

    /// Whether the session with this header value has a live binding.
    fn has_session(&self, key: &[u8], now: Instant) -> bool;

    /// Adopt one binding another replica wrote to the shared store (`crate::cluster`; endpoint id already mapped
    /// to this process's). Returns whether it was taken.
    fn import_binding(&self, saved: SavedSession, now: Instant) -> bool;

    /// The binding a served request left in the table (after `served`), to share with the other replicas.
    fn served_binding(&self, ticket: &Ticket, now: Instant) -> Option<SavedSession>;

    /// Adopt bindings a previous instance saved (endpoint ids already mapped to this process's).
    fn import_sessions(&self, saved: Vec<SavedSession>, now: Instant) -> ImportOutcome;
}

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::time::Duration;

    use super::*;
    use crate::config::Config;
    use crate::placement::factory::build;

    fn pool(extra: &str) -> PoolConfig {
        let text = format!("pools:\n  - name: a\n    endpoints: [\"http://127.0.0.1:9\"]\n{extra}");
        let cfg = Config::parse(Path::new("t.yaml"), &text).expect("valid");
        cfg.pools[0].clone()
    }

    const IDS: [u64; 2] = [1, 2];

    fn cands() -> [Candidate; 2] {
        [Candidate {
            eligible: true,
            ..Candidate::default()
        }; 2]
    }

    fn session_count(p: &dyn PlacementPolicy) -> Option<usize> {
        p.sessions().map(|s| s.session_count())
    }

    /// Place `key`'s turn with `prompt` and commit it as served; returns the reason.
    fn turn(p: &dyn PlacementPolicy, key: &[u8], prompt: &[u8], now: Instant) -> Reason {
        let cands = cands();
        let snap = Snapshot {
            cands: &cands,
            ids: &IDS,
            now,
        };
        let req = PlaceRequest {
            session_key: Some(key),
            model: "m",
            prompt,
            conversation_at: 0,
            body_bytes: prompt.len() as u64,
            tokens: None,
            output_tokens: None,
            ttft_budget: None,
        };
        let placed = p
            .place(&req, &snap, &mut fastrand::Rng::with_seed(7))
            .unwrap();
        p.dispatched(IDS[placed.index], &placed.ticket, now);
        p.served(IDS[placed.index], &placed.ticket, now);
        placed.reason
    }

    #[test]
    fn exact_tokens_scale_a_part_of_the_body_by_the_count() {
        let req = |tokens| PlaceRequest {
            body_bytes: 1_000,
            tokens,
            ..PlaceRequest::default()
        };
        assert_eq!(req(None).exact_tokens(500), None);
        assert_eq!(req(None).tokens_of(500, 4.0), 125);
        let exact = req(Some(300));
        assert_eq!(exact.exact_tokens(1_000), Some(300));
        assert_eq!(exact.exact_tokens(2_000), Some(300));
        assert_eq!(exact.exact_tokens(100), Some(30));
        assert_eq!(exact.exact_tokens(1), Some(1), "rounded up");
        assert_eq!(exact.exact_tokens(0), Some(0));
        assert_eq!(exact.tokens_of(500, 4.0), 150);
        assert!((exact.bytes_per_token(4.0) - 1_000.0 / 300.0).abs() < 1e-9);
        assert_eq!(req(Some(0)).bytes_per_token(4.0), 4.0);
    }

    #[test]
    fn a_sticky_turn_holds_the_exact_tokens_of_its_growth() {
        let p = build(&pool("    sessions: {}\n"));
        let cands = cands();
        let now = Instant::now();
        let snap = Snapshot {
            cands: &cands,
            ids: &IDS,
            now,
        };
        let prompt = vec![b'a'; 1_000];
        let req = |len: usize, tokens| PlaceRequest {
            session_key: Some(b"s"),
            model: "m",
            prompt: &prompt[..len],
            conversation_at: 0,
            body_bytes: len as u64,
            tokens: Some(tokens),
            output_tokens: None,
            ttft_budget: None,
        };
        let first = p
            .place(&req(600, 150), &snap, &mut fastrand::Rng::with_seed(7))
            .unwrap();
        assert_eq!(
            (first.reason, first.estimate_tokens),
            (Reason::NewSession, Some(150))
        );
        p.dispatched(IDS[first.index], &first.ticket, now);
        p.served(IDS[first.index], &first.ticket, now);
        // The turn grew by 400 of its 1,000 bytes: 40% of its 250 exact tokens.
        let next = p
            .place(&req(1_000, 250), &snap, &mut fastrand::Rng::with_seed(7))
            .unwrap();
        assert_eq!(
            (next.reason, next.estimate_bytes, next.estimate_tokens),
            (Reason::Sticky, 400, Some(100))
        );
    }

    #[test]
    fn a_smaller_session_table_keeps_the_most_recent_bindings_and_counts_the_rest() {
        let p = build(&pool("    sessions: { max_sessions: 3, ttl: 1h }\n"));
        let t0 = Instant::now();
        for (i, key) in [b"s1", b"s2", b"s3"].iter().enumerate() {
            turn(&*p, *key, b"hello", t0 + Duration::from_secs(i as u64));
        }
        assert_eq!(session_count(&*p), Some(3));
        let now = t0 + Duration::from_secs(10);
        let note = p
            .reconfigure(&pool("    sessions: { max_sessions: 1, ttl: 1h }\n"), now)
            .unwrap();
        assert_eq!(
            note.as_deref(),
            Some("0 session binding(s) past the new ttl dropped, 2 beyond the new max_sessions evicted")
        );
        assert_eq!(session_count(&*p), Some(1));
        // Counted as capacity evictions for infergate_session_evictions_total.
        assert_eq!(p.expire(now), (0, 2));
        // The binding kept is the most recently served one, and it is still sticky.
        assert_eq!(turn(&*p, b"s3", b"hello", now), Reason::Sticky);
        assert_eq!(turn(&*p, b"s1", b"hello", now), Reason::NewSession);
    }

    #[test]
    fn a_shorter_session_ttl_drops_idle_bindings_now() {
        let p = build(&pool("    sessions: { ttl: 1h }\n"));
        let t0 = Instant::now();
        turn(&*p, b"old", b"x", t0);
        turn(&*p, b"new", b"x", t0 + Duration::from_secs(600));
        let now = t0 + Duration::from_secs(660);
        let note = p
            .reconfigure(&pool("    sessions: { ttl: 5m }\n"), now)
            .unwrap();
        assert_eq!(
            note.as_deref(),
            Some("1 session binding(s) past the new ttl dropped, 0 beyond the new max_sessions evicted")
        );
        assert_eq!(session_count(&*p), Some(1));
        assert_eq!(p.expire(now), (1, 0));
        assert_eq!(turn(&*p, b"new", b"x", now), Reason::Sticky);
        // Nothing to drop: no note.
        assert_eq!(
            p.reconfigure(&pool("    sessions: { ttl: 2h }\n"), now),
            Ok(None)
        );
    }

    #[test]
    fn sessions_cannot_be_turned_on_or_off_in_place() {
        let with = build(&pool("    sessions: {}\n"));
        let without = build(&pool(""));
        let now = Instant::now();
        assert!(with.reconfigure(&pool(""), now).is_err());
        assert!(without
            .reconfigure(&pool("    sessions: {}\n"), now)
            .is_err());
        assert_eq!(
            without.reconfigure(&pool("    prefill: { bytes_per_token: 2 }\n"), now),
            Ok(None)
        );
    }

    #[test]
    fn the_prefix_index_is_trimmed_to_a_new_capacity_and_cleared_by_a_new_block_size() {
        let cfg = |extra: &str| {
            pool(&format!(
                "    policy: prefix_aware\n    prefix: {{ min_match_bytes: 64{extra} }}\n"
            ))
        };
        let p = build(&cfg(""));
        let now = Instant::now();
        let prompt = vec![b'a'; 64 * 8];
        assert_eq!(turn(&*p, b"", &prompt, now), Reason::PrefixMiss);
        assert_eq!(turn(&*p, b"", &prompt, now), Reason::PrefixHit);
        // 16 tokens × 4 bytes per token = one 64-byte block per endpoint: the first block is kept.
        let note = p
            .reconfigure(&cfg(", capacity_tokens_per_endpoint: 16"), now)
            .unwrap();
        assert_eq!(
            note.as_deref(),
            Some("7 prefix blocks beyond the new capacity dropped")
        );
        assert_eq!(turn(&*p, b"", &prompt, now), Reason::PrefixHit);
        let note = p.reconfigure(&cfg(", block_bytes: 32"), now).unwrap();
        assert!(
            note.as_deref()
                .is_some_and(|n| n.starts_with("prefix index cleared")),
            "{note:?}"
        );
        assert_eq!(turn(&*p, b"", &prompt, now), Reason::PrefixMiss);
        // A policy of another kind is refused.
        assert!(p.reconfigure(&pool(""), now).is_err());
    }

    #[test]
    fn predicted_ttft_resizes_its_session_table_and_refuses_a_new_prefix_index() {
        let sessions = "    policy: predicted_ttft\n    sessions: { max_sessions: 3, ttl: 1h }\n";
        let p = build(&pool(sessions));
        let t0 = Instant::now();
        for (i, key) in [b"s1", b"s2", b"s3"].iter().enumerate() {
            turn(&*p, *key, b"hello", t0 + Duration::from_secs(i as u64));
        }
        assert_eq!(session_count(&*p), Some(3));
        let now = t0 + Duration::from_secs(10);
        let smaller = "    policy: predicted_ttft\n    sessions: { max_sessions: 1, ttl: 1h }\n";
        assert!(p.reconfigure(&pool(smaller), now).unwrap().is_some());
        assert_eq!(session_count(&*p), Some(1));
        let rehash = format!("{smaller}    prefix: {{ block_bytes: 32 }}\n");
        assert!(p.reconfigure(&pool(&rehash), now).is_err());
        assert!(
            p.reconfigure(&pool("    policy: predicted_ttft\n"), now)
                .is_err(),
            "sessions off"
        );
        // The binding a served turn leaves is what the cluster shares.
        let key: &[u8] = b"s9";
        turn(&*p, key, b"hello", now);
        assert_eq!(p.sessions().map(|s| s.has_session(key, now)), Some(true));
    }

    #[test]
    fn policies_without_parameters_accept_and_others_refuse_by_default() {
        let now = Instant::now();
        for policy in ["round_robin", "least_request"] {
            let cfg = pool(&format!("    policy: {policy}\n"));
            assert_eq!(build(&cfg).reconfigure(&cfg, now), Ok(None));
        }
        struct Fixed;
        impl PlacementPolicy for Fixed {
            fn name(&self) -> &'static str {
                "fixed"
            }
            fn reasons(&self) -> &'static [Reason] {
                &[]
            }
            fn place(
                &self,
                _: &PlaceRequest,
                _: &Snapshot,
                _: &mut fastrand::Rng,
            ) -> Option<Placement> {
                None
            }
        }
        assert_eq!(Fixed.reconfigure(&pool(""), now), Err(CANNOT_RECONFIGURE));
    }
}
