//! `kv_events`: subscribing to each engine's KV-cache event publisher (vLLM `--kv-events-config`). The pool's
//! section holds the defaults; an endpoint names its own publisher (each engine publishes on its own port).

use std::time::Duration;

use serde_norway::Value;

use super::values::to_usize;
use super::walk::read_keys;
use super::walk::{Field, Node};
use super::ConfigError;

/// A pool's `kv_events` defaults, for the endpoints that name a publisher.
#[derive(Debug, Clone, PartialEq)]
pub struct KvEventsConfig {
    /// Bind the address and let the engine connect (vLLM given `tcp://HOST:P` without `*` connects); false:
    /// connect to an engine that binds (vLLM given `tcp://*:P`).
    pub bind: bool,
    /// The topic subscribed to (vLLM's `topic`; "" takes every topic).
    pub topic: String,
    /// No message for this long, or a sequence gap this long ago, and the endpoint's index is not trusted.
    pub stale_after: Duration,
    /// The engine's KV block size in tokens (vLLM `--block-size`; 128 on the CPU build). Events of another
    /// block size are counted and skipped.
    pub block_size: usize,
    /// Most blocks kept per endpoint; the oldest are dropped beyond it (counted).
    pub max_blocks_per_endpoint: usize,
}

impl Default for KvEventsConfig {
    fn default() -> Self {
        KvEventsConfig {
            bind: false,
            topic: "kv".to_string(),
            stale_after: Duration::from_secs(10),
            block_size: 128,
            max_blocks_per_endpoint: 1 << 20,
        }
    }
}

impl KvEventsConfig {
    pub(super) fn read(n: Node<'_>) -> Result<KvEventsConfig, ConfigError> {
        read_keys!(n; bind, topic, stale_after, block_size, max_blocks_per_endpoint);
        let d = KvEventsConfig::default();
        let topic = match topic.value() {
            None => d.topic,
            Some(_) => topic.string()?.to_string(),
        };
        Ok(KvEventsConfig {
            bind: bind.bool_or(d.bind)?,
            topic,
            stale_after: stale_after.duration_or(d.stale_after)?,
            block_size: to_usize(block_size.positive_or(d.block_size as u64)?),
            max_blocks_per_endpoint: to_usize(
                max_blocks_per_endpoint.positive_or(d.max_blocks_per_endpoint as u64)?,
            ),
        })
    }
}

/// One endpoint's publisher: `kv_events: tcp://HOST:PORT`, or a mapping with `endpoint`, `replay` and `bind`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvEndpointConfig {
    /// `tcp://HOST:PORT` (validated; `*` only when binding).
    pub endpoint: String,
    /// The engine's replay ROUTER socket (`replay_endpoint`), asked for missed batches after a gap.
    pub replay: Option<String>,
    /// Overrides the pool's `kv_events.bind`.
    pub bind: Option<bool>,
}

impl KvEndpointConfig {
    pub(super) fn read(f: &Field<'_>) -> Result<Option<KvEndpointConfig>, ConfigError> {
        match f.value() {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(_)) => Ok(Some(KvEndpointConfig {
                endpoint: zmq_tcp(f, true)?,
                replay: None,
                bind: None,
            })),
            Some(Value::Mapping(_)) => {
                let n = f.section()?;
                read_keys!(n; endpoint, replay, bind);
                let bind = match bind.value() {
                    None => None,
                    Some(_) => Some(bind.bool_or(false)?),
                };
                let replay = match replay.value() {
                    None | Some(Value::Null) => None,
                    Some(_) => Some(zmq_tcp(&replay, false)?),
                };
                Ok(Some(KvEndpointConfig {
                    endpoint: zmq_tcp(&endpoint, true)?,
                    replay,
                    bind,
                }))
            }
            Some(other) => Err(f.type_err(
                "a publisher address such as `tcp://10.0.0.5:5557` (or a mapping with `endpoint`)",
                other,
            )),
        }
    }
}

/// A `tcp://HOST:PORT` address (`*` as the host allowed when `wildcard`).
fn zmq_tcp(f: &Field<'_>, wildcard: bool) -> Result<String, ConfigError> {
    let s = f.string()?.trim();
    let Some(rest) = s.strip_prefix("tcp://") else {
        return Err(f.err(format!(
            "`{s}` is not a tcp:// address; write e.g. `tcp://10.0.0.5:5557` (only tcp is supported)"
        )));
    };
    let Some((host, port)) = rest.rsplit_once(':') else {
        return Err(f.err(format!(
            "`{s}` has no port; write e.g. `tcp://10.0.0.5:5557`"
        )));
    };
    if port.parse::<u16>().map_or(true, |p| p == 0) {
        return Err(f.err(format!("`{s}`: `{port}` is not a port number (1 to 65535)")));
    }
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() || (host == "*" && !wildcard) {
        return Err(f.err(format!("`{s}` needs a host")));
    }
    if host.chars().any(|c| c.is_whitespace() || c == '/') {
        return Err(f.err(format!("`{s}`: `{host}` is not a host name or address")));
    }
    Ok(s.to_string())
}

/// What one endpoint's subscriber runs with: its publisher and the pool's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvSubscription {
    pub endpoint: String,
    pub bind: bool,
    pub topic: String,
    pub replay: Option<String>,
    pub stale_after: Duration,
    pub block_size: usize,
    pub max_blocks: usize,
}

impl KvSubscription {
    pub fn of(pool: &KvEventsConfig, ep: &KvEndpointConfig) -> KvSubscription {
        KvSubscription {
            endpoint: ep.endpoint.clone(),
            bind: ep.bind.unwrap_or(pool.bind),
            topic: pool.topic.clone(),
            replay: ep.replay.clone(),
            stale_after: pool.stale_after,
            block_size: pool.block_size,
            max_blocks: pool.max_blocks_per_endpoint,
        }
    }
}
