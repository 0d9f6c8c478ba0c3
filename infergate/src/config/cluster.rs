//! `cluster` (top level): the Redis store that router replicas share live load and session bindings through.

use std::time::Duration;

use redis::IntoConnectionInfo;
use serde_norway::Value;

use super::walk::read_keys;
use super::walk::{Field, Node};
use super::ConfigError;
use crate::tls;

/// How often a replica publishes its load and reads its peers', by default.
pub const DEFAULT_PUBLISH_INTERVAL: Duration = Duration::from_millis(100);

/// The longest a request waits for a session binding from the store, by default.
pub const DEFAULT_CLUSTER_TIMEOUT: Duration = Duration::from_millis(5);

/// The longest `read_timeout` may be: the request path never waits on the store for longer.
const MAX_TIMEOUT: Duration = Duration::from_millis(100);

const DEFAULT_KEY_PREFIX: &str = "infergate";

/// Replicas that share placement state through Redis (absent from the file: one router, nothing shared).
#[derive(Clone)]
pub struct ClusterConfig {
    /// Where and how to connect (address, database, user, password); the password is never printed.
    pub connection: redis::ConnectionInfo,
    /// The `redis` URL with any password replaced by `***`, for messages.
    pub shown_url: String,
    /// This replica's name in the store (default: hostname and the first listen port).
    pub replica: String,
    /// How often this replica publishes its load and reads its peers'.
    pub publish_interval: Duration,
    /// The longest a request waits on the store at each step: its session binding and the peers' reservations
    /// before placement, a served turn's binding before its answer.
    pub read_timeout: Duration,
    /// Every key this router writes starts with `{key_prefix}:` (several clusters on one Redis).
    pub key_prefix: String,
    /// The key that set the password, for messages: `cluster.password_file` or `cluster.redis`.
    pub password_key: &'static str,
    /// `rediss://`: the CA file Redis's certificate is checked against (None: the system's CA certificates) and
    /// the client certificate, if Redis asks for one (`tls-auth-clients`); see [`ClusterTls`].
    pub tls: Option<ClusterTls>,
}

/// What TLS to Redis was configured with (for messages; the certificates themselves are in `connection`).
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterTls {
    pub ca_file: Option<std::path::PathBuf>,
    pub cert_file: Option<std::path::PathBuf>,
}

impl std::fmt::Debug for ClusterConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterConfig")
            .field("redis", &self.shown_url)
            .field("replica", &self.replica)
            .field("publish_interval", &self.publish_interval)
            .field("read_timeout", &self.read_timeout)
            .field("key_prefix", &self.key_prefix)
            .field("tls", &self.tls)
            .finish()
    }
}

impl ClusterConfig {
    /// `cluster`: absent or null = off; otherwise a mapping that needs `redis`. `listen` gives the default
    /// replica name its port.
    pub(super) fn read_optional(
        f: &Field<'_>,
        listen: &[String],
    ) -> Result<Option<ClusterConfig>, ConfigError> {
        match f.value() {
            None | Some(Value::Null) => Ok(None),
            Some(_) => ClusterConfig::read(f.section()?, listen).map(Some),
        }
    }

    pub(super) fn read(n: Node<'_>, listen: &[String]) -> Result<ClusterConfig, ConfigError> {
        read_keys!(
            n;
            redis_url: "redis",
            password_file,
            ca_file,
            cert_file,
            key_file,
            replica,
            publish_interval,
            read_timeout,
            key_prefix,
        );
        redis_url.required()?;
        let text = redis_url.string()?.trim();
        let mut connection = connection_info(text).map_err(|r| redis_url.err(r))?;
        let mut password_key = "cluster.redis";
        let tls = redis_tls(
            &mut connection,
            &redis_url,
            [&ca_file, &cert_file, &key_file],
        )?;
        if password_file.value().is_some() {
            password_key = "cluster.password_file";
            if connection.redis.password.is_some() {
                return Err(n.err("set the password in `redis` or in `password_file`, not both"));
            }
            connection.redis.password = Some(super::walk::secret_from_file(&password_file)?);
        }
        let replica = match replica.value() {
            None => default_replica(listen),
            Some(_) => name(&replica, 100)?,
        };
        let interval = publish_interval.duration_or(DEFAULT_PUBLISH_INTERVAL)?;
        if !(Duration::from_millis(10)..=Duration::from_secs(10)).contains(&interval) {
            return Err(publish_interval.err(
                "must be between 10ms and 10s (peers drop out after a few intervals without news)",
            ));
        }
        let wait = read_timeout.duration_or(DEFAULT_CLUSTER_TIMEOUT)?;
        if wait > MAX_TIMEOUT {
            return Err(read_timeout.err(format!(
                "must be at most {MAX_TIMEOUT:?}: requests wait this long for the store (a few ms is plenty)"
            )));
        }
        let key_prefix = match key_prefix.value() {
            None => DEFAULT_KEY_PREFIX.to_string(),
            Some(_) => name(&key_prefix, 64)?,
        };
        Ok(ClusterConfig {
            connection,
            shown_url: shown_url(text),
            replica,
            publish_interval: interval,
            read_timeout: wait,
            key_prefix,
            password_key,
            tls,
        })
    }
}

/// `ca_file`, `cert_file` and `key_file` of a `rediss://` store: read, checked and put into `connection`.
fn redis_tls(
    connection: &mut redis::ConnectionInfo,
    url: &Field<'_>,
    [ca_file, cert_file, key_file]: [&Field<'_>; 3],
) -> Result<Option<ClusterTls>, ConfigError> {
    let insecure = match &connection.addr {
        redis::ConnectionAddr::TcpTls { insecure, .. } => *insecure,
        _ => {
            if let Some(f) = [ca_file, cert_file, key_file]
                .into_iter()
                .find(|f| f.value().is_some())
            {
                return Err(
                    f.err("applies to TLS only: write the `redis` URL as `rediss://host:port`")
                );
            }
            return Ok(None);
        }
    };
    if insecure {
        return Err(url.err(
            "`#insecure` (no certificate check) is not supported: give the CA that issued Redis's certificate in              `ca_file`",
        ));
    }
    let path = |f: &Field<'_>| -> Result<Option<std::path::PathBuf>, ConfigError> {
        match f.value() {
            None | Some(Value::Null) => Ok(None),
            Some(_) => super::access_log::file_path(f, f.string()?.trim()).map(Some),
        }
    };
    let (ca, cert, key) = (path(ca_file)?, path(cert_file)?, path(key_file)?);
    let read = |f: &Field<'_>, p: &std::path::Path| {
        std::fs::read(p).map_err(|e| f.err(format!("cannot read `{}`: {e}", p.display())))
    };
    // Each file is read once: what is checked here is what the Redis client is given.
    let root_cert = match &ca {
        Some(p) => {
            let pem = read(ca_file, p)?;
            let certs = tls::parse_certs(p, &pem).map_err(|r| ca_file.err(r))?;
            tls::ca_store(p, certs).map_err(|r| ca_file.err(r))?;
            Some(pem)
        }
        None => None,
    };
    let client_tls = match (&cert, &key) {
        (None, None) => None,
        (Some(c), Some(k)) => {
            let (cert_pem, key_pem) = (read(cert_file, c)?, read(key_file, k)?);
            let certs = tls::parse_certs(c, &cert_pem).map_err(|r| cert_file.err(r))?;
            let pkey = tls::parse_key(k, &key_pem).map_err(|r| key_file.err(r))?;
            tls::pair(c, certs, k, pkey).map_err(|r| key_file.err(r))?;
            Some(redis::ClientTlsConfig {
                client_cert: cert_pem,
                client_key: key_pem,
            })
        }
        (Some(_), None) => return Err(key_file.err("required with `cert_file`")),
        (None, Some(_)) => return Err(cert_file.err("required with `key_file`")),
    };
    let client = redis::Client::build_with_tls(
        connection.clone(),
        redis::TlsCertificates {
            client_tls,
            root_cert,
        },
    )
    .map_err(|e| url.err(format!("TLS settings rejected: {e}")))?;
    *connection = client.get_connection_info().clone();
    Ok(Some(ClusterTls {
        ca_file: ca,
        cert_file: cert,
    }))
}

/// Parse a `redis://` URL (or `rediss://`, `unix://`) into connection info, with a reason on failure.
fn connection_info(url: &str) -> Result<redis::ConnectionInfo, String> {
    if url.is_empty() {
        return Err("must be a Redis URL such as `redis://127.0.0.1:6379/0`".into());
    }
    if redis::parse_redis_url(url).is_none() {
        return Err(format!(
            "`{}` is not a Redis URL; write `redis://host:port/db` (`rediss://` for TLS)",
            shown_url(url)
        ));
    }
    url.into_connection_info()
        .map_err(|e| format!("`{}`: {e}", shown_url(url)))
}

/// The URL with its password (if any) replaced by `***`.
fn shown_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    match rest.split_once('@') {
        Some((userinfo, host)) if userinfo.contains(':') => {
            let user = userinfo.split(':').next().unwrap_or_default();
            format!("{scheme}://{user}:***@{host}")
        }
        _ => url.to_string(),
    }
}

/// A name that goes into Redis keys: printable, no spaces, at most `max` bytes.
fn name(f: &Field<'_>, max: usize) -> Result<String, ConfigError> {
    let s = f.string()?.trim();
    if s.is_empty() {
        return Err(f.err("must not be empty"));
    }
    if s.len() > max {
        return Err(f.err(format!("must be at most {max} bytes")));
    }
    if s.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(f.err(format!(
            "`{s}` must not contain spaces or control characters"
        )));
    }
    Ok(s.to_string())
}

/// `hostname:port` of the first listen address: unique per replica on one host and across hosts.
fn default_replica(listen: &[String]) -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok().filter(|h| !h.is_empty()))
        .unwrap_or_else(|| "localhost".to_string());
    let port = listen
        .first()
        .and_then(|a| a.rsplit_once(':'))
        .map_or("0", |(_, p)| p);
    format!("{host}:{port}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::testing::*;

    #[test]
    fn off_by_default_and_defaults_when_on() {
        assert!(parse(POOL).unwrap().cluster.is_none());
        assert!(parse(&format!("cluster:\n{POOL}"))
            .unwrap()
            .cluster
            .is_none());
        let c = parse(&format!(
            "listen: 127.0.0.1:8123\ncluster: {{ redis: \"redis://127.0.0.1:6379/2\" }}\n{POOL}"
        ))
        .unwrap()
        .cluster
        .unwrap();
        assert_eq!(c.publish_interval, Duration::from_millis(100));
        assert_eq!(c.read_timeout, Duration::from_millis(5));
        assert_eq!(c.key_prefix, "infergate");
        assert!(c.replica.ends_with(":8123"), "{}", c.replica);
        assert_eq!(c.connection.redis.db, 2);
        assert_eq!(c.connection.redis.password, None);
    }

    #[test]
    fn every_key_is_read_and_the_password_never_shows() {
        let pw = temp_file("cluster-pw", "  s3cret\n");
        let c = parse(&format!(
            "cluster:\n  redis: redis://127.0.0.1:6390\n  password_file: {}\n  replica: r-1\n  publish_interval: 250ms\n  read_timeout: 2ms\n  key_prefix: prod\n{POOL}",
            pw.display()
        ))
        .unwrap()
        .cluster
        .unwrap();
        assert_eq!(c.connection.redis.password.as_deref(), Some("s3cret"));
        assert_eq!((c.replica.as_str(), c.key_prefix.as_str()), ("r-1", "prod"));
        assert_eq!(c.publish_interval, Duration::from_millis(250));
        assert_eq!(c.read_timeout, Duration::from_millis(2));
        assert!(!format!("{c:?}").contains("s3cret"));
        let u = parse(&format!(
            "cluster: {{ redis: \"redis://me:hunter2@127.0.0.1:6390\" }}\n{POOL}"
        ))
        .unwrap()
        .cluster
        .unwrap();
        assert_eq!(u.connection.redis.password.as_deref(), Some("hunter2"));
        assert_eq!(u.shown_url, "redis://me:***@127.0.0.1:6390");
        assert!(!format!("{u:?}").contains("hunter2"));
        let _ = std::fs::remove_file(pw);
    }

    #[test]
    fn rediss_takes_a_ca_file_and_a_client_certificate() {
        use crate::tls::testing::{self_signed, write_pem};
        let (cert, key) = self_signed("redis.test");
        let (c, k) = write_pem("cluster-tls", &cert, &key);
        let (_, other_key) = self_signed("other.test");
        let (_, k2) = write_pem("cluster-tls-2", &cert, &other_key);
        let (cs, ks, k2s) = (c.display(), k.display(), k2.display());
        let plain = parse(&format!(
            "cluster: {{ redis: \"rediss://127.0.0.1:6390\" }}\n{POOL}"
        ))
        .unwrap()
        .cluster
        .unwrap();
        assert!(matches!(
            plain.connection.addr,
            redis::ConnectionAddr::TcpTls {
                insecure: false,
                ..
            }
        ));
        assert_eq!(
            plain.tls,
            Some(ClusterTls {
                ca_file: None,
                cert_file: None
            })
        );
        let t = parse(&format!(
            "cluster: {{ redis: \"rediss://127.0.0.1:6390\", ca_file: {cs}, cert_file: {cs}, key_file: {ks} }}\n{POOL}"
        ))
        .unwrap()
        .cluster
        .unwrap();
        assert_eq!(
            t.tls.as_ref().unwrap().ca_file.as_deref(),
            Some(c.as_path())
        );
        assert!(!format!("{t:?}").contains("PRIVATE"));
        assert_err(
            &format!("cluster: {{ redis: \"redis://127.0.0.1:6390\", ca_file: {cs} }}\n{POOL}"),
            "cluster.ca_file",
            &["rediss://"],
        );
        assert_err(
            &format!("cluster: {{ redis: \"rediss://127.0.0.1:6390#insecure\" }}\n{POOL}"),
            "cluster.redis",
            &["not supported", "ca_file"],
        );
        assert_err(
            &format!("cluster: {{ redis: \"rediss://127.0.0.1:6390\", ca_file: {ks} }}\n{POOL}"),
            "cluster.ca_file",
            &["no certificate"],
        );
        assert_err(
            &format!("cluster: {{ redis: \"rediss://127.0.0.1:6390\", cert_file: {cs} }}\n{POOL}"),
            "cluster.key_file",
            &["required with `cert_file`"],
        );
        assert_err(
            &format!(
                "cluster: {{ redis: \"rediss://127.0.0.1:6390\", cert_file: {cs}, key_file: {k2s} }}\n{POOL}"
            ),
            "cluster.key_file",
            &["does not belong"],
        );
    }

    #[test]
    fn bad_values_name_their_key() {
        assert_err(
            &format!("cluster: {{ replica: a }}\n{POOL}"),
            "cluster.redis",
            &["required key is missing"],
        );
        assert_err(
            &format!("cluster: {{ redis: \"http://127.0.0.1:6379\" }}\n{POOL}"),
            "cluster.redis",
            &["not a Redis URL"],
        );
        assert_err(
            &format!("cluster: {{ redis: \"redis://127.0.0.1\", publish_interval: 5ms }}\n{POOL}"),
            "cluster.publish_interval",
            &["between 10ms and 10s"],
        );
        assert_err(
            &format!("cluster: {{ redis: \"redis://127.0.0.1\", read_timeout: 1s }}\n{POOL}"),
            "cluster.read_timeout",
            &["at most"],
        );
        assert_err(
            &format!("cluster: {{ redis: \"redis://127.0.0.1\", replica: \"a b\" }}\n{POOL}"),
            "cluster.replica",
            &["spaces"],
        );
        assert_err(
            &format!(
                "cluster: {{ redis: \"redis://127.0.0.1\", password_file: /nonexistent/pw }}\n{POOL}"
            ),
            "cluster.password_file",
            &["cannot read `/nonexistent/pw`"],
        );
        let pw = temp_file("cluster-pw2", "x");
        assert_err(
            &format!(
                "cluster: {{ redis: \"redis://:p@127.0.0.1\", password_file: {} }}\n{POOL}",
                pw.display()
            ),
            "cluster",
            &["not both"],
        );
        let _ = std::fs::remove_file(pw);
        assert_err(
            &format!("cluster: {{ redis: \"redis://127.0.0.1\", publish: 1s }}\n{POOL}"),
            "cluster.publish",
            &["unknown key"],
        );
    }
}
