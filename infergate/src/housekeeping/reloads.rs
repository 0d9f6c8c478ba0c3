//! SIGHUP: re-read the config file and apply what can change in place (`reload`).

use async_trait::async_trait;
use pingora_core::server::ShutdownWatch;
use pingora_core::services::background::BackgroundService;
use pingora_core::services::ServiceReadyNotifier;

use crate::state::RouterState;

pub(super) struct Reloads {
    pub(super) state: RouterState,
}

#[async_trait]
impl BackgroundService for Reloads {
    async fn start_with_ready_notifier(
        &self,
        mut stop: ShutdownWatch,
        ready: ServiceReadyNotifier,
    ) {
        // Ready once the handler is in place: without it SIGHUP would terminate the process, so the proxy
        // accepts only after (through the health checks, which wait for this).
        #[cfg(unix)]
        {
            let hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup());
            ready.notify_ready();
            let mut hup = match hup {
                Ok(hup) => hup,
                Err(e) => {
                    log::warn!("cannot listen for SIGHUP (reload): {e}");
                    return;
                }
            };
            loop {
                tokio::select! {
                    got = hup.recv() => if got.is_none() { return },
                    _ = stop.changed() => return,
                }
                // Re-reading resolves hostnames (blocking DNS): keep it off this runtime.
                let state = self.state.clone();
                if let Err(e) = tokio::task::spawn_blocking(move || state.reload_from_file()).await
                {
                    log::error!("reload failed: {e}");
                }
            }
        }
        #[cfg(not(unix))]
        {
            ready.notify_ready();
            let _ = stop.changed().await;
        }
    }
}
