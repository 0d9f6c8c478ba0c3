//! engine-sim: a simulated vLLM engine that is right on the wire (OpenAI-compatible HTTP/1.1, vLLM V1 metric
//! names) and follows vLLM's V1 scheduler for timing (continuous batching, chunked prefill, prefix cache).
//!
//! Start engines in-process with [`spawn_engine`] (inside a tokio runtime) or [`spawn_engine_blocking`] (from
//! any thread); the `engine-sim` binary serves several on fixed ports. Each engine has its own scheduler task
//! and prefix cache, a [`Control`] for failure injection, and records every request it received.
//!
//! Layout: `config` (knobs), `tokenize` (token rule, prompt extraction), `cache` (prefix LRU), `scheduler`
//! (step loop), `http` (HTTP/1.1 connection layer), `control` (runtime knobs, listener, connections), `engine`
//! (shared engine state, records and totals), `errors` (error bodies), `server` (accept and request loops), `api`
//! (routes and response shapes), `store` (stored Responses API responses), `metrics` (Prometheus text).

mod api;
mod cache;
mod config;
mod control;
mod engine;
mod errors;
mod http;
pub mod kv_events;
mod kv_transfer;
mod metrics;
mod scheduler;
mod server;
mod store;
mod tokenize;

use std::collections::VecDeque;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

pub use config::SimConfig;
pub use control::Control;
pub use engine::{EngineTotals, RecordedRequest};
pub use store::MAX_STORED_RESPONSES;
pub use tokenize::{count_tokens, fnv64};

use control::Net;
use engine::Engine;
use scheduler::SchedShared;
use store::ResponseStore;

/// A running engine. Dropping it stops the engine (listener closed, connections closed, tasks aborted).
pub struct EngineHandle {
    pub addr: SocketAddr,
    pub control: Arc<Control>,
    engine: Arc<Engine>,
    tasks: Vec<JoinHandle<()>>,
    /// For `spawn_engine_blocking`: stops the runtime thread; `done` fires once it has exited.
    own_runtime: Option<(oneshot::Sender<()>, oneshot::Receiver<()>)>,
}

impl EngineHandle {
    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn config(&self) -> &SimConfig {
        &self.engine.cfg
    }

    /// Every request received so far, in order (up to `max_recorded_requests`, oldest dropped first).
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.engine
            .recorded
            .lock()
            .unwrap()
            .iter()
            .cloned()
            .collect()
    }

    /// Forgets the recorded requests.
    pub fn clear_requests(&self) {
        self.engine.recorded.lock().unwrap().clear();
    }

    /// Same numbers as `GET /sim/stats`.
    pub fn stats(&self) -> EngineTotals {
        self.engine.totals()
    }

    fn stop(&mut self) {
        self.control.net.stop();
        for t in &self.tasks {
            t.abort();
        }
        if let Some((stop, _)) = self.own_runtime.as_mut() {
            // Replace the sender so a second stop does nothing.
            let (dummy, _) = oneshot::channel();
            let _ = std::mem::replace(stop, dummy).send(());
        }
    }

    /// Stops the engine and waits until its tasks (and, for a blocking engine, its runtime thread) have ended.
    pub async fn shutdown(mut self) {
        self.stop();
        for t in std::mem::take(&mut self.tasks) {
            let _ = t.await;
        }
        if let Some((_, done)) = self.own_runtime.take() {
            let _ = done.await;
        }
    }

    /// `shutdown` for callers outside a runtime (for engines from `spawn_engine_blocking`).
    pub fn shutdown_blocking(mut self) {
        self.stop();
        self.tasks.clear();
        if let Some((_, done)) = self.own_runtime.take() {
            let _ = done.blocking_recv();
        }
    }
}

impl Drop for EngineHandle {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Starts an engine on `127.0.0.1:0` in the current tokio runtime.
pub async fn spawn_engine(cfg: SimConfig) -> io::Result<EngineHandle> {
    spawn_engine_on(SocketAddr::from(([127, 0, 0, 1], 0)), cfg).await
}

/// Starts an engine on `addr` in the current tokio runtime; it is accepting when this returns.
pub async fn spawn_engine_on(addr: SocketAddr, cfg: SimConfig) -> io::Result<EngineHandle> {
    let cfg = cfg.sanitized();
    let net = Net::bind(addr)?;
    let addr = net.addr;
    let control = Arc::new(Control::new(net, cfg.speed));
    let (sched_tx, sched_rx) = mpsc::unbounded_channel();
    let sched = Arc::new(SchedShared::default());
    let engine = Arc::new(Engine {
        cfg: cfg.clone(),
        control: control.clone(),
        sched_tx,
        sched: sched.clone(),
        recorded: Mutex::new(VecDeque::new()),
        http_requests: AtomicU64::new(0),
        received: AtomicU64::new(0),
        gen_requests: AtomicU64::new(0),
        rejected: AtomicU64::new(0),
        refused_injected: AtomicU64::new(0),
        refused_queue_full: AtomicU64::new(0),
        next_record: AtomicU64::new(1),
        next_id: AtomicU64::new(1),
        responses: Arc::new(ResponseStore::new(MAX_STORED_RESPONSES)),
        engine_id: format!("sim-{addr}-{:08x}", fastrand::u32(..)),
        addr,
        kv_issued: AtomicU64::new(0),
        kv_pulled: AtomicU64::new(0),
    });
    let kv = cfg.kv_events.clone().map(|endpoint| {
        let (tx, rx) = mpsc::unbounded_channel();
        (
            tx,
            tokio::spawn(kv_events::publish_loop(endpoint, "kv".to_string(), rx)),
        )
    });
    let (kv_tx, kv_task) = match kv {
        Some((tx, task)) => (Some(tx), Some(task)),
        None => (None, None),
    };
    let scheduler = tokio::spawn(scheduler::run(cfg, sched_rx, sched, kv_tx, control.clone()));
    let acceptor = tokio::spawn(server::accept_loop(engine.clone()));
    Ok(EngineHandle {
        addr,
        control,
        engine,
        tasks: [acceptor, scheduler].into_iter().chain(kv_task).collect(),
        own_runtime: None,
    })
}

/// Starts an engine on `127.0.0.1:0` with its own two-worker runtime on a background thread (for callers that
/// are not in a runtime). The runtime ends when the handle is dropped or shut down.
pub fn spawn_engine_blocking(cfg: SimConfig) -> io::Result<EngineHandle> {
    spawn_engine_blocking_on(SocketAddr::from(([127, 0, 0, 1], 0)), cfg)
}

/// [`spawn_engine_blocking`] on a given address.
pub fn spawn_engine_blocking_on(addr: SocketAddr, cfg: SimConfig) -> io::Result<EngineHandle> {
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let (stop_tx, stop_rx) = oneshot::channel::<()>();
    let (done_tx, done_rx) = oneshot::channel::<()>();
    std::thread::Builder::new()
        .name(format!("engine-sim-{addr}"))
        .spawn(move || {
            let rt = match tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .thread_name("engine-sim-worker")
                .enable_all()
                .build()
            {
                Ok(rt) => rt,
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                    return;
                }
            };
            let started = rt.block_on(spawn_engine_on(addr, cfg));
            let ok = started.is_ok();
            let _ = ready_tx.send(started);
            if ok {
                let _ = rt.block_on(stop_rx);
            }
            drop(rt);
            let _ = done_tx.send(());
        })?;
    let mut handle = ready_rx
        .recv()
        .map_err(|_| io::Error::other("engine-sim runtime thread died"))??;
    handle.own_runtime = Some((stop_tx, done_rx));
    Ok(handle)
}
