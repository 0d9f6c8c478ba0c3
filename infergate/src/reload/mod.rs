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

mod plan;
mod table;

use std::time::Instant;

pub use plan::plan;

use crate::config::Config;
use crate::state::RouterState;

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

/// Every setting that differs between `running` and `new` and cannot change in place.
pub fn not_applied(running: &Config, new: &Config) -> Vec<NotApplied> {
    plan(running, new).not_applied
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
        let connect = effective.timeouts.connect;
        let removed = pool.set_endpoints(&pc.endpoints, connect, Some(&state.metrics));
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
    endpoints.extend(running.metrics_auth.reload_note(&new.metrics_auth));
    let cert = state.server_cert.as_ref().zip(effective.tls.as_ref());
    if let Some((served, tls)) = cert.filter(|(served, tls)| !served.serves(&tls.loaded)) {
        served.set(&tls.loaded);
        notes.push(format!(
            "tls: new connections get the certificate {}",
            tls.certificate
        ));
        if let Some(w) = tls.certificate.expiry_warning(crate::tls::unix_now()) {
            log::warn!("reload {path}: {}: {w}", tls.cert_file.display());
        }
    }
    state.set_current(effective);
    if let Err(e) = state.tracing.configure(state.current().tracing.as_ref()) {
        log::error!("reload {path}: {e}; tracing stays as it was");
    }

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

/// The reload entry points on the router's state: SIGHUP re-reads the file; tests apply parts directly.
impl RouterState {
    /// Apply a re-read configuration's endpoint lists (SIGHUP): pools are matched by name; departing endpoints
    /// lose their metric series and prefix entries. Returns the names of pools present on only one side, whose
    /// changes need a restart or graceful upgrade.
    pub fn reload_endpoints(&self, cfg: &Config) -> Vec<String> {
        let mut unmatched: Vec<String> = cfg
            .pools
            .iter()
            .filter(|pc| !self.pools.pools.iter().any(|p| *p.name == *pc.name))
            .map(|pc| pc.name.clone())
            .collect();
        for pool in &self.pools.pools {
            let Some(pc) = cfg.pools.iter().find(|pc| *pc.name == *pool.name) else {
                unmatched.push(pool.name.to_string());
                continue;
            };
            pool.set_endpoints(&pc.endpoints, cfg.timeouts.connect, Some(&self.metrics));
        }
        unmatched
    }

    /// Apply a re-read configuration's client keys and their limits (SIGHUP).
    pub fn reload_keys(&self, cfg: &Config) {
        self.admission.reload_keys(cfg.auth.as_ref());
    }

    /// Re-read the config file and apply what can change in place (`reload`); anything invalid leaves the running
    /// state as is.
    pub fn reload_from_file(&self) {
        // Log rotation: the access log file is opened again whatever the new file says (its settings need an
        // upgrade; the running one is the start configuration's).
        if let Some(crate::config::AccessLogConfig {
            target: crate::config::LogTarget::File(path),
            ..
        }) = &self.cfg.access_log
        {
            crate::access_log::request_reopen();
            log::info!(
                "access log reopened at {} (before its next line)",
                path.display()
            );
        }
        match Config::load(&self.current().source) {
            Ok(new) => apply(self, &new),
            Err(e) => {
                self.metrics.count_reload("failed");
                log::error!("reload rejected, keeping the running configuration: {e}");
            }
        }
    }
}

#[cfg(test)]
mod tests;
