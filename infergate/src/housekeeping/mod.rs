//! The router's background services, one per concern (as pingora-load-balancing's `background.rs`): health
//! checks and discovery, engine-stats scrapes, KV-event subscribers, the span pipeline, the prefill janitor with
//! session expiry, and SIGHUP reloads.

mod health;
mod janitor;
mod kv_events;
mod reloads;
mod scrapes;
mod tracing;

use pingora_core::server::Server;
use pingora_core::services::background::background_service;
use pingora_core::services::ServiceHandle;

use crate::state::RouterState;

/// What a listening service waits for before it accepts.
pub struct Handles {
    /// The health checks, ready after their first round (the proxy waits for it: endpoints start unknown).
    pub health: ServiceHandle,
    /// The SIGHUP handler, ready once installed: until then a SIGHUP would terminate the process, so no port may
    /// answer before it (an operator or a script reloads as soon as the router answers).
    pub reloads: ServiceHandle,
}

/// Add the background services.
pub fn install(server: &mut Server, state: &RouterState) -> Handles {
    // SIGHUP first: its default action would terminate the process.
    let reloads = server.add_service(background_service(
        "infergate reloads",
        reloads::Reloads {
            state: state.clone(),
        },
    ));
    server.add_service(background_service(
        "infergate janitor",
        janitor::Janitor {
            state: state.clone(),
        },
    ));
    server.add_service(background_service(
        "infergate engine stats",
        scrapes::Scrapes {
            pools: state.pools.clone(),
        },
    ));
    // Before the proxy accepts (through the health checks): the first requests are traced too.
    let tracing = server.add_service(background_service(
        "infergate tracing",
        tracing::Tracing {
            state: state.clone(),
            flush: parking_lot::Mutex::new(Some(crate::lifecycle::ShutdownWork::expect())),
        },
    ));
    server.add_service(background_service(
        "infergate kv events",
        kv_events::KvEvents {
            pools: state.pools.clone(),
        },
    ));
    let health = server.add_service(background_service(
        "infergate health checks",
        health::HealthChecks {
            state: state.clone(),
        },
    ));
    health.add_dependency(&reloads);
    health.add_dependency(&tracing);
    Handles { health, reloads }
}
