//! The configuration the crate reads: the `Config` types, `Config::load`, the top-level keys and `timeouts`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_norway::Value;

mod access_log;
mod auth;
mod clients;
mod cluster;
mod cors;
mod disaggregation;
mod engine_tls;
mod expose_paths;
mod kv_events;
mod metrics_auth;
mod outlier;
mod policy;
mod pool;
mod queue;
mod route_receipt;
mod server;
mod state_file;
#[cfg(test)]
mod testing;
mod tls;
mod tracing;
mod trusted_proxies;
mod ttft_budget;
mod values;
mod walk;

pub use access_log::{AccessLogConfig, LogFormat, LogTarget};
pub use auth::{AuthConfig, ClientKey, KeyLimits};
pub use clients::{DEFAULT_CLIENT_IDLE, DEFAULT_MAX_CLIENT_CONNECTIONS};
pub use cluster::ClusterConfig;
pub use cors::CorsOrigins;
pub use disaggregation::{prefill_set_name, Connector, Disaggregation};
pub use engine_tls::EngineTls;
use expose_paths::expose_paths;
pub use kv_events::{KvEndpointConfig, KvEventsConfig, KvSubscription};
pub use metrics_auth::{is_loopback, MetricsAuthConfig};
pub use outlier::OutlierConfig;
pub use policy::{
    EngineKind, EngineStatsConfig, Policy, PolicyConfig, PrefixConfig, PrefixFallback,
    SessionsConfig, DEFAULT_MOVE_MARGIN,
};
use pool::pools_list;
pub use pool::{EndpointConfig, HealthCheckConfig, PoolConfig, PrefillConfig, TokenizerConfig};
pub use queue::QueueConfig;
pub use route_receipt::RouteReceipt;
use server::server_yaml;
pub use state_file::StateFileConfig;
pub use tls::TlsConfig;
pub use tracing::TracingConfig;
use trusted_proxies::trusted_proxies;
pub use trusted_proxies::Cidr;
pub use ttft_budget::{effective as effective_ttft_budget, OverBudget, TtftBudgetConfig};
use values::{check_listen_addr, to_usize};
use walk::read_keys;
use walk::{kind, yaml_reason, Field, Node, Reader, Walker};

/// The whole validated configuration. Everything else in the crate reads this, never the YAML.
#[derive(Debug, Clone)]
pub struct Config {
    /// The file it was loaded from (for messages).
    pub source: PathBuf,
    /// Client-facing HTTP listeners ("host:port"), at least one.
    pub listen: Vec<String>,
    /// HTTPS on every `listen` address (`tls`); None = plain HTTP.
    pub tls: Option<TlsConfig>,
    /// Prometheus listener ("host:port"); None disables the metrics service.
    pub metrics_listen: Option<String>,
    /// Who may read `/metrics` and the status page on `metrics_listen` (`metrics_auth`); see `metrics_port`.
    pub metrics_auth: MetricsAuthConfig,
    /// Pingora `ServerConf` fields, validated against the known field names, as YAML text for `ServerConf::from_yaml`.
    /// Defaults infergate sets when absent: grace_period_seconds 30, graceful_shutdown_timeout_seconds 5,
    /// threads 2, pid_file/upgrade_sock under /tmp/infergate*.
    pub server_yaml: String,
    pub timeouts: Timeouts,
    /// Retries of a failed connect on another endpoint (default 2).
    pub max_retries: usize,
    /// Largest accepted request body in bytes (default 32 MiB); larger gets 413.
    pub max_body_bytes: usize,
    /// Longest session key (a session header's value, or a body's `prompt_cache_key`) in bytes (default 1 KiB);
    /// a longer header gets 431, a longer body key 400.
    pub max_session_key_bytes: usize,
    /// Request body bytes held for routing by all requests together (default 512 MiB); past it a request waits
    /// `body_budget_wait` for room, then gets 503 with Retry-After.
    pub body_budget_bytes: usize,
    /// How long a request waits for room in the body budget (default 2s).
    pub body_budget_wait: Duration,
    /// Client connections open at once on the `listen` addresses (default 10000, lowered at start to what the
    /// open-files limit holds; see `crate::clients`).
    pub max_client_connections: usize,
    pub pools: Vec<PoolConfig>,
    /// Paths beyond the inference API forwarded for every pool (`expose_paths`, normalised); see `exposure`.
    pub expose_paths: Vec<String>,
    /// Peers whose `X-Real-IP` is kept (`trusted_proxies`); see `forwarded`.
    pub trusted_proxies: Vec<Cidr>,
    /// Web origins whose pages may read the client port's answers (`cors_allowed_origins`); see `cors`.
    pub cors_allowed_origins: CorsOrigins,
    /// Client API keys and their limits (`auth`); None = every client is served.
    pub auth: Option<AuthConfig>,
    /// One line per request (`access_log`); None = off.
    pub access_log: Option<AccessLogConfig>,
    /// Responses name the serving endpoint in `x-infergate-endpoint` (`endpoint_header`, default true).
    pub endpoint_header: bool,
    /// Session bindings saved for the next instance (`state_file`); None = off.
    pub state_file: Option<StateFileConfig>,
    /// Replicas sharing live load and session bindings through Redis (`cluster`); None = off.
    pub cluster: Option<ClusterConfig>,
    /// Spans of each request exported over OTLP (`tracing`); None = off.
    pub tracing: Option<TracingConfig>,
    /// Who gets the `x-infergate-route` header (`route_receipt`, default nobody).
    pub route_receipt: RouteReceipt,
}

// Read on every request through `live::Live`.
crate::live::live_slot!(Config);

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Timeouts {
    /// TCP connect to an endpoint (default 2s): proxied requests, prefill legs and, over TLS, the router's own.
    pub connect: Duration,
    /// Longest wait for response headers and the first body byte (default 120s).
    pub response_header: Duration,
    /// Longest gap between two response body chunks (default 60s).
    pub stream_idle: Duration,
    /// The whole request body must arrive within this (default 60s); 408 otherwise.
    pub request_body: Duration,
    /// The whole request header must arrive within this (default 10s), else the connection is closed.
    pub request_header: Duration,
    /// A keep-alive client connection is closed after this long without a request (default 60s, whole seconds).
    pub client_idle: Duration,
    /// A write to the client that makes no progress for this long ends the request (default 60s): a client that
    /// stopped reading a stream would otherwise hold its engine slot forever.
    pub client_write: Duration,
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
            // A disaggregated pool's prefill set is no pool a client can name.
            None => wildcard().or_else(|| {
                let mut named = self
                    .pools
                    .iter()
                    .enumerate()
                    .filter(|(_, p)| p.prefill_of.is_none());
                match (named.next(), named.next()) {
                    (Some((i, _)), None) => Some(i),
                    _ => None,
                }
            }),
        }
    }
}

/// Default `timeouts.connect`.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// How long an idle upstream connection stays pooled (proxied requests, prefill legs, the router's own requests
/// over TLS): below the engine's keep-alive (uvicorn closes idle ones after 5 s), so a stale reuse is the
/// exception the retry handles, not the rule. Not a setting: here so that every floor above can share it.
pub const UPSTREAM_IDLE_TIMEOUT: Duration = Duration::from_secs(4);

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            connect: DEFAULT_CONNECT_TIMEOUT,
            response_header: Duration::from_secs(120),
            stream_idle: Duration::from_secs(60),
            request_body: Duration::from_secs(60),
            request_header: clients::DEFAULT_REQUEST_HEADER,
            client_idle: clients::DEFAULT_CLIENT_IDLE,
            client_write: clients::DEFAULT_CLIENT_WRITE,
        }
    }
}

const DEFAULT_LISTEN: &str = "127.0.0.1:8000";
const DEFAULT_MAX_RETRIES: usize = 2;
const DEFAULT_MAX_BODY_BYTES: usize = 32 << 20;
/// Session ids are UUIDs or similar: 1 KiB is room to spare, and what the session table hashes stays small.
const DEFAULT_MAX_SESSION_KEY_BYTES: usize = 1 << 10;
const DEFAULT_BODY_BUDGET_BYTES: usize = 512 << 20;
const DEFAULT_BODY_BUDGET_WAIT: Duration = Duration::from_secs(2);

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
    ("disaggregation", |n| {
        Disaggregation::read_section(n, "").map(drop)
    }),
    ("tokenizer", |n| TokenizerConfig::read(n).map(drop)),
    ("sessions", |n| {
        SessionsConfig::read(n, Policy::LoadAware).map(drop)
    }),
    ("engine_stats", |n| EngineStatsConfig::read(n).map(drop)),
    ("kv_events", |n| KvEventsConfig::read(n).map(drop)),
    ("prefix", |n| PrefixConfig::read(n).map(drop)),
    ("outlier_detection", |n| OutlierConfig::read(n).map(drop)),
    ("auth", |n| AuthConfig::read(n).map(drop)),
    ("limits", auth::read_limits_section),
    (
        "a key's limits (auth.limits.per_key[N])",
        auth::read_key_limits_section,
    ),
    ("queue", |n| QueueConfig::read(n, Some(1)).map(drop)),
    ("ttft_budget", |n| {
        TtftBudgetConfig::read(n, Policy::PredictedTtft).map(drop)
    }),
    ("access_log", |n| AccessLogConfig::read(n).map(drop)),
    ("state_file", |n| StateFileConfig::read(n).map(drop)),
    ("cluster", |n| ClusterConfig::read(n, &[]).map(drop)),
    ("metrics_auth", |n| MetricsAuthConfig::read(n).map(drop)),
    ("tracing", |n| TracingConfig::read(n).map(drop)),
    ("tls", |n| TlsConfig::read(n).map(drop)),
];

impl Config {
    /// The top level of the file.
    fn read(n: Node<'_>) -> Result<Config, ConfigError> {
        read_keys!(
            n;
            listen,
            metrics_listen,
            metrics_auth,
            server,
            timeouts,
            max_retries,
            max_body_bytes,
            max_session_key_bytes,
            body_budget_bytes,
            body_budget_wait,
            max_client_connections,
            pools,
            expose: "expose_paths",
            trusted: "trusted_proxies",
            cors: "cors_allowed_origins",
            auth,
            access_log,
            endpoint_header,
            state_file,
            cluster,
            tracing,
            route_receipt,
            tls,
        );
        let listen = listen_list(&listen)?;
        let metrics_addr = match metrics_listen.value() {
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
        let auth = match auth.optional_section()? {
            None => None,
            Some(a) => Some(AuthConfig::read(a)?),
        };
        Ok(Config {
            source: n.file().to_path_buf(),
            tls: TlsConfig::read_optional(&tls)?,
            metrics_auth: MetricsAuthConfig::read_for(
                &metrics_auth,
                metrics_addr.as_deref(),
                &metrics_listen,
            )?,
            metrics_listen: metrics_addr,
            server_yaml: server_yaml(server.section()?)?,
            timeouts: Timeouts::read(timeouts.section()?)?,
            max_retries: to_usize(max_retries.uint_or(DEFAULT_MAX_RETRIES as u64)?),
            max_body_bytes: max_body_bytes.byte_size_or(DEFAULT_MAX_BODY_BYTES)?,
            max_session_key_bytes: max_session_key_bytes
                .byte_size_or(DEFAULT_MAX_SESSION_KEY_BYTES)?,
            body_budget_bytes: body_budget_bytes.byte_size_or(DEFAULT_BODY_BUDGET_BYTES)?,
            body_budget_wait: body_budget_wait.duration_or(DEFAULT_BODY_BUDGET_WAIT)?,
            max_client_connections: clients::max_client_connections(&max_client_connections)?,
            pools: pools_list(&pools)?,
            expose_paths: expose_paths(&expose)?,
            trusted_proxies: trusted_proxies(&trusted)?,
            cors_allowed_origins: cors::cors_allowed_origins(&cors)?,
            route_receipt: route_receipt::route_receipt(&route_receipt, auth.as_ref())?,
            auth,
            access_log: AccessLogConfig::read_optional(&access_log)?,
            endpoint_header: access_log::endpoint_header(&endpoint_header)?,
            state_file: StateFileConfig::read_optional(&state_file)?,
            cluster: ClusterConfig::read_optional(&cluster, &listen)?,
            tracing: TracingConfig::read_optional(&tracing)?,
            listen,
        })
    }
}

impl Timeouts {
    fn read(n: Node<'_>) -> Result<Timeouts, ConfigError> {
        read_keys!(
            n;
            connect,
            response_header,
            stream_idle,
            request_body,
            request_header,
            client_idle,
            client_write,
        );
        let d = Timeouts::default();
        Ok(Timeouts {
            connect: connect.duration_or(d.connect)?,
            response_header: response_header.duration_or(d.response_header)?,
            stream_idle: stream_idle.duration_or(d.stream_idle)?,
            request_body: request_body.duration_or(d.request_body)?,
            request_header: request_header.duration_or(d.request_header)?,
            client_idle: clients::client_idle(&client_idle)?,
            client_write: client_write.duration_or(d.client_write)?,
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

#[cfg(test)]
mod tests;
