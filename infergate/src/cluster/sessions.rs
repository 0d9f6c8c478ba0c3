//! Session bindings: the bounded read before placement, the bounded write before a turn's answer, the catch-up
//! after an outage.

use std::time::Instant;

use redis::aio::ConnectionManager;

use super::wire::{self, BindingRecord};
use super::{wall_ms, Cluster};
use crate::placement::sessions::{session_hash, SavedSession};
use crate::pool::Pool;

impl Cluster {
    /// Before placing a session request: read the session's binding from the store (waiting at most
    /// `cluster.read_timeout`) and import it into the pool's table when this replica has none or the store's was
    /// served more recently (another replica moved the session, or served turns since). Read even on a local hit:
    /// otherwise a replica holding an old binding sends the session back to the engine another replica moved it
    /// away from, and the two replicas flip it between engines. Never fails: the store's answer only helps.
    pub async fn lookup_binding(&self, pool: &Pool, header: &[u8]) {
        let Some(local) = pool
            .policy
            .sessions()
            .map(|s| s.has_session(header, Instant::now()))
        else {
            return;
        };
        // Where placement's binding comes from when the store adds nothing: it answered, or it did not.
        let own = if local { "local" } else { "miss" };
        let unanswered = if local { "local" } else { "unavailable" };
        let Some(mut conn) = self.conn() else {
            return self.metrics.lookup(&pool.name, unanswered);
        };
        let hash = session_hash(header);
        let key = self.keys.session(&pool.name, hash);
        let bytes = match self.read_binding(&mut conn, &key).await {
            Ok(Some(bytes)) => bytes,
            Ok(None) => return self.metrics.lookup(&pool.name, own),
            Err(()) => return self.metrics.lookup(&pool.name, unanswered),
        };
        let endpoint = BindingRecord::decode(&bytes).and_then(|rec| {
            let label = rec.endpoint.strip_prefix("http://")?;
            let ep = pool
                .endpoints()
                .iter()
                .find(|e| e.label == label)
                .map(|e| e.id)?;
            Some(rec.saved(hash, ep, wall_ms()))
        });
        // A binding to an endpoint this replica does not have is no binding here (the pool's config differs); one
        // served no later than the table's own (within a second) leaves the table's.
        let adopted = endpoint
            .zip(pool.policy.sessions())
            .is_some_and(|(s, hooks)| hooks.import_binding(s, Instant::now()));
        self.metrics
            .lookup(&pool.name, if adopted { "store" } else { own });
    }

    /// One binding's record (a session's, or a stored response's engine) on the request path: GET `key`, waiting at
    /// most `cluster.read_timeout`. Err (counted, logged at debug) when the store failed or did not answer in time.
    pub(super) async fn read_binding(
        &self,
        conn: &mut ConnectionManager,
        key: &str,
    ) -> Result<Option<Vec<u8>>, ()> {
        let t0 = Instant::now();
        let got = tokio::time::timeout(
            self.cfg.read_timeout,
            redis::cmd("GET")
                .arg(key)
                .query_async::<Option<Vec<u8>>>(conn),
        )
        .await;
        self.metrics
            .read_seconds
            .with_label_values(&["binding"])
            .observe(t0.elapsed().as_secs_f64());
        match got {
            Ok(Ok(found)) => Ok(found),
            Ok(Err(e)) if e.code() == Some("WRONGTYPE") => {
                self.foreign_binding(conn, key).await;
                Ok(None)
            }
            Ok(Err(e)) => {
                log::debug!("cluster: reading a binding failed: {e}");
                self.metrics.error("read_binding");
                Err(())
            }
            Err(_) => {
                self.metrics.error("read_binding");
                Err(())
            }
        }
    }

    /// A session turn is being served (its engine sent response headers): write its binding (`saved`, endpoint id
    /// of this process) to the store before the client gets the answer, waiting at most `cluster.read_timeout`
    /// (the engine prefills meanwhile). So a client's next turn, wherever it goes, finds the binding, and a replica
    /// killed after answering has lost none. A store down, slow or failing costs the wait at most (counted).
    pub async fn store_binding(&self, pool: &Pool, saved: &SavedSession) {
        let Some(mut conn) = self.conn() else {
            return;
        };
        let Some((key, value, ttl_ms)) = self.binding_write(pool, saved, wall_ms()) else {
            return;
        };
        let t0 = Instant::now();
        let done = tokio::time::timeout(
            self.cfg.read_timeout,
            redis::cmd("SET")
                .arg(&key)
                .arg(value)
                .arg("PX")
                .arg(ttl_ms)
                .query_async::<()>(&mut conn),
        )
        .await;
        self.metrics
            .write_seconds
            .observe(t0.elapsed().as_secs_f64());
        match done {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                log::debug!("cluster: writing a binding failed: {e}");
                self.metrics.error("write_binding");
            }
            // Sent, most likely: the command lands when the store answers; not waited for.
            Err(_) => self.metrics.error("write_binding"),
        }
    }

    fn binding_write(
        &self,
        pool: &Pool,
        saved: &SavedSession,
        now_ms: u64,
    ) -> Option<(String, Vec<u8>, u64)> {
        let ttl = pool.cfg().policy.sessions()?.ttl.saturating_sub(saved.idle);
        let ttl_ms = wire::millis(ttl);
        if ttl_ms == 0 {
            return None;
        }
        let url = pool
            .endpoints()
            .iter()
            .find(|e| e.id == saved.endpoint)
            .map(|e| crate::state_file::endpoint_url(e))?;
        Some((
            self.keys.session(&pool.name, saved.key),
            BindingRecord::of(saved, url, now_ms).encode(),
            ttl_ms,
        ))
    }

    /// Back from an outage: write this replica's live bindings where the store has none.
    pub(super) async fn catch_up(&self, conn: &mut ConnectionManager) -> redis::RedisResult<usize> {
        let now = Instant::now();
        let now_ms = wall_ms();
        let mut written = 0;
        for pool in &self.pools.pools {
            let Some(saved) = pool.policy.sessions().map(|s| s.export_sessions(now)) else {
                continue;
            };
            for chunk in saved.chunks(512) {
                let mut pipe = redis::pipe();
                for s in chunk {
                    if let Some((key, value, ttl_ms)) = self.binding_write(pool, s, now_ms) {
                        pipe.cmd("SET")
                            .arg(key)
                            .arg(value)
                            .arg("PX")
                            .arg(ttl_ms)
                            .arg("NX")
                            .ignore();
                        written += 1;
                    }
                }
                pipe.query_async::<()>(conn).await?;
            }
        }
        Ok(written)
    }
}
