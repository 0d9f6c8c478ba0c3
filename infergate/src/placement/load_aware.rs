//! `load_aware`: lowest requests × 16384 + prefill tokens in flight, random ties; with `sessions`, the session
//! table decides whether a turn stays, spills or moves (see `sessions`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use parking_lot::Mutex;

use super::policy::{Evictions, PlaceRequest, Placement, PlacementPolicy, Snapshot, Ticket};
use super::sessions::{lineage_of, ImportOutcome, SavedSession, SessionRequest, SessionTable};
use super::Reason;
use crate::config::{PoolConfig, SessionsConfig};

pub struct LoadAware {
    sessions: Option<Mutex<SessionTable>>,
    /// f64 bits: a reload may change it (`reconfigure`).
    bytes_per_token: AtomicU64,
}

impl LoadAware {
    pub fn new(sessions: Option<&SessionsConfig>, bytes_per_token: f64) -> LoadAware {
        LoadAware {
            sessions: sessions.map(|s| Mutex::new(SessionTable::new(s.max_sessions, s.ttl))),
            bytes_per_token: AtomicU64::new(bytes_per_token.to_bits()),
        }
    }
}

impl PlacementPolicy for LoadAware {
    fn place(
        &self,
        req: &PlaceRequest,
        snap: &Snapshot,
        rng: &mut fastrand::Rng,
    ) -> Option<Placement> {
        let (table, key) = match (&self.sessions, req.session_key) {
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
            lineage: lineage_of(req.prompt),
            body_bytes: req.body_bytes,
            bytes_per_token: f64::from_bits(self.bytes_per_token.load(Ordering::Relaxed)),
        };
        let p = table
            .lock()
            .place(&sreq, snap.cands, snap.ids, snap.now, rng)?;
        Some(Placement {
            index: p.index,
            reason: p.reason,
            estimate_bytes: p.estimate_bytes,
            ticket: Ticket::Session(p.commit),
        })
    }

    fn served(&self, _endpoint: u64, ticket: &Ticket, now: Instant) {
        if let (Some(table), Ticket::Session(commit)) = (&self.sessions, ticket) {
            table.lock().commit(commit, now);
        }
    }

    fn reconfigure(&self, cfg: &PoolConfig, now: Instant) -> Result<Option<String>, &'static str> {
        let new = cfg.policy.sessions();
        if new.is_some() != self.sessions.is_some() {
            return Err(
                "turning sessions on or off changes the placement reasons and the session table",
            );
        }
        self.bytes_per_token
            .store(cfg.prefill.bytes_per_token.to_bits(), Ordering::Relaxed);
        let (Some(table), Some(s)) = (&self.sessions, new) else {
            return Ok(None);
        };
        let (expired, evicted) = table.lock().reconfigure(s.max_sessions, s.ttl, now);
        Ok((expired + evicted > 0).then(|| {
            format!("{expired} session binding(s) past the new ttl dropped, {evicted} beyond the new max_sessions evicted")
        }))
    }

    fn expire(&self, now: Instant) -> Evictions {
        let Some(table) = &self.sessions else {
            return (0, 0);
        };
        let mut table = table.lock();
        table.expire(now);
        table.take_evictions()
    }

    fn session_count(&self) -> Option<usize> {
        self.sessions.as_ref().map(|t| t.lock().len())
    }

    fn export_sessions(&self, now: Instant) -> Option<Vec<SavedSession>> {
        self.sessions.as_ref().map(|t| t.lock().export(now))
    }

    fn has_session(&self, key: &[u8], now: Instant) -> Option<bool> {
        self.sessions
            .as_ref()
            .map(|t| t.lock().contains_live(key, now))
    }

    fn import_binding(&self, saved: SavedSession, now: Instant) -> bool {
        self.sessions
            .as_ref()
            .is_some_and(|t| t.lock().import_one(saved, now))
    }

    fn served_binding(&self, ticket: &Ticket, now: Instant) -> Option<SavedSession> {
        match (&self.sessions, ticket) {
            (Some(table), Ticket::Session(commit)) => table.lock().saved(commit.key(), now),
            _ => None,
        }
    }

    fn import_sessions(&self, saved: Vec<SavedSession>, now: Instant) -> ImportOutcome {
        match &self.sessions {
            Some(t) => t.lock().import(saved, now),
            None => ImportOutcome {
                no_sessions: saved.len(),
                ..ImportOutcome::default()
            },
        }
    }
}
