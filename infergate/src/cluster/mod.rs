//! Router replicas that place as one (`cluster`): live load and session bindings shared through Redis.
//!
//! * **Load**: every `publish_interval` a background task writes this replica's requests and prefill tokens in
//!   flight per endpoint URL under a key of its own that expires after [`PEER_TTL_INTERVALS`] intervals, then reads
//!   the other replicas' keys and stores their sums in each endpoint's `ledger::PeerLoad`. The pool's placement snapshot
//!   adds those to its own live figures (placement stays pure: it gets numbers). A replica that stops publishing
//!   drops out when its key expires; while the store cannot be read, the last figures stay for one key lifetime
//!   (a fresh peer never reads as zero), then this replica places on its own figures alone.
//! * **Sessions**: a served session turn's binding is queued for a background writer (the request path never waits
//!   for the write); every session request reads its binding from the store, waiting at most
//!   `cluster.read_timeout`, and imports it before placement when the local table has none or an older one on
//!   another endpoint (so a move another replica made is followed).
//! * **Stored responses**: which engine holds a stored Responses API object (`stored_responses`) is written the
//!   same way when one is created, and read (bounded by `cluster.read_timeout`) when a request names an id this
//!   replica has not seen.
//! * **Store down or slow**: nothing waits and nothing fails; `infergate_cluster_state` says `down` and one log line
//!   marks each transition. On the way back up this replica's live bindings are written where the store has none
//!   (`SET NX`: never over a newer binding another replica wrote meanwhile).

mod metrics;
pub mod wire;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use arc_swap::ArcSwapOption;
use async_trait::async_trait;
use parking_lot::Mutex;
use pingora_core::server::{Server, ShutdownWatch};
use pingora_core::services::background::BackgroundService;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use crate::config::ClusterConfig;
use crate::placement::sessions::{session_hash, SavedSession};
use crate::pool::{Pool, Pools};
use crate::stored_responses::Holder;
pub use metrics::ClusterMetrics;
use wire::{BindingRecord, Figures, Keys, LoadRecord};

/// A replica's load key expires after this many publish intervals without a publish.
pub const PEER_TTL_INTERVALS: u32 = 5;

/// The shortest load-key lifetime, whatever the interval: a busy host may miss a tick or two.
const MIN_PEER_TTL: Duration = Duration::from_millis(500);

/// How long background store operations (publish, peer reads, binding writes) may take.
const BACKGROUND_TIMEOUT: Duration = Duration::from_secs(1);

/// The shortest wait between two connection attempts while the store is down.
const RECONNECT_EVERY: Duration = Duration::from_millis(500);

/// How long the store remembers which engine holds a stored response (vLLM keeps them until the engine restarts).
const RESPONSE_HOLDER_TTL: Duration = Duration::from_secs(24 * 3600);

/// Binding writes queued for the background writer; past this they are dropped (and counted).
const WRITE_QUEUE: usize = 8192;

/// Replica names older than this are pruned from the replica set (their load keys expired long ago).
const REPLICA_FORGET_MS: u64 = 600_000;

/// One binding write for the background writer.
struct Write {
    key: String,
    value: Vec<u8>,
    ttl_ms: u64,
}

/// A replica's handle on the shared store.
pub struct Cluster {
    cfg: ClusterConfig,
    keys: Keys,
    pools: Arc<Pools>,
    conn: ArcSwapOption<ConnectionManager>,
    connected: AtomicBool,
    metrics: ClusterMetrics,
    writes: tokio::sync::mpsc::Sender<Write>,
    writes_rx: Mutex<Option<tokio::sync::mpsc::Receiver<Write>>>,
}

impl Cluster {
    /// The cluster handle when `cfg` is set; registers the `infergate_cluster_*` series either way.
    pub fn new(
        cfg: Option<&ClusterConfig>,
        pools: &Arc<Pools>,
        metrics: &crate::metrics::Metrics,
    ) -> Option<Arc<Cluster>> {
        let session_pools: Vec<&str> = pools
            .pools
            .iter()
            .filter(|p| p.cfg().policy.sessions().is_some())
            .map(|p| &*p.name)
            .collect();
        let m = ClusterMetrics::register(metrics, &session_pools, cfg.is_some());
        let cfg = cfg?;
        let (tx, rx) = tokio::sync::mpsc::channel(WRITE_QUEUE);
        Some(Arc::new(Cluster {
            keys: Keys::new(&cfg.key_prefix),
            cfg: cfg.clone(),
            pools: pools.clone(),
            conn: ArcSwapOption::empty(),
            connected: AtomicBool::new(false),
            metrics: m,
            writes: tx,
            writes_rx: Mutex::new(Some(rx)),
        }))
    }

    /// The store answered the last background operation.
    pub fn connected(&self) -> bool {
        self.connected.load(Ordering::Relaxed)
    }

    fn peer_ttl(&self) -> Duration {
        (self.cfg.publish_interval * PEER_TTL_INTERVALS).max(MIN_PEER_TTL)
    }

    /// Record the store's state; logs once per transition. Returns true when it changed to connected.
    fn set_connected(&self, up: bool, why: &str) -> bool {
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
    fn conn(&self) -> Option<ConnectionManager> {
        if !self.connected() {
            return None;
        }
        self.conn.load().as_deref().cloned()
    }

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
    async fn read_binding(
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

    /// After a session turn was served: queue its binding (`saved`, endpoint id of this process) for the store.
    /// Never waits; a full queue or a down store drops the write (counted).
    pub fn share_binding(&self, pool: &Pool, saved: &SavedSession) {
        if !self.connected() {
            return;
        }
        let Some(write) = self.binding_write(pool, saved, wall_ms()) else {
            return;
        };
        if self.writes.try_send(write).is_err() {
            self.metrics.error("write_binding");
        }
    }

    /// A stored response was created on `holder`: queue that for the store, so a replica that gets its next turn,
    /// retrieval or cancel sends it there too. Never waits; a full queue or a down store drops the write (counted).
    pub fn share_response(&self, id: &str, holder: &Holder) {
        if !self.connected() {
            return;
        }
        let write = Write {
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

    fn binding_write(&self, pool: &Pool, saved: &SavedSession, now_ms: u64) -> Option<Write> {
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
        Some(Write {
            key: self.keys.session(&pool.name, saved.key),
            value: BindingRecord::of(saved, url, now_ms).encode(),
            ttl_ms,
        })
    }

    /// This replica's live load by endpoint URL.
    fn own_load(&self) -> LoadRecord {
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

    /// Hand the peers' sums to every endpoint (0 for endpoints no peer has load on).
    fn apply_peers(&self, sums: &std::collections::HashMap<String, Figures>, peers: usize) {
        for pool in &self.pools.pools {
            for e in pool.endpoints().iter() {
                let f = sums
                    .get(&crate::state_file::endpoint_url(e))
                    .copied()
                    .unwrap_or_default();
                e.peers.set(f.requests, f.prefill_tokens);
            }
        }
        self.metrics.peers.set(peers as i64);
    }

    /// Publish this replica's load and read the peers'. Err when the store did not answer.
    async fn publish_and_read(&self, conn: &mut ConnectionManager) -> redis::RedisResult<()> {
        let now_ms = wall_ms();
        let me = &self.cfg.replica;
        let ttl_ms = wire::millis(self.peer_ttl());
        let replicas_key = self.keys.replicas();
        let t0 = Instant::now();
        let (names,): (Vec<String>,) = redis::pipe()
            .cmd("SET")
            .arg(self.keys.load(me))
            .arg(self.own_load().encode())
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
            .cmd("ZRANGE")
            .arg(&replicas_key)
            .arg(0)
            .arg(-1)
            .query_async(conn)
            .await?;
        self.metrics
            .publish_seconds
            .observe(t0.elapsed().as_secs_f64());
        let others: Vec<String> = names
            .iter()
            .filter(|n| *n != me)
            .map(|n| self.keys.load(n))
            .collect();
        if others.is_empty() {
            self.apply_peers(&Default::default(), 0);
            return Ok(());
        }
        let t1 = Instant::now();
        let records: Vec<Option<Vec<u8>>> =
            redis::cmd("MGET").arg(&others).query_async(conn).await?;
        self.metrics
            .read_seconds
            .with_label_values(&["load"])
            .observe(t1.elapsed().as_secs_f64());
        let (sums, peers) = wire::sum_peers(records.iter().map(|r| r.as_deref()));
        self.apply_peers(&sums, peers);
        Ok(())
    }

    /// Back from an outage: write this replica's live bindings where the store has none.
    async fn catch_up(&self, conn: &mut ConnectionManager) -> redis::RedisResult<usize> {
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
                    if let Some(w) = self.binding_write(pool, s, now_ms) {
                        pipe.cmd("SET")
                            .arg(w.key)
                            .arg(w.value)
                            .arg("PX")
                            .arg(w.ttl_ms)
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

    async fn connect(&self) -> redis::RedisResult<ConnectionManager> {
        let client = redis::Client::open(self.cfg.connection.clone())?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(BACKGROUND_TIMEOUT)
            .set_response_timeout(BACKGROUND_TIMEOUT)
            .set_number_of_retries(1)
            .set_max_delay(100);
        ConnectionManager::new_with_config(client, config).await
    }

    /// The publish loop: connect, publish and read every interval, track the store's state, catch up after an
    /// outage. Ends at shutdown, removing this replica's load key so its peers drop it at once.
    async fn run(self: Arc<Self>, mut stop: ShutdownWatch) {
        let mut tick = tokio::time::interval(self.cfg.publish_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut last_ok = Instant::now();
        let mut next_connect = Instant::now();
        let mut need_catch_up = false;
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stop.changed() => break,
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
                        self.down(&e.to_string(), last_ok);
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
            match tokio::time::timeout(BACKGROUND_TIMEOUT, self.publish_and_read(&mut conn)).await {
                Ok(Ok(())) => {
                    last_ok = Instant::now();
                    if self.set_connected(true, "") || need_catch_up {
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
                Ok(Err(e)) => {
                    // Start over with a fresh connection next time (the manager's own retries are short).
                    self.conn.store(None);
                    self.down(&e.to_string(), last_ok);
                    need_catch_up = true;
                }
                Err(_) => {
                    self.conn.store(None);
                    self.down("publish timed out", last_ok);
                    need_catch_up = true;
                }
            }
        }
        if let Some(mut conn) = self.conn() {
            let key = self.keys.load(&self.cfg.replica);
            let _ = tokio::time::timeout(
                BACKGROUND_TIMEOUT,
                redis::cmd("DEL").arg(key).query_async::<()>(&mut conn),
            )
            .await;
        }
    }

    fn down(&self, why: &str, last_ok: Instant) {
        self.metrics.error("publish");
        self.set_connected(false, why);
        self.forget_stale_peers(last_ok);
    }

    /// The peers' last figures stay as long as their keys would have; after that this replica is on its own.
    fn forget_stale_peers(&self, last_ok: Instant) {
        if last_ok.elapsed() >= self.peer_ttl() {
            self.apply_peers(&Default::default(), 0);
        }
    }

    /// The binding writer: sends queued writes in batches.
    async fn write_bindings(self: Arc<Self>, mut stop: ShutdownWatch) {
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

/// Wall-clock milliseconds since the Unix epoch (binding times cross processes and hosts).
fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, wire::millis)
}

/// Add the cluster's background service (publish loop and binding writer) when `cluster` is configured.
pub fn install(server: &mut Server, cluster: Option<&Arc<Cluster>>) {
    let Some(cluster) = cluster else {
        return;
    };
    server.add_service(pingora_core::services::background::background_service(
        "infergate cluster",
        ClusterService {
            cluster: cluster.clone(),
        },
    ));
}

struct ClusterService {
    cluster: Arc<Cluster>,
}

#[async_trait]
impl BackgroundService for ClusterService {
    async fn start(&self, shutdown: ShutdownWatch) {
        let writer = tokio::spawn(self.cluster.clone().write_bindings(shutdown.clone()));
        self.cluster.clone().run(shutdown).await;
        let _ = writer.await;
    }
}
