//! The span pipeline's life: built once the process runs (after a daemon's fork, which its export thread would
//! not survive), flushed when the router stops, after the requests in flight then have ended.

use async_trait::async_trait;
use pingora_core::server::ShutdownWatch;
use pingora_core::services::background::BackgroundService;
use pingora_core::services::ServiceReadyNotifier;

use crate::lifecycle::ShutdownWork;
use crate::state::RouterState;

pub(super) struct Tracing {
    pub(super) state: RouterState,
    /// The flush at shutdown, which the process's early exit waits for.
    pub(super) flush: parking_lot::Mutex<Option<ShutdownWork>>,
}

#[async_trait]
impl BackgroundService for Tracing {
    async fn start_with_ready_notifier(
        &self,
        mut stop: ShutdownWatch,
        ready: ServiceReadyNotifier,
    ) {
        let state = self.state.clone();
        // Starting threads and the exporter's HTTP client blocks: off the runtime.
        let built = tokio::task::spawn_blocking(move || {
            state.tracing.configure(state.current().tracing.as_ref())
        })
        .await;
        match built {
            Ok(Ok(())) => {}
            Ok(Err(e)) => log::error!("{e}; requests are not traced"),
            Err(e) => log::error!("tracing: the pipeline could not be built: {e}"),
        }
        ready.notify_ready();
        let _ = stop.changed().await;
        // The spans of requests still in flight at a stop end with them: flush after the last one.
        crate::lifecycle::clients_drained().await;
        let tracing = self.state.tracing.clone();
        let _ = tokio::task::spawn_blocking(move || tracing.shutdown()).await;
        drop(self.flush.lock().take());
    }
}
