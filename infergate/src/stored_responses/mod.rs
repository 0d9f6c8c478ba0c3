//! Which engine holds each stored Responses API object: vLLM keeps a stored response (`store`, on with
//! `VLLM_ENABLE_RESPONSES_API_STORE=1`) in the memory of the one engine that made it, so a turn continuing it
//! (`previous_response_id`), its retrieval (`GET /v1/responses/{id}`) and its cancel must go to that engine.
//!
//! The ids are learned from the responses that create them (the first `"id"` of the answer, streamed or not) and
//! kept in a bounded map, oldest forgotten first. An id the map does not have (made before a restart, through
//! another router or straight at an engine, or forgotten) is looked for by asking the engines themselves
//! (`probe`): the one that has it answers its `GET /v1/responses/{id}` with 200.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use prometheus::{IntCounterVec, Opts};

use crate::engine_stats::SideClient;
use crate::metrics::Metrics;
use crate::paths::is_valid_response_id;

mod unknown;
pub use unknown::{is_probed_shape, Unknown};

/// Response ids remembered; past this the oldest is forgotten (its follow-ups are placed as any request, and
/// the engine answers them 404 if it is not the holder). ~100 bytes each.
pub const CAPACITY: usize = 100_000;

/// Bytes of an answer's start searched for its id: the response object opens with it (vLLM's field order), in
/// the first event of a stream.
const ID_SCAN_BYTES: usize = 8 * 1024;

/// The engine holding a stored response: its pool and endpoint (`host:port`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    pub pool: Arc<str>,
    pub endpoint: String,
}

/// Sources of `infergate_stored_response_lookups_total`: this router's record, the cluster's store, the engine that
/// answered it has the response, none (`unknown`); and the ids no engine was asked about: not shaped like a
/// response id (`not_an_id`), no engine had it lately (`remembered_unknown`), the probe budget was spent
/// (`throttled`).
pub const LOOKUP_SOURCES: [&str; 7] = [
    "local",
    "cluster",
    "engine",
    "unknown",
    "not_an_id",
    "remembered_unknown",
    "throttled",
];

/// Response id -> the engine holding it.
pub struct StoredResponses {
    inner: Mutex<Inner>,
    lookups: IntCounterVec,
    /// Ids no engine had lately, and the budget of engine probes.
    pub unknown: Unknown,
}

#[derive(Default)]
struct Inner {
    holders: HashMap<Box<str>, Holder>,
    /// Insertion order, for forgetting the oldest.
    order: VecDeque<Box<str>>,
}

impl StoredResponses {
    pub fn new(metrics: &Metrics) -> StoredResponses {
        let lookups = metrics.add(IntCounterVec::new(
            Opts::new(
                "infergate_stored_response_lookups_total",
                "Requests naming a stored Responses API object (previous_response_id, retrieve, cancel) by where \
                 the engine holding it was found: local (this router saw it made), cluster (another replica \
                 did), engine (the engines were asked), unknown (none has it); or why the engines were not \
                 asked: not_an_id, remembered_unknown (none had it lately), throttled (the probe budget was \
                 spent).",
            ),
            &["source"],
        ));
        for s in LOOKUP_SOURCES {
            lookups.with_label_values(&[s]);
        }
        StoredResponses {
            inner: Mutex::default(),
            lookups,
            unknown: Unknown::default(),
        }
    }

    /// Count one lookup of a stored response's engine by where it was found (one of `LOOKUP_SOURCES`).
    pub fn count_lookup(&self, source: &str) {
        self.lookups.with_label_values(&[source]).inc();
    }

    pub fn record(&self, id: &str, holder: Holder) {
        self.unknown.forget(id);
        let mut g = self.inner.lock();
        if g.holders.insert(id.into(), holder).is_some() {
            return;
        }
        g.order.push_back(id.into());
        while g.order.len() > CAPACITY {
            if let Some(old) = g.order.pop_front() {
                g.holders.remove(&old);
            }
        }
    }

    pub fn lookup(&self, id: &str) -> Option<Holder> {
        self.inner.lock().holders.get(id).cloned()
    }

    pub fn len(&self) -> usize {
        self.inner.lock().holders.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Most engines asked at once for one unknown id.
pub const MAX_PROBES: usize = 64;

/// How long the engines asked for an unknown id may take to answer.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// An engine that may hold a stored response, and how to ask it.
pub struct Candidate {
    pub holder: Holder,
    /// The endpoint's own client: plain, or TLS checked as proxied requests are.
    pub client: SideClient,
    /// Sent as `Authorization: Bearer` (the engine's key); never logged.
    pub api_key: Option<String>,
}

/// Ask `candidates` (at most [`MAX_PROBES`]) at once whether they hold stored response `id` (`GET
/// /v1/responses/{id}` answered 200), waiting at most `timeout`; the first that does. `id` must be a valid one.
pub async fn probe(id: &str, candidates: Vec<Candidate>, timeout: Duration) -> Option<Holder> {
    let path: Arc<str> = format!("/v1/responses/{id}").into();
    let mut asked = tokio::task::JoinSet::new();
    for c in candidates.into_iter().take(MAX_PROBES) {
        let path = path.clone();
        asked.spawn(async move {
            let (key, json) = (c.api_key.as_deref(), "application/json");
            let has = match c.client.status(&path, json, key, timeout).await {
                Ok(status) => status == 200,
                Err(e) => {
                    // An engine that cannot be asked (down, a refused certificate) is one that does not have it.
                    log::debug!(
                        "pool {} endpoint {}: stored response lookup failed: {e}",
                        c.holder.pool,
                        c.holder.endpoint
                    );
                    false
                }
            };
            has.then_some(c.holder)
        });
    }
    // Dropping the set when one answers aborts the other questions.
    while let Some(answer) = asked.join_next().await {
        if let Ok(Some(holder)) = answer {
            return Some(holder);
        }
    }
    None
}

/// Finds the response id at the start of an answer fed chunk by chunk.
#[derive(Debug, Default)]
pub struct IdCapture {
    head: Vec<u8>,
    done: bool,
}

impl IdCapture {
    /// Feed the next chunk; the id once it is seen (then nothing more is kept or searched).
    pub fn feed(&mut self, chunk: &[u8]) -> Option<String> {
        if self.done {
            return None;
        }
        let room = ID_SCAN_BYTES.saturating_sub(self.head.len());
        self.head.extend_from_slice(&chunk[..chunk.len().min(room)]);
        match response_id(&self.head) {
            Some(id) => {
                self.done = true;
                let id = id.to_string();
                self.head = Vec::new();
                Some(id)
            }
            None => {
                if self.head.len() >= ID_SCAN_BYTES {
                    self.done = true;
                    self.head = Vec::new();
                }
                None
            }
        }
    }
}

/// The first `"id": "resp..."` in `head` (a JSON response object, or SSE events carrying one).
pub fn response_id(head: &[u8]) -> Option<&str> {
    let mut from = 0;
    while let Some(k) = memchr::memmem::find(&head[from..], b"\"id\"") {
        let mut i = from + k + 4;
        from = i;
        let skip_ws = |i: &mut usize| {
            while matches!(head.get(*i), Some(b' ' | b'\t' | b'\r' | b'\n')) {
                *i += 1;
            }
        };
        skip_ws(&mut i);
        if head.get(i) != Some(&b':') {
            continue;
        }
        i += 1;
        skip_ws(&mut i);
        if head.get(i) != Some(&b'"') {
            continue;
        }
        let start = i + 1;
        let end = start + memchr::memchr(b'"', head.get(start..)?)?;
        let id = std::str::from_utf8(&head[start..end]).ok()?;
        if id.starts_with("resp") && is_valid_response_id(id) {
            return Some(id);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn holder(ep: &str) -> Holder {
        Holder {
            pool: "default".into(),
            endpoint: ep.into(),
        }
    }

    #[test]
    fn finds_the_id_of_a_response_object_and_of_a_stream_over_every_split() {
        let body =
            br#"{"id":"resp_0a1b","object":"response","output":[{"id":"msg_1","type":"message"}]}"#;
        assert_eq!(response_id(body), Some("resp_0a1b"));
        let spaced = br#"{"object": "response", "id" : "resp_x-1.2", "model": "m"}"#;
        assert_eq!(response_id(spaced), Some("resp_x-1.2"));
        let stream = b"event: response.created\ndata: {\"response\":{\"id\":\"resp_9\",\"status\":\"in_progress\"},\"sequence_number\":0,\"type\":\"response.created\"}\n\n";
        for cut in 0..stream.len() {
            let mut c = IdCapture::default();
            let first = c.feed(&stream[..cut]);
            let second = c.feed(&stream[cut..]);
            assert_eq!(first.or(second).as_deref(), Some("resp_9"), "cut at {cut}");
        }
    }

    #[test]
    fn ignores_ids_that_are_not_a_responses_and_gives_up_after_the_head() {
        // A message id first, a key merely containing "id", a non-string id: none is a response id.
        assert_eq!(
            response_id(br#"{"item_id":"resp_no","id":"msg_1","x":{"id":7}}"#),
            None
        );
        assert_eq!(response_id(br#"{"id":"resp_<script>"}"#), None);
        let mut c = IdCapture::default();
        assert_eq!(c.feed(&vec![b' '; ID_SCAN_BYTES]), None);
        assert_eq!(c.feed(br#"{"id":"resp_late"}"#), None, "past the head");
    }

    #[test]
    fn remembers_holders_and_forgets_the_oldest_past_capacity() {
        let m = StoredResponses::new(&Metrics::new());
        m.record("resp_a", holder("127.0.0.1:1"));
        m.record("resp_a", holder("127.0.0.1:1"));
        assert_eq!(m.len(), 1);
        for i in 0..CAPACITY {
            m.record(&format!("resp_{i}"), holder("127.0.0.1:2"));
        }
        assert_eq!(m.len(), CAPACITY);
        assert_eq!(m.lookup("resp_a"), None, "the oldest went first");
        assert_eq!(m.lookup("resp_7"), Some(holder("127.0.0.1:2")));
    }

    #[test]
    fn valid_ids() {
        assert!(is_valid_response_id(
            "resp_67ccd2bed1ec8190b14f964abc0542670bb6a6b452d3795b"
        ));
        for bad in ["", "resp/1", "resp 1", "resp'1", &"r".repeat(129)] {
            assert!(!is_valid_response_id(bad), "{bad:?}");
        }
    }
}
