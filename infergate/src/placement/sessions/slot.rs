//! A policy's optional session table (`sessions` in its config) and the lifecycle hooks every session-keeping
//! policy answers the same way: expiry, count, saving and adopting bindings, sharing them, resizing on reload.

use std::time::Instant;

use parking_lot::Mutex;

use super::{ImportOutcome, SavedSession, SessionCommit, SessionTable};
use crate::config::SessionsConfig;
use crate::placement::policy::{Evictions, SessionHooks, Ticket};

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

    /// A reload removed `endpoint`: its bindings go (the sessions gauge counts live bindings only).
    pub fn endpoint_removed(&self, endpoint: u64) {
        if let Some(t) = &self.0 {
            t.lock().remove_endpoint(endpoint);
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

    /// The session hooks, when the table is on.
    pub fn hooks(&self) -> Option<&dyn SessionHooks> {
        self.0.as_ref().map(|t| t as &dyn SessionHooks)
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

/// Every session-keeping policy answers the session hooks from its table.
impl SessionHooks for Mutex<SessionTable> {
    fn session_count(&self) -> usize {
        self.lock().len()
    }

    fn export_sessions(&self, now: Instant) -> Vec<SavedSession> {
        self.lock().export(now)
    }

    fn has_session(&self, key: &[u8], now: Instant) -> bool {
        self.lock().contains_live(key, now)
    }

    fn import_binding(&self, saved: SavedSession, now: Instant) -> bool {
        self.lock().import_one(saved, now)
    }

    fn served_binding(&self, ticket: &Ticket, now: Instant) -> Option<SavedSession> {
        self.lock().saved(ticket.session.as_ref()?.key(), now)
    }

    fn import_sessions(&self, saved: Vec<SavedSession>, now: Instant) -> ImportOutcome {
        self.lock().import(saved, now)
    }
}
