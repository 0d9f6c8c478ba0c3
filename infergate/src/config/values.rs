//! Value syntaxes shared by the sections: durations, byte sizes, URL paths, endpoint URLs and listen addresses.

use std::net::{SocketAddr, ToSocketAddrs};
use std::time::Duration;

use serde_norway::Value;

use super::walk::Field;
use super::ConfigError;

impl Field<'_> {
    /// A duration with a unit (`500ms`, `2s`, `2h`), greater than zero; `default` when absent.
    pub(super) fn duration_or(&self, default: Duration) -> Result<Duration, ConfigError> {
        let d = self.duration_or_off(default)?;
        if d.is_zero() {
            return Err(self.err("must be greater than zero"));
        }
        Ok(d)
    }

    /// A duration with a unit, where `0s` turns the setting off; `default` when absent.
    pub(super) fn duration_or_off(&self, default: Duration) -> Result<Duration, ConfigError> {
        let d = match self.value() {
            None => return Ok(default),
            Some(Value::String(s)) => humantime::parse_duration(s.trim()).map_err(|e| {
                self.err(format!("invalid duration `{s}`: {e}; write a number with a unit such as `500ms`, `2s` or `2h`"))
            })?,
            Some(Value::Number(n)) => {
                return Err(self.err(format!("expected a duration with a unit, found the bare number {n}; add a unit, e.g. `{n}s` or `{n}ms`")))
            }
            Some(other) => return Err(self.type_err("a duration such as `2s`", other)),
        };
        Ok(d)
    }

    /// A size (`32MiB`, see [`parse_byte_size`]) or a number of bytes, greater than zero; `default` when absent.
    pub(super) fn byte_size_or(&self, default: usize) -> Result<usize, ConfigError> {
        let n = match self.value() {
            None => return Ok(default),
            Some(Value::Number(_)) => self.uint()?,
            Some(Value::String(s)) => parse_byte_size(s).map_err(|r| self.err(r))?,
            Some(other) => {
                return Err(self.type_err("a size such as `32MiB` or a number of bytes", other))
            }
        };
        if n == 0 {
            return Err(self.err("must be greater than zero"));
        }
        Ok(to_usize(n))
    }

    /// `true` or `false`; `default` when absent.
    pub(super) fn bool_or(&self, default: bool) -> Result<bool, ConfigError> {
        match self.value() {
            None => Ok(default),
            Some(Value::Bool(b)) => Ok(*b),
            Some(other) => Err(self.type_err("true or false", other)),
        }
    }

    /// An HTTP request path that must start with "/"; `default` when absent.
    pub(super) fn url_path_or(&self, default: &str) -> Result<String, ConfigError> {
        if self.value().is_none() {
            return Ok(default.to_string());
        }
        let s = self.string()?.trim();
        if !s.starts_with('/') {
            return Err(self.err(format!("`{s}` must start with \"/\" (e.g. `{default}`)")));
        }
        if s.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(self.err(format!("`{s}` must not contain whitespace")));
        }
        Ok(s.to_string())
    }
}

pub(super) fn to_usize(n: u64) -> usize {
    usize::try_from(n).unwrap_or(usize::MAX)
}

/// Parse "http[s]://host[:port][/]" into (host as written, port, https). IPv6 hosts keep their brackets.
pub(super) fn parse_http_url(url: &str) -> Result<(String, u16, bool), String> {
    const EXAMPLE: &str = "e.g. `http://10.0.0.5:8000`";
    let (rest, https) = match url.split_once("://") {
        Some((scheme, rest)) if scheme.eq_ignore_ascii_case("http") => (rest, false),
        Some((scheme, rest)) if scheme.eq_ignore_ascii_case("https") => (rest, true),
        Some((scheme, _)) => {
            return Err(format!(
                "unsupported scheme `{scheme}`; expected an http:// or https:// URL ({EXAMPLE})"
            ))
        }
        None => return Err(format!("expected an http:// URL ({EXAMPLE})")),
    };
    let (authority, tail) = match rest.find(['/', '?', '#']) {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    if !(tail.is_empty() || tail == "/") {
        return Err(format!(
            "unexpected path `{tail}` after the host; give only http://host:port (request paths such as /v1/completions are forwarded as sent)"
        ));
    }
    if authority.contains('@') {
        return Err(
            "credentials in the URL are not supported; use api_key_env or api_key_file".to_string(),
        );
    }
    let (host, port) = if let Some(after_bracket) = authority.strip_prefix('[') {
        let end = after_bracket
            .find(']')
            .ok_or_else(|| "unterminated IPv6 address (missing `]`)".to_string())?;
        let inner = &after_bracket[..end];
        if inner.parse::<std::net::Ipv6Addr>().is_err() {
            return Err(format!("invalid IPv6 address `[{inner}]`"));
        }
        let after = &after_bracket[end + 1..];
        let port = match after {
            "" => None,
            p => Some(
                p.strip_prefix(':')
                    .ok_or_else(|| format!("unexpected `{p}` after the IPv6 address"))?,
            ),
        };
        (&authority[..end + 2], port)
    } else {
        match authority.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (authority, None),
        }
    };
    if host.is_empty() {
        return Err(format!("missing host ({EXAMPLE})"));
    }
    if !host.starts_with('[')
        && !host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_'))
    {
        return Err(format!("invalid host `{host}`"));
    }
    let port = match port {
        None if https => 443,
        None => 80,
        Some("") => return Err("missing port after `:`".to_string()),
        Some(p) => match p.parse::<u16>() {
            Ok(n) if n > 0 => n,
            _ => return Err(format!("bad port `{p}`; expected a number from 1 to 65535")),
        },
    };
    Ok((host.to_string(), port, https))
}

/// Resolve `host` (as written; IPv6 in brackets) to one address, preferring IPv4.
pub(super) fn resolve(host: &str, port: u16) -> Result<SocketAddr, String> {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let addrs: Vec<SocketAddr> = (bare, port)
        .to_socket_addrs()
        .map_err(|e| format!("cannot resolve host `{host}`: {e}"))?
        .collect();
    addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or_else(|| addrs.first())
        .copied()
        .ok_or_else(|| format!("cannot resolve host `{host}`: no addresses"))
}

/// A listen address must be host:port (IP or resolvable name, e.g. `localhost:8000`, `[::1]:8000`).
pub(super) fn check_listen_addr(addr: &str) -> Result<(), String> {
    if addr.parse::<SocketAddr>().is_ok() {
        return Ok(());
    }
    let bad =
        || format!("invalid listen address `{addr}`: expected host:port such as 127.0.0.1:8000");
    let (host, port) = addr.rsplit_once(':').ok_or_else(bad)?;
    if host.is_empty() || port.parse::<u16>().is_err() || host.contains(['/', ' ']) {
        return Err(bad());
    }
    let found = addr
        .to_socket_addrs()
        .map_err(|e| format!("invalid listen address `{addr}`: cannot resolve host `{host}`: {e}"))?
        .next()
        .is_some();
    if !found {
        return Err(format!(
            "invalid listen address `{addr}`: host `{host}` has no addresses"
        ));
    }
    Ok(())
}

/// "32MiB", "1.5 GB", "1024" (bytes). Units: B, KB, KiB, MB, MiB, GB, GiB (case-insensitive).
pub(super) fn parse_byte_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let bad = |why: &str| {
        format!("invalid size `{s}`: {why}; write e.g. `32MiB`, `512KB` or a number of bytes")
    };
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    if num.is_empty() {
        return Err(bad("missing number"));
    }
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "kb" => 1_000,
        "kib" => 1 << 10,
        "mb" => 1_000_000,
        "mib" => 1 << 20,
        "gb" => 1_000_000_000,
        "gib" => 1 << 30,
        _ => {
            return Err(bad(&format!(
                "unknown unit `{}` (use B, KB, KiB, MB, MiB, GB or GiB)",
                unit.trim()
            )))
        }
    };
    if let Ok(n) = num.parse::<u64>() {
        return n.checked_mul(mult).ok_or_else(|| bad("too large"));
    }
    let x: f64 = num.parse().map_err(|_| bad("not a number"))?;
    let bytes = (x * mult as f64).round();
    if !bytes.is_finite() || bytes >= u64::MAX as f64 {
        return Err(bad("too large"));
    }
    Ok(bytes as u64)
}

#[cfg(test)]
mod tests {
    use crate::config::testing::*;

    #[test]
    fn durations() {
        assert_err(
            &format!("timeouts: {{ connect: 2 }}\n{POOL}"),
            "timeouts.connect",
            &["bare number 2", "add a unit", "`2s`"],
        );
        assert_err(
            &format!("timeouts: {{ stream_idle: 2 parsecs }}\n{POOL}"),
            "timeouts.stream_idle",
            &["invalid duration `2 parsecs`", "`500ms`"],
        );
        assert_err(
            &pool_with("    health_check: { interval: 0s }\n"),
            "pools[0].health_check.interval",
            &["must be greater than zero"],
        );
        assert_err(
            &pool_with("    health_check: { timeout: 0ms }\n"),
            "pools[0].health_check.timeout",
            &["must be greater than zero"],
        );
        assert_err(
            &pool_with("    engine_stats: { interval: 0s }\n"),
            "pools[0].engine_stats.interval",
            &["must be greater than zero"],
        );
        assert_err(
            &pool_with("    sessions: { ttl: 5 }\n"),
            "pools[0].sessions.ttl",
            &["bare number 5"],
        );
        assert_err(
            &format!("timeouts: {{ connect: true }}\n{POOL}"),
            "timeouts.connect",
            &["expected a duration such as `2s`, found a boolean"],
        );
    }

    #[test]
    fn byte_sizes() {
        let size =
            |v: &str| parse(&format!("max_body_bytes: {v}\n{POOL}")).map(|c| c.max_body_bytes);
        assert_eq!(size("1048576").unwrap(), 1 << 20);
        assert_eq!(size("32MiB").unwrap(), 32 << 20);
        assert_eq!(size("\"64 KB\"").unwrap(), 64_000);
        assert_eq!(size("1.5KiB").unwrap(), 1536);
        assert_eq!(size("2GiB").unwrap(), 2 << 30);
        assert_eq!(size("100B").unwrap(), 100);
        assert_err(
            &format!("max_body_bytes: 32XB\n{POOL}"),
            "max_body_bytes",
            &["unknown unit `XB`"],
        );
        assert_err(
            &format!("max_body_bytes: MiB\n{POOL}"),
            "max_body_bytes",
            &["missing number"],
        );
        assert_err(
            &format!("max_body_bytes: 0\n{POOL}"),
            "max_body_bytes",
            &["must be greater than zero"],
        );
        assert_err(
            &format!("max_body_bytes: [1]\n{POOL}"),
            "max_body_bytes",
            &["found a list"],
        );
    }

    fn url_err(url: &str, needles: &[&str]) {
        assert_err(
            &format!("pools:\n  - name: a\n    endpoints:\n      - url: \"{url}\"\n"),
            "pools[0].endpoints[0].url",
            needles,
        );
    }

    #[test]
    fn bad_urls() {
        url_err("ftp://127.0.0.1:8101", &["unsupported scheme `ftp`"]);
        url_err("127.0.0.1:8101", &["expected an http:// URL"]);
        url_err("http://:8101", &["missing host"]);
        url_err("http://", &["missing host"]);
        url_err("http://127.0.0.1:99999", &["bad port `99999`"]);
        url_err("http://127.0.0.1:0", &["bad port `0`"]);
        url_err("http://127.0.0.1:abc", &["bad port `abc`"]);
        url_err("http://127.0.0.1:", &["missing port"]);
        url_err("http://127.0.0.1:8101/v1", &["unexpected path `/v1`"]);
        url_err("http://127.0.0.1:8101?x=1", &["unexpected path `?x=1`"]);
        url_err(
            "http://user:pw@127.0.0.1:8101",
            &["credentials in the URL are not supported"],
        );
        url_err("http://[::1:8101", &["unterminated IPv6"]);
        url_err("http://bad host:80", &["invalid host `bad host`"]);
        assert_err(
            "pools:\n  - name: a\n    endpoints:\n      - api_key_env: X\n",
            "pools[0].endpoints[0].url",
            &["required key is missing"],
        );
    }

    #[test]
    fn unresolvable_host() {
        url_err(
            "http://no-such-host.invalid:8101",
            &["cannot resolve host `no-such-host.invalid`"],
        );
    }

    #[test]
    fn paths_must_start_with_slash() {
        assert_err(
            &pool_with("    health_check: { path: health }\n"),
            "pools[0].health_check.path",
            &["`health` must start with \"/\""],
        );
        assert_err(
            &pool_with("    engine_stats: { path: metrics }\n"),
            "pools[0].engine_stats.path",
            &["must start with \"/\""],
        );
    }
}
