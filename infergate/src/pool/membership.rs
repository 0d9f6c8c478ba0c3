//! A pool's membership as pingora-load-balancing discovers it.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use async_trait::async_trait;
use parking_lot::RwLock;
use pingora_load_balancing::discovery::ServiceDiscovery;
use pingora_load_balancing::Backend;

use super::Endpoint;

/// The pool's membership as pingora-load-balancing discovers it; `Pool::set_endpoints` replaces it (reload).
#[derive(Default)]
pub(super) struct Membership {
    pub(super) backends: RwLock<BTreeSet<Backend>>,
    /// Backend equality ignores `ext`, so the health check finds the current endpoint by address instead.
    pub(super) by_addr: RwLock<HashMap<std::net::SocketAddr, Arc<Endpoint>>>,
}

impl Membership {
    pub(super) fn endpoint(&self, target: &Backend) -> Option<Arc<Endpoint>> {
        let addr = target.addr.as_inet()?;
        self.by_addr.read().get(addr).cloned()
    }
}

#[async_trait]
impl ServiceDiscovery for Membership {
    async fn discover(&self) -> pingora_error::Result<(BTreeSet<Backend>, HashMap<u64, bool>)> {
        let set = self.backends.read().clone();
        Ok((set, HashMap::new()))
    }
}

/// Forwards discovery to the shared membership so the pool can swap members.
pub(super) struct SharedMembership(pub(super) Arc<Membership>);

#[async_trait]
impl ServiceDiscovery for SharedMembership {
    async fn discover(&self) -> pingora_error::Result<(BTreeSet<Backend>, HashMap<u64, bool>)> {
        self.0.discover().await
    }
}
