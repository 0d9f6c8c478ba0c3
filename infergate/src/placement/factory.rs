//! The policy factory: the one place that names every policy, building a pool's policy from its config.

use super::least_request::LeastRequest;
use super::load_aware::LoadAware;
use super::policy::PlacementPolicy;
use super::predicted_ttft::PredictedTtft;
use super::prefix_aware::PrefixAware;
use super::round_robin::RoundRobin;
use crate::config::{PolicyConfig, PoolConfig};

/// Build a pool's policy from its config: one arm per policy.
pub fn build(cfg: &PoolConfig) -> Box<dyn PlacementPolicy> {
    let bytes_per_token = cfg.prefill.bytes_per_token;
    match &cfg.policy {
        PolicyConfig::RoundRobin => Box::new(RoundRobin::default()),
        PolicyConfig::LeastRequest => Box::new(LeastRequest),
        PolicyConfig::LoadAware { sessions } => {
            Box::new(LoadAware::new(sessions.as_ref(), bytes_per_token))
        }
        PolicyConfig::PrefixAware { prefix } => Box::new(PrefixAware::new(prefix, bytes_per_token)),
        PolicyConfig::PredictedTtft { sessions, prefix } => Box::new(PredictedTtft::new(
            sessions.as_ref(),
            prefix,
            bytes_per_token,
        )),
    }
}
