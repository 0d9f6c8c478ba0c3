//! The store's connection and its state: connecting, the connection in use while up, one log line per change.

use std::sync::atomic::Ordering;

use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use super::{Cluster, BACKGROUND_TIMEOUT};

impl Cluster {
    /// The store answered the last background operation.
    pub fn connected(&self) -> bool {
        self.connected.load(Ordering::Relaxed)
    }

    /// Record the store's state; logs once per transition. Returns true when it changed to connected.
    pub(super) fn set_connected(&self, up: bool, why: &str) -> bool {
        if self.connected.swap(up, Ordering::Relaxed) == up {
            return false;
        }
        self.metrics.set_state(up);
        if up {
            log::info!(
                "cluster: connected to Redis at {} as replica {}; sharing load and session bindings",
                self.cfg.shown_url,
                self.cfg.replica
            );
        } else {
            log::warn!(
                "cluster: Redis at {} is unavailable ({why}); placing on this replica's own load and sessions until it is back",
                self.cfg.shown_url
            );
        }
        up
    }

    /// A connection to use now, when the store is up.
    pub(super) fn conn(&self) -> Option<ConnectionManager> {
        if !self.connected() {
            return None;
        }
        self.conn.load().as_deref().cloned()
    }

    pub(super) async fn connect(&self) -> redis::RedisResult<ConnectionManager> {
        // `rediss://` builds its rustls client with the process's provider.
        crate::tls::provider();
        let client = redis::Client::open(self.cfg.connection.clone())?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(BACKGROUND_TIMEOUT)
            .set_response_timeout(BACKGROUND_TIMEOUT)
            .set_number_of_retries(1)
            .set_max_delay(100);
        ConnectionManager::new_with_config(client, config).await
    }
}
