//! Helpers for the config modules' unit tests: parse a snippet, check an error's key path and reason.

use std::path::{Path, PathBuf};

use super::{Config, ConfigError};

pub(super) const POOL: &str =
    "pools:\n  - name: a\n    endpoints:\n      - url: http://127.0.0.1:8101\n";

pub(super) fn parse(text: &str) -> Result<Config, ConfigError> {
    Config::parse(Path::new("t.yaml"), text)
}

/// Asserts the error's key path and that its reason contains every needle; returns the full message.
#[track_caller]
pub(super) fn assert_err(text: &str, key: &str, needles: &[&str]) -> String {
    let e = match parse(text) {
        Ok(_) => panic!("expected an error for:\n{text}"),
        Err(e) => e,
    };
    let msg = e.to_string();
    assert_eq!(e.key, key, "wrong key in `{msg}`");
    for n in needles {
        assert!(e.reason.contains(n), "`{msg}` does not contain `{n}`");
    }
    let prefix = if key.is_empty() {
        "t.yaml: ".to_string()
    } else {
        format!("t.yaml: {key}: ")
    };
    assert!(
        msg.starts_with(&prefix),
        "`{msg}` does not start with `{prefix}`"
    );
    msg
}

/// One pool `a` with one endpoint and the given extra pool-level YAML (indented by 4).
pub(super) fn pool_with(extra: &str) -> String {
    format!("{POOL}{extra}")
}

/// One pool `a` whose single endpoint has the given extra endpoint-level YAML (indented by 8).
pub(super) fn endpoint_with(extra: &str) -> String {
    format!("{POOL}{extra}")
}

pub(super) fn temp_file(name: &str, contents: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!(
        "infergate-config-test-{}-{name}",
        std::process::id()
    ));
    std::fs::write(&p, contents).unwrap();
    p
}
