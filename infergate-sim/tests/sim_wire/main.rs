//! Wire-level tests of the simulated vLLM engine (`infergate-sim`) over real loopback sockets, one module per API.

mod answers;
mod chat;
mod common;
mod control;
mod http;
mod limits;
mod metrics;
mod responses;
mod scheduler;
mod tokenize;
