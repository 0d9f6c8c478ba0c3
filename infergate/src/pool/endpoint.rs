//! One engine endpoint: its identity, where it resolves to and its key, and the live state it carries.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use pingora_load_balancing::health_check::HttpHealthCheck;
use pingora_load_balancing::Backend;

use super::{DecodeSpeed, Drift, HealthTracker, PrefillSpeed};
use crate::config::{EndpointConfig, EngineTls, HealthCheckConfig};
use crate::engine_stats::{SideClient, StatsCell};
use crate::kv_events::KvIndex;
use crate::ledger::{EndpointLoad, PeerLoad};
use crate::metrics::EndpointSeries;
use crate::outlier::Outlier;

static NEXT_ENDPOINT_ID: AtomicU64 = AtomicU64::new(1);

/// What a reload may change about an endpoint without changing its identity: where it resolves to and its key.
pub struct Target {
    pub addr: std::net::SocketAddr,
    pub api_key: Option<String>,
    /// `https://`: the name and CA its certificate is checked against; None = plain HTTP.
    pub tls: Option<EngineTls>,
    pub(super) checker: HttpHealthCheck,
    /// The `health_check` path and timeout the checker was built with.
    pub(super) checked_as: (String, Duration),
    /// The client of the router's own requests to it, built with the target (never per request); why not if
    /// it could not be (a server name rustls refuses).
    side: Result<SideClient, String>,
    /// `timeouts.connect` as the client was built with (its TLS connects give up after it).
    connect_timeout: Duration,
}

impl Target {
    /// `prev`: the endpoint's target before a reload, whose client (and its open connections) is kept when the
    /// address and TLS settings are the same, and for TLS the connect timeout too.
    fn new(
        pool: &str,
        cfg: &EndpointConfig,
        hc: &HealthCheckConfig,
        connect_timeout: Duration,
        prev: Option<&Target>,
    ) -> Target {
        let mut checker = HttpHealthCheck::new(&cfg.label, cfg.tls.is_some());
        if let Some(tls) = &cfg.tls {
            // `new` takes the label ("host:port") for the name; the check verifies as requests do.
            checker.peer_template.sni.clone_from(&tls.server_name);
            checker.peer_template.options.ca.clone_from(&tls.ca);
        }
        // `new` builds a valid "GET /" header; set our path and headers on it.
        if let Ok(req) = pingora_http::RequestHeader::build("GET", hc.path.as_bytes(), None) {
            checker.req = req;
        }
        let _ = checker.req.insert_header("Host", cfg.label.as_str());
        if let Some(key) = &cfg.api_key {
            let _ = checker
                .req
                .insert_header("Authorization", format!("Bearer {key}"));
        }
        checker.peer_template.options.connection_timeout = Some(hc.timeout);
        checker.peer_template.options.read_timeout = Some(hc.timeout);
        checker.peer_template.options.write_timeout = Some(hc.timeout);
        let side = match prev.filter(|p| p.side_fits(cfg, connect_timeout)) {
            Some(Target { side: Ok(c), .. }) => Ok(c.clone()),
            _ => {
                let failed_before = prev.is_some_and(|p| p.side.is_err());
                build_side(pool, cfg, connect_timeout, failed_before)
            }
        };
        Target {
            addr: cfg.addr,
            api_key: cfg.api_key.clone(),
            tls: cfg.tls.clone(),
            checker,
            checked_as: (hc.path.clone(), hc.timeout),
            side,
            connect_timeout,
        }
    }

    /// Whether its client is the one `cfg` and `connect_timeout` would build (or failed to): the same address,
    /// TLS settings and connect timeout.
    fn side_fits(&self, cfg: &EndpointConfig, connect_timeout: Duration) -> bool {
        self.addr == cfg.addr && self.tls == cfg.tls && self.connect_timeout == connect_timeout
    }

    /// How the router's own GETs reach it (plain, or TLS checked as requests are); why not if they cannot.
    pub fn side(&self) -> Result<&SideClient, &str> {
        self.side.as_ref().map_err(String::as_str)
    }

    pub(super) fn backend(&self) -> Backend {
        Backend {
            addr: pingora_core::protocols::l4::socket::SocketAddr::Inet(self.addr),
            weight: 1,
            ext: http::Extensions::new(),
        }
    }
}

/// `cfg`'s client of the router's own requests; a failure warned, naming what waits for it. `failed_before`: the
/// target it replaces had none (a reload tried again).
fn build_side(
    pool: &str,
    cfg: &EndpointConfig,
    connect_timeout: Duration,
    failed_before: bool,
) -> Result<SideClient, String> {
    let side = SideClient::new(&cfg.label, cfg.addr, cfg.tls.as_ref(), connect_timeout);
    match &side {
        Err(e) => log::warn!(
            "pool {pool} endpoint {}: the router's own requests to it (engine stats, model list, stored-response \
             lookups, prefill legs) cannot be sent until a reload builds its client: {e}",
            cfg.label
        ),
        Ok(_) if failed_before => log::info!(
            "pool {pool} endpoint {}: its client for the router's own requests is built",
            cfg.label
        ),
        Ok(_) => {}
    }
    side
}

/// One engine endpoint of one pool. Its identity is its URL: a reload that changes only its key or resolved
/// address keeps its health, load, sessions, prefix entries and metric series.
pub struct Endpoint {
    /// Stable identity across reloads (session bindings and prefix entries refer to it).
    pub id: u64,
    pub pool: Arc<str>,
    /// "host:port", the `endpoint` metric label.
    pub label: String,
    /// [`Self::label`] as a header value (the upstream `Host`, `x-infergate-endpoint`), built once.
    pub label_value: http::HeaderValue,
    pub host: String,
    target: ArcSwap<Target>,
    pub load: Arc<EndpointLoad>,
    /// Other router replicas' load on this endpoint (`cluster`), as last read from the shared store.
    pub peers: PeerLoad,
    pub health: HealthTracker,
    pub outlier: Outlier,
    pub stats: StatsCell,
    /// What its engine holds, from its KV-cache events (`kv_events`; off unless the endpoint names a publisher).
    pub kv: Arc<KvIndex>,
    /// Set when the endpoint left its pool; holds still release into it harmlessly.
    pub removed: AtomicBool,
    /// Observed prefill speed, for releasing non-streaming requests' tokens at their estimated prefill end.
    pub prefill_speed: PrefillSpeed,
    /// Observed decode speed (seconds per output token over the sequences running), for `predicted_ttft`.
    pub decode_speed: DecodeSpeed,
    /// How its recent speeds compare with its learned lines, and whether it is a speed outlier.
    pub drift: Drift,
    /// The metrics callback every hold on this endpoint shares (built once, on first use).
    pub release_hook: std::sync::OnceLock<crate::ledger::ReleaseHook>,
    /// Its series every request writes (looked up once, `metrics`).
    series_handles: std::sync::OnceLock<crate::metrics::EndpointHandles>,
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never print the API key.
        f.debug_struct("Endpoint")
            .field("pool", &self.pool)
            .field("label", &self.label)
            .finish()
    }
}

impl Endpoint {
    /// `connect_timeout`: `timeouts.connect`, for its client's TLS connects.
    pub(super) fn new(
        pool: Arc<str>,
        cfg: &EndpointConfig,
        hc: &HealthCheckConfig,
        connect_timeout: Duration,
    ) -> Endpoint {
        let kv = Arc::new(KvIndex::new(&pool, &cfg.label));
        let target = ArcSwap::from_pointee(Target::new(&pool, cfg, hc, connect_timeout, None));
        Endpoint {
            kv,
            id: NEXT_ENDPOINT_ID.fetch_add(1, Ordering::Relaxed),
            pool,
            label: cfg.label.clone(),
            // A label is host:port, always a valid header value; the fallback only keeps this infallible.
            label_value: http::HeaderValue::from_str(&cfg.label)
                .unwrap_or_else(|_| http::HeaderValue::from_static("invalid")),
            host: cfg.host.clone(),
            target,
            load: Arc::new(EndpointLoad::default()),
            peers: PeerLoad::default(),
            health: HealthTracker::default(),
            outlier: Outlier::default(),
            stats: StatsCell::default(),
            removed: AtomicBool::new(false),
            prefill_speed: PrefillSpeed::default(),
            decode_speed: DecodeSpeed::default(),
            drift: Drift::default(),
            release_hook: std::sync::OnceLock::new(),
            series_handles: std::sync::OnceLock::new(),
        }
    }

    /// Its metric labels and removal flag.
    pub fn series(&self) -> EndpointSeries<'_> {
        EndpointSeries {
            pool: &self.pool,
            endpoint: &self.label,
            removed: &self.removed,
            handles: &self.series_handles,
        }
    }

    /// Where the endpoint is now and its key (a reload may swap both).
    pub fn target(&self) -> Arc<Target> {
        self.target.load_full()
    }

    pub fn addr(&self) -> std::net::SocketAddr {
        self.target.load().addr
    }

    pub fn api_key(&self) -> Option<String> {
        self.target.load().api_key.clone()
    }

    /// Apply a reloaded key, address, health-check path and timeout or connect timeout; true if the key or
    /// address changed.
    pub(super) fn retarget(
        &self,
        cfg: &EndpointConfig,
        hc: &HealthCheckConfig,
        connect_timeout: Duration,
    ) -> bool {
        let cur = self.target.load();
        let moved = cur.addr != cfg.addr || cur.api_key != cfg.api_key || cur.tls != cfg.tls;
        let (path, timeout) = &cur.checked_as;
        // A client that could not be built is tried again at every reload.
        let side_stale = cur.side.is_err() || !cur.side_fits(cfg, connect_timeout);
        if moved || side_stale || *path != hc.path || *timeout != hc.timeout {
            let next = Target::new(&self.pool, cfg, hc, connect_timeout, Some(&cur));
            self.target.store(Arc::new(next));
        }
        moved
    }
}
