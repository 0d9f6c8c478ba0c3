//! Admission: who may send (client keys), how much (per-key limits) and when (each pool's wait queue); the state
//! the proxy consults before a request's body is read, once the body is known, and before it is placed.
//!
//! The pure rules live in `keys` (matching), `limits` (token buckets) and `fair_queue` (turn order); this module
//! holds their run-time state, reloads keys, counts metrics and words the answers.

pub mod fair_queue;
pub mod keys;
pub mod limits;
mod metrics;
pub mod queue;

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Instant;

use arc_swap::ArcSwapOption;
use parking_lot::Mutex;

use crate::config::{is_loopback, AuthConfig, Config};
use crate::errors::ApiError;
use crate::metrics::Metrics;
use keys::Presented;
use limits::{Denied, KeyLimiter, Limit};
use metrics::AdmissionMetrics;
use queue::PoolQueue;

/// The Anthropic-style key header (parsed once: a lookup by text parses the name on every request).
pub static X_API_KEY: http::HeaderName = http::HeaderName::from_static("x-api-key");

/// The `key` label of requests without a (valid) client key: auth off, or refused with 401.
pub const NO_KEY: &str = "-";

/// The `limit` label values of `infergate_client_rate_limited_total`.
fn limit_names() -> [&'static str; 3] {
    [Limit::Requests, Limit::Tokens, Limit::Concurrency].map(Limit::as_str)
}

/// One configured client.
pub struct Client {
    pub name: Arc<str>,
    secret: Box<[u8]>,
    /// Shared by the clients of the same name across reloads, so a reload neither resets a key's buckets nor
    /// forgets its requests in flight.
    limiter: Arc<Mutex<KeyLimiter>>,
    /// Set (under the metrics' series lock) when the name leaves the keys file, so a request of it that ends
    /// afterwards does not bring its deleted series back. Shared like `limiter`.
    retired: Arc<AtomicBool>,
}

/// The keys in force.
struct KeyTable {
    source: String,
    clients: Vec<Arc<Client>>,
}

impl KeyTable {
    fn new(auth: &AuthConfig, previous: Option<&KeyTable>, now: Instant) -> KeyTable {
        let clients = auth
            .keys
            .iter()
            .map(|k| {
                let (limiter, retired) = match previous.and_then(|p| p.client(&k.name)) {
                    Some(old) => {
                        old.limiter.lock().set_limits(k.limits, now);
                        (old.limiter.clone(), old.retired.clone())
                    }
                    None => (
                        Arc::new(Mutex::new(KeyLimiter::new(k.limits, now))),
                        Arc::new(AtomicBool::new(false)),
                    ),
                };
                Arc::new(Client {
                    name: Arc::from(k.name.as_str()),
                    secret: k.secret.as_bytes().into(),
                    limiter,
                    retired,
                })
            })
            .collect();
        KeyTable {
            source: auth.source.clone(),
            clients,
        }
    }

    fn client(&self, name: &str) -> Option<&Arc<Client>> {
        self.clients.iter().find(|c| &*c.name == name)
    }
}

/// One request's admission state, kept in the proxy's context: its client and its concurrency slot, given back
/// when the context is dropped (every path).
#[derive(Default)]
pub struct Pass {
    client: Option<Arc<Client>>,
    holds_slot: bool,
}

impl Pass {
    /// The `key` metric label: the client's configured name, or `-`.
    pub fn key(&self) -> &str {
        self.client.as_ref().map_or(NO_KEY, |c| &*c.name)
    }

    /// The client key's TTFT budget (`auth.limits.ttft_budget`), if it has one.
    pub fn ttft_budget(&self) -> Option<std::time::Duration> {
        self.client
            .as_ref()
            .and_then(|c| c.limiter.lock().limits().ttft_budget)
    }
}

impl Drop for Pass {
    fn drop(&mut self) {
        if let (true, Some(c)) = (self.holds_slot, &self.client) {
            c.limiter.lock().end();
        }
    }
}

pub struct Admission {
    /// None: authentication is off.
    keys: ArcSwapOption<KeyTable>,
    queues: Vec<(String, Arc<PoolQueue>)>,
    metrics: AdmissionMetrics,
}

impl Admission {
    pub fn new(cfg: &Config, metrics: &Metrics) -> Arc<Admission> {
        let now = Instant::now();
        let metrics = AdmissionMetrics::new(metrics);
        let queues = cfg
            .pools
            .iter()
            .filter_map(|p| {
                let q = p.queue?;
                let name = p.name.as_str();
                Some((p.name.clone(), PoolQueue::new(q, metrics.queue(name))))
            })
            .collect();
        let admission = Arc::new(Admission {
            keys: ArcSwapOption::from(
                cfg.auth
                    .as_ref()
                    .map(|a| Arc::new(KeyTable::new(a, None, now))),
            ),
            queues,
            metrics,
        });
        // Every key's series exist from the start (rate() sees the first event).
        admission.metrics.add_client(NO_KEY, true, &[]);
        if let Some(t) = &*admission.keys.load() {
            for c in &t.clients {
                admission.metrics.add_client(&c.name, false, &limit_names());
            }
        }
        admission
    }

    pub fn auth_enabled(&self) -> bool {
        self.keys.load().is_some()
    }

    /// The pool's wait queue, if it has one.
    pub fn queue(&self, pool: &str) -> Option<&Arc<PoolQueue>> {
        self.queues.iter().find(|(n, _)| n == pool).map(|(_, q)| q)
    }

    /// Check the request's key (`Authorization: Bearer KEY` or `x-api-key: KEY`) when auth is on: 401 when it is
    /// missing or wrong.
    pub fn authenticate(&self, headers: &http::HeaderMap, pass: &mut Pass) -> Result<(), ApiError> {
        let keys = self.keys.load();
        let Some(table) = keys.as_ref() else {
            return Ok(());
        };
        let presented = Presented::from_headers(
            headers
                .get(http::header::AUTHORIZATION)
                .map(|v| v.as_bytes()),
            headers.get(&X_API_KEY).map(|v| v.as_bytes()),
        );
        if presented.is_empty() {
            return Err(ApiError::missing_api_key());
        }
        let secrets: Vec<&[u8]> = table.clients.iter().map(|c| &*c.secret).collect();
        match keys::match_key(&secrets, &presented) {
            Some(i) => {
                pass.client = table.clients.get(i).cloned();
                Ok(())
            }
            None => Err(ApiError::invalid_api_key()),
        }
    }

    /// Before the body is read: the key's concurrency slot and a look at its requests-per-minute bucket.
    pub fn begin(&self, pass: &mut Pass) -> Result<(), ApiError> {
        let Some(c) = &pass.client else {
            return Ok(());
        };
        let r = c.limiter.lock().begin(Instant::now());
        match r {
            Ok(()) => {
                pass.holds_slot = true;
                Ok(())
            }
            Err(d) => Err(self.refuse(c, d)),
        }
    }

    /// Once the body is known: charge one request and its estimated prompt tokens.
    pub fn charge(&self, pass: &Pass, tokens: u64) -> Result<(), ApiError> {
        let Some(c) = &pass.client else {
            return Ok(());
        };
        let r = c.limiter.lock().charge(tokens, Instant::now());
        r.map_err(|d| self.refuse(c, d))
    }

    fn refuse(&self, c: &Client, d: Denied) -> ApiError {
        self.metrics
            .rate_limited(&c.name, &c.retired, d.limit.as_str());
        let limits = c.limiter.lock().limits();
        let (what, limit, kind) = match d.limit {
            Limit::Requests => (
                "requests per minute",
                limits.requests_per_minute,
                "requests",
            ),
            Limit::Tokens => (
                "estimated prompt tokens per minute",
                limits.prompt_tokens_per_minute,
                "tokens",
            ),
            Limit::Concurrency => (
                "concurrent requests",
                limits.concurrent_requests,
                "requests",
            ),
        };
        let secs = d.retry_after_secs();
        ApiError::rate_limited(
            kind,
            format!(
                "Rate limit reached for key `{}` on {what} (limit {}); retry after {secs} s.",
                c.name,
                limit.unwrap_or(0)
            ),
            secs,
        )
    }

    /// Count a finished request by key and final status (not under a key that has left the keys file since).
    pub fn count(&self, pass: &Pass, code: u16) {
        match &pass.client {
            Some(c) => self.metrics.request(&c.name, Some(&c.retired), code),
            None => self.metrics.request(NO_KEY, None, code),
        }
    }

    /// Apply a reloaded `auth` section. Keys of the same name keep their buckets and in-flight counts; departed
    /// names lose their metric series. Logs names and counts, never keys.
    pub fn reload_keys(&self, auth: Option<&AuthConfig>) {
        let old = self.keys.load_full();
        let new = auth.map(|a| Arc::new(KeyTable::new(a, old.as_deref(), Instant::now())));
        let names = |t: &Option<Arc<KeyTable>>| -> Vec<Arc<str>> {
            t.iter()
                .flat_map(|t| t.clients.iter().map(|c| c.name.clone()))
                .collect()
        };
        let (before, after) = (names(&old), names(&new));
        for gone in before.iter().filter(|n| !after.contains(n)) {
            let retired = old
                .as_deref()
                .and_then(|t| t.client(gone))
                .map(|c| &*c.retired);
            self.metrics.remove_client(gone, retired);
        }
        for added in after.iter().filter(|n| !before.contains(n)) {
            self.metrics.add_client(added, false, &limit_names());
        }
        match (&old, &new) {
            (_, Some(t)) => {
                let added = after.iter().filter(|n| !before.contains(n)).count();
                let removed = before.iter().filter(|n| !after.contains(n)).count();
                log::info!(
                    "client keys reloaded from {}: {} keys ({added} added, {removed} removed)",
                    t.source,
                    t.clients.len()
                );
            }
            (Some(_), None) => log::warn!("client authentication turned off by reload"),
            (None, None) => {}
        }
        self.keys.store(new);
    }
}

/// Warn about every listener reachable from outside the host while auth is off, and about a metrics listener
/// reachable from outside that the operator left without a token (`metrics_auth.allow_unauthenticated`).
pub fn warn_if_open(cfg: &Config) {
    if let Some(addr) = cfg.metrics_listen.as_deref().filter(|a| !is_loopback(a)) {
        if cfg.metrics_auth.token.is_none() {
            log::warn!(
                "metrics listener {addr} is not loopback-only and metrics_auth.allow_unauthenticated is true: \
                 /metrics, /status and /status.json (pools, endpoint addresses, load, placement reasons) answer \
                 anyone who reaches it; keep it on a private network or firewall it"
            );
        }
    }
    if cfg.auth.is_some() {
        return;
    }
    for addr in cfg.listen.iter().filter(|a| !is_loopback(a)) {
        log::warn!(
            "listener {addr} is not loopback-only and `auth` is off: anyone who reaches it can use every pool; \
             configure auth.keys_file (see README, Security)"
        );
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::config::{ClientKey, KeyLimits};

    fn auth(names: &[&str]) -> AuthConfig {
        AuthConfig {
            source: "test".into(),
            keys: names
                .iter()
                .map(|n| ClientKey {
                    name: n.to_string(),
                    secret: format!("sk-{n}-0000000000000000"),
                    limits: KeyLimits::default(),
                })
                .collect(),
        }
    }

    fn series_of(metrics: &Metrics, key: &str) -> usize {
        let text = String::from_utf8_lossy(&metrics.render()).into_owned();
        let label = format!("key=\"{key}\"");
        text.lines().filter(|l| l.contains(&label)).count()
    }

    /// A request that began under a key and ends after a reload removed it does not bring the key's series back.
    #[test]
    fn a_request_ending_after_its_key_left_does_not_bring_its_series_back() {
        let text = "pools:\n  - name: a\n    endpoints:\n      - url: http://127.0.0.1:8101\n";
        let cfg = Config::parse(Path::new("t.yaml"), text).expect("valid");
        let metrics = Metrics::new();
        let admission = Admission::new(&cfg, &metrics);
        admission.reload_keys(Some(&auth(&["alice", "bob"])));
        assert!(series_of(&metrics, "bob") > 0);

        let mut headers = http::HeaderMap::new();
        let bearer = "Bearer sk-bob-0000000000000000";
        headers.insert(http::header::AUTHORIZATION, bearer.parse().expect("ascii"));
        let mut pass = Pass::default();
        assert!(admission.authenticate(&headers, &mut pass).is_ok());
        assert_eq!(pass.key(), "bob");

        admission.reload_keys(Some(&auth(&["alice"])));
        assert_eq!(series_of(&metrics, "bob"), 0);
        admission.count(&pass, 200);
        assert_eq!(series_of(&metrics, "bob"), 0, "bob's series came back");
        assert!(series_of(&metrics, "alice") > 0);

        // Added again, the name counts afresh.
        admission.reload_keys(Some(&auth(&["alice", "bob"])));
        let mut again = Pass::default();
        assert!(admission.authenticate(&headers, &mut again).is_ok());
        admission.count(&again, 200);
        let text = String::from_utf8_lossy(&metrics.render()).into_owned();
        assert!(
            text.contains("infergate_client_requests_total{code=\"200\",key=\"bob\"} 1"),
            "{text}"
        );
    }
}
