//! What an operator watches: every series exists from the start and leaves with its endpoint.

mod common;

use common::*;
use infergate::metrics::{COMMIT, REQUEST_CODES, ROUTER_CODES, VERSION};
use infergate_sim::SimConfig;

const SESSION_REASONS: [&str; 6] = [
    "new_session",
    "sticky",
    "migrate",
    "spill",
    "fallback",
    "headerless",
];

/// A router with sessions and engine stats in front of `engines`.
async fn router_for(engines: &[infergate_sim::EngineHandle]) -> TestRouter {
    let extra = format!("{}{}", sessions_yaml(1000), ENGINE_STATS);
    let router = start_router(&pool_yaml("load_aware", &urls(engines), &extra)).await;
    router.all_healthy().await;
    router
}

fn labels_of(router: &TestRouter) -> Vec<String> {
    router.state.pools.pools[0]
        .endpoints()
        .iter()
        .map(|e| e.label.clone())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_series_exists_at_zero_from_start_and_leaves_with_its_endpoint() {
    let engines = engines(2, SimConfig::default()).await;
    let router = router_for(&engines).await;
    let eps = labels_of(&router);
    let m = router.metrics_text().await;

    for ep in &eps {
        let e = format!("endpoint=\"{ep}\"");
        for name in [
            "infergate_prefill_tokens_estimated_total",
            "infergate_prefill_janitor_released_total",
            "infergate_retries_total",
            "infergate_endpoint_ejections_total",
            "infergate_time_to_first_byte_seconds_count",
            "infergate_request_duration_seconds_count",
            "infergate_endpoint_prefill_tokens",
            "infergate_endpoint_requests_in_flight",
            "infergate_endpoint_ejected",
            "infergate_endpoint_prefill_tokens_per_second",
        ] {
            assert_eq!(metric_value(&m, name, &[&e]), Some(0.0), "{name} {ep}");
        }
        assert_eq!(
            metric_value(&m, "infergate_endpoint_healthy", &[&e]),
            Some(1.0)
        );
        for reason in SESSION_REASONS {
            let r = format!("reason=\"{reason}\"");
            assert_eq!(
                metric_value(&m, "infergate_placements_total", &[&e, &r]),
                Some(0.0),
                "placements {reason} {ep}"
            );
        }
        for code in REQUEST_CODES {
            let c = format!("code=\"{code}\"");
            assert_eq!(
                metric_value(&m, "infergate_requests_total", &[&e, &c]),
                Some(0.0),
                "requests {code} {ep}"
            );
        }
        for state in infergate::metrics::STATS_STATES {
            let s = format!("state=\"{state}\"");
            assert!(metric_value(&m, "infergate_engine_stats_state", &[&e, &s]).is_some());
        }
    }
    for cause in ["ttl", "capacity"] {
        let c = format!("cause=\"{cause}\"");
        assert_eq!(
            metric_value(&m, "infergate_session_evictions_total", &[&c]),
            Some(0.0)
        );
    }
    for code in ROUTER_CODES {
        let c = format!("code=\"{code}\"");
        assert!(
            metric_value(&m, "infergate_router_responses_total", &[&c]).is_some(),
            "router responses {code}"
        );
    }
    assert_eq!(metric_value(&m, "infergate_sessions", &[]), Some(0.0));
    let build = [
        format!("version=\"{VERSION}\""),
        format!("commit=\"{COMMIT}\""),
    ];
    assert!(!COMMIT.is_empty());
    assert_eq!(
        metric_value(
            &m,
            "infergate_build_info",
            &[build[0].as_str(), build[1].as_str()]
        ),
        Some(1.0)
    );
    for name in [
        "process_resident_memory_bytes",
        "process_open_fds",
        "process_max_fds",
    ] {
        assert!(
            metric_value(&m, name, &[]).is_some_and(|v| v > 0.0),
            "{name}"
        );
    }
    assert!(metric_value(&m, "process_cpu_seconds_total", &[]).is_some());

    // One request: its endpoint's time to first byte and duration are observed once.
    let status = post_chat_in_session(&router.url(), "s1", chat_body(2000, true, 4)).await;
    assert_eq!(status, 200);
    let m = router
        .metrics_when(|m| metric_sum(m, "infergate_request_duration_seconds_count", &[]) == 1.0)
        .await;
    assert_eq!(
        metric_sum(&m, "infergate_time_to_first_byte_seconds_count", &[]),
        1.0
    );
    assert_eq!(
        metric_sum(&m, "infergate_request_duration_seconds_count", &[]),
        1.0
    );
    let served = eps
        .iter()
        .find(|ep| {
            let e = format!("endpoint=\"{ep}\"");
            metric_value(&m, "infergate_time_to_first_byte_seconds_count", &[&e]) == Some(1.0)
        })
        .expect("the serving endpoint's histogram");
    let e = format!("endpoint=\"{served}\"");
    assert_eq!(
        metric_value(&m, "infergate_request_duration_seconds_count", &[&e]),
        Some(1.0)
    );

    // An endpoint that leaves takes every series with it; one that comes back starts again at 0.
    let mut cfg = (*router.state.cfg).clone();
    let gone = cfg.pools[0].endpoints.remove(1).label;
    let stay = &cfg.pools[0].endpoints[0].label;
    assert!(router.state.reload_endpoints(&cfg).is_empty());
    let m = router.metrics_text().await;
    assert!(
        !m.contains(&format!("endpoint=\"{gone}\"")),
        "series of {gone} left:\n{}",
        m.lines()
            .filter(|l| l.contains(gone.as_str()))
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(m.contains(&format!("endpoint=\"{stay}\"")));
    assert!(router.state.reload_endpoints(&router.state.cfg).is_empty());
    let m = router.metrics_text().await;
    let e = format!("endpoint=\"{gone}\"");
    for name in [
        "infergate_retries_total",
        "infergate_time_to_first_byte_seconds_count",
        "infergate_request_duration_seconds_count",
    ] {
        assert_eq!(metric_value(&m, name, &[&e]), Some(0.0), "{name} back");
    }
    let r = "reason=\"sticky\"";
    assert_eq!(
        metric_value(&m, "infergate_placements_total", &[&e, r]),
        Some(0.0)
    );
}
