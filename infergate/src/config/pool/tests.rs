//! Unit tests of the pool keys: structure and routing errors, endpoint API keys, numeric limits.

use crate::config::testing::*;

#[test]
fn pool_structure_errors() {
    assert_err(
        "listen: \"127.0.0.1:8000\"\n",
        "pools",
        &["at least one pool is required"],
    );
    assert_err("pools: []\n", "pools", &["at least one pool is required"]);
    assert_err(
        "pools:\n  - name: a\n",
        "pools[0].endpoints",
        &["at least one endpoint is required"],
    );
    assert_err(
        "pools:\n  - name: a\n    endpoints: []\n",
        "pools[0].endpoints",
        &["at least one endpoint is required"],
    );
    assert_err(
        "pools:\n  - endpoints: [\"http://127.0.0.1:1\"]\n",
        "pools[0].name",
        &["required key is missing"],
    );
    assert_err(
        "pools:\n  - name: \"\"\n    endpoints: [\"http://127.0.0.1:1\"]\n",
        "pools[0].name",
        &["must not be empty"],
    );
    assert_err(
        "pools:\n  -\n",
        "pools[0]",
        &["expected a mapping, found nothing"],
    );
    assert_err(
        "pools:\n  - name: a\n    models: [x]\n    endpoints: [\"http://127.0.0.1:1\"]\n  - name: a\n    models: [y]\n    endpoints: [\"http://127.0.0.1:2\"]\n",
        "pools[1].name",
        &["duplicate pool name `a` (also pools[0])"],
    );
    assert_err(
        "pools:\n  - name: a\n    endpoints:\n      - http://127.0.0.1:8101\n      - url: http://127.0.0.1:8102\n      - url: http://127.0.0.1:8101/\n",
        "pools[0].endpoints[2].url",
        &["duplicate endpoint `127.0.0.1:8101` (also pools[0].endpoints[0])"],
    );
    assert_err(
        "pools:\n  - name: a\n    endpoints: [\"http://localhost\", \"http://LOCALHOST:80\"]\n",
        "pools[0].endpoints[1].url",
        &["duplicate endpoint"],
    );
}

#[test]
fn model_routing_conflicts() {
    assert_err(
        "pools:\n  - name: a\n    endpoints: [\"http://127.0.0.1:1\"]\n  - name: b\n    endpoints: [\"http://127.0.0.1:2\"]\n",
        "pools[1].models[0]",
        &["only one pool may use \"*\"; pool `a` already catches all other models"],
    );
    assert_err(
        "pools:\n  - name: a\n    models: [m, n]\n    endpoints: [\"http://127.0.0.1:1\"]\n  - name: b\n    models: [o, n]\n    endpoints: [\"http://127.0.0.1:2\"]\n",
        "pools[1].models[1]",
        &["model `n` is already served by pool `a`"],
    );
    assert_err(
        &pool_with("    models: []\n"),
        "pools[0].models",
        &["at least one model name"],
    );
    assert_err(
        &pool_with("    models: [m, m]\n"),
        "pools[0].models[1]",
        &["listed twice"],
    );
}

#[test]
fn api_key_env_errors() {
    assert_err(
        &endpoint_with("        api_key_env: INFERGATE_TEST_SURELY_UNSET_VAR\n"),
        "pools[0].endpoints[0].api_key_env",
        &["environment variable `INFERGATE_TEST_SURELY_UNSET_VAR` is not set"],
    );
    std::env::set_var("INFERGATE_TEST_EMPTY_KEY", "  ");
    assert_err(
        &endpoint_with("        api_key_env: INFERGATE_TEST_EMPTY_KEY\n"),
        "pools[0].endpoints[0].api_key_env",
        &["environment variable `INFERGATE_TEST_EMPTY_KEY` is empty"],
    );
}

#[test]
fn api_key_file_errors() {
    assert_err(
        &endpoint_with("        api_key_file: /nonexistent/key\n"),
        "pools[0].endpoints[0].api_key_file",
        &["cannot read `/nonexistent/key`"],
    );
    let empty = temp_file("empty-key", "\n  \n");
    assert_err(
        &endpoint_with(&format!("        api_key_file: {}\n", empty.display())),
        "pools[0].endpoints[0].api_key_file",
        &["is empty"],
    );
    let spaced = temp_file("spaced-key", "topsecret value\n");
    let msg = assert_err(
        &endpoint_with(&format!("        api_key_file: {}\n", spaced.display())),
        "pools[0].endpoints[0].api_key_file",
        &["cannot be sent in a header"],
    );
    assert!(!msg.contains("topsecret"), "key leaked: {msg}");
    let good = temp_file("good-key", "k-123\n");
    let c = parse(&endpoint_with(&format!(
        "        api_key_file: {}\n",
        good.display()
    )))
    .unwrap();
    assert_eq!(c.pools[0].endpoints[0].api_key.as_deref(), Some("k-123"));
    for f in [empty, spaced, good] {
        let _ = std::fs::remove_file(f);
    }
}

#[test]
fn api_key_env_and_file_together() {
    std::env::set_var("INFERGATE_TEST_BOTH_KEY", "secret-both");
    let msg = assert_err(
        &endpoint_with(
            "        api_key_env: INFERGATE_TEST_BOTH_KEY\n        api_key_file: /etc/hostname\n",
        ),
        "pools[0].endpoints[0]",
        &["set either `api_key_env` or `api_key_file`, not both"],
    );
    assert!(!msg.contains("secret-both"));
}

#[test]
fn endpoint_debug_hides_the_api_key() {
    std::env::set_var("INFERGATE_TEST_DEBUG_KEY", "debug-secret");
    let c = parse(&endpoint_with(
        "        api_key_env: INFERGATE_TEST_DEBUG_KEY\n",
    ))
    .unwrap();
    let ep = &c.pools[0].endpoints[0];
    assert_eq!(ep.api_key.as_deref(), Some("debug-secret"));
    let compact = [format!("{ep:?}"), format!("{:?}", c.pools[0])];
    for shown in &compact {
        assert!(shown.contains(r#"api_key: Some("***")"#), "{shown}");
    }
    for shown in compact
        .iter()
        .chain(&[format!("{ep:#?}"), format!("{c:#?}")])
    {
        assert!(!shown.contains("debug-secret"), "key leaked: {shown}");
        assert!(shown.contains(r#""***""#), "{shown}");
        assert!(shown.contains("127.0.0.1:8101"), "{shown}");
    }
    let plain = parse(POOL).unwrap();
    assert!(format!("{:?}", plain.pools[0].endpoints[0]).contains("api_key: None"));
}

#[test]
fn numeric_limits() {
    let pf = "pools[0].prefill.bytes_per_token";
    assert_err(
        &pool_with("    prefill: { bytes_per_token: 0 }\n"),
        pf,
        &["greater than 0"],
    );
    assert_err(
        &pool_with("    prefill: { bytes_per_token: -1.5 }\n"),
        pf,
        &["greater than 0"],
    );
    let images = |v: &str| {
        parse(&pool_with(&format!(
            "    prefill: {{ tokens_per_image: {v} }}\n"
        )))
    };
    assert_eq!(images("0").unwrap().pools[0].prefill.tokens_per_image, 0);
    assert_eq!(
        images("2560").unwrap().pools[0].prefill.tokens_per_image,
        2560
    );
    assert!(images("1.5")
        .unwrap_err()
        .to_string()
        .contains("pools[0].prefill.tokens_per_image"));
    assert_err(
        &pool_with("    prefill: { max_tokens: 0 }\n"),
        "pools[0].prefill.max_tokens",
        &["at least 1"],
    );
    assert_err(
        &pool_with("    health_check: { healthy_after: 0 }\n"),
        "pools[0].health_check.healthy_after",
        &["at least 1"],
    );
    assert_err(
        &pool_with("    health_check: { route_when_all_unhealthy: \"no\" }\n"),
        "pools[0].health_check.route_when_all_unhealthy",
        &["true or false"],
    );
    assert_err(
        &pool_with("    health_check: { unhealthy_after: 0 }\n"),
        "pools[0].health_check.unhealthy_after",
        &["at least 1"],
    );
    assert_err(
        &pool_with("    max_in_flight_per_endpoint: 0\n"),
        "pools[0].max_in_flight_per_endpoint",
        &["at least 1"],
    );
    assert_err(
        &pool_with("    prefix: { block_bytes: 0 }\n"),
        "pools[0].prefix.block_bytes",
        &["at least 1"],
    );
}

#[test]
fn kv_events_keys_defaults_and_errors() {
    use crate::config::{Config, KvEventsConfig};
    let ok = "pools:\n  - name: a\n    kv_events: { stale_after: 3s, block_size: 16 }\n    endpoints:\n      - url: http://127.0.0.1:8101\n        kv_events: tcp://10.0.0.5:5557\n      - url: http://127.0.0.1:8102\n        kv_events: { endpoint: \"tcp://*:5558\", bind: true, replay: tcp://10.0.0.6:5600 }\n      - http://127.0.0.1:8103\n";
    let cfg = Config::parse(std::path::Path::new("t.yaml"), ok).unwrap();
    let p = &cfg.pools[0];
    let a = p.kv_subscription("127.0.0.1:8101").unwrap();
    assert_eq!((a.bind, a.block_size, a.topic.as_str()), (false, 16, "kv"));
    assert_eq!(a.stale_after, std::time::Duration::from_secs(3));
    let b = p.kv_subscription("127.0.0.1:8102").unwrap();
    assert_eq!(
        (b.bind, b.replay.as_deref()),
        (true, Some("tcp://10.0.0.6:5600"))
    );
    assert_eq!(p.kv_subscription("127.0.0.1:8103"), None);
    assert_eq!(KvEventsConfig::default().block_size, 128);
    let ep = |kv: &str| {
        format!("pools:\n  - name: a\n    endpoints:\n      - url: http://127.0.0.1:8101\n        kv_events: {kv}\n")
    };
    assert_err(
        &ep("http://10.0.0.5:5557"),
        "pools[0].endpoints[0].kv_events",
        &["is not a tcp:// address"],
    );
    assert_err(
        &ep("tcp://10.0.0.5"),
        "pools[0].endpoints[0].kv_events",
        &["has no port"],
    );
    assert_err(
        &ep("\"tcp://*:5557\""),
        "pools[0].endpoints[0].kv_events",
        &["a `*` host can only be bound"],
    );
    assert_err(
        &ep("{ endpoint: tcp://h:1, replay: \"tcp://*:2\" }"),
        "pools[0].endpoints[0].kv_events.replay",
        &["needs a host"],
    );
    assert_err(
        "pools:\n  - name: a\n    endpoints:\n      - { url: http://127.0.0.1:1, kv_events: tcp://h:9 }\n      - { url: http://127.0.0.1:2, kv_events: tcp://h:9 }\n",
        "pools[0].endpoints[1].kv_events",
        &["already endpoints[0]'s"],
    );
    assert_err(
        "pools:\n  - name: a\n    kv_events: { block_size: 0 }\n    endpoints: [http://127.0.0.1:1]\n",
        "pools[0].kv_events.block_size",
        &["must be at least 1"],
    );
    assert_err(
        "pools:\n  - name: a\n    kv_events: { stale: 1s }\n    endpoints: [http://127.0.0.1:1]\n",
        "pools[0].kv_events.stale",
        &["did you mean `stale_after`"],
    );
}
