//! `state_file` (top level): where session bindings are saved for the next instance (restart or graceful upgrade).

use std::path::PathBuf;
use std::time::Duration;

use super::access_log::file_path;
use super::walk::read_keys;
use super::walk::{Field, Node};
use super::ConfigError;

/// How often the bindings are written while running, by default.
pub const DEFAULT_STATE_INTERVAL: Duration = Duration::from_secs(10);

/// Session bindings saved to a file (absent from the file: nothing is saved or loaded).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StateFileConfig {
    /// Absolute path of the file (a relative one is made absolute when the config is loaded).
    pub path: PathBuf,
    /// Written every `interval` while running, and at a graceful shutdown or upgrade.
    pub interval: Duration,
}

impl StateFileConfig {
    /// `state_file`: absent or null = off; a string is the path; a mapping needs `path`.
    pub(super) fn read_optional(f: &Field<'_>) -> Result<Option<StateFileConfig>, ConfigError> {
        match f.value() {
            None | Some(serde_norway::Value::Null) => Ok(None),
            Some(serde_norway::Value::String(s)) => Ok(Some(StateFileConfig {
                path: file_path(f, s.trim())?,
                interval: DEFAULT_STATE_INTERVAL,
            })),
            Some(_) => StateFileConfig::read(f.section()?).map(Some),
        }
    }

    pub(super) fn read(n: Node<'_>) -> Result<StateFileConfig, ConfigError> {
        read_keys!(n; path, interval);
        let text = path.string()?.trim();
        Ok(StateFileConfig {
            path: file_path(&path, text)?,
            interval: interval.duration_or(DEFAULT_STATE_INTERVAL)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::testing::*;

    #[test]
    fn off_by_default_path_required() {
        assert_eq!(parse(POOL).unwrap().state_file, None);
        assert_eq!(
            parse(&format!("state_file:\n{POOL}")).unwrap().state_file,
            None
        );
        let c = parse(&format!(
            "state_file: {{ path: /run/infergate/sessions.state }}\n{POOL}"
        ))
        .unwrap();
        assert_eq!(
            c.state_file,
            Some(StateFileConfig {
                path: "/run/infergate/sessions.state".into(),
                interval: Duration::from_secs(10),
            })
        );
        let short = parse(&format!("state_file: /tmp/s.state\n{POOL}")).unwrap();
        assert_eq!(
            short.state_file.map(|s| (s.path, s.interval)),
            Some(("/tmp/s.state".into(), DEFAULT_STATE_INTERVAL))
        );
        let c = parse(&format!(
            "state_file: {{ path: s.state, interval: 500ms }}\n{POOL}"
        ))
        .unwrap()
        .state_file
        .unwrap();
        assert_eq!(c.path, std::env::current_dir().unwrap().join("s.state"));
        assert_eq!(c.interval, Duration::from_millis(500));
    }

    #[test]
    fn bad_values_name_their_key() {
        assert_err(
            &format!("state_file: {{ interval: 1s }}\n{POOL}"),
            "state_file.path",
            &["required key is missing"],
        );
        assert_err(
            &format!("state_file: [/tmp/x]\n{POOL}"),
            "state_file",
            &["expected a mapping"],
        );
        assert_err(
            &format!("state_file: {{ path: /tmp/x, interval: 0s }}\n{POOL}"),
            "state_file.interval",
            &["greater than zero"],
        );
        assert_err(
            &format!("state_file: {{ path: /tmp/x, intervall: 1s }}\n{POOL}"),
            "state_file.intervall",
            &["did you mean `interval`?"],
        );
    }
}
