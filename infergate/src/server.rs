//! Assembly: turns a validated `Config` into a Pingora `Server` with the proxy, the metrics listener and the
//! background services (`housekeeping`).

use async_trait::async_trait;
use pingora_core::server::configuration::{Opt, ServerConf};
use pingora_core::server::{RunArgs, Server, ShutdownSignal, ShutdownSignalWatch};
use pingora_core::services::background::background_service;
use pingora_core::services::listening::Service;

use crate::clients::{self, ClientGate};
use crate::config::Config;
use crate::lifecycle::ExitWhenDrained;
use crate::metrics_port::MetricsApp;
use crate::proxy::Router;
pub use crate::state::RouterState;

/// The longest the early exit of a graceful shutdown waits for the access log to write what is queued.
const ACCESS_LOG_SYNC: std::time::Duration = std::time::Duration::from_secs(2);

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
    let log_sync = access_log.as_ref().map(|l| l.sync_handle());
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
    let open_connections = gate.open_connections();
    let mut proxy = Service::new("infergate proxy".to_string(), gate);
    if let Some(tls) = &state.cfg.tls {
        log::info!(
            "TLS on {}: certificate {}",
            state.cfg.listen.join(", "),
            tls.certificate
        );
        if let Some(w) = tls.certificate.expiry_warning(crate::tls::unix_now()) {
            log::warn!("{}: {w}", tls.cert_file.display());
        }
    }
    for addr in &state.cfg.listen {
        let mut listener = clients::listener(addr);
        if let Some(cert) = &state.server_cert {
            listener = listener.tls(crate::tls::listener_settings(cert, &server.configuration)?);
        }
        proxy.add_listener(listener);
    }
    server.add_service(background_service(
        "infergate exit when drained",
        ExitWhenDrained {
            open_connections: Box::new(open_connections),
            before_exit: Box::new(move || {
                if let Some(s) = &log_sync {
                    if !s.wait(ACCESS_LOG_SYNC) {
                        log::warn!("access log: lines still queued at exit were not written");
                    }
                }
            }),
            grace_seconds: server.configuration.grace_period_seconds.unwrap_or(300), // Pingora's default
        },
    ));
    crate::state_file::install(&mut server, &state.sessions());
    crate::cluster::install(&mut server, state.cluster.as_ref());
    let hk = crate::housekeeping::install(&mut server, &state);
    let hk_handle = hk.health;
    let proxy_handle = server.add_service(proxy);
    proxy_handle.add_dependency(&hk_handle);
    let mut listening = vec![proxy_handle];
    if let Some(addr) = &state.cfg.metrics_listen {
        let mut metrics = Service::new(
            "infergate metrics".to_string(),
            MetricsApp::new(state.clone()),
        );
        metrics.add_tcp(addr);
        let metrics = server.add_service(metrics);
        metrics.add_dependency(&hk.reloads);
        listening.push(metrics);
    }
    // Bootstrap (readiness for daemon_wait_for_ready, the upgrade's sockets) runs after the fork: see lifecycle.
    let addrs: Vec<String> = state
        .cfg
        .listen
        .iter()
        .chain(&state.cfg.metrics_listen)
        .cloned()
        .collect();
    crate::lifecycle::order_startup(
        &mut server,
        upgrade,
        &hk_handle,
        &listening,
        &addrs,
        &state.serving,
    );
    Ok((server, state))
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
