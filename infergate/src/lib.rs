//! infergate: a Pingora reverse proxy that places each LLM request on the engine pod best able to serve it now.

pub mod admission;
pub mod clients;
pub mod config;
pub mod engine_stats;
pub mod exposure;
pub mod forwarded;
pub mod ledger;
pub mod listen;
pub mod logging;
pub mod metrics;
pub mod outlier;
pub mod placement;
pub mod pool;
pub mod proxy;
pub mod request;
pub mod server;
pub mod status;
