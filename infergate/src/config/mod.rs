//! The YAML configuration: schema, defaults, validation and error messages that name the file, key path and reason.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_norway::Value;

mod policy;
mod server;
#[cfg(test)]
mod testing;
mod values;
mod walk;

pub use policy::{
    EngineKind, EngineStatsConfig, Policy, PrefixConfig, PrefixFallback, SessionsConfig,
};
use server::server_yaml;
use values::{check_listen_addr, parse_http_url, resolve, to_usize};
use walk::{kind, yaml_reason, Field, Node, Reader, Walker};

/// The whole validated configuration. Everything else in the crate reads this, never the YAML.
#[derive(Debug, Clone)]
pub struct Config {
    /// The file it was loaded from (for messages).
    pub source: PathBuf,
    /// Client-facing HTTP listeners ("host:port"), at least one.
    pub listen: Vec<String>,
    /// Prometheus listener ("host:port"); None disables the metrics service.
    pub metrics_listen: Option<String>,
    /// Pingora `ServerConf` fields, validated against the known field names, as YAML text for `ServerConf::from_yaml`.
    /// Defaults infergate sets when absent: grace_period_seconds 30, graceful_shutdown_timeout_seconds 5,
    /// threads 2, pid_file/upgrade_sock under /tmp/infergate*.
    pub server_yaml: String,
    pub timeouts: Timeouts,
    /// Retries of a failed connect on another endpoint (default 2).
    pub max_retries: usize,
    /// Largest accepted request body in bytes (default 32 MiB); larger gets 413.
    pub max_body_bytes: usize,
    pub pools: Vec<PoolConfig>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Timeouts {
    /// TCP connect to an endpoint (default 2s).
    pub connect: Duration,
    /// Longest wait for response headers and the first body byte (default 120s).
    pub response_header: Duration,
    /// Longest gap between two response body chunks (default 60s).
    pub stream_idle: Duration,
}

#[derive(Debug, Clone)]
pub struct PoolConfig {
    pub name: String,
    /// Model names matched against the request body's "model"; "*" matches anything not matched by another pool.
    pub models: Vec<String>,
    pub policy: Policy,
    pub endpoints: Vec<EndpointConfig>,
    pub health_check: HealthCheckConfig,
    pub prefill: PrefillConfig,
    /// Per-endpoint in-flight request limit (None = unlimited). Reaching it is "pressure" for sessions and a hard
    /// limit for spills.
    pub max_in_flight_per_endpoint: Option<u64>,
    /// Sessions (policy load_aware only); None = off.
    pub sessions: Option<SessionsConfig>,
    /// Engine stats scraping; None = off.
    pub engine_stats: Option<EngineStatsConfig>,
    /// Prefix index settings (policy prefix_aware).
    pub prefix: PrefixConfig,
}

/// `Debug` shows `api_key` as `Some("***")`, never the key itself.
#[derive(Clone)]
pub struct EndpointConfig {
    /// The URL as written ("http://host:port"); only http is supported.
    pub url: String,
    /// "host:port" as written in the URL (port defaulted to 80): the `endpoint` metric label.
    pub label: String,
    /// The host part, used as the upstream Host header.
    pub host: String,
    /// Resolved at load time (first address; IPv4 preferred).
    pub addr: SocketAddr,
    /// Bearer token for the endpoint, read from api_key_env or api_key_file at load time. Never logged.
    pub api_key: Option<String>,
}

impl std::fmt::Debug for EndpointConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EndpointConfig")
            .field("url", &self.url)
            .field("label", &self.label)
            .field("host", &self.host)
            .field("addr", &self.addr)
            .field("api_key", &self.api_key.as_ref().map(|_| "***"))
            .finish()
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct HealthCheckConfig {
    pub path: String,
    pub interval: Duration,
    pub timeout: Duration,
    pub healthy_after: usize,
    pub unhealthy_after: usize,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PrefillConfig {
    pub bytes_per_token: f64,
    pub max_tokens: u64,
}

/// A configuration error: `{file}: {key path}: {reason}`.
#[derive(Debug, Clone, PartialEq)]
pub struct ConfigError {
    pub file: PathBuf,
    /// Dotted key path, e.g. `pools[0].endpoints[1].url`; empty for whole-file errors.
    pub key: String,
    pub reason: String,
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.key.is_empty() {
            write!(f, "{}: {}", self.file.display(), self.reason)
        } else {
            write!(f, "{}: {}: {}", self.file.display(), self.key, self.reason)
        }
    }
}

impl std::error::Error for ConfigError {}

impl Config {
    /// Read, parse and validate `path`. Resolves hostnames and reads API keys.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            file: path.to_path_buf(),
            key: String::new(),
            reason: format!("cannot read: {e}"),
        })?;
        Config::parse(path, &text)
    }

    /// Parse and validate YAML text; `path` is used in messages only.
    pub fn parse(path: &Path, text: &str) -> Result<Config, ConfigError> {
        let w = Walker::new(path);
        let mut doc: Value =
            serde_norway::from_str(text).map_err(|e| w.err("", yaml_reason(&e)))?;
        doc.apply_merge().map_err(|e| w.err("", yaml_reason(&e)))?;
        match &doc {
            Value::Mapping(_) => Config::read(w.root(&doc).section()?),
            Value::Null => Err(w.err("", "the file has no settings; at least `pools` is required")),
            other => Err(w.err(
                "",
                format!(
                    "the top level must be a mapping of keys (listen, pools, ...), found {}",
                    kind(other)
                ),
            )),
        }
    }

    /// The pool that serves `model`: the pool listing it exactly, else the pool listing `"*"`, else None.
    /// With no model (`None`): the `"*"` pool, else the only pool if there is exactly one, else None.
    pub fn pool_for_model(&self, model: Option<&str>) -> Option<usize> {
        let wildcard = || {
            self.pools
                .iter()
                .position(|p| p.models.iter().any(|m| m == "*"))
        };
        match model {
            Some(m) => self
                .pools
                .iter()
                .position(|p| p.models.iter().any(|x| x == m))
                .or_else(wildcard),
            None => wildcard().or(if self.pools.len() == 1 { Some(0) } else { None }),
        }
    }
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            connect: Duration::from_secs(2),
            response_header: Duration::from_secs(120),
            stream_idle: Duration::from_secs(60),
        }
    }
}

impl Default for HealthCheckConfig {
    fn default() -> Self {
        HealthCheckConfig {
            path: "/health".to_string(),
            interval: Duration::from_secs(2),
            timeout: Duration::from_secs(1),
            healthy_after: 2,
            unhealthy_after: 2,
        }
    }
}

impl Default for PrefillConfig {
    fn default() -> Self {
        PrefillConfig {
            bytes_per_token: 4.0,
            max_tokens: 262_144,
        }
    }
}

const DEFAULT_LISTEN: &str = "127.0.0.1:8000";
const DEFAULT_MAX_RETRIES: usize = 2;
const DEFAULT_MAX_BODY_BYTES: usize = 32 << 20;

/// Every section's reader and where its keys belong, in words (in the order "`x` belongs in ..." lists them). The
/// known keys of a section are the ones its reader asks for ([`walk::discover`]).
const SECTIONS: &[(&str, Reader)] = &[
    ("the top level", |n| Config::read(n).map(drop)),
    ("timeouts", |n| Timeouts::read(n).map(drop)),
    ("server", |n| server_yaml(n).map(drop)),
    ("a pool (pools[N])", |n| PoolConfig::read(n).map(drop)),
    ("an endpoint (pools[N].endpoints[M])", |n| {
        EndpointConfig::read_mapping(n).map(drop)
    }),
    ("health_check", |n| HealthCheckConfig::read(n).map(drop)),
    ("prefill", |n| PrefillConfig::read(n).map(drop)),
    ("sessions", |n| {
        SessionsConfig::read(n, Policy::LoadAware).map(drop)
    }),
    ("engine_stats", |n| EngineStatsConfig::read(n).map(drop)),
    ("prefix", |n| PrefixConfig::read(n).map(drop)),
];

impl Config {
    /// The top level of the file.
    fn read(n: Node<'_>) -> Result<Config, ConfigError> {
        let [listen, metrics_listen, server, timeouts, max_retries, max_body_bytes, pools] = n
            .keys([
                "listen",
                "metrics_listen",
                "server",
                "timeouts",
                "max_retries",
                "max_body_bytes",
                "pools",
            ])?;
        let listen = listen_list(&listen)?;
        let metrics_listen = match metrics_listen.value() {
            None | Some(Value::Null) => None,
            Some(_) => {
                let addr = metrics_listen.string()?.trim().to_string();
                check_listen_addr(&addr).map_err(|r| metrics_listen.err(r))?;
                if listen.contains(&addr) {
                    return Err(metrics_listen.err(format!(
                        "`{addr}` is also in `listen`; use a different port"
                    )));
                }
                Some(addr)
            }
        };
        Ok(Config {
            source: n.file().to_path_buf(),
            listen,
            metrics_listen,
            server_yaml: server_yaml(server.section()?)?,
            timeouts: Timeouts::read(timeouts.section()?)?,
            max_retries: to_usize(max_retries.uint_or(DEFAULT_MAX_RETRIES as u64)?),
            max_body_bytes: max_body_bytes.byte_size_or(DEFAULT_MAX_BODY_BYTES)?,
            pools: pools_list(&pools)?,
        })
    }
}

impl Timeouts {
    fn read(n: Node<'_>) -> Result<Timeouts, ConfigError> {
        let [connect, response_header, stream_idle] =
            n.keys(["connect", "response_header", "stream_idle"])?;
        let d = Timeouts::default();
        Ok(Timeouts {
            connect: connect.duration_or(d.connect)?,
            response_header: response_header.duration_or(d.response_header)?,
            stream_idle: stream_idle.duration_or(d.stream_idle)?,
        })
    }
}

/// `listen`: one address or a list of them.
fn listen_list(f: &Field<'_>) -> Result<Vec<String>, ConfigError> {
    let items: Vec<Field<'_>> = match f.value() {
        None => return Ok(vec![DEFAULT_LISTEN.to_string()]),
        Some(Value::Sequence(seq)) => {
            if seq.is_empty() {
                return Err(f.err("at least one address is required (e.g. \"127.0.0.1:8000\")"));
            }
            seq.iter().enumerate().map(|(i, v)| f.item(i, v)).collect()
        }
        Some(Value::String(_)) => vec![f.clone()],
        Some(other) => return Err(f.type_err("a string or a list of strings", other)),
    };
    let mut out: Vec<String> = Vec::new();
    for item in items {
        let addr = item.string()?.trim().to_string();
        check_listen_addr(&addr).map_err(|r| item.err(r))?;
        if out.contains(&addr) {
            return Err(item.err(format!("`{addr}` is listed twice")));
        }
        out.push(addr);
    }
    Ok(out)
}

/// `pools`: each pool, then the names and models that must be unique across pools.
fn pools_list(f: &Field<'_>) -> Result<Vec<PoolConfig>, ConfigError> {
    let seq = match f.value() {
        None | Some(Value::Null) => return Err(f.err("at least one pool is required")),
        Some(Value::Sequence(seq)) => seq,
        Some(other) => return Err(f.type_err("a list of pools", other)),
    };
    if seq.is_empty() {
        return Err(f.err("at least one pool is required"));
    }
    let mut pools: Vec<PoolConfig> = Vec::new();
    for (i, v) in seq.iter().enumerate() {
        let item = f.item(i, v);
        if v.is_null() {
            return Err(item.type_err("a mapping", v));
        }
        let pool = PoolConfig::read(item.section()?)?;
        if let Some(j) = pools.iter().position(|p| p.name == pool.name) {
            return Err(item.err_in(
                "name",
                format!(
                    "duplicate pool name `{}` (also {}[{j}])",
                    pool.name,
                    f.path()
                ),
            ));
        }
        for (m_idx, model) in pool.models.iter().enumerate() {
            if let Some(other) = pools.iter().find(|p| p.models.contains(model)) {
                let reason = if model == "*" {
                    format!(
                        "only one pool may use \"*\"; pool `{}` already catches all other models",
                        other.name
                    )
                } else {
                    format!(
                        "model `{model}` is already served by pool `{}`; each model belongs to one pool",
                        other.name
                    )
                };
                return Err(item.err_in(&format!("models[{m_idx}]"), reason));
            }
        }
        pools.push(pool);
    }
    Ok(pools)
}

impl PoolConfig {
    fn read(n: Node<'_>) -> Result<PoolConfig, ConfigError> {
        let [name, models, policy, max_in_flight_per_endpoint, endpoints, health_check, prefill, sessions, engine_stats, prefix] =
            n.keys([
                "name",
                "models",
                "policy",
                "max_in_flight_per_endpoint",
                "endpoints",
                "health_check",
                "prefill",
                "sessions",
                "engine_stats",
                "prefix",
            ])?;
        let name = {
            let s = name.string()?.trim().to_string();
            if s.is_empty() {
                return Err(name.err("must not be empty"));
            }
            s
        };
        let models = model_list(&models)?;
        let policy = Policy::read(&policy)?;
        let max_in_flight_per_endpoint = match max_in_flight_per_endpoint.value() {
            None | Some(Value::Null) => None,
            Some(_) => {
                let f = &max_in_flight_per_endpoint;
                let n = f.uint()?;
                if n == 0 {
                    return Err(f.err("must be at least 1 (remove the key for no limit)"));
                }
                Some(n)
            }
        };
        let endpoints = endpoint_list(&endpoints)?;
        let health_check = HealthCheckConfig::read(health_check.section()?)?;
        let prefill = PrefillConfig::read(prefill.section()?)?;
        let sessions = match sessions.optional_section()? {
            None => None,
            Some(s) => Some(SessionsConfig::read(s, policy)?),
        };
        let engine_stats = match engine_stats.optional_section()? {
            None => None,
            Some(e) => Some(EngineStatsConfig::read(e)?),
        };
        let prefix = PrefixConfig::read(prefix.section()?)?;
        Ok(PoolConfig {
            name,
            models,
            policy,
            endpoints,
            health_check,
            prefill,
            max_in_flight_per_endpoint,
            sessions,
            engine_stats,
            prefix,
        })
    }
}

/// A pool's `models`: `["*"]` when absent.
fn model_list(f: &Field<'_>) -> Result<Vec<String>, ConfigError> {
    let seq = match f.value() {
        None => return Ok(vec!["*".to_string()]),
        Some(Value::Sequence(seq)) => seq,
        Some(other) => return Err(f.type_err("a list of model names", other)),
    };
    if seq.is_empty() {
        return Err(f.err("at least one model name is required (use \"*\" to match any model)"));
    }
    let mut models: Vec<String> = Vec::new();
    for (i, v) in seq.iter().enumerate() {
        let item = f.item(i, v);
        let m = item.string()?.trim().to_string();
        if m.is_empty() {
            return Err(item.err("must not be empty"));
        }
        if models.contains(&m) {
            return Err(item.err(format!("model `{m}` is listed twice")));
        }
        models.push(m);
    }
    Ok(models)
}

/// A pool's `endpoints`: at least one, no endpoint twice.
fn endpoint_list(f: &Field<'_>) -> Result<Vec<EndpointConfig>, ConfigError> {
    let seq = match f.value() {
        None | Some(Value::Null) => return Err(f.err("at least one endpoint is required")),
        Some(Value::Sequence(seq)) => seq,
        Some(other) => return Err(f.type_err("a list of endpoints", other)),
    };
    if seq.is_empty() {
        return Err(f.err("at least one endpoint is required"));
    }
    let mut out: Vec<EndpointConfig> = Vec::new();
    for (i, v) in seq.iter().enumerate() {
        let item = f.item(i, v);
        let ep = EndpointConfig::read(&item)?;
        if let Some(j) = out
            .iter()
            .position(|o| o.label.eq_ignore_ascii_case(&ep.label))
        {
            return Err(item.err_in(
                "url",
                format!("duplicate endpoint `{}` (also {}[{j}])", ep.label, f.path()),
            ));
        }
        out.push(ep);
    }
    Ok(out)
}

impl EndpointConfig {
    /// One endpoint: a mapping with `url`, or the URL string alone.
    fn read(f: &Field<'_>) -> Result<EndpointConfig, ConfigError> {
        match f.required()? {
            Value::String(_) => EndpointConfig::at_url(f),
            Value::Mapping(_) => EndpointConfig::read_mapping(f.section()?),
            other => Err(f.type_err("a mapping with `url` (or a URL string)", other)),
        }
    }

    fn read_mapping(n: Node<'_>) -> Result<EndpointConfig, ConfigError> {
        let [url, api_key_env, api_key_file] = n.keys(["url", "api_key_env", "api_key_file"])?;
        let mut ep = EndpointConfig::at_url(&url)?;
        ep.api_key = api_key(&n, &api_key_env, &api_key_file)?;
        Ok(ep)
    }

    /// The endpoint at the URL in `url` (parsed and resolved), without an API key.
    fn at_url(url: &Field<'_>) -> Result<EndpointConfig, ConfigError> {
        let text = url.string()?.trim().to_string();
        let (host, port) = parse_http_url(&text).map_err(|r| url.err(r))?;
        let addr = resolve(&host, port).map_err(|r| url.err(r))?;
        Ok(EndpointConfig {
            label: format!("{host}:{port}"),
            url: text,
            host,
            addr,
            api_key: None,
        })
    }
}

/// The endpoint's API key, from the environment variable named in `env` or the file named in `file` (not both).
fn api_key(
    endpoint: &Node<'_>,
    env: &Field<'_>,
    file: &Field<'_>,
) -> Result<Option<String>, ConfigError> {
    let (source, key) = match (env.value(), file.value()) {
        (None, None) => return Ok(None),
        (Some(_), Some(_)) => {
            return Err(endpoint.err("set either `api_key_env` or `api_key_file`, not both"))
        }
        (Some(_), None) => (env, api_key_from_env(env)?),
        (None, Some(_)) => (file, api_key_from_file(file)?),
    };
    if key.chars().any(|c| c.is_control() || c == ' ') {
        return Err(source.err(
            "the API key contains spaces or control characters and cannot be sent in a header",
        ));
    }
    Ok(Some(key))
}

fn api_key_from_env(f: &Field<'_>) -> Result<String, ConfigError> {
    let name = f.string()?.trim();
    if name.is_empty() {
        return Err(f.err("must name an environment variable"));
    }
    match std::env::var(name) {
        Ok(val) if !val.trim().is_empty() => Ok(val.trim().to_string()),
        Ok(_) => Err(f.err(format!("environment variable `{name}` is empty"))),
        Err(std::env::VarError::NotPresent) => {
            Err(f.err(format!("environment variable `{name}` is not set")))
        }
        Err(std::env::VarError::NotUnicode(_)) => {
            Err(f.err(format!("environment variable `{name}` is not valid UTF-8")))
        }
    }
}

fn api_key_from_file(f: &Field<'_>) -> Result<String, ConfigError> {
    let fname = f.string()?.trim();
    if fname.is_empty() {
        return Err(f.err("must name a file"));
    }
    match std::fs::read(fname) {
        Err(err) => Err(f.err(format!("cannot read `{fname}`: {err}"))),
        Ok(bytes) => match String::from_utf8(bytes) {
            Err(_) => Err(f.err(format!("`{fname}` is not valid UTF-8"))),
            Ok(text) if text.trim().is_empty() => Err(f.err(format!("`{fname}` is empty"))),
            Ok(text) => Ok(text.trim().to_string()),
        },
    }
}

impl HealthCheckConfig {
    fn read(n: Node<'_>) -> Result<HealthCheckConfig, ConfigError> {
        let [path, interval, timeout, healthy_after, unhealthy_after] = n.keys([
            "path",
            "interval",
            "timeout",
            "healthy_after",
            "unhealthy_after",
        ])?;
        let d = HealthCheckConfig::default();
        Ok(HealthCheckConfig {
            path: path.url_path_or(&d.path)?,
            interval: interval.duration_or(d.interval)?,
            timeout: timeout.duration_or(d.timeout)?,
            healthy_after: to_usize(healthy_after.positive_or(d.healthy_after as u64)?),
            unhealthy_after: to_usize(unhealthy_after.positive_or(d.unhealthy_after as u64)?),
        })
    }
}

impl PrefillConfig {
    fn read(n: Node<'_>) -> Result<PrefillConfig, ConfigError> {
        let [bytes_per_token, max_tokens] = n.keys(["bytes_per_token", "max_tokens"])?;
        let d = PrefillConfig::default();
        let bytes_per_token = match bytes_per_token.value() {
            None => d.bytes_per_token,
            Some(Value::Number(n)) => {
                let x = n.as_f64().unwrap_or(f64::NAN);
                if !(x.is_finite() && x > 0.0) {
                    return Err(
                        bytes_per_token.err(format!("must be a number greater than 0, found {x}"))
                    );
                }
                x
            }
            Some(other) => return Err(bytes_per_token.type_err("a number", other)),
        };
        Ok(PrefillConfig {
            bytes_per_token,
            max_tokens: max_tokens.positive_or(d.max_tokens)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::testing::*;
    use super::*;

    #[test]
    fn defaults_from_minimal_config() {
        let c = parse(POOL).unwrap();
        assert_eq!(c.source, PathBuf::from("t.yaml"));
        assert_eq!(c.listen, vec!["127.0.0.1:8000".to_string()]);
        assert_eq!(c.metrics_listen, None);
        assert_eq!(c.timeouts, Timeouts::default());
        assert_eq!(c.timeouts.connect, Duration::from_secs(2));
        assert_eq!(c.timeouts.response_header, Duration::from_secs(120));
        assert_eq!(c.timeouts.stream_idle, Duration::from_secs(60));
        assert_eq!(c.max_retries, 2);
        assert_eq!(c.max_body_bytes, 32 * 1024 * 1024);
        assert_eq!(c.pools.len(), 1);
        let p = &c.pools[0];
        assert_eq!(p.name, "a");
        assert_eq!(p.models, vec!["*".to_string()]);
        assert_eq!(p.policy, Policy::LoadAware);
        assert_eq!(p.max_in_flight_per_endpoint, None);
        assert_eq!(
            p.health_check,
            HealthCheckConfig {
                path: "/health".into(),
                interval: Duration::from_secs(2),
                timeout: Duration::from_secs(1),
                healthy_after: 2,
                unhealthy_after: 2,
            }
        );
        assert_eq!(
            p.prefill,
            PrefillConfig {
                bytes_per_token: 4.0,
                max_tokens: 262_144
            }
        );
        assert_eq!(p.sessions, None);
        assert_eq!(p.engine_stats, None);
        assert_eq!(
            p.prefix,
            PrefixConfig {
                block_bytes: 64,
                min_match_bytes: 256,
                capacity_tokens_per_endpoint: 1_000_000,
                fallback: PrefixFallback::LeastInflight,
            }
        );
        let ep = &p.endpoints[0];
        assert_eq!(ep.url, "http://127.0.0.1:8101");
        assert_eq!(ep.label, "127.0.0.1:8101");
        assert_eq!(ep.host, "127.0.0.1");
        assert_eq!(ep.addr, "127.0.0.1:8101".parse().unwrap());
        assert_eq!(ep.api_key, None);

        let s = c.server_conf();
        assert_eq!(s.grace_period_seconds, Some(30));
        assert_eq!(s.graceful_shutdown_timeout_seconds, Some(5));
        assert_eq!(s.threads, 2);
        assert_eq!(s.pid_file, "/tmp/infergate.pid");
        assert_eq!(s.upgrade_sock, "/tmp/infergate_upgrade.sock");
    }

    #[test]
    fn full_config_round_trip() {
        let key_file = temp_file("full-key", "  file-secret\n");
        std::env::set_var("INFERGATE_TEST_FULL_KEY", "env-secret");
        let text = format!(
            r#"
listen: ["127.0.0.1:8000", "localhost:8001"]
metrics_listen: "127.0.0.1:9090"
server:
  threads: 4
  pid_file: /tmp/x.pid
  work_stealing: false
  client_bind_to_ipv4: ["127.0.0.1"]
timeouts: {{ connect: 500ms, response_header: 30s, stream_idle: 1m }}
max_retries: 0
max_body_bytes: 1KiB
pools:
  - name: chat
    models: ["llama-3", "qwen"]
    policy: load_aware
    max_in_flight_per_endpoint: 64
    endpoints:
      - url: "http://127.0.0.1:8101"
        api_key_env: INFERGATE_TEST_FULL_KEY
      - url: "http://localhost:8102/"
        api_key_file: {key_file}
      - "http://[::1]:8103"
      - url: http://127.0.0.1
    health_check: {{ path: /ready, interval: 3s, timeout: 250ms, healthy_after: 1, unhealthy_after: 3 }}
    prefill: {{ bytes_per_token: 3.5, max_tokens: 8192 }}
    sessions: {{ header: X-Conversation, ttl: 10m, max_sessions: 5 }}
    engine_stats: {{ kind: sglang, interval: 500ms }}
  - name: rest
    models: ["*"]
    policy: prefix_aware
    endpoints:
      - url: http://127.0.0.1:8201
    engine_stats: {{ kind: vllm, path: /stats, metric_prefix: "x:" }}
    prefix: {{ block_bytes: 32, min_match_bytes: 0, capacity_tokens_per_endpoint: 5, fallback: qps }}
"#,
            key_file = key_file.display()
        );
        let c = parse(&text).unwrap();
        assert_eq!(c.listen, vec!["127.0.0.1:8000", "localhost:8001"]);
        assert_eq!(c.metrics_listen.as_deref(), Some("127.0.0.1:9090"));
        assert_eq!(
            c.timeouts,
            Timeouts {
                connect: Duration::from_millis(500),
                response_header: Duration::from_secs(30),
                stream_idle: Duration::from_secs(60),
            }
        );
        assert_eq!(c.max_retries, 0);
        assert_eq!(c.max_body_bytes, 1024);
        let s = c.server_conf();
        assert_eq!(s.threads, 4);
        assert_eq!(s.pid_file, "/tmp/x.pid");
        assert!(!s.work_stealing);
        assert_eq!(s.client_bind_to_ipv4, vec!["127.0.0.1".to_string()]);
        assert_eq!(s.grace_period_seconds, Some(30));
        assert_eq!(s.upgrade_sock, "/tmp/infergate_upgrade.sock");

        let p = &c.pools[0];
        assert_eq!(p.models, vec!["llama-3", "qwen"]);
        assert_eq!(p.max_in_flight_per_endpoint, Some(64));
        assert_eq!(p.endpoints[0].api_key.as_deref(), Some("env-secret"));
        assert_eq!(p.endpoints[1].api_key.as_deref(), Some("file-secret"));
        assert_eq!(p.endpoints[1].label, "localhost:8102");
        assert_eq!(p.endpoints[1].host, "localhost");
        assert!(
            p.endpoints[1].addr.is_ipv4(),
            "IPv4 preferred: {}",
            p.endpoints[1].addr
        );
        assert_eq!(p.endpoints[2].label, "[::1]:8103");
        assert_eq!(p.endpoints[2].host, "[::1]");
        assert_eq!(p.endpoints[2].addr, "[::1]:8103".parse().unwrap());
        assert_eq!(p.endpoints[3].label, "127.0.0.1:80");
        assert_eq!(p.endpoints[3].addr, "127.0.0.1:80".parse().unwrap());
        assert_eq!(p.health_check.path, "/ready");
        assert_eq!(p.health_check.timeout, Duration::from_millis(250));
        assert_eq!(p.health_check.healthy_after, 1);
        assert_eq!(p.health_check.unhealthy_after, 3);
        assert_eq!(
            p.prefill,
            PrefillConfig {
                bytes_per_token: 3.5,
                max_tokens: 8192
            }
        );
        assert_eq!(
            p.sessions,
            Some(SessionsConfig {
                header: "x-conversation".into(),
                ttl: Duration::from_secs(600),
                max_sessions: 5
            })
        );
        assert_eq!(
            p.engine_stats,
            Some(EngineStatsConfig {
                kind: EngineKind::Sglang,
                path: "/metrics".into(),
                interval: Duration::from_millis(500),
                metric_prefix: "sglang:".into(),
            })
        );
        let r = &c.pools[1];
        assert_eq!(r.policy, Policy::PrefixAware);
        assert_eq!(
            r.engine_stats,
            Some(EngineStatsConfig {
                kind: EngineKind::Vllm,
                path: "/stats".into(),
                interval: Duration::from_secs(1),
                metric_prefix: "x:".into(),
            })
        );
        assert_eq!(
            r.prefix,
            PrefixConfig {
                block_bytes: 32,
                min_match_bytes: 0,
                capacity_tokens_per_endpoint: 5,
                fallback: PrefixFallback::Qps
            }
        );

        assert_eq!(c.pool_for_model(Some("qwen")), Some(0));
        assert_eq!(c.pool_for_model(Some("other")), Some(1));
        assert_eq!(c.pool_for_model(None), Some(1));
        let _ = std::fs::remove_file(key_file);
    }

    #[test]
    fn pool_for_model_rules() {
        let two = "pools:\n  - name: a\n    models: [m1]\n    endpoints: [\"http://127.0.0.1:1\"]\n  - name: b\n    models: [m2]\n    endpoints: [\"http://127.0.0.1:2\"]\n";
        let c = parse(two).unwrap();
        assert_eq!(c.pool_for_model(Some("m1")), Some(0));
        assert_eq!(c.pool_for_model(Some("m2")), Some(1));
        assert_eq!(c.pool_for_model(Some("m3")), None);
        assert_eq!(c.pool_for_model(None), None);

        let one =
            "pools:\n  - name: a\n    models: [m1]\n    endpoints: [\"http://127.0.0.1:1\"]\n";
        let c = parse(one).unwrap();
        assert_eq!(c.pool_for_model(None), Some(0));
        assert_eq!(c.pool_for_model(Some("m1")), Some(0));
        assert_eq!(c.pool_for_model(Some("zzz")), None);

        let wild = "pools:\n  - name: a\n    models: [m1]\n    endpoints: [\"http://127.0.0.1:1\"]\n  - name: b\n    models: [\"*\"]\n    endpoints: [\"http://127.0.0.1:2\"]\n";
        let c = parse(wild).unwrap();
        assert_eq!(c.pool_for_model(Some("m1")), Some(0));
        assert_eq!(c.pool_for_model(Some("zzz")), Some(1));
        assert_eq!(c.pool_for_model(None), Some(1));
    }

    #[test]
    fn shipped_config_files_parse() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../conf");
        let example = Config::load(&dir.join("infergate.yaml")).unwrap_or_else(|e| panic!("{e}"));
        assert!(!example.pools.is_empty());
        let demo = Config::load(&dir.join("demo.yaml")).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(demo.listen, vec!["127.0.0.1:8000"]);
        assert_eq!(demo.metrics_listen.as_deref(), Some("127.0.0.1:9090"));
        assert_eq!(demo.pools.len(), 1);
        let p = &demo.pools[0];
        assert_eq!(p.name, "default");
        assert_eq!(p.policy, Policy::LoadAware);
        assert_eq!(
            p.sessions.as_ref().map(|s| s.header.as_str()),
            Some("x-session-id")
        );
        assert!(p.engine_stats.is_some());
        let labels: Vec<&str> = p.endpoints.iter().map(|e| e.label.as_str()).collect();
        assert_eq!(
            labels,
            [
                "127.0.0.1:8101",
                "127.0.0.1:8102",
                "127.0.0.1:8103",
                "127.0.0.1:8104"
            ]
        );
        let s = demo.server_conf();
        assert_eq!(s.grace_period_seconds, Some(2));
        assert!(s.pid_file.starts_with("/tmp/"));
        assert!(s.upgrade_sock.starts_with("/tmp/"));
    }

    #[test]
    fn unreadable_file() {
        let e = Config::load(Path::new("/nonexistent/infergate.yaml")).unwrap_err();
        assert_eq!(e.key, "");
        assert!(
            e.to_string()
                .starts_with("/nonexistent/infergate.yaml: cannot read: "),
            "{e}"
        );
    }

    #[test]
    fn bad_yaml_has_line_and_column() {
        let msg = assert_err(
            "listen: \"127.0.0.1:8000\"\npools: [\n  - a: b\n",
            "",
            &["invalid YAML", "line"],
        );
        assert!(msg.contains("column"), "{msg}");
        assert_err(
            "pools: []\npools: []\n",
            "",
            &["invalid YAML: duplicate entry with key \"pools\" (in the mapping that starts at line 1 column 1)"],
        );
    }

    #[test]
    fn top_level_must_be_a_mapping() {
        assert_err(
            "- a\n- b\n",
            "",
            &["top level must be a mapping", "found a list"],
        );
        assert_err(
            "just text\n",
            "",
            &["top level must be a mapping", "found a string"],
        );
        assert_err("# only a comment\n", "", &["no settings", "pools"]);
    }

    #[test]
    fn pool_structure_errors() {
        assert_err(
            "listen: \"127.0.0.1:8000\"\n",
            "pools",
            &["at least one pool is required"],
        );
        assert_err("pools: []\n", "pools", &["at least one pool is required"]);
        assert_err(
            "pools:\n  - name: a\n",
            "pools[0].endpoints",
            &["at least one endpoint is required"],
        );
        assert_err(
            "pools:\n  - name: a\n    endpoints: []\n",
            "pools[0].endpoints",
            &["at least one endpoint is required"],
        );
        assert_err(
            "pools:\n  - endpoints: [\"http://127.0.0.1:1\"]\n",
            "pools[0].name",
            &["required key is missing"],
        );
        assert_err(
            "pools:\n  - name: \"\"\n    endpoints: [\"http://127.0.0.1:1\"]\n",
            "pools[0].name",
            &["must not be empty"],
        );
        assert_err(
            "pools:\n  -\n",
            "pools[0]",
            &["expected a mapping, found nothing"],
        );
        assert_err(
            "pools:\n  - name: a\n    models: [x]\n    endpoints: [\"http://127.0.0.1:1\"]\n  - name: a\n    models: [y]\n    endpoints: [\"http://127.0.0.1:2\"]\n",
            "pools[1].name",
            &["duplicate pool name `a` (also pools[0])"],
        );
        assert_err(
            "pools:\n  - name: a\n    endpoints:\n      - http://127.0.0.1:8101\n      - url: http://127.0.0.1:8102\n      - url: http://127.0.0.1:8101/\n",
            "pools[0].endpoints[2].url",
            &["duplicate endpoint `127.0.0.1:8101` (also pools[0].endpoints[0])"],
        );
        assert_err(
            "pools:\n  - name: a\n    endpoints: [\"http://localhost\", \"http://LOCALHOST:80\"]\n",
            "pools[0].endpoints[1].url",
            &["duplicate endpoint"],
        );
    }

    #[test]
    fn model_routing_conflicts() {
        assert_err(
            "pools:\n  - name: a\n    endpoints: [\"http://127.0.0.1:1\"]\n  - name: b\n    endpoints: [\"http://127.0.0.1:2\"]\n",
            "pools[1].models[0]",
            &["only one pool may use \"*\"; pool `a` already catches all other models"],
        );
        assert_err(
            "pools:\n  - name: a\n    models: [m, n]\n    endpoints: [\"http://127.0.0.1:1\"]\n  - name: b\n    models: [o, n]\n    endpoints: [\"http://127.0.0.1:2\"]\n",
            "pools[1].models[1]",
            &["model `n` is already served by pool `a`"],
        );
        assert_err(
            &pool_with("    models: []\n"),
            "pools[0].models",
            &["at least one model name"],
        );
        assert_err(
            &pool_with("    models: [m, m]\n"),
            "pools[0].models[1]",
            &["listed twice"],
        );
    }

    #[test]
    fn api_key_env_errors() {
        assert_err(
            &endpoint_with("        api_key_env: INFERGATE_TEST_SURELY_UNSET_VAR\n"),
            "pools[0].endpoints[0].api_key_env",
            &["environment variable `INFERGATE_TEST_SURELY_UNSET_VAR` is not set"],
        );
        std::env::set_var("INFERGATE_TEST_EMPTY_KEY", "  ");
        assert_err(
            &endpoint_with("        api_key_env: INFERGATE_TEST_EMPTY_KEY\n"),
            "pools[0].endpoints[0].api_key_env",
            &["environment variable `INFERGATE_TEST_EMPTY_KEY` is empty"],
        );
    }

    #[test]
    fn api_key_file_errors() {
        assert_err(
            &endpoint_with("        api_key_file: /nonexistent/key\n"),
            "pools[0].endpoints[0].api_key_file",
            &["cannot read `/nonexistent/key`"],
        );
        let empty = temp_file("empty-key", "\n  \n");
        assert_err(
            &endpoint_with(&format!("        api_key_file: {}\n", empty.display())),
            "pools[0].endpoints[0].api_key_file",
            &["is empty"],
        );
        let spaced = temp_file("spaced-key", "topsecret value\n");
        let msg = assert_err(
            &endpoint_with(&format!("        api_key_file: {}\n", spaced.display())),
            "pools[0].endpoints[0].api_key_file",
            &["cannot be sent in a header"],
        );
        assert!(!msg.contains("topsecret"), "key leaked: {msg}");
        let good = temp_file("good-key", "k-123\n");
        let c = parse(&endpoint_with(&format!(
            "        api_key_file: {}\n",
            good.display()
        )))
        .unwrap();
        assert_eq!(c.pools[0].endpoints[0].api_key.as_deref(), Some("k-123"));
        for f in [empty, spaced, good] {
            let _ = std::fs::remove_file(f);
        }
    }

    #[test]
    fn api_key_env_and_file_together() {
        std::env::set_var("INFERGATE_TEST_BOTH_KEY", "secret-both");
        let msg = assert_err(
            &endpoint_with("        api_key_env: INFERGATE_TEST_BOTH_KEY\n        api_key_file: /etc/hostname\n"),
            "pools[0].endpoints[0]",
            &["set either `api_key_env` or `api_key_file`, not both"],
        );
        assert!(!msg.contains("secret-both"));
    }

    #[test]
    fn listen_addresses() {
        let c = parse(&format!("listen: localhost:8000\n{POOL}")).unwrap();
        assert_eq!(c.listen, vec!["localhost:8000"]);
        let c = parse(&format!("listen: [\"0.0.0.0:80\", \"[::1]:81\"]\n{POOL}")).unwrap();
        assert_eq!(c.listen, vec!["0.0.0.0:80", "[::1]:81"]);
        assert_err(
            &format!("listen: nonsense\n{POOL}"),
            "listen",
            &["invalid listen address `nonsense`", "host:port"],
        );
        assert_err(
            &format!("listen: 127.0.0.1\n{POOL}"),
            "listen",
            &["invalid listen address `127.0.0.1`"],
        );
        assert_err(
            &format!("listen: \":8000\"\n{POOL}"),
            "listen",
            &["invalid listen address `:8000`"],
        );
        assert_err(
            &format!("listen: [\"127.0.0.1:1\", \"a:b\"]\n{POOL}"),
            "listen[1]",
            &["invalid listen address `a:b`"],
        );
        assert_err(
            &format!("listen: no-such-host.invalid:80\n{POOL}"),
            "listen",
            &["cannot resolve host `no-such-host.invalid`"],
        );
        assert_err(
            &format!("listen: []\n{POOL}"),
            "listen",
            &["at least one address"],
        );
        assert_err(
            &format!("listen: [\"127.0.0.1:1\", \"127.0.0.1:1\"]\n{POOL}"),
            "listen[1]",
            &["listed twice"],
        );
        assert_err(
            &format!("metrics_listen: \"9090\"\n{POOL}"),
            "metrics_listen",
            &["invalid listen address `9090`"],
        );
        assert_err(
            &format!("metrics_listen: \"127.0.0.1:8000\"\n{POOL}"),
            "metrics_listen",
            &["also in `listen`"],
        );
        assert_eq!(
            parse(&format!("metrics_listen:\n{POOL}"))
                .unwrap()
                .metrics_listen,
            None
        );
    }

    #[test]
    fn numeric_limits() {
        let pf = "pools[0].prefill.bytes_per_token";
        assert_err(
            &pool_with("    prefill: { bytes_per_token: 0 }\n"),
            pf,
            &["greater than 0"],
        );
        assert_err(
            &pool_with("    prefill: { bytes_per_token: -1.5 }\n"),
            pf,
            &["greater than 0"],
        );
        assert_err(
            &pool_with("    prefill: { max_tokens: 0 }\n"),
            "pools[0].prefill.max_tokens",
            &["at least 1"],
        );
        assert_err(
            &pool_with("    health_check: { healthy_after: 0 }\n"),
            "pools[0].health_check.healthy_after",
            &["at least 1"],
        );
        assert_err(
            &pool_with("    health_check: { unhealthy_after: 0 }\n"),
            "pools[0].health_check.unhealthy_after",
            &["at least 1"],
        );
        assert_err(
            &pool_with("    max_in_flight_per_endpoint: 0\n"),
            "pools[0].max_in_flight_per_endpoint",
            &["at least 1"],
        );
        assert_err(
            &pool_with("    prefix: { block_bytes: 0 }\n"),
            "pools[0].prefix.block_bytes",
            &["at least 1"],
        );
    }

    #[test]
    fn endpoint_debug_hides_the_api_key() {
        std::env::set_var("INFERGATE_TEST_DEBUG_KEY", "debug-secret");
        let c = parse(&endpoint_with(
            "        api_key_env: INFERGATE_TEST_DEBUG_KEY\n",
        ))
        .unwrap();
        let ep = &c.pools[0].endpoints[0];
        assert_eq!(ep.api_key.as_deref(), Some("debug-secret"));
        let compact = [format!("{ep:?}"), format!("{:?}", c.pools[0])];
        for shown in &compact {
            assert!(shown.contains(r#"api_key: Some("***")"#), "{shown}");
        }
        for shown in compact
            .iter()
            .chain(&[format!("{ep:#?}"), format!("{c:#?}")])
        {
            assert!(!shown.contains("debug-secret"), "key leaked: {shown}");
            assert!(shown.contains(r#""***""#), "{shown}");
            assert!(shown.contains("127.0.0.1:8101"), "{shown}");
        }
        let plain = parse(POOL).unwrap();
        assert!(format!("{:?}", plain.pools[0].endpoints[0]).contains("api_key: None"));
    }

    #[test]
    fn yaml_merge_keys_are_applied() {
        let text =
            "x-common: &common\n  policy: least_request\n  endpoints: [\"http://127.0.0.1:1\"]\n";
        // Anchors at the top level would be an unknown key; merges work inside the pools list.
        assert_err(&format!("{text}{POOL}"), "x-common", &["unknown key"]);
        let c = parse(
            "pools:\n  - &a\n    name: a\n    models: [m]\n    policy: least_request\n    endpoints: [\"http://127.0.0.1:1\"]\n  - <<: *a\n    name: b\n    models: [n]\n",
        )
        .unwrap();
        assert_eq!(c.pools[1].policy, Policy::LeastRequest);
        assert_eq!(c.pools[1].endpoints[0].label, "127.0.0.1:1");
    }
}
