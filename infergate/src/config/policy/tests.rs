//! Unit tests of the policy keys: defaults, valid names, what sessions need, header lists, move margin, cache keys.

use super::*;
use crate::config::testing::*;

#[test]
fn sessions_and_engine_stats_defaults_when_present() {
    let c = parse(&pool_with("    sessions: {}\n    engine_stats:\n")).unwrap();
    assert_eq!(
        c.pools[0].policy.sessions(),
        Some(&SessionsConfig::default())
    );
    assert_eq!(
        c.pools[0].engine_stats,
        Some(EngineStatsConfig {
            kind: EngineKind::Vllm,
            path: "/metrics".into(),
            interval: Duration::from_secs(1),
            metric_prefix: "vllm:".into(),
        })
    );
}

#[test]
fn bad_policy_lists_valid_names() {
    assert_err(
        &pool_with("    policy: fastest\n"),
        "pools[0].policy",
        &["unknown policy `fastest`; expected one of round_robin, least_request, load_aware, prefix_aware, predicted_ttft"],
    );
    for (name, p) in [
        ("round_robin", Policy::RoundRobin),
        ("least_request", Policy::LeastRequest),
        ("load_aware", Policy::LoadAware),
        ("prefix_aware", Policy::PrefixAware),
    ] {
        assert_eq!(
            parse(&pool_with(&format!("    policy: {name}\n")))
                .unwrap()
                .pools[0]
                .policy
                .kind(),
            p
        );
    }
    assert_err(
        &pool_with("    engine_stats: { kind: tgi }\n"),
        "pools[0].engine_stats.kind",
        &["unknown engine kind `tgi`; expected one of vllm, sglang"],
    );
    assert_err(
        &pool_with("    prefix: { fallback: random }\n"),
        "pools[0].prefix.fallback",
        &["unknown fallback `random`; expected one of least_inflight, qps"],
    );
}

#[test]
fn sessions_require_load_aware() {
    assert_err(
        &pool_with("    policy: round_robin\n    sessions: { header: x-session-id }\n"),
        "pools[0].sessions",
        &["sessions require policy load_aware or predicted_ttft (this pool's policy is round_robin)"],
    );
    assert_err(
        &pool_with("    sessions: { header: \"x session\" }\n"),
        "pools[0].sessions.header",
        &["`x session` is not a valid HTTP header name"],
    );
    assert_err(
        &pool_with("    sessions: { max_sessions: 0 }\n"),
        "pools[0].sessions.max_sessions",
        &["at least 1"],
    );
}

#[test]
fn session_header_is_one_name_or_a_list_in_lookup_order() {
    let headers = |v: &str| {
        let c = parse(&pool_with(&format!("    sessions: {{ header: {v} }}\n"))).unwrap();
        c.pools[0].policy.sessions().unwrap().headers.clone()
    };
    let default = parse(&pool_with("    sessions: {}\n")).unwrap();
    assert_eq!(
        default.pools[0].policy.sessions().unwrap().headers,
        ["x-session-id", "x-claude-code-session-id", "session-id"]
    );
    assert_eq!(headers("X-Conv"), ["x-conv"]);
    assert_eq!(
        headers("[x-session-id, X-Claude-Code-Session-Id]"),
        ["x-session-id", "x-claude-code-session-id"]
    );
    let f = "pools[0].sessions.header";
    assert_err(
        &pool_with("    sessions: { header: [] }\n"),
        f,
        &["at least one header name is required"],
    );
    assert_err(
        &pool_with("    sessions: { header: [x-a, X-A] }\n"),
        "pools[0].sessions.header[1]",
        &["header `x-a` is listed twice"],
    );
    assert_err(
        &pool_with("    sessions: { header: [x-a, \"x b\"] }\n"),
        "pools[0].sessions.header[1]",
        &["`x b` is not a valid HTTP header name"],
    );
}

#[test]
fn move_margin_is_predicted_ttfts_share_from_0_to_1() {
    let sessions = |policy: &str, margin: &str| {
        pool_with(&format!(
            "    policy: {policy}\n    sessions: {{ move_margin: {margin} }}\n"
        ))
    };
    for (margin, want) in [("0", 0.0), ("0.35", 0.35), ("1", 1.0)] {
        let c = parse(&sessions("predicted_ttft", margin)).unwrap();
        assert_eq!(c.pools[0].policy.sessions().unwrap().move_margin, want);
    }
    let f = "pools[0].sessions.move_margin";
    let range = "must be a number from 0 to 1 (1: never move a session off a healthy endpoint below its limit)";
    assert_err(&sessions("predicted_ttft", "1.5"), f, &[range, "found 1.5"]);
    assert_err(&sessions("predicted_ttft", "-0.1"), f, &[range]);
    assert_err(
        &sessions("predicted_ttft", ".nan"),
        f,
        &[range, "found NaN"],
    );
    assert_err(&sessions("predicted_ttft", "high"), f, &["a number"]);
    assert_err(
        &sessions("load_aware", "0.5"),
        f,
        &["is read by policy predicted_ttft only (load_aware moves a session on pressure); remove it"],
    );
}

#[test]
fn prompt_cache_key_sessions_are_off_unless_asked_for() {
    let with = |v: &str| pool_with(&format!("    sessions: {{ prompt_cache_key: {v} }}\n"));
    let on = |c: crate::config::Config| c.pools[0].policy.sessions().unwrap().prompt_cache_key;
    assert!(!on(parse(&pool_with("    sessions: {}\n")).unwrap()));
    assert!(on(parse(&with("true")).unwrap()));
    assert_err(
        &with("yes please"),
        "pools[0].sessions.prompt_cache_key",
        &["true or false"],
    );
}
