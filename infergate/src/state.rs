//! The router's shared state: the handles every part holds (pools, ledger, metrics, admission, cluster) and the
//! configuration in effect.

use std::sync::Arc;

use crate::admission::Admission;
use crate::config::Config;
use crate::ledger::Ledger;
use crate::live::Live;
use crate::metrics::Metrics;
use crate::pool::Pools;
use crate::tokens::Tokenizing;

/// Handles to a built router's shared state (tests and the binary read metrics and pools through it).
#[derive(Clone)]
pub struct RouterState {
    /// The configuration the router was built with: listeners, server settings and everything else a reload cannot
    /// change are read here.
    pub cfg: Arc<Config>,
    /// The configuration in effect: `cfg` plus what reloads applied (`reload`). Settings read per request come
    /// from here (`current`).
    live: Arc<Live<Config>>,
    pub pools: Arc<Pools>,
    pub ledger: Arc<Ledger>,
    pub metrics: Arc<Metrics>,
    /// Client keys, their limits and the pools' wait queues.
    pub admission: Arc<Admission>,
    /// The replicas' shared store (`cluster`); None = this router places on its own.
    pub cluster: Option<Arc<crate::cluster::Cluster>>,
    /// Exact prompt token counts for pools with a `tokenizer`, off the proxy's threads.
    pub tokens: Arc<Tokenizing>,
    /// Request spans exported over OTLP (`tracing`): off until housekeeping builds the pipeline after start.
    pub tracing: Arc<crate::traces::Tracing>,
    /// The certificate the `listen` addresses serve (`tls`), swapped by a reload; None = plain HTTP.
    pub server_cert: Option<Arc<crate::tls::ServerCert>>,
    /// Set once every listening address accepts connections (`lifecycle::order_startup`).
    pub serving: crate::lifecycle::Serving,
}

impl RouterState {
    pub fn new(cfg: Config) -> RouterState {
        let metrics = Metrics::new();
        let pools = Pools::new(&cfg, metrics.clone());
        let tokens = Arc::new(Tokenizing::new(None));
        for c in tokens.collectors() {
            metrics.register(c);
        }
        for p in cfg.pools.iter().filter(|p| p.tokenizer.is_some()) {
            tokens.add_pool(&p.name);
        }
        RouterState {
            server_cert: cfg
                .tls
                .as_ref()
                .map(|t| crate::tls::ServerCert::new(&t.loaded)),
            tokens,
            serving: Default::default(),
            tracing: crate::traces::Tracing::new(&metrics),
            cluster: crate::cluster::Cluster::new(cfg.cluster.as_ref(), &pools, &metrics),
            pools,
            admission: Admission::new(&cfg, &metrics),
            live: Arc::new(Live::new(cfg.clone())),
            cfg: Arc::new(cfg),
            ledger: Ledger::new(),
            metrics,
        }
    }

    /// The configuration in effect (cheap: no lock, no clone of the configuration); read it per request, a reload
    /// may swap it.
    pub fn current(&self) -> Arc<Config> {
        self.live.load()
    }

    /// Make `cfg` the configuration in effect (`reload` made it: new values where they apply, running ones where
    /// they do not).
    pub(crate) fn set_current(&self, cfg: Config) {
        self.live.store(cfg);
    }
}

impl RouterState {
    /// What the state file saves and restores.
    pub fn sessions(&self) -> crate::state_file::Sessions {
        crate::state_file::Sessions {
            pools: self.pools.clone(),
            cfg: self.cfg.clone(),
        }
    }
}
