//! infergate: a Pingora reverse proxy that places each LLM request on the engine pod best able to serve it now.

pub mod access_log;
pub mod admission;
pub mod cli;
pub mod clients;
pub mod cluster;
pub mod config;
pub mod cors;
pub mod engine_stats;
pub mod errors;
pub mod exposure;
#[cfg(test)]
mod floors;
pub mod fnv;
pub mod forwarded;
pub mod housekeeping;
pub mod kv_events;
pub mod ledger;
pub mod lifecycle;
pub mod listen;
pub mod logging;
pub mod metrics;
pub mod outlier;
pub mod paths;
pub mod placement;
pub mod pool;
pub mod proxy;
pub mod reload;
pub mod request;
pub mod request_id;
pub mod server;
pub mod state;
pub mod state_file;
pub mod status;
pub mod stored_responses;
pub mod tls;
pub mod tokens;
