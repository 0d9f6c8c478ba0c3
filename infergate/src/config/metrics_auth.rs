//! `metrics_auth` (top level): the bearer token that guards `/metrics`, `/status` and `/status.json` on
//! `metrics_listen`, and the explicit opt-out a listener beyond loopback needs without one.

use std::net::ToSocketAddrs;

use super::auth::MIN_KEY_LEN;
use super::walk::read_keys;
use super::walk::{secret_from_file, Field, Node};
use super::ConfigError;

/// The metrics port's access rule. The default (section absent): no token, which only a loopback listener accepts.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct MetricsAuthConfig {
    /// The token file as written (for log lines); None = no token.
    pub token_file: Option<String>,
    /// The token read from `token_file` when the file was loaded (again on every reload).
    pub token: Option<String>,
    /// Serve `/metrics` and the status page without a token on a listener beyond loopback.
    pub allow_unauthenticated: bool,
}

impl std::fmt::Debug for MetricsAuthConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the token.
        f.debug_struct("MetricsAuthConfig")
            .field("token_file", &self.token_file)
            .field("allow_unauthenticated", &self.allow_unauthenticated)
            .finish_non_exhaustive()
    }
}

impl MetricsAuthConfig {
    /// `metrics_auth` for the metrics listener `listen` (None: no metrics listener); `listen_field` is where the
    /// listener was configured, named when an open listener is refused.
    pub(super) fn read_for(
        f: &Field<'_>,
        listen: Option<&str>,
        listen_field: &Field<'_>,
    ) -> Result<MetricsAuthConfig, ConfigError> {
        let cfg = match f.optional_section()? {
            None => MetricsAuthConfig::default(),
            Some(n) => MetricsAuthConfig::read(n)?,
        };
        if let Some(addr) = listen {
            if cfg.token.is_none() && !cfg.allow_unauthenticated && !is_loopback(addr) {
                return Err(listen_field.err(format!(
                    "`{addr}` is reachable beyond this host and /metrics, /status and /status.json would \
                     answer anyone without authentication: set `metrics_auth.token_file` (a file holding a \
                     bearer token) or, to serve them unauthenticated on purpose, \
                     `metrics_auth.allow_unauthenticated: true` (or bind it to 127.0.0.1)"
                )));
            }
        }
        Ok(cfg)
    }

    pub(super) fn read(n: Node<'_>) -> Result<MetricsAuthConfig, ConfigError> {
        read_keys!(n; token_file, allow_unauthenticated);
        let allow = allow_unauthenticated.bool_or(false)?;
        let token = match token_file.value() {
            None | Some(serde_norway::Value::Null) => None,
            Some(_) => Some(token(&token_file)?),
        };
        if allow && token.is_some() {
            return Err(allow_unauthenticated.err(
                "contradicts `token_file`: with a token every request needs it; remove one of the two",
            ));
        }
        Ok(MetricsAuthConfig {
            token_file: token
                .is_some()
                .then(|| token_file.string().map(|s| s.trim().to_string()))
                .transpose()?,
            token,
            allow_unauthenticated: allow,
        })
    }
}

impl MetricsAuthConfig {
    /// What a reload from `self` to `new` does to the metrics port, for the reload's log line (never the token);
    /// None when neither has a token.
    pub fn reload_note(&self, new: &MetricsAuthConfig) -> Option<String> {
        let file = new.token_file.as_deref().unwrap_or_default();
        match (&self.token, &new.token) {
            (None, None) => None,
            (None, Some(_)) => Some(format!("metrics token turned on (from {file})")),
            (Some(_), None) => Some(
                "metrics token turned off: /metrics, /status and /status.json answer without one"
                    .into(),
            ),
            (Some(old), Some(now)) if old == now => {
                Some(format!("metrics token re-read from {file} (unchanged)"))
            }
            (Some(_), Some(_)) => Some(format!(
                "metrics token re-read from {file} (changed: the old one is refused from now on)"
            )),
        }
    }
}

/// The token in the file `f` names: one line of visible ASCII (it travels in an `Authorization` header), at
/// least [`MIN_KEY_LEN`] characters.
fn token(f: &Field<'_>) -> Result<String, ConfigError> {
    let token = secret_from_file(f)?;
    let file = f.string()?.trim();
    if !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(f.err(format!(
            "`{file}` must hold one token of visible ASCII characters (no spaces, no second line)"
        )));
    }
    if token.len() < MIN_KEY_LEN {
        return Err(f.err(format!(
            "the token in `{file}` is shorter than {MIN_KEY_LEN} characters (easy to guess); e.g. \
             `openssl rand -hex 32 > {file}`"
        )));
    }
    Ok(token)
}

/// Every address `addr` ("host:port") resolves to is a loopback address.
pub fn is_loopback(addr: &str) -> bool {
    match addr.to_socket_addrs() {
        Ok(addrs) => {
            let addrs: Vec<_> = addrs.collect();
            !addrs.is_empty() && addrs.iter().all(|a| a.ip().is_loopback())
        }
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::testing::*;

    const TOKEN: &str = "0123456789abcdef0123456789abcdef";

    #[test]
    fn loopback_listeners() {
        assert!(is_loopback("127.0.0.1:8000"));
        assert!(is_loopback("[::1]:8000"));
        assert!(!is_loopback("0.0.0.0:8000"));
        assert!(!is_loopback("[::]:8000"));
        assert!(!is_loopback("10.1.2.3:8000"));
    }

    #[test]
    fn loopback_needs_nothing_and_beyond_it_needs_a_token_or_the_opt_out() {
        let c = parse(&format!("metrics_listen: 127.0.0.1:9090\n{POOL}")).unwrap();
        assert_eq!(c.metrics_auth, MetricsAuthConfig::default());
        for addr in ["0.0.0.0:9090", "[::]:9090"] {
            let msg = assert_err(
                &format!("metrics_listen: \"{addr}\"\n{POOL}"),
                "metrics_listen",
                &[
                    addr,
                    "metrics_auth.token_file",
                    "metrics_auth.allow_unauthenticated: true",
                ],
            );
            assert!(msg.contains("without authentication"), "{msg}");
        }
        let c = parse(&format!(
            "metrics_listen: 0.0.0.0:9090\nmetrics_auth: {{ allow_unauthenticated: true }}\n{POOL}"
        ))
        .unwrap();
        assert!(c.metrics_auth.allow_unauthenticated);
        assert_eq!(c.metrics_auth.token, None);
        // No metrics listener: nothing to guard.
        assert!(parse(POOL).unwrap().metrics_auth.token.is_none());
    }

    #[test]
    fn the_token_is_read_from_its_file_and_never_shown() {
        let f = temp_file("metrics-token", &format!("{TOKEN}\n"));
        let c = parse(&format!(
            "metrics_listen: 0.0.0.0:9090\nmetrics_auth:\n  token_file: {}\n{POOL}",
            f.display()
        ))
        .unwrap();
        assert_eq!(c.metrics_auth.token.as_deref(), Some(TOKEN));
        assert_eq!(
            c.metrics_auth.token_file.as_deref(),
            Some(f.to_str().unwrap())
        );
        assert!(!c.metrics_auth.allow_unauthenticated);
        let shown = format!("{:?}", c.metrics_auth);
        assert!(
            !shown.contains(TOKEN) && shown.contains("token_file"),
            "{shown}"
        );
        let _ = std::fs::remove_file(f);
    }

    #[test]
    fn a_reload_says_what_became_of_the_token_without_showing_it() {
        let with = |token: &str| MetricsAuthConfig {
            token_file: Some("/etc/infergate/metrics-token".into()),
            token: Some(token.into()),
            allow_unauthenticated: false,
        };
        let none = MetricsAuthConfig::default();
        let other = "fedcba9876543210fedcba9876543210";
        assert_eq!(none.reload_note(&none), None);
        let notes = [
            none.reload_note(&with(TOKEN)),
            with(TOKEN).reload_note(&with(TOKEN)),
            with(TOKEN).reload_note(&with(other)),
            with(TOKEN).reload_note(&none),
        ]
        .map(Option::unwrap);
        assert_eq!(
            notes[..3],
            [
                "metrics token turned on (from /etc/infergate/metrics-token)",
                "metrics token re-read from /etc/infergate/metrics-token (unchanged)",
                "metrics token re-read from /etc/infergate/metrics-token (changed: the old one is refused \
                 from now on)",
            ]
        );
        assert!(notes[3].starts_with("metrics token turned off"));
        assert!(notes
            .iter()
            .all(|n| !n.contains(TOKEN) && !n.contains(other)));
    }

    #[test]
    fn bad_tokens_and_contradictions_name_the_key() {
        let missing = assert_err(
            &format!("metrics_auth: {{ token_file: /nonexistent/token }}\n{POOL}"),
            "metrics_auth.token_file",
            &["cannot read `/nonexistent/token`"],
        );
        assert!(!missing.contains(TOKEN));
        for (name, text, needle) in [
            ("short", "abc\n", "shorter than 16"),
            ("spaces", "0123456789 abcdef0123\n", "visible ASCII"),
            (
                "lines",
                "0123456789abcdef\n0123456789abcdef\n",
                "no second line",
            ),
            ("empty", "\n", "is empty"),
        ] {
            let f = temp_file(&format!("metrics-token-{name}"), text);
            let msg = assert_err(
                &format!("metrics_auth: {{ token_file: {} }}\n{POOL}", f.display()),
                "metrics_auth.token_file",
                &[needle],
            );
            assert!(!msg.contains("0123456789"), "the token shown: {msg}");
            let _ = std::fs::remove_file(f);
        }
        let f = temp_file("metrics-token-both", TOKEN);
        assert_err(
            &format!(
                "metrics_auth: {{ token_file: {}, allow_unauthenticated: true }}\n{POOL}",
                f.display()
            ),
            "metrics_auth.allow_unauthenticated",
            &["contradicts `token_file`"],
        );
        let _ = std::fs::remove_file(f);
        assert_err(
            &format!("metrics_auth: {{ allow_unauthenticated: yes }}\n{POOL}"),
            "metrics_auth.allow_unauthenticated",
            &["true or false"],
        );
        assert_err(
            &format!("metrics_auth: {{ token: {TOKEN} }}\n{POOL}"),
            "metrics_auth.token",
            &["unknown key"],
        );
    }
}
