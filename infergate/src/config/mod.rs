//! The YAML configuration: schema, defaults, validation and error messages that name the file, key path and reason.

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::time::Duration;

use pingora::server::configuration::ServerConf;
use serde_norway::{Mapping, Value};

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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    RoundRobin,
    LeastRequest,
    LoadAware,
    PrefixAware,
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

#[derive(Debug, Clone, PartialEq)]
pub struct SessionsConfig {
    /// Lower-cased header name.
    pub header: String,
    pub ttl: Duration,
    pub max_sessions: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EngineKind {
    Vllm,
    Sglang,
}

#[derive(Debug, Clone, PartialEq)]
pub struct EngineStatsConfig {
    pub kind: EngineKind,
    pub path: String,
    pub interval: Duration,
    /// Defaults by kind: "vllm:" or "sglang:".
    pub metric_prefix: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrefixFallback {
    LeastInflight,
    Qps,
}

#[derive(Debug, Clone, PartialEq)]
pub struct PrefixConfig {
    pub block_bytes: usize,
    pub min_match_bytes: usize,
    pub capacity_tokens_per_endpoint: u64,
    pub fallback: PrefixFallback,
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
        let cx = Cx { file: path };
        let mut doc: Value =
            serde_norway::from_str(text).map_err(|e| cx.err("", yaml_reason(&e)))?;
        doc.apply_merge().map_err(|e| cx.err("", yaml_reason(&e)))?;
        let top = match &doc {
            Value::Mapping(_) => cx.obj("", &doc, TOP_KEYS)?,
            Value::Null => {
                return Err(cx.err("", "the file has no settings; at least `pools` is required"));
            }
            other => {
                return Err(cx.err(
                    "",
                    format!(
                        "the top level must be a mapping of keys (listen, pools, ...), found {}",
                        kind(other)
                    ),
                ));
            }
        };

        let listen = cx.listen_list(&top)?;
        let metrics_listen = match top.get("metrics_listen") {
            None | Some(Value::Null) => None,
            Some(v) => {
                let key = top.child("metrics_listen");
                let addr = cx.string(&key, v)?.trim().to_string();
                check_listen_addr(&addr).map_err(|r| cx.err(&key, r))?;
                if listen.contains(&addr) {
                    return Err(cx.err(
                        &key,
                        format!("`{addr}` is also in `listen`; use a different port"),
                    ));
                }
                Some(addr)
            }
        };
        let server_yaml = cx.server(&top)?;

        let t = cx.section(&top, "timeouts", TIMEOUT_KEYS)?;
        let d = Timeouts::default();
        let timeouts = Timeouts {
            connect: cx.duration_or(&t, "connect", d.connect)?,
            response_header: cx.duration_or(&t, "response_header", d.response_header)?,
            stream_idle: cx.duration_or(&t, "stream_idle", d.stream_idle)?,
        };

        let max_retries = match top.get("max_retries") {
            None => DEFAULT_MAX_RETRIES,
            Some(v) => to_usize(cx.uint(&top.child("max_retries"), v)?),
        };
        let max_body_bytes = match top.get("max_body_bytes") {
            None => DEFAULT_MAX_BODY_BYTES,
            Some(v) => cx.byte_size(&top.child("max_body_bytes"), v)?,
        };

        let pools = cx.pools(&top)?;

        Ok(Config {
            source: path.to_path_buf(),
            listen,
            metrics_listen,
            server_yaml,
            timeouts,
            max_retries,
            max_body_bytes,
            pools,
        })
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

    /// The Pingora server configuration (`server_yaml`, validated when the file was loaded).
    pub fn server_conf(&self) -> ServerConf {
        ServerConf::from_yaml(&self.server_yaml)
            .expect("server_yaml was validated by Config::parse")
    }
}

impl Policy {
    /// Every policy, in the order the names are listed in messages.
    pub const ALL: [Policy; 4] = [
        Policy::RoundRobin,
        Policy::LeastRequest,
        Policy::LoadAware,
        Policy::PrefixAware,
    ];

    /// The name used in the YAML file (and in metric labels).
    pub fn as_str(self) -> &'static str {
        match self {
            Policy::RoundRobin => "round_robin",
            Policy::LeastRequest => "least_request",
            Policy::LoadAware => "load_aware",
            Policy::PrefixAware => "prefix_aware",
        }
    }
}

impl EngineKind {
    /// The name used in the YAML file.
    pub fn as_str(self) -> &'static str {
        match self {
            EngineKind::Vllm => "vllm",
            EngineKind::Sglang => "sglang",
        }
    }

    /// The metric name prefix the engine exports by default ("vllm:" / "sglang:").
    pub fn default_metric_prefix(self) -> &'static str {
        match self {
            EngineKind::Vllm => "vllm:",
            EngineKind::Sglang => "sglang:",
        }
    }
}

impl PrefixFallback {
    /// The name used in the YAML file.
    pub fn as_str(self) -> &'static str {
        match self {
            PrefixFallback::LeastInflight => "least_inflight",
            PrefixFallback::Qps => "qps",
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

impl Default for SessionsConfig {
    fn default() -> Self {
        SessionsConfig {
            header: "x-session-id".to_string(),
            ttl: Duration::from_secs(2 * 3600),
            max_sessions: 100_000,
        }
    }
}

impl Default for PrefixConfig {
    fn default() -> Self {
        PrefixConfig {
            block_bytes: 64,
            min_match_bytes: 256,
            capacity_tokens_per_endpoint: 1_000_000,
            fallback: PrefixFallback::LeastInflight,
        }
    }
}

const DEFAULT_LISTEN: &str = "127.0.0.1:8000";
const DEFAULT_MAX_RETRIES: usize = 2;
const DEFAULT_MAX_BODY_BYTES: usize = 32 << 20;

const TOP_KEYS: &[&str] = &[
    "listen",
    "metrics_listen",
    "server",
    "timeouts",
    "max_retries",
    "max_body_bytes",
    "pools",
];
const TIMEOUT_KEYS: &[&str] = &["connect", "response_header", "stream_idle"];
const POOL_KEYS: &[&str] = &[
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
];
const ENDPOINT_KEYS: &[&str] = &["url", "api_key_env", "api_key_file"];
const HEALTH_KEYS: &[&str] = &[
    "path",
    "interval",
    "timeout",
    "healthy_after",
    "unhealthy_after",
];
const PREFILL_KEYS: &[&str] = &["bytes_per_token", "max_tokens"];
const SESSIONS_KEYS: &[&str] = &["header", "ttl", "max_sessions"];
const ENGINE_STATS_KEYS: &[&str] = &["kind", "path", "interval", "metric_prefix"];
const PREFIX_KEYS: &[&str] = &[
    "block_bytes",
    "min_match_bytes",
    "capacity_tokens_per_endpoint",
    "fallback",
];

/// How a Pingora `ServerConf` field is type-checked before Pingora itself parses it.
#[derive(Clone, Copy)]
enum ServerKind {
    Uint,
    /// An integer of at least 1.
    PosUint,
    OptUint,
    OptNonZero,
    Bool,
    Str,
    OptStr,
    StrList,
    /// Checked by Pingora only.
    Other,
}

/// The fields of Pingora 0.9 `ServerConf` (without the `s2n` feature).
const SERVER_FIELDS: &[(&str, ServerKind)] = &[
    ("version", ServerKind::Uint),
    ("daemon", ServerKind::Bool),
    ("error_log", ServerKind::OptStr),
    ("pid_file", ServerKind::Str),
    ("upgrade_sock", ServerKind::Str),
    ("user", ServerKind::OptStr),
    ("group", ServerKind::OptStr),
    ("working_directory", ServerKind::OptStr),
    ("threads", ServerKind::PosUint),
    ("listener_tasks_per_fd", ServerKind::PosUint),
    ("work_stealing", ServerKind::Bool),
    ("runtime_enable_alt_timer", ServerKind::Bool),
    ("ca_file", ServerKind::OptStr),
    ("grace_period_seconds", ServerKind::OptUint),
    ("graceful_shutdown_timeout_seconds", ServerKind::OptUint),
    ("client_bind_to_ipv4", ServerKind::StrList),
    ("client_bind_to_ipv6", ServerKind::StrList),
    ("upstream_keepalive_pool_size", ServerKind::Uint),
    ("upstream_connect_offload_threadpools", ServerKind::OptUint),
    (
        "upstream_connect_offload_thread_per_pool",
        ServerKind::OptUint,
    ),
    ("downstream_tls_offload_threadpools", ServerKind::OptUint),
    (
        "downstream_tls_offload_thread_per_pool",
        ServerKind::OptUint,
    ),
    ("upstream_debug_ssl_keylog", ServerKind::Bool),
    ("max_retries", ServerKind::Uint),
    (
        "upgrade_sock_connect_accept_max_retries",
        ServerKind::OptUint,
    ),
    ("max_blocking_threads", ServerKind::OptUint),
    ("blocking_threads_ttl_seconds", ServerKind::OptUint),
    (
        "fast_timeout_to_tokio_threshold_seconds",
        ServerKind::OptUint,
    ),
    ("runtime_metrics_poll_time_histogram", ServerKind::Bool),
    (
        "runtime_metrics_poll_time_histogram_scale",
        ServerKind::Other,
    ),
    (
        "runtime_metrics_poll_time_histogram_resolution_micros",
        ServerKind::OptUint,
    ),
    (
        "runtime_metrics_poll_time_histogram_buckets",
        ServerKind::OptUint,
    ),
    ("daemon_wait_for_ready", ServerKind::Bool),
    ("daemon_ready_timeout_seconds", ServerKind::OptNonZero),
    ("daemon_notify_timeout_seconds", ServerKind::OptNonZero),
];

/// Values infergate sets in `server:` when the file does not.
const SERVER_DEFAULTS: &[(&str, ServerDefault)] = &[
    ("grace_period_seconds", ServerDefault::Int(30)),
    ("graceful_shutdown_timeout_seconds", ServerDefault::Int(5)),
    ("threads", ServerDefault::Int(2)),
    ("pid_file", ServerDefault::Str("/tmp/infergate.pid")),
    (
        "upgrade_sock",
        ServerDefault::Str("/tmp/infergate_upgrade.sock"),
    ),
];

enum ServerDefault {
    Int(u64),
    Str(&'static str),
}

/// Error context: the file name for messages.
struct Cx<'a> {
    file: &'a Path,
}

/// A mapping whose keys have been checked against the known ones; `map` None means "present but empty (null)".
struct Obj<'v> {
    path: String,
    map: Option<&'v Mapping>,
}

impl<'v> Obj<'v> {
    fn get(&self, key: &str) -> Option<&'v Value> {
        self.map.and_then(|m| m.get(key))
    }

    fn child(&self, key: &str) -> String {
        join(&self.path, key)
    }
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

/// "a string", "a number", ... for "expected X, found Y".
fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "nothing (null)",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Sequence(_) => "a list",
        Value::Mapping(_) => "a mapping",
        Value::Tagged(_) => "a tagged value",
    }
}

fn yaml_reason(e: &serde_norway::Error) -> String {
    let msg = e.to_string();
    match e.location() {
        // The parser reports a duplicate key at the start of the mapping that holds it.
        Some(loc) if msg.starts_with("duplicate entry") => format!(
            "invalid YAML: {msg} (in the mapping that starts at line {} column {})",
            loc.line(),
            loc.column()
        ),
        Some(loc) if !msg.contains(" line ") => {
            format!(
                "invalid YAML at line {} column {}: {msg}",
                loc.line(),
                loc.column()
            )
        }
        _ => format!("invalid YAML: {msg}"),
    }
}

/// Where each key of the file lives, to point at the right section when a key is misplaced.
fn key_homes() -> Vec<(&'static str, Vec<&'static str>)> {
    vec![
        ("the top level", TOP_KEYS.to_vec()),
        ("timeouts", TIMEOUT_KEYS.to_vec()),
        ("server", SERVER_FIELDS.iter().map(|(k, _)| *k).collect()),
        ("a pool (pools[N])", POOL_KEYS.to_vec()),
        (
            "an endpoint (pools[N].endpoints[M])",
            ENDPOINT_KEYS.to_vec(),
        ),
        ("health_check", HEALTH_KEYS.to_vec()),
        ("prefill", PREFILL_KEYS.to_vec()),
        ("sessions", SESSIONS_KEYS.to_vec()),
        ("engine_stats", ENGINE_STATS_KEYS.to_vec()),
        ("prefix", PREFIX_KEYS.to_vec()),
    ]
}

fn unknown_key_reason(key: &str, known: &[&str]) -> String {
    let best = known
        .iter()
        .map(|k| {
            let ndl = strsim::normalized_damerau_levenshtein(key, k);
            let jw = strsim::jaro_winkler(key, k);
            (ndl + jw, ndl, jw, *k)
        })
        .max_by(|a, b| a.0.total_cmp(&b.0));
    let elsewhere: Vec<&str> = key_homes()
        .into_iter()
        .filter(|(_, keys)| keys.as_slice() != known && keys.contains(&key))
        .map(|(home, _)| home)
        .collect();
    let placement = if elsewhere.is_empty() {
        String::new()
    } else {
        format!("`{key}` belongs in {}", elsewhere.join(" or "))
    };
    match best {
        Some((_, ndl, jw, k)) if ndl >= 0.5 || jw >= 0.85 => {
            let mut r = format!("unknown key `{key}`; did you mean `{k}`?");
            if !placement.is_empty() {
                r.push_str(&format!(" (or move it: {placement})"));
            }
            r
        }
        _ if !placement.is_empty() => format!("unknown key `{key}` here; {placement}"),
        _ => format!("unknown key `{key}`; known keys here: {}", known.join(", ")),
    }
}

fn to_usize(n: u64) -> usize {
    usize::try_from(n).unwrap_or(usize::MAX)
}

impl Cx<'_> {
    fn err(&self, key: &str, reason: impl Into<String>) -> ConfigError {
        ConfigError {
            file: self.file.to_path_buf(),
            key: key.to_string(),
            reason: reason.into(),
        }
    }

    fn type_err(&self, key: &str, expected: &str, v: &Value) -> ConfigError {
        self.err(key, format!("expected {expected}, found {}", kind(v)))
    }

    /// `v` must be a mapping (or null, meaning empty) whose keys are all in `known`.
    fn obj<'v>(&self, path: &str, v: &'v Value, known: &[&str]) -> Result<Obj<'v>, ConfigError> {
        let map = match v {
            Value::Mapping(m) => m,
            Value::Null => {
                return Ok(Obj {
                    path: path.to_string(),
                    map: None,
                })
            }
            other => return Err(self.type_err(path, "a mapping", other)),
        };
        for k in map.keys() {
            match k {
                Value::String(name) if known.contains(&name.as_str()) => {}
                Value::String(name) => {
                    return Err(self.err(&join(path, name), unknown_key_reason(name, known)))
                }
                other => {
                    let shown = serde_norway::to_string(other).unwrap_or_default();
                    return Err(self.err(
                        &join(path, shown.trim()),
                        format!("keys must be strings, found {}", kind(other)),
                    ));
                }
            }
        }
        Ok(Obj {
            path: path.to_string(),
            map: Some(map),
        })
    }

    /// An optional sub-mapping of `parent`; absent or null reads as empty.
    fn section<'v>(
        &self,
        parent: &Obj<'v>,
        key: &str,
        known: &[&str],
    ) -> Result<Obj<'v>, ConfigError> {
        let path = parent.child(key);
        match parent.get(key) {
            None => Ok(Obj { path, map: None }),
            Some(v) => self.obj(&path, v, known),
        }
    }

    fn string<'v>(&self, key: &str, v: &'v Value) -> Result<&'v str, ConfigError> {
        match v {
            Value::String(s) => Ok(s),
            other => Err(self.type_err(key, "a string", other)),
        }
    }

    fn uint(&self, key: &str, v: &Value) -> Result<u64, ConfigError> {
        match v {
            Value::Number(n) => {
                if let Some(u) = n.as_u64() {
                    Ok(u)
                } else if n.is_i64() {
                    Err(self.err(key, format!("expected a non-negative integer, found {n}")))
                } else {
                    Err(self.err(key, format!("expected an integer, found {n}")))
                }
            }
            other => Err(self.type_err(key, "an integer", other)),
        }
    }

    /// A positive integer, defaulting when absent.
    fn positive_or(&self, obj: &Obj, key: &str, default: u64) -> Result<u64, ConfigError> {
        match obj.get(key) {
            None => Ok(default),
            Some(v) => {
                let path = obj.child(key);
                let n = self.uint(&path, v)?;
                if n == 0 {
                    return Err(self.err(&path, "must be at least 1"));
                }
                Ok(n)
            }
        }
    }

    fn duration(&self, key: &str, v: &Value) -> Result<Duration, ConfigError> {
        let d = match v {
            Value::String(s) => humantime::parse_duration(s.trim()).map_err(|e| {
                self.err(
                    key,
                    format!("invalid duration `{s}`: {e}; write a number with a unit such as `500ms`, `2s` or `2h`"),
                )
            })?,
            Value::Number(n) => {
                return Err(self.err(
                    key,
                    format!("expected a duration with a unit, found the bare number {n}; add a unit, e.g. `{n}s` or `{n}ms`"),
                ))
            }
            other => return Err(self.type_err(key, "a duration such as `2s`", other)),
        };
        if d.is_zero() {
            return Err(self.err(key, "must be greater than zero"));
        }
        Ok(d)
    }

    fn duration_or(
        &self,
        obj: &Obj,
        key: &str,
        default: Duration,
    ) -> Result<Duration, ConfigError> {
        match obj.get(key) {
            None => Ok(default),
            Some(v) => self.duration(&obj.child(key), v),
        }
    }

    fn byte_size(&self, key: &str, v: &Value) -> Result<usize, ConfigError> {
        let n = match v {
            Value::Number(_) => self.uint(key, v)?,
            Value::String(s) => parse_byte_size(s).map_err(|r| self.err(key, r))?,
            other => {
                return Err(self.type_err(
                    key,
                    "a size such as `32MiB` or a number of bytes",
                    other,
                ))
            }
        };
        if n == 0 {
            return Err(self.err(key, "must be greater than zero"));
        }
        Ok(to_usize(n))
    }

    /// A path that must start with "/".
    fn url_path_or(&self, obj: &Obj, key: &str, default: &str) -> Result<String, ConfigError> {
        match obj.get(key) {
            None => Ok(default.to_string()),
            Some(v) => {
                let path = obj.child(key);
                let s = self.string(&path, v)?.trim();
                if !s.starts_with('/') {
                    return Err(self.err(
                        &path,
                        format!("`{s}` must start with \"/\" (e.g. `{default}`)"),
                    ));
                }
                if s.chars().any(|c| c.is_whitespace() || c.is_control()) {
                    return Err(self.err(&path, format!("`{s}` must not contain whitespace")));
                }
                Ok(s.to_string())
            }
        }
    }

    fn listen_list(&self, top: &Obj) -> Result<Vec<String>, ConfigError> {
        let key = top.child("listen");
        let items: Vec<(String, &Value)> = match top.get("listen") {
            None => return Ok(vec![DEFAULT_LISTEN.to_string()]),
            Some(Value::Sequence(seq)) => {
                if seq.is_empty() {
                    return Err(self.err(
                        &key,
                        "at least one address is required (e.g. \"127.0.0.1:8000\")",
                    ));
                }
                seq.iter()
                    .enumerate()
                    .map(|(i, v)| (format!("{key}[{i}]"), v))
                    .collect()
            }
            Some(v @ Value::String(_)) => vec![(key.clone(), v)],
            Some(other) => return Err(self.type_err(&key, "a string or a list of strings", other)),
        };
        let mut out: Vec<String> = Vec::new();
        for (path, v) in items {
            let addr = self.string(&path, v)?.trim().to_string();
            check_listen_addr(&addr).map_err(|r| self.err(&path, r))?;
            if out.contains(&addr) {
                return Err(self.err(&path, format!("`{addr}` is listed twice")));
            }
            out.push(addr);
        }
        Ok(out)
    }

    fn server(&self, top: &Obj) -> Result<String, ConfigError> {
        let known: Vec<&str> = SERVER_FIELDS.iter().map(|(k, _)| *k).collect();
        let server = self.section(top, "server", &known)?;
        let mut out = Mapping::new();
        if let Some(map) = server.map {
            for (k, v) in map {
                let name = k.as_str().unwrap_or_default();
                let path = server.child(name);
                let field_kind = SERVER_FIELDS
                    .iter()
                    .find(|(n, _)| *n == name)
                    .map(|(_, k)| *k)
                    .unwrap_or(ServerKind::Other);
                self.server_value(&path, field_kind, v)?;
                let mut one = Mapping::new();
                one.insert(k.clone(), v.clone());
                let yaml = serde_norway::to_string(&Value::Mapping(one))
                    .map_err(|e| self.err(&path, format!("cannot re-encode: {e}")))?;
                if let Err(e) = ServerConf::from_yaml(&yaml) {
                    return Err(self.err(
                        &path,
                        format!("rejected by Pingora: {}", pingora_reason(&e)),
                    ));
                }
                out.insert(k.clone(), v.clone());
            }
        }
        for (name, default) in SERVER_DEFAULTS {
            if !out.contains_key(*name) {
                let v = match default {
                    ServerDefault::Int(n) => Value::Number((*n).into()),
                    ServerDefault::Str(s) => Value::String((*s).to_string()),
                };
                out.insert(Value::String((*name).to_string()), v);
            }
        }
        let yaml = serde_norway::to_string(&Value::Mapping(out))
            .map_err(|e| self.err("server", format!("cannot re-encode: {e}")))?;
        ServerConf::from_yaml(&yaml).map_err(|e| {
            self.err(
                "server",
                format!("rejected by Pingora: {}", pingora_reason(&e)),
            )
        })?;
        Ok(yaml)
    }

    fn server_value(
        &self,
        path: &str,
        field_kind: ServerKind,
        v: &Value,
    ) -> Result<(), ConfigError> {
        match (field_kind, v) {
            (ServerKind::OptUint | ServerKind::OptNonZero | ServerKind::OptStr, Value::Null) => {
                Ok(())
            }
            (ServerKind::Uint | ServerKind::OptUint, _) => self.uint(path, v).map(|_| ()),
            (ServerKind::OptNonZero | ServerKind::PosUint, _) => {
                if self.uint(path, v)? == 0 {
                    return Err(self.err(path, "must be at least 1"));
                }
                Ok(())
            }
            (ServerKind::Bool, Value::Bool(_)) => Ok(()),
            (ServerKind::Bool, other) => Err(self.type_err(path, "true or false", other)),
            (ServerKind::Str | ServerKind::OptStr, _) => self.string(path, v).map(|_| ()),
            (ServerKind::StrList, Value::Sequence(seq)) => {
                for (i, item) in seq.iter().enumerate() {
                    self.string(&format!("{path}[{i}]"), item)?;
                }
                Ok(())
            }
            (ServerKind::StrList, other) => Err(self.type_err(path, "a list of strings", other)),
            (ServerKind::Other, _) => Ok(()),
        }
    }

    fn pools(&self, top: &Obj) -> Result<Vec<PoolConfig>, ConfigError> {
        let key = top.child("pools");
        let seq = match top.get("pools") {
            None | Some(Value::Null) => {
                return Err(self.err(&key, "at least one pool is required"));
            }
            Some(Value::Sequence(seq)) => seq,
            Some(other) => return Err(self.type_err(&key, "a list of pools", other)),
        };
        if seq.is_empty() {
            return Err(self.err(&key, "at least one pool is required"));
        }
        let mut pools: Vec<PoolConfig> = Vec::new();
        for (i, v) in seq.iter().enumerate() {
            let path = format!("{key}[{i}]");
            let pool = self.pool(&path, v)?;
            if let Some(j) = pools.iter().position(|p| p.name == pool.name) {
                return Err(self.err(
                    &join(&path, "name"),
                    format!("duplicate pool name `{}` (also {key}[{j}])", pool.name),
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
                    return Err(self.err(&format!("{path}.models[{m_idx}]"), reason));
                }
            }
            pools.push(pool);
        }
        Ok(pools)
    }

    fn pool(&self, path: &str, v: &Value) -> Result<PoolConfig, ConfigError> {
        if v.is_null() {
            return Err(self.type_err(path, "a mapping", v));
        }
        let p = self.obj(path, v, POOL_KEYS)?;

        let name = match p.get("name") {
            None => return Err(self.err(&p.child("name"), "required key is missing")),
            Some(v) => {
                let n = self.string(&p.child("name"), v)?.trim().to_string();
                if n.is_empty() {
                    return Err(self.err(&p.child("name"), "must not be empty"));
                }
                n
            }
        };

        let models = match p.get("models") {
            None => vec!["*".to_string()],
            Some(Value::Sequence(seq)) => {
                if seq.is_empty() {
                    return Err(self.err(
                        &p.child("models"),
                        "at least one model name is required (use \"*\" to match any model)",
                    ));
                }
                let mut models: Vec<String> = Vec::new();
                for (i, m) in seq.iter().enumerate() {
                    let mpath = format!("{}[{i}]", p.child("models"));
                    let m = self.string(&mpath, m)?.trim().to_string();
                    if m.is_empty() {
                        return Err(self.err(&mpath, "must not be empty"));
                    }
                    if models.contains(&m) {
                        return Err(self.err(&mpath, format!("model `{m}` is listed twice")));
                    }
                    models.push(m);
                }
                models
            }
            Some(other) => {
                return Err(self.type_err(&p.child("models"), "a list of model names", other))
            }
        };

        let policy = match p.get("policy") {
            None => Policy::LoadAware,
            Some(v) => {
                let key = p.child("policy");
                let s = self.string(&key, v)?.trim();
                match Policy::ALL.iter().find(|pol| pol.as_str() == s) {
                    Some(pol) => *pol,
                    None => {
                        let names: Vec<&str> = Policy::ALL.iter().map(|p| p.as_str()).collect();
                        return Err(self.err(
                            &key,
                            format!("unknown policy `{s}`; expected one of {}", names.join(", ")),
                        ));
                    }
                }
            }
        };

        let max_in_flight_per_endpoint = match p.get("max_in_flight_per_endpoint") {
            None | Some(Value::Null) => None,
            Some(v) => {
                let key = p.child("max_in_flight_per_endpoint");
                let n = self.uint(&key, v)?;
                if n == 0 {
                    return Err(self.err(&key, "must be at least 1 (remove the key for no limit)"));
                }
                Some(n)
            }
        };

        let endpoints = self.endpoints(&p)?;

        let h = self.section(&p, "health_check", HEALTH_KEYS)?;
        let hd = HealthCheckConfig::default();
        let health_check = HealthCheckConfig {
            path: self.url_path_or(&h, "path", &hd.path)?,
            interval: self.duration_or(&h, "interval", hd.interval)?,
            timeout: self.duration_or(&h, "timeout", hd.timeout)?,
            healthy_after: to_usize(self.positive_or(
                &h,
                "healthy_after",
                hd.healthy_after as u64,
            )?),
            unhealthy_after: to_usize(self.positive_or(
                &h,
                "unhealthy_after",
                hd.unhealthy_after as u64,
            )?),
        };

        let pf = self.section(&p, "prefill", PREFILL_KEYS)?;
        let pd = PrefillConfig::default();
        let bytes_per_token = match pf.get("bytes_per_token") {
            None => pd.bytes_per_token,
            Some(v) => {
                let key = pf.child("bytes_per_token");
                let x = match v {
                    Value::Number(n) => n.as_f64().unwrap_or(f64::NAN),
                    other => return Err(self.type_err(&key, "a number", other)),
                };
                if !(x.is_finite() && x > 0.0) {
                    return Err(
                        self.err(&key, format!("must be a number greater than 0, found {x}"))
                    );
                }
                x
            }
        };
        let prefill = PrefillConfig {
            bytes_per_token,
            max_tokens: self.positive_or(&pf, "max_tokens", pd.max_tokens)?,
        };

        let sessions = match p.get("sessions") {
            None => None,
            Some(v) => {
                let key = p.child("sessions");
                let s = self.obj(&key, v, SESSIONS_KEYS)?;
                if policy != Policy::LoadAware {
                    return Err(self.err(
                        &key,
                        format!(
                            "sessions require policy load_aware (this pool's policy is {}); remove `sessions` or change the policy",
                            policy.as_str()
                        ),
                    ));
                }
                let sd = SessionsConfig::default();
                let header = match s.get("header") {
                    None => sd.header.clone(),
                    Some(v) => {
                        let hkey = s.child("header");
                        let raw = self.string(&hkey, v)?.trim();
                        match http::HeaderName::from_bytes(raw.as_bytes()) {
                            Ok(h) => h.as_str().to_string(),
                            Err(_) => {
                                return Err(self.err(
                                    &hkey,
                                    format!("`{raw}` is not a valid HTTP header name (letters, digits and -_.!#$%&'*+^`|~ only)"),
                                ))
                            }
                        }
                    }
                };
                Some(SessionsConfig {
                    header,
                    ttl: self.duration_or(&s, "ttl", sd.ttl)?,
                    max_sessions: to_usize(self.positive_or(
                        &s,
                        "max_sessions",
                        sd.max_sessions as u64,
                    )?),
                })
            }
        };

        let engine_stats = match p.get("engine_stats") {
            None => None,
            Some(v) => {
                let e = self.obj(&p.child("engine_stats"), v, ENGINE_STATS_KEYS)?;
                let kind = match e.get("kind") {
                    None => EngineKind::Vllm,
                    Some(v) => {
                        let key = e.child("kind");
                        match self.string(&key, v)?.trim() {
                            "vllm" => EngineKind::Vllm,
                            "sglang" => EngineKind::Sglang,
                            other => {
                                return Err(self.err(
                                    &key,
                                    format!(
                                    "unknown engine kind `{other}`; expected one of vllm, sglang"
                                ),
                                ))
                            }
                        }
                    }
                };
                let metric_prefix = match e.get("metric_prefix") {
                    None => kind.default_metric_prefix().to_string(),
                    Some(v) => self
                        .string(&e.child("metric_prefix"), v)?
                        .trim()
                        .to_string(),
                };
                Some(EngineStatsConfig {
                    kind,
                    path: self.url_path_or(&e, "path", "/metrics")?,
                    interval: self.duration_or(&e, "interval", Duration::from_secs(1))?,
                    metric_prefix,
                })
            }
        };

        let x = self.section(&p, "prefix", PREFIX_KEYS)?;
        let xd = PrefixConfig::default();
        let fallback = match x.get("fallback") {
            None => xd.fallback,
            Some(v) => {
                let key = x.child("fallback");
                match self.string(&key, v)?.trim() {
                    "least_inflight" => PrefixFallback::LeastInflight,
                    "qps" => PrefixFallback::Qps,
                    other => {
                        return Err(self.err(
                            &key,
                            format!(
                                "unknown fallback `{other}`; expected one of least_inflight, qps"
                            ),
                        ))
                    }
                }
            }
        };
        let min_match_bytes = match x.get("min_match_bytes") {
            None => xd.min_match_bytes,
            Some(v) => to_usize(self.uint(&x.child("min_match_bytes"), v)?),
        };
        let prefix = PrefixConfig {
            block_bytes: to_usize(self.positive_or(&x, "block_bytes", xd.block_bytes as u64)?),
            min_match_bytes,
            capacity_tokens_per_endpoint: self.positive_or(
                &x,
                "capacity_tokens_per_endpoint",
                xd.capacity_tokens_per_endpoint,
            )?,
            fallback,
        };

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

    fn endpoints(&self, p: &Obj) -> Result<Vec<EndpointConfig>, ConfigError> {
        let key = p.child("endpoints");
        let seq = match p.get("endpoints") {
            None | Some(Value::Null) => {
                return Err(self.err(&key, "at least one endpoint is required"))
            }
            Some(Value::Sequence(seq)) => seq,
            Some(other) => return Err(self.type_err(&key, "a list of endpoints", other)),
        };
        if seq.is_empty() {
            return Err(self.err(&key, "at least one endpoint is required"));
        }
        let mut out: Vec<EndpointConfig> = Vec::new();
        for (i, v) in seq.iter().enumerate() {
            let path = format!("{key}[{i}]");
            let ep = self.endpoint(&path, v)?;
            if let Some(j) = out
                .iter()
                .position(|o| o.label.eq_ignore_ascii_case(&ep.label))
            {
                return Err(self.err(
                    &join(&path, "url"),
                    format!("duplicate endpoint `{}` (also {key}[{j}])", ep.label),
                ));
            }
            out.push(ep);
        }
        Ok(out)
    }

    fn endpoint(&self, path: &str, v: &Value) -> Result<EndpointConfig, ConfigError> {
        // Shorthand: a bare URL string.
        let (url_key, url_value, e) = match v {
            Value::String(_) => (path.to_string(), v, None),
            Value::Mapping(_) => {
                let e = self.obj(path, v, ENDPOINT_KEYS)?;
                let url_key = e.child("url");
                match e.get("url") {
                    None => return Err(self.err(&url_key, "required key is missing")),
                    Some(u) => (url_key, u, Some(e)),
                }
            }
            other => {
                return Err(self.type_err(path, "a mapping with `url` (or a URL string)", other))
            }
        };
        let url = self.string(&url_key, url_value)?.trim().to_string();
        let (host, port) = parse_http_url(&url).map_err(|r| self.err(&url_key, r))?;
        let addr = resolve(&host, port).map_err(|r| self.err(&url_key, r))?;

        let mut api_key = None;
        if let Some(e) = e {
            let env = e.get("api_key_env");
            let file = e.get("api_key_file");
            if env.is_some() && file.is_some() {
                return Err(self.err(path, "set either `api_key_env` or `api_key_file`, not both"));
            }
            if let Some(v) = env {
                let key = e.child("api_key_env");
                let name = self.string(&key, v)?.trim();
                if name.is_empty() {
                    return Err(self.err(&key, "must name an environment variable"));
                }
                match std::env::var(name) {
                    Ok(val) if !val.trim().is_empty() => api_key = Some(val.trim().to_string()),
                    Ok(_) => {
                        return Err(
                            self.err(&key, format!("environment variable `{name}` is empty"))
                        )
                    }
                    Err(std::env::VarError::NotPresent) => {
                        return Err(
                            self.err(&key, format!("environment variable `{name}` is not set"))
                        )
                    }
                    Err(std::env::VarError::NotUnicode(_)) => {
                        return Err(self.err(
                            &key,
                            format!("environment variable `{name}` is not valid UTF-8"),
                        ))
                    }
                }
            }
            if let Some(v) = file {
                let key = e.child("api_key_file");
                let fname = self.string(&key, v)?.trim();
                if fname.is_empty() {
                    return Err(self.err(&key, "must name a file"));
                }
                match std::fs::read(fname) {
                    Err(err) => return Err(self.err(&key, format!("cannot read `{fname}`: {err}"))),
                    Ok(bytes) => match String::from_utf8(bytes) {
                        Err(_) => {
                            return Err(self.err(&key, format!("`{fname}` is not valid UTF-8")))
                        }
                        Ok(text) if text.trim().is_empty() => {
                            return Err(self.err(&key, format!("`{fname}` is empty")))
                        }
                        Ok(text) => api_key = Some(text.trim().to_string()),
                    },
                }
            }
            if let Some(k) = &api_key {
                if k.chars().any(|c| c.is_control() || c == ' ') {
                    let src = if env.is_some() {
                        "api_key_env"
                    } else {
                        "api_key_file"
                    };
                    return Err(self.err(
                        &e.child(src),
                        "the API key contains spaces or control characters and cannot be sent in a header",
                    ));
                }
            }
        }

        Ok(EndpointConfig {
            label: format!("{host}:{port}"),
            url,
            host,
            addr,
            api_key,
        })
    }
}

/// The reason text of a Pingora error (the cause if there is one: the context repeats the whole YAML).
fn pingora_reason(e: &pingora::Error) -> String {
    let text = match (&e.cause, &e.context) {
        (Some(c), _) => c.to_string(),
        (None, Some(ctx)) => ctx.as_str().to_string(),
        (None, None) => e.to_string(),
    };
    // A position would point into the YAML infergate generated, not into the user's file.
    match text.rfind(" at line ") {
        Some(i) => text[..i].to_string(),
        None => text,
    }
}

/// Parse "http://host[:port][/]" into (host as written, port). IPv6 hosts keep their brackets.
fn parse_http_url(url: &str) -> Result<(String, u16), String> {
    const EXAMPLE: &str = "e.g. `http://10.0.0.5:8000`";
    let rest = match url.split_once("://") {
        Some((scheme, rest)) if scheme.eq_ignore_ascii_case("http") => rest,
        Some((scheme, _)) if scheme.eq_ignore_ascii_case("https") => {
            return Err(format!(
                "https is not supported yet; use an http:// URL ({EXAMPLE}) on a private network"
            ))
        }
        Some((scheme, _)) => {
            return Err(format!(
                "unsupported scheme `{scheme}`; expected an http:// URL ({EXAMPLE})"
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
        None => 80,
        Some("") => return Err("missing port after `:`".to_string()),
        Some(p) => match p.parse::<u16>() {
            Ok(n) if n > 0 => n,
            _ => return Err(format!("bad port `{p}`; expected a number from 1 to 65535")),
        },
    };
    Ok((host.to_string(), port))
}

/// Resolve `host` (as written; IPv6 in brackets) to one address, preferring IPv4.
fn resolve(host: &str, port: u16) -> Result<SocketAddr, String> {
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
fn check_listen_addr(addr: &str) -> Result<(), String> {
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
fn parse_byte_size(s: &str) -> Result<u64, String> {
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
    use super::*;

    const POOL: &str = "pools:\n  - name: a\n    endpoints:\n      - url: http://127.0.0.1:8101\n";

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse(Path::new("t.yaml"), text)
    }

    /// Asserts the error's key path and that its reason contains every needle; returns the full message.
    #[track_caller]
    fn assert_err(text: &str, key: &str, needles: &[&str]) -> String {
        let e = match parse(text) {
            Ok(_) => panic!("expected an error for:\n{text}"),
            Err(e) => e,
        };
        let msg = e.to_string();
        assert_eq!(e.key, key, "wrong key in `{msg}`");
        for n in needles {
            assert!(e.reason.contains(n), "`{msg}` does not contain `{n}`");
        }
        let prefix = if key.is_empty() {
            "t.yaml: ".to_string()
        } else {
            format!("t.yaml: {key}: ")
        };
        assert!(
            msg.starts_with(&prefix),
            "`{msg}` does not start with `{prefix}`"
        );
        msg
    }

    /// One pool `a` with one endpoint and the given extra pool-level YAML (indented by 4).
    fn pool_with(extra: &str) -> String {
        format!("{POOL}{extra}")
    }

    /// One pool `a` whose single endpoint has the given extra endpoint-level YAML (indented by 8).
    fn endpoint_with(extra: &str) -> String {
        format!("{POOL}{extra}")
    }

    fn temp_file(name: &str, contents: &str) -> PathBuf {
        let p = std::env::temp_dir().join(format!(
            "infergate-config-test-{}-{name}",
            std::process::id()
        ));
        std::fs::write(&p, contents).unwrap();
        p
    }

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
    fn sessions_and_engine_stats_defaults_when_present() {
        let c = parse(&pool_with("    sessions: {}\n    engine_stats:\n")).unwrap();
        assert_eq!(c.pools[0].sessions, Some(SessionsConfig::default()));
        assert_eq!(
            c.pools[0].engine_stats,
            Some(EngineStatsConfig {
                kind: EngineKind::Vllm,
                path: "/metrics".into(),
                interval: Duration::from_secs(1),
                metric_prefix: "vllm:".into(),
            })
        );
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
    fn unknown_keys_name_the_path_and_suggest() {
        assert_err(
            &format!("listn: x\n{POOL}"),
            "listn",
            &["unknown key `listn`; did you mean `listen`?"],
        );
        assert_err(
            &pool_with("    health_check: { intervall: 2s }\n"),
            "pools[0].health_check.intervall",
            &["unknown key `intervall`; did you mean `interval`?"],
        );
        assert_err(
            &endpoint_with("        api_key_evn: X\n"),
            "pools[0].endpoints[0].api_key_evn",
            &["did you mean `api_key_env`?"],
        );
        assert_err(
            &pool_with("    polcy: qps\n"),
            "pools[0].polcy",
            &["did you mean `policy`?"],
        );
        assert_err(
            &format!("timeouts: {{ conect: 1s }}\n{POOL}"),
            "timeouts.conect",
            &["did you mean `connect`?"],
        );
        assert_err(
            &pool_with("    sessions: { headr: x }\n"),
            "pools[0].sessions.headr",
            &["did you mean `header`?"],
        );
        assert_err(
            &pool_with("    engine_stats: { knd: vllm }\n"),
            "pools[0].engine_stats.knd",
            &["did you mean `kind`?"],
        );
        assert_err(
            &pool_with("    prefix: { fallbak: qps }\n"),
            "pools[0].prefix.fallbak",
            &["did you mean `fallback`?"],
        );
        assert_err(
            &pool_with("    prefill: { max_token: 1 }\n"),
            "pools[0].prefill.max_token",
            &["did you mean `max_tokens`?"],
        );
        assert_err(
            &format!("server: {{ thread: 2 }}\n{POOL}"),
            "server.thread",
            &["did you mean `threads`?"],
        );
        assert_err(
            &format!("zzz: 1\n{POOL}"),
            "zzz",
            &["unknown key `zzz`; known keys here: listen, metrics_listen"],
        );
        assert_err(
            &format!("1: x\n{POOL}"),
            "1",
            &["keys must be strings, found a number"],
        );
        assert_err(
            &pool_with("    interval: 2s\n"),
            "pools[0].interval",
            &["unknown key `interval` here; `interval` belongs in health_check or engine_stats"],
        );
        assert_err(
            &format!("endpoints: []\n{POOL}"),
            "endpoints",
            &["`endpoints` belongs in a pool (pools[N])"],
        );
        assert_err(
            &format!("timeout: 1s\n{POOL}"),
            "timeout",
            &["did you mean `timeouts`? (or move it: `timeout` belongs in health_check)"],
        );
    }

    #[test]
    fn wrong_types() {
        assert_err(
            &format!("max_retries: two\n{POOL}"),
            "max_retries",
            &["expected an integer, found a string"],
        );
        assert_err(
            &format!("max_retries: -1\n{POOL}"),
            "max_retries",
            &["expected a non-negative integer, found -1"],
        );
        assert_err(
            &format!("max_retries: 1.5\n{POOL}"),
            "max_retries",
            &["expected an integer, found 1.5"],
        );
        assert_err(
            "pools:\n  - name: 5\n    endpoints: [\"http://127.0.0.1:1\"]\n",
            "pools[0].name",
            &["expected a string, found a number"],
        );
        assert_err(
            &format!("listen: 8000\n{POOL}"),
            "listen",
            &["expected a string or a list of strings, found a number"],
        );
        assert_err(
            &format!("timeouts: 5s\n{POOL}"),
            "timeouts",
            &["expected a mapping, found a string"],
        );
        assert_err(
            "pools: {a: 1}\n",
            "pools",
            &["expected a list of pools, found a mapping"],
        );
        assert_err(
            &pool_with("    models: gpt\n"),
            "pools[0].models",
            &["expected a list of model names, found a string"],
        );
        assert_err(
            &format!("server: {{ threads: two }}\n{POOL}"),
            "server.threads",
            &["expected an integer, found a string"],
        );
        assert_err(
            &format!("server: {{ daemon: 1 }}\n{POOL}"),
            "server.daemon",
            &["expected true or false, found a number"],
        );
        assert_err(
            &pool_with("    prefill: { bytes_per_token: four }\n"),
            "pools[0].prefill.bytes_per_token",
            &["expected a number, found a string"],
        );
        assert_err(
            "pools:\n  - name: a\n    endpoints:\n      - 5\n",
            "pools[0].endpoints[0]",
            &["found a number"],
        );
    }

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
        url_err("https://127.0.0.1:8101", &["https is not supported yet"]);
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
    fn bad_policy_lists_valid_names() {
        assert_err(
            &pool_with("    policy: fastest\n"),
            "pools[0].policy",
            &["unknown policy `fastest`; expected one of round_robin, least_request, load_aware, prefix_aware"],
        );
        for (name, p) in [
            ("round_robin", Policy::RoundRobin),
            ("least_request", Policy::LeastRequest),
            ("load_aware", Policy::LoadAware),
            ("prefix_aware", Policy::PrefixAware),
        ] {
            assert_eq!(
                parse(&pool_with(&format!("    policy: {name}\n")))
                    .unwrap()
                    .pools[0]
                    .policy,
                p
            );
        }
        assert_err(
            &pool_with("    engine_stats: { kind: tgi }\n"),
            "pools[0].engine_stats.kind",
            &["unknown engine kind `tgi`; expected one of vllm, sglang"],
        );
        assert_err(
            &pool_with("    prefix: { fallback: random }\n"),
            "pools[0].prefix.fallback",
            &["unknown fallback `random`; expected one of least_inflight, qps"],
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
    fn sessions_require_load_aware() {
        assert_err(
            &pool_with("    policy: round_robin\n    sessions: { header: x-session-id }\n"),
            "pools[0].sessions",
            &["sessions require policy load_aware (this pool's policy is round_robin)"],
        );
        assert_err(
            &pool_with("    sessions: { header: \"x session\" }\n"),
            "pools[0].sessions.header",
            &["`x session` is not a valid HTTP header name"],
        );
        assert_err(
            &pool_with("    sessions: { max_sessions: 0 }\n"),
            "pools[0].sessions.max_sessions",
            &["at least 1"],
        );
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

    #[test]
    fn server_section() {
        assert_err(
            &format!("server: {{ max_blocking_threads: 0 }}\n{POOL}"),
            "server.max_blocking_threads",
            &[
                "rejected by Pingora",
                "max_blocking_threads must be greater than zero",
            ],
        );
        assert_err(
            &format!("server: {{ runtime_metrics_poll_time_histogram_scale: cubic }}\n{POOL}"),
            "server.runtime_metrics_poll_time_histogram_scale",
            &["rejected by Pingora: runtime_metrics_poll_time_histogram_scale: unknown variant `cubic`"],
        );
        assert!(!parse(&format!(
            "server: {{ runtime_metrics_poll_time_histogram_scale: cubic }}\n{POOL}"
        ))
        .unwrap_err()
        .reason
        .contains(" at line "));
        assert_err(
            &format!("server: {{ daemon_ready_timeout_seconds: 0 }}\n{POOL}"),
            "server.daemon_ready_timeout_seconds",
            &["at least 1"],
        );
        assert_err(
            &format!("server: [1]\n{POOL}"),
            "server",
            &["expected a mapping, found a list"],
        );
        let c = parse(&format!(
            "server:\n  grace_period_seconds: 7\n  error_log: null\n{POOL}"
        ))
        .unwrap();
        let s = c.server_conf();
        assert_eq!(s.grace_period_seconds, Some(7));
        assert_eq!(s.graceful_shutdown_timeout_seconds, Some(5));
        assert!(
            c.server_yaml.contains("grace_period_seconds: 7"),
            "{}",
            c.server_yaml
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
