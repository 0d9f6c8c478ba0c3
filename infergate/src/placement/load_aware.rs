//! `load_aware`: lowest requests × 16384 + prefill tokens in flight, random ties; with `sessions`, the session
//! table decides whether a turn stays, spills or moves (see `sessions`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use super::policy::{
    Evictions, PlaceRequest, Placement, PlacementPolicy, SessionHooks, Snapshot, Ticket,
};
use super::sessions::{lineage_of, SessionRequest, SessionSlot, SESSION_REASONS};
use super::Reason;
use crate::config::{Policy, PoolConfig, SessionsConfig};

pub struct LoadAware {
    sessions: SessionSlot,
    /// f64 bits: a reload may change it (`reconfigure`).
    bytes_per_token: AtomicU64,
}

impl LoadAware {
    pub fn new(sessions: Option<&SessionsConfig>, bytes_per_token: f64) -> LoadAware {
        LoadAware {
            sessions: SessionSlot::new(sessions),
            bytes_per_token: AtomicU64::new(bytes_per_token.to_bits()),
        }
    }
}

impl PlacementPolicy for LoadAware {
    fn name(&self) -> &'static str {
        Policy::LoadAware.as_str()
    }

    fn reasons(&self) -> &'static [Reason] {
        if self.sessions.is_on() {
            &SESSION_REASONS
        } else {
            &[Reason::LoadAware]
        }
    }

    fn place(
        &self,
        req: &PlaceRequest,
        snap: &Snapshot,
        rng: &mut fastrand::Rng,
    ) -> Option<Placement> {
        let (table, key) = match (self.sessions.table(), req.session_key) {
            (Some(table), Some(key)) => (table, key),
            (Some(_), None) => {
                let index = super::load_aware(snap.cands, rng)?;
                return Some(Placement::whole(index, Reason::Headerless, req));
            }
            (None, _) => {
                let index = super::load_aware(snap.cands, rng)?;
                return Some(Placement::whole(index, Reason::LoadAware, req));
            }
        };
        let sreq = SessionRequest {
            key,
            lineage: lineage_of(req.prompt, req.conversation_at),
            body_bytes: req.body_bytes,
            bytes_per_token: req
                .bytes_per_token(f64::from_bits(self.bytes_per_token.load(Ordering::Relaxed))),
        };
        let p = table
            .lock()
            .place(&sreq, snap.cands, snap.ids, snap.now, rng)?;
        Some(Placement {
            index: p.index,
            reason: p.reason,
            estimate_bytes: p.estimate_bytes,
            estimate_tokens: req.exact_tokens(p.estimate_bytes),
            ticket: Ticket {
                session: Some(p.commit),
                ..Ticket::NONE
            },
        })
    }

    fn served(&self, _endpoint: u64, ticket: &Ticket, now: Instant) {
        if let Some(commit) = &ticket.session {
            self.sessions.commit(commit, now);
        }
    }

    fn endpoint_removed(&self, endpoint: u64) {
        self.sessions.endpoint_removed(endpoint);
    }

    fn reconfigure(&self, cfg: &PoolConfig, now: Instant) -> Result<Option<String>, &'static str> {
        let note = self.sessions.reconfigure(cfg.policy.sessions(), now)?;
        self.bytes_per_token
            .store(cfg.prefill.bytes_per_token.to_bits(), Ordering::Relaxed);
        Ok(note)
    }

    fn sessions(&self) -> Option<&dyn SessionHooks> {
        self.sessions.hooks()
    }

    fn expire(&self, now: Instant) -> Evictions {
        self.sessions.expire(now)
    }
}
