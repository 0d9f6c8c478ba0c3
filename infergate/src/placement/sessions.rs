//! Session bindings for agent conversations: sticky placement that moves only under real pressure, with
//! growth-only prefill estimates.
//!
//! One [`SessionTable`] per pool maps a 64-bit hash of the session header value to a binding: the endpoint the
//! session is bound to, up to [`MAX_LINEAGES`] prompt lineages (each with the body size of its last turn the bound
//! endpoint served) and when the session was last seen. [`SessionTable::place`] only reads the table (apart from
//! dropping an expired binding it looks up); [`SessionTable::commit`], called once the request was served, is the
//! only writer of bindings and sizes, so a failed dispatch never advances a size record.
//!
//! Decisions, in order, for a request that carries the session header:
//!
//! 1. No live binding → `NewSession`: `load_aware` among eligible endpoints, whole body; commit binds.
//! 2. The bound endpoint is gone (its id is not in `ids`) or ineligible → `Fallback`: `load_aware`, whole body;
//!    commit rebinds.
//! 3. The bound endpoint `has_queue()` and the `load_aware` pick among the other eligible, not `kv_full()`
//!    endpoints has a `request_load()` at least [`MIGRATE_MIN_GAP`] below the bound endpoint's → `Migrate`: whole
//!    body; commit rebinds. Tokens choose the target; the gap is measured in requests against that target.
//! 4. The bound endpoint is `at_limit()` → `Spill` to the `load_aware` pick among the other eligible endpoints that
//!    are not at their own limit, preferring ones that are not `kv_full()`; whole body; the binding is kept. With
//!    no such endpoint the request stays on the bound one as `Sticky`.
//! 5. Backlog spill (infergate's addition): the bound endpoint has at least [`BACKLOG_SPILL_MIN_TOKENS`] prefill
//!    tokens in flight (a long cold prefill that this turn would queue behind: chunked prefill is FIFO), and the
//!    `load_aware` pick among the others (not at their limit, not `kv_full()`) would clear the *whole* body at least
//!    [`BACKLOG_SPILL_RATIO`] times sooner (its prefill in flight + the whole body, against the bound endpoint's
//!    prefill in flight + the growth) → `Spill`, binding kept. Only short conversations qualify: recomputing a long
//!    one elsewhere costs more than waiting. Tokens never *move* a session; they may send one turn around a jam.
//! 6. Otherwise `Sticky`: the estimate is the growth of this lineage since its last committed size, or the whole
//!    body when the lineage is new to the session or the body shrank (compaction, or another conversation reusing
//!    the header).
//!
//! Spill and lineage sizes: a spilled turn is served by another endpoint, so the bound endpoint's cache did not see
//! it. Committing a spill therefore neither moves the binding nor touches any lineage size (it only refreshes
//! "last seen"); the next sticky turn counts the growth since the last turn the bound endpoint itself served.
//!
//! Rebinding (`NewSession`, `Fallback`, `Migrate`) to a different endpoint clears the session's other lineages:
//! the new endpoint has none of them cached, so their next turns count the whole body. Rebinding to the endpoint the
//! binding already names (two first turns of a session racing) keeps them.

use std::hash::Hasher;
use std::num::NonZeroUsize;
use std::time::{Duration, Instant};

use lru::LruCache;

use super::{Candidate, Reason};

/// Prompt lineages remembered per session (LRU among them beyond this).
pub const MAX_LINEAGES: usize = 4;

/// A queued bound endpoint moves a session only to a target with at least this many fewer requests in flight.
pub const MIGRATE_MIN_GAP: u64 = 4;

/// A backlog spill needs at least this many prefill tokens in flight on the bound endpoint.
pub const BACKLOG_SPILL_MIN_TOKENS: u64 = 16_384;

/// A backlog spill needs the target to clear the request's prefill at least this many times sooner.
pub const BACKLOG_SPILL_RATIO: u64 = 4;

/// Bytes of the prompt text [`lineage_of`] hashes.
pub const LINEAGE_PREFIX_BYTES: usize = 256;

/// FNV-1a (64-bit) of the first [`LINEAGE_PREFIX_BYTES`] bytes of the prompt text: sub-agents that share one
/// session header but start from different system prompts / first messages get different lineages.
/// Deterministic across processes and builds.
pub fn lineage_of(prompt_prefix: &[u8]) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let n = prompt_prefix.len().min(LINEAGE_PREFIX_BYTES);
    prompt_prefix[..n]
        .iter()
        .fold(OFFSET, |h, &b| (h ^ u64::from(b)).wrapping_mul(PRIME))
}

/// The table key for a session header value. SipHash (std's `DefaultHasher` with fixed keys) rather than FNV: a
/// client cannot cheaply craft a header that lands on another session's binding. Only this hash is stored.
fn session_key(header: &[u8]) -> u64 {
    let mut h = std::hash::DefaultHasher::new();
    h.write(header);
    h.finish()
}

/// One session request to place (policy `load_aware`, the request carries the session header).
#[derive(Debug, Clone, Copy)]
pub struct SessionRequest<'a> {
    /// The session header value.
    pub key: &'a [u8],
    /// [`lineage_of`] the prompt, computed by the proxy.
    pub lineage: u64,
    /// The request body size in bytes.
    pub body_bytes: u64,
    /// The pool's prefill estimate divisor, to weigh body bytes against candidates' prefill tokens.
    pub bytes_per_token: f64,
}

/// Where a session request goes, why, what its prefill estimate is computed from, and what to commit once served.
#[derive(Debug, Clone)]
pub struct SessionPlacement {
    /// Index into the candidate slice.
    pub index: usize,
    pub reason: Reason,
    /// Bytes the prefill estimate is computed from: the whole body, or a sticky turn's growth.
    pub estimate_bytes: u64,
    /// Pass to [`SessionTable::commit`] after the request was served (response headers below 500).
    pub commit: SessionCommit,
}

/// What [`SessionTable::commit`] writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CommitKind {
    /// NewSession, Fallback, Migrate: bind the session to the endpoint that served it.
    Bind,
    /// Sticky: the bound endpoint served this turn; record the lineage size.
    Sticky,
    /// Spill: another endpoint served this one turn; keep the binding and every size.
    Spill,
}

/// The record of one placement, applied by [`SessionTable::commit`] once the request was served.
#[derive(Clone, Debug)]
pub struct SessionCommit {
    key: u64,
    lineage: u64,
    /// Endpoint id that served (Bind, Sticky) or the bound endpoint's id (Spill).
    endpoint: u64,
    body_bytes: u64,
    kind: CommitKind,
}

impl SessionCommit {
    /// The endpoint id the commit binds to (or, for a spill, the binding it keeps).
    pub fn endpoint(&self) -> u64 {
        self.endpoint
    }
}

/// One binding. Lineages are kept most recently used first in `lineages[..len]`; sizes are saturated to `u32`
/// (4 GiB bodies are far beyond any prefill estimate cap) to keep the entry at 80 bytes.
#[derive(Debug, Clone, Copy)]
struct Binding {
    endpoint: u64,
    last_seen: Instant,
    lineages: [u64; MAX_LINEAGES],
    sizes: [u32; MAX_LINEAGES],
    len: u8,
}

impl Binding {
    fn new(endpoint: u64, now: Instant) -> Self {
        Binding {
            endpoint,
            last_seen: now,
            lineages: [0; MAX_LINEAGES],
            sizes: [0; MAX_LINEAGES],
            len: 0,
        }
    }

    fn size_of(&self, lineage: u64) -> Option<u64> {
        let n = usize::from(self.len);
        self.lineages[..n]
            .iter()
            .position(|&l| l == lineage)
            .map(|i| u64::from(self.sizes[i]))
    }

    /// Record `lineage` at `bytes`, making it the most recently used; the least recently used lineage drops out
    /// beyond [`MAX_LINEAGES`].
    fn record(&mut self, lineage: u64, bytes: u64) {
        let n = usize::from(self.len);
        let size = u32::try_from(bytes).unwrap_or(u32::MAX);
        let end = match self.lineages[..n].iter().position(|&l| l == lineage) {
            Some(i) => i,
            None if n < MAX_LINEAGES => {
                self.len += 1;
                n
            }
            None => MAX_LINEAGES - 1,
        };
        self.lineages[..=end].rotate_right(1);
        self.sizes[..=end].rotate_right(1);
        self.lineages[0] = lineage;
        self.sizes[0] = size;
    }

    fn touch(&mut self, now: Instant) {
        self.last_seen = self.last_seen.max(now);
    }

    fn expired(&self, now: Instant, ttl: Duration) -> bool {
        now.saturating_duration_since(self.last_seen) > ttl
    }
}

/// Bounded table of session bindings (LRU beyond capacity, idle expiry after the TTL).
///
/// The LRU order is "last committed": `place` does not promote (it only peeks), `commit` promotes and refreshes
/// `last_seen`, so with a non-decreasing `now` the LRU end is also the longest idle binding and [`Self::expire`]
/// stops at the first live one (cost proportional to what it drops, not to the table).
pub struct SessionTable {
    map: LruCache<u64, Binding>,
    ttl: Duration,
    ttl_evictions: u64,
    capacity_evictions: u64,
}

impl SessionTable {
    /// A table holding at most `max_sessions` bindings (0 is treated as 1) that expire after `ttl` idle. Memory
    /// grows with use; nothing is preallocated.
    pub fn new(max_sessions: usize, ttl: Duration) -> Self {
        let cap = NonZeroUsize::new(max_sessions).unwrap_or(NonZeroUsize::MIN);
        SessionTable {
            map: LruCache::sparse(cap),
            ttl,
            ttl_evictions: 0,
            capacity_evictions: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// The live binding for `key`, dropping (and counting) it if it has been idle longer than the TTL.
    fn live(&mut self, key: u64, now: Instant) -> Option<Binding> {
        let b = *self.map.peek(&key)?;
        if b.expired(now, self.ttl) {
            self.map.pop(&key);
            self.ttl_evictions += 1;
            return None;
        }
        Some(b)
    }

    /// Place one session request (policy load_aware, request carries the session header).
    /// `cands[i]` describes endpoint `ids[i]` (stable endpoint ids; a binding whose id is not in `ids` is "gone").
    /// Returns `None` when no candidate is eligible. Changes no state the next `place` sees, except dropping an
    /// expired binding: sizes and bindings are written only by [`Self::commit`].
    pub fn place(
        &mut self,
        req: &SessionRequest,
        cands: &[Candidate],
        ids: &[u64],
        now: Instant,
        rng: &mut fastrand::Rng,
    ) -> Option<SessionPlacement> {
        debug_assert_eq!(cands.len(), ids.len(), "one id per candidate");
        let n = cands.len().min(ids.len());
        let (cands, ids) = (&cands[..n], &ids[..n]);
        let key = session_key(req.key);
        let whole = req.body_bytes;
        let out =
            |index: usize, reason: Reason, estimate_bytes: u64, kind: CommitKind, endpoint: u64| {
                Some(SessionPlacement {
                    index,
                    reason,
                    estimate_bytes,
                    commit: SessionCommit {
                        key,
                        lineage: req.lineage,
                        endpoint,
                        body_bytes: whole,
                        kind,
                    },
                })
            };

        let Some(binding) = self.live(key, now) else {
            let i = pick(cands, rng, |_, _| true)?;
            return out(i, Reason::NewSession, whole, CommitKind::Bind, ids[i]);
        };
        let bound = ids
            .iter()
            .position(|&id| id == binding.endpoint)
            .filter(|&i| cands[i].eligible);
        let Some(b) = bound else {
            let i = pick(cands, rng, |_, _| true)?;
            return out(i, Reason::Fallback, whole, CommitKind::Bind, ids[i]);
        };
        let bc = &cands[b];

        if bc.has_queue() {
            // Tokens choose the target; the pressure rule compares requests against that target only.
            if let Some(t) = pick(cands, rng, |i, c| i != b && !c.kv_full()) {
                if cands[t].request_load().saturating_add(MIGRATE_MIN_GAP) <= bc.request_load() {
                    return out(t, Reason::Migrate, whole, CommitKind::Bind, ids[t]);
                }
            }
        }

        if bc.at_limit() {
            let spill = pick(cands, rng, |i, c| i != b && !c.at_limit() && !c.kv_full())
                .or_else(|| pick(cands, rng, |i, c| i != b && !c.at_limit()));
            if let Some(t) = spill {
                return out(t, Reason::Spill, whole, CommitKind::Spill, binding.endpoint);
            }
        }

        let estimate = match binding.size_of(req.lineage) {
            Some(last) if whole >= last => whole - last,
            _ => whole,
        };

        if bc.prefill_tokens >= BACKLOG_SPILL_MIN_TOKENS && req.bytes_per_token > 0.0 {
            let tokens = |bytes: u64| (bytes as f64 / req.bytes_per_token) as u64;
            let wait_bound = bc.prefill_tokens.saturating_add(tokens(estimate));
            if let Some(t) = pick(cands, rng, |i, c| i != b && !c.at_limit() && !c.kv_full()) {
                let wait_target = cands[t].prefill_tokens.saturating_add(tokens(whole));
                if wait_target.saturating_mul(BACKLOG_SPILL_RATIO) <= wait_bound {
                    return out(t, Reason::Spill, whole, CommitKind::Spill, binding.endpoint);
                }
            }
        }

        out(
            b,
            Reason::Sticky,
            estimate,
            CommitKind::Sticky,
            binding.endpoint,
        )
    }

    /// After the request was SERVED (response headers < 500 received), record the new size / binding. A failed
    /// dispatch never calls this.
    ///
    /// * Bind (NewSession, Fallback, Migrate): the session is bound to the serving endpoint with this lineage at
    ///   this size; other lineages are dropped when the endpoint changes.
    /// * Sticky: the lineage size is recorded if the binding still names the serving endpoint; if the binding has
    ///   moved meanwhile (a concurrent turn migrated it) only "last seen" is refreshed; if it was dropped, it is
    ///   recreated on the serving endpoint.
    /// * Spill: only "last seen" is refreshed; binding and sizes stay as they were.
    pub fn commit(&mut self, c: &SessionCommit, now: Instant) {
        if let Some(b) = self.map.get_mut(&c.key) {
            b.touch(now);
            match c.kind {
                CommitKind::Spill => {}
                CommitKind::Sticky if b.endpoint != c.endpoint => {}
                CommitKind::Sticky => b.record(c.lineage, c.body_bytes),
                CommitKind::Bind => {
                    if b.endpoint != c.endpoint {
                        *b = Binding::new(c.endpoint, b.last_seen);
                    }
                    b.record(c.lineage, c.body_bytes);
                }
            }
            return;
        }
        if c.kind == CommitKind::Spill {
            return;
        }
        let mut b = Binding::new(c.endpoint, now);
        b.record(c.lineage, c.body_bytes);
        if self.map.len() == self.map.cap().get() {
            // Prefer dropping bindings that are already idle past the TTL over evicting a live one.
            self.expire(now);
        }
        if self.map.push(c.key, b).is_some() {
            self.capacity_evictions += 1;
        }
    }

    /// Drop bindings idle longer than the TTL; returns how many.
    pub fn expire(&mut self, now: Instant) -> usize {
        let mut dropped = 0;
        while self
            .map
            .peek_lru()
            .is_some_and(|(_, b)| b.expired(now, self.ttl))
        {
            self.map.pop_lru();
            dropped += 1;
        }
        self.ttl_evictions += dropped as u64;
        dropped
    }

    /// Evictions since the last call: (ttl, capacity). The proxy exports them as
    /// infergate_session_evictions_total{cause}.
    pub fn take_evictions(&mut self) -> (u64, u64) {
        let out = (self.ttl_evictions, self.capacity_evictions);
        self.ttl_evictions = 0;
        self.capacity_evictions = 0;
        out
    }

    /// Approximate heap bytes per binding (for the BENCHMARKS memory figure).
    ///
    /// `lru::LruCache<u64, Binding>` keeps one boxed node per entry plus one hash-map bucket pointing at it:
    ///
    /// * node = key (8) + `Binding` (80) + prev/next pointers (2 × 8) = 104 bytes, plus the allocator's 8-byte
    ///   header rounded up to 16-byte chunks (glibc malloc) → 112 bytes;
    /// * bucket = `KeyRef` pointer + node pointer (2 × 8) + 1 control byte = 17 bytes, times 16/7 for the worst
    ///   case of hashbrown's 7/8 load factor right after a power-of-two growth → 39 bytes.
    ///
    /// Total 151 bytes on 64-bit Linux: 100k sessions ≈ 15 MB.
    pub fn approx_bytes_per_session() -> usize {
        use std::mem::size_of;
        let word = size_of::<usize>();
        let node = size_of::<u64>() + size_of::<Binding>() + 2 * word;
        let node_heap = (node + word).div_ceil(16) * 16;
        let bucket = 2 * word + 1;
        let bucket_worst = (bucket * 16).div_ceil(7);
        node_heap + bucket_worst
    }
}

/// `load_aware` restricted to eligible candidates that also satisfy `allow`: minimum score, exact ties uniformly
/// at random (the same rule and reservoir sampling as [`super::load_aware`]).
fn pick(
    cands: &[Candidate],
    rng: &mut fastrand::Rng,
    allow: impl Fn(usize, &Candidate) -> bool,
) -> Option<usize> {
    let ok = |i: usize, c: &Candidate| c.eligible && allow(i, c);
    let min = cands
        .iter()
        .enumerate()
        .filter(|&(i, c)| ok(i, c))
        .map(|(_, c)| c.score())
        .min()?;
    let mut chosen = None;
    let mut seen = 0u32;
    for (i, c) in cands.iter().enumerate() {
        if ok(i, c) && c.score() == min {
            seen += 1;
            if rng.u32(0..seen) == 0 {
                chosen = Some(i);
            }
        }
    }
    chosen
}

#[cfg(test)]
mod tests {
    use super::super::EngineLoad;
    use super::*;

    const TTL: Duration = Duration::from_secs(3600);
    const LIN_A: u64 = 0xA;
    const LIN_B: u64 = 0xB;

    fn cand(requests: u64, prefill: u64) -> Candidate {
        Candidate {
            eligible: true,
            requests,
            prefill_tokens: prefill,
            ..Default::default()
        }
    }

    /// A candidate whose fresh engine stats show a queue (has_queue): `load - 1` running + 1 waiting, so its
    /// request_load() is `load`.
    fn queued(load: u64) -> Candidate {
        Candidate {
            engine: Some(EngineLoad {
                running: load - 1,
                waiting: 1,
                kv_usage: 0.5,
            }),
            ..cand(load, 0)
        }
    }

    fn kv_full(mut c: Candidate) -> Candidate {
        c.engine = Some(EngineLoad {
            running: c.requests,
            waiting: 0,
            kv_usage: 0.99,
        });
        c
    }

    fn at_limit(requests: u64) -> Candidate {
        Candidate {
            max_in_flight: Some(requests),
            ..cand(requests, 0)
        }
    }

    fn req(key: &[u8], lineage: u64, body: u64) -> SessionRequest<'_> {
        SessionRequest {
            key,
            lineage,
            body_bytes: body,
            bytes_per_token: 4.0,
        }
    }

    struct Fixture {
        table: SessionTable,
        rng: fastrand::Rng,
        t0: Instant,
    }

    impl Fixture {
        fn new() -> Self {
            Fixture {
                table: SessionTable::new(1000, TTL),
                rng: fastrand::Rng::with_seed(7),
                t0: Instant::now(),
            }
        }

        fn place(
            &mut self,
            r: &SessionRequest,
            cands: &[Candidate],
            ids: &[u64],
        ) -> SessionPlacement {
            self.table
                .place(r, cands, ids, self.t0, &mut self.rng)
                .expect("an eligible candidate")
        }

        /// Place and commit (the request was served); returns the placement.
        fn serve(
            &mut self,
            r: &SessionRequest,
            cands: &[Candidate],
            ids: &[u64],
        ) -> SessionPlacement {
            let p = self.place(r, cands, ids);
            self.table.commit(&p.commit, self.t0);
            p
        }

        /// Bind `key` to `ids[index]` with lineage `lineage` at `body` bytes.
        fn bind(&mut self, key: &[u8], lineage: u64, body: u64, ids: &[u64], index: usize) {
            let mut cands = vec![cand(5, 0); ids.len()];
            cands[index] = cand(0, 0);
            let p = self.serve(&req(key, lineage, body), &cands, ids);
            assert_eq!((p.index, p.reason), (index, Reason::NewSession));
        }
    }

    const IDS: [u64; 3] = [100, 200, 300];

    #[test]
    fn new_session_avoids_endpoint_mid_long_prefill_and_counts_whole_body() {
        let mut f = Fixture::new();
        let cands = [cand(2, 140_000), cand(2, 0)];
        for k in 0..50u32 {
            let key = k.to_le_bytes();
            let p = f.place(&req(&key, LIN_A, 9_000), &cands, &IDS[..2]);
            assert_eq!(
                (p.index, p.reason, p.estimate_bytes),
                (1, Reason::NewSession, 9_000)
            );
        }
        let p = f.serve(&req(b"s", LIN_A, 9_000), &cands, &IDS[..2]);
        assert_eq!(p.commit.endpoint(), 200);
        assert_eq!(f.table.len(), 1);
        // Bound: the next turn is sticky even though the other endpoint is now idle.
        let p = f.place(
            &req(b"s", LIN_A, 9_500),
            &[cand(0, 0), cand(3, 0)],
            &IDS[..2],
        );
        assert_eq!(
            (p.index, p.reason, p.estimate_bytes),
            (1, Reason::Sticky, 500)
        );
    }

    #[test]
    fn growth_only_estimates_across_sticky_turns() {
        let mut f = Fixture::new();
        f.bind(b"s", LIN_A, 1_000, &IDS, 0);
        let cands = [cand(1, 0), cand(0, 0), cand(0, 0)];
        for (body, growth) in [(1_500, 500), (2_300, 800), (2_300, 0), (10_000, 7_700)] {
            let p = f.serve(&req(b"s", LIN_A, body), &cands, &IDS);
            assert_eq!(
                (p.index, p.reason, p.estimate_bytes),
                (0, Reason::Sticky, growth)
            );
        }
    }

    #[test]
    fn compacted_conversation_counts_the_whole_body_then_grows_from_it() {
        let mut f = Fixture::new();
        f.bind(b"s", LIN_A, 50_000, &IDS, 0);
        let cands = [cand(0, 0); 3];
        let p = f.serve(&req(b"s", LIN_A, 8_000), &cands, &IDS);
        assert_eq!(
            (p.index, p.reason, p.estimate_bytes),
            (0, Reason::Sticky, 8_000)
        );
        let p = f.serve(&req(b"s", LIN_A, 8_600), &cands, &IDS);
        assert_eq!((p.reason, p.estimate_bytes), (Reason::Sticky, 600));
    }

    #[test]
    fn a_lineage_new_to_the_session_counts_the_whole_body() {
        let mut f = Fixture::new();
        f.bind(b"s", LIN_A, 5_000, &IDS, 0);
        let cands = [cand(0, 0); 3];
        let p = f.serve(&req(b"s", LIN_B, 7_000), &cands, &IDS);
        assert_eq!(
            (p.index, p.reason, p.estimate_bytes),
            (0, Reason::Sticky, 7_000)
        );
        let p = f.place(&req(b"s", LIN_B, 7_100), &cands, &IDS);
        assert_eq!(p.estimate_bytes, 100, "recorded at commit");
    }

    #[test]
    fn spill_avoids_the_endpoint_mid_long_prefill_and_keeps_binding_and_size() {
        let mut f = Fixture::new();
        f.bind(b"s", LIN_A, 1_000, &IDS, 0);
        // Bound endpoint at its hard limit (4/4) but the gap to the others is 2 < 4: no migration, a spill.
        let busy = [at_limit(4), cand(2, 140_000), cand(2, 0)];
        for _ in 0..20 {
            let p = f.place(&req(b"s", LIN_A, 1_500), &busy, &IDS);
            assert_eq!(
                (p.index, p.reason, p.estimate_bytes),
                (2, Reason::Spill, 1_500)
            );
        }
        let p = f.serve(&req(b"s", LIN_A, 1_500), &busy, &IDS);
        assert_eq!(p.reason, Reason::Spill);
        // The binding did not move and the spilled turn did not advance the size: the bound endpoint last served
        // 1,000 bytes, so the next sticky turn counts the growth since then.
        let calm = [cand(0, 0), cand(0, 0), cand(0, 0)];
        let p = f.serve(&req(b"s", LIN_A, 2_000), &calm, &IDS);
        assert_eq!(
            (p.index, p.reason, p.estimate_bytes),
            (0, Reason::Sticky, 1_000)
        );
        let p = f.place(&req(b"s", LIN_A, 2_400), &calm, &IDS);
        assert_eq!(
            (p.index, p.reason, p.estimate_bytes),
            (0, Reason::Sticky, 400)
        );
    }

    #[test]
    fn spill_prefers_endpoints_not_kv_full_and_not_at_limit() {
        let mut f = Fixture::new();
        f.bind(b"s", LIN_A, 1_000, &IDS, 0);
        // The least loaded other is kv-full: spill to the one that is not.
        let cands = [at_limit(4), kv_full(cand(1, 0)), cand(2, 0)];
        let p = f.place(&req(b"s", LIN_A, 1_500), &cands, &IDS);
        assert_eq!((p.index, p.reason), (2, Reason::Spill));
        // Kv-full is the last resort when it is the only other endpoint under its limit.
        let cands = [at_limit(4), kv_full(cand(2, 0)), at_limit(3)];
        let p = f.place(&req(b"s", LIN_A, 1_500), &cands, &IDS);
        assert_eq!((p.index, p.reason), (1, Reason::Spill));
    }

    #[test]
    fn spill_with_no_other_eligible_endpoint_stays_sticky() {
        let mut f = Fixture::new();
        f.bind(b"s", LIN_A, 1_000, &IDS, 0);
        let mut cands = [at_limit(4), cand(0, 0), at_limit(2)];
        cands[1].eligible = false;
        let p = f.place(&req(b"s", LIN_A, 1_300), &cands, &IDS);
        assert_eq!(
            (p.index, p.reason, p.estimate_bytes),
            (0, Reason::Sticky, 300)
        );
        let p = f.place(&req(b"s", LIN_A, 1_300), &cands[..1], &IDS[..1]);
        assert_eq!(
            (p.index, p.reason, p.estimate_bytes),
            (0, Reason::Sticky, 300)
        );
    }

    #[test]
    fn migration_target_avoids_the_endpoint_mid_long_prefill() {
        let mut f = Fixture::new();
        f.bind(b"s", LIN_A, 1_000, &IDS, 0);
        let cands = [queued(8), cand(2, 140_000), cand(2, 0)];
        for _ in 0..20 {
            let p = f.place(&req(b"s", LIN_A, 1_500), &cands, &IDS);
            assert_eq!(
                (p.index, p.reason, p.estimate_bytes),
                (2, Reason::Migrate, 1_500)
            );
        }
        let p = f.serve(&req(b"s", LIN_A, 1_500), &cands, &IDS);
        assert_eq!(p.commit.endpoint(), 300);
        // Rebound: the next calm turn sticks to the new endpoint and counts only growth.
        let calm = [cand(0, 0), cand(0, 0), cand(1, 0)];
        let p = f.place(&req(b"s", LIN_A, 1_800), &calm, &IDS);
        assert_eq!(
            (p.index, p.reason, p.estimate_bytes),
            (2, Reason::Sticky, 300)
        );
    }

    #[test]
    fn a_short_conversation_spills_around_a_long_cold_prefill_and_keeps_its_binding() {
        let mut f = Fixture::new();
        f.bind(b"s", LIN_A, 1_000, &IDS, 0);
        // 250k tokens queued ahead on the bound endpoint; recomputing 300 tokens elsewhere is far cheaper.
        let jammed = [cand(1, 250_000), cand(1, 0), cand(2, 0)];
        let p = f.serve(&req(b"s", LIN_A, 1_200), &jammed, &IDS);
        assert_eq!(
            (p.index, p.reason, p.estimate_bytes),
            (1, Reason::Spill, 1_200)
        );
        // Below the backlog threshold, or with a target that is not 4x faster, it stays.
        let mild = [
            cand(1, BACKLOG_SPILL_MIN_TOKENS - 1),
            cand(1, 0),
            cand(2, 0),
        ];
        assert_eq!(
            f.place(&req(b"s", LIN_A, 1_200), &mild, &IDS).reason,
            Reason::Sticky
        );
        let busy_target = [cand(1, 20_000), cand(1, 4_800), cand(1, 4_800)];
        assert_eq!(
            f.place(&req(b"s", LIN_A, 1_200), &busy_target, &IDS).reason,
            Reason::Sticky
        );
        // The binding never moved and the spill did not advance the size: the next turn is sticky, growth only.
        let calm = [cand(1, 0), cand(1, 0), cand(1, 0)];
        let p = f.place(&req(b"s", LIN_A, 1_500), &calm, &IDS);
        assert_eq!(
            (p.index, p.reason, p.estimate_bytes),
            (0, Reason::Sticky, 500)
        );
    }

    #[test]
    fn tokens_choose_the_target_and_the_gap_is_measured_against_it() {
        let mut f = Fixture::new();
        f.bind(b"s", LIN_A, 1_000, &IDS, 0);
        // Index 1 has 5 fewer requests but a 140k cold prefill; the load_aware target is index 2, only 3 fewer.
        let cands = [queued(6), cand(1, 140_000), cand(3, 0)];
        let p = f.place(&req(b"s", LIN_A, 1_500), &cands, &IDS);
        assert_eq!(
            (p.index, p.reason, p.estimate_bytes),
            (0, Reason::Sticky, 500)
        );
    }

    #[test]
    fn tokens_alone_never_move_a_session() {
        let mut f = Fixture::new();
        f.bind(b"s", LIN_A, 400_000, &IDS, 0);
        // Bound endpoint deep in prefill and busier, but no queue and no limit: a long conversation stays (moving
        // it would recompute 100k tokens elsewhere).
        let cands = [cand(6, 250_000), cand(0, 0), cand(0, 0)];
        let p = f.place(&req(b"s", LIN_A, 400_800), &cands, &IDS);
        assert_eq!(
            (p.index, p.reason, p.estimate_bytes),
            (0, Reason::Sticky, 800)
        );
        // Queue, but the prefill gap is the only difference (equal requests): stay.
        let cands = [
            Candidate {
                prefill_tokens: 250_000,
                ..queued(3)
            },
            cand(3, 0),
            cand(3, 0),
        ];
        let p = f.place(&req(b"s", LIN_A, 401_200), &cands, &IDS);
        assert_eq!((p.index, p.reason), (0, Reason::Sticky));
    }

    #[test]
    fn a_queue_with_gap_3_does_not_move_gap_4_does() {
        let mut f = Fixture::new();
        f.bind(b"s", LIN_A, 1_000, &IDS, 0);
        let p = f.place(
            &req(b"s", LIN_A, 1_200),
            &[queued(7), cand(4, 0), cand(5, 0)],
            &IDS,
        );
        assert_eq!(
            (p.index, p.reason, p.estimate_bytes),
            (0, Reason::Sticky, 200)
        );
        let p = f.place(
            &req(b"s", LIN_A, 1_200),
            &[queued(7), cand(3, 0), cand(5, 0)],
            &IDS,
        );
        assert_eq!(
            (p.index, p.reason, p.estimate_bytes),
            (1, Reason::Migrate, 1_200)
        );
        // Our own in-flight limit counts as a queue too.
        let p = f.place(
            &req(b"s", LIN_A, 1_200),
            &[at_limit(7), cand(3, 0), cand(5, 0)],
            &IDS,
        );
        assert_eq!((p.index, p.reason), (1, Reason::Migrate));
        // Without a queue, even a gap of 7 does not move it.
        let p = f.place(
            &req(b"s", LIN_A, 1_200),
            &[cand(7, 0), cand(0, 0), cand(5, 0)],
            &IDS,
        );
        assert_eq!((p.index, p.reason), (0, Reason::Sticky));
    }

    #[test]
    fn a_kv_full_target_is_no_migration_target() {
        let mut f = Fixture::new();
        f.bind(b"s", LIN_A, 1_000, &IDS, 0);
        // The only endpoint 4+ requests lighter is kv-full; the best other target is only 2 lighter: stay.
        let cands = [queued(8), kv_full(cand(0, 0)), cand(6, 0)];
        let p = f.place(&req(b"s", LIN_A, 1_200), &cands, &IDS);
        assert_eq!(
            (p.index, p.reason, p.estimate_bytes),
            (0, Reason::Sticky, 200)
        );
        // The only other endpoint is kv-full: stay.
        let p = f.place(&req(b"s", LIN_A, 1_200), &cands[..2], &IDS[..2]);
        assert_eq!((p.index, p.reason), (0, Reason::Sticky));
    }

    #[test]
    fn fallback_when_the_bound_endpoint_goes_ineligible() {
        let mut f = Fixture::new();
        f.bind(b"s", LIN_A, 1_000, &IDS, 0);
        let mut cands = [cand(0, 0), cand(2, 140_000), cand(2, 0)];
        cands[0].eligible = false;
        let p = f.serve(&req(b"s", LIN_A, 1_500), &cands, &IDS);
        assert_eq!(
            (p.index, p.reason, p.estimate_bytes),
            (2, Reason::Fallback, 1_500)
        );
        // Rebound to 300: sticky there even when 100 is back.
        let calm = [cand(0, 0), cand(0, 0), cand(1, 0)];
        let p = f.place(&req(b"s", LIN_A, 1_700), &calm, &IDS);
        assert_eq!(
            (p.index, p.reason, p.estimate_bytes),
            (2, Reason::Sticky, 200)
        );
    }

    #[test]
    fn fallback_when_the_bound_endpoint_id_disappears() {
        let mut f = Fixture::new();
        f.bind(b"s", LIN_A, 1_000, &IDS, 1);
        // Endpoint 200 departed; 400 joined at the same index.
        let ids = [100, 400, 300];
        let cands = [cand(1, 0), cand(0, 0), cand(1, 0)];
        let p = f.serve(&req(b"s", LIN_A, 1_500), &cands, &ids);
        assert_eq!(
            (p.index, p.reason, p.estimate_bytes),
            (1, Reason::Fallback, 1_500)
        );
        assert_eq!(p.commit.endpoint(), 400);
        let p = f.place(&req(b"s", LIN_A, 1_600), &cands, &ids);
        assert_eq!(
            (p.index, p.reason, p.estimate_bytes),
            (1, Reason::Sticky, 100)
        );
    }

    #[test]
    fn no_eligible_candidate_places_nothing() {
        let mut f = Fixture::new();
        let mut cands = [cand(0, 0), cand(0, 0)];
        cands.iter_mut().for_each(|c| c.eligible = false);
        let r = req(b"new", LIN_A, 10);
        assert!(f
            .table
            .place(&r, &cands, &IDS[..2], f.t0, &mut f.rng)
            .is_none());
        f.bind(b"s", LIN_A, 10, &IDS[..2], 0);
        let r = req(b"s", LIN_A, 20);
        assert!(f
            .table
            .place(&r, &cands, &IDS[..2], f.t0, &mut f.rng)
            .is_none());
        assert!(f.table.place(&r, &[], &[], f.t0, &mut f.rng).is_none());
    }

    #[test]
    fn sub_agents_sharing_a_header_each_get_growth_only_estimates() {
        let mut f = Fixture::new();
        let lead = lineage_of(b"You are the lead agent. Plan the work.");
        let sub = lineage_of(b"You are a code search sub-agent.");
        assert_ne!(lead, sub);
        f.bind(b"s", lead, 20_000, &IDS, 0);
        let cands = [cand(1, 0), cand(0, 0), cand(0, 0)];
        let turns = [
            (sub, 3_000, 3_000), // first sub-agent turn: whole body
            (lead, 21_000, 1_000),
            (sub, 3_500, 500),
            (lead, 22_000, 1_000),
            (sub, 4_200, 700),
        ];
        for (lineage, body, estimate) in turns {
            let p = f.serve(&req(b"s", lineage, body), &cands, &IDS);
            assert_eq!(
                (p.index, p.reason, p.estimate_bytes),
                (0, Reason::Sticky, estimate)
            );
        }
    }

    #[test]
    fn lineages_beyond_four_drop_the_least_recently_used() {
        let mut f = Fixture::new();
        f.bind(b"s", 1, 1_000, &IDS, 0);
        let cands = [cand(0, 0); 3];
        for lineage in 2..=4 {
            f.serve(&req(b"s", lineage, 1_000), &cands, &IDS);
        }
        // Touch lineage 1 so lineage 2 is the least recently used, then add a fifth.
        assert_eq!(
            f.serve(&req(b"s", 1, 1_100), &cands, &IDS).estimate_bytes,
            100
        );
        assert_eq!(
            f.serve(&req(b"s", 5, 1_000), &cands, &IDS).estimate_bytes,
            1_000
        );
        assert_eq!(
            f.place(&req(b"s", 2, 1_100), &cands, &IDS).estimate_bytes,
            1_100,
            "dropped"
        );
        for lineage in [1, 3, 4, 5] {
            let last = if lineage == 1 { 1_100 } else { 1_000 };
            let p = f.place(&req(b"s", lineage, 1_200), &cands, &IDS);
            assert_eq!(p.estimate_bytes, 1_200 - last, "lineage {lineage} kept");
        }
    }

    #[test]
    fn rebinding_elsewhere_forgets_the_other_lineages() {
        let mut f = Fixture::new();
        f.bind(b"s", LIN_A, 1_000, &IDS, 0);
        f.serve(&req(b"s", LIN_B, 2_000), &[cand(0, 0); 3], &IDS);
        let p = f.serve(
            &req(b"s", LIN_A, 1_500),
            &[queued(8), cand(1, 0), cand(5, 0)],
            &IDS,
        );
        assert_eq!((p.index, p.reason), (1, Reason::Migrate));
        let calm = [cand(0, 0); 3];
        let p = f.place(&req(b"s", LIN_B, 2_100), &calm, &IDS);
        assert_eq!(
            (p.index, p.reason, p.estimate_bytes),
            (1, Reason::Sticky, 2_100)
        );
        let p = f.place(&req(b"s", LIN_A, 1_600), &calm, &IDS);
        assert_eq!(
            (p.index, p.reason, p.estimate_bytes),
            (1, Reason::Sticky, 100)
        );
    }

    #[test]
    fn a_failed_dispatch_does_not_advance_the_size() {
        let mut f = Fixture::new();
        f.bind(b"s", LIN_A, 1_000, &IDS, 0);
        let cands = [cand(0, 0); 3];
        // Dispatch of the 1,800-byte turn fails (no commit); the client retries the same turn, then a longer one.
        let p = f.place(&req(b"s", LIN_A, 1_800), &cands, &IDS);
        assert_eq!((p.reason, p.estimate_bytes), (Reason::Sticky, 800));
        let p = f.place(&req(b"s", LIN_A, 1_800), &cands, &IDS);
        assert_eq!((p.reason, p.estimate_bytes), (Reason::Sticky, 800));
        let p = f.place(&req(b"s", LIN_A, 2_000), &cands, &IDS);
        assert_eq!((p.reason, p.estimate_bytes), (Reason::Sticky, 1_000));
        // The proxy's retry excludes the failed endpoint: a fallback, whose commit is the one that counts.
        let mut retry = cands;
        retry[0].eligible = false;
        let p = f.serve(&req(b"s", LIN_A, 2_000), &retry, &IDS);
        assert_eq!((p.reason, p.estimate_bytes), (Reason::Fallback, 2_000));
        let p = f.place(&req(b"s", LIN_A, 2_100), &cands, &IDS);
        assert_eq!(
            (p.index, p.reason, p.estimate_bytes),
            (p.index, Reason::Sticky, 100)
        );
        assert_ne!(p.index, 0);
    }

    #[test]
    fn place_without_commit_changes_no_state_the_next_place_sees() {
        let mut f = Fixture::new();
        // A new session placed but never committed (e.g. count_tokens, or a failed dispatch) leaves no binding.
        let calm = [cand(0, 0), cand(1, 0), cand(1, 0)];
        for _ in 0..3 {
            let p = f.place(&req(b"new", LIN_A, 500), &calm, &IDS);
            assert_eq!(
                (p.index, p.reason, p.estimate_bytes),
                (0, Reason::NewSession, 500)
            );
        }
        assert!(f.table.is_empty());
        // Every kind of placement on a bound session, without commit, leaves the next one unchanged.
        f.bind(b"s", LIN_A, 1_000, &IDS, 0);
        let mut ineligible = [cand(0, 0); 3];
        ineligible[0].eligible = false;
        let situations = [
            [queued(8), cand(1, 0), cand(5, 0)],   // migrate
            [at_limit(4), cand(2, 0), cand(3, 0)], // spill
            ineligible,                            // fallback
            [cand(0, 0), cand(0, 0), cand(0, 0)],  // sticky
            [cand(0, 0), cand(0, 0), cand(0, 0)],  // sticky, new lineage below
        ];
        let expected = [
            Reason::Migrate,
            Reason::Spill,
            Reason::Fallback,
            Reason::Sticky,
            Reason::Sticky,
        ];
        for (k, (cands, reason)) in situations.iter().zip(expected).enumerate() {
            let lineage = if k == 4 { LIN_B } else { LIN_A };
            let p = f.place(&req(b"s", lineage, 1_400), cands, &IDS);
            assert_eq!(p.reason, reason);
        }
        let p = f.place(&req(b"s", LIN_A, 1_400), &calm, &IDS);
        assert_eq!(
            (p.index, p.reason, p.estimate_bytes),
            (0, Reason::Sticky, 400)
        );
        let p = f.place(&req(b"s", LIN_B, 1_400), &calm, &IDS);
        assert_eq!(
            (p.index, p.reason, p.estimate_bytes),
            (0, Reason::Sticky, 1_400)
        );
        assert_eq!(f.table.len(), 1);
        assert_eq!(f.table.take_evictions(), (0, 0));
    }

    #[test]
    fn a_stale_sticky_commit_does_not_undo_a_migration() {
        let mut f = Fixture::new();
        f.bind(b"s", LIN_A, 1_000, &IDS, 0);
        // Turn A placed sticky on 100; meanwhile turn B migrates to 200 and commits first.
        let a = f.place(&req(b"s", LIN_A, 1_200), &[cand(0, 0); 3], &IDS);
        assert_eq!(a.reason, Reason::Sticky);
        let b = f.serve(
            &req(b"s", LIN_A, 1_300),
            &[queued(8), cand(1, 0), cand(5, 0)],
            &IDS,
        );
        assert_eq!(b.reason, Reason::Migrate);
        f.table.commit(&a.commit, f.t0);
        let p = f.place(&req(b"s", LIN_A, 1_400), &[cand(0, 0); 3], &IDS);
        assert_eq!(
            (p.index, p.reason, p.estimate_bytes),
            (1, Reason::Sticky, 100)
        );
    }

    #[test]
    fn lru_capacity_eviction_is_counted() {
        let mut f = Fixture::new();
        f.table = SessionTable::new(2, TTL);
        f.bind(b"s1", LIN_A, 100, &IDS, 0);
        f.bind(b"s2", LIN_A, 100, &IDS, 1);
        // Committing s1 again makes s2 the least recently used.
        f.serve(&req(b"s1", LIN_A, 200), &[cand(0, 0); 3], &IDS);
        assert_eq!(f.table.take_evictions(), (0, 0));
        f.bind(b"s3", LIN_A, 100, &IDS, 2);
        assert_eq!(f.table.len(), 2);
        assert_eq!(f.table.take_evictions(), (0, 1));
        assert_eq!(f.table.take_evictions(), (0, 0), "taken once");
        let calm = [cand(0, 0); 3];
        assert_eq!(
            f.place(&req(b"s2", LIN_A, 200), &calm, &IDS).reason,
            Reason::NewSession
        );
        assert_eq!(
            f.place(&req(b"s1", LIN_A, 300), &calm, &IDS).reason,
            Reason::Sticky
        );
        assert_eq!(
            f.place(&req(b"s3", LIN_A, 300), &calm, &IDS).reason,
            Reason::Sticky
        );
    }

    #[test]
    fn ttl_expiry_lazily_on_lookup_and_in_expire() {
        let mut f = Fixture::new();
        f.table = SessionTable::new(100, Duration::from_secs(60));
        let t0 = f.t0;
        let calm = [cand(0, 0); 3];
        f.bind(b"s1", LIN_A, 100, &IDS, 0);
        f.bind(b"s2", LIN_A, 100, &IDS, 1);
        let s3 = f.place(&req(b"s3", LIN_A, 100), &calm, &IDS).commit;
        f.table.commit(&s3, t0 + Duration::from_secs(30));
        // Exactly the TTL idle is still live; place does not refresh "last seen".
        let at = |s| t0 + Duration::from_secs(s);
        let p = f
            .table
            .place(&req(b"s1", LIN_A, 150), &calm, &IDS, at(60), &mut f.rng)
            .unwrap();
        assert_eq!(p.reason, Reason::Sticky);
        // Lazily on lookup.
        let p = f
            .table
            .place(&req(b"s1", LIN_A, 150), &calm, &IDS, at(61), &mut f.rng)
            .unwrap();
        assert_eq!((p.reason, p.estimate_bytes), (Reason::NewSession, 150));
        assert_eq!(f.table.take_evictions(), (1, 0));
        assert_eq!(f.table.len(), 2);
        // In expire(): s2 idle 61 s goes, s3 idle 31 s stays.
        assert_eq!(f.table.expire(at(61)), 1);
        assert_eq!(f.table.len(), 1);
        assert_eq!(f.table.expire(at(61)), 0);
        assert_eq!(f.table.expire(at(91)), 1);
        assert!(f.table.is_empty());
        assert_eq!(f.table.take_evictions(), (2, 0));
    }

    #[test]
    fn a_full_table_drops_expired_bindings_before_evicting_live_ones() {
        let mut f = Fixture::new();
        f.table = SessionTable::new(2, Duration::from_secs(60));
        let calm = [cand(0, 0); 3];
        f.bind(b"old", LIN_A, 100, &IDS, 0);
        let live = f.place(&req(b"live", LIN_A, 100), &calm, &IDS).commit;
        f.table.commit(&live, f.t0 + Duration::from_secs(50));
        let new = f.place(&req(b"new", LIN_A, 100), &calm, &IDS).commit;
        f.table.commit(&new, f.t0 + Duration::from_secs(100));
        assert_eq!(f.table.take_evictions(), (1, 0));
        assert_eq!(f.table.len(), 2);
    }

    #[test]
    fn spill_commit_refreshes_last_seen_only() {
        let mut f = Fixture::new();
        f.table = SessionTable::new(100, Duration::from_secs(60));
        f.bind(b"s", LIN_A, 1_000, &IDS, 0);
        let busy = [at_limit(4), cand(2, 0), cand(2, 0)];
        let p = f.place(&req(b"s", LIN_A, 1_500), &busy, &IDS);
        assert_eq!(p.reason, Reason::Spill);
        f.table.commit(&p.commit, f.t0 + Duration::from_secs(50));
        let calm = [cand(0, 0); 3];
        let at = f.t0 + Duration::from_secs(100);
        let p = f
            .table
            .place(&req(b"s", LIN_A, 1_600), &calm, &IDS, at, &mut f.rng)
            .unwrap();
        assert_eq!(
            (p.index, p.reason, p.estimate_bytes),
            (0, Reason::Sticky, 600)
        );
    }

    #[test]
    fn random_ties_spread_new_sessions() {
        let mut f = Fixture::new();
        let cands = [cand(1, 0); 3];
        let mut counts = [0u32; 3];
        for k in 0..3000u32 {
            counts[f
                .place(&req(&k.to_le_bytes(), LIN_A, 1), &cands, &IDS)
                .index] += 1;
        }
        assert!(
            counts.iter().all(|&c| (800..1200).contains(&c)),
            "{counts:?}"
        );
    }

    #[test]
    fn lineage_hashes_the_first_256_bytes_deterministically() {
        let mut a = vec![b'x'; 300];
        let b = a.clone();
        assert_eq!(lineage_of(&a), lineage_of(&b));
        a[299] = b'y';
        assert_eq!(lineage_of(&a), lineage_of(&b), "bytes past 256 are ignored");
        a[255] = b'y';
        assert_ne!(lineage_of(&a), lineage_of(&b));
        // FNV-1a 64 reference values.
        assert_eq!(lineage_of(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(lineage_of(b"a"), 0xaf63_dc4c_8601_ec8c);
    }

    #[test]
    fn memory_for_100k_sessions_is_well_under_50_mb() {
        let per = SessionTable::approx_bytes_per_session();
        assert!(per < 200, "{per} bytes per session");
        println!("approx_bytes_per_session = {per}");
        assert!(per * 100_000 < 50 << 20);
        let mut table = SessionTable::new(100_000, TTL);
        let t0 = Instant::now();
        for k in 0..100_000u64 {
            let key = k.to_le_bytes();
            let c = SessionCommit {
                key: session_key(&key),
                lineage: k,
                endpoint: k % 8,
                body_bytes: 10_000,
                kind: CommitKind::Bind,
            };
            table.commit(&c, t0);
        }
        assert_eq!(table.len(), 100_000);
        assert_eq!(table.take_evictions(), (0, 0));
    }
}
