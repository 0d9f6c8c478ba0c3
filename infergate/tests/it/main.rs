//! The integration tests of the router, one module per area, in one test binary (one link of the crate instead
//! of one per file). `common` is the shared harness: routers and simulated engines on loopback ports.

mod common;

mod access_log;
mod auth;
mod black_holes;
mod bodies;
mod budget;
mod cli;
mod clients;
mod cluster;
mod config_cli;
mod config_fixtures;
mod cors;
mod deploy;
mod exposure;
mod faults;
mod forwarded;
mod kv_events;
mod lifecycle;
mod listen;
mod observe;
mod predicted;
mod prefix;
mod proxy;
mod queue;
mod real_vllm;
mod reload;
mod secrets_in_logs;
mod session_memory;
mod session_state;
mod session_upgrade;
mod sessions;
mod slow_clients;
mod soak;
mod speed;
mod stored_responses;
mod tokens;
