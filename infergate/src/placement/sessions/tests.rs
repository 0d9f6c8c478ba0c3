//! Unit tests of session bindings: the placement decisions, growth-only estimates and the table's bookkeeping.

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

    fn place(&mut self, r: &SessionRequest, cands: &[Candidate], ids: &[u64]) -> SessionPlacement {
        self.table
            .place(r, cands, ids, self.t0, &mut self.rng)
            .expect("an eligible candidate")
    }

    /// Place and commit (the request was served); returns the placement.
    fn serve(&mut self, r: &SessionRequest, cands: &[Candidate], ids: &[u64]) -> SessionPlacement {
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
