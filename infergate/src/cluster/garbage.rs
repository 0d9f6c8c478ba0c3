//! Keys under the prefix that hold another type than the cluster writes there: every key under `{key_prefix}:` is
//! the cluster's own, so such a key is replaced (with a warning), never a reason to stay down or to fail a lookup.

use redis::aio::ConnectionManager;

use super::Cluster;

impl Cluster {
    /// After a `WRONGTYPE` answer to a publish or a write: delete the keys of this replica that hold the wrong type
    /// (the replica set, its reservations; its load record and the bindings are plain `SET`s, which replace any
    /// type). Returns how many were replaced.
    pub(super) async fn replace_foreign_keys(
        &self,
        conn: &mut ConnectionManager,
    ) -> redis::RedisResult<usize> {
        let own = [
            (self.keys.replicas(), "zset"),
            (self.keys.reserved(&self.publishing_as()), "hash"),
        ];
        let mut replaced = 0;
        for (key, want) in own {
            let found: String = redis::cmd("TYPE").arg(&key).query_async(conn).await?;
            if found == want || found == "none" {
                continue;
            }
            redis::cmd("DEL").arg(&key).query_async::<()>(conn).await?;
            log::warn!(
                "cluster: Redis key `{key}` held a {found}, not the cluster's {want}; replaced it (every key under \
                 `{}:` is the cluster's own)",
                self.cfg.key_prefix
            );
            replaced += 1;
        }
        Ok(replaced)
    }

    /// A binding read met `key` holding another type: read as none, and the key deleted before the request goes
    /// on (awaited, at most `cluster.read_timeout`). Queued to the writer instead, the delete could land after the
    /// binding this same turn writes once its engine answers (`store_binding`, straight on the connection) and
    /// delete that.
    pub(super) async fn foreign_binding(&self, conn: &mut ConnectionManager, key: &str) {
        log::warn!(
            "cluster: Redis key `{key}` holds another type than the cluster's binding; read as none, and replaced"
        );
        let deleted = tokio::time::timeout(
            self.cfg.read_timeout,
            redis::cmd("DEL").arg(key).query_async::<()>(conn),
        )
        .await;
        if !matches!(deleted, Ok(Ok(()))) {
            self.metrics.error("write_binding");
        }
    }
}
