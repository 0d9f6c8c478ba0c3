//! What replicas write to Redis and read back: key names, the load record and the binding record. Pure: no I/O,
//! no clock (times are passed in as wall-clock milliseconds).

use std::collections::HashMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::placement::sessions::SavedSession;

/// The names of every key a cluster writes, under its `key_prefix`.
#[derive(Debug, Clone)]
pub struct Keys {
    prefix: String,
}

impl Keys {
    pub fn new(prefix: &str) -> Keys {
        Keys {
            prefix: prefix.to_string(),
        }
    }

    /// The sorted set of replica names (score: last publish, wall-clock ms), so readers know whose load to get.
    pub fn replicas(&self) -> String {
        format!("{}:replicas", self.prefix)
    }

    /// One replica's load record (expires a few publish intervals after its last publish).
    pub fn load(&self, replica: &str) -> String {
        format!("{}:load:{replica}", self.prefix)
    }

    /// One session's binding in one pool. Named by the session hash (`sessions::session_hash`, the one the access
    /// log and the state file use), never by the header value.
    pub fn session(&self, pool: &str, hash: u64) -> String {
        format!("{}:session:{pool}:{hash:016x}", self.prefix)
    }

    /// The engine holding one stored Responses API object (`stored_responses`); the id is a well-formed one.
    pub fn response(&self, id: &str) -> String {
        format!("{}:response:{id}", self.prefix)
    }
}

/// Requests and estimated prefill tokens in flight to one endpoint.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Figures {
    #[serde(rename = "r")]
    pub requests: u64,
    #[serde(rename = "p")]
    pub prefill_tokens: u64,
}

impl Figures {
    fn add(&mut self, other: Figures) {
        self.requests = self.requests.saturating_add(other.requests);
        self.prefill_tokens = self.prefill_tokens.saturating_add(other.prefill_tokens);
    }
}

/// One replica's live load, by endpoint URL (`http://host:port`, the endpoint's identity across replicas).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoadRecord {
    pub endpoints: HashMap<String, Figures>,
}

impl LoadRecord {
    /// Count `f` against `url` (an endpoint listed in two pools is one engine: its figures add up).
    pub fn add(&mut self, url: String, f: Figures) {
        self.endpoints.entry(url).or_default().add(f);
    }

    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }
}

impl LoadRecord {
    pub fn decode(bytes: &[u8]) -> Option<LoadRecord> {
        serde_json::from_slice(bytes).ok()
    }
}

/// The peers' load summed by endpoint URL, from the records a read returned (None: the key expired, so that peer
/// dropped out). Returns the sums and how many records were readable.
pub fn sum_peers<'a>(
    records: impl IntoIterator<Item = Option<&'a [u8]>>,
) -> (HashMap<String, Figures>, usize) {
    let mut sums: HashMap<String, Figures> = HashMap::new();
    let mut peers = 0;
    for bytes in records.into_iter().flatten() {
        let Some(rec) = LoadRecord::decode(bytes) else {
            continue;
        };
        peers += 1;
        for (url, f) in rec.endpoints {
            sums.entry(url).or_default().add(f);
        }
    }
    (sums, peers)
}

/// A session binding as stored: the bound endpoint's URL, when the session was last served (wall-clock ms) and
/// its lineages with sizes, most recent first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BindingRecord {
    pub endpoint: String,
    pub seen_ms: u64,
    pub lineages: Vec<(u64, u32)>,
}

impl BindingRecord {
    /// The record of a binding exported at `now_ms` whose endpoint is at `url`.
    pub fn of(saved: &SavedSession, url: String, now_ms: u64) -> BindingRecord {
        BindingRecord {
            endpoint: url,
            seen_ms: now_ms.saturating_sub(millis(saved.idle)),
            lineages: saved.lineages.clone(),
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    pub fn decode(bytes: &[u8]) -> Option<BindingRecord> {
        serde_json::from_slice(bytes).ok()
    }

    /// The binding to import at `now_ms` under table key `key`, bound to this process's endpoint id `endpoint`.
    /// A record from a clock ahead of ours counts as served now.
    pub fn saved(&self, key: u64, endpoint: u64, now_ms: u64) -> SavedSession {
        SavedSession {
            key,
            endpoint,
            idle: Duration::from_millis(now_ms.saturating_sub(self.seen_ms)),
            lineages: self.lineages.clone(),
        }
    }
}

/// A duration in whole milliseconds, saturating.
pub fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_carry_the_prefix_and_the_hash_never_the_header() {
        let k = Keys::new("prod");
        assert_eq!(k.replicas(), "prod:replicas");
        assert_eq!(k.load("host:8000"), "prod:load:host:8000");
        assert_eq!(
            k.session("chat", 0xab),
            "prod:session:chat:00000000000000ab"
        );
    }

    #[test]
    fn peers_add_up_by_endpoint_and_expired_or_garbled_records_drop_out() {
        let mut a = LoadRecord::default();
        a.add(
            "http://e1".into(),
            Figures {
                requests: 2,
                prefill_tokens: 100_000,
            },
        );
        a.add(
            "http://e1".into(),
            Figures {
                requests: 1,
                prefill_tokens: 5,
            },
        );
        let mut b = LoadRecord::default();
        b.add(
            "http://e1".into(),
            Figures {
                requests: 4,
                prefill_tokens: 0,
            },
        );
        b.add(
            "http://e2".into(),
            Figures {
                requests: 1,
                prefill_tokens: 7,
            },
        );
        let (ea, eb) = (a.encode(), b.encode());
        let (sums, peers) = sum_peers([Some(&ea[..]), None, Some(&b"{nope"[..]), Some(&eb[..])]);
        assert_eq!(peers, 2);
        assert_eq!(
            sums["http://e1"],
            Figures {
                requests: 7,
                prefill_tokens: 100_005
            }
        );
        assert_eq!(
            sums["http://e2"],
            Figures {
                requests: 1,
                prefill_tokens: 7
            }
        );
    }

    #[test]
    fn a_binding_round_trips_with_its_idle_time() {
        let saved = SavedSession {
            key: 9,
            endpoint: 3,
            idle: Duration::from_millis(1500),
            lineages: vec![(u64::MAX, 4000), (1, 20)],
        };
        let rec = BindingRecord::of(&saved, "http://127.0.0.1:8101".into(), 10_000);
        assert_eq!(rec.seen_ms, 8_500);
        let back = BindingRecord::decode(&rec.encode()).unwrap();
        assert_eq!(back, rec);
        let imported = back.saved(9, 77, 11_000);
        assert_eq!(imported.endpoint, 77);
        assert_eq!(imported.idle, Duration::from_millis(2500));
        assert_eq!(imported.lineages, saved.lineages);
        // A peer whose clock runs ahead: served "now", not in the future.
        assert_eq!(back.saved(9, 77, 1_000).idle, Duration::ZERO);
        assert_eq!(BindingRecord::decode(b"[]"), None);
    }
}
