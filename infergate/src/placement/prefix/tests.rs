//! Unit tests of the prefix index and the `prefix_aware` rule: hashing, matching, gate, fallbacks, eviction.

use super::*;
use crate::placement::EngineLoad;

fn cfg(min_match_bytes: usize, fallback: PrefixFallback) -> PrefixConfig {
    PrefixConfig {
        block_bytes: 64,
        min_match_bytes,
        capacity_tokens_per_endpoint: 1_000_000,
        fallback,
    }
}

fn cand(requests: u64) -> Candidate {
    Candidate {
        eligible: true,
        requests,
        ..Default::default()
    }
}

/// A prompt of `blocks` full 64-byte blocks, distinct per `tag`.
fn text(tag: &str, blocks: usize) -> Vec<u8> {
    let mut out = Vec::new();
    let mut i = 0;
    while out.len() < blocks * 64 {
        out.extend_from_slice(format!("{tag}:{i};").as_bytes());
        i += 1;
    }
    out.truncate(blocks * 64);
    out
}

const IDS2: [u64; 2] = [10, 11];
fn now() -> Instant {
    Instant::now()
}

#[test]
fn hashes_are_chained_model_seeded_and_full_blocks_only() {
    let ix = PrefixIndex::new(&cfg(0, PrefixFallback::LeastInflight), 4.0);
    let p = text("a", 3);
    let mut longer = p.clone();
    longer.extend_from_slice(&[b'x'; 63]); // a partial 4th block does not hash
    let h = ix.block_hashes("m", &p);
    assert_eq!(h.len(), 3);
    assert_eq!(ix.block_hashes("m", &longer), h);
    assert_eq!(ix.block_hashes("m", &p), h, "deterministic");
    assert_ne!(ix.block_hashes("other-model", &p), h);
    // The same block content at a different position hashes differently (chain).
    let same = [b'z'; 128];
    let hs = ix.block_hashes("m", &same);
    assert_ne!(hs[0], hs[1]);
    // A different first block changes every later hash.
    let mut q = p.clone();
    q[0] ^= 1;
    let hq = ix.block_hashes("m", &q);
    assert!(h.iter().zip(&hq).all(|(a, b)| a != b));
    assert!(ix.block_hashes("m", &p[..63]).is_empty());
}

#[test]
fn matching_stops_at_the_first_missing_block() {
    let mut ix = PrefixIndex::new(&cfg(0, PrefixFallback::LeastInflight), 4.0);
    let h = ix.block_hashes("m", &text("a", 6));
    ix.insert(10, &h[..4], now());
    ix.insert(11, &h[1..], now()); // lacks block 0: no usable prefix
    assert_eq!(ix.matched_blocks(&h, &[10, 11, 12]), vec![4, 0, 0]);
}

/// The incident of production-stack #1073: a burst of 8 new sessions onto 2 equally sized endpoints that each
/// hold 4 long-running requests. Endpoint 0's requests arrived long ago (1 arrival in the window); endpoint 1
/// serves short requests (12 arrivals). Each placement adds a request (and an arrival) to its endpoint.
fn burst(fallback: PrefixFallback, seed: u64) -> [u32; 2] {
    let mut ix = PrefixIndex::new(&cfg(256, fallback), 4.0);
    let mut rng = fastrand::Rng::with_seed(seed);
    let mut cands = [cand(4), cand(4)];
    let mut arrivals = [1u64, 12];
    let mut counts = [0u32; 2];
    for s in 0..8 {
        let h = ix.block_hashes("m", &text(&format!("session-{s}"), 8));
        let d = ix.place(&h, &cands, &IDS2, &arrivals, &mut rng).unwrap();
        assert_eq!(d.reason, Reason::PrefixMiss);
        cands[d.index].requests += 1;
        arrivals[d.index] += 1;
        counts[d.index] += 1;
        ix.insert(IDS2[d.index], &h, now());
    }
    counts
}

#[test]
fn burst_of_new_sessions_splits_evenly_with_least_inflight_and_skews_with_qps() {
    for seed in 0..200 {
        // The +1 slack absorbs stale engine stats; the live counts then split the burst exactly.
        assert_eq!(
            burst(PrefixFallback::LeastInflight, seed),
            [4, 4],
            "seed {seed}"
        );
    }
    // QPS: the busy endpoint with the low arrival rate takes the whole burst (12 in flight vs 4).
    assert_eq!(burst(PrefixFallback::Qps, 0), [8, 0]);
}

#[test]
fn qps_picks_first_without_arrivals_then_lowest_first_on_ties() {
    let cands = [cand(9), cand(0), cand(0)];
    assert_eq!(qps_pick(&cands, &[3, 0, 0]), Some(1));
    assert_eq!(qps_pick(&cands, &[3, 2, 2]), Some(1));
    assert_eq!(
        qps_pick(&cands, &[1, 2, 2]),
        Some(0),
        "ignores load entirely"
    );
    let mut c = cands;
    c[1].eligible = false;
    assert_eq!(qps_pick(&c, &[3, 0, 5]), Some(0));
    assert_eq!(
        qps_pick(&c, &[]),
        Some(0),
        "no stats at all: first eligible"
    );
}

#[test]
fn ties_are_random_on_miss_and_on_hit() {
    let mut ix = PrefixIndex::new(&cfg(0, PrefixFallback::LeastInflight), 4.0);
    let cands = [cand(2), cand(2)];
    let h = ix.block_hashes("m", &text("a", 4));
    let mut seen = [0u32; 2];
    for seed in 0..100 {
        let d = ix
            .place(
                &h,
                &cands,
                &IDS2,
                &[0, 0],
                &mut fastrand::Rng::with_seed(seed),
            )
            .unwrap();
        assert_eq!(d.reason, Reason::PrefixMiss);
        seen[d.index] += 1;
    }
    assert!(seen.iter().all(|&n| n > 20), "miss: {seen:?}");
    // Both hold the prefix at the same load: random between them.
    ix.insert(10, &h, now());
    ix.insert(11, &h, now());
    let mut seen = [0u32; 2];
    for seed in 0..100 {
        let d = ix
            .place(
                &h,
                &cands,
                &IDS2,
                &[0, 0],
                &mut fastrand::Rng::with_seed(seed),
            )
            .unwrap();
        assert_eq!(d.reason, Reason::PrefixHit);
        seen[d.index] += 1;
    }
    assert!(seen.iter().all(|&n| n > 20), "hit: {seen:?}");
    // Equal match, unequal load: the lower load.
    let d = ix
        .place(
            &h,
            &[cand(3), cand(2)],
            &IDS2,
            &[0, 0],
            &mut fastrand::Rng::with_seed(1),
        )
        .unwrap();
    assert_eq!((d.index, d.reason), (1, Reason::PrefixHit));
}

#[test]
fn stale_stats_fall_back_to_own_counts_never_zero() {
    let mut ix = PrefixIndex::new(&cfg(256, PrefixFallback::LeastInflight), 4.0);
    let h = ix.block_hashes("m", &text("a", 8));
    // Endpoint 0: stats stale/absent (engine None) but 5 of our requests in flight: load 5, not 0.
    // Endpoint 1: 1 of ours, fresh stats show 3 of which 1 ours: load 1 + 2 = 3.
    let mut busy_stale = cand(5);
    busy_stale.engine = None;
    let mut fresh = cand(1);
    fresh.engine = Some(EngineLoad {
        running: 3,
        waiting: 0,
        kv_usage: 0.2,
        own_at_sample: 1,
    });
    for seed in 0..50 {
        let d = ix
            .place(
                &h,
                &[busy_stale, fresh],
                &IDS2,
                &[0, 0],
                &mut fastrand::Rng::with_seed(seed),
            )
            .unwrap();
        assert_eq!((d.index, d.reason), (1, Reason::PrefixMiss));
    }
    // Fresh engine numbers above the stale one's own count: now the stale endpoint is the lighter one.
    fresh.engine = Some(EngineLoad {
        running: 5,
        waiting: 3,
        kv_usage: 0.2,
        own_at_sample: 1,
    });
    let d = ix
        .place(
            &h,
            &[busy_stale, fresh],
            &IDS2,
            &[0, 0],
            &mut fastrand::Rng::with_seed(7),
        )
        .unwrap();
    assert_eq!(d.index, 0);
}

#[test]
fn below_threshold_is_a_miss_even_with_a_partial_match() {
    let mut ix = PrefixIndex::new(&cfg(256, PrefixFallback::LeastInflight), 4.0);
    let h = ix.block_hashes("m", &text("a", 8));
    ix.insert(10, &h[..3], now()); // 192 bytes < 256
    let d = ix
        .place(
            &h,
            &[cand(5), cand(0)],
            &IDS2,
            &[0, 0],
            &mut fastrand::Rng::with_seed(1),
        )
        .unwrap();
    assert_eq!((d.index, d.reason), (1, Reason::PrefixMiss));
    ix.insert(10, &h[..4], now()); // 256 bytes: a hit
    let d = ix
        .place(
            &h,
            &[cand(3), cand(0)],
            &IDS2,
            &[0, 0],
            &mut fastrand::Rng::with_seed(1),
        )
        .unwrap();
    assert_eq!(
        (d.index, d.reason),
        (0, Reason::PrefixHit),
        "3 vs mean 1.5: 3 > 2.25 but not > 3.5"
    );
    // min_match_bytes 0 still needs one block: an empty match is a miss, not a random "hit".
    let mut ix0 = PrefixIndex::new(&cfg(0, PrefixFallback::LeastInflight), 4.0);
    let d = ix0
        .place(
            &h,
            &[cand(5), cand(0)],
            &IDS2,
            &[0, 0],
            &mut fastrand::Rng::with_seed(1),
        )
        .unwrap();
    assert_eq!((d.index, d.reason), (1, Reason::PrefixMiss));
    let d = ix0
        .place(
            &[],
            &[cand(5), cand(0)],
            &IDS2,
            &[0, 0],
            &mut fastrand::Rng::with_seed(1),
        )
        .unwrap();
    assert_eq!((d.index, d.reason), (1, Reason::PrefixMiss));
}

#[test]
fn gate_trips_and_the_insert_replicates_the_prefix() {
    let mut ix = PrefixIndex::new(&cfg(256, PrefixFallback::LeastInflight), 4.0);
    let ids = [10, 11, 12];
    let h = ix.block_hashes("m", &text("hot", 8));
    ix.insert(10, &h, now());
    // Loads 8, 1, 1: mean 3.33; 8 > 5.0 and 8 > 5.33: hot.
    let cands = [cand(8), cand(1), cand(1)];
    let d = ix
        .place(&h, &cands, &ids, &[0; 3], &mut fastrand::Rng::with_seed(3))
        .unwrap();
    assert_eq!(d.reason, Reason::PrefixGated);
    assert_ne!(d.index, 0);
    // The proxy inserts on the endpoint it actually used: the prefix now lives on both.
    ix.insert(ids[d.index], &h, now());
    let m = ix.matched_blocks(&h, &ids);
    assert_eq!(m[0], 8);
    assert_eq!(m[d.index], 8);
    // Just below the gate (load 5 vs mean 2.33: 5 > 3.5 but not > 4.33): stays a hit.
    let d = ix
        .place(
            &h,
            &[cand(5), cand(1), cand(1)],
            &ids,
            &[0; 3],
            &mut fastrand::Rng::with_seed(3),
        )
        .unwrap();
    assert_eq!(d.reason, Reason::PrefixHit);
    // One eligible endpoint can never be hot relative to itself.
    let mut solo = cands;
    solo[1].eligible = false;
    solo[2].eligible = false;
    let d = ix
        .place(&h, &solo, &ids, &[0; 3], &mut fastrand::Rng::with_seed(3))
        .unwrap();
    assert_eq!((d.index, d.reason), (0, Reason::PrefixHit));
}

#[test]
fn gate_with_qps_fallback_reports_a_hit_if_it_lands_on_the_candidate() {
    let mut ix = PrefixIndex::new(&cfg(0, PrefixFallback::Qps), 4.0);
    let h = ix.block_hashes("m", &text("hot", 4));
    ix.insert(10, &h, now());
    let cands = [cand(9), cand(0)];
    // QPS prefers endpoint 0 (no arrivals): the gate tripped but the request lands on the holder anyway.
    let d = ix
        .place(&h, &cands, &IDS2, &[0, 5], &mut fastrand::Rng::with_seed(1))
        .unwrap();
    assert_eq!((d.index, d.reason), (0, Reason::PrefixHit));
    let d = ix
        .place(&h, &cands, &IDS2, &[5, 0], &mut fastrand::Rng::with_seed(1))
        .unwrap();
    assert_eq!((d.index, d.reason), (1, Reason::PrefixGated));
}

#[test]
fn eviction_bounds_memory_and_keeps_prompt_heads() {
    // 100 tokens × 4 bytes / 64 = 6 blocks per endpoint.
    let c = PrefixConfig {
        capacity_tokens_per_endpoint: 100,
        ..cfg(0, PrefixFallback::LeastInflight)
    };
    let mut ix = PrefixIndex::new(&c, 4.0);
    assert_eq!(ix.capacity_blocks(), 6);
    for s in 0..200 {
        let h = ix.block_hashes("m", &text(&format!("s{s}"), 5));
        ix.insert(10, &h, now());
        assert!(ix.blocks_held(10) <= 6);
    }
    // A prompt longer than the capacity keeps its first blocks, which is what matching needs.
    let h = ix.block_hashes("m", &text("long", 50));
    ix.insert(10, &h, now());
    assert_eq!(ix.blocks_held(10), 6);
    assert_eq!(ix.matched_blocks(&h, &[10]), vec![6]);
    // Another prompt evicts the tails of the older one first.
    let g = ix.block_hashes("m", &text("other", 2));
    ix.insert(10, &g, now());
    assert_eq!(ix.matched_blocks(&h, &[10]), vec![4]);
    assert_eq!(ix.matched_blocks(&g, &[10]), vec![2]);
    ix.remove_endpoint(10);
    assert_eq!(ix.blocks_held(10), 0);
    assert_eq!(ix.matched_blocks(&g, &[10]), vec![0]);
    // Capacity is at least one block however small the config.
    let tiny = PrefixConfig {
        capacity_tokens_per_endpoint: 1,
        ..cfg(0, PrefixFallback::LeastInflight)
    };
    assert_eq!(PrefixIndex::new(&tiny, 4.0).capacity_blocks(), 1);
}

/// #957: every session shares a long system prompt. Without a gate the first endpoint to see it would own all
/// traffic; with it, load spreads and the prefix replicates.
#[test]
fn shared_system_prompt_does_not_pin_all_traffic() {
    let mut ix = PrefixIndex::new(&cfg(256, PrefixFallback::LeastInflight), 4.0);
    let mut rng = fastrand::Rng::with_seed(11);
    let system = text("system", 16);
    let mut cands = [cand(0), cand(0)];
    let mut counts = [0u32; 2];
    let mut reasons = Vec::new();
    for s in 0..20 {
        let mut prompt = system.clone();
        prompt.extend_from_slice(&text(&format!("user-{s}"), 2));
        let h = ix.block_hashes("m", &prompt);
        let d = ix.place(&h, &cands, &IDS2, &[0, 0], &mut rng).unwrap();
        cands[d.index].requests += 1; // long-running: nothing completes
        counts[d.index] += 1;
        reasons.push(d.reason);
        ix.insert(IDS2[d.index], &h, now());
    }
    assert!(counts.iter().all(|&n| n >= 8), "{counts:?} {reasons:?}");
    assert!(reasons.contains(&Reason::PrefixGated), "{reasons:?}");
    let sys_h = ix.block_hashes("m", &system);
    assert_eq!(
        ix.matched_blocks(&sys_h, &IDS2),
        vec![16, 16],
        "the hot prefix replicated"
    );
}

/// Multi-turn sessions keep their endpoint while load is even, and leave it when it gets hot (never latched).
#[test]
fn sessions_keep_affinity_under_even_load_but_are_not_latched() {
    let mut ix = PrefixIndex::new(&cfg(256, PrefixFallback::LeastInflight), 4.0);
    let mut rng = fastrand::Rng::with_seed(5);
    let mut conv = [text("sys", 8), text("sys", 8)];
    // Turn 1 of each session lands on a different endpoint.
    conv[0].extend_from_slice(&text("alice", 4));
    conv[1].extend_from_slice(&text("bob", 4));
    ix.insert(10, &ix.block_hashes("m", &conv[0]), now());
    ix.insert(11, &ix.block_hashes("m", &conv[1]), now());
    let even = [cand(3), cand(3)];
    for turn in 0..10 {
        for (s, home) in [(0, 0usize), (1, 1)] {
            conv[s].extend_from_slice(&text(&format!("turn{turn}-{s}"), 3));
            let h = ix.block_hashes("m", &conv[s]);
            let d = ix.place(&h, &even, &IDS2, &[0, 0], &mut rng).unwrap();
            assert_eq!(
                (d.index, d.reason),
                (home, Reason::PrefixHit),
                "session {s} turn {turn}"
            );
            ix.insert(IDS2[d.index], &h, now());
        }
    }
    // Alice's endpoint gets hot: her next turn is re-evaluated and spills, then replicates.
    conv[0].extend_from_slice(&text("late", 3));
    let h = ix.block_hashes("m", &conv[0]);
    let d = ix
        .place(&h, &[cand(9), cand(1)], &IDS2, &[0, 0], &mut rng)
        .unwrap();
    assert_eq!((d.index, d.reason), (1, Reason::PrefixGated));
    ix.insert(IDS2[d.index], &h, now());
    // With load even again both hold her whole conversation: either is a hit.
    let d = ix.place(&h, &even, &IDS2, &[0, 0], &mut rng).unwrap();
    assert_eq!(d.reason, Reason::PrefixHit);
}

#[test]
fn no_eligible_candidate_places_nothing() {
    let mut ix = PrefixIndex::new(&cfg(0, PrefixFallback::Qps), 4.0);
    let mut c = [cand(0), cand(0)];
    c[0].eligible = false;
    c[1].eligible = false;
    assert_eq!(
        ix.place(
            &[1, 2],
            &c,
            &IDS2,
            &[0, 0],
            &mut fastrand::Rng::with_seed(1)
        ),
        None
    );
    // An ineligible holder of the prefix is not a match.
    let h = ix.block_hashes("m", &text("a", 4));
    ix.insert(10, &h, now());
    c[1].eligible = true;
    let d = ix
        .place(&h, &c, &IDS2, &[0, 0], &mut fastrand::Rng::with_seed(1))
        .unwrap();
    assert_eq!((d.index, d.reason), (1, Reason::PrefixMiss));
}

#[test]
fn exact_held_tokens_replace_the_guess_per_candidate() {
    let mut ix = PrefixIndex::new(&cfg(256, PrefixFallback::LeastInflight), 4.0);
    let h = ix.block_hashes("m", &text("a", 8));
    // The guess: endpoint 10 holds all 8 blocks.
    ix.insert(10, &h, now());
    let mut rng = fastrand::Rng::with_seed(1);
    let place = |ix: &mut PrefixIndex, cands: &[Candidate], rng: &mut fastrand::Rng| {
        ix.place(&h, cands, &IDS2, &[0, 0], rng).unwrap()
    };
    let d = place(&mut ix, &[cand(0), cand(0)], &mut rng);
    assert_eq!((d.index, d.reason), (0, Reason::PrefixHit));
    // Its engine's events say it holds nothing; endpoint 11's say 96 tokens (384 bytes = 6 blocks).
    let mut exact = [cand(0), cand(0)];
    exact[0].kv_held_tokens = Some(0);
    exact[1].kv_held_tokens = Some(96);
    let d = place(&mut ix, &exact, &mut rng);
    assert_eq!((d.index, d.reason), (1, Reason::PrefixHit));
    // Exact and below the threshold (32 tokens = 128 bytes < 256): a miss, whatever the guess said.
    exact[1].kv_held_tokens = Some(32);
    let d = place(&mut ix, &exact, &mut rng);
    assert_eq!(d.reason, Reason::PrefixMiss);
}
