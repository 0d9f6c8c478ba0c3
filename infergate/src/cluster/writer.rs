//! The binding writer: the queue the request path fills and the background task that sends it in batches.

use std::sync::Arc;

use pingora_core::server::ShutdownWatch;

use super::{Cluster, BACKGROUND_TIMEOUT};

/// Binding writes queued for the background writer; past this they are dropped (and counted).
pub(super) const WRITE_QUEUE: usize = 8192;

/// One binding write for the background writer.
pub(super) struct Write {
    pub(super) key: String,
    pub(super) value: Vec<u8>,
    pub(super) ttl_ms: u64,
}

impl Cluster {
    /// The binding writer: sends queued writes in batches.
    pub(super) async fn write_bindings(self: Arc<Self>, mut stop: ShutdownWatch) {
        let Some(mut rx) = self.writes_rx.lock().take() else {
            return;
        };
        let mut batch = Vec::with_capacity(256);
        loop {
            tokio::select! {
                n = rx.recv_many(&mut batch, 256) => if n == 0 { return },
                _ = stop.changed() => return,
            }
            let Some(mut conn) = self.conn() else {
                for _ in batch.drain(..) {
                    self.metrics.error("write_binding");
                }
                continue;
            };
            let mut pipe = redis::pipe();
            for w in batch.drain(..) {
                pipe.cmd("SET")
                    .arg(w.key)
                    .arg(w.value)
                    .arg("PX")
                    .arg(w.ttl_ms)
                    .ignore();
            }
            let n = pipe.len() as u64;
            match tokio::time::timeout(BACKGROUND_TIMEOUT, pipe.query_async::<()>(&mut conn)).await
            {
                Ok(Ok(())) => {}
                _ => self
                    .metrics
                    .errors_total
                    .with_label_values(&["write_binding"])
                    .inc_by(n),
            }
        }
    }
}
