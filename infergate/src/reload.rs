//! SIGHUP: apply what a re-read configuration can change in the running router, and say, setting by setting,
//! what was applied and what was not, and why.
//!
//! [`plan`] compares the file with the configuration in effect and builds the next one: the new value of every
//! setting that is read per request or that its owner can update while keeping its state, the running value of
//! every other. [`apply`] hands it over: each pool's settings (a swap the next request reads; engine-stats scrapes
//! restart with new settings within a second), its policy's
//! parameters (`PlacementPolicy::reconfigure`: the session table and prefix index keep their entries, trimmed to
//! new limits), its endpoints (kept ones keep their health, load, sessions and prefix entries), its wait queue's
//! limits, the client keys with their limits (buckets and in-flight counts kept); then the router's own settings
//! read per request. Requests in flight keep the values they started with (their holds, deadlines, queue places).
//!
//! Not applied, each logged with the reason, and taken on a restart or a graceful upgrade (`systemctl reload`,
//! which builds a new router from the file): what is bound or built at start (listeners, Pingora's server
//! settings, the client connection gate, the body budget, the path screen, the access log, the state file, pools
//! and their models, health checks, engine-stats scraping or a wait queue turned on or off), and a pool's
//! policy kind or its sessions turned on or off: the placement reasons (and their metric series) are fixed at
//! start, and a new policy would start without the old one's session bindings and prefix index, which a graceful
//! upgrade with a `state_file` hands over instead.

use std::fmt::Debug;
use std::time::Instant;

use crate::config::{
    Config, HealthCheckConfig, PolicyConfig, PoolConfig, PrefixConfig, SessionsConfig,
};
use crate::server::RouterState;

/// What a reload must tell the operator to do for a setting it could not apply.
const REMEDY: &str = "needs a restart or `systemctl reload` (graceful upgrade)";

/// A setting whose new value the running router does not take.
#[derive(Debug, Clone, PartialEq)]
pub struct NotApplied {
    /// The pool it belongs to, if any.
    pub pool: Option<String>,
    /// The key as written in the file (`timeouts.request_header`, `policy`).
    pub key: String,
    /// ` (old → new)` when both values are short, else empty.
    pub values: String,
    /// Why it cannot change in place.
    pub why: &'static str,
}

impl std::fmt::Display for NotApplied {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} changed{}: not applied, {REMEDY}: {}",
            what(&self.pool, &self.key),
            self.values,
            self.why
        )
    }
}

/// A setting applied in place.
#[derive(Debug, Clone, PartialEq)]
pub struct Applied {
    pub pool: Option<String>,
    pub key: String,
    /// ` (old → new)` when both values are short, else empty.
    pub values: String,
}

impl std::fmt::Display for Applied {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "applied {}{}", what(&self.pool, &self.key), self.values)
    }
}

fn what(pool: &Option<String>, key: &str) -> String {
    match pool {
        Some(pool) => format!("{key} of pool `{pool}`"),
        None => key.to_string(),
    }
}

/// The next configuration and what it changes.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The new value where it applies in place, the running one elsewhere.
    pub effective: Config,
    /// Settings that change in place (endpoint lists and client keys are reported by their own code).
    pub applied: Vec<Applied>,
    pub not_applied: Vec<NotApplied>,
}

/// Whether a setting changes in place: Ok, or why not.
type How = Result<(), &'static str>;
const IN_PLACE: How = Ok(());

const WHY_LISTEN: How = Err("listening sockets are bound at start");
const WHY_SERVER: How = Err("Pingora reads its server settings at start");
const WHY_GATE: How = Err("the client connection gate is built at start");
const WHY_BUDGET: How = Err("the shared body budget is sized at start");
const WHY_SCREEN: How = Err("the path screen is built at start");
const WHY_ACCESS_LOG: How = Err("the access log is opened at start");
const WHY_STATE_FILE: How =
    Err("the state file is read at start and written by the instance that started with it");
const WHY_POOLS: &str = "pools are built at start";
const WHY_MODELS: How = Err("which pool serves which model is fixed at start");
const WHY_POLICY: &str = "the pool's placement reasons (and their metric series) are fixed at start, and a new \
                          policy would start without the old one's state (session bindings, prefix index)";
const WHY_SESSIONS: &str =
    "turning sessions on or off changes the pool's placement reasons (their metric \
                            series are fixed at start) and creates or drops the session table";
const WHY_HEALTH_INTERVAL: How = Err("the health-check interval is set at start");
const WHY_STATS: How = Err("engine-stats scraping is turned on or off at start");
const WHY_QUEUE: &str = "a pool's wait queue is created at start";
const WHY_CLUSTER: How =
    Err("the shared store's connection and its publish task are set up at start");
const WHY_OTHER: &str = "the router keeps the values it started with";
const WHY_PREDICTED_PREFIX: &str =
    "predicted_ttft sizes and hashes its prefix index with the prefix settings and \
                                    bytes_per_token it started with";

/// The longest value shown in a message (`old → new`); longer ones are only named.
const SHOWN: usize = 60;

struct Diff {
    applied: Vec<Applied>,
    not_applied: Vec<NotApplied>,
    pool: Option<String>,
}

impl Diff {
    /// ` (old → new)` when they differ (compared by their `Debug` text: every config type has one, and it never
    /// shows a key), with the values when both are short; None when equal.
    fn values<T: Debug + ?Sized>(old: &T, new: &T) -> Option<String> {
        let (old, new) = (format!("{old:?}"), format!("{new:?}"));
        if old == new {
            return None;
        }
        let shown = old.len() <= SHOWN && new.len() <= SHOWN;
        Some(if shown {
            format!(" ({old} → {new})")
        } else {
            String::new()
        })
    }

    /// One setting: `next` holds the new value; when it differs from `running`, record it as applied, or as not
    /// applied and put the running value back.
    fn setting<T: Debug + Clone>(&mut self, key: &str, running: &T, next: &mut T, how: How) {
        let Some(values) = Self::values(running, next) else {
            return;
        };
        match how {
            Ok(()) => self.applied.push(Applied {
                pool: self.pool.clone(),
                key: key.to_string(),
                values,
            }),
            Err(why) => {
                self.skip(key, values, why);
                *next = running.clone();
            }
        }
    }

    fn skip(&mut self, key: &str, values: String, why: &'static str) {
        self.not_applied.push(NotApplied {
            pool: self.pool.clone(),
            key: key.to_string(),
            values,
            why,
        });
    }
}

/// Compare `new` with the configuration in effect (`running`) and build the next one.
pub fn plan(running: &Config, new: &Config) -> Plan {
    let mut d = Diff {
        applied: Vec::new(),
        not_applied: Vec::new(),
        pool: None,
    };
    let mut next = new.clone();
    let (r, n) = (running, &mut next);
    d.setting("listen", &r.listen, &mut n.listen, WHY_LISTEN);
    d.setting(
        "metrics_listen",
        &r.metrics_listen,
        &mut n.metrics_listen,
        WHY_LISTEN,
    );
    if r.server_yaml != n.server_yaml {
        d.skip("server", String::new(), WHY_SERVER.unwrap_err());
        n.server_yaml.clone_from(&r.server_yaml);
    }
    let (t0, t1) = (&r.timeouts, &mut n.timeouts);
    d.setting("timeouts.connect", &t0.connect, &mut t1.connect, IN_PLACE);
    d.setting(
        "timeouts.response_header",
        &t0.response_header,
        &mut t1.response_header,
        IN_PLACE,
    );
    d.setting(
        "timeouts.stream_idle",
        &t0.stream_idle,
        &mut t1.stream_idle,
        IN_PLACE,
    );
    d.setting(
        "timeouts.request_body",
        &t0.request_body,
        &mut t1.request_body,
        IN_PLACE,
    );
    d.setting(
        "timeouts.request_header",
        &t0.request_header,
        &mut t1.request_header,
        WHY_GATE,
    );
    d.setting(
        "timeouts.client_idle",
        &t0.client_idle,
        &mut t1.client_idle,
        IN_PLACE,
    );
    d.setting(
        "timeouts.client_write",
        &t0.client_write,
        &mut t1.client_write,
        IN_PLACE,
    );
    d.setting("max_retries", &r.max_retries, &mut n.max_retries, IN_PLACE);
    d.setting(
        "max_body_bytes",
        &r.max_body_bytes,
        &mut n.max_body_bytes,
        IN_PLACE,
    );
    d.setting(
        "body_budget_bytes",
        &r.body_budget_bytes,
        &mut n.body_budget_bytes,
        WHY_BUDGET,
    );
    d.setting(
        "body_budget_wait",
        &r.body_budget_wait,
        &mut n.body_budget_wait,
        IN_PLACE,
    );
    d.setting(
        "max_client_connections",
        &r.max_client_connections,
        &mut n.max_client_connections,
        WHY_GATE,
    );
    d.setting(
        "expose_paths",
        &r.expose_paths,
        &mut n.expose_paths,
        WHY_SCREEN,
    );
    d.setting(
        "trusted_proxies",
        &r.trusted_proxies,
        &mut n.trusted_proxies,
        IN_PLACE,
    );
    d.setting(
        "cors_allowed_origins",
        &r.cors_allowed_origins,
        &mut n.cors_allowed_origins,
        IN_PLACE,
    );
    d.setting(
        "access_log",
        &r.access_log,
        &mut n.access_log,
        WHY_ACCESS_LOG,
    );
    d.setting(
        "endpoint_header",
        &r.endpoint_header,
        &mut n.endpoint_header,
        IN_PLACE,
    );
    d.setting(
        "state_file",
        &r.state_file,
        &mut n.state_file,
        WHY_STATE_FILE,
    );
    d.setting("cluster", &r.cluster, &mut n.cluster, WHY_CLUSTER);
    // `auth` is applied as a whole (`Admission::reload_keys` logs it).

    for pc in &new.pools {
        if !r.pools.iter().any(|p| p.name == pc.name) {
            d.skip("pools", format!(" (`{}` added)", pc.name), WHY_POOLS);
        }
    }
    // The running pools in their order (the path screen and the metrics refer to them by position).
    n.pools = r
        .pools
        .iter()
        .map(|p| match new.pools.iter().find(|pc| pc.name == p.name) {
            None => {
                d.skip("pools", format!(" (`{}` removed)", p.name), WHY_POOLS);
                p.clone()
            }
            Some(pc) => {
                let mut next = pc.clone();
                pool_settings(&mut d, p, &mut next);
                next
            }
        })
        .collect();
    let names = |c: &Config| c.pools.iter().map(|p| p.name.clone()).collect::<Vec<_>>();
    let (mut old_names, mut new_names) = (names(r), names(new));
    if old_names != new_names {
        old_names.sort();
        new_names.sort();
        if old_names == new_names {
            d.skip("pools", " (order)".to_string(), WHY_POOLS);
        }
    }
    if d.not_applied.is_empty() && unlisted_change(r, new) {
        d.skip(
            "settings without a reload check of their own",
            String::new(),
            WHY_OTHER,
        );
    }
    Plan {
        effective: next,
        applied: d.applied,
        not_applied: d.not_applied,
    }
}

/// Every setting that differs between `running` and `new` and cannot change in place.
pub fn not_applied(running: &Config, new: &Config) -> Vec<NotApplied> {
    plan(running, new).not_applied
}

/// Whether `new` differs from `running` in something the checks above do not look at (a setting added to the
/// configuration later): `running` with every checked or applied value taken from `new` must equal `new`.
fn unlisted_change(running: &Config, new: &Config) -> bool {
    let mut r = running.clone();
    r.source.clone_from(&new.source);
    r.listen.clone_from(&new.listen);
    r.metrics_listen.clone_from(&new.metrics_listen);
    r.server_yaml.clone_from(&new.server_yaml);
    r.timeouts = new.timeouts;
    r.max_client_connections = new.max_client_connections;
    r.auth.clone_from(&new.auth);
    r.max_retries = new.max_retries;
    r.max_body_bytes = new.max_body_bytes;
    r.body_budget_bytes = new.body_budget_bytes;
    r.body_budget_wait = new.body_budget_wait;
    r.expose_paths.clone_from(&new.expose_paths);
    r.trusted_proxies.clone_from(&new.trusted_proxies);
    r.cors_allowed_origins.clone_from(&new.cors_allowed_origins);
    r.access_log.clone_from(&new.access_log);
    r.endpoint_header = new.endpoint_header;
    r.state_file.clone_from(&new.state_file);
    r.cluster.clone_from(&new.cluster);
    if r.pools.len() == new.pools.len() {
        for (p, n) in r.pools.iter_mut().zip(&new.pools) {
            p.name.clone_from(&n.name);
            p.models.clone_from(&n.models);
            p.policy = n.policy.clone();
            p.outlier = n.outlier.clone();
            p.endpoints.clone_from(&n.endpoints);
            p.health_check = n.health_check.clone();
            p.prefill = n.prefill;
            p.max_in_flight_per_endpoint = n.max_in_flight_per_endpoint;
            p.engine_stats.clone_from(&n.engine_stats);
            p.expose_paths.clone_from(&n.expose_paths);
            p.queue.clone_from(&n.queue);
        }
    } else {
        r.pools.clone_from(&new.pools);
    }
    format!("{r:?}") != format!("{new:?}")
}

/// One pool's settings; `next` starts as the file's.
fn pool_settings(d: &mut Diff, old: &PoolConfig, next: &mut PoolConfig) {
    d.pool = Some(old.name.clone());
    d.setting("models", &old.models, &mut next.models, WHY_MODELS);
    policy_settings(d, &old.policy, &mut next.policy);
    let (o0, o1) = (&old.outlier, &mut next.outlier);
    d.setting(
        "outlier_detection.consecutive_failures",
        &o0.consecutive_failures,
        &mut o1.consecutive_failures,
        IN_PLACE,
    );
    d.setting(
        "outlier_detection.base_ejection",
        &o0.base_ejection,
        &mut o1.base_ejection,
        IN_PLACE,
    );
    d.setting(
        "outlier_detection.max_ejection",
        &o0.max_ejection,
        &mut o1.max_ejection,
        IN_PLACE,
    );
    d.setting(
        "outlier_detection.max_ejected_percent",
        &o0.max_ejected_percent,
        &mut o1.max_ejected_percent,
        IN_PLACE,
    );
    d.setting(
        "outlier_detection.saturation_cooldown",
        &o0.saturation_cooldown,
        &mut o1.saturation_cooldown,
        IN_PLACE,
    );
    health_settings(d, &old.health_check, &mut next.health_check);
    let per_token = match old.policy {
        PolicyConfig::PredictedTtft { .. } => Err(WHY_PREDICTED_PREFIX),
        _ => IN_PLACE,
    };
    d.setting(
        "prefill.bytes_per_token",
        &old.prefill.bytes_per_token,
        &mut next.prefill.bytes_per_token,
        per_token,
    );
    d.setting(
        "prefill.max_tokens",
        &old.prefill.max_tokens,
        &mut next.prefill.max_tokens,
        IN_PLACE,
    );
    d.setting(
        "prefill.tokens_per_image",
        &old.prefill.tokens_per_image,
        &mut next.prefill.tokens_per_image,
        IN_PLACE,
    );
    d.setting(
        "max_in_flight_per_endpoint",
        &old.max_in_flight_per_endpoint,
        &mut next.max_in_flight_per_endpoint,
        IN_PLACE,
    );
    match (&old.engine_stats, &mut next.engine_stats) {
        (Some(e0), Some(e1)) => {
            d.setting("engine_stats.kind", &e0.kind, &mut e1.kind, IN_PLACE);
            d.setting("engine_stats.path", &e0.path, &mut e1.path, IN_PLACE);
            d.setting(
                "engine_stats.interval",
                &e0.interval,
                &mut e1.interval,
                IN_PLACE,
            );
            d.setting(
                "engine_stats.metric_prefix",
                &e0.metric_prefix,
                &mut e1.metric_prefix,
                IN_PLACE,
            );
        }
        (e0, e1) => d.setting("engine_stats", e0, e1, WHY_STATS),
    }
    d.setting(
        "expose_paths",
        &old.expose_paths,
        &mut next.expose_paths,
        WHY_SCREEN,
    );
    match (&old.queue, &mut next.queue) {
        (Some(q0), Some(q1)) => {
            d.setting(
                "queue.max_length",
                &q0.max_length,
                &mut q1.max_length,
                IN_PLACE,
            );
            d.setting("queue.max_wait", &q0.max_wait, &mut q1.max_wait, IN_PLACE);
        }
        (q0, q1) => d.setting("queue", q0, q1, Err(WHY_QUEUE)),
    }
    d.pool = None;
}

/// A pool's policy: its kind and whether it keeps sessions are fixed; its parameters change in place.
fn policy_settings(d: &mut Diff, old: &PolicyConfig, next: &mut PolicyConfig) {
    if old.kind() != next.kind() {
        let (from, to) = (old.kind().as_str(), next.kind().as_str());
        d.skip("policy", format!(" ({from} → {to})"), WHY_POLICY);
        *next = old.clone();
        return;
    }
    match (old, next) {
        (PolicyConfig::LoadAware { sessions: s0 }, PolicyConfig::LoadAware { sessions: s1 }) => {
            sessions_settings(d, s0, s1)
        }
        (
            PolicyConfig::PredictedTtft {
                sessions: s0,
                prefix: p0,
            },
            PolicyConfig::PredictedTtft {
                sessions: s1,
                prefix: p1,
            },
        ) => {
            sessions_settings(d, s0, s1);
            prefix_settings(d, p0, p1, Err(WHY_PREDICTED_PREFIX));
        }
        (PolicyConfig::PrefixAware { prefix: p0 }, PolicyConfig::PrefixAware { prefix: p1 }) => {
            prefix_settings(d, p0, p1, IN_PLACE)
        }
        // Round robin and least request have no parameters.
        (old, next) => d.setting("policy settings", old, next, Err(WHY_OTHER)),
    }
}

/// A pool's `health_check`: the next round of checks takes its keys (a wrong `path` fixed without losing the
/// session bindings), except the interval, which pingora-load-balancing's check loop is built with.
fn health_settings(d: &mut Diff, old: &HealthCheckConfig, next: &mut HealthCheckConfig) {
    d.setting("health_check.path", &old.path, &mut next.path, IN_PLACE);
    d.setting(
        "health_check.interval",
        &old.interval,
        &mut next.interval,
        WHY_HEALTH_INTERVAL,
    );
    d.setting(
        "health_check.timeout",
        &old.timeout,
        &mut next.timeout,
        IN_PLACE,
    );
    d.setting(
        "health_check.healthy_after",
        &old.healthy_after,
        &mut next.healthy_after,
        IN_PLACE,
    );
    d.setting(
        "health_check.unhealthy_after",
        &old.unhealthy_after,
        &mut next.unhealthy_after,
        IN_PLACE,
    );
    d.setting(
        "health_check.route_when_all_unhealthy",
        &old.route_when_all_unhealthy,
        &mut next.route_when_all_unhealthy,
        IN_PLACE,
    );
}

/// A pool's `sessions`: its keys change in place; turning sessions on or off cannot.
fn sessions_settings(
    d: &mut Diff,
    old: &Option<SessionsConfig>,
    next: &mut Option<SessionsConfig>,
) {
    match (old, next) {
        (Some(s0), Some(s1)) => {
            d.setting("sessions.header", &s0.headers, &mut s1.headers, IN_PLACE);
            d.setting("sessions.ttl", &s0.ttl, &mut s1.ttl, IN_PLACE);
            d.setting(
                "sessions.max_sessions",
                &s0.max_sessions,
                &mut s1.max_sessions,
                IN_PLACE,
            );
            d.setting(
                "sessions.move_margin",
                &s0.move_margin,
                &mut s1.move_margin,
                IN_PLACE,
            );
            d.setting(
                "sessions.prompt_cache_key",
                &s0.prompt_cache_key,
                &mut s1.prompt_cache_key,
                IN_PLACE,
            );
        }
        (s0, s1) => {
            let on = |s: &Option<_>| if s.is_some() { "on" } else { "off" };
            if s0.is_some() != s1.is_some() {
                d.skip(
                    "sessions",
                    format!(" ({} → {})", on(s0), on(s1)),
                    WHY_SESSIONS,
                );
                s1.clone_from(s0);
            }
        }
    }
}

/// A pool's `prefix` keys, each applied as `how` says.
fn prefix_settings(d: &mut Diff, old: &PrefixConfig, next: &mut PrefixConfig, how: How) {
    d.setting(
        "prefix.block_bytes",
        &old.block_bytes,
        &mut next.block_bytes,
        how,
    );
    d.setting(
        "prefix.min_match_bytes",
        &old.min_match_bytes,
        &mut next.min_match_bytes,
        how,
    );
    d.setting(
        "prefix.capacity_tokens_per_endpoint",
        &old.capacity_tokens_per_endpoint,
        &mut next.capacity_tokens_per_endpoint,
        how,
    );
    d.setting("prefix.fallback", &old.fallback, &mut next.fallback, how);
}

/// Apply `new` to the running router (see the module doc), log one line per setting applied or not, and count the
/// reload.
pub fn apply(state: &RouterState, new: &Config) {
    let path = new.source.display();
    let running = state.current();
    let Plan {
        effective,
        applied,
        mut not_applied,
    } = plan(&running, new);
    let now = Instant::now();
    let mut notes = Vec::new();
    let mut endpoints = Vec::new();
    for pool in &state.pools.pools {
        let Some(pc) = effective.pools.iter().find(|pc| *pc.name == *pool.name) else {
            continue;
        };
        match pool.reconfigure(pc, now) {
            Ok(Some(note)) => notes.push(format!("pool `{}`: {note}", pool.name)),
            Ok(None) => {}
            Err(why) => not_applied.push(NotApplied {
                pool: Some(pool.name.to_string()),
                key: "policy settings".to_string(),
                values: String::new(),
                why,
            }),
        }
        if let (Some(q), Some(qc)) = (state.admission.queue(&pool.name), pc.queue) {
            q.reconfigure(qc);
        }
        let before: Vec<String> = pool.endpoints().iter().map(|e| e.label.clone()).collect();
        let removed = pool.set_endpoints(&pc.endpoints, Some(&state.metrics));
        let added: Vec<&str> = pc
            .endpoints
            .iter()
            .map(|e| e.label.as_str())
            .filter(|l| !before.iter().any(|b| b == l))
            .collect();
        if !added.is_empty() || !removed.is_empty() {
            let removed: Vec<&str> = removed.iter().map(|e| e.label.as_str()).collect();
            endpoints.push(format!(
                "pool `{}`: {} endpoint(s) added [{}], {} removed [{}]",
                pool.name,
                added.len(),
                added.join(", "),
                removed.len(),
                removed.join(", ")
            ));
        }
    }
    if running.auth.is_some() || new.auth.is_some() {
        state.reload_keys(new);
        endpoints.push("client keys and limits re-read".to_string());
    }
    state.set_current(effective);

    if endpoints.is_empty() {
        log::info!("reload {path}: endpoint lists unchanged (keys and addresses re-read)");
    } else {
        log::info!("reload {path}: applied {}", endpoints.join("; "));
    }
    for a in &applied {
        log::info!("reload {path}: {a}");
    }
    for note in &notes {
        log::info!("reload {path}: {note}");
    }
    for s in &not_applied {
        log::warn!("reload {path}: {s}");
    }
    if not_applied.is_empty() {
        state.metrics.count_reload("applied");
    } else {
        state.metrics.count_reload("partial");
        log::warn!(
            "reload {path}: {} setting(s) not applied; the router keeps running with their old values",
            not_applied.len()
        );
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    fn conf(extra: &str, pool_extra: &str) -> Config {
        let text = format!(
            "{extra}pools:\n  - name: a\n    endpoints: [\"http://127.0.0.1:9\"]\n{pool_extra}"
        );
        Config::parse(Path::new("t.yaml"), &text).expect("valid")
    }

    #[test]
    fn endpoints_alone_leave_nothing_unapplied() {
        let old = conf("", "");
        let mut new = old.clone();
        new.pools[0].endpoints.clear();
        assert_eq!(not_applied(&old, &new), vec![]);
    }

    #[test]
    fn a_policy_change_is_named_with_its_pool_and_what_to_do() {
        let old = conf("", "");
        let new = conf("", "    policy: prefix_aware\n");
        let p = plan(&old, &new);
        let n = p.not_applied;
        assert_eq!(n.len(), 1, "{n:?}");
        assert_eq!(
            n[0].to_string(),
            "policy of pool `a` changed (load_aware → prefix_aware): not applied, needs a restart or \
             `systemctl reload` (graceful upgrade): the pool's placement reasons (and their metric series) are \
             fixed at start, and a new policy would start without the old one's state (session bindings, prefix \
             index)"
        );
        // The pool keeps running its policy.
        assert_eq!(p.effective.pools[0].policy, old.pools[0].policy);
        // Sessions turned on: the same.
        let n = not_applied(&old, &conf("", "    sessions: {}\n"));
        assert_eq!(n.len(), 1, "{n:?}");
        assert_eq!(n[0].key, "sessions");
        assert_eq!(n[0].values, " (off → on)");
    }

    #[test]
    fn policy_parameters_limits_and_per_request_settings_apply() {
        let old = conf(
            "",
            "    sessions: { ttl: 1h }\n    max_in_flight_per_endpoint: 4\n    queue: {}\n",
        );
        let new = conf(
            "timeouts: { connect: 5s, client_idle: 3s }\nmax_retries: 0\nendpoint_header: false\n",
            "    sessions: { ttl: 5m, max_sessions: 10, header: x-conv }\n    max_in_flight_per_endpoint: 8\n    \
             queue: { max_wait: 1s }\n    prefill: { bytes_per_token: 3, tokens_per_image: 800 }\n    outlier_detection: { base_ejection: 1s }\n",
        );
        let p = plan(&old, &new);
        assert_eq!(p.not_applied, vec![]);
        let applied: Vec<String> = p.applied.iter().map(|a| a.to_string()).collect();
        assert_eq!(
            applied,
            [
                "applied timeouts.connect (2s → 5s)",
                "applied timeouts.client_idle (60s → 3s)",
                "applied max_retries (2 → 0)",
                "applied endpoint_header (true → false)",
                "applied sessions.header of pool `a` ([\"x-session-id\", \"x-claude-code-session-id\", \"session-id\"] → [\"x-conv\"])",
                "applied sessions.ttl of pool `a` (3600s → 300s)",
                "applied sessions.max_sessions of pool `a` (100000 → 10)",
                "applied outlier_detection.base_ejection of pool `a` (2s → 1s)",
                "applied prefill.bytes_per_token of pool `a` (4.0 → 3.0)",
                "applied prefill.tokens_per_image of pool `a` (1500 → 800)",
                "applied max_in_flight_per_endpoint of pool `a` (Some(4) → Some(8))",
                "applied queue.max_wait of pool `a` (10s → 1s)",
            ]
        );
        // Everything applied: the next configuration is the file's.
        assert_eq!(format!("{:?}", p.effective), format!("{new:?}"));
        let stats = |i: &str| conf("", &format!("    engine_stats: {{ interval: {i} }}\n"));
        let p = plan(&stats("1s"), &stats("250ms"));
        assert_eq!(p.not_applied, vec![]);
        assert_eq!(
            p.applied[0].to_string(),
            "applied engine_stats.interval of pool `a` (1s → 250ms)"
        );
        let prefix = |extra: &str| conf("", &format!("    policy: prefix_aware\n{extra}"));
        let p = plan(
            &prefix(""),
            &prefix("    prefix: { block_bytes: 32, min_match_bytes: 64, capacity_tokens_per_endpoint: 9, fallback: qps }\n"),
        );
        assert_eq!(p.not_applied, vec![]);
        let keys: Vec<&str> = p.applied.iter().map(|a| a.key.as_str()).collect();
        assert_eq!(
            keys,
            [
                "prefix.block_bytes",
                "prefix.min_match_bytes",
                "prefix.capacity_tokens_per_endpoint",
                "prefix.fallback"
            ]
        );
    }

    #[test]
    fn health_check_keys_apply_in_place_but_the_interval() {
        let p = plan(
            &conf("", ""),
            &conf(
                "",
                "    health_check: { path: /ready, interval: 5s, timeout: 3s, healthy_after: 1, \
                 unhealthy_after: 4, route_when_all_unhealthy: false }\n",
            ),
        );
        let applied: Vec<&str> = p.applied.iter().map(|a| a.key.as_str()).collect();
        assert_eq!(
            applied,
            [
                "health_check.path",
                "health_check.timeout",
                "health_check.healthy_after",
                "health_check.unhealthy_after",
                "health_check.route_when_all_unhealthy"
            ]
        );
        let not: Vec<&str> = p.not_applied.iter().map(|n| n.key.as_str()).collect();
        assert_eq!(not, ["health_check.interval"]);
        assert_eq!(
            p.effective.pools[0].health_check.interval,
            std::time::Duration::from_secs(2)
        );
        assert_eq!(p.effective.pools[0].health_check.path, "/ready");
    }

    #[test]
    fn predicted_ttfts_sessions_apply_in_place_and_its_prefix_is_kept() {
        let pred = |extra: &str| conf("", &format!("    policy: predicted_ttft\n{extra}"));
        let p = plan(
            &pred("    sessions: { ttl: 1h }\n"),
            &pred(
                "    sessions: { ttl: 5m, max_sessions: 10, header: x-conv, move_margin: 0.5, prompt_cache_key: true }\n",
            ),
        );
        assert_eq!(p.not_applied, vec![]);
        let applied: Vec<String> = p.applied.iter().map(|a| a.to_string()).collect();
        assert_eq!(
            applied,
            [
                "applied sessions.header of pool `a` ([\"x-session-id\", \"x-claude-code-session-id\", \"session-id\"] → [\"x-conv\"])",
                "applied sessions.ttl of pool `a` (3600s → 300s)",
                "applied sessions.max_sessions of pool `a` (100000 → 10)",
                "applied sessions.move_margin of pool `a` (0.1 → 0.5)",
                "applied sessions.prompt_cache_key of pool `a` (false → true)",
            ]
        );
        // Its prefix index is hashed with the settings it started with: those are kept, the sessions' still
        // apply (the policy's reconfigure refuses a change to the former, which would also drop the latter).
        let p = plan(
            &pred(""),
            &pred("    prefix: { block_bytes: 32 }\n    prefill: { bytes_per_token: 3 }\n"),
        );
        assert_eq!(p.applied, vec![]);
        let keys: Vec<&str> = p.not_applied.iter().map(|n| n.key.as_str()).collect();
        assert_eq!(keys, ["prefix.block_bytes", "prefill.bytes_per_token"]);
        let p = plan(
            &pred("    sessions: { ttl: 1h }\n"),
            &pred("    sessions: { ttl: 5m }\n    prefill: { bytes_per_token: 3 }\n"),
        );
        assert_eq!(p.applied.len(), 1, "{:?}", p.applied);
        let running =
            crate::placement::factory::build(&pred("    sessions: { ttl: 1h }\n").pools[0]);
        assert_eq!(
            running.reconfigure(&p.effective.pools[0], Instant::now()),
            Ok(None)
        );
        assert!(
            p.not_applied[0].why.contains("prefix index"),
            "{:?}",
            p.not_applied
        );
    }

    #[test]
    fn nothing_changed_is_nothing_to_report() {
        let old = conf("", "    sessions: {}\n");
        assert_eq!(not_applied(&old, &old.clone()), vec![]);
        assert!(!unlisted_change(&old, &old.clone()));
    }

    #[test]
    fn pools_in_another_order_are_named() {
        let two = "  - name: b\n    models: [m]\n    endpoints: [\"http://127.0.0.1:10\"]\n";
        let old = conf("", two);
        let mut new = old.clone();
        new.pools.reverse();
        let n = not_applied(&old, &new);
        assert_eq!(n.len(), 1, "{n:?}");
        assert_eq!(n[0].values, " (order)");
    }

    #[test]
    fn what_cannot_change_in_place_is_listed_once_and_keeps_its_running_value() {
        let old = conf("", "");
        let new = conf(
            "listen: \"127.0.0.1:2\"\ntimeouts: { connect: 5s, request_header: 3s }\nmax_retries: 0\nserver: { threads: 4 }\n",
            "    sessions: { ttl: 1h }\n    max_in_flight_per_endpoint: 8\n  - name: b\n    models: [m]\n    endpoints: [\"http://127.0.0.1:10\"]\n",
        );
        let p = plan(&old, &new);
        let keys: Vec<String> = p
            .not_applied
            .iter()
            .map(|n| match &n.pool {
                Some(p) => format!("{p}.{}", n.key),
                None => n.key.clone(),
            })
            .collect();
        assert_eq!(
            keys,
            [
                "listen",
                "server",
                "timeouts.request_header",
                "pools",
                "a.sessions"
            ]
        );
        // The next configuration keeps the running values of those, and takes the rest.
        let e = &p.effective;
        assert_eq!(e.listen, old.listen);
        assert_eq!(e.server_yaml, old.server_yaml);
        assert_eq!(e.timeouts.request_header, old.timeouts.request_header);
        assert_eq!(e.pools.len(), 1);
        assert_eq!(e.pools[0].policy, old.pools[0].policy);
        assert_eq!(e.timeouts.connect, new.timeouts.connect);
        assert_eq!(e.max_retries, 0);
        assert_eq!(e.pools[0].max_in_flight_per_endpoint, Some(8));
        // Everything that changed has its own line: none is left for the catch-all.
        assert!(!unlisted_change(&old, &new));
        let same_pools = conf(
            "body_budget_bytes: 1000\nexpose_paths: [/metrics]\nmax_client_connections: 5\n",
            "    models: [x]\n    health_check: { interval: 1s }\n    engine_stats: {}\n    expose_paths: [/x]\n    \
             max_in_flight_per_endpoint: 2\n    queue: {}\n",
        );
        let n = not_applied(&old, &same_pools);
        let keys: Vec<&str> = n.iter().map(|n| n.key.as_str()).collect();
        assert_eq!(
            keys,
            [
                "body_budget_bytes",
                "max_client_connections",
                "expose_paths",
                "models",
                "health_check.interval",
                "engine_stats",
                "expose_paths",
                "queue"
            ]
        );
        assert!(!unlisted_change(&old, &same_pools));
        let n = not_applied(&old, &new);
        assert_eq!(n[2].values, " (10s → 3s)");
        assert_eq!(
            n[3].to_string(),
            "pools changed (`b` added): not applied, needs a restart or `systemctl reload` (graceful upgrade): \
             pools are built at start"
        );
    }
}
