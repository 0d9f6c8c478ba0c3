//! Stored responses: which engine holds one, queued for the store when created and read for an id not seen here.

use std::time::Duration;

use super::wire;
use super::writer::Write;
use super::Cluster;
use crate::stored_responses::Holder;

/// How long the store remembers which engine holds a stored response (vLLM keeps them until the engine restarts).
const RESPONSE_HOLDER_TTL: Duration = Duration::from_secs(24 * 3600);

impl Cluster {
    /// A stored response was created on `holder`: queue that for the store, so a replica that gets its next turn,
    /// retrieval or cancel sends it there too. Never waits; a full queue or a down store drops the write (counted).
    pub fn share_response(&self, id: &str, holder: &Holder) {
        if !self.connected() {
            return;
        }
        let write = Write::Set {
            key: self.keys.response(id),
            value: format!("{}\n{}", holder.pool, holder.endpoint).into_bytes(),
            ttl_ms: wire::millis(RESPONSE_HOLDER_TTL),
        };
        if self.writes.try_send(write).is_err() {
            self.metrics.error("write_binding");
        }
    }

    /// The engine another replica saw store response `id`, waiting at most `cluster.read_timeout`; None when the
    /// store does not know it or does not answer in time.
    pub async fn lookup_response(&self, id: &str) -> Option<Holder> {
        let mut conn = self.conn()?;
        let bytes = self
            .read_binding(&mut conn, &self.keys.response(id))
            .await
            .ok()??;
        let text = std::str::from_utf8(&bytes).ok()?;
        let (pool, endpoint) = text.split_once('\n')?;
        Some(Holder {
            pool: pool.into(),
            endpoint: endpoint.to_string(),
        })
    }
}
