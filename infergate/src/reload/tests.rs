//! The reload plan, key by key.

use std::path::Path;

use super::plan::unlisted_change;
use super::*;

fn conf(extra: &str, pool_extra: &str) -> Config {
    let text = format!(
        "{extra}pools:\n  - name: a\n    endpoints: [\"http://127.0.0.1:9\"]\n{pool_extra}"
    );
    Config::parse(Path::new("t.yaml"), &text).expect("valid")
}

#[test]
fn endpoints_alone_leave_nothing_unapplied() {
    let old = conf("", "");
    let mut new = old.clone();
    new.pools[0].endpoints.clear();
    assert_eq!(not_applied(&old, &new), vec![]);
}

#[test]
fn a_policy_change_is_named_with_its_pool_and_what_to_do() {
    let old = conf("", "");
    let new = conf("", "    policy: prefix_aware\n");
    let p = plan(&old, &new);
    let n = p.not_applied;
    assert_eq!(n.len(), 1, "{n:?}");
    assert_eq!(
        n[0].to_string(),
        "policy of pool `a` changed (load_aware → prefix_aware): not applied, needs a restart or \
         `systemctl reload` (graceful upgrade): the pool's placement reasons (and their metric series) are \
         fixed at start, and a new policy would start without the old one's state (session bindings, prefix \
         index)"
    );
    // The pool keeps running its policy.
    assert_eq!(p.effective.pools[0].policy, old.pools[0].policy);
    // Sessions turned on: the same.
    let n = not_applied(&old, &conf("", "    sessions: {}\n"));
    assert_eq!(n.len(), 1, "{n:?}");
    assert_eq!(n[0].key, "sessions");
    assert_eq!(n[0].values, " (off → on)");
}

#[test]
fn policy_parameters_limits_and_per_request_settings_apply() {
    let old = conf(
        "",
        "    sessions: { ttl: 1h }\n    max_in_flight_per_endpoint: 4\n    queue: {}\n",
    );
    let new = conf(
        "timeouts: { connect: 5s, client_idle: 3s }\nmax_retries: 0\nendpoint_header: false\n",
        "    sessions: { ttl: 5m, max_sessions: 10, header: x-conv }\n    max_in_flight_per_endpoint: 8\n    \
         queue: { max_wait: 1s }\n    prefill: { bytes_per_token: 3, tokens_per_image: 800 }\n    outlier_detection: { base_ejection: 1s }\n",
    );
    let p = plan(&old, &new);
    assert_eq!(p.not_applied, vec![]);
    let applied: Vec<String> = p.applied.iter().map(|a| a.to_string()).collect();
    assert_eq!(
        applied,
        [
            "applied timeouts.connect (2s → 5s)",
            "applied timeouts.client_idle (60s → 3s)",
            "applied max_retries (2 → 0)",
            "applied endpoint_header (true → false)",
            "applied sessions.header of pool `a` ([\"x-session-id\", \"x-claude-code-session-id\", \"session-id\"] → [\"x-conv\"])",
            "applied sessions.ttl of pool `a` (3600s → 300s)",
            "applied sessions.max_sessions of pool `a` (100000 → 10)",
            "applied outlier_detection.base_ejection of pool `a` (2s → 1s)",
            "applied prefill.bytes_per_token of pool `a` (4.0 → 3.0)",
            "applied prefill.tokens_per_image of pool `a` (1500 → 800)",
            "applied max_in_flight_per_endpoint of pool `a` (Some(4) → Some(8))",
            "applied queue.max_wait of pool `a` (10s → 1s)",
        ]
    );
    // Everything applied: the next configuration is the file's.
    assert_eq!(format!("{:?}", p.effective), format!("{new:?}"));
    let stats = |i: &str| conf("", &format!("    engine_stats: {{ interval: {i} }}\n"));
    let p = plan(&stats("1s"), &stats("250ms"));
    assert_eq!(p.not_applied, vec![]);
    assert_eq!(
        p.applied[0].to_string(),
        "applied engine_stats.interval of pool `a` (1s → 250ms)"
    );
    let prefix = |extra: &str| conf("", &format!("    policy: prefix_aware\n{extra}"));
    let p = plan(
        &prefix(""),
        &prefix("    prefix: { block_bytes: 32, min_match_bytes: 64, capacity_tokens_per_endpoint: 9, fallback: qps }\n"),
    );
    assert_eq!(p.not_applied, vec![]);
    let keys: Vec<&str> = p.applied.iter().map(|a| a.key.as_str()).collect();
    assert_eq!(
        keys,
        [
            "prefix.block_bytes",
            "prefix.min_match_bytes",
            "prefix.capacity_tokens_per_endpoint",
            "prefix.fallback"
        ]
    );
}

#[test]
fn health_check_keys_apply_in_place_but_the_interval() {
    let p = plan(
        &conf("", ""),
        &conf(
            "",
            "    health_check: { path: /ready, interval: 5s, timeout: 3s, healthy_after: 1, \
             unhealthy_after: 4, route_when_all_unhealthy: false }\n",
        ),
    );
    let applied: Vec<&str> = p.applied.iter().map(|a| a.key.as_str()).collect();
    assert_eq!(
        applied,
        [
            "health_check.path",
            "health_check.timeout",
            "health_check.healthy_after",
            "health_check.unhealthy_after",
            "health_check.route_when_all_unhealthy"
        ]
    );
    let not: Vec<&str> = p.not_applied.iter().map(|n| n.key.as_str()).collect();
    assert_eq!(not, ["health_check.interval"]);
    assert_eq!(
        p.effective.pools[0].health_check.interval,
        std::time::Duration::from_secs(2)
    );
    assert_eq!(p.effective.pools[0].health_check.path, "/ready");
}

#[test]
fn predicted_ttfts_sessions_apply_in_place_and_its_prefix_is_kept() {
    let pred = |extra: &str| conf("", &format!("    policy: predicted_ttft\n{extra}"));
    let p = plan(
        &pred("    sessions: { ttl: 1h }\n"),
        &pred(
            "    sessions: { ttl: 5m, max_sessions: 10, header: x-conv, move_margin: 0.5, prompt_cache_key: true }\n",
        ),
    );
    assert_eq!(p.not_applied, vec![]);
    let applied: Vec<String> = p.applied.iter().map(|a| a.to_string()).collect();
    assert_eq!(
        applied,
        [
            "applied sessions.header of pool `a` ([\"x-session-id\", \"x-claude-code-session-id\", \"session-id\"] → [\"x-conv\"])",
            "applied sessions.ttl of pool `a` (3600s → 300s)",
            "applied sessions.max_sessions of pool `a` (100000 → 10)",
            "applied sessions.move_margin of pool `a` (0.1 → 0.5)",
            "applied sessions.prompt_cache_key of pool `a` (false → true)",
        ]
    );
    // Its prefix index is hashed with the settings it started with: those are kept, the sessions' still
    // apply (the policy's reconfigure refuses a change to the former, which would also drop the latter).
    let p = plan(
        &pred(""),
        &pred("    prefix: { block_bytes: 32 }\n    prefill: { bytes_per_token: 3 }\n"),
    );
    assert_eq!(p.applied, vec![]);
    let keys: Vec<&str> = p.not_applied.iter().map(|n| n.key.as_str()).collect();
    assert_eq!(keys, ["prefix.block_bytes", "prefill.bytes_per_token"]);
    let p = plan(
        &pred("    sessions: { ttl: 1h }\n"),
        &pred("    sessions: { ttl: 5m }\n    prefill: { bytes_per_token: 3 }\n"),
    );
    assert_eq!(p.applied.len(), 1, "{:?}", p.applied);
    let running = crate::placement::factory::build(&pred("    sessions: { ttl: 1h }\n").pools[0]);
    assert_eq!(
        running.reconfigure(&p.effective.pools[0], Instant::now()),
        Ok(None)
    );
    assert!(
        p.not_applied[0].why.contains("prefix index"),
        "{:?}",
        p.not_applied
    );
}

#[test]
fn nothing_changed_is_nothing_to_report() {
    let old = conf("", "    sessions: {}\n");
    assert_eq!(not_applied(&old, &old.clone()), vec![]);
    assert!(!unlisted_change(&old, &old.clone()));
}

#[test]
fn pools_in_another_order_are_named() {
    let two = "  - name: b\n    models: [m]\n    endpoints: [\"http://127.0.0.1:10\"]\n";
    let old = conf("", two);
    let mut new = old.clone();
    new.pools.reverse();
    let n = not_applied(&old, &new);
    assert_eq!(n.len(), 1, "{n:?}");
    assert_eq!(n[0].values, " (order)");
}

#[test]
fn what_cannot_change_in_place_is_listed_once_and_keeps_its_running_value() {
    let old = conf("", "");
    let new = conf(
        "listen: \"127.0.0.1:2\"\ntimeouts: { connect: 5s, request_header: 3s }\nmax_retries: 0\nserver: { threads: 4 }\n",
        "    sessions: { ttl: 1h }\n    max_in_flight_per_endpoint: 8\n  - name: b\n    models: [m]\n    endpoints: [\"http://127.0.0.1:10\"]\n",
    );
    let p = plan(&old, &new);
    let keys: Vec<String> = p
        .not_applied
        .iter()
        .map(|n| match &n.pool {
            Some(p) => format!("{p}.{}", n.key),
            None => n.key.clone(),
        })
        .collect();
    assert_eq!(
        keys,
        [
            "listen",
            "server",
            "timeouts.request_header",
            "pools",
            "a.sessions"
        ]
    );
    // The next configuration keeps the running values of those, and takes the rest.
    let e = &p.effective;
    assert_eq!(e.listen, old.listen);
    assert_eq!(e.server_yaml, old.server_yaml);
    assert_eq!(e.timeouts.request_header, old.timeouts.request_header);
    assert_eq!(e.pools.len(), 1);
    assert_eq!(e.pools[0].policy, old.pools[0].policy);
    assert_eq!(e.timeouts.connect, new.timeouts.connect);
    assert_eq!(e.max_retries, 0);
    assert_eq!(e.pools[0].max_in_flight_per_endpoint, Some(8));
    // Everything that changed has its own line: none is left for the catch-all.
    assert!(!unlisted_change(&old, &new));
    let same_pools = conf(
        "body_budget_bytes: 1000\nexpose_paths: [/metrics]\nmax_client_connections: 5\n",
        "    models: [x]\n    health_check: { interval: 1s }\n    engine_stats: {}\n    expose_paths: [/x]\n    \
         max_in_flight_per_endpoint: 2\n    queue: {}\n",
    );
    let n = not_applied(&old, &same_pools);
    let keys: Vec<&str> = n.iter().map(|n| n.key.as_str()).collect();
    assert_eq!(
        keys,
        [
            "body_budget_bytes",
            "max_client_connections",
            "expose_paths",
            "models",
            "health_check.interval",
            "engine_stats",
            "expose_paths",
            "queue"
        ]
    );
    assert!(!unlisted_change(&old, &same_pools));
    let n = not_applied(&old, &new);
    assert_eq!(n[2].values, " (10s → 3s)");
    assert_eq!(
        n[3].to_string(),
        "pools changed (`b` added): not applied, needs a restart or `systemctl reload` (graceful upgrade): \
         pools are built at start"
    );
}

#[test]
fn tracing_and_the_route_receipt_apply_in_place() {
    let old = conf("", "");
    let new = conf(
        "tracing: { endpoint: \"http://127.0.0.1:4318\" }\nroute_receipt: true\n",
        "",
    );
    let p = plan(&old, &new);
    assert_eq!(p.not_applied, vec![]);
    let keys: Vec<&str> = p.applied.iter().map(|a| a.key.as_str()).collect();
    assert_eq!(keys, ["tracing", "route_receipt"]);
    assert_eq!(format!("{:?}", p.effective), format!("{new:?}"));
    assert_eq!(plan(&new, &old).applied.len(), 2, "and off again");
}

#[test]
fn disaggregation_is_built_at_start_and_its_prefill_set_reloads_like_a_pool() {
    let disagg = |prefill: &str| {
        format!(
            "    disaggregation:\n      connector: nixl\n      prefill: {{ endpoints: [{prefill}], max_in_flight_per_endpoint: 2 }}\n"
        )
    };
    let old = conf("", "");
    let new = conf("", &disagg("\"http://127.0.0.1:10\""));
    let p = plan(&old, &new);
    let keys: Vec<&str> = p.not_applied.iter().map(|n| n.key.as_str()).collect();
    assert!(keys.contains(&"disaggregation"), "{keys:?}");
    // The running pool stays whole: no prefill leg towards a set that does not run.
    assert_eq!(p.effective.pools.len(), 1);
    assert_eq!(p.effective.pools[0].disaggregation, None);
    // A running prefill set takes its endpoints and limits in place.
    let old = conf("", &disagg("\"http://127.0.0.1:10\""));
    let new = conf(
        "",
        &disagg("\"http://127.0.0.1:10\", \"http://127.0.0.1:11\"").replace("2 }", "3 }"),
    );
    let p = plan(&old, &new);
    assert_eq!(p.not_applied, vec![]);
    assert_eq!(p.effective.pools[1].endpoints.len(), 2);
    assert_eq!(p.effective.pools[1].max_in_flight_per_endpoint, Some(3));
}
