//! Unit tests of the `predicted_ttft` policy: its decisions over snapshots, sessions and the prefix index.

use std::time::{Duration, Instant};

use super::*;
use crate::placement::Candidate;

const IDS: [u64; 2] = [10, 11];
const SPEED: f64 = 20_000.0;

fn policy() -> PredictedTtft {
    policy_with_margin(DEFAULT_MOVE_MARGIN)
}

fn sessions(move_margin: f64) -> SessionsConfig {
    SessionsConfig {
        headers: vec![http::HeaderName::from_static("x-session-id")],
        ttl: Duration::from_secs(3600),
        max_sessions: 100,
        move_margin,
        ..SessionsConfig::default()
    }
}

fn policy_with_margin(move_margin: f64) -> PredictedTtft {
    PredictedTtft::new(Some(&sessions(move_margin)), &PrefixConfig::default(), 4.0)
}

fn cand(requests: u64, prefill: u64) -> Candidate {
    Candidate {
        eligible: true,
        requests,
        prefill_tokens: prefill,
        prefill_speed: Some(crate::placement::throughput::Fitted::ratio(SPEED)),
        ..Default::default()
    }
}

/// A prompt of `bytes` bytes starting with `head` (distinct text per head).
fn prompt(head: &str, bytes: usize) -> Vec<u8> {
    let mut p = head.as_bytes().to_vec();
    let mut i = 0;
    while p.len() < bytes {
        p.extend_from_slice(format!(" {head} word {i};").as_bytes());
        i += 1;
    }
    p.truncate(bytes);
    p
}

struct Fx {
    p: PredictedTtft,
    rng: fastrand::Rng,
    now: Instant,
    /// The requests' TTFT budget, seconds.
    budget: Option<f64>,
}

impl Fx {
    fn new() -> Fx {
        Fx {
            p: policy(),
            rng: fastrand::Rng::with_seed(7),
            now: Instant::now(),
            budget: None,
        }
    }

    fn place(&mut self, key: Option<&str>, text: &[u8], cands: &[Candidate]) -> Placement {
        let req = PlaceRequest {
            session_key: key.map(str::as_bytes),
            model: "m",
            prompt: text,
            conversation_at: 0,
            body_bytes: text.len() as u64,
            tokens: None,
            output_tokens: None,
            ttft_budget: self.budget,
        };
        let snap = Snapshot {
            cands,
            ids: &IDS,
            now: self.now,
        };
        self.p
            .place(&req, &snap, &mut self.rng)
            .expect("a placement")
    }

    /// Place and serve.
    fn serve(&mut self, key: Option<&str>, text: &[u8], cands: &[Candidate]) -> Placement {
        let p = self.place(key, text, cands);
        self.p.served(IDS[p.index], &p.ticket, self.now);
        p
    }

    /// A session's first turn of `bytes` served on two idle endpoints: its home and its next turn, `grow` bytes
    /// longer.
    fn session(&mut self, key: &str, bytes: usize, grow: usize) -> (usize, Vec<u8>) {
        let text = prompt(key, bytes);
        let home = self
            .serve(Some(key), &text, &[cand(0, 0), cand(0, 0)])
            .index;
        let mut next = text;
        next.extend_from_slice(&prompt("turn", grow));
        (home, next)
    }
}

#[test]
fn before_speeds_are_learned_it_places_as_load_aware() {
    let mut fx = Fx::new();
    let mut cands = [cand(3, 0), cand(1, 0)];
    cands[1].prefill_speed = None;
    let p = fx.place(Some("s"), &prompt("a", 4000), &cands);
    // load_aware: fewer requests wins; no prediction made.
    assert_eq!((p.index, p.reason), (1, Reason::NewSession));
    assert_eq!(p.ticket.prediction(), Some((None, 0)));
    // Without the header in a sessions pool: headerless, still load_aware.
    let p = fx.place(None, &prompt("b", 4000), &cands);
    assert_eq!((p.index, p.reason), (1, Reason::Headerless));
}

#[test]
fn a_session_stays_and_counts_only_its_growth() {
    let mut fx = Fx::new();
    let even = [cand(0, 0), cand(0, 0)];
    let first = prompt("s1", 40_000);
    let p = fx.serve(Some("s1"), &first, &even);
    assert_eq!(p.reason, Reason::NewSession);
    let home = p.index;
    // The next turn grows by 2,000 bytes; the other endpoint is idle, the home one a little busier.
    let mut cands = [cand(0, 0), cand(0, 0)];
    cands[home] = cand(2, 2_000);
    let mut second = first.clone();
    second.extend_from_slice(&prompt("more", 2_000));
    let p = fx.place(Some("s1"), &second, &cands);
    assert_eq!((p.index, p.reason), (home, Reason::Sticky));
    assert_eq!(p.estimate_bytes, 2_000);
    let (predicted, ahead) = p.ticket.prediction().unwrap();
    assert_eq!(ahead, 2_000);
    // (2,000 queued + 500 own tokens) / 20,000 tokens/s.
    assert!((predicted.unwrap() - 0.125).abs() < 1e-9, "{predicted:?}");
}

#[test]
fn load_placed_elsewhere_is_ahead_in_the_prediction_and_in_its_sample() {
    let mut fx = Fx::new();
    // Each engine holds 4 requests, one of them ours: 3 came from elsewhere.
    let mut cands = [cand(1, 0), cand(1, 0)];
    for c in &mut cands {
        c.engine = Some(crate::placement::EngineLoad {
            running: 4,
            waiting: 0,
            kv_usage: 0.1,
            own_at_sample: 1,
        });
    }
    let p = fx.place(Some("s"), &prompt("a", 4_000), &cands);
    let (predicted, ahead) = p.ticket.prediction().unwrap();
    // The throughput sample is taken over the same tokens ahead the prediction counted, so the flood is not
    // also learned as a slower engine.
    assert_eq!(ahead, 3 * 16_384);
    // (3 × 16384 ahead + 1,000 own tokens) / 20,000 tokens/s.
    let expected = (3.0 * 16_384.0 + 1_000.0) / SPEED;
    assert!(
        (predicted.unwrap() - expected).abs() < 1e-9,
        "{predicted:?}"
    );
}

#[test]
fn a_session_moves_only_when_the_saving_beats_the_recompute() {
    let mut fx = Fx::new();
    let even = [cand(0, 0), cand(0, 0)];
    let short = prompt("short", 8_000); // 2k tokens
    let long = prompt("long", 240_000); // 60k tokens
    let ps = fx.serve(Some("short"), &short, &even);
    let pl = fx.serve(Some("long"), &long, &[cand(0, 0), cand(0, 0)]);
    // A 40k-token cold prefill is running on each one's home endpoint; the other endpoint is idle.
    for (key, text, home) in [("short", &short, ps.index), ("long", &long, pl.index)] {
        let mut cands = [cand(0, 0), cand(0, 0)];
        cands[home] = cand(1, 40_000);
        let mut next = text.clone();
        next.extend_from_slice(&prompt("turn", 2_000));
        let p = fx.place(Some(key), &next, &cands);
        if key == "short" {
            // 2.5k tokens recomputed elsewhere (0.13 s) against 40.5k tokens of queue at home (2 s): move.
            assert_eq!((p.index, p.reason), (1 - home, Reason::Migrate));
            assert_eq!(p.estimate_bytes, next.len() as u64);
        } else {
            // 60.5k tokens recomputed elsewhere (3 s) is worse than waiting (2 s): stay.
            assert_eq!((p.index, p.reason), (home, Reason::Sticky));
        }
    }
}

#[test]
fn a_turn_stuck_behind_a_long_prompt_is_rescued_beside_a_busy_batch() {
    let mut fx = Fx::new();
    // The other endpoint: 20 streams decoding, nothing queued. Home: `queued` prefill tokens ahead.
    let mut turn = |key: &str, bytes: usize, queued: u64| {
        let (home, next) = fx.session(key, bytes, 2_000);
        let mut cands = [cand(20, 0), cand(20, 0)];
        cands[home] = cand(1, queued);
        let p = fx.place(Some(key), &next, &cands);
        (p.index == home, p.reason)
    };
    // 8.5k tokens to recompute (0.43 s) against 2 s queued: by the totals its stall on 20 streams (8.5 s) outweighs
    // the 2.25 s stay; but the turn would wait home more than 3 times as long, and two steps stall no one's tail.
    // Counted apart from the moves the totals make, its series created with the others.
    assert_eq!(turn("short", 32_000, 40_000), (false, Reason::Rescue));
    // Behind 20k tokens (1 s), not 3 times the 0.43 s there: not stuck, it stays.
    assert_eq!(turn("short2", 32_000, 20_000), (true, Reason::Sticky));
    // Past two batch steps: 24.5k tokens (1.2 s) against 10 s queued would stall the 20 streams for longer.
    assert_eq!(turn("mid", 96_000, 200_000), (true, Reason::Sticky));
    // A long session: recomputing 60.5k tokens (3 s) is slower than the queue at home.
    assert_eq!(turn("long", 240_000, 40_000), (true, Reason::Sticky));
    assert!(Fx::new().p.reasons().contains(&Reason::Rescue));
}

#[test]
fn a_turn_behind_a_long_prompt_leaves_for_an_engine_whose_own_long_prompt_is_nearly_done() {
    let mut fx = Fx::new();
    let (home, next) = fx.session("s", 32_000, 2_000);
    // Both engines hold 100k tokens of ours (5 s at 20k tokens/s), home's just sent.
    let mut cands = [cand(4, 100_000), cand(4, 100_000)];
    let p = fx.place(Some("s"), &next, &cands);
    assert_eq!((p.index, p.reason), (home, Reason::Sticky));
    // The other engine has been on its prompt for 4.8 s: 4k tokens are left of it, 0.2 s, and the turn's 8.5k
    // tokens take 0.43 s there against more than 5 s at home.
    cands[1 - home].prefill_busy_seconds = 4.8;
    let p = fx.place(Some("s"), &next, &cands);
    assert_eq!(p.index, 1 - home, "{:?}", p.reason);
    assert!(matches!(p.reason, Reason::Rescue | Reason::Migrate));
    let (predicted, ahead) = p.ticket.prediction().unwrap();
    // The throughput sample is taken over the same tokens ahead.
    assert_eq!(ahead, 4_000);
    assert!(
        (predicted.unwrap() - (4_000.0 + 8_500.0) / SPEED).abs() < 1e-9,
        "{predicted:?}"
    );
}

#[test]
fn a_move_margin_of_1_keeps_the_session_home_until_a_reload_lowers_it() {
    let mut fx = Fx::new();
    fx.p = policy_with_margin(1.0);
    let (home, next) = fx.session("short", 8_000, 2_000);
    // The case above that moves by default: 2.5k tokens to recompute against 40.5k queued at home.
    let mut cands = [cand(0, 0), cand(0, 0)];
    cands[home] = cand(1, 40_000);
    let p = fx.place(Some("short"), &next, &cands);
    assert_eq!((p.index, p.reason), (home, Reason::Sticky));
    // Unhealthy home: the margin does not hold the session there.
    let mut down = cands;
    down[home].eligible = false;
    assert_eq!(fx.place(Some("short"), &next, &down).index, 1 - home);
    // A reload with the default margin changes it in place, the binding kept.
    let yaml = "pools:\n  - name: a\n    policy: predicted_ttft\n    sessions: {}\n    endpoints: [\"http://127.0.0.1:9\"]\n";
    let cfg = crate::config::Config::parse(std::path::Path::new("t.yaml"), yaml).expect("valid");
    assert_eq!(fx.p.reconfigure(&cfg.pools[0], fx.now), Ok(None));
    let p = fx.place(Some("short"), &next, &cands);
    assert_eq!((p.index, p.reason), (1 - home, Reason::Migrate));
}

#[test]
fn a_shared_prefix_draws_new_sessions_unless_the_queue_outweighs_it() {
    let mut fx = Fx::new();
    let system = prompt("shared system prompt and tools", 64_000); // 16k tokens
    let with = |user: &str| {
        let mut p = system.clone();
        p.extend_from_slice(&prompt(user, 4_000));
        p
    };
    let p = fx.serve(Some("first"), &with("u0"), &[cand(0, 0), cand(0, 0)]);
    let warm = p.index;
    // Equal load: the endpoint holding the 16k shared tokens costs 1k tokens, the other 17k.
    let p = fx.place(Some("second"), &with("u1"), &[cand(1, 0), cand(1, 0)]);
    assert_eq!((p.index, p.reason), (warm, Reason::NewSession));
    assert_eq!(p.estimate_bytes, 4_000);
    // 40k tokens queued on the warm endpoint (2 s): the cold one costs less, its 17k tokens (0.85 s) and the
    // stall of the stream decoding there (0.85 s) included. (30k, 1.5 s, would not: 1.55 s against 1.7 s.)
    let mut cands = [cand(1, 0), cand(1, 0)];
    cands[warm] = cand(1, 40_000);
    let p = fx.place(Some("third"), &with("u2"), &cands);
    assert_eq!((p.index, p.reason), (1 - warm, Reason::NewSession));
    assert_eq!(p.estimate_bytes, 68_000);
}

#[test]
fn a_bound_endpoint_at_its_limit_spills_one_turn_and_keeps_the_binding() {
    let mut fx = Fx::new();
    let first = prompt("s", 20_000);
    let p = fx.serve(Some("s"), &first, &[cand(0, 0), cand(0, 0)]);
    let home = p.index;
    let mut cands = [cand(0, 0), cand(0, 0)];
    cands[home] = Candidate {
        max_in_flight: Some(4),
        ..cand(4, 0)
    };
    let p = fx.serve(Some("s"), &first, &cands);
    assert_eq!((p.index, p.reason), (1 - home, Reason::Spill));
    // The binding stayed: with room again, the session is sticky at home.
    let p = fx.place(Some("s"), &first, &[cand(0, 0), cand(0, 0)]);
    assert_eq!((p.index, p.reason), (home, Reason::Sticky));
}

#[test]
fn ties_are_random_and_nothing_latches() {
    let mut fx = Fx::new();
    let mut seen = [0; 2];
    for i in 0..200 {
        let p = fx.place(
            None,
            &prompt(&format!("chat {i}"), 2_000),
            &[cand(1, 0), cand(1, 0)],
        );
        assert_eq!(p.reason, Reason::Headerless);
        seen[p.index] += 1;
    }
    assert!(seen[0] > 50 && seen[1] > 50, "{seen:?}");
    // A session served on one endpoint goes to the other once the home one is far busier.
    let text = prompt("s", 4_000);
    let home = fx.serve(Some("s"), &text, &[cand(0, 0), cand(0, 0)]).index;
    let mut cands = [cand(0, 0), cand(0, 0)];
    cands[home] = cand(40, 80_000);
    let p = fx.place(Some("s"), &text, &cands);
    assert_eq!((p.index, p.reason), (1 - home, Reason::Migrate));
}

#[test]
fn exact_held_tokens_from_kv_events_win_over_the_prefix_index_and_none_falls_back() {
    let mut fx = Fx::new();
    let text = prompt("kv", 40_000);
    let even = [cand(0, 0), cand(0, 0)];
    // The approximate index learns that endpoint 0 holds the prompt.
    let first = fx.serve(None, &text, &even);
    let guess = first.index;
    let other = 1 - guess;
    // No exact figures (no events, or a stale index): the approximate index decides.
    let p = fx.place(None, &text, &even);
    assert_eq!(p.index, guess);
    // The engines' own events say the other one holds 9,000 of the 10,000 tokens and the guessed one nothing
    // (it evicted them): the exact figures win, and the estimate is what is left to compute.
    let mut exact = even;
    exact[guess].kv_held_tokens = Some(0);
    exact[other].kv_held_tokens = Some(9_000);
    let p = fx.place(None, &text, &exact);
    assert_eq!(p.index, other);
    assert_eq!(p.estimate_bytes, 40_000 - 36_000);
    // Only one endpoint's index is trusted: the other keeps its approximate figure.
    let mut mixed = even;
    mixed[other].kv_held_tokens = Some(0);
    assert_eq!(fx.place(None, &text, &mixed).index, guess);
}

#[test]
fn a_ttft_budget_narrows_the_choice_and_says_when_nothing_fits() {
    let mut fx = Fx::new();
    // A session of 10.8k tokens (43.2k bytes at 4 bytes per token) bound to one endpoint; its next turn adds 1k.
    let text = prompt("b", 43_200);
    let home = fx.serve(Some("b"), &text, &[cand(0, 0), cand(0, 0)]).index;
    let grown = prompt("b", 47_200);
    // Home: 11k tokens queued (0.55 s) and the 1k of growth: 0.6 s to the first token, and 0.16 s of stall to
    // the stream there (0.05 s, 3.2 times behind the queue). Elsewhere: all 11.8k tokens, 0.59 s, and as long a
    // stall to the stream decoding there: 1.18 s against 0.76 s. It stays.
    let mut cands = [cand(1, 0), cand(1, 0)];
    cands[home] = cand(1, 11_000);
    let p = fx.place(Some("b"), &grown, &cands);
    assert_eq!((p.index, p.reason), (home, Reason::Sticky));
    // A budget of 0.595 s: home cannot make it, the other endpoint can: one turn there, the binding kept.
    fx.budget = Some(0.595);
    let p = fx.place(Some("b"), &grown, &cands);
    assert_eq!((p.index, p.reason), (1 - home, Reason::Spill));
    let predicted = p.ticket.predicted.unwrap();
    assert_eq!(predicted.over_budget, None);
    assert!(predicted.ttft.unwrap() <= 0.595);
    // 0.2 s: nowhere. The placement is made as without a budget and says by how much it misses.
    fx.budget = Some(0.2);
    let p = fx.place(Some("b"), &grown, &cands);
    assert_eq!((p.index, p.reason), (home, Reason::Sticky));
    let predicted = p.ticket.predicted.unwrap();
    assert!(
        (predicted.over_budget.unwrap() - 0.59).abs() < 1e-9,
        "{predicted:?}"
    );
    assert!(
        !predicted.beyond_budget,
        "home's 0.05 s of growth would fit once its queue drained"
    );
    // 0.01 s: not even idle (the growth alone takes 0.05 s): waiting cannot help.
    fx.budget = Some(0.01);
    let p = fx.place(Some("b"), &grown, &cands);
    assert!(p.ticket.predicted.unwrap().beyond_budget);
}

#[test]
fn failed_requests_weigh_as_queued_work_even_when_their_prompts_were_cached() {
    // The session's engine accepted three requests and never answered them; their prompts were cached there, so
    // their debt carries no prefill tokens. It must not look idle (issue 27: a hung engine draws no traffic).
    let mut fx = Fx::new();
    let even = [cand(0, 0), cand(0, 0)];
    let first = prompt("s1", 8_000);
    let home = fx.serve(Some("s1"), &first, &even).index;
    let mut cands = [cand(0, 0), cand(0, 0)];
    cands[home].debt_requests = 3;
    let mut second = first.clone();
    second.extend_from_slice(&prompt("more", 200));
    for _ in 0..50 {
        // A request without the header whose prompt is cached there too.
        let p = fx.place(None, &second, &cands);
        assert_eq!((p.index, p.reason), (1 - home, Reason::Headerless));
        // The session bound there leaves it, whatever its cache.
        let p = fx.place(Some("s1"), &second, &cands);
        assert_eq!((p.index, p.reason), (1 - home, Reason::Migrate));
    }
    // The prediction and its sample count only the tokens there are: the debt weighs in the choice alone.
    cands[1 - home].eligible = false;
    let p = fx.place(None, &prompt("x", 400), &cands);
    assert_eq!(p.ticket.prediction().map(|(_, ahead)| ahead), Some(0));
}

#[test]
fn a_session_stays_beside_a_busy_batch_when_moving_would_lengthen_its_own_first_token() {
    let mut fx = Fx::new();
    let (home, next) = fx.session("s", 4_000, 4_000);
    // Home: 10 streams decoding, 1k tokens of growth (0.05 s); the other endpoint idle, 2k tokens to recompute
    // (0.1 s). By the totals the growth's stall on the 10 streams (0.5 s) would send the turn away.
    let mut cands = [cand(0, 0), cand(0, 0)];
    cands[home] = cand(10, 0);
    let p = fx.place(Some("s"), &next, &cands);
    assert_eq!((p.index, p.reason), (home, Reason::Sticky));
}
