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

    /// One replica's reservations: the requests it dispatched since its last load record, a hash of
    /// [`reservation_field`] → [`pack`]ed figures (expires a few publish intervals after its last dispatch).
    pub fn reserved(&self, replica: &str) -> String {
        format!("{}:reserved:{replica}", self.prefix)
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
    /// The publish this record was taken at: it holds every request dispatched under an earlier epoch, none of
    /// those dispatched under this one or later (those are in the replica's reservations). 0 from a replica that
    /// makes no reservations.
    #[serde(rename = "e", default)]
    pub epoch: u64,
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

/// The hash field of a reservation: the epoch it was made under, and the endpoint URL.
pub fn reservation_field(epoch: u64, url: &str) -> String {
    format!("{epoch}|{url}")
}

/// Requests go above this bit of a packed reservation, prefill tokens below it (2^40 tokens: no overflow).
const PACK_SHIFT: u32 = 40;

/// One dispatch of `tokens` prefill tokens as one integer, so a reservation is one atomic `HINCRBY`.
pub fn pack(tokens: u64) -> i64 {
    let tokens = tokens.min((1 << PACK_SHIFT) - 1);
    i64::try_from((1u64 << PACK_SHIFT) | tokens).unwrap_or(i64::MAX)
}

/// A packed sum of dispatches back as figures (a negative or garbled value is none).
pub fn unpack(v: i64) -> Figures {
    let v = u64::try_from(v).unwrap_or(0);
    Figures {
        requests: v >> PACK_SHIFT,
        prefill_tokens: v & ((1 << PACK_SHIFT) - 1),
    }
}

/// One replica's reservations as read: (epoch, endpoint URL, figures) per field; fields that do not parse are left
/// out.
pub fn parse_reservations(fields: HashMap<String, i64>) -> Vec<(u64, String, Figures)> {
    fields
        .into_iter()
        .filter_map(|(field, v)| {
            let (epoch, url) = field.split_once('|')?;
            Some((epoch.parse().ok()?, url.to_string(), unpack(v)))
        })
        .collect()
}

/// What this replica knows of one peer: its last load record and its reservations as last read.
#[derive(Debug, Clone, Default)]
pub struct PeerState {
    pub record: LoadRecord,
    pub reserved: Vec<(u64, String, Figures)>,
}

/// The peers' load summed by endpoint URL: each one's record plus the reservations its record does not hold yet
/// (made under the record's epoch or later). A dispatch is in exactly one of the two, whenever either was read.
pub fn sum_peers<'a>(peers: impl IntoIterator<Item = &'a PeerState>) -> HashMap<String, Figures> {
    let mut sums: HashMap<String, Figures> = HashMap::new();
    for p in peers {
        for (url, f) in &p.record.endpoints {
            sums.entry(url.clone()).or_default().add(*f);
        }
        for (epoch, url, f) in &p.reserved {
            if *epoch >= p.record.epoch {
                sums.entry(url.clone()).or_default().add(*f);
            }
        }
    }
    sums
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
    fn peers_add_up_by_endpoint() {
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
        assert_eq!(LoadRecord::decode(b"{nope"), None);
        let peers: Vec<PeerState> = [ea, eb]
            .iter()
            .map(|r| PeerState {
                record: LoadRecord::decode(r).unwrap(),
                reserved: Vec::new(),
            })
            .collect();
        let sums = sum_peers(&peers);
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
    fn a_dispatch_counts_in_the_record_or_in_the_reservations_never_both() {
        let url = "http://e1".to_string();
        let one = |tokens| unpack(pack(tokens));
        assert_eq!(
            one(100_000),
            Figures {
                requests: 1,
                prefill_tokens: 100_000
            }
        );
        assert_eq!(
            unpack(pack(7) + pack(5)),
            Figures {
                requests: 2,
                prefill_tokens: 12
            }
        );
        assert_eq!(unpack(-3), Figures::default());
        let field = reservation_field(41, &url);
        let parsed = parse_reservations(HashMap::from([
            (field, pack(10) + pack(20)),
            (reservation_field(42, &url), pack(5)),
            ("garbage".to_string(), 1),
            ("x|http://e1".to_string(), 1),
        ]));
        assert_eq!(parsed.len(), 2);
        // Dispatched under epoch 41 (two) and 42 (one); the record of epoch 42 holds the first two.
        let mut peer = PeerState {
            record: LoadRecord {
                epoch: 41,
                endpoints: HashMap::from([(url.clone(), Figures::default())]),
            },
            reserved: parsed,
        };
        let before = sum_peers([&peer])[&url];
        assert_eq!(
            before,
            Figures {
                requests: 3,
                prefill_tokens: 35
            }
        );
        peer.record = LoadRecord {
            epoch: 42,
            endpoints: HashMap::from([(
                url.clone(),
                Figures {
                    requests: 2,
                    prefill_tokens: 30,
                },
            )]),
        };
        assert_eq!(sum_peers([&peer])[&url], before, "counted once either way");
        // A record without an epoch (an older replica) and no reservations.
        let old = LoadRecord::decode(br#"{"endpoints":{"http://e1":{"r":1,"p":2}}}"#).unwrap();
        assert_eq!(old.epoch, 0);
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
