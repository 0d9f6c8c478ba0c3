//! What keeps unknown response ids from turning into a flood of engine probes: ids that no engine had, remembered
//! for a while, and a budget of probe rounds per second for the whole router.
//!
//! Without them every `GET /v1/responses/<id>` for an id no one holds asks every engine of every pool again: a
//! client polling a lost id, or anyone sending made-up ids, multiplies its requests by the fleet's size.

use std::num::NonZeroUsize;
use std::time::{Duration, Instant};

use lru::LruCache;
use parking_lot::Mutex;

/// How long an id that no engine had is answered 404 without asking again. A response made meanwhile through
/// this router or another replica is found at once (its holder is recorded or shared, which the remembered miss
/// does not shadow); one made straight at an engine waits this long to be found.
pub const UNKNOWN_TTL: Duration = Duration::from_secs(30);

/// Unknown ids remembered at most (LRU beyond it): ~100 bytes each.
pub const MAX_UNKNOWN: usize = 10_000;

/// Probe rounds (one unknown id asked of the engines) per second, and the burst allowed above that rate.
pub const PROBES_PER_SECOND: f64 = 10.0;
pub const PROBE_BURST: f64 = 20.0;

/// Ids no engine had lately, and the probe budget.
pub struct Unknown {
    ids: Mutex<LruCache<Box<str>, Instant>>,
    bucket: Mutex<Bucket>,
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Option<Instant>,
}

impl Default for Unknown {
    fn default() -> Self {
        Unknown {
            ids: Mutex::new(LruCache::new(
                NonZeroUsize::new(MAX_UNKNOWN).unwrap_or(NonZeroUsize::MIN),
            )),
            bucket: Mutex::new(Bucket {
                tokens: PROBE_BURST,
                at: None,
            }),
        }
    }
}

impl Unknown {
    /// No engine had `id` when asked less than [`UNKNOWN_TTL`] ago.
    pub fn is_remembered(&self, id: &str, now: Instant) -> bool {
        let mut ids = self.ids.lock();
        match ids.get(id) {
            Some(&at) if now.saturating_duration_since(at) < UNKNOWN_TTL => true,
            Some(_) => {
                ids.pop(id);
                false
            }
            None => false,
        }
    }

    /// No engine had `id`.
    pub fn remember(&self, id: &str, now: Instant) {
        self.ids.lock().put(id.into(), now);
    }

    /// `id` has a holder now.
    pub fn forget(&self, id: &str) {
        self.ids.lock().pop(id);
    }

    /// Take one probe round from the budget; false when it is spent.
    pub fn may_probe(&self, now: Instant) -> bool {
        let mut b = self.bucket.lock();
        if let Some(at) = b.at {
            let refill = now.saturating_duration_since(at).as_secs_f64() * PROBES_PER_SECOND;
            b.tokens = (b.tokens + refill).min(PROBE_BURST);
        }
        b.at = Some(now);
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

/// Whether `id` is shaped like a response id an engine makes (`resp_` and more: vLLM's and SGLang's are `resp_` and
/// 32 hex digits, OpenAI's `resp_` and 48): only those are worth asking the engines about.
pub fn is_probed_shape(id: &str) -> bool {
    id.strip_prefix("resp_").is_some_and(|rest| rest.len() >= 8)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_miss_is_remembered_for_its_ttl_and_forgotten_on_a_holder() {
        let u = Unknown::default();
        let t0 = Instant::now();
        assert!(!u.is_remembered("resp_0123456789", t0));
        u.remember("resp_0123456789", t0);
        assert!(u.is_remembered("resp_0123456789", t0 + UNKNOWN_TTL / 2));
        assert!(!u.is_remembered("resp_0123456789", t0 + UNKNOWN_TTL));
        u.remember("resp_0123456789", t0);
        u.forget("resp_0123456789");
        assert!(!u.is_remembered("resp_0123456789", t0));
    }

    #[test]
    fn probes_are_budgeted_per_second() {
        let u = Unknown::default();
        let t0 = Instant::now();
        let burst = (0..100).filter(|_| u.may_probe(t0)).count();
        assert_eq!(burst, PROBE_BURST as usize);
        // A second later, a second's worth more.
        let t1 = t0 + Duration::from_secs(1);
        let more = (0..100).filter(|_| u.may_probe(t1)).count();
        assert_eq!(more, PROBES_PER_SECOND as usize);
    }

    #[test]
    fn only_response_shaped_ids_are_probed() {
        assert!(is_probed_shape("resp_67ccd2bed1ec8190b14f964abc054267"));
        for not in [
            "resp_",
            "resp_1",
            "foo",
            "msg_0123456789",
            "chatcmpl-0123456789",
        ] {
            assert!(!is_probed_shape(not), "{not}");
        }
    }
}
