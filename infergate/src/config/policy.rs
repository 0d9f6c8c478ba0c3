//! A pool's placement policy and the policies' settings: `policy`, `sessions`, `engine_stats` and `prefix`.

use std::time::Duration;

use serde_norway::Value;

use super::values::to_usize;
use super::walk::read_keys;
use super::walk::{Field, Node};
use super::ConfigError;

/// The one list of policies: a row is a policy's variant, its name in the YAML file (also its metric label) and
/// the settings sections it reads (`sessions`, `prefix`), which become its [`PolicyConfig`] variant. It makes
/// [`Policy`] (`ALL`, `as_str`) and [`PolicyConfig`] (`new`, `kind`), so adding a policy here is one row.
macro_rules! policies {
    ($($(#[$doc:meta])* $variant:ident = $name:literal $({ $($field:ident: $ty:ty),* })?,)*) => {
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum Policy {
            $($variant,)*
        }

        impl Policy {
            /// Every policy, in the order the names are listed in messages.
            pub const ALL: [Policy; [$(Policy::$variant),*].len()] = [$(Policy::$variant),*];

            /// The name used in the YAML file (and in metric labels).
            pub fn as_str(self) -> &'static str {
                match self {
                    $(Policy::$variant => $name,)*
                }
            }
        }

        /// A pool's policy with the settings that only it reads.
        #[derive(Debug, Clone, PartialEq)]
        pub enum PolicyConfig {
            $($(#[$doc])* $variant $({ $($field: $ty),* })?,)*
        }

        impl PolicyConfig {
            /// Combine the keys read from a pool into its policy's variant (sessions were already checked against
            /// the policy; a `prefix` section of another policy is validated and unused).
            pub(super) fn new(
                kind: Policy,
                sessions: Option<SessionsConfig>,
                prefix: PrefixConfig,
            ) -> PolicyConfig {
                match kind {
                    $(Policy::$variant => PolicyConfig::$variant $({
                        $($field: policies!(@read $field, sessions, prefix)),*
                    })?,)*
                }
            }

            pub fn kind(&self) -> Policy {
                match self {
                    $(PolicyConfig::$variant $({ $($field: _),* })? => Policy::$variant,)*
                }
            }
        }
    };
    (@read sessions, $sessions:ident, $prefix:ident) => { $sessions };
    (@read prefix, $sessions:ident, $prefix:ident) => { $prefix };
}

policies! {
    RoundRobin = "round_robin",
    LeastRequest = "least_request",
    LoadAware = "load_aware" { sessions: Option<SessionsConfig> },
    PrefixAware = "prefix_aware" { prefix: PrefixConfig },
    /// Lowest predicted time to first token; `prefix` sizes its prefix index.
    PredictedTtft = "predicted_ttft" { sessions: Option<SessionsConfig>, prefix: PrefixConfig },
}

impl Policy {
    /// A pool's `policy`: load_aware when absent.
    pub(super) fn read(f: &Field<'_>) -> Result<Policy, ConfigError> {
        if f.value().is_none() {
            return Ok(Policy::LoadAware);
        }
        let s = f.string()?.trim();
        match Policy::ALL.iter().find(|pol| pol.as_str() == s) {
            Some(pol) => Ok(*pol),
            None => {
                let names: Vec<&str> = Policy::ALL.iter().map(|p| p.as_str()).collect();
                Err(f.err(format!(
                    "unknown policy `{s}`; expected one of {}",
                    names.join(", ")
                )))
            }
        }
    }
}

impl PolicyConfig {
    /// Session settings, when the policy keeps sessions.
    pub fn sessions(&self) -> Option<&SessionsConfig> {
        match self {
            PolicyConfig::LoadAware { sessions } | PolicyConfig::PredictedTtft { sessions, .. } => {
                sessions.as_ref()
            }
            _ => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub struct SessionsConfig {
    /// Lower-cased header names, in the order they are looked for: the first a request carries (non-empty) names its
    /// session. A list serves clients that name sessions differently from one pool (Claude Code sends
    /// `x-claude-code-session-id` on every request). Parsed once: a lookup by text would parse the name again on
    /// every request.
    pub headers: Vec<http::HeaderName>,
    pub ttl: Duration,
    pub max_sessions: usize,
    /// predicted_ttft: a session moves only when the move's predicted cost is lower than staying's by more than
    /// this share of staying's (0..=1; 1 never moves a session off a healthy endpoint below its limit).
    pub move_margin: f64,
    /// Without a session header, a request's top-level `prompt_cache_key` names its session (agents set it to
    /// their session or thread id). Off by default: one key shared by unrelated traffic would be one session.
    pub prompt_cache_key: bool,
}

/// The SDK clients' conventional header first, then those coding agents send on every request unasked: Claude
/// Code's and Codex CLI's (`session-id`, on the Responses API).
pub const DEFAULT_SESSION_HEADERS: [&str; 3] =
    ["x-session-id", "x-claude-code-session-id", "session-id"];

/// A move must save more than a tenth of staying's predicted cost: estimates are noisy (bytes per token, a
/// fitted speed) and a move that saves nothing real throws away a warm cache. Higher values keep more of the
/// prefix cache for less of the TTFT lead (BENCHMARKS.md, "What moving a session buys and costs").
pub const DEFAULT_MOVE_MARGIN: f64 = 0.1;

impl Default for SessionsConfig {
    fn default() -> Self {
        SessionsConfig {
            headers: DEFAULT_SESSION_HEADERS
                .map(http::HeaderName::from_static)
                .to_vec(),
            ttl: Duration::from_secs(2 * 3600),
            max_sessions: 100_000,
            move_margin: DEFAULT_MOVE_MARGIN,
            prompt_cache_key: false,
        }
    }
}

impl SessionsConfig {
    /// A pool's `sessions`, allowed with policies load_aware and predicted_ttft only.
    pub(super) fn read(n: Node<'_>, policy: Policy) -> Result<SessionsConfig, ConfigError> {
        read_keys!(n; header, ttl, max_sessions, move_margin, prompt_cache_key);
        if !matches!(policy, Policy::LoadAware | Policy::PredictedTtft) {
            return Err(n.err(format!(
                "sessions require policy load_aware or predicted_ttft (this pool's policy is {}); remove `sessions` or change the policy",
                policy.as_str()
            )));
        }
        let d = SessionsConfig::default();
        let headers = match header.value() {
            None => d.headers.clone(),
            Some(_) => session_headers(&header)?,
        };
        let move_margin = match move_margin.value() {
            None => d.move_margin,
            Some(_) if policy != Policy::PredictedTtft => {
                return Err(move_margin.err(format!(
                "is read by policy predicted_ttft only ({} moves a session on pressure); remove it",
                policy.as_str()
            )))
            }
            Some(Value::Number(v)) => {
                let x = v.as_f64().unwrap_or(f64::NAN);
                if !(0.0..=1.0).contains(&x) {
                    return Err(move_margin.err(format!(
                        "must be a number from 0 to 1 (1: never move a session off a healthy endpoint below its limit), found {x}"
                    )));
                }
                x
            }
            Some(other) => return Err(move_margin.type_err("a number", other)),
        };
        Ok(SessionsConfig {
            headers,
            ttl: ttl.duration_or(d.ttl)?,
            max_sessions: to_usize(max_sessions.positive_or(d.max_sessions as u64)?),
            move_margin,
            prompt_cache_key: prompt_cache_key.bool_or(d.prompt_cache_key)?,
        })
    }
}

/// `sessions.header`: one header name or a non-empty list of them, each valid and listed once.
fn session_headers(f: &Field<'_>) -> Result<Vec<http::HeaderName>, ConfigError> {
    let one = |item: &Field<'_>| -> Result<http::HeaderName, ConfigError> {
        let raw = item.string()?.trim();
        match http::HeaderName::from_bytes(raw.as_bytes()) {
            Ok(h) => Ok(h),
            Err(_) => Err(item.err(format!(
                "`{raw}` is not a valid HTTP header name (letters, digits and -_.!#$%&'*+^`|~ only)"
            ))),
        }
    };
    let Some(Value::Sequence(seq)) = f.value() else {
        return Ok(vec![one(f)?]);
    };
    if seq.is_empty() {
        return Err(f.err("at least one header name is required"));
    }
    let mut headers: Vec<http::HeaderName> = Vec::new();
    for (i, v) in seq.iter().enumerate() {
        let item = f.item(i, v);
        let h = one(&item)?;
        if headers.contains(&h) {
            return Err(item.err(format!("header `{h}` is listed twice")));
        }
        headers.push(h);
    }
    Ok(headers)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EngineKind {
    Vllm,
    Sglang,
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

#[derive(Debug, Clone, PartialEq)]
pub struct EngineStatsConfig {
    pub kind: EngineKind,
    pub path: String,
    pub interval: Duration,
    /// Defaults by kind: "vllm:" or "sglang:".
    pub metric_prefix: String,
}

impl EngineStatsConfig {
    pub(super) fn read(n: Node<'_>) -> Result<EngineStatsConfig, ConfigError> {
        read_keys!(n; kind, path, interval, metric_prefix);
        let kind = match kind.value() {
            None => EngineKind::Vllm,
            Some(_) => match kind.string()?.trim() {
                "vllm" => EngineKind::Vllm,
                "sglang" => EngineKind::Sglang,
                other => {
                    return Err(kind.err(format!(
                        "unknown engine kind `{other}`; expected one of vllm, sglang"
                    )))
                }
            },
        };
        let metric_prefix = match metric_prefix.value() {
            None => kind.default_metric_prefix().to_string(),
            Some(_) => metric_prefix.string()?.trim().to_string(),
        };
        Ok(EngineStatsConfig {
            kind,
            path: path.url_path_or("/metrics")?,
            interval: interval.duration_or(Duration::from_secs(1))?,
            metric_prefix,
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PrefixFallback {
    LeastInflight,
    Qps,
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

#[derive(Debug, Clone, PartialEq)]
pub struct PrefixConfig {
    pub block_bytes: usize,
    pub min_match_bytes: usize,
    pub capacity_tokens_per_endpoint: u64,
    pub fallback: PrefixFallback,
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

impl PrefixConfig {
    pub(super) fn read(n: Node<'_>) -> Result<PrefixConfig, ConfigError> {
        read_keys!(n; block_bytes, min_match_bytes, capacity_tokens_per_endpoint, fallback);
        let d = PrefixConfig::default();
        let fallback = match fallback.value() {
            None => d.fallback,
            Some(_) => match fallback.string()?.trim() {
                "least_inflight" => PrefixFallback::LeastInflight,
                "qps" => PrefixFallback::Qps,
                other => {
                    return Err(fallback.err(format!(
                        "unknown fallback `{other}`; expected one of least_inflight, qps"
                    )))
                }
            },
        };
        let min_match_bytes = to_usize(min_match_bytes.uint_or(d.min_match_bytes as u64)?);
        Ok(PrefixConfig {
            block_bytes: to_usize(block_bytes.positive_or(d.block_bytes as u64)?),
            min_match_bytes,
            capacity_tokens_per_endpoint: capacity_tokens_per_endpoint
                .positive_or(d.capacity_tokens_per_endpoint)?,
            fallback,
        })
    }
}

#[cfg(test)]
mod tests;
