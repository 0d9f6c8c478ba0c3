//! Shared harness for the integration tests: real routers and simulated engines on ephemeral loopback ports.
//!
//! Split by what each part starts or talks to: `router` (an in-process router and its configuration),
//! `engines` (simulated engines and what they received), `metrics` (the router's `/metrics`), `requests`
//! (a client's requests to the router), `bursts` (a burst of new sessions after load placed around the router).
#![allow(dead_code, unused_imports)]

pub mod bursts;
pub mod certs;
pub mod engines;
pub mod metrics;
pub mod otlp;
pub mod requests;
pub mod router;
pub mod tools;

pub use bursts::*;
pub use certs::*;
pub use engines::*;
pub use metrics::*;
pub use otlp::*;
pub use requests::*;
pub use router::*;
pub use tools::*;
