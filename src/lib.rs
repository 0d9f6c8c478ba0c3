//! infergate: a Pingora reverse proxy that places each LLM request on the engine pod best able to serve it now.

pub mod config;
pub mod sim;
