//! Unit tests of the YAML walker: every section's reader asks for its keys, unknown keys and wrong types are worded.

use crate::config::testing::*;

#[test]
fn every_section_reader_asks_for_its_keys() {
    let homes = super::key_homes();
    assert_eq!(homes.len(), crate::config::SECTIONS.len());
    for (home, keys) in &homes {
        assert!(!keys.is_empty(), "the reader of {home} asked for no keys");
        let mut distinct = keys.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(distinct.len(), keys.len(), "{home}: {keys:?}");
    }
    let keys_of = |home: &str| &homes.iter().find(|(h, _)| *h == home).unwrap().1;
    assert!(keys_of("the top level").contains(&"pools"));
    assert!(keys_of("server").contains(&"threads"));
    assert!(keys_of("sessions").contains(&"ttl"));
    assert!(keys_of("an endpoint (pools[N].endpoints[M])").contains(&"api_key_file"));
}

#[test]
fn unknown_keys_name_the_path_and_suggest() {
    assert_err(
        &format!("listn: x\n{POOL}"),
        "listn",
        &["unknown key `listn`; did you mean `listen`?"],
    );
    assert_err(
        &pool_with("    health_check: { intervall: 2s }\n"),
        "pools[0].health_check.intervall",
        &["unknown key `intervall`; did you mean `interval`?"],
    );
    assert_err(
        &endpoint_with("        api_key_evn: X\n"),
        "pools[0].endpoints[0].api_key_evn",
        &["did you mean `api_key_env`?"],
    );
    assert_err(
        &pool_with("    polcy: qps\n"),
        "pools[0].polcy",
        &["did you mean `policy`?"],
    );
    assert_err(
        &format!("timeouts: {{ conect: 1s }}\n{POOL}"),
        "timeouts.conect",
        &["did you mean `connect`?"],
    );
    assert_err(
        &pool_with("    sessions: { headr: x }\n"),
        "pools[0].sessions.headr",
        &["did you mean `header`?"],
    );
    assert_err(
        &pool_with("    engine_stats: { knd: vllm }\n"),
        "pools[0].engine_stats.knd",
        &["did you mean `kind`?"],
    );
    assert_err(
        &pool_with("    prefix: { fallbak: qps }\n"),
        "pools[0].prefix.fallbak",
        &["did you mean `fallback`?"],
    );
    assert_err(
        &pool_with("    prefill: { max_token: 1 }\n"),
        "pools[0].prefill.max_token",
        &["did you mean `max_tokens`?"],
    );
    assert_err(
        &format!("server: {{ thread: 2 }}\n{POOL}"),
        "server.thread",
        &["did you mean `threads`?"],
    );
    assert_err(
        &format!("zzz: 1\n{POOL}"),
        "zzz",
        &["unknown key `zzz`; known keys here: listen, metrics_listen"],
    );
    assert_err(
        &format!("1: x\n{POOL}"),
        "1",
        &["keys must be strings, found a number"],
    );
    assert_err(
        &pool_with("    interval: 2s\n"),
        "pools[0].interval",
        &["unknown key `interval` here; `interval` belongs in health_check or engine_stats"],
    );
    assert_err(
        &format!("endpoints: []\n{POOL}"),
        "endpoints",
        &["`endpoints` belongs in a pool (pools[N])"],
    );
    assert_err(
        &format!("timeout: 1s\n{POOL}"),
        "timeout",
        &["did you mean `timeouts`? (or move it: `timeout` belongs in health_check)"],
    );
}

#[test]
fn wrong_types() {
    assert_err(
        &format!("max_retries: two\n{POOL}"),
        "max_retries",
        &["expected an integer, found a string"],
    );
    assert_err(
        &format!("max_retries: -1\n{POOL}"),
        "max_retries",
        &["expected a non-negative integer, found -1"],
    );
    assert_err(
        &format!("max_retries: 1.5\n{POOL}"),
        "max_retries",
        &["expected an integer, found 1.5"],
    );
    assert_err(
        "pools:\n  - name: 5\n    endpoints: [\"http://127.0.0.1:1\"]\n",
        "pools[0].name",
        &["expected a string, found a number"],
    );
    assert_err(
        &format!("listen: 8000\n{POOL}"),
        "listen",
        &["expected a string or a list of strings, found a number"],
    );
    assert_err(
        &format!("timeouts: 5s\n{POOL}"),
        "timeouts",
        &["expected a mapping, found a string"],
    );
    assert_err(
        "pools: {a: 1}\n",
        "pools",
        &["expected a list of pools, found a mapping"],
    );
    assert_err(
        &pool_with("    models: gpt\n"),
        "pools[0].models",
        &["expected a list of model names, found a string"],
    );
    assert_err(
        &format!("server: {{ threads: two }}\n{POOL}"),
        "server.threads",
        &["expected an integer, found a string"],
    );
    assert_err(
        &format!("server: {{ daemon: 1 }}\n{POOL}"),
        "server.daemon",
        &["expected true or false, found a number"],
    );
    assert_err(
        &pool_with("    prefill: { bytes_per_token: four }\n"),
        "pools[0].prefill.bytes_per_token",
        &["expected a number, found a string"],
    );
    assert_err(
        "pools:\n  - name: a\n    endpoints:\n      - 5\n",
        "pools[0].endpoints[0]",
        &["found a number"],
    );
}
