//! Keys under the prefix that hold another type than the cluster writes there: every key under `{key_prefix}:` is
//! the cluster's own, so such a key is replaced (with a warning), never a reason to stay down or to fail a lookup.

use redis::aio::ConnectionManager;

use super::writer::Write;
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
            (self.keys.reserved(&self.cfg.replica), "hash"),
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

    /// A binding read met `key` holding another type: read as no binding, and the key deleted (queued) so that the
    /// next write lands.
    pub(super) fn foreign_binding(&self, key: &str) {
        log::warn!(
            "cluster: Redis key `{key}` holds another type than the cluster's binding; read as none, and replaced"
        );
        if self
            .writes
            .try_send(Write::Del {
                key: key.to_string(),
            })
            .is_err()
        {
            self.metrics.error("write_binding");
        }
    }
}
