//! `infergate -t` and the store: one brief attempt to connect, authenticate and read what the cluster's keys hold.
//!
//! What an operator expects from a config test run by `ExecStartPre` before every start and reload: a store that
//! refuses the configured credentials (or database) is a configuration error, naming the key that set them, exit 1;
//! a store that cannot be reached now is a warning, exit 0 (Redis may start after the router, and a replica serves
//! on its own until it is reachable); keys of the wrong type under the prefix are a warning (replaced at start).

use std::time::Duration;

use super::connection::{explain, is_refusal};
use super::wire::Keys;
use crate::config::{Config, ConfigError};

/// The longest `-t` waits for the store, to connect and for each answer.
const CHECK_TIMEOUT: Duration = Duration::from_secs(2);

/// Try the store of `cfg.cluster` once. Ok(Some(warning)) when it cannot be reached or holds foreign keys under the
/// prefix; Err when it answered and refused this configuration. Ok(None) without `cluster` or when all is well.
pub fn check_store(cfg: &Config) -> Result<Option<String>, ConfigError> {
    let Some(c) = &cfg.cluster else {
        return Ok(None);
    };
    let url = &c.shown_url;
    let error = |key: &str, e: &redis::RedisError| ConfigError {
        file: cfg.source.clone(),
        key: key.to_string(),
        reason: format!("Redis at {url} refused this replica: {}", explain(e)),
    };
    let judge = |e: redis::RedisError| -> Result<Option<String>, ConfigError> {
        if is_refusal(&e) || (answered(&e) && e.to_string().contains("AUTH")) {
            Err(error(c.password_key, &e))
        } else if answered(&e) {
            Err(error("cluster.redis", &e))
        } else {
            Ok(Some(format!(
                "cluster.redis: cannot reach Redis at {url} within {CHECK_TIMEOUT:?} ({e}); the replica will place on \
                 its own load and sessions until it can"
            )))
        }
    };
    let client = match redis::Client::open(c.connection.clone()) {
        Ok(client) => client,
        Err(e) => return judge(e),
    };
    let mut conn = match client.get_connection_with_timeout(CHECK_TIMEOUT) {
        Ok(conn) => conn,
        Err(e) => return judge(e),
    };
    let timeouts = conn
        .set_read_timeout(Some(CHECK_TIMEOUT))
        .and_then(|()| conn.set_write_timeout(Some(CHECK_TIMEOUT)));
    if let Err(e) = timeouts {
        return judge(e);
    }
    if let Err(e) = redis::cmd("PING").query::<String>(&mut conn) {
        return judge(e);
    }
    let replicas = Keys::new(&c.key_prefix).replicas();
    match redis::cmd("TYPE").arg(&replicas).query::<String>(&mut conn) {
        Ok(t) if t == "zset" || t == "none" => Ok(None),
        Ok(t) => Ok(Some(format!(
            "cluster.key_prefix: Redis key `{replicas}` is a {t}, not the cluster's sorted set of replicas; the \
             replicas will replace it"
        ))),
        Err(e) => judge(e),
    }
}

/// The store answered with an error (as opposed to not answering): the configuration, not the network.
fn answered(e: &redis::RedisError) -> bool {
    use redis::ErrorKind::*;
    matches!(
        e.kind(),
        ResponseError | ExtensionError | AuthenticationFailed | ReadOnly | InvalidClientConfig
    )
}
