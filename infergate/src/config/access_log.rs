//! `access_log` (top level): one line per request, text or JSON, to stderr or a file; and `endpoint_header`, whether
//! responses name the endpoint that served them.

use std::path::PathBuf;

use super::walk::read_keys;
use super::walk::{Field, Node};
use super::ConfigError;

/// Lines waiting for the writer by default; past it lines are dropped and counted.
pub const DEFAULT_BUFFER_LINES: usize = 8192;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// `key=value` pairs (logfmt), values quoted when they need it.
    Text,
    /// One JSON object per line.
    Json,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LogTarget {
    Stderr,
    /// Appended to; an absolute path (a relative one is made absolute when the file is loaded).
    File(PathBuf),
}

/// The access log (absent from the file: no access log).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccessLogConfig {
    pub format: LogFormat,
    pub target: LogTarget,
    /// Lines queued for the writer thread at most; a full queue drops lines (counted), never blocks a request.
    pub buffer_lines: usize,
}

impl Default for AccessLogConfig {
    fn default() -> Self {
        AccessLogConfig {
            format: LogFormat::Text,
            target: LogTarget::Stderr,
            buffer_lines: DEFAULT_BUFFER_LINES,
        }
    }
}

impl AccessLogConfig {
    /// `access_log`: absent = off; present (even empty or null) = on, inner keys defaulted.
    pub(super) fn read_optional(f: &Field<'_>) -> Result<Option<AccessLogConfig>, ConfigError> {
        match f.optional_section()? {
            None => Ok(None),
            Some(n) => AccessLogConfig::read(n).map(Some),
        }
    }

    pub(super) fn read(n: Node<'_>) -> Result<AccessLogConfig, ConfigError> {
        read_keys!(n; format, path, buffer_lines);
        let d = AccessLogConfig::default();
        let format = match format.value() {
            None => d.format,
            Some(_) => match format.string()?.trim() {
                "text" => LogFormat::Text,
                "json" => LogFormat::Json,
                other => {
                    return Err(
                        format.err(format!("unknown format `{other}`; expected text or json"))
                    )
                }
            },
        };
        let target = match path.value() {
            None => d.target,
            Some(_) => match path.string()?.trim() {
                "stderr" => LogTarget::Stderr,
                other => LogTarget::File(file_path(&path, other)?),
            },
        };
        Ok(AccessLogConfig {
            format,
            target,
            buffer_lines: super::values::to_usize(buffer_lines.positive_or(d.buffer_lines as u64)?),
        })
    }
}

/// A file path for the router to write: not empty, made absolute against the working directory now (a daemon
/// changes directory later).
pub(super) fn file_path(f: &Field<'_>, text: &str) -> Result<PathBuf, ConfigError> {
    if text.is_empty() {
        return Err(f.err("must not be empty"));
    }
    if text.ends_with('/') {
        return Err(f.err(format!("`{text}` names a directory; give a file path")));
    }
    std::path::absolute(text).map_err(|e| f.err(format!("cannot make `{text}` absolute: {e}")))
}

/// `endpoint_header`: true (default) names the serving endpoint (`host:port`) in `x-infergate-endpoint`.
pub(super) fn endpoint_header(f: &Field<'_>) -> Result<bool, ConfigError> {
    f.bool_or(true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::testing::*;

    #[test]
    fn off_by_default_and_stderr_text_when_present() {
        let c = parse(POOL).unwrap();
        assert_eq!(c.access_log, None);
        assert!(c.endpoint_header);
        for empty in ["access_log: {}\n", "access_log:\n"] {
            let c = parse(&format!("{empty}{POOL}")).unwrap();
            assert_eq!(c.access_log, Some(AccessLogConfig::default()), "{empty}");
        }
        let c = parse(&format!(
            "access_log: {{ format: json, path: /var/log/infergate/access.log, buffer_lines: 10 }}\nendpoint_header: false\n{POOL}"
        ))
        .unwrap();
        assert_eq!(
            c.access_log,
            Some(AccessLogConfig {
                format: LogFormat::Json,
                target: LogTarget::File("/var/log/infergate/access.log".into()),
                buffer_lines: 10,
            })
        );
        assert!(!c.endpoint_header);
    }

    #[test]
    fn relative_paths_become_absolute() {
        let c = parse(&format!("access_log: {{ path: logs/a.log }}\n{POOL}")).unwrap();
        let want = std::env::current_dir().unwrap().join("logs/a.log");
        assert_eq!(c.access_log.unwrap().target, LogTarget::File(want));
    }

    #[test]
    fn bad_values_name_their_key() {
        assert_err(
            &format!("access_log: {{ format: xml }}\n{POOL}"),
            "access_log.format",
            &["unknown format `xml`; expected text or json"],
        );
        assert_err(
            &format!("access_log: {{ path: \"\" }}\n{POOL}"),
            "access_log.path",
            &["must not be empty"],
        );
        assert_err(
            &format!("access_log: {{ path: /var/log/ }}\n{POOL}"),
            "access_log.path",
            &["names a directory"],
        );
        assert_err(
            &format!("access_log: {{ buffer_lines: 0 }}\n{POOL}"),
            "access_log.buffer_lines",
            &["at least 1"],
        );
        assert_err(
            &format!("access_log: {{ fromat: json }}\n{POOL}"),
            "access_log.fromat",
            &["did you mean `format`?"],
        );
        assert_err(
            &format!("access_log: stderr\n{POOL}"),
            "access_log",
            &["expected a mapping"],
        );
        assert_err(
            &format!("endpoint_header: off\n{POOL}"),
            "endpoint_header",
            &["expected true or false, found a string"],
        );
    }
}
