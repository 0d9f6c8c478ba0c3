//! The binding writer: the queue the request path fills (bindings, stored-response holders, replaced keys) and the
//! background task that sends it in batches.

use std::sync::Arc;

use pingora_core::server::ShutdownWatch;

use super::{Cluster, BACKGROUND_TIMEOUT};

/// Binding writes queued for the background writer; past this they are dropped (and counted).
pub(super) const WRITE_QUEUE: usize = 8192;

/// One write for the background writer.
pub(super) enum Write {
    /// `SET key value PX ttl_ms`.
    Set {
        key: String,
        value: Vec<u8>,
        ttl_ms: u64,
    },
    /// `DEL key`: a key of the wrong type under the prefix.
    Del { key: String },
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
                match w {
                    Write::Set { key, value, ttl_ms } => {
                        pipe.cmd("SET")
                            .arg(key)
                            .arg(value)
                            .arg("PX")
                            .arg(ttl_ms)
                            .ignore();
                    }
                    Write::Del { key } => {
                        pipe.cmd("DEL").arg(key).ignore();
                    }
                }
            }
            let n = pipe.len() as u64;
            match tokio::time::timeout(BACKGROUND_TIMEOUT, pipe.query_async::<()>(&mut conn)).await
            {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    self.metrics
                        .errors_total
                        .with_label_values(&["write_binding"])
                        .inc_by(n);
                    if e.code() == Some("WRONGTYPE") {
                        let _ = tokio::time::timeout(
                            BACKGROUND_TIMEOUT,
                            self.replace_foreign_keys(&mut conn),
                        )
                        .await;
                    }
                }
                Err(_) => self
                    .metrics
                    .errors_total
                    .with_label_values(&["write_binding"])
                    .inc_by(n),
            }
        }
    }
}
