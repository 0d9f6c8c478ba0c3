//! Live load: the publish loop that writes this replica's figures and hands the peers' sums to each endpoint.

use std::sync::Arc;
use std::time::{Duration, Instant};

use pingora_core::server::ShutdownWatch;
use redis::aio::ConnectionManager;

use super::wire::{self, Figures, LoadRecord, PeerState};
use super::{connection, wall_ms, Cluster, BACKGROUND_TIMEOUT};

/// A replica's load key expires after this many publish intervals without a publish.
pub const PEER_TTL_INTERVALS: u32 = 5;

/// The shortest load-key lifetime, whatever the interval: a busy host may miss a tick or two.
const MIN_PEER_TTL: Duration = Duration::from_millis(500);

/// The shortest wait between two connection attempts while the store is down.
pub(super) const RECONNECT_EVERY: Duration = Duration::from_millis(500);

/// Publishes in a row that may miss their deadline before the store is declared down: one stall of a busy host
/// (or of Redis forking for a snapshot) is no outage, and declaring one drops the connection and the binding
/// writes until the next tick reconnects. An error the store answers is an outage at once.
const LATE_PUBLISHES_DOWN: u32 = 2;

/// Replica names older than this are pruned from the replica set (their load keys expired long ago).
const REPLICA_FORGET_MS: u64 = 600_000;

/// Names read from the replica set per tick, most recently published first: more live replicas than this is no
/// deployment but junk, and one tick's work stays bounded whatever the set holds.
pub const MAX_REPLICAS_READ: usize = 256;

/// A replica-set score further ahead of this replica's clock than this is no replica's (clocks agree within
/// seconds): pruned.
const FUTURE_SLACK_MS: u64 = 60_000;

impl Cluster {
    /// The name this process publishes its load and reservations under: the replica's, or, once a graceful
    /// upgrade began, the replica's with this process's id. The new instance publishes under the replica's name
    /// meanwhile: each must count, and neither may overwrite or remove the other's keys.
    pub(super) fn publishing_as(&self) -> String {
        if crate::lifecycle::upgrading() {
            format!("{}~{}", self.cfg.replica, std::process::id())
        } else {
            self.cfg.replica.clone()
        }
    }

    pub(super) fn peer_ttl(&self) -> Duration {
        (self.cfg.publish_interval * PEER_TTL_INTERVALS).max(MIN_PEER_TTL)
    }

    /// This replica's live load by endpoint URL.
    pub(super) fn own_load(&self) -> LoadRecord {
        let mut rec = LoadRecord::default();
        for pool in &self.pools.pools {
            for e in pool.endpoints().iter() {
                rec.add(
                    crate::state_file::endpoint_url(e),
                    Figures {
                        requests: e.load.requests(),
                        prefill_tokens: e.load.prefill_tokens(),
                    },
                );
            }
        }
        rec
    }

    /// Forget every peer: this replica places on its own figures.
    fn forget_peers(&self) {
        let mut view = self.view.lock();
        view.clear();
        self.apply_view(&view, self.pools.pools.iter().map(|p| &**p));
        self.metrics.peers.set(0);
    }

    /// Publish this replica's load and read the peers'. Err when the store did not answer. Prunes the replica set
    /// of names without a readable load record (stopped replicas, junk) and of scores far in the future, and reads
    /// at most [`MAX_REPLICAS_READ`] names.
    async fn publish_and_read(&self, conn: &mut ConnectionManager) -> redis::RedisResult<()> {
        let now_ms = wall_ms();
        let me = &self.publishing_as();
        let ttl_ms = wire::millis(self.peer_ttl());
        let replicas_key = self.keys.replicas();
        let record = self.next_record();
        let t0 = Instant::now();
        let (names,): (Vec<String>,) = redis::pipe()
            .cmd("SET")
            .arg(self.keys.load(me))
            .arg(record.encode())
            .arg("PX")
            .arg(ttl_ms)
            .ignore()
            .cmd("ZADD")
            .arg(&replicas_key)
            .arg(now_ms)
            .arg(me)
            .ignore()
            .cmd("ZREMRANGEBYSCORE")
            .arg(&replicas_key)
            .arg("-inf")
            .arg(now_ms.saturating_sub(REPLICA_FORGET_MS))
            .ignore()
            .cmd("ZREMRANGEBYSCORE")
            .arg(&replicas_key)
            .arg(format!("({}", now_ms.saturating_add(FUTURE_SLACK_MS)))
            .arg("+inf")
            .ignore()
            .cmd("ZREVRANGEBYSCORE")
            .arg(&replicas_key)
            .arg("+inf")
            .arg("-inf")
            .arg("LIMIT")
            .arg(0)
            .arg(MAX_REPLICAS_READ)
            .query_async(conn)
            .await?;
        self.metrics
            .publish_seconds
            .observe(t0.elapsed().as_secs_f64());
        let others: Vec<String> = names.into_iter().filter(|n| n != me).collect();
        let records: Vec<Option<Vec<u8>>> = if others.is_empty() {
            Vec::new()
        } else {
            let keys: Vec<String> = others.iter().map(|n| self.keys.load(n)).collect();
            let t1 = Instant::now();
            let records = redis::cmd("MGET").arg(&keys).query_async(conn).await?;
            self.metrics
                .read_seconds
                .with_label_values(&["load"])
                .observe(t1.elapsed().as_secs_f64());
            records
        };
        let mut gone = Vec::new();
        {
            let mut view = self.view.lock();
            let mut before = std::mem::take(&mut *view);
            for (name, bytes) in others.into_iter().zip(records) {
                match bytes.as_deref().and_then(LoadRecord::decode) {
                    Some(record) => {
                        let reserved = before.remove(&name).map(|s| s.reserved).unwrap_or_default();
                        view.insert(name, PeerState { record, reserved });
                    }
                    None => gone.push(name),
                }
            }
            self.apply_view(&view, self.pools.pools.iter().map(|p| &**p));
            self.metrics.peers.set(view.len() as i64);
        }
        if !gone.is_empty() {
            // A live replica among them (its key just expired: a missed tick) adds itself back at its next publish.
            redis::cmd("ZREM")
                .arg(&replicas_key)
                .arg(&gone)
                .query_async::<()>(conn)
                .await?;
        }
        Ok(())
    }

    /// Publish; a key of the wrong type in the way is replaced and the publish tried once more.
    async fn publish(&self, conn: &mut ConnectionManager) -> redis::RedisResult<()> {
        match self.publish_and_read(conn).await {
            Err(e) if e.code() == Some("WRONGTYPE") => {
                self.replace_foreign_keys(conn).await?;
                self.publish_and_read(conn).await
            }
            done => done,
        }
    }

    /// The publish loop: connect, publish and read every interval, track the store's state, catch up after an
    /// outage. Ends at shutdown, removing this replica's load key so its peers drop it at once.
    pub(super) async fn run(self: Arc<Self>, stop: ShutdownWatch) {
        // A stopping replica's requests still load the engines until they end: its peers keep seeing them.
        let stopped = crate::lifecycle::requests_done(stop);
        tokio::pin!(stopped);
        let mut tick = tokio::time::interval(self.cfg.publish_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_ok = Instant::now();
        let mut next_connect = Instant::now();
        let mut need_catch_up = false;
        let mut late = 0u32;
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = &mut stopped => break,
            }
            let mut conn = match self.conn.load().as_deref().cloned() {
                Some(c) => c,
                None if Instant::now() < next_connect => {
                    self.forget_stale_peers(last_ok);
                    continue;
                }
                None => match tokio::time::timeout(BACKGROUND_TIMEOUT * 2, self.connect()).await {
                    Ok(Ok(c)) => {
                        self.conn.store(Some(Arc::new(c.clone())));
                        c
                    }
                    Ok(Err(e)) => {
                        self.down(&connection::explain(&e), last_ok);
                        next_connect = Instant::now() + RECONNECT_EVERY;
                        continue;
                    }
                    Err(_) => {
                        self.down("connect timed out", last_ok);
                        next_connect = Instant::now() + RECONNECT_EVERY;
                        continue;
                    }
                },
            };
            match tokio::time::timeout(BACKGROUND_TIMEOUT, self.publish(&mut conn)).await {
                Ok(Ok(())) => {
                    last_ok = Instant::now();
                    late = 0;
                    if self.store_up() || need_catch_up {
                        need_catch_up = false;
                        match self.catch_up(&mut conn).await {
                            Ok(n) if n > 0 => {
                                log::info!(
                                    "cluster: wrote {n} local session bindings the store lacked"
                                )
                            }
                            Ok(_) => {}
                            Err(e) => {
                                log::debug!("cluster: catching up failed: {e}");
                                need_catch_up = true;
                            }
                        }
                    }
                }
                Ok(Err(e)) if !e.is_timeout() => {
                    // Start over with a fresh connection next time (the manager's own retries are short).
                    late = 0;
                    self.conn.store(None);
                    self.down(&connection::explain(&e), last_ok);
                    need_catch_up = true;
                }
                // Late: the connection's response timeout or ours (both BACKGROUND_TIMEOUT).
                Ok(Err(_)) | Err(_) => {
                    late += 1;
                    if late < LATE_PUBLISHES_DOWN {
                        // Counted, kept connected: the multiplexed connection drops the late reply when it comes.
                        self.metrics.error("publish");
                        self.forget_stale_peers(last_ok);
                        log::info!(
                            "cluster: a publish to Redis took over {BACKGROUND_TIMEOUT:?}; the store counts as \
                             down if {} in a row do",
                            LATE_PUBLISHES_DOWN
                        );
                        continue;
                    }
                    late = 0;
                    self.conn.store(None);
                    self.down(
                        &format!("{LATE_PUBLISHES_DOWN} publishes in a row took over {BACKGROUND_TIMEOUT:?}"),
                        last_ok,
                    );
                    need_catch_up = true;
                }
            }
        }
        if let Some(mut conn) = self.conn() {
            let me = &self.publishing_as();
            let _ = tokio::time::timeout(
                BACKGROUND_TIMEOUT,
                redis::cmd("DEL")
                    .arg(self.keys.load(me))
                    .arg(self.keys.reserved(me))
                    .query_async::<()>(&mut conn),
            )
            .await;
        }
    }

    fn down(&self, why: &str, last_ok: Instant) {
        self.metrics.error("publish");
        self.store_down(why);
        self.forget_stale_peers(last_ok);
    }

    /// The peers' last figures stay as long as their keys would have; after that this replica is on its own.
    fn forget_stale_peers(&self, last_ok: Instant) {
        if last_ok.elapsed() >= self.peer_ttl() {
            self.forget_peers();
        }
    }
}
