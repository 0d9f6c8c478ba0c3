//! Session placement decisions: new session, sticky growth, spill, migrate, fallback, random ties.

use super::*;

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
