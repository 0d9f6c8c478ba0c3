//! Unit tests of the top-level configuration: defaults, a full round trip, pools by model, shipped files, YAML errors.

use super::testing::*;
use super::*;

#[test]
fn defaults_from_minimal_config() {
    let c = parse(POOL).unwrap();
    assert_eq!(c.source, PathBuf::from("t.yaml"));
    assert_eq!(c.listen, vec!["127.0.0.1:8000".to_string()]);
    assert_eq!(c.metrics_listen, None);
    assert_eq!(c.timeouts, Timeouts::default());
    assert_eq!(c.timeouts.connect, Duration::from_secs(2));
    assert_eq!(c.timeouts.response_header, Duration::from_secs(120));
    assert_eq!(c.timeouts.stream_idle, Duration::from_secs(60));
    assert_eq!(c.max_retries, 2);
    assert_eq!(c.max_body_bytes, 32 * 1024 * 1024);
    assert_eq!(c.pools.len(), 1);
    let p = &c.pools[0];
    assert_eq!(p.name, "a");
    assert_eq!(p.models, vec!["*".to_string()]);
    assert_eq!(p.policy.kind(), Policy::LoadAware);
    assert_eq!(p.max_in_flight_per_endpoint, None);
    assert_eq!(
        p.health_check,
        HealthCheckConfig {
            path: "/health".into(),
            interval: Duration::from_secs(2),
            timeout: Duration::from_secs(1),
            healthy_after: 2,
            unhealthy_after: 2,
            route_when_all_unhealthy: true,
        }
    );
    assert_eq!(
        p.prefill,
        PrefillConfig {
            bytes_per_token: 4.0,
            max_tokens: 262_144,
            tokens_per_image: 1500,
        }
    );
    assert_eq!(p.policy.sessions(), None);
    assert_eq!(p.engine_stats, None);
    assert_eq!(
        PrefixConfig::default(),
        PrefixConfig {
            block_bytes: 64,
            min_match_bytes: 256,
            capacity_tokens_per_endpoint: 1_000_000,
            fallback: PrefixFallback::LeastInflight,
        }
    );
    let ep = &p.endpoints[0];
    assert_eq!(ep.url, "http://127.0.0.1:8101");
    assert_eq!(ep.label, "127.0.0.1:8101");
    assert_eq!(ep.host, "127.0.0.1");
    assert_eq!(ep.addr, "127.0.0.1:8101".parse().unwrap());
    assert_eq!(ep.api_key, None);

    let s = c.server_conf();
    assert_eq!(s.grace_period_seconds, Some(30));
    assert_eq!(s.graceful_shutdown_timeout_seconds, Some(5));
    assert_eq!(s.threads, 2);
    assert_eq!(s.pid_file, "/tmp/infergate.pid");
    assert_eq!(s.upgrade_sock, "/tmp/infergate_upgrade.sock");
}

#[test]
fn full_config_round_trip() {
    let key_file = temp_file("full-key", "  file-secret\n");
    std::env::set_var("INFERGATE_TEST_FULL_KEY", "env-secret");
    let text = format!(
        r#"
listen: ["127.0.0.1:8000", "localhost:8001"]
metrics_listen: "127.0.0.1:9090"
server:
  threads: 4
  pid_file: /tmp/x.pid
  work_stealing: false
  client_bind_to_ipv4: ["127.0.0.1"]
timeouts: {{ connect: 500ms, response_header: 30s, stream_idle: 1m }}
max_retries: 0
max_body_bytes: 1KiB
pools:
  - name: chat
    models: ["llama-3", "qwen"]
    policy: load_aware
    max_in_flight_per_endpoint: 64
    endpoints:
      - url: "http://127.0.0.1:8101"
        api_key_env: INFERGATE_TEST_FULL_KEY
      - url: "http://localhost:8102/"
        api_key_file: {key_file}
      - "http://[::1]:8103"
      - url: http://127.0.0.1
    health_check: {{ path: /ready, interval: 3s, timeout: 250ms, healthy_after: 1, unhealthy_after: 3, route_when_all_unhealthy: false }}
    prefill: {{ bytes_per_token: 3.5, max_tokens: 8192, tokens_per_image: 256 }}
    sessions: {{ header: X-Conversation, ttl: 10m, max_sessions: 5 }}
    engine_stats: {{ kind: sglang, interval: 500ms }}
  - name: rest
    models: ["*"]
    policy: prefix_aware
    endpoints:
      - url: http://127.0.0.1:8201
    engine_stats: {{ kind: vllm, path: /stats, metric_prefix: "x:" }}
    prefix: {{ block_bytes: 32, min_match_bytes: 0, capacity_tokens_per_endpoint: 5, fallback: qps }}
"#,
        key_file = key_file.display()
    );
    let c = parse(&text).unwrap();
    assert_eq!(c.listen, vec!["127.0.0.1:8000", "localhost:8001"]);
    assert_eq!(c.metrics_listen.as_deref(), Some("127.0.0.1:9090"));
    assert_eq!(
        c.timeouts,
        Timeouts {
            connect: Duration::from_millis(500),
            response_header: Duration::from_secs(30),
            stream_idle: Duration::from_secs(60),
            request_body: Duration::from_secs(60),
            ..Timeouts::default()
        }
    );
    assert_eq!(c.max_retries, 0);
    assert_eq!(c.max_body_bytes, 1024);
    let s = c.server_conf();
    assert_eq!(s.threads, 4);
    assert_eq!(s.pid_file, "/tmp/x.pid");
    assert!(!s.work_stealing);
    assert_eq!(s.client_bind_to_ipv4, vec!["127.0.0.1".to_string()]);
    assert_eq!(s.grace_period_seconds, Some(30));
    assert_eq!(s.upgrade_sock, "/tmp/infergate_upgrade.sock");

    let p = &c.pools[0];
    assert_eq!(p.models, vec!["llama-3", "qwen"]);
    assert_eq!(p.max_in_flight_per_endpoint, Some(64));
    assert_eq!(p.endpoints[0].api_key.as_deref(), Some("env-secret"));
    assert_eq!(p.endpoints[1].api_key.as_deref(), Some("file-secret"));
    assert_eq!(p.endpoints[1].label, "localhost:8102");
    assert_eq!(p.endpoints[1].host, "localhost");
    assert!(
        p.endpoints[1].addr.is_ipv4(),
        "IPv4 preferred: {}",
        p.endpoints[1].addr
    );
    assert_eq!(p.endpoints[2].label, "[::1]:8103");
    assert_eq!(p.endpoints[2].host, "[::1]");
    assert_eq!(p.endpoints[2].addr, "[::1]:8103".parse().unwrap());
    assert_eq!(p.endpoints[3].label, "127.0.0.1:80");
    assert_eq!(p.endpoints[3].addr, "127.0.0.1:80".parse().unwrap());
    assert_eq!(p.health_check.path, "/ready");
    assert_eq!(p.health_check.timeout, Duration::from_millis(250));
    assert_eq!(p.health_check.healthy_after, 1);
    assert_eq!(p.health_check.unhealthy_after, 3);
    assert!(!p.health_check.route_when_all_unhealthy);
    assert_eq!(
        p.prefill,
        PrefillConfig {
            bytes_per_token: 3.5,
            max_tokens: 8192,
            tokens_per_image: 256,
        }
    );
    assert_eq!(
        p.policy.sessions(),
        Some(&SessionsConfig {
            headers: vec![http::HeaderName::from_static("x-conversation")],
            ttl: Duration::from_secs(600),
            max_sessions: 5,
            move_margin: 0.1,
            prompt_cache_key: false,
        })
    );
    assert_eq!(
        p.engine_stats,
        Some(EngineStatsConfig {
            kind: EngineKind::Sglang,
            path: "/metrics".into(),
            interval: Duration::from_millis(500),
            metric_prefix: "sglang:".into(),
        })
    );
    let r = &c.pools[1];
    assert_eq!(r.policy.kind(), Policy::PrefixAware);
    assert_eq!(
        r.engine_stats,
        Some(EngineStatsConfig {
            kind: EngineKind::Vllm,
            path: "/stats".into(),
            interval: Duration::from_secs(1),
            metric_prefix: "x:".into(),
        })
    );
    assert_eq!(
        r.policy,
        PolicyConfig::PrefixAware {
            prefix: PrefixConfig {
                block_bytes: 32,
                min_match_bytes: 0,
                capacity_tokens_per_endpoint: 5,
                fallback: PrefixFallback::Qps
            }
        }
    );

    assert_eq!(c.pool_for_model(Some("qwen")), Some(0));
    assert_eq!(c.pool_for_model(Some("other")), Some(1));
    assert_eq!(c.pool_for_model(None), Some(1));
    let _ = std::fs::remove_file(key_file);
}

#[test]
fn pool_for_model_rules() {
    let two = "pools:\n  - name: a\n    models: [m1]\n    endpoints: [\"http://127.0.0.1:1\"]\n  - name: b\n    models: [m2]\n    endpoints: [\"http://127.0.0.1:2\"]\n";
    let c = parse(two).unwrap();
    assert_eq!(c.pool_for_model(Some("m1")), Some(0));
    assert_eq!(c.pool_for_model(Some("m2")), Some(1));
    assert_eq!(c.pool_for_model(Some("m3")), None);
    assert_eq!(c.pool_for_model(None), None);

    let one = "pools:\n  - name: a\n    models: [m1]\n    endpoints: [\"http://127.0.0.1:1\"]\n";
    let c = parse(one).unwrap();
    assert_eq!(c.pool_for_model(None), Some(0));
    assert_eq!(c.pool_for_model(Some("m1")), Some(0));
    assert_eq!(c.pool_for_model(Some("zzz")), None);

    let wild = "pools:\n  - name: a\n    models: [m1]\n    endpoints: [\"http://127.0.0.1:1\"]\n  - name: b\n    models: [\"*\"]\n    endpoints: [\"http://127.0.0.1:2\"]\n";
    let c = parse(wild).unwrap();
    assert_eq!(c.pool_for_model(Some("m1")), Some(0));
    assert_eq!(c.pool_for_model(Some("zzz")), Some(1));
    assert_eq!(c.pool_for_model(None), Some(1));
}

#[test]
fn shipped_config_files_parse() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../conf");
    let example = Config::load(&dir.join("infergate.yaml")).unwrap_or_else(|e| panic!("{e}"));
    assert!(!example.pools.is_empty());
    let demo = Config::load(&dir.join("demo.yaml")).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(demo.listen, vec!["127.0.0.1:8000"]);
    assert_eq!(demo.metrics_listen.as_deref(), Some("127.0.0.1:9090"));
    assert_eq!(demo.pools.len(), 1);
    let p = &demo.pools[0];
    assert_eq!(p.name, "default");
    assert_eq!(p.policy.kind(), Policy::PredictedTtft);
    assert_eq!(
        p.policy.sessions().map(|s| s.headers.clone()),
        Some(vec![http::HeaderName::from_static("x-session-id")])
    );
    assert!(p.engine_stats.is_some());
    let labels: Vec<&str> = p.endpoints.iter().map(|e| e.label.as_str()).collect();
    assert_eq!(
        labels,
        [
            "127.0.0.1:8101",
            "127.0.0.1:8102",
            "127.0.0.1:8103",
            "127.0.0.1:8104"
        ]
    );
    let s = demo.server_conf();
    assert_eq!(s.grace_period_seconds, Some(2));
    assert!(s.pid_file.starts_with("/tmp/"));
    assert!(s.upgrade_sock.starts_with("/tmp/"));
}

#[test]
fn unreadable_file() {
    let e = Config::load(Path::new("/nonexistent/infergate.yaml")).unwrap_err();
    assert_eq!(e.key, "");
    assert!(
        e.to_string()
            .starts_with("/nonexistent/infergate.yaml: cannot read: "),
        "{e}"
    );
}

#[test]
fn bad_yaml_has_line_and_column() {
    let msg = assert_err(
        "listen: \"127.0.0.1:8000\"\npools: [\n  - a: b\n",
        "",
        &["invalid YAML", "line"],
    );
    assert!(msg.contains("column"), "{msg}");
    assert_err(
        "pools: []\npools: []\n",
        "",
        &["invalid YAML: duplicate entry with key \"pools\" (in the mapping that starts at line 1 column 1)"],
    );
}

#[test]
fn top_level_must_be_a_mapping() {
    assert_err(
        "- a\n- b\n",
        "",
        &["top level must be a mapping", "found a list"],
    );
    assert_err(
        "just text\n",
        "",
        &["top level must be a mapping", "found a string"],
    );
    assert_err("# only a comment\n", "", &["no settings", "pools"]);
}

#[test]
fn listen_addresses() {
    let c = parse(&format!("listen: localhost:8000\n{POOL}")).unwrap();
    assert_eq!(c.listen, vec!["localhost:8000"]);
    let c = parse(&format!("listen: [\"0.0.0.0:80\", \"[::1]:81\"]\n{POOL}")).unwrap();
    assert_eq!(c.listen, vec!["0.0.0.0:80", "[::1]:81"]);
    assert_err(
        &format!("listen: nonsense\n{POOL}"),
        "listen",
        &["invalid listen address `nonsense`", "host:port"],
    );
    assert_err(
        &format!("listen: 127.0.0.1\n{POOL}"),
        "listen",
        &["invalid listen address `127.0.0.1`"],
    );
    assert_err(
        &format!("listen: \":8000\"\n{POOL}"),
        "listen",
        &["invalid listen address `:8000`"],
    );
    assert_err(
        &format!("listen: [\"127.0.0.1:1\", \"a:b\"]\n{POOL}"),
        "listen[1]",
        &["invalid listen address `a:b`"],
    );
    assert_err(
        &format!("listen: no-such-host.invalid:80\n{POOL}"),
        "listen",
        &["cannot resolve host `no-such-host.invalid`"],
    );
    assert_err(
        &format!("listen: []\n{POOL}"),
        "listen",
        &["at least one address"],
    );
    assert_err(
        &format!("listen: [\"127.0.0.1:1\", \"127.0.0.1:1\"]\n{POOL}"),
        "listen[1]",
        &["listed twice"],
    );
    assert_err(
        &format!("metrics_listen: \"9090\"\n{POOL}"),
        "metrics_listen",
        &["invalid listen address `9090`"],
    );
    assert_err(
        &format!("metrics_listen: \"127.0.0.1:8000\"\n{POOL}"),
        "metrics_listen",
        &["also in `listen`"],
    );
    assert_eq!(
        parse(&format!("metrics_listen:\n{POOL}"))
            .unwrap()
            .metrics_listen,
        None
    );
}

#[test]
fn yaml_merge_keys_are_applied() {
    let text =
        "x-common: &common\n  policy: least_request\n  endpoints: [\"http://127.0.0.1:1\"]\n";
    // Anchors at the top level would be an unknown key; merges work inside the pools list.
    assert_err(&format!("{text}{POOL}"), "x-common", &["unknown key"]);
    let c = parse(
        "pools:\n  - &a\n    name: a\n    models: [m]\n    policy: least_request\n    endpoints: [\"http://127.0.0.1:1\"]\n  - <<: *a\n    name: b\n    models: [n]\n",
    )
    .unwrap();
    assert_eq!(c.pools[1].policy.kind(), Policy::LeastRequest);
    assert_eq!(c.pools[1].endpoints[0].label, "127.0.0.1:1");
}
