//! The `auth` section: client API keys (`keys_file` or `keys_env`, one `name:key` per entry) and per-key `limits`.

use std::fmt;

use serde_norway::Value;

use super::walk::read_keys;
use super::walk::{Field, Node};
use super::ConfigError;

/// Shortest accepted client key: a short key can be guessed.
pub const MIN_KEY_LEN: usize = 16;

/// Client authentication (the `auth` section). Absent = auth off.
#[derive(Debug, Clone, PartialEq)]
pub struct AuthConfig {
    /// Where the keys came from, for log lines: the keys file's path or `$VAR`.
    pub source: String,
    /// Every client key with its resolved limits, in file order.
    pub keys: Vec<ClientKey>,
}

/// One client: its name (the metric label; from the config only, so cardinality stays bounded), its secret and
/// its limits (defaults with the per-key overrides applied).
#[derive(Clone, PartialEq)]
pub struct ClientKey {
    pub name: String,
    pub secret: String,
    pub limits: KeyLimits,
}

impl fmt::Debug for ClientKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Never print the key.
        f.debug_struct("ClientKey")
            .field("name", &self.name)
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

/// A key's limits; None = unlimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct KeyLimits {
    pub requests_per_minute: Option<u64>,
    /// Estimated prompt tokens per minute (body bytes / the pool's `prefill.bytes_per_token`).
    pub prompt_tokens_per_minute: Option<u64>,
    pub concurrent_requests: Option<u64>,
    /// The key's TTFT budget in pools with `ttft_budget` (`config::ttft_budget`).
    pub ttft_budget: Option<std::time::Duration>,
}

const LIMIT_KEYS: [&str; 3] = [
    "requests_per_minute",
    "prompt_tokens_per_minute",
    "concurrent_requests",
];

impl AuthConfig {
    pub(super) fn read(n: Node<'_>) -> Result<AuthConfig, ConfigError> {
        read_keys!(n; keys_file, keys_env, limits);
        let (source, entries) = match (keys_file.value(), keys_env.value()) {
            (Some(_), Some(_)) => {
                return Err(keys_env.err("set either keys_file or keys_env, not both"))
            }
            (None, None) => {
                return Err(n.err(
                    "needs keys_file or keys_env (remove the `auth` section to turn authentication off)",
                ))
            }
            (Some(_), None) => {
                let path = keys_file.string()?.trim();
                if path.is_empty() {
                    return Err(keys_file.err("must not be empty"));
                }
                let text = std::fs::read_to_string(path)
                    .map_err(|e| keys_file.err(format!("cannot read {path}: {e}")))?;
                let entries = parse_keys(&text, false)
                    .map_err(|e| keys_file.err(e.located(path, "line")))?;
                (path.to_string(), entries)
            }
            (None, Some(_)) => {
                let var = keys_env.string()?.trim();
                let text = std::env::var(var).map_err(|_| {
                    keys_env.err(format!("environment variable `{var}` is not set (or not UTF-8)"))
                })?;
                let entries = parse_keys(&text, true)
                    .map_err(|e| keys_env.err(e.located(&format!("${var}"), "entry")))?;
                (format!("${var}"), entries)
            }
        };
        let (default, per_key) = read_limits(limits.section()?)?;
        let mut keys: Vec<ClientKey> = entries
            .into_iter()
            .map(|e| ClientKey {
                name: e.name,
                secret: e.secret,
                limits: default,
            })
            .collect();
        for (name, f, overrides) in per_key {
            let Some(k) = keys.iter_mut().find(|k| k.name == name) else {
                return Err(f.err_in("name", format!("no key named `{name}` in {source}")));
            };
            k.limits = overrides.over(default);
        }
        Ok(AuthConfig { source, keys })
    }
}

/// One override of `per_key`: Some(None) = unlimited, Some(Some(n)) = n, None = the default; the same for the
/// TTFT budget.
#[derive(Debug, Clone, Copy, Default)]
struct Overrides(
    [Option<Option<u64>>; 3],
    Option<Option<std::time::Duration>>,
);

impl Overrides {
    fn over(self, d: KeyLimits) -> KeyLimits {
        let [r, t, c] = self.0;
        KeyLimits {
            requests_per_minute: r.unwrap_or(d.requests_per_minute),
            prompt_tokens_per_minute: t.unwrap_or(d.prompt_tokens_per_minute),
            concurrent_requests: c.unwrap_or(d.concurrent_requests),
            ttft_budget: self.1.unwrap_or(d.ttft_budget),
        }
    }
}

/// A key's `ttft_budget`: absent = the default, empty = none, else a duration longer than 0.
fn budget_value(f: &Field<'_>) -> Result<Option<Option<std::time::Duration>>, ConfigError> {
    match f.value() {
        None => Ok(None),
        Some(Value::Null) => Ok(Some(None)),
        Some(_) => {
            // A zero duration is refused by the duration reader itself.
            Ok(Some(Some(f.duration_or(std::time::Duration::ZERO)?)))
        }
    }
}

/// A limit: absent = `None` (not given), empty = `Some(None)` (unlimited), else a count of at least 1.
fn limit_value(f: &Field<'_>) -> Result<Option<Option<u64>>, ConfigError> {
    match f.value() {
        None => Ok(None),
        Some(Value::Null) => Ok(Some(None)),
        Some(_) => {
            let n = f.uint()?;
            if n == 0 {
                return Err(f.err("must be at least 1 (leave the value empty for no limit)"));
            }
            Ok(Some(Some(n)))
        }
    }
}

fn limit_fields(fields: &[Field<'_>; 3], budget: &Field<'_>) -> Result<Overrides, ConfigError> {
    let mut o = Overrides::default();
    for (slot, f) in o.0.iter_mut().zip(fields) {
        *slot = limit_value(f)?;
    }
    o.1 = budget_value(budget)?;
    Ok(o)
}

type PerKey<'a> = Vec<(String, Field<'a>, Overrides)>;

/// For `SECTIONS`: the reader of `auth.limits`.
pub(super) fn read_limits_section(n: Node<'_>) -> Result<(), ConfigError> {
    read_limits(n).map(drop)
}

/// `auth.limits`: the defaults of every key, then `per_key` overrides.
fn read_limits(n: Node<'_>) -> Result<(KeyLimits, PerKey<'_>), ConfigError> {
    let [rpm, tpm, conc, budget, per_key] = n.keys([
        LIMIT_KEYS[0],
        LIMIT_KEYS[1],
        LIMIT_KEYS[2],
        "ttft_budget",
        "per_key",
    ])?;
    let default = limit_fields(&[rpm, tpm, conc], &budget)?.over(KeyLimits::default());
    let seq = match per_key.value() {
        None | Some(Value::Null) => return Ok((default, Vec::new())),
        Some(Value::Sequence(seq)) => seq,
        Some(other) => {
            return Err(per_key.type_err("a list of `{ name: ..., <limits> }` mappings", other))
        }
    };
    let mut out: PerKey<'_> = Vec::new();
    for (i, v) in seq.iter().enumerate() {
        let item = per_key.item(i, v);
        let (name, overrides) = read_key_limits(item.section()?)?;
        if let Some(j) = out.iter().position(|(n, _, _)| *n == name) {
            return Err(item.err_in(
                "name",
                format!("`{name}` already has limits ({}[{j}])", per_key.path()),
            ));
        }
        out.push((name, item, overrides));
    }
    Ok((default, out))
}

/// One item of `auth.limits.per_key`.
fn read_key_limits(n: Node<'_>) -> Result<(String, Overrides), ConfigError> {
    let [name, rpm, tpm, conc, budget] = n.keys([
        "name",
        LIMIT_KEYS[0],
        LIMIT_KEYS[1],
        LIMIT_KEYS[2],
        "ttft_budget",
    ])?;
    let s = name.string()?.trim().to_string();
    if !valid_name(&s) {
        return Err(name.err(format!(
            "`{s}` is not a key name (letters, digits, `_`, `.`, `-`)"
        )));
    }
    Ok((s, limit_fields(&[rpm, tpm, conc], &budget)?))
}

/// For `SECTIONS`: the reader of a `per_key` item.
pub(super) fn read_key_limits_section(n: Node<'_>) -> Result<(), ConfigError> {
    read_key_limits(n).map(drop)
}

/// One parsed `name:key` entry.
#[derive(Debug, PartialEq)]
pub(super) struct KeyEntry {
    pub name: String,
    pub secret: String,
    pub line: usize,
}

/// Why a keys text was rejected: the line (or entry) number, 0 for the whole text, and a reason that never
/// contains key text.
#[derive(Debug, PartialEq)]
pub(super) struct KeysError {
    pub line: usize,
    pub reason: String,
}

impl KeysError {
    /// "{source} line N: reason" (`unit` is "line" or "entry").
    fn located(&self, source: &str, unit: &str) -> String {
        match self.line {
            0 => format!("{source}: {}", self.reason),
            n => format!("{source} {unit} {n}: {}", self.reason),
        }
    }
}

pub(super) fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

/// Parse `name:key` entries: one per line (and, with `semicolons`, also `;`-separated); surrounding whitespace
/// trimmed; blank entries and entries starting with `#` ignored. The key is everything after the first `:`.
/// Names and keys must be unique. Reasons name lines and key names, never key text.
pub(super) fn parse_keys(text: &str, semicolons: bool) -> Result<Vec<KeyEntry>, KeysError> {
    let items: Vec<&str> = if semicolons {
        text.split(['\n', ';']).collect()
    } else {
        text.split('\n').collect()
    };
    let mut out: Vec<KeyEntry> = Vec::new();
    for (i, raw) in items.iter().enumerate() {
        let line = i + 1;
        let item = raw.trim();
        if item.is_empty() || item.starts_with('#') {
            continue;
        }
        let err = |reason: String| KeysError { line, reason };
        let Some((name, secret)) = item.split_once(':') else {
            return Err(err("expected `name:key` (no `:` found)".into()));
        };
        if !valid_name(name) {
            return Err(err(
                "the name before the first `:` may hold only letters, digits, `_`, `.` and `-`"
                    .into(),
            ));
        }
        if secret.is_empty() {
            return Err(err(format!("the key of `{name}` is empty")));
        }
        if secret.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(err(format!(
                "the key of `{name}` contains whitespace or a control character"
            )));
        }
        if secret.chars().count() < MIN_KEY_LEN {
            return Err(err(format!(
                "the key of `{name}` is shorter than {MIN_KEY_LEN} characters"
            )));
        }
        if let Some(first) = out.iter().find(|e| e.name == name) {
            return Err(err(format!(
                "duplicate name `{name}` (first on line {})",
                first.line
            )));
        }
        if let Some(first) = out.iter().find(|e| e.secret == secret) {
            return Err(err(format!(
                "the key of `{name}` is the same as the key of `{}` (line {}); every client needs its own key",
                first.name, first.line
            )));
        }
        out.push(KeyEntry {
            name: name.to_string(),
            secret: secret.to_string(),
            line,
        });
    }
    if out.is_empty() {
        return Err(KeysError {
            line: 0,
            reason: "no keys (every entry is blank or a comment); every request would be refused"
                .into(),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::testing::*;

    const K1: &str = "k1-0123456789abcdef";
    const K2: &str = "k2-0123456789abcdef";

    fn keys_file(name: &str, text: &str) -> std::path::PathBuf {
        temp_file(name, text)
    }

    #[test]
    fn parses_names_keys_comments_and_blank_lines() {
        let e = parse_keys(
            &format!("# clients\n\n  alice:{K1}  \nbob.ci-2:{K2}:with:colons\n"),
            false,
        )
        .unwrap();
        assert_eq!(e.len(), 2);
        assert_eq!(
            (e[0].name.as_str(), e[0].secret.as_str(), e[0].line),
            ("alice", K1, 3)
        );
        assert_eq!(e[1].name, "bob.ci-2");
        assert_eq!(e[1].secret, format!("{K2}:with:colons"));
        let env = parse_keys(&format!("a:{K1};b:{K2}\n"), true).unwrap();
        assert_eq!(env.len(), 2);
        // Without `semicolons` a `;` is part of the key.
        let one = parse_keys(&format!("a:{K1};b:{K2}"), false).unwrap();
        assert_eq!(one.len(), 1);
    }

    #[test]
    fn rejects_bad_entries_without_echoing_keys() {
        let cases = [
            (format!("a:{K1}\n{K2}\n"), 2, "no `:`"),
            (format!("bad name:{K1}\n"), 1, "may hold only letters"),
            ("a:\n".to_string(), 1, "key of `a` is empty"),
            ("a:short\n".to_string(), 1, "shorter than 16"),
            (format!("a:{K1} x\n"), 1, "whitespace"),
            (
                format!("a:{K1}\nb:{K2}\na:{K2}x\n"),
                3,
                "duplicate name `a` (first on line 1)",
            ),
            (
                format!("a:{K1}\nb:{K1}\n"),
                2,
                "the key of `b` is the same as the key of `a` (line 1)",
            ),
            ("# nothing\n\n".to_string(), 0, "no keys"),
        ];
        for (text, line, needle) in cases {
            let e = parse_keys(&text, false).unwrap_err();
            assert_eq!(e.line, line, "{text:?}: {e:?}");
            assert!(e.reason.contains(needle), "{text:?}: {e:?}");
            assert!(
                !e.reason.contains("0123456789"),
                "key text leaked: {}",
                e.reason
            );
        }
    }

    #[test]
    fn auth_section_from_file_with_limits() {
        let f = keys_file("auth-ok", &format!("alice:{K1}\nbatch:{K2}\n"));
        let c = parse(&format!(
            "auth:\n  keys_file: {}\n  limits:\n    requests_per_minute: 600\n    concurrent_requests: 8\n    \
             ttft_budget: 2s\n    per_key:\n      - {{ name: batch, prompt_tokens_per_minute: 5000, concurrent_requests: , \
             ttft_budget: }}\n{POOL}",
            f.display()
        ))
        .unwrap();
        let a = c.auth.unwrap();
        assert_eq!(a.source, f.display().to_string());
        assert_eq!(a.keys[0].name, "alice");
        assert_eq!(
            a.keys[0].limits,
            KeyLimits {
                requests_per_minute: Some(600),
                prompt_tokens_per_minute: None,
                concurrent_requests: Some(8),
                ttft_budget: Some(std::time::Duration::from_secs(2)),
            }
        );
        assert_eq!(
            a.keys[1].limits,
            KeyLimits {
                requests_per_minute: Some(600),
                prompt_tokens_per_minute: Some(5000),
                concurrent_requests: None,
                ttft_budget: None,
            }
        );
        assert!(
            !format!("{a:?}").contains("0123456789"),
            "Debug shows no key"
        );
        let _ = std::fs::remove_file(f);
    }

    #[test]
    fn auth_from_environment() {
        std::env::set_var("INFERGATE_TEST_CLIENT_KEYS", format!("a:{K1}; b:{K2}"));
        let c = parse(&format!(
            "auth: {{ keys_env: INFERGATE_TEST_CLIENT_KEYS }}\n{POOL}"
        ))
        .unwrap();
        let a = c.auth.unwrap();
        assert_eq!(a.source, "$INFERGATE_TEST_CLIENT_KEYS");
        assert_eq!(a.keys.len(), 2);
        assert_eq!(a.keys[1].secret, K2);
        std::env::set_var("INFERGATE_TEST_CLIENT_KEYS_BAD", format!("a:{K1};a:{K2}"));
        assert_err(
            &format!("auth: {{ keys_env: INFERGATE_TEST_CLIENT_KEYS_BAD }}\n{POOL}"),
            "auth.keys_env",
            &["$INFERGATE_TEST_CLIENT_KEYS_BAD entry 2: duplicate name `a`"],
        );
        assert_err(
            &format!("auth: {{ keys_env: INFERGATE_TEST_CLIENT_KEYS_UNSET }}\n{POOL}"),
            "auth.keys_env",
            &["`INFERGATE_TEST_CLIENT_KEYS_UNSET` is not set"],
        );
    }

    #[test]
    fn auth_errors_name_the_file_line_and_key_path() {
        let f = keys_file("auth-dup", &format!("a:{K1}\n\nb:{K1}\n"));
        let msg = assert_err(
            &format!("auth:\n  keys_file: {}\n{POOL}", f.display()),
            "auth.keys_file",
            &[&format!(
                "{} line 3: the key of `b` is the same as the key of `a`",
                f.display()
            )],
        );
        assert!(!msg.contains(K1));
        let _ = std::fs::remove_file(f);
        assert_err(
            &format!("auth: {{ keys_file: /nonexistent/keys }}\n{POOL}"),
            "auth.keys_file",
            &["cannot read /nonexistent/keys"],
        );
        assert_err(
            &format!("auth: {{}}\n{POOL}"),
            "auth",
            &["needs keys_file or keys_env"],
        );
        assert_err(
            &format!("auth: {{ keys_file: /x, keys_env: Y }}\n{POOL}"),
            "auth.keys_env",
            &["not both"],
        );
        let f = keys_file("auth-limits", &format!("a:{K1}\n"));
        let with = |limits: &str| {
            format!(
                "auth:\n  keys_file: {}\n  limits: {limits}\n{POOL}",
                f.display()
            )
        };
        assert_err(
            &with("{ per_key: [ { name: zed, requests_per_minute: 1 } ] }"),
            "auth.limits.per_key[0].name",
            &["no key named `zed`"],
        );
        assert_err(
            &with("{ requests_per_minute: 0 }"),
            "auth.limits.requests_per_minute",
            &["at least 1"],
        );
        assert_err(
            &with("{ per_key: [ { name: a }, { name: a } ] }"),
            "auth.limits.per_key[1].name",
            &["already has limits"],
        );
        assert_err(
            &with("{ per_key: [ { name: a, rpm: 5 } ] }"),
            "auth.limits.per_key[0].rpm",
            &["unknown key `rpm`"],
        );
        assert_err(
            &with("{ tokens_per_minute: 5 }"),
            "auth.limits.tokens_per_minute",
            &["did you mean `prompt_tokens_per_minute`?"],
        );
        let _ = std::fs::remove_file(f);
    }
}
