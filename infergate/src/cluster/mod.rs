//! Router replicas that place as one (`cluster`): live load and session bindings shared through Redis.
//!
//! * **Load**: every `publish_interval` a background task writes this replica's requests and prefill tokens in
//!   flight per endpoint URL under a key of its own that expires after [`PEER_TTL_INTERVALS`] intervals, then reads
//!   the other replicas' keys (at most [`MAX_REPLICAS_READ`], pruning names without a record) and stores their sums
//!   in each endpoint's `ledger::PeerLoad`. The pool's placement snapshot adds those to its own live figures
//!   (placement stays pure: it gets numbers). A replica that stops publishing drops out when its key expires; while
//!   the store cannot be read, the last figures stay for one key lifetime (a fresh peer never reads as zero), then
//!   this replica places on its own figures alone.
//! * **Reservations** (`reserve`): every dispatch is also counted at once in the replica's reservations (one
//!   queued `HINCRBY` under a lease), and every placement first reads the peers' (one round trip, at most
//!   `cluster.read_timeout`), so a burst spread over the replicas inside one interval splits as one router splits
//!   it. An epoch puts each dispatch in the record or in the reservations, never both.
//! * **Sessions**: a served session turn's binding is written when its engine sends headers, before the client
//!   gets them, waiting at most `cluster.read_timeout` (the engine prefills meanwhile); every session request reads
//!   its binding from the store, waiting at most as long, and imports it before placement when the local table has
//!   none or an older one on another endpoint (so a move another replica made is followed).
//! * **Stored responses**: which engine holds a stored Responses API object (`stored_responses`) is queued for a
//!   background writer when one is created, and read (bounded by `cluster.read_timeout`) when a request names an id this
//!   replica has not seen.
//! * **Garbage** (`garbage`): a key of the wrong type under the prefix is replaced, with a warning.
//! * **Store down or slow**: nothing waits longer than `cluster.read_timeout` and nothing fails. A connect or publish
//!   the store refuses, or two publishes in a row over their deadline (one is a stall, not an outage: counted, and
//!   logged at info), make `infergate_cluster_state` say `down`; the log says
//!   why at the first failure (also when the store was never reached: a wrong password, an unreachable host), again
//!   every minute while it stays down, and when it is back. On the way back up this replica's live bindings are
//!   written where the store has none (`SET NX`: never over a newer binding another replica wrote meanwhile).
//! * **`infergate -t`** tries the store once, briefly (`check`): credentials it refuses are a configuration error,
//!   a store it cannot reach is a warning (it may come up after the router).

mod check;
mod connection;
mod garbage;
mod load;
mod metrics;
mod reserve;
mod responses;
mod sessions;
pub mod wire;
mod writer;

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use arc_swap::ArcSwapOption;
use async_trait::async_trait;
use parking_lot::{Mutex, RwLock};
use pingora_core::server::{Server, ShutdownWatch};
use pingora_core::services::background::BackgroundService;
use redis::aio::ConnectionManager;

use crate::config::ClusterConfig;
use crate::lifecycle::ShutdownWork;
use crate::pool::Pools;
pub use check::check_store;
pub use load::{MAX_REPLICAS_READ, PEER_TTL_INTERVALS};
pub use metrics::ClusterMetrics;
pub use reserve::Reserving;
use wire::{Keys, PeerState};
use writer::{Write, WRITE_QUEUE};

/// How long background store operations (publish, peer reads, binding writes) may take.
const BACKGROUND_TIMEOUT: Duration = Duration::from_secs(1);

/// A replica's handle on the shared store.
pub struct Cluster {
    cfg: ClusterConfig,
    keys: Keys,
    pools: Arc<Pools>,
    conn: ArcSwapOption<ConnectionManager>,
    connected: AtomicBool,
    outage: Mutex<connection::Outage>,
    metrics: ClusterMetrics,
    writes: tokio::sync::mpsc::Sender<Write>,
    /// This replica's publish count, from its start time in ms (a restart never reuses an epoch), see `reserve`.
    epoch: RwLock<u64>,
    /// What this replica knows of each peer, by name: its last load record and its reservations as last read.
    view: Mutex<std::collections::HashMap<String, PeerState>>,
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
            outage: Mutex::default(),
            metrics: m,
            writes: tx,
            epoch: RwLock::new(wall_ms()),
            view: Mutex::default(),
            writes_rx: Mutex::new(Some(rx)),
        }))
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
            load_key: Mutex::new(Some(ShutdownWork::expect())),
        },
    ));
}

struct ClusterService {
    cluster: Arc<Cluster>,
    /// This replica's load key, published until a stop's requests in flight ended, then removed: the process's
    /// early exit waits for it.
    load_key: Mutex<Option<ShutdownWork>>,
}

#[async_trait]
impl BackgroundService for ClusterService {
    async fn start(&self, shutdown: ShutdownWatch) {
        let writer = tokio::spawn(self.cluster.clone().write_batches(shutdown.clone()));
        self.cluster.clone().run(shutdown).await;
        let _ = writer.await;
        drop(self.load_key.lock().take());
    }
}
