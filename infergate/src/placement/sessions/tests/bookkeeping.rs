//! Session table bookkeeping: lineages, commits, TTL expiry, LRU eviction, the lineage hash, memory.

use super::*;

#[test]
fn sub_agents_sharing_a_header_each_get_growth_only_estimates() {
    let mut f = Fixture::new();
    let lead = lineage_of(b"You are the lead agent. Plan the work.", 0);
    let sub = lineage_of(b"You are a code search sub-agent.", 0);
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
fn lineage_hashes_the_first_256_bytes_deterministically() {
    let mut a = vec![b'x'; 300];
    let b = a.clone();
    assert_eq!(lineage_of(&a, 0), lineage_of(&b, 0));
    a[299] = b'y';
    assert_eq!(
        lineage_of(&a, 0),
        lineage_of(&b, 0),
        "bytes past 256 are ignored"
    );
    a[255] = b'y';
    assert_ne!(lineage_of(&a, 0), lineage_of(&b, 0));
    // FNV-1a 64 reference values.
    assert_eq!(lineage_of(b"", 0), 0xcbf2_9ce4_8422_2325);
    assert_eq!(lineage_of(b"a", 0), 0xaf63_dc4c_8601_ec8c);
}

#[test]
fn behind_a_long_shared_system_prompt_the_first_message_tells_lineages_apart() {
    let system = vec![b's'; 2000];
    let with = |first: &[u8]| [&system[..], b"\x1e", first].concat();
    let (lead, sub) = (with(b"plan the release"), with(b"search the code for uses"));
    let at = system.len() + 1;
    assert_eq!(
        lineage_of(&lead, 0),
        lineage_of(&sub, 0),
        "the system prompt alone"
    );
    assert_ne!(lineage_of(&lead, at), lineage_of(&sub, at));
    let later_turn = [&lead[..], b"\x1eok\x1enext step"].concat();
    assert_eq!(
        lineage_of(&lead, at),
        lineage_of(&later_turn, at),
        "one conversation"
    );
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
