//! Every file in conf/test-bad/ is rejected with a message naming the file, the key path and the reason.

use std::path::{Path, PathBuf};

use infergate::config::Config;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../conf/test-bad")
        .join(name)
}

const CASES: &[(&str, &str)] = &[
    (
        "unknown_key.yaml",
        "pools[0].health_check.intervall: unknown key `intervall`; did you mean `interval`?",
    ),
    (
        "bare_duration.yaml",
        "timeouts.connect: expected a duration with a unit, found the bare number 2",
    ),
    (
        "tls_without_https.yaml",
        "pools[0].tls: applies to `https://` endpoints, and this pool has none",
    ),
    (
        "sessions_round_robin.yaml",
        "pools[0].sessions: sessions require policy load_aware or predicted_ttft",
    ),
    ("bad_yaml.yaml", "invalid YAML"),
    ("no_pools.yaml", "pools: at least one pool is required"),
    (
        "two_wildcards.yaml",
        "pools[1].models[0]: only one pool may use \"*\"",
    ),
];

#[test]
fn bad_fixtures_are_rejected_with_clear_messages() {
    for (name, expected) in CASES {
        let path = fixture(name);
        let msg = match Config::load(&path) {
            Ok(_) => panic!("{name} was accepted"),
            Err(e) => e.to_string(),
        };
        let prefix = format!("{}: ", path.display());
        assert!(
            msg.starts_with(&prefix),
            "{name}: `{msg}` does not start with the file name"
        );
        assert!(
            msg.contains(expected),
            "{name}: `{msg}` does not contain `{expected}`"
        );
    }
}

#[test]
fn every_fixture_is_covered() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../conf/test-bad");
    for entry in std::fs::read_dir(dir).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        assert!(
            CASES.iter().any(|(n, _)| *n == name),
            "conf/test-bad/{name} has no expectation in CASES"
        );
    }
}

#[test]
fn shipped_configs_load() {
    for name in ["infergate.yaml", "demo.yaml"] {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../conf")
            .join(name);
        if let Err(e) = Config::load(&path) {
            panic!("{e}");
        }
    }
}
