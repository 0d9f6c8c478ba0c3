//! The placement policy seam: one trait every policy implements, the per-request ticket it hands back, and the
//! factory that builds a pool's policy from its config.
//!
//! A policy owns its state (session table, prefix index, arrival window) and says which lifecycle hooks it needs;
//! the hooks default to doing nothing. `place` stays pure: it sees a snapshot, the time and a random source, and
//! does no I/O, so every rule is a unit test.

use std::time::Instant;

use super::sessions::{ImportOutcome, SavedSession, SessionCommit};
use super::{Candidate, Reason};
use crate::config::{PolicyConfig, PoolConfig};

/// What placement needs to know of one generate request.
#[derive(Debug, Clone, Copy, Default)]
pub struct PlaceRequest<'a> {
    /// The session header's value, when the pool has sessions and the request carries one.
    pub session_key: Option<&'a [u8]>,
    /// The body's `model` ("" when absent).
    pub model: &'a str,
    /// Prompt text in order (see `request::BodyScan::prompt`).
    pub prompt: &'a [u8],
    /// The whole body's size in bytes.
    pub body_bytes: u64,
}

/// The live view of a pool: `cands[i]` describes endpoint `ids[i]`.
#[derive(Debug, Clone, Copy)]
pub struct Snapshot<'a> {
    pub cands: &'a [Candidate],
    pub ids: &'a [u64],
    pub now: Instant,
}

/// Policy state carried by one request from `place` to the lifecycle hooks.
#[derive(Debug, Clone, Default)]
pub enum Ticket {
    #[default]
    None,
    /// What a sessions pool commits once the turn was served.
    Session(SessionCommit),
    /// The prompt's block hashes, inserted into the prefix index once served.
    Prefix(Vec<u64>),
    /// `predicted_ttft`: session commit, block hashes and the prediction.
    Predicted(Box<super::predicted_ttft::PredictedTicket>),
}

impl Ticket {
    /// The predicted seconds to first token and the prefill tokens that were ahead of the request, for a
    /// placement that predicted them.
    pub fn prediction(&self) -> Option<(Option<f64>, u64)> {
        match self {
            Ticket::Predicted(t) => Some((t.predicted_ttft, t.tokens_ahead)),
            _ => None,
        }
    }
}

/// A placement decision.
#[derive(Debug, Clone)]
pub struct Placement {
    /// Index into the snapshot.
    pub index: usize,
    pub reason: Reason,
    /// Bytes the prefill estimate is computed from: the whole body or, for a sticky session turn, its growth.
    pub estimate_bytes: u64,
    pub ticket: Ticket,
}

impl Placement {
    pub fn whole(index: usize, reason: Reason, req: &PlaceRequest) -> Placement {
        Placement {
            index,
            reason,
            estimate_bytes: req.body_bytes,
            ticket: Ticket::None,
        }
    }
}

/// Bindings a policy dropped since it was last asked: (idle past the TTL, over capacity).
pub type Evictions = (u64, u64);

/// One placement policy of one pool.
pub trait PlacementPolicy: Send + Sync {
    /// Choose an endpoint for a generate request; None when no candidate is eligible.
    fn place(
        &self,
        req: &PlaceRequest,
        snap: &Snapshot,
        rng: &mut fastrand::Rng,
    ) -> Option<Placement>;

    /// Whether requests placed by this policy hold prefill tokens on the ledger.
    fn counts_tokens(&self) -> bool {
        true
    }

    /// The request was sent to `endpoint`.
    fn dispatched(&self, _endpoint: u64, _ticket: &Ticket, _now: Instant) {}

    /// `endpoint` answered the request with a success status: what the policy learns, it learns here only.
    fn served(&self, _endpoint: u64, _ticket: &Ticket, _now: Instant) {}

    /// `endpoint` left the pool (or failed in a way that makes its cached state worthless).
    fn endpoint_removed(&self, _endpoint: u64) {}

    /// Housekeeping: drop state idle past its lifetime; returns the evictions since the last call.
    fn expire(&self, _now: Instant) -> Evictions {
        (0, 0)
    }

    /// Session bindings held, for policies that keep sessions.
    fn session_count(&self) -> Option<usize> {
        None
    }

    /// The live session bindings, least recently served first, for the next instance (`state_file`); None for
    /// policies that keep no sessions.
    fn export_sessions(&self, _now: Instant) -> Option<Vec<SavedSession>> {
        None
    }

    /// Adopt bindings a previous instance saved (endpoint ids already mapped to this process's).
    fn import_sessions(&self, saved: Vec<SavedSession>, _now: Instant) -> ImportOutcome {
        ImportOutcome {
            no_sessions: saved.len(),
            ..ImportOutcome::default()
        }
    }
}

/// The reasons a pool's policy can give for a generate request (the `reason` series of
/// `infergate_placements_total` created at start).
pub fn reasons(policy: &PolicyConfig) -> &'static [Reason] {
    match policy {
        PolicyConfig::RoundRobin => &[Reason::RoundRobin],
        PolicyConfig::LeastRequest => &[Reason::LeastRequest],
        PolicyConfig::LoadAware { sessions: None } => &[Reason::LoadAware],
        PolicyConfig::LoadAware { sessions: Some(_) } => &[
            Reason::NewSession,
            Reason::Sticky,
            Reason::Migrate,
            Reason::Spill,
            Reason::Fallback,
            Reason::Headerless,
        ],
        PolicyConfig::PrefixAware { .. } => {
            &[Reason::PrefixHit, Reason::PrefixMiss, Reason::PrefixGated]
        }
        PolicyConfig::PredictedTtft { sessions: None, .. } => {
            &[Reason::Predicted, Reason::LoadAware]
        }
        PolicyConfig::PredictedTtft {
            sessions: Some(_), ..
        } => &[
            Reason::NewSession,
            Reason::Sticky,
            Reason::Migrate,
            Reason::Spill,
            Reason::Fallback,
            Reason::Headerless,
        ],
    }
}

/// Build a pool's policy from its config: the one place that maps config to policy types.
pub fn build(cfg: &PoolConfig) -> Box<dyn PlacementPolicy> {
    match &cfg.policy {
        PolicyConfig::RoundRobin => Box::new(super::round_robin::RoundRobin::default()),
        PolicyConfig::LeastRequest => Box::new(super::least_request::LeastRequest),
        PolicyConfig::LoadAware { sessions } => Box::new(super::load_aware::LoadAware::new(
            sessions.as_ref(),
            cfg.prefill.bytes_per_token,
        )),
        PolicyConfig::PrefixAware { prefix } => Box::new(super::prefix_aware::PrefixAware::new(
            prefix,
            cfg.prefill.bytes_per_token,
        )),
        PolicyConfig::PredictedTtft { sessions, prefix } => {
            Box::new(super::predicted_ttft::PredictedTtft::new(
                sessions.as_ref(),
                prefix,
                cfg.prefill.bytes_per_token,
            ))
        }
    }
}
