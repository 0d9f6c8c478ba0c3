//! What an operator watches: every series exists from the start and leaves with its endpoint; the shipped Grafana
//! dashboard and Prometheus alert rules use only metrics a live router exports (and pass `promtool`); the status
//! page renders every endpoint in headless Chromium while `/metrics` answers as before; a prefill released a
//! moment ago still shows in the status peak.
//!
//! promtool (Debian `prometheus`) and Chromium (Debian `chromium`) are installed by `scripts/ensure-test-tools.sh`,
//! which the test command runs first; a test fails when they are missing, unless `INFERGATE_SKIP_TOOL_TESTS` is set.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::common::*;
use infergate::config::Config;
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
            "infergate_endpoint_health_check_failures_total",
        ] {
            assert_eq!(metric_value(&m, name, &[&e]), Some(0.0), "{name} {ep}");
        }
        for (to, n) in [("unhealthy", 0.0), ("healthy", 1.0)] {
            let t = format!("to=\"{to}\"");
            assert_eq!(
                metric_value(&m, "infergate_endpoint_health_changes_total", &[&e, &t]),
                Some(n),
                "health changes to {to} {ep}"
            );
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_recommended_policy_exports_every_reason_it_gives_from_the_start() {
    // predicted_ttft declares its reasons in a list of its own: a reason it gives but does not declare would
    // appear only once used, and a rate() over it would miss its first placements.
    let engines = engines(2, SimConfig::default()).await;
    let extra = format!("{}{}", sessions_yaml(1000), ENGINE_STATS);
    let router = start_router(&pool_yaml("predicted_ttft", &urls(&engines), &extra)).await;
    router.all_healthy().await;
    let declared: BTreeSet<&str> = router.state.pools.pools[0]
        .reasons()
        .iter()
        .map(|r| r.as_str())
        .collect();
    for reason in ["new_session", "sticky", "migrate", "headerless"] {
        assert!(declared.contains(reason), "{reason} not in {declared:?}");
    }
    let m = router.metrics_text().await;
    for ep in labels_of(&router) {
        let e = format!("endpoint=\"{ep}\"");
        for reason in &declared {
            let r = format!("reason=\"{reason}\"");
            assert_eq!(
                metric_value(&m, "infergate_placements_total", &[&e, &r]),
                Some(0.0),
                "placements {reason} {ep}"
            );
        }
    }
    // Sessions opening and continuing, and requests without a session: every reason counted was declared.
    for i in 0..12 {
        let body = chat_body(1500 + i * 50, i % 2 == 0, 2);
        let status = if i % 4 == 3 {
            post_chat(&router.url(), body).await
        } else {
            post_chat_in_session(&router.url(), &format!("s{}", i % 3), body).await
        };
        assert_eq!(status, 200, "request {i}");
    }
    let m = router
        .metrics_when(|m| metric_sum(m, "infergate_placements_total", &[]) >= 12.0)
        .await;
    let counted: BTreeSet<String> = m
        .lines()
        .filter(|l| l.starts_with("infergate_placements_total{"))
        // Counted: the router's own reasons (a stored response's engine) exist at zero beside the policy's.
        .filter(|l| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()) > Some(0.0))
        .filter_map(|l| {
            l.split("reason=\"")
                .nth(1)?
                .split('"')
                .next()
                .map(String::from)
        })
        .collect();
    assert!(
        counted.contains("new_session") && counted.contains("headerless"),
        "{counted:?}"
    );
    for reason in &counted {
        assert!(
            declared.contains(reason.as_str()),
            "{reason} counted, not declared: {declared:?}"
        );
    }
    router.wait_idle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_ends_after_its_endpoint_left_does_not_bring_its_series_back() {
    let engines = engines(2, slow_prefill()).await;
    let router = router_for(&engines).await;
    // A long prefill (about 4 s) in flight on one endpoint while a reload removes that endpoint.
    let url = router.url();
    let stream = tokio::spawn(async move { post_chat(&url, chat_body(400_000, true, 2)).await });
    router
        .wait_for("the request in flight", Duration::from_secs(10), |r| {
            r.totals().1 == 1
        })
        .await;
    let busy = (0..2).find(|&i| router.endpoint_load(i).1 == 1).unwrap();
    let mut cfg = (*router.state.cfg).clone();
    let gone = cfg.pools[0].endpoints.remove(busy).label;
    assert!(router.state.reload_endpoints(&cfg).is_empty());
    let series = format!("endpoint=\"{gone}\"");
    assert!(!router.metrics_text().await.contains(&series));

    assert_eq!(
        stream.await.unwrap(),
        200,
        "the stream finishes on the departed endpoint"
    );
    // Wait for the request to be counted somewhere it may be counted: nowhere, so give the logging hook time.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let m = router.metrics_text().await;
    let back: Vec<&str> = m.lines().filter(|l| l.contains(&series)).collect();
    assert!(
        back.is_empty(),
        "series of {gone} came back:\n{}",
        back.join("\n")
    );
}

/// A router whose pool has a wait queue and whose clients need keys (alice, bob) from a file in `dir`.
/// `more` is appended to the pool's keys (or, indented as `pools:` items, adds pools).
async fn router_with_keys_and_queue(
    engines: &[infergate_sim::EngineHandle],
    dir: &Path,
    more: &str,
) -> (TestRouter, PathBuf) {
    std::fs::create_dir_all(dir).unwrap();
    let keys = dir.join("client-keys");
    std::fs::write(
        &keys,
        "alice:sk-alice-0123456789abcdef\nbob:sk-bob-fedcba9876543210\n",
    )
    .unwrap();
    let extra = format!(
        "{}{}    max_in_flight_per_endpoint: 8\n    queue: {{ max_length: 16, max_wait: 2s }}\n{more}",
        sessions_yaml(1000),
        ENGINE_STATS
    );
    let yaml = format!(
        "auth:\n  keys_file: {}\n{}",
        keys.display(),
        pool_yaml("load_aware", &urls(engines), &extra)
    );
    let router = start_router(&yaml).await;
    router.all_healthy().await;
    (router, keys)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_key_and_wait_queue_series_exist_from_start_and_the_page_shows_the_queue() {
    let engines = engines(2, SimConfig::default()).await;
    let dir = std::env::temp_dir().join(format!("infergate-observe-keys-{}", std::process::id()));
    let (router, keys) = router_with_keys_and_queue(&engines, &dir, "").await;
    let m = router.metrics_text().await;
    for key in ["alice", "bob"] {
        let k = format!("key=\"{key}\"");
        for code in REQUEST_CODES {
            let c = format!("code=\"{code}\"");
            assert_eq!(
                metric_value(&m, "infergate_client_requests_total", &[&k, &c]),
                Some(0.0),
                "{key} {code}"
            );
        }
        for limit in [
            "requests_per_minute",
            "prompt_tokens_per_minute",
            "concurrent_requests",
        ] {
            let l = format!("limit=\"{limit}\"");
            assert_eq!(
                metric_value(&m, "infergate_client_rate_limited_total", &[&k, &l]),
                Some(0.0),
                "{key} {limit}"
            );
        }
    }
    assert_eq!(
        metric_value(
            &m,
            "infergate_client_requests_total",
            &["key=\"-\"", "code=\"401\""]
        ),
        Some(0.0)
    );
    let p = "pool=\"default\"";
    for (name, labels) in [
        ("infergate_queue_length", vec![p]),
        ("infergate_queue_wait_seconds_count", vec![p]),
        ("infergate_queue_rejected_total", vec![p, "reason=\"full\""]),
        (
            "infergate_queue_rejected_total",
            vec![p, "reason=\"timeout\""],
        ),
        ("infergate_queue_abandoned_total", vec![p]),
    ] {
        assert_eq!(metric_value(&m, name, &labels), Some(0.0), "{name}");
    }
    // The status page reads the queue's length.
    let base = format!("http://{}", router.metrics_addr);
    let json = get_json(&base, "/status.json").await;
    assert_eq!(json["pools"][0]["queue_length"], 0);
    assert_eq!(json["pools"][0]["max_in_flight_per_endpoint"], 8);

    // A key added by a reload starts at 0; a departed one loses its series.
    std::fs::write(
        &keys,
        "alice:sk-alice-0123456789abcdef\ncarol:sk-carol-0011223344556677\n",
    )
    .unwrap();
    let text = format!(
        "auth:\n  keys_file: {}\n{}",
        keys.display(),
        pool_yaml("load_aware", &urls(&engines), "")
            .replace("{listen}", &router.addr.to_string())
            .replace("{metrics}", &router.metrics_addr.to_string())
    );
    let cfg = Config::parse(Path::new("test.yaml"), &text).expect("reloaded config");
    router.state.reload_keys(&cfg);
    let m = router.metrics_text().await;
    assert!(!m.contains("key=\"bob\""), "bob's series left");
    assert_eq!(
        metric_value(
            &m,
            "infergate_client_requests_total",
            &["key=\"carol\"", "code=\"200\""]
        ),
        Some(0.0)
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// Every metric name a scrape declares (`# TYPE`), with the `_bucket`, `_sum` and `_count` series of
/// histograms and summaries.
fn exported_names(text: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for l in text.lines() {
        let mut w = l.split_whitespace();
        if (w.next(), w.next()) != (Some("#"), Some("TYPE")) {
            continue;
        }
        let (Some(name), Some(kind)) = (w.next(), w.next()) else {
            continue;
        };
        names.insert(name.to_string());
        if kind == "histogram" || kind == "summary" {
            for suffix in ["_bucket", "_sum", "_count"] {
                names.insert(format!("{name}{suffix}"));
            }
        }
    }
    names
}

/// The metric names a PromQL expression selects: identifiers outside strings, label matchers, ranges and
/// grouping label lists that are neither functions, aggregations, keywords nor Grafana variables.
fn promql_metric_names(expr: &str) -> Vec<String> {
    const KEYWORDS: [&str; 26] = [
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
        "and",
        "or",
        "unless",
        "bool",
        "offset",
        "inf",
        "nan",
        "sum",
        "min",
        "max",
        "avg",
        "count",
        "group",
        "stddev",
        "stdvar",
        "topk",
        "bottomk",
        "quantile",
        "count_values",
        "atan2",
    ];
    const GROUPING: [&str; 6] = [
        "by",
        "without",
        "on",
        "ignoring",
        "group_left",
        "group_right",
    ];
    let c: Vec<char> = expr.chars().collect();
    let mut names = Vec::new();
    let mut i = 0;
    // Skip from an opening delimiter at `i` to just past its closing one (no nesting inside these).
    let skip_to = |i: usize, close: char| -> usize {
        let mut j = i + 1;
        while j < c.len() && c[j] != close {
            if c[j] == '\\' {
                j += 1;
            }
            j += 1;
        }
        j + 1
    };
    while i < c.len() {
        match c[i] {
            '"' | '\'' | '`' => i = skip_to(i, c[i]),
            '{' => i = skip_to(i, '}'),
            '[' => i = skip_to(i, ']'),
            '$' => {
                i += 1;
                while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_') {
                    i += 1;
                }
            }
            ch if ch.is_ascii_digit() || ch == '.' => {
                while i < c.len() && (c[i].is_alphanumeric() || c[i] == '.') {
                    i += 1;
                }
            }
            ch if ch.is_alphabetic() || ch == '_' || ch == ':' => {
                let start = i;
                while i < c.len() && (c[i].is_alphanumeric() || c[i] == '_' || c[i] == ':') {
                    i += 1;
                }
                let word: String = c[start..i].iter().collect();
                let mut j = i;
                while j < c.len() && c[j].is_whitespace() {
                    j += 1;
                }
                let call = j < c.len() && c[j] == '(';
                if GROUPING.contains(&word.as_str()) && call {
                    i = skip_to(j, ')');
                } else if !call && !KEYWORDS.contains(&word.as_str()) {
                    names.push(word);
                }
            }
            _ => i += 1,
        }
    }
    names
}

#[test]
fn promql_names_are_found_and_nothing_else() {
    let e = r#"sum by (pool, le) (rate(infergate_x_bucket{pool=~"$pool",code=~"5.."}[$__rate_interval]))
        / on(pool) group_left(endpoint) max without (endpoint) (infergate_y) > 0.5 and infergate_z offset 5m"#;
    assert_eq!(
        promql_metric_names(e),
        ["infergate_x_bucket", "infergate_y", "infergate_z"]
    );
    assert_eq!(
        promql_metric_names("histogram_quantile(0.95, x) == bool 1"),
        ["x"]
    );
}

/// Every `expr` of a dashboard's panels (rows' nested panels too).
fn panel_exprs(panels: &[serde_json::Value], out: &mut Vec<(String, String)>) {
    for p in panels {
        let title = p["title"].as_str().unwrap_or("").to_string();
        for t in p["targets"].as_array().into_iter().flatten() {
            let expr = t["expr"].as_str().expect("every target has an expr");
            out.push((title.clone(), expr.to_string()));
        }
        if let Some(nested) = p["panels"].as_array() {
            panel_exprs(nested, out);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_and_alert_rules_use_only_exported_metrics_and_pass_promtool() {
    // Client keys, a wait queue, a pool with a TTFT budget (model `budgeted`) and a disaggregated pool (model `pd`,
    // never asked), so that their series are exported too.
    let engines = engines(2, SimConfig::default()).await;
    let dir = std::env::temp_dir().join(format!("infergate-observe-dash-{}", std::process::id()));
    let u = urls(&engines);
    let pools = format!(
        "  - name: budgeted\n    models: [budgeted]\n    policy: predicted_ttft\n    endpoints: [\"{0}\"]\n    \
         ttft_budget: {{ default: 60s }}\n  - name: pd\n    models: [pd]\n    endpoints: [\"{0}\"]\n    \
         disaggregation: {{ connector: nixl, prefill: {{ endpoints: [\"{1}\"] }} }}\n",
        u[0], u[1]
    );
    let (router, _) = router_with_keys_and_queue(&engines, &dir, &pools).await;
    // A budget's series exist once a request had one.
    let resp = post_json(&client(), &router.url(), CHAT)
        .bearer_auth("sk-alice-0123456789abcdef")
        .body(chat_body(100, false, 2).replace("sim-model", "budgeted"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    // Series that exist once engine stats are fresh (load placed elsewhere) are exported by then.
    let m = router
        .metrics_when(|m| m.contains("infergate_endpoint_foreign_requests{"))
        .await;
    assert!(
        m.contains("infergate_ttft_budget_total{"),
        "a budget's series"
    );
    for pd in [
        "infergate_disagg_prefill_legs_total{",
        "infergate_disagg_prefill_seconds_bucket{",
        "infergate_disagg_kv_transfer_seconds_bucket{",
    ] {
        assert!(m.contains(pd), "{pd} exists from start");
    }
    let exported = exported_names(&m);
    drop(router);
    let _ = std::fs::remove_dir_all(dir);

    // The dashboard: valid JSON, unique panel ids, every panel's queries select only exported metrics.
    let path = repo().join("conf/grafana/infergate.json");
    let dash: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("dashboard")).expect("JSON");
    assert_eq!(dash["uid"], "infergate");
    let panels = dash["panels"].as_array().expect("panels");
    let ids: Vec<u64> = panels.iter().filter_map(|p| p["id"].as_u64()).collect();
    assert_eq!(ids.len(), panels.len(), "every panel has an id");
    assert_eq!(
        ids.iter().collect::<BTreeSet<_>>().len(),
        ids.len(),
        "panel ids are unique"
    );
    for p in panels {
        assert!(p["type"].is_string() && p["title"].is_string() && p["gridPos"]["w"].is_u64());
        if p["type"] != "row" {
            assert!(
                p["targets"].as_array().is_some_and(|t| !t.is_empty()),
                "panel {} has queries",
                p["title"]
            );
        }
    }
    let mut exprs = Vec::new();
    panel_exprs(panels, &mut exprs);
    for v in dash["templating"]["list"].as_array().expect("templating") {
        if let Some(q) = v["definition"].as_str() {
            // label_values(METRIC{...}, label): the metric part.
            let inner = q
                .strip_prefix("label_values(")
                .and_then(|s| s.rsplit_once(','))
                .map(|(m, _)| m.to_string())
                .unwrap_or_else(|| q.to_string());
            exprs.push((format!("variable {}", v["name"]), inner));
        }
    }
    assert!(exprs.len() >= 20, "{} queries", exprs.len());
    let mut used = BTreeSet::new();
    for (title, expr) in &exprs {
        let names = promql_metric_names(expr);
        assert!(!names.is_empty(), "{title}: no metric in {expr}");
        for n in names {
            assert!(
                exported.contains(&n),
                "dashboard panel {title}: {n} is not exported by the router ({expr})"
            );
            used.insert(n);
        }
    }

    // The alert rules: the same check on every expression, then promtool.
    let rules_path = repo().join("conf/prometheus/infergate-alerts.yml");
    let rules: serde_json::Value =
        serde_norway::from_str(&std::fs::read_to_string(&rules_path).expect("rules"))
            .expect("YAML");
    let mut alerts = BTreeSet::new();
    for rule in rules["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .flat_map(|g| g["rules"].as_array().expect("rules").iter())
    {
        let name = rule["alert"].as_str().expect("alert name");
        assert!(alerts.insert(name.to_string()), "duplicate alert {name}");
        assert!(rule["labels"]["severity"].is_string(), "{name}: severity");
        assert!(
            rule["annotations"]["summary"].is_string(),
            "{name}: summary"
        );
        let expr = rule["expr"].as_str().expect("expr");
        for n in promql_metric_names(expr) {
            assert!(
                exported.contains(&n),
                "alert {name}: {n} is not exported by the router ({expr})"
            );
        }
    }
    for wanted in [
        "InfergateEndpointUnhealthy",
        "InfergateEndpointEjected",
        "InfergateEngineStatsNotFresh",
        "InfergatePrefillTokensStuck",
        "InfergateErrorRatioHigh",
        "InfergateJanitorReleases",
        "InfergateQueueWaitHigh",
        "InfergateTracingSpansLost",
        "InfergateEndpointSpeedOutlier",
    ] {
        assert!(alerts.contains(wanted), "missing alert {wanted}");
    }

    let Some(promtool) = tool("promtool") else {
        return;
    };
    let dir = repo().join("conf/prometheus");
    let checked = run(
        Command::new(&promtool)
            .args(["check", "rules", "infergate-alerts.yml"])
            .current_dir(&dir),
        60,
    );
    assert!(checked.contains("SUCCESS"), "{checked}");
    let tested = run(
        Command::new(&promtool)
            .args(["test", "rules", "infergate-alerts.test.yml"])
            .current_dir(&dir),
        60,
    );
    assert!(tested.contains("SUCCESS"), "{tested}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_page_shows_every_endpoint_in_chromium_and_metrics_answer_as_before() {
    // Slow prefill, so requests are seen in flight on the page.
    let engines = engines(2, slow_prefill()).await;
    let router = router_for(&engines).await;
    let eps = labels_of(&router);
    let base = format!("http://{}", router.metrics_addr);
    let c = client();

    // /metrics exactly as before; other paths 404.
    let r = c.get(format!("{base}/metrics")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "text/plain; version=0.0.4");
    assert!(r
        .text()
        .await
        .unwrap()
        .contains("# TYPE infergate_requests_total counter"));
    let r = c.get(format!("{base}/nothing")).send().await.unwrap();
    assert_eq!(r.status(), 404);

    // Three sessions (large enough first turns to learn the prefill speed), two of them back for a second turn,
    // and two more still prefilling while the page is read.
    for s in ["a", "b", "c"] {
        assert_eq!(
            post_chat_in_session(&router.url(), s, chat_body(8000, true, 2)).await,
            200
        );
    }
    for s in ["a", "b"] {
        assert_eq!(
            post_chat_in_session(&router.url(), s, chat_body(9000, true, 2)).await,
            200
        );
    }
    let mut inflight = Vec::new();
    for s in ["d", "e"] {
        let url = router.url();
        inflight.push(tokio::spawn(async move {
            post_chat_in_session(&url, s, chat_body(400_000, true, 2)).await
        }));
    }
    router
        .wait_for(
            "both long prefills in flight",
            Duration::from_secs(10),
            |r| r.totals().1 == 2,
        )
        .await;

    let json = get_json(&base, "/status.json").await;
    let pool = &json["pools"][0];
    assert_eq!(pool["name"], "default");
    assert_eq!(json["version"], VERSION);
    let listed: Vec<&str> = pool["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["endpoint"].as_str().unwrap())
        .collect();
    assert_eq!(listed, eps);
    for e in pool["endpoints"].as_array().unwrap() {
        assert_eq!(e["health"], "healthy");
        assert_eq!(e["ejected"], false);
        assert!(e["engine_stats"]["state"].is_string());
    }
    let in_flight: u64 = pool["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["prefill_tokens"].as_u64().unwrap())
        .sum();
    assert!(in_flight > 0, "prefill tokens in flight: {pool}");
    assert!(pool["sessions"].as_u64().unwrap() >= 3);
    let reasons: Vec<&str> = pool["placements_last_minute"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["reason"].as_str().unwrap())
        .collect();
    assert_eq!(reasons, SESSION_REASONS);
    let count = |i: usize| pool["placements_last_minute"][i]["count"].as_u64();
    assert_eq!(
        (count(0), count(1)),
        (Some(5), Some(2)),
        "new sessions, sticky turns"
    );
    assert_eq!(pool["recent_placements"].as_array().unwrap().len(), 7);
    assert_eq!(pool["recent_placements"][0]["reason"], "new_session");
    assert!(
        pool["endpoints"]
            .as_array()
            .unwrap()
            .iter()
            .any(|e| e["prefill_tokens_per_second"].as_f64().is_some()),
        "a learned prefill speed: {pool}"
    );
    assert!(
        pool["queue_length"].is_null(),
        "no wait queue in this build"
    );

    let r = c.get(format!("{base}/status")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "text/html; charset=utf-8");
    let html = r.text().await.unwrap();
    for external in ["http://", "https://", "<link", "src="] {
        assert!(!html.contains(external), "external asset: {external}");
    }

    if let Some(chrome) = tool("chromium") {
        let url = format!("{base}/status");
        let dom = tokio::task::spawn_blocking({
            let (chrome, url) = (chrome.clone(), url.clone());
            move || chromium(&chrome, &url, &["--dump-dom"])
        })
        .await
        .unwrap();
        for ep in &eps {
            assert!(
                dom.contains(&format!("<tr data-endpoint=\"{ep}\">")),
                "{ep} not rendered:\n{dom}"
            );
        }
        assert!(
            dom.contains("data-source=\"live\""),
            "the page did not refresh from /status.json:\n{dom}"
        );
        // A screenshot: INFERGATE_STATUS_SCREENSHOT=docs/status.png (from the workspace root) renews the README's.
        let png = std::env::var_os("INFERGATE_STATUS_SCREENSHOT")
            .map(|p| repo().join(p))
            .unwrap_or_else(|| Path::new(env!("CARGO_TARGET_TMPDIR")).join("status.png"));
        let _ = std::fs::remove_file(&png);
        let shot = format!("--screenshot={}", png.display());
        tokio::task::spawn_blocking(move || {
            chromium(&chrome, &url, &["--window-size=1100,330", &shot])
        })
        .await
        .unwrap();
        let bytes = std::fs::read(&png).expect("screenshot written");
        assert!(bytes.starts_with(b"\x89PNG\r\n\x1a\n"), "a PNG");
    }

    for t in inflight {
        assert_eq!(t.await.unwrap(), 200);
    }
    router.wait_idle().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_released_prefill_shows_in_the_status_peak_for_its_window_whoever_reads() {
    // One engine prefilling about 25k estimated tokens for about a second.
    let engines = engines(1, slow_prefill()).await;
    let router = router_for(&engines).await;
    let base = format!("http://{}", router.metrics_addr);
    let endpoint = |json: &serde_json::Value| json["pools"][0]["endpoints"][0].clone();

    let before = get_json(&base, "/status.json").await;
    assert_eq!(before["prefill_peak_window_seconds"], 2.0);
    assert_eq!(endpoint(&before)["prefill_tokens_peak"], 0);

    assert_eq!(
        post_chat_in_session(&router.url(), "peak", chat_body(100_000, true, 2)).await,
        200
    );
    let released = std::time::Instant::now();
    // The tokens went back at the first byte; the peak still shows them, to every reader (the page and a
    // script read the same figure, neither resets it).
    for _ in 0..3 {
        let e = endpoint(&get_json(&base, "/status.json").await);
        assert_eq!(e["prefill_tokens"], 0, "{e}");
        let peak = e["prefill_tokens_peak"].as_u64().unwrap();
        assert!((20_000..=30_000).contains(&peak), "peak {peak}: {e}");
    }
    assert!(
        released.elapsed() < Duration::from_millis(1500),
        "reads were too slow to be inside the window"
    );
    // After the window it is gone.
    tokio::time::sleep(Duration::from_millis(2600)).await;
    let e = endpoint(&get_json(&base, "/status.json").await);
    assert_eq!(e["prefill_tokens_peak"], 0, "{e}");
}
