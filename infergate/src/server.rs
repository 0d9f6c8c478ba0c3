//! Assembly: turns a validated `Config` into a Pingora `Server` with the proxy, the metrics listener and the
//! housekeeping background service (discovery, health checks, engine stats, janitor, session expiry).

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use pingora_core::apps::http_app::ServeHttp;
use pingora_core::protocols::http::ServerSession;
use pingora_core::server::configuration::{Opt, ServerConf};
use pingora_core::server::{RunArgs, Server, ShutdownSignal, ShutdownSignalWatch, ShutdownWatch};
use pingora_core::services::background::BackgroundService;
use pingora_core::services::listening::Service;
use pingora_core::services::ServiceReadyNotifier;

use crate::clients::{self, ClientGate};
use crate::config::Config;
use crate::metrics::Metrics;
use crate::pool::{Pools, JANITOR_PERIOD};
use crate::proxy::Router;
pub use crate::state::RouterState;

/// A `"*"` pool re-reads its engines' model list every this many health-check rounds.
const MODELS_REFRESH_CHECKS: u32 = 15;

/// How often non-streaming holds are checked against their estimated prefill end.
const RELEASE_PERIOD: Duration = Duration::from_millis(50);

/// Build the Pingora server: proxy on every `listen` address, metrics on `metrics_listen`, housekeeping in the
/// background. The proxy starts accepting only after the first round of health checks (endpoints start unknown).
pub fn build_server(cfg: Config, mut opt: Opt) -> Result<(Server, RouterState), String> {
    let server_conf = ServerConf::from_yaml(&cfg.server_yaml)
        .map_err(|e| format!("{}: server: {e}", cfg.source.display()))?;
    // The YAML file is ours, not Pingora's: hand it the parsed ServerConf instead.
    opt.conf = None;
    let upgrade = opt.upgrade;
    let mut server = Server::new_with_opt_and_conf(opt, server_conf);

    crate::admission::warn_if_open(&cfg);
    let state = RouterState::new(cfg);
    let access_log = match &state.cfg.access_log {
        Some(c) => Some(crate::access_log::AccessLog::open(c, &state.metrics)?),
        None => None,
    };
    let router = Router::new(state.clone()).with_access_log(access_log);
    // Slow and idle clients and the connection cap: see crate::clients.
    let max_clients = clients::effective_max(
        state.cfg.max_client_connections,
        clients::open_files_limit(),
    );
    let gate = ClientGate::new(
        pingora_proxy::http_proxy(&server.configuration, router),
        &state.cfg,
        max_clients,
        &state.metrics,
    );
    let mut proxy = Service::new("infergate proxy".to_string(), gate);
    for addr in &state.cfg.listen {
        proxy.add_listener(clients::listener(addr));
    }
    let housekeeping = pingora_core::services::background::background_service(
        "infergate housekeeping",
        Housekeeper {
            state: state.clone(),
        },
    );
    crate::state_file::install(&mut server, &state.sessions());
    crate::cluster::install(&mut server, state.cluster.as_ref());
    let hk_handle = server.add_service(housekeeping);
    let proxy_handle = server.add_service(proxy);
    proxy_handle.add_dependency(&hk_handle);
    let mut listening = vec![proxy_handle];
    if let Some(addr) = &state.cfg.metrics_listen {
        let mut metrics = Service::new(
            "infergate metrics".to_string(),
            MetricsApp {
                metrics: state.metrics.clone(),
                pools: state.pools.clone(),
            },
        );
        metrics.add_tcp(addr);
        listening.push(server.add_service(metrics));
    }
    // Bootstrap (readiness for daemon_wait_for_ready, the upgrade's sockets) runs after the fork: see lifecycle.
    let addrs: Vec<String> = state
        .cfg
        .listen
        .iter()
        .chain(&state.cfg.metrics_listen)
        .cloned()
        .collect();
    crate::lifecycle::order_startup(&mut server, upgrade, &hk_handle, &listening, &addrs);
    Ok((server, state))
}

/// Serves `GET /metrics` in the Prometheus text format, `GET /health` as the proxy does (this listener is not
/// under the client connection cap, so it answers while the proxy port is full), and the status page (`status.rs`).
struct MetricsApp {
    metrics: Arc<Metrics>,
    pools: Arc<Pools>,
}

#[async_trait]
impl ServeHttp for MetricsApp {
    async fn response(&self, session: &mut ServerSession) -> http::Response<Vec<u8>> {
        let path = session.req_header().uri.path();
        let (status, ctype, body) = if path == "/metrics" {
            (200, "text/plain; version=0.0.4", self.metrics.render())
        } else if path == "/health" {
            let (status, body) = clients::health(&self.pools);
            (status, "application/json", body.as_bytes().to_vec())
        } else if let Some(status) = crate::status::respond(path, &self.pools, &self.metrics) {
            status
        } else {
            (
                404,
                "text/plain",
                b"not found: metrics are on /metrics, the status page on /status\n".to_vec(),
            )
        };
        http::Response::builder()
            .status(status)
            .header("content-type", ctype)
            .header("content-length", body.len())
            .body(body)
            .unwrap_or_default()
    }
}

/// Discovery and health checks per pool, engine-stats scrapes, the prefill janitor and session expiry.
struct Housekeeper {
    state: RouterState,
}

#[async_trait]
impl BackgroundService for Housekeeper {
    async fn start_with_ready_notifier(
        &self,
        shutdown: ShutdownWatch,
        ready: ServiceReadyNotifier,
    ) {
        // Take over SIGHUP first: its default action would terminate the process.
        #[cfg(unix)]
        let hangup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup());
        // One round of checks before the proxy accepts: endpoints start unknown, so this is what lets the first
        // requests through. Bounded by the slowest configured timeout.
        let first_round_limit = self
            .state
            .cfg
            .pools
            .iter()
            .map(|p| p.health_check.timeout)
            .max()
            .unwrap_or(Duration::from_secs(1))
            + Duration::from_secs(1);
        if tokio::time::timeout(first_round_limit, self.state.pools.refresh_now())
            .await
            .is_err()
        {
            log::warn!(
                "first health-check round did not finish in {first_round_limit:?}; starting anyway"
            );
        }
        ready.notify_ready();

        let mut tasks = tokio::task::JoinSet::new();
        for pool in &self.state.pools.pools {
            let pool_checks = pool.clone();
            let mut stop = shutdown.clone();
            tasks.spawn(async move {
                let pool = pool_checks;
                let mut tick = tokio::time::interval(pool.cfg().health_check.interval);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                tick.tick().await;
                let mut models_due = MODELS_REFRESH_CHECKS;
                loop {
                    tokio::select! {
                        _ = tick.tick() => {}
                        _ = stop.changed() => return,
                    }
                    if let Err(e) = pool.lb.update().await {
                        log::warn!("pool {}: discovery failed: {e}", pool.name);
                    }
                    pool.lb.backends().run_health_check(true).await;
                    models_due = models_due.saturating_sub(1);
                    if models_due == 0 && pool.serves_any_model() {
                        models_due = MODELS_REFRESH_CHECKS;
                        let client = crate::engine_stats::shared_client();
                        pool.refresh_models(client, pool.cfg().health_check.timeout)
                            .await;
                    }
                }
            });
            if let Some(stats_cfg) = pool.cfg().engine_stats.clone() {
                let pool = pool.clone();
                let stop = shutdown.clone();
                tasks.spawn(async move {
                    run_pool_scrapes(pool, stats_cfg, stop).await;
                });
            }
        }
        {
            let state = self.state.clone();
            let mut stop = shutdown.clone();
            tasks.spawn(async move {
                let mut tick = tokio::time::interval(RELEASE_PERIOD);
                let mut last_janitor = Instant::now();
                let mut bound = JanitorBound::new(&state.current().timeouts, last_janitor);
                loop {
                    tokio::select! {
                        _ = tick.tick() => {}
                        _ = stop.changed() => return,
                    }
                    let now = Instant::now();
                    state.ledger.release_due(now);
                    if now.duration_since(last_janitor) < JANITOR_PERIOD {
                        continue;
                    }
                    last_janitor = now;
                    let max_age = bound.at(&state.current().timeouts, now);
                    state.ledger.expire(max_age, now);
                    for pool in &state.pools.pools {
                        let evictions = pool.policy.expire(now);
                        state.metrics.count_session_evictions(&pool.name, evictions);
                    }
                }
            });
        }
        #[cfg(unix)]
        {
            // SIGHUP re-reads the file and applies what can change in place (without it, SIGHUP would terminate
            // the process).
            let state = self.state.clone();
            let mut stop = shutdown.clone();
            match hangup {
                Ok(mut hup) => {
                    tasks.spawn(async move {
                        loop {
                            tokio::select! {
                                got = hup.recv() => if got.is_none() { return },
                                _ = stop.changed() => return,
                            }
                            // Re-reading resolves hostnames (blocking DNS): keep it off this runtime.
                            let state = state.clone();
                            if let Err(e) =
                                tokio::task::spawn_blocking(move || state.reload_from_file()).await
                            {
                                log::error!("reload failed: {e}");
                            }
                        }
                    });
                }
                Err(e) => log::warn!("cannot listen for SIGHUP (reload): {e}"),
            }
        }
        let mut stop = shutdown.clone();
        let _ = stop.changed().await;
        tasks.shutdown().await;
    }
}

/// The janitor's age bound for holds, response_header + stream_idle as reloads change them. A lower bound takes
/// effect only once the wider one has run out since it was last in force: requests dispatched under it may take
/// that long, and their holds are not overdue before.
struct JanitorBound {
    widest: Duration,
    /// When `widest` was last the configured bound.
    seen: Instant,
}

impl JanitorBound {
    fn new(t: &crate::config::Timeouts, now: Instant) -> JanitorBound {
        JanitorBound {
            widest: t.response_header + t.stream_idle,
            seen: now,
        }
    }

    fn at(&mut self, t: &crate::config::Timeouts, now: Instant) -> Duration {
        let configured = t.response_header + t.stream_idle;
        if configured >= self.widest || now.saturating_duration_since(self.seen) > self.widest {
            self.widest = configured;
            self.seen = now;
        }
        self.widest
    }
}

/// A shutdown signal a test (or an embedding program) triggers through a channel instead of Unix signals.
pub struct ChannelShutdown(pub tokio::sync::Mutex<tokio::sync::mpsc::Receiver<ShutdownSignal>>);

#[async_trait]
impl ShutdownSignalWatch for ChannelShutdown {
    async fn recv(&self) -> ShutdownSignal {
        match self.0.lock().await.recv().await {
            Some(s) => s,
            None => ShutdownSignal::FastShutdown,
        }
    }
}

/// Run a built server on the current thread until the channel says stop (in-process use; the binary uses
/// `run_forever` with Unix signals).
pub fn run_with_channel(server: Server, rx: tokio::sync::mpsc::Receiver<ShutdownSignal>) {
    server.run(RunArgs {
        shutdown_signal: Box::new(ChannelShutdown(tokio::sync::Mutex::new(rx))),
    });
}

/// Keep one scrape loop per current endpoint of a pool (endpoints may come and go on reload, and a reload may
/// rotate an endpoint's key or change the scrape settings: its loop restarts with the new ones); each records its
/// outcome in the endpoint's stats cell.
async fn run_pool_scrapes(
    pool: Arc<crate::pool::Pool>,
    mut cfg: crate::config::EngineStatsConfig,
    mut stop: ShutdownWatch,
) {
    use std::collections::HashMap;
    type Loop = (tokio::sync::watch::Sender<bool>, Arc<crate::pool::Target>);
    let mut loops: HashMap<u64, Loop> = HashMap::new();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        let endpoints = pool.endpoints();
        let changed = match &pool.cfg().engine_stats {
            Some(now) if *now != cfg => {
                cfg = now.clone();
                for e in endpoints.iter() {
                    e.stats.enable(cfg.interval);
                }
                true
            }
            _ => false,
        };
        loops.retain(|id, (tx, target)| {
            let keep = !changed
                && endpoints
                    .iter()
                    .any(|e| e.id == *id && Arc::ptr_eq(&e.target(), target));
            if !keep {
                let _ = tx.send(true);
            }
            keep
        });
        for ep in endpoints.iter() {
            if loops.contains_key(&ep.id) {
                continue;
            }
            let (tx, rx) = tokio::sync::watch::channel(false);
            let current = ep.target();
            let api_key = current.api_key.clone();
            loops.insert(ep.id, (tx, current));
            let sink_ep = ep.clone();
            let sent_ep = ep.clone();
            let target = crate::engine_stats::ScrapeTarget {
                pool: pool.name.to_string(),
                endpoint: ep.label.clone(),
                url: format!("http://{}{}", ep.label, cfg.path),
                api_key,
                cfg: cfg.clone(),
                cell: Arc::new(move |mut outcome| {
                    // Our own count while the scrape was under way (its most): the engine's figure less it is the
                    // foreign load.
                    if let crate::engine_stats::ScrapeOutcome::Good(load) = &mut outcome {
                        load.own_at_sample = sink_ep.load.requests_since_mark();
                    }
                    sink_ep.stats.record_outcome(Instant::now(), &outcome)
                }),
                on_send: Arc::new(move || sent_ep.load.mark_requests()),
            };
            tokio::spawn(crate::engine_stats::scrape_loop(target, rx));
        }
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => break,
        }
    }
    for (tx, _) in loops.values() {
        let _ = tx.send(true);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Timeouts;

    #[test]
    fn a_lower_janitor_bound_waits_for_the_requests_of_the_wider_one() {
        let t0 = Instant::now();
        let wide = Timeouts::default();
        let narrow = Timeouts {
            response_header: Duration::from_secs(1),
            stream_idle: Duration::from_secs(1),
            ..wide
        };
        let w = wide.response_header + wide.stream_idle;
        let mut b = JanitorBound::new(&wide, t0);
        assert_eq!(b.at(&narrow, t0 + Duration::from_secs(1)), w);
        assert_eq!(b.at(&narrow, t0 + w), w);
        assert_eq!(
            b.at(&narrow, t0 + w + Duration::from_secs(1)),
            Duration::from_secs(2)
        );
        // A wider one applies at once.
        assert_eq!(b.at(&wide, t0 + w + Duration::from_secs(2)), w);
    }
}
