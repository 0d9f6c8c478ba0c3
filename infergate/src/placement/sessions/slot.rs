//! A policy's optional session table (`sessions` in its config) and the lifecycle hooks every session-keeping
//! policy answers the same way: expiry, count, saving and adopting bindings, sharing them, resizing on reload.

use std::time::Instant;

use parking_lot::Mutex;

use super::{ImportOutcome, SavedSession, SessionCommit, SessionTable};
use crate::config::SessionsConfig;
use crate::placement::policy::Evictions;

/// None when the pool's policy runs without `sessions`.
pub struct SessionSlot(Option<Mutex<SessionTable>>);

impl SessionSlot {
    pub fn new(cfg: Option<&SessionsConfig>) -> SessionSlot {
        SessionSlot(cfg.map(|s| Mutex::new(SessionTable::new(s.max_sessions, s.ttl))))
    }

    pub fn table(&self) -> Option<&Mutex<SessionTable>> {
        self.0.as_ref()
    }

    pub fn is_on(&self) -> bool {
        self.0.is_some()
    }

    /// Commit a served turn's binding.
    pub fn commit(&self, commit: &SessionCommit, now: Instant) {
        if let Some(t) = &self.0 {
            t.lock().commit(commit, now);
        }
    }

    /// Drop bindings idle past the ttl; the evictions (ttl, capacity) since the last call.
    pub fn expire(&self, now: Instant) -> Evictions {
        let Some(table) = &self.0 else {
            return (0, 0);
        };
        let mut table = table.lock();
        table.expire(now);
        table.take_evictions()
    }

    pub fn count(&self) -> Option<usize> {
        self.0.as_ref().map(|t| t.lock().len())
    }

    pub fn export(&self, now: Instant) -> Option<Vec<SavedSession>> {
        self.0.as_ref().map(|t| t.lock().export(now))
    }

    pub fn import(&self, saved: Vec<SavedSession>, now: Instant) -> ImportOutcome {
        match &self.0 {
            Some(t) => t.lock().import(saved, now),
            None => ImportOutcome {
                no_sessions: saved.len(),
                ..ImportOutcome::default()
            },
        }
    }

    pub fn has(&self, key: &[u8], now: Instant) -> Option<bool> {
        self.0.as_ref().map(|t| t.lock().contains_live(key, now))
    }

    pub fn import_one(&self, saved: SavedSession, now: Instant) -> bool {
        self.0
            .as_ref()
            .is_some_and(|t| t.lock().import_one(saved, now))
    }

    /// The binding `commit`'s turn left in the table, to share with other replicas.
    pub fn saved(&self, commit: &SessionCommit, now: Instant) -> Option<SavedSession> {
        self.0.as_ref()?.lock().saved(commit.key(), now)
    }

    /// A reload's new `sessions` settings: ttl and size change in place (what no longer fits is dropped and
    /// counted); turning sessions on or off cannot. Ok carries a note for the reload's log line.
    pub fn reconfigure(
        &self,
        new: Option<&SessionsConfig>,
        now: Instant,
    ) -> Result<Option<String>, &'static str> {
        if new.is_some() != self.0.is_some() {
            return Err(
                "turning sessions on or off changes the placement reasons and the session table",
            );
        }
        let (Some(table), Some(s)) = (&self.0, new) else {
            return Ok(None);
        };
        let (expired, evicted) = table.lock().reconfigure(s.max_sessions, s.ttl, now);
        Ok((expired + evicted > 0).then(|| {
            format!("{expired} session binding(s) past the new ttl dropped, {evicted} beyond the new max_sessions evicted")
        }))
    }
}
