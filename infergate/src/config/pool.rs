//! Pools: the `pools` list, each pool's keys, its `endpoints` (URL, address, API key), `health_check`, `prefill`
//! and `tokenizer`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use serde_norway::Value;

use super::disaggregation::Disaggregation;
use super::engine_tls::{engine_tls, EngineTls};
use super::expose_paths::expose_paths;
use super::kv_events::{KvEndpointConfig, KvEventsConfig, KvSubscription};
use super::outlier::OutlierConfig;
use super::policy::{EngineStatsConfig, Policy, PolicyConfig, PrefixConfig, SessionsConfig};
use super::queue::QueueConfig;
use super::ttft_budget::TtftBudgetConfig;
use super::values::{parse_http_url, resolve, to_usize};
use super::walk::read_keys;
use super::walk::{Field, Node};
use super::ConfigError;

#[derive(Debug, Clone)]
pub struct PoolConfig {
    pub name: String,
    /// Model names matched against the request body's "model"; "*" matches anything not matched by another pool.
    pub models: Vec<String>,
    /// The policy and the settings only it reads (sessions, prefix index).
    pub policy: PolicyConfig,
    /// When failures take an endpoint out of placement (`outlier_detection`).
    pub outlier: OutlierConfig,
    pub endpoints: Vec<EndpointConfig>,
    pub health_check: HealthCheckConfig,
    pub prefill: PrefillConfig,
    /// Per-endpoint in-flight request limit (None = unlimited). Reaching it is "pressure" for sessions and a hard
    /// limit for spills.
    pub max_in_flight_per_endpoint: Option<u64>,
    /// Engine stats scraping; None = off.
    pub engine_stats: Option<EngineStatsConfig>,
    /// Paths beyond the inference API forwarded to this pool only (`expose_paths`, normalised).
    pub expose_paths: Vec<String>,
    /// The router-side wait queue (needs `max_in_flight_per_endpoint`); None = off.
    pub queue: Option<QueueConfig>,
    /// TTFT budgets (`predicted_ttft` only); None = off.
    pub ttft_budget: Option<TtftBudgetConfig>,
    /// Defaults of the KV-event subscribers of the endpoints that name a publisher (`endpoints[N].kv_events`).
    pub kv_events: KvEventsConfig,
    /// The model's tokenizer for exact prompt tokens; None = bytes / `prefill.bytes_per_token`.
    pub tokenizer: Option<TokenizerConfig>,
    /// Prefill engines apart (`disaggregation`): this pool's endpoints are then its decode engines.
    pub disaggregation: Option<Disaggregation>,
    /// This is the prefill set of the disaggregated pool of this name (`disaggregation.prefill`).
    pub prefill_of: Option<String>,
}

// Read on every request through `live::Live`.
crate::live::live_slot!(PoolConfig);

/// A pool's `tokenizer`: the model directory, loaded and checked when the file is read (start or reload).
#[derive(Debug, Clone)]
pub struct TokenizerConfig {
    /// The model directory as written.
    pub path: PathBuf,
    /// Bodies larger than this are estimated from bytes (`infergate_tokenizer_fallbacks_total{reason="too_large"}`).
    pub max_bytes: usize,
    /// Its `Debug` shows the directory and a fingerprint of the files: a reload compares them.
    pub model: Arc<crate::tokens::ModelTokenizer>,
}

impl TokenizerConfig {
    pub(super) fn read(n: Node<'_>) -> Result<TokenizerConfig, ConfigError> {
        read_keys!(n; path, max_bytes);
        let dir = path.string()?.trim();
        if dir.is_empty() {
            return Err(path.err(
                "must name the model directory (with tokenizer.json and tokenizer_config.json)",
            ));
        }
        let model =
            crate::tokens::load(std::path::Path::new(dir)).map_err(|e| path.err(e.to_string()))?;
        let max_bytes = max_bytes.byte_size_or(crate::tokens::DEFAULT_MAX_BYTES)?;
        Ok(TokenizerConfig {
            path: PathBuf::from(dir),
            max_bytes,
            model: Arc::new(model),
        })
    }
}

/// `pools`: each pool, then the names and models that must be unique across pools.
pub(super) fn pools_list(f: &Field<'_>) -> Result<Vec<PoolConfig>, ConfigError> {
    let seq = match f.value() {
        None | Some(Value::Null) => return Err(f.err("at least one pool is required")),
        Some(Value::Sequence(seq)) => seq,
        Some(other) => return Err(f.type_err("a list of pools", other)),
    };
    if seq.is_empty() {
        return Err(f.err("at least one pool is required"));
    }
    let mut pools: Vec<PoolConfig> = Vec::new();
    let mut prefill_sets: Vec<(usize, PoolConfig)> = Vec::new();
    for (i, v) in seq.iter().enumerate() {
        let item = f.item(i, v);
        if v.is_null() {
            return Err(item.type_err("a mapping", v));
        }
        let (pool, prefill_set) = PoolConfig::read_as(item.section()?, None)?;
        prefill_sets.extend(prefill_set.map(|s| (i, s)));
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
    // After every configured pool: the positions of those stay the file's.
    for (i, set) in prefill_sets {
        if let Some(j) = pools.iter().position(|p| p.name == set.name) {
            return Err(f.item(i, &seq[i]).err_in(
                "disaggregation.prefill",
                format!(
                    "pool `{}` (pools[{j}]) already has the name of this prefill set; rename it",
                    set.name
                ),
            ));
        }
        pools.push(set);
    }
    Ok(pools)
}

impl PoolConfig {
    pub(super) fn read(n: Node<'_>) -> Result<PoolConfig, ConfigError> {
        PoolConfig::read_as(n, None).map(|(p, _)| p)
    }

    /// The prefill set of a disaggregated pool, as the pool `name` (the pool-only keys were refused).
    pub(super) fn read_set(n: Node<'_>, name: String) -> Result<PoolConfig, ConfigError> {
        PoolConfig::read_as(n, Some(name)).map(|(p, _)| p)
    }

    /// A pool and, when it is disaggregated, its prefill set; `set_name`: read a prefill set under this name.
    fn read_as(
        n: Node<'_>,
        set_name: Option<String>,
    ) -> Result<(PoolConfig, Option<PoolConfig>), ConfigError> {
        read_keys!(
            n;
            name,
            models,
            policy,
            max_in_flight_per_endpoint,
            endpoints,
            health_check,
            prefill,
            sessions,
            engine_stats,
            prefix,
            outlier_detection,
            expose: "expose_paths",
            queue,
            kv_events,
            tokenizer,
            tls,
            disaggregation,
            ttft_budget,
        );
        let is_set = set_name.is_some();
        let name = match set_name {
            Some(s) => s,
            None => {
                let s = name.string()?.trim().to_string();
                if s.is_empty() {
                    return Err(name.err("must not be empty"));
                }
                s
            }
        };
        // A prefill set serves no model of its own: only its pool's prefill legs reach it.
        let models = if is_set {
            Vec::new()
        } else {
            model_list(&models)?
        };
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
        let endpoints_at = endpoints;
        let mut endpoints = endpoint_list(&endpoints_at)?;
        engine_tls(&tls, &mut endpoints)?;
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
        let outlier = OutlierConfig::read(outlier_detection.section()?)?;
        let queue = match queue.optional_section()? {
            None => None,
            Some(q) => Some(QueueConfig::read(q, max_in_flight_per_endpoint)?),
        };
        let ttft_budget = match ttft_budget.optional_section()? {
            None => None,
            Some(b) => Some(TtftBudgetConfig::read(b, policy)?),
        };
        let kv_events = KvEventsConfig::read(kv_events.section()?)?;
        check_kv_publishers(&endpoints_at, &endpoints, &kv_events)?;
        let tokenizer = match tokenizer.optional_section()? {
            None => None,
            Some(t) => Some(TokenizerConfig::read(t)?),
        };
        let (disaggregation, prefill_set) = match Disaggregation::read(&disaggregation, &name)? {
            Some((d, set)) => {
                super::disaggregation::check_apart(&disaggregation, &endpoints, &set, &name)?;
                (Some(d), Some(set))
            }
            None => (None, None),
        };
        let pool = PoolConfig {
            kv_events,
            name,
            models,
            policy: PolicyConfig::new(policy, sessions, prefix),
            endpoints,
            health_check,
            prefill,
            max_in_flight_per_endpoint,
            engine_stats,
            outlier,
            expose_paths: expose_paths(&expose)?,
            queue,
            tokenizer,
            disaggregation,
            prefill_of: None,
            ttft_budget,
        };
        Ok((pool, prefill_set))
    }
}

impl PoolConfig {
    /// The KV-event subscription of the endpoint labelled `label`, if it names a publisher.
    pub fn kv_subscription(&self, label: &str) -> Option<KvSubscription> {
        let ep = self.endpoints.iter().find(|e| e.label == label)?;
        Some(KvSubscription::of(&self.kv_events, ep.kv_events.as_ref()?))
    }
}

/// Each endpoint's publisher once, and a `*` host only where the router binds.
fn check_kv_publishers(
    at: &Field<'_>,
    endpoints: &[EndpointConfig],
    cfg: &KvEventsConfig,
) -> Result<(), ConfigError> {
    for (i, ep) in endpoints.iter().enumerate() {
        let Some(kv) = &ep.kv_events else { continue };
        if !kv.bind.unwrap_or(cfg.bind) && kv.endpoint.contains("://*:") {
            return Err(at.err_in_item(
                i,
                "kv_events",
                format!(
                    "`{}`: a `*` host can only be bound; set `bind: true`, or write the engine's address to connect to it",
                    kv.endpoint
                ),
            ));
        }
        if let Some(j) = endpoints[..i].iter().position(|o| {
            o.kv_events
                .as_ref()
                .is_some_and(|k| k.endpoint == kv.endpoint)
        }) {
            return Err(at.err_in_item(
                i,
                "kv_events",
                format!(
                    "publisher `{}` is already endpoints[{j}]'s; each engine publishes on its own port",
                    kv.endpoint
                ),
            ));
        }
    }
    Ok(())
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

/// `Debug` shows `api_key` as `Some("***")`, never the key itself.
#[derive(Clone)]
pub struct EndpointConfig {
    /// The URL as written ("http://host:port" or "https://host:port").
    pub url: String,
    /// "host:port" as written in the URL (port defaulted to 80): the `endpoint` metric label.
    pub label: String,
    /// The host part, used as the upstream Host header.
    pub host: String,
    /// Resolved at load time (first address; IPv4 preferred).
    pub addr: SocketAddr,
    /// Bearer token for the endpoint, read from api_key_env or api_key_file at load time. Never logged.
    pub api_key: Option<String>,
    /// The engine's KV-event publisher, if the router subscribes to it.
    pub kv_events: Option<KvEndpointConfig>,
    /// `https://`: how its certificate is checked (the pool's `tls`); None = plain HTTP.
    pub tls: Option<EngineTls>,
}

impl std::fmt::Debug for EndpointConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EndpointConfig")
            .field("url", &self.url)
            .field("label", &self.label)
            .field("host", &self.host)
            .field("addr", &self.addr)
            .field("api_key", &self.api_key.as_ref().map(|_| "***"))
            .field("kv_events", &self.kv_events)
            .field("tls", &self.tls)
            .finish()
    }
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
    pub(super) fn read(f: &Field<'_>) -> Result<EndpointConfig, ConfigError> {
        match f.required()? {
            Value::String(_) => EndpointConfig::at_url(f),
            Value::Mapping(_) => EndpointConfig::read_mapping(f.section()?),
            other => Err(f.type_err("a mapping with `url` (or a URL string)", other)),
        }
    }

    pub(super) fn read_mapping(n: Node<'_>) -> Result<EndpointConfig, ConfigError> {
        read_keys!(n; url, api_key_env, api_key_file, kv_events);
        let mut ep = EndpointConfig::at_url(&url)?;
        ep.api_key = api_key(&n, &api_key_env, &api_key_file)?;
        ep.kv_events = KvEndpointConfig::read(&kv_events)?;
        Ok(ep)
    }

    /// The endpoint at the URL in `url` (parsed and resolved), without an API key.
    fn at_url(url: &Field<'_>) -> Result<EndpointConfig, ConfigError> {
        let text = url.string()?.trim().to_string();
        let (host, port, https) = parse_http_url(&text).map_err(|r| url.err(r))?;
        let tls = https.then(|| EngineTls::for_host(&host));
        let addr = resolve(&host, port).map_err(|r| url.err(r))?;
        Ok(EndpointConfig {
            label: format!("{host}:{port}"),
            url: text,
            host,
            addr,
            api_key: None,
            kv_events: None,
            tls,
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
        (None, Some(_)) => (file, super::walk::secret_from_file(file)?),
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

#[derive(Debug, Clone, PartialEq)]
pub struct HealthCheckConfig {
    pub path: String,
    pub interval: Duration,
    pub timeout: Duration,
    pub healthy_after: usize,
    pub unhealthy_after: usize,
    /// When every endpoint of the pool fails its check, place across those whose engine answers it rather than
    /// refuse (Envoy's panic mode, nginx's reset of failed servers): a check that times out under load, or a
    /// wrong `path`, must not stop a pool whose engines still serve.
    pub route_when_all_unhealthy: bool,
}

impl Default for HealthCheckConfig {
    fn default() -> Self {
        HealthCheckConfig {
            path: "/health".to_string(),
            interval: Duration::from_secs(2),
            timeout: Duration::from_secs(1),
            healthy_after: 2,
            unhealthy_after: 2,
            route_when_all_unhealthy: true,
        }
    }
}

impl HealthCheckConfig {
    pub(super) fn read(n: Node<'_>) -> Result<HealthCheckConfig, ConfigError> {
        read_keys!(n; path, interval, timeout, healthy_after, unhealthy_after, route_when_all_unhealthy);
        let d = HealthCheckConfig::default();
        Ok(HealthCheckConfig {
            path: path.url_path_or(&d.path)?,
            interval: interval.duration_or(d.interval)?,
            timeout: timeout.duration_or(d.timeout)?,
            healthy_after: to_usize(healthy_after.positive_or(d.healthy_after as u64)?),
            unhealthy_after: to_usize(unhealthy_after.positive_or(d.unhealthy_after as u64)?),
            route_when_all_unhealthy: route_when_all_unhealthy
                .bool_or(d.route_when_all_unhealthy)?,
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PrefillConfig {
    pub bytes_per_token: f64,
    pub max_tokens: u64,
    /// What one inline base64 attachment (an image, mostly) costs in prompt tokens, whatever its size.
    pub tokens_per_image: u64,
}

/// A screenshot of 1 to 1.5 megapixels costs common vision models about 1,300 to 2,000 tokens (Qwen2.5-VL: one per
/// 28x28 pixels; Claude: about 1,600 for 1.15 MP); its base64 over 4 bytes per token would read as 300,000.
pub const DEFAULT_TOKENS_PER_IMAGE: u64 = 1500;

impl Default for PrefillConfig {
    fn default() -> Self {
        PrefillConfig {
            bytes_per_token: 4.0,
            max_tokens: 262_144,
            tokens_per_image: DEFAULT_TOKENS_PER_IMAGE,
        }
    }
}

impl PrefillConfig {
    pub(super) fn read(n: Node<'_>) -> Result<PrefillConfig, ConfigError> {
        read_keys!(n; bytes_per_token, max_tokens, tokens_per_image);
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
            tokens_per_image: tokens_per_image.uint_or(d.tokens_per_image)?,
        })
    }
}

#[cfg(test)]
mod tests;
