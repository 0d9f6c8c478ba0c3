//! Limits on clients: `timeouts.request_header`, `timeouts.client_idle`, `timeouts.client_write` and
//! `max_client_connections`.

use std::time::Duration;

use super::walk::Field;
use super::ConfigError;

/// Default `timeouts.request_header`: the whole request header must arrive within this.
pub const DEFAULT_REQUEST_HEADER: Duration = Duration::from_secs(10);
/// Default `timeouts.client_idle`: a keep-alive connection waits this long for the next request.
pub const DEFAULT_CLIENT_IDLE: Duration = Duration::from_secs(60);
/// Default `timeouts.client_write`: a write to the client may make no progress for this long.
pub const DEFAULT_CLIENT_WRITE: Duration = Duration::from_secs(60);
/// Default `max_client_connections` (before the file-descriptor limit is applied, see `crate::clients`).
pub const DEFAULT_MAX_CLIENT_CONNECTIONS: u64 = 10_000;

/// `timeouts.client_idle`: whole seconds, at least 1s, a fraction rounded up (a connection the client gate does not
/// wrap falls back to Pingora's keep-alive timeout, which takes seconds).
pub(super) fn client_idle(f: &Field<'_>) -> Result<Duration, ConfigError> {
    let d = f.duration_or(DEFAULT_CLIENT_IDLE)?;
    if d < Duration::from_secs(1) {
        return Err(
            f.err("must be at least 1s (idle client connections are timed in whole seconds)")
        );
    }
    Ok(Duration::from_secs(
        d.as_secs() + u64::from(d.subsec_nanos() > 0),
    ))
}

/// `max_client_connections`: at least 1.
pub(super) fn max_client_connections(f: &Field<'_>) -> Result<usize, ConfigError> {
    let n = f.positive_or(DEFAULT_MAX_CLIENT_CONNECTIONS)?;
    Ok(usize::try_from(n).unwrap_or(usize::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::testing::*;

    #[test]
    fn defaults() {
        let c = parse(POOL).unwrap();
        assert_eq!(c.timeouts.request_header, Duration::from_secs(10));
        assert_eq!(c.timeouts.client_idle, Duration::from_secs(60));
        assert_eq!(c.timeouts.client_write, Duration::from_secs(60));
        assert_eq!(c.max_client_connections, 10_000);
    }

    #[test]
    fn values_and_checks() {
        let c = parse(&format!(
            "timeouts: {{ request_header: 500ms, client_idle: 1500ms, client_write: 2s }}\nmax_client_connections: 3\n{POOL}"
        ))
        .unwrap();
        assert_eq!(c.timeouts.request_header, Duration::from_millis(500));
        assert_eq!(c.timeouts.client_idle, Duration::from_secs(2), "rounded up");
        assert_eq!(c.timeouts.client_write, Duration::from_secs(2));
        assert_eq!(c.max_client_connections, 3);
        assert_err(
            &format!("timeouts: {{ client_write: 0s }}\n{POOL}"),
            "timeouts.client_write",
            &["greater than zero"],
        );
        assert_err(
            &format!("timeouts: {{ client_idle: 500ms }}\n{POOL}"),
            "timeouts.client_idle",
            &["at least 1s"],
        );
        assert_err(
            &format!("timeouts: {{ request_header: 0s }}\n{POOL}"),
            "timeouts.request_header",
            &["greater than zero"],
        );
        assert_err(
            &format!("max_client_connections: 0\n{POOL}"),
            "max_client_connections",
            &["at least 1"],
        );
        assert_err(
            &format!("max_client_connections: lots\n{POOL}"),
            "max_client_connections",
            &["integer"],
        );
        assert_err(
            &format!("timeouts: {{ client_idel: 5s }}\n{POOL}"),
            "timeouts.client_idel",
            &["did you mean `client_idle`"],
        );
    }
}
