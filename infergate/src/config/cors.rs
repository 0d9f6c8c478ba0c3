//! `cors_allowed_origins` (top level): the web origins whose pages may call the client port from a browser.

use serde_norway::Value;

use super::walk::Field;
use super::ConfigError;

/// The origins allowed to read the client port's answers from a browser (CORS); empty = none (the default:
/// browsers keep other sites' pages from reading them).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CorsOrigins {
    /// `"*"`: any origin.
    any: bool,
    /// Exact origins (`scheme://host[:port]`, lowercase, default port left out, as browsers send them).
    origins: Vec<String>,
}

impl CorsOrigins {
    pub fn is_off(&self) -> bool {
        !self.any && self.origins.is_empty()
    }

    /// The `Access-Control-Allow-Origin` value for a request from `origin`, when it is allowed: `*` when any origin
    /// is, else the origin itself.
    pub fn allow<'o>(&self, origin: &'o str) -> Option<&'o str> {
        if self.any {
            Some("*")
        } else {
            self.origins
                .iter()
                .any(|o| o.eq_ignore_ascii_case(origin))
                .then_some(origin)
        }
    }
}

/// `cors_allowed_origins`: a list of origins, or `["*"]`; absent or empty = CORS off.
pub(super) fn cors_allowed_origins(f: &Field<'_>) -> Result<CorsOrigins, ConfigError> {
    let seq = match f.value() {
        None | Some(Value::Null) => return Ok(CorsOrigins::default()),
        Some(Value::Sequence(seq)) => seq,
        Some(other) => {
            return Err(f.type_err(
                "a list of origins such as [\"https://app.example.com\"], or [\"*\"]",
                other,
            ))
        }
    };
    let mut out = CorsOrigins::default();
    for (i, v) in seq.iter().enumerate() {
        let item = f.item(i, v);
        let text = item.string()?.trim();
        if text == "*" {
            out.any = true;
            continue;
        }
        let origin = parse_origin(text).map_err(|r| item.err(r))?;
        if out.origins.contains(&origin) {
            return Err(item.err(format!("`{origin}` is listed twice")));
        }
        out.origins.push(origin);
    }
    if out.any && !out.origins.is_empty() {
        return Err(f.err("`*` allows every origin: list it alone, or list origins without it"));
    }
    Ok(out)
}

/// An origin as a browser sends it in `Origin`: `http` or `https`, a host, a port only when not the default.
fn parse_origin(s: &str) -> Result<String, String> {
    let lower = s.to_ascii_lowercase();
    let (scheme, rest) = lower
        .split_once("://")
        .ok_or_else(|| format!("`{s}` is not an origin: write e.g. `https://app.example.com`"))?;
    let default_port = match scheme {
        "http" => "80",
        "https" => "443",
        _ => return Err(format!("`{s}`: the scheme must be http or https")),
    };
    if let Some(host_part) = rest.strip_suffix('/').filter(|h| !h.contains('/')) {
        return Err(format!(
            "`{s}` has a trailing `/`; an origin has no path: did you mean `{scheme}://{host_part}`?"
        ));
    }
    if rest.contains(['/', '?', '#', '@']) || rest.is_empty() {
        return Err(format!(
            "`{s}` is not an origin: only scheme, host and port, e.g. `https://app.example.com:8443`"
        ));
    }
    // `[v6]:port` or `host:port`; the port is optional.
    let split = match rest.find(']') {
        Some(end) if rest.starts_with('[') => (&rest[..=end], rest[end + 1..].strip_prefix(':')),
        _ => match rest.rsplit_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (rest, None),
        },
    };
    let (host, port) = match split {
        (h, Some(p)) => match p.parse::<u16>() {
            Ok(n) if n > 0 => (h, Some(p)),
            _ => return Err(format!("`{s}`: the port must be a number from 1 to 65535")),
        },
        (h, None) => (h, None),
    };
    if host.is_empty()
        || !host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-.[]:".contains(&b))
    {
        return Err(format!("`{s}`: `{host}` is not a host name or address"));
    }
    Ok(match port {
        Some(p) if p != default_port => format!("{scheme}://{host}:{p}"),
        _ => format!("{scheme}://{host}"),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::testing::*;

    #[test]
    fn origins_are_read_as_browsers_send_them() {
        for (text, want) in [
            ("https://App.Example.com", "https://app.example.com"),
            ("https://app.example.com:443", "https://app.example.com"),
            ("http://127.0.0.1:8080", "http://127.0.0.1:8080"),
            ("http://[::1]:3000", "http://[::1]:3000"),
            ("http://[::1]", "http://[::1]"),
        ] {
            assert_eq!(parse_origin(text).as_deref(), Ok(want), "{text}");
        }
        for (text, needle) in [
            (
                "https://app.example.com/",
                "did you mean `https://app.example.com`?",
            ),
            ("https://app.example.com/chat", "only scheme, host and port"),
            ("app.example.com", "write e.g."),
            ("ftp://x", "http or https"),
            ("https://x:99999", "from 1 to 65535"),
            ("https://a b", "not a host name"),
        ] {
            let e = parse_origin(text).unwrap_err();
            assert!(e.contains(needle), "{text}: {e}");
        }
    }

    #[test]
    fn config_key() {
        let off = parse(POOL).unwrap().cors_allowed_origins;
        assert!(off.is_off());
        assert_eq!(off.allow("https://x"), None);
        let c = parse(&format!(
            "cors_allowed_origins: [\"https://app.example.com\", \"http://localhost:3000\"]\n{POOL}"
        ))
        .unwrap()
        .cors_allowed_origins;
        assert_eq!(
            c.allow("https://app.example.com"),
            Some("https://app.example.com")
        );
        assert_eq!(c.allow("https://evil.example.com"), None);
        let any = parse(&format!("cors_allowed_origins: [\"*\"]\n{POOL}"))
            .unwrap()
            .cors_allowed_origins;
        assert_eq!(any.allow("https://anything"), Some("*"));
        assert_err(
            &format!("cors_allowed_origins: [\"*\", \"https://a.example\"]\n{POOL}"),
            "cors_allowed_origins",
            &["list it alone"],
        );
        assert_err(
            &format!("cors_allowed_origins: [\"https://a.example/\"]\n{POOL}"),
            "cors_allowed_origins[0]",
            &["trailing `/`"],
        );
        assert_err(
            &format!("cors_allowed_origins: \"*\"\n{POOL}"),
            "cors_allowed_origins",
            &["expected a list of origins"],
        );
    }
}
