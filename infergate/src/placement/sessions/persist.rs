//! A session table's bindings leaving and entering the process: [`SessionTable::export`] for the state file and
//! [`SessionTable::import`] at start (and when a graceful upgrade's old instance writes its last bindings); one
//! binding at a time for the replicas' shared store (`crate::cluster`): [`SessionTable::saved`] and
//! [`SessionTable::import_one`].
//!
//! Saved bindings carry no `Instant` (only how long each has been idle) and name their endpoint by the in-process
//! id of *this* process; the state file (`crate::state_file`) turns ids into endpoint URLs and back.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use super::{Binding, SessionTable, MAX_LINEAGES};

/// Saved times are wall-clock milliseconds turned back into `Instant`s: a saved binding replaces the table's own
/// only when it was served more recently by more than this (the same binding read twice is not "newer").
const SAME_TIME: Duration = Duration::from_secs(1);

/// One binding as saved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SavedSession {
    /// The session's table key ([`super::session_hash`] of its header value).
    pub key: u64,
    /// Endpoint id in the process that exports or imports.
    pub endpoint: u64,
    /// Time since the session was last served.
    pub idle: Duration,
    /// Prompt lineages and the body size of each one's last turn served by the bound endpoint, most recent first
    /// (at most [`MAX_LINEAGES`]).
    pub lineages: Vec<(u64, u32)>,
}

/// What [`SessionTable::import`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ImportOutcome {
    /// Bindings taken into the table.
    pub adopted: usize,
    /// Idle longer than the table's TTL.
    pub expired: usize,
    /// The table already had a binding for the key served at least as recently.
    pub older: usize,
    /// Left out because the table was full of more recent bindings.
    pub over_capacity: usize,
    /// Left out because the pool's policy keeps no sessions (any more).
    pub no_sessions: usize,
}

impl ImportOutcome {
    /// `saved` bindings offered to a pool whose policy keeps no sessions: none taken.
    pub fn no_sessions(saved: usize) -> ImportOutcome {
        ImportOutcome {
            no_sessions: saved,
            ..ImportOutcome::default()
        }
    }
}

fn saved(key: u64, b: &Binding, now: Instant) -> SavedSession {
    let n = usize::from(b.len);
    SavedSession {
        key,
        endpoint: b.endpoint,
        idle: now.saturating_duration_since(b.last_seen),
        lineages: b.lineages[..n]
            .iter()
            .copied()
            .zip(b.sizes[..n].iter().copied())
            .collect(),
    }
}

impl SessionTable {
    /// The live bindings, least recently served first.
    pub fn export(&self, now: Instant) -> Vec<SavedSession> {
        self.map
            .iter()
            .rev()
            .filter(|(_, b)| !b.expired(now, self.ttl))
            .map(|(&key, b)| saved(key, b, now))
            .collect()
    }

    /// The live binding of table key `key`, as saved.
    pub fn saved(&self, key: u64, now: Instant) -> Option<SavedSession> {
        let b = self.map.peek(&key)?;
        (!b.expired(now, self.ttl)).then(|| saved(key, b, now))
    }

    /// Whether the session with this header value has a live binding (nothing is changed).
    pub fn contains_live(&self, header: &[u8], now: Instant) -> bool {
        self.map
            .peek(&super::session_key(header))
            .is_some_and(|b| !b.expired(now, self.ttl))
    }

    /// Adopt one binding (read from the replicas' store before a session request is placed) unless it is idle
    /// past the TTL or the table's own binding for the key was served at least as recently: within [`SAME_TIME`]
    /// when both name the same endpoint (only the sizes could differ), strictly otherwise, so that a move another
    /// replica made even a moment after this one's last turn is followed. Returns whether it was adopted. The
    /// binding goes to the most recently used end although it may have been idle a while: the request about to be
    /// placed commits it again at once (and an expired binding is dropped when looked up whatever its position).
    pub fn import_one(&mut self, s: SavedSession, now: Instant) -> bool {
        if s.idle > self.ttl {
            return false;
        }
        let last_seen = now.checked_sub(s.idle).unwrap_or(now);
        if self.map.peek(&s.key).is_some_and(|b| {
            let tie = if b.endpoint == s.endpoint {
                SAME_TIME
            } else {
                Duration::ZERO
            };
            b.last_seen + tie >= last_seen && !b.expired(now, self.ttl)
        }) {
            return false;
        }
        let mut b = Binding::new(s.endpoint, last_seen);
        for &(lineage, size) in s.lineages.iter().take(MAX_LINEAGES).rev() {
            b.record(lineage, u64::from(size));
        }
        if self.map.len() == self.map.cap().get() && !self.map.contains(&s.key) {
            self.expire(now);
        }
        if self.map.push(s.key, b).is_some_and(|(k, _)| k != s.key) {
            self.capacity_evictions += 1;
        }
        true
    }

    /// Adopt saved bindings. For a key the table already binds, the more recently served binding wins (the
    /// table's own within [`SAME_TIME`]); bindings idle past the TTL are dropped; when everything does not fit, the most
    /// recently served bindings are kept (an own binding left out counts as a capacity eviction, a saved one as
    /// `over_capacity`). The table is rebuilt in last-served order, so its LRU end stays the longest idle (what
    /// [`Self::expire`] relies on).
    pub fn import(&mut self, saved: Vec<SavedSession>, now: Instant) -> ImportOutcome {
        let mut out = ImportOutcome::default();
        // key -> (binding, adopted now)
        let mut entries: HashMap<u64, (Binding, bool)> =
            HashMap::with_capacity(self.map.len() + saved.len());
        while let Some((key, b)) = self.map.pop_lru() {
            entries.insert(key, (b, false));
        }
        for s in saved {
            if s.idle > self.ttl {
                out.expired += 1;
                continue;
            }
            // Right after a reboot the monotonic clock may not reach back that far: count the session as
            // seen now (it then lives up to one idle period longer than the TTL says).
            let last_seen = now.checked_sub(s.idle).unwrap_or(now);
            if entries
                .get(&s.key)
                .is_some_and(|(b, _)| b.last_seen + SAME_TIME >= last_seen)
            {
                out.older += 1;
                continue;
            }
            let mut b = Binding::new(s.endpoint, last_seen);
            // `record` puts the newest first: replay the lineages oldest first.
            for &(lineage, size) in s.lineages.iter().take(MAX_LINEAGES).rev() {
                b.record(lineage, u64::from(size));
            }
            entries.insert(s.key, (b, true));
        }
        let mut entries: Vec<(u64, Binding, bool)> =
            entries.into_iter().map(|(k, (b, a))| (k, b, a)).collect();
        // Ties (equal times) broken by key, so the order does not depend on the hash map's.
        entries.sort_unstable_by_key(|(k, b, _)| (b.last_seen, *k));
        let excess = entries.len().saturating_sub(self.map.cap().get());
        for (i, (key, b, adopted)) in entries.into_iter().enumerate() {
            match (i < excess, adopted) {
                (true, true) => out.over_capacity += 1,
                // An own binding older than what was adopted: an ordinary capacity eviction.
                (true, false) => self.capacity_evictions += 1,
                (false, adopted) => {
                    out.adopted += usize::from(adopted);
                    self.map.push(key, b);
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::super::{CommitKind, SessionCommit};
    use super::*;

    const TTL: Duration = Duration::from_secs(3600);

    fn commit(
        t: &mut SessionTable,
        key: u64,
        endpoint: u64,
        lineage: u64,
        bytes: u64,
        now: Instant,
    ) {
        t.commit(
            &SessionCommit {
                key,
                lineage,
                endpoint,
                body_bytes: bytes,
                kind: CommitKind::Bind,
            },
            now,
        );
    }

    #[test]
    fn export_then_import_restores_bindings_sizes_and_order() {
        let t0 = Instant::now();
        let mut a = SessionTable::new(10, TTL);
        commit(&mut a, 1, 7, 0xA, 1000, t0);
        commit(&mut a, 2, 8, 0xA, 2000, t0 + Duration::from_secs(1));
        commit(&mut a, 1, 7, 0xB, 3000, t0 + Duration::from_secs(2));
        let now = t0 + Duration::from_secs(5);
        let saved = a.export(now);
        assert_eq!(
            saved,
            vec![
                SavedSession {
                    key: 2,
                    endpoint: 8,
                    idle: Duration::from_secs(4),
                    lineages: vec![(0xA, 2000)]
                },
                SavedSession {
                    key: 1,
                    endpoint: 7,
                    idle: Duration::from_secs(3),
                    lineages: vec![(0xB, 3000), (0xA, 1000)]
                },
            ]
        );
        let mut b = SessionTable::new(10, TTL);
        let out = b.import(saved.clone(), now);
        assert_eq!(out.adopted, 2);
        assert_eq!(b.export(now), saved);
        assert_eq!(b.map.peek(&1).and_then(|x| x.size_of(0xA)), Some(1000));
        assert_eq!(b.take_evictions(), (0, 0), "adopting is no eviction");
    }

    #[test]
    fn the_newer_binding_wins_expired_ones_drop_and_capacity_keeps_the_newest() {
        let now = Instant::now() + Duration::from_secs(10_000);
        let mut t = SessionTable::new(3, TTL);
        commit(&mut t, 1, 9, 0xA, 10, now);
        let saved = |key, idle_s| SavedSession {
            key,
            endpoint: 5,
            idle: Duration::from_secs(idle_s),
            lineages: vec![(0xC, 20)],
        };
        let out = t.import(
            vec![
                saved(1, 1),
                saved(2, TTL.as_secs() + 1),
                saved(6, 0),
                saved(3, 30),
                saved(4, 20),
                saved(5, 10),
            ],
            now,
        );
        assert_eq!(
            out,
            ImportOutcome {
                adopted: 2,
                expired: 1,
                older: 1,
                over_capacity: 2,
                no_sessions: 0,
            }
        );
        assert_eq!(
            t.map.peek(&1).map(|b| b.endpoint),
            Some(9),
            "own, more recent binding kept"
        );
        let keys: Vec<u64> = t.export(now).iter().map(|s| s.key).collect();
        assert_eq!(
            keys,
            [5, 1, 6],
            "least recently served first; the oldest imports left out"
        );
        // A saved binding served more recently than the table's replaces it.
        let later = now + Duration::from_secs(5);
        let out = t.import(
            vec![SavedSession {
                key: 1,
                endpoint: 4,
                idle: Duration::from_secs(1),
                lineages: vec![],
            }],
            later,
        );
        assert_eq!(
            (out.adopted, t.map.peek(&1).map(|b| b.endpoint)),
            (1, Some(4))
        );
        assert_eq!(t.len(), 3);
        // The LRU end is the longest idle: expiry still stops at the first live binding.
        assert_eq!(t.expire(now + TTL - Duration::from_secs(5)), 1);
    }

    #[test]
    fn one_binding_leaves_and_enters_with_its_sizes_and_a_fresher_own_binding_wins() {
        let t0 = Instant::now();
        let mut a = SessionTable::new(10, TTL);
        commit(&mut a, 1, 7, 0xA, 1000, t0);
        commit(&mut a, 1, 7, 0xB, 3000, t0 + Duration::from_secs(2));
        let now = t0 + Duration::from_secs(3);
        let s = a.saved(1, now).unwrap();
        assert_eq!(s.lineages, vec![(0xB, 3000), (0xA, 1000)]);
        assert_eq!(s.idle, Duration::from_secs(1));
        assert_eq!(a.saved(2, now), None);

        let mut b = SessionTable::new(1, TTL);
        assert!(b.import_one(s.clone(), now));
        assert_eq!(b.saved(1, now), Some(s.clone()));
        assert!(
            !b.import_one(s.clone(), now),
            "the same binding again is not newer"
        );
        let half_a_second = Duration::from_millis(500);
        let resized = SavedSession {
            idle: s.idle - half_a_second,
            lineages: vec![(0xB, 3500)],
            ..s.clone()
        };
        assert!(
            !b.import_one(resized, now),
            "same endpoint, within a second: the table's own sizes stay"
        );
        let moved = SavedSession {
            endpoint: 8,
            idle: s.idle - half_a_second,
            ..s.clone()
        };
        assert!(
            b.import_one(moved, now),
            "another endpoint, served later: the move is followed"
        );
        assert_eq!(b.saved(1, now).map(|x| x.endpoint), Some(8));
        let moved_back_earlier = SavedSession {
            idle: s.idle,
            ..s.clone()
        };
        assert!(
            !b.import_one(moved_back_earlier, now),
            "another endpoint, served earlier: the table's own stays"
        );
        let stale = SavedSession {
            idle: TTL + Duration::from_secs(1),
            ..s.clone()
        };
        assert!(!b.import_one(stale, now), "idle past the TTL");
        // Full table: the new binding takes the place of the old one (a capacity eviction).
        let other = SavedSession { key: 2, ..s };
        assert!(b.import_one(other, now));
        assert_eq!((b.len(), b.take_evictions()), (1, (0, 1)));
    }

    #[test]
    fn an_idle_time_beyond_the_monotonic_clock_counts_as_now() {
        let now = Instant::now();
        let mut t = SessionTable::new(3, Duration::MAX);
        let out = t.import(
            vec![SavedSession {
                key: 1,
                endpoint: 1,
                idle: Duration::MAX,
                lineages: vec![],
            }],
            now,
        );
        assert_eq!(out.adopted, 1);
        assert_eq!(t.export(now)[0].idle, Duration::ZERO);
    }
}
