//! SIGHUP: apply what a re-read configuration can change in the running router, and say, setting by setting,
//! what it cannot.
//!
//! Applied in place: each pool's endpoints (pools matched by name): added ones start unknown, departed ones lose
//! their metric series, kept ones keep their health, load, sessions and prefix entries and take a rotated API
//! key or a re-resolved address; and the client keys with their limits (`auth`: a key whose name stays keeps its
//! buckets). Everything else is read when the router is built (listeners, Pingora's server
//! settings, the proxy's limits and timeouts, each pool's policy and its state): a change to it is logged as not
//! applied, with the reason, and takes effect on a restart or a graceful upgrade (`systemctl reload`), which
//! builds a new router from the file.

use std::fmt::Debug;

use crate::config::{Config, PoolConfig};
use crate::server::RouterState;

/// What a reload must tell the operator to do for a setting it could not apply.
const REMEDY: &str = "needs a restart or `systemctl reload` (graceful upgrade)";

/// A setting whose new value the running router does not take.
#[derive(Debug, Clone, PartialEq)]
pub struct NotApplied {
    /// The pool it belongs to, if any.
    pub pool: Option<String>,
    /// The key as written in the file (`timeouts.connect`, `policy`).
    pub key: String,
    /// ` (old → new)` when both values are short, else empty.
    pub values: String,
    /// Why it cannot change in place.
    pub why: &'static str,
}

impl std::fmt::Display for NotApplied {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let what = match &self.pool {
            Some(pool) => format!("{} of pool `{pool}`", self.key),
            None => self.key.clone(),
        };
        write!(
            f,
            "{what} changed{}: not applied, {REMEDY}: {}",
            self.values, self.why
        )
    }
}

const WHY_LISTEN: &str = "listening sockets are bound at start";
const WHY_SERVER: &str = "Pingora reads its server settings at start";
const WHY_PROXY: &str = "the proxy keeps the value it started with";
const WHY_POOLS: &str = "pools are built at start";
const WHY_POLICY: &str =
    "the policy and its state (session bindings, prefix index) are built at start";
const WHY_POOL: &str = "the pool keeps the value it was built with";

/// The longest value shown in a message (`old → new`); longer ones are only named.
const SHOWN: usize = 60;

struct Diff {
    out: Vec<NotApplied>,
    pool: Option<String>,
}

impl Diff {
    /// Record `key` when its values differ (compared by their `Debug` text: every config type has one, and it
    /// never shows a key).
    fn field<T: Debug + ?Sized>(&mut self, key: &str, old: &T, new: &T, why: &'static str) {
        let (old, new) = (format!("{old:?}"), format!("{new:?}"));
        if old == new {
            return;
        }
        let shown = old.len() <= SHOWN && new.len() <= SHOWN;
        self.push(key, shown.then(|| format!(" ({old} → {new})")), why);
    }

    fn push(&mut self, key: &str, values: Option<String>, why: &'static str) {
        let values = values.unwrap_or_default();
        self.out.push(NotApplied {
            pool: self.pool.clone(),
            key: key.to_string(),
            values,
            why,
        });
    }
}

/// Every setting that differs between `running` and `new` and cannot change in place. Endpoint lists are
/// applied, so they are not listed.
pub fn not_applied(running: &Config, new: &Config) -> Vec<NotApplied> {
    let mut d = Diff {
        out: Vec::new(),
        pool: None,
    };
    d.field("listen", &running.listen, &new.listen, WHY_LISTEN);
    d.field(
        "metrics_listen",
        &running.metrics_listen,
        &new.metrics_listen,
        WHY_LISTEN,
    );
    if running.server_yaml != new.server_yaml {
        d.push("server", None, WHY_SERVER);
    }
    let (t0, t1) = (&running.timeouts, &new.timeouts);
    d.field("timeouts.connect", &t0.connect, &t1.connect, WHY_PROXY);
    d.field(
        "timeouts.response_header",
        &t0.response_header,
        &t1.response_header,
        WHY_PROXY,
    );
    d.field(
        "timeouts.stream_idle",
        &t0.stream_idle,
        &t1.stream_idle,
        WHY_PROXY,
    );
    d.field(
        "timeouts.request_body",
        &t0.request_body,
        &t1.request_body,
        WHY_PROXY,
    );
    d.field(
        "max_retries",
        &running.max_retries,
        &new.max_retries,
        WHY_PROXY,
    );
    d.field(
        "max_body_bytes",
        &running.max_body_bytes,
        &new.max_body_bytes,
        WHY_PROXY,
    );
    d.field(
        "body_budget_bytes",
        &running.body_budget_bytes,
        &new.body_budget_bytes,
        WHY_PROXY,
    );
    d.field(
        "body_budget_wait",
        &running.body_budget_wait,
        &new.body_budget_wait,
        WHY_PROXY,
    );
    d.field(
        "timeouts.request_header",
        &t0.request_header,
        &t1.request_header,
        WHY_PROXY,
    );
    d.field(
        "timeouts.client_idle",
        &t0.client_idle,
        &t1.client_idle,
        WHY_PROXY,
    );
    d.field(
        "max_client_connections",
        &running.max_client_connections,
        &new.max_client_connections,
        WHY_LISTEN,
    );
    d.field(
        "expose_paths",
        &running.expose_paths,
        &new.expose_paths,
        WHY_PROXY,
    );
    d.field(
        "trusted_proxies",
        &running.trusted_proxies,
        &new.trusted_proxies,
        WHY_PROXY,
    );
    for pc in &new.pools {
        if !running.pools.iter().any(|p| p.name == pc.name) {
            d.push("pools", Some(format!(" (`{}` added)", pc.name)), WHY_POOLS);
        }
    }
    for p in &running.pools {
        match new.pools.iter().find(|pc| pc.name == p.name) {
            None => d.push("pools", Some(format!(" (`{}` removed)", p.name)), WHY_POOLS),
            Some(pc) => pool_changes(&mut d, p, pc),
        }
    }
    let names = |c: &Config| c.pools.iter().map(|p| p.name.clone()).collect::<Vec<_>>();
    let (mut old_names, mut new_names) = (names(running), names(new));
    if old_names != new_names {
        old_names.sort();
        new_names.sort();
        if old_names == new_names {
            d.push("pools", Some(" (order)".to_string()), WHY_POOLS);
        }
    }
    if d.out.is_empty() && unlisted_change(running, new) {
        d.push(
            "settings without a reload check of their own",
            None,
            WHY_OTHER,
        );
    }
    d.out
}

const WHY_OTHER: &str = "the router keeps the values it started with";

/// Whether `new` differs from `running` in something the checks above do not look at (a setting added to the
/// configuration later): `running` with every checked or applied value taken from `new` must equal `new`.
fn unlisted_change(running: &Config, new: &Config) -> bool {
    let mut r = running.clone();
    r.source.clone_from(&new.source);
    r.listen.clone_from(&new.listen);
    r.metrics_listen.clone_from(&new.metrics_listen);
    r.server_yaml.clone_from(&new.server_yaml);
    r.timeouts.connect = new.timeouts.connect;
    r.timeouts.response_header = new.timeouts.response_header;
    r.timeouts.stream_idle = new.timeouts.stream_idle;
    r.timeouts.request_body = new.timeouts.request_body;
    r.timeouts.request_header = new.timeouts.request_header;
    r.timeouts.client_idle = new.timeouts.client_idle;
    r.max_client_connections = new.max_client_connections;
    // Applied in place (`apply`).
    r.auth.clone_from(&new.auth);
    r.max_retries = new.max_retries;
    r.max_body_bytes = new.max_body_bytes;
    r.body_budget_bytes = new.body_budget_bytes;
    r.body_budget_wait = new.body_budget_wait;
    r.expose_paths.clone_from(&new.expose_paths);
    r.trusted_proxies.clone_from(&new.trusted_proxies);
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

fn pool_changes(d: &mut Diff, old: &PoolConfig, new: &PoolConfig) {
    d.pool = Some(old.name.clone());
    d.field("models", &old.models, &new.models, WHY_POOLS);
    if old.policy.kind() != new.policy.kind() {
        let (from, to) = (old.policy.kind().as_str(), new.policy.kind().as_str());
        d.push("policy", Some(format!(" ({from} → {to})")), WHY_POLICY);
    } else {
        // Same policy, other parameters (sessions, prefix).
        d.field("policy settings", &old.policy, &new.policy, WHY_POLICY);
    }
    d.field(
        "health_check",
        &old.health_check,
        &new.health_check,
        WHY_POOL,
    );
    d.field("prefill", &old.prefill, &new.prefill, WHY_POOL);
    d.field(
        "max_in_flight_per_endpoint",
        &old.max_in_flight_per_endpoint,
        &new.max_in_flight_per_endpoint,
        WHY_POOL,
    );
    d.field(
        "engine_stats",
        &old.engine_stats,
        &new.engine_stats,
        WHY_POOL,
    );
    d.field("outlier_detection", &old.outlier, &new.outlier, WHY_POOL);
    d.field("queue", &old.queue, &new.queue, WHY_POOL);
    d.field(
        "expose_paths",
        &old.expose_paths,
        &new.expose_paths,
        WHY_POOL,
    );
    d.pool = None;
}

/// Apply `new` to the running router: endpoints in place, then one warning per setting that is not applied.
pub fn apply(state: &RouterState, new: &Config) {
    let path = state.cfg.source.display();
    let mut applied = Vec::new();
    for pool in &state.pools.pools {
        let Some(pc) = new.pools.iter().find(|pc| *pc.name == *pool.name) else {
            continue;
        };
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
            applied.push(format!(
                "pool `{}`: {} endpoint(s) added [{}], {} removed [{}]",
                pool.name,
                added.len(),
                added.join(", "),
                removed.len(),
                removed.join(", ")
            ));
        }
    }
    if state.cfg.auth.is_some() || new.auth.is_some() {
        state.reload_keys(new);
        applied.push("client keys and limits re-read".to_string());
    }
    if applied.is_empty() {
        log::info!("reload {path}: endpoint lists unchanged (keys and addresses re-read)");
    } else {
        log::info!("reload {path}: applied {}", applied.join("; "));
    }
    let skipped = not_applied(&state.cfg, new);
    for s in &skipped {
        log::warn!("reload {path}: {s}");
    }
    if !skipped.is_empty() {
        log::warn!(
            "reload {path}: {} setting(s) not applied; the router keeps running with their old values",
            skipped.len()
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
        let n = not_applied(&old, &new);
        assert_eq!(n.len(), 1, "{n:?}");
        assert_eq!(
            n[0].to_string(),
            "policy of pool `a` changed (load_aware → prefix_aware): not applied, needs a restart or \
             `systemctl reload` (graceful upgrade): the policy and its state (session bindings, prefix index) \
             are built at start"
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
    fn every_other_kind_of_change_is_listed_once() {
        let old = conf("", "");
        let new = conf(
            "listen: \"127.0.0.1:2\"\ntimeouts: { connect: 5s }\nmax_retries: 0\nserver: { threads: 4 }\n",
            "    sessions: { ttl: 1h }\n    max_in_flight_per_endpoint: 8\n  - name: b\n    models: [m]\n    endpoints: [\"http://127.0.0.1:10\"]\n",
        );
        let keys: Vec<String> = not_applied(&old, &new)
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
                "timeouts.connect",
                "max_retries",
                "pools",
                "a.policy settings",
                "a.max_in_flight_per_endpoint",
            ]
        );
        // Everything that changed has its own line: none is left for the catch-all.
        assert!(!unlisted_change(&old, &new));
        let same_pools = conf(
            "timeouts: { request_body: 5s }\nbody_budget_wait: 1s\nexpose_paths: [/metrics]\n",
            "    models: [x]\n    prefill: { bytes_per_token: 3 }\n    outlier_detection: { base_ejection: 1s }\n    \
             health_check: { interval: 1s }\n    engine_stats: {}\n    expose_paths: [/x]\n",
        );
        assert_eq!(not_applied(&old, &same_pools).len(), 9);
        assert!(!unlisted_change(&old, &same_pools));
        let n = not_applied(&old, &new);
        assert_eq!(n[2].values, " (2s → 5s)");
        assert_eq!(
            n[4].to_string(),
            "pools changed (`b` added): not applied, needs a restart or `systemctl reload` (graceful upgrade): \
             pools are built at start"
        );
    }
}
