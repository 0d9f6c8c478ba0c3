//! The integration tests of the router, one module per area, in one test binary (one link of the crate instead
//! of one per file). `common` is the shared harness: routers and simulated engines on loopback ports.

mod common;

mod access_log;
mod auth;
mod black_holes;
mod bodies;
mod cli;
mod clients;
mod cluster;
mod cluster_tls;
mod config_cli;
mod config_fixtures;
mod cors;
mod deploy;
mod disagg;
mod exposure;
mod fault_soak;
mod faults;
mod forwarded;
mod framing;
mod kv_events;
mod lifecycle;
mod listen;
mod log_flood;
mod metrics_auth;
mod observe;
mod predicted;
mod prefix;
mod proxy;
mod queue;
mod real_vllm;
mod reload;
mod route_receipt;
mod secrets_in_logs;
mod session_memory;
mod session_state;
mod session_upgrade;
mod sessions;
mod slow_clients;
mod soak;
mod stored_responses;
mod tls;
mod tls_engines;
mod tokens;
mod traces;
