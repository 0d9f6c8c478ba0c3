//! Every setting a reload looks at, one row each: its key as written, whether it applies in place and why not,
//! and where it sits in the configuration. The plan and the check for unlisted changes both read these rows.

use std::any::Any;
use std::fmt::Debug;

use crate::config::{
    Config, EngineStatsConfig, PoolConfig, PrefixConfig, QueueConfig, SessionsConfig, TlsConfig,
};

/// A setting's value, compared by its `Debug` text (every config type has one, and it never shows a key) and
/// copied from one configuration into another.
pub(super) trait Value: Debug {
    fn as_any(&self) -> &dyn Any;
    /// Take `other`'s value (a value of the same setting, so of the same type).
    fn take(&mut self, other: &dyn Value);
}

impl<T: Debug + Clone + 'static> Value for T {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn take(&mut self, other: &dyn Value) {
        if let Some(v) = other.as_any().downcast_ref::<T>() {
            self.clone_from(v);
        }
    }
}

/// How a reload treats a setting.
#[derive(Debug, Clone, Copy)]
pub(super) enum Rule {
    /// The running router takes the new value.
    InPlace,
    /// Kept at its running value, for this reason.
    AtStart(&'static str),
    /// Like `AtStart`, and its values are not shown (the `server` section is raw YAML).
    AtStartUnshown(&'static str),
    /// In place, except in a pool running predicted_ttft.
    UnlessPredicted,
    /// Not compared here: its own code applies and reports it (endpoints, client keys), or it is the identity a
    /// pool is matched by.
    Elsewhere,
}

/// Where a setting sits in a configuration part `C`.
pub(super) type Field<C> = fn(&mut C) -> &mut dyn Value;

/// A part of a pool with rules of its own, which the plan compares by itself; the unlisted check takes it whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Part {
    /// The kind is fixed; its sessions ([`SESSIONS`]) and prefix ([`PREFIX`]) keys change in place.
    Policy,
    /// On or off is fixed ([`WHY_STATS`]); its keys ([`ENGINE_STATS`]) change in place.
    EngineStats,
    /// On or off is fixed ([`WHY_QUEUE`]); its keys ([`QUEUE`]) change in place.
    Queue,
}

/// One row: a key of part `C`, or a part of it with rules of its own.
pub(super) enum Row<C: 'static> {
    Key(&'static str, Rule, Field<C>),
    Part(Field<C>, Part),
}

pub(super) const WHY_LISTEN: &str = "listening sockets are bound at start";
pub(super) const WHY_TLS: &str =
    "the listeners are bound at start as plain HTTP or HTTPS; only their certificate changes in place";
pub(super) const WHY_SERVER: &str = "Pingora reads its server settings at start";
pub(super) const WHY_GATE: &str = "the client connection gate is built at start";
pub(super) const WHY_BUDGET: &str = "the shared body budget is sized at start";
pub(super) const WHY_SCREEN: &str = "the path screen is built at start";
pub(super) const WHY_ACCESS_LOG: &str = "the access log is opened at start";
pub(super) const WHY_STATE_FILE: &str =
    "the state file is read at start and written by the instance that started with it";
pub(super) const WHY_POOLS: &str = "pools are built at start";
pub(super) const WHY_MODELS: &str = "which pool serves which model is fixed at start";
pub(super) const WHY_POLICY: &str = "the pool's placement reasons (and their metric series) are fixed at start, and a new \
                          policy would start without the old one's state (session bindings, prefix index)";
pub(super) const WHY_SESSIONS: &str =
    "turning sessions on or off changes the pool's placement reasons (their metric \
                            series are fixed at start) and creates or drops the session table";
pub(super) const WHY_HEALTH_INTERVAL: &str = "the health-check interval is set at start";
pub(super) const WHY_STATS: &str = "engine-stats scraping is turned on or off at start";
pub(super) const WHY_QUEUE: &str = "a pool's wait queue is created at start";
pub(super) const WHY_CLUSTER: &str =
    "the shared store's connection and its publish task are set up at start";
pub(super) const WHY_OTHER: &str = "the router keeps the values it started with";
pub(super) const WHY_PREDICTED_PREFIX: &str =
    "predicted_ttft sizes and hashes its prefix index with the prefix settings and \
                                    bytes_per_token it started with";

use Row::Key;
use Rule::{AtStart, AtStartUnshown, Elsewhere, InPlace, UnlessPredicted};

/// The router's own settings (pools are matched by name and compared with [`POOL`]).
pub(super) const TOP: &[Row<Config>] = &[
    Key("source", Elsewhere, |c| &mut c.source),
    Key("listen", AtStart(WHY_LISTEN), |c| &mut c.listen),
    Key("metrics_listen", AtStart(WHY_LISTEN), |c| {
        &mut c.metrics_listen
    }),
    // On or off is fixed ([`WHY_TLS`]); its keys ([`TLS`]) change in place: the plan compares it by itself.
    Key("tls", Elsewhere, |c| &mut c.tls),
    Key("server", AtStartUnshown(WHY_SERVER), |c| &mut c.server_yaml),
    Key("timeouts.connect", InPlace, |c| &mut c.timeouts.connect),
    Key("timeouts.response_header", InPlace, |c| {
        &mut c.timeouts.response_header
    }),
    Key("timeouts.stream_idle", InPlace, |c| {
        &mut c.timeouts.stream_idle
    }),
    Key("timeouts.request_body", InPlace, |c| {
        &mut c.timeouts.request_body
    }),
    Key("timeouts.request_header", AtStart(WHY_GATE), |c| {
        &mut c.timeouts.request_header
    }),
    Key("timeouts.client_idle", InPlace, |c| {
        &mut c.timeouts.client_idle
    }),
    Key("timeouts.client_write", InPlace, |c| {
        &mut c.timeouts.client_write
    }),
    Key("max_retries", InPlace, |c| &mut c.max_retries),
    Key("max_body_bytes", InPlace, |c| &mut c.max_body_bytes),
    Key("max_session_key_bytes", InPlace, |c| {
        &mut c.max_session_key_bytes
    }),
    Key("body_budget_bytes", AtStart(WHY_BUDGET), |c| {
        &mut c.body_budget_bytes
    }),
    Key("body_budget_wait", InPlace, |c| &mut c.body_budget_wait),
    Key("max_client_connections", AtStart(WHY_GATE), |c| {
        &mut c.max_client_connections
    }),
    Key("expose_paths", AtStart(WHY_SCREEN), |c| &mut c.expose_paths),
    Key("trusted_proxies", InPlace, |c| &mut c.trusted_proxies),
    Key("cors_allowed_origins", InPlace, |c| {
        &mut c.cors_allowed_origins
    }),
    Key("access_log", AtStart(WHY_ACCESS_LOG), |c| &mut c.access_log),
    Key("endpoint_header", InPlace, |c| &mut c.endpoint_header),
    Key("state_file", AtStart(WHY_STATE_FILE), |c| &mut c.state_file),
    Key("cluster", AtStart(WHY_CLUSTER), |c| &mut c.cluster),
    // Applied as a whole (`Admission::reload_keys` logs it).
    Key("auth", Elsewhere, |c| &mut c.auth),
    // The token file is re-read on every reload; `reload::apply` says what changed (never the token).
    Key("metrics_auth", Elsewhere, |c| &mut c.metrics_auth),
    // The span pipeline is rebuilt with the new settings (`traces::Tracing::configure`); requests in flight end
    // their spans through the old one.
    Key("tracing", InPlace, |c| &mut c.tracing),
    Key("route_receipt", InPlace, |c| &mut c.route_receipt),
];

/// `tls`, when it is on before and after: new handshakes take the certificate the files hold now.
pub(super) const TLS: &[Row<TlsConfig>] = &[
    Key("tls.cert_file", InPlace, |t| &mut t.cert_file),
    Key("tls.key_file", InPlace, |t| &mut t.key_file),
    Key("tls.certificate", InPlace, |t| &mut t.certificate),
];

/// One pool's settings.
pub(super) const POOL: &[Row<PoolConfig>] = &[
    Key("name", Elsewhere, |p| &mut p.name),
    Key("models", AtStart(WHY_MODELS), |p| &mut p.models),
    // A prefill set is a pool of its own, built at start like any pool.
    Key("disaggregation", AtStart(WHY_POOLS), |p| {
        &mut p.disaggregation
    }),
    Key("disaggregation (prefill set)", AtStart(WHY_POOLS), |p| {
        &mut p.prefill_of
    }),
    Row::Part(|p| &mut p.policy, Part::Policy),
    Key("outlier_detection.consecutive_failures", InPlace, |p| {
        &mut p.outlier.consecutive_failures
    }),
    Key("outlier_detection.base_ejection", InPlace, |p| {
        &mut p.outlier.base_ejection
    }),
    Key("outlier_detection.max_ejection", InPlace, |p| {
        &mut p.outlier.max_ejection
    }),
    Key("outlier_detection.max_ejected_percent", InPlace, |p| {
        &mut p.outlier.max_ejected_percent
    }),
    Key("outlier_detection.saturation_cooldown", InPlace, |p| {
        &mut p.outlier.saturation_cooldown
    }),
    Key("outlier_detection.failure_percent", InPlace, |p| {
        &mut p.outlier.failure_percent
    }),
    Key("outlier_detection.failure_min_requests", InPlace, |p| {
        &mut p.outlier.failure_min_requests
    }),
    Key("outlier_detection.failure_window", InPlace, |p| {
        &mut p.outlier.failure_window
    }),
    Key("outlier_detection.failure_penalty", InPlace, |p| {
        &mut p.outlier.failure_penalty
    }),
    Key("outlier_detection.stream_headers_within", InPlace, |p| {
        &mut p.outlier.stream_headers_within
    }),
    // The next round of checks takes these (a wrong `path` fixed without losing the session bindings), except
    // the interval, which pingora-load-balancing's check loop is built with.
    Key("health_check.path", InPlace, |p| &mut p.health_check.path),
    Key("health_check.interval", AtStart(WHY_HEALTH_INTERVAL), |p| {
        &mut p.health_check.interval
    }),
    Key("health_check.timeout", InPlace, |p| {
        &mut p.health_check.timeout
    }),
    Key("health_check.healthy_after", InPlace, |p| {
        &mut p.health_check.healthy_after
    }),
    Key("health_check.unhealthy_after", InPlace, |p| {
        &mut p.health_check.unhealthy_after
    }),
    Key("health_check.route_when_all_unhealthy", InPlace, |p| {
        &mut p.health_check.route_when_all_unhealthy
    }),
    Key("prefill.bytes_per_token", UnlessPredicted, |p| {
        &mut p.prefill.bytes_per_token
    }),
    Key("prefill.max_tokens", InPlace, |p| &mut p.prefill.max_tokens),
    Key("prefill.tokens_per_image", InPlace, |p| {
        &mut p.prefill.tokens_per_image
    }),
    // Loaded and checked when the file was read; a changed directory or changed files (their fingerprint) take
    // effect for the next request.
    Key("tokenizer", InPlace, |p| &mut p.tokenizer),
    Key("max_in_flight_per_endpoint", InPlace, |p| {
        &mut p.max_in_flight_per_endpoint
    }),
    Row::Part(|p| &mut p.engine_stats, Part::EngineStats),
    Key("expose_paths", AtStart(WHY_SCREEN), |p| &mut p.expose_paths),
    Row::Part(|p| &mut p.queue, Part::Queue),
    // The subscribers re-read it every second; a changed subscription restarts with an empty index.
    Key("kv_events", InPlace, |p| &mut p.kv_events),
    Key("endpoints", Elsewhere, |p| &mut p.endpoints),
];

/// A pool's `engine_stats`, when it has them before and after.
pub(super) const ENGINE_STATS: &[Row<EngineStatsConfig>] = &[
    Key("engine_stats.kind", InPlace, |e| &mut e.kind),
    Key("engine_stats.path", InPlace, |e| &mut e.path),
    Key("engine_stats.interval", InPlace, |e| &mut e.interval),
    Key("engine_stats.metric_prefix", InPlace, |e| {
        &mut e.metric_prefix
    }),
];

/// A pool's `queue`, when it has one before and after.
pub(super) const QUEUE: &[Row<QueueConfig>] = &[
    Key("queue.max_length", InPlace, |q| &mut q.max_length),
    Key("queue.max_wait", InPlace, |q| &mut q.max_wait),
];

/// A pool's `sessions`, when it keeps them before and after.
pub(super) const SESSIONS: &[Row<SessionsConfig>] = &[
    Key("sessions.header", InPlace, |s| &mut s.headers),
    Key("sessions.ttl", InPlace, |s| &mut s.ttl),
    Key("sessions.max_sessions", InPlace, |s| &mut s.max_sessions),
    Key("sessions.move_margin", InPlace, |s| &mut s.move_margin),
    Key("sessions.prompt_cache_key", InPlace, |s| {
        &mut s.prompt_cache_key
    }),
];

/// A pool's `prefix`.
pub(super) const PREFIX: &[Row<PrefixConfig>] = &[
    Key("prefix.block_bytes", UnlessPredicted, |p| {
        &mut p.block_bytes
    }),
    Key("prefix.min_match_bytes", UnlessPredicted, |p| {
        &mut p.min_match_bytes
    }),
    Key(
        "prefix.capacity_tokens_per_endpoint",
        UnlessPredicted,
        |p| &mut p.capacity_tokens_per_endpoint,
    ),
    Key("prefix.fallback", UnlessPredicted, |p| &mut p.fallback),
];
