//! What each engine really holds, from its KV-cache events (vLLM `--kv-events-config`): per endpoint, the set of
//! whole blocks its prefix cache has, and for a request's token ids how many leading tokens it already holds.
//!
//! Keys are the router's own: a chain of each block's token ids over its parent's key ([`block_keys`]), computed
//! from the events' token ids, never vLLM's block hashes (they depend on the engine's hash seed). A map from
//! vLLM's hash to our key lets `BlockRemoved`, which carries only vLLM's hashes, find the block.
//!
//! Trust: an index is used only while it is in step with its engine ([`KvIndex::held_tokens`] is None otherwise,
//! and placement falls back to its approximate prefix index; never "holds nothing"):
//! - no publisher connected (never yet, or it vanished): not trusted;
//! - joining a running publisher (a first message after seq 0) is not a gap: the index starts there and can only
//!   hold less than the engine (the replay socket is asked for the rest when configured);
//! - a sequence gap (lost messages): the replay socket is asked when configured;
//!   a gap it does not fill leaves the index untrusted for `stale_after`, then trusted again, the gap counted
//!   (what was missed is wrong both ways: blocks stored then are absent, blocks removed then linger until
//!   evicted; a full resync does not exist in vLLM's protocol beyond its replay buffer);
//! - silence: requests were sent to the endpoint but no message came for `stale_after` (an idle engine publishes
//!   nothing and stays trusted; a hung or cut-off publisher does not);
//! - a sequence number going backwards is a restarted engine: its cache is empty, so is the index.
//!
//! The subscriber loop is in `subscribe`, the decoder in `decode`, the scrape-time series in `metrics`.

pub mod decode;
mod metrics;
mod subscribe;

pub use metrics::{KvCollector, KvSource};
pub use subscribe::subscribe_loop;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use lru::LruCache;
use parking_lot::Mutex;

use crate::config::KvSubscription;

/// The key of a chain's first block's parent.
const ROOT: u64 = 0x6b76_5f72_6f6f_7421;

/// A 64-bit finaliser (splitmix64's): every input bit reaches every output bit.
pub(crate) fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The key of one block: its parent's key, its token ids and a salt (0 for plain text).
fn chain(parent: u64, tokens: &[u32], salt: u64) -> u64 {
    let mut h = mix(parent ^ salt.rotate_left(29));
    for &t in tokens {
        h = (h ^ u64::from(t)).wrapping_mul(0x0000_0100_0000_01b3);
        h ^= h >> 32;
    }
    mix(h ^ tokens.len() as u64)
}

/// The keys of the whole blocks of `token_ids` (a partial last block has none: vLLM stores only whole blocks).
pub fn block_keys(token_ids: &[u32], block_size: usize) -> Vec<u64> {
    if block_size == 0 {
        return Vec::new();
    }
    let mut parent = ROOT;
    token_ids
        .chunks_exact(block_size)
        .map(|b| {
            parent = chain(parent, b, 0);
            parent
        })
        .collect()
}

/// Event types of `infergate_kv_events_total`.
pub const EVENT_TYPES: [&str; 5] = [
    "BlockStored",
    "BlockRemoved",
    "AllBlocksCleared",
    "other",
    "invalid",
];

/// Counters read at scrape time (one endpoint's).
#[derive(Debug, Default)]
pub struct KvCounters {
    /// By [`EVENT_TYPES`]: "other" an unknown event type, "invalid" a message or event that did not decode.
    pub events: [AtomicU64; 5],
    pub gaps: AtomicU64,
    /// Blocks dropped to stay within `max_blocks_per_endpoint`.
    pub evicted: AtomicU64,
    /// Stored blocks whose parent the index does not have (stored before the subscription, or evicted here).
    pub orphans: AtomicU64,
    /// Tokens placement took as already held by the endpoint it chose.
    pub predicted_cached_tokens: AtomicU64,
}

impl KvCounters {
    fn count(&self, i: usize) {
        if let Some(c) = self.events.get(i) {
            c.fetch_add(1, Ordering::Relaxed);
        }
    }
}

struct Inner {
    sub: Option<KvSubscription>,
    /// vLLM hash → our key, the oldest stored first.
    by_hash: LruCache<u64, u64>,
    /// Our keys held, with how many vLLM blocks carry each.
    held: HashMap<u64, u32>,
    last_seq: Option<u64>,
    last_message: Option<Instant>,
    /// Publishers connected to our socket (ZMQ monitor events).
    peers: usize,
    /// The last gap nobody filled.
    gap_at: Option<Instant>,
    /// The first request sent to the endpoint since its last message.
    pending_since: Option<Instant>,
}

impl Inner {
    fn new(sub: Option<KvSubscription>) -> Inner {
        Inner {
            sub,
            // Unbounded and trimmed by hand: `LruCache::new` would allocate the whole bound up front.
            by_hash: LruCache::unbounded(),
            held: HashMap::new(),
            last_seq: None,
            last_message: None,
            peers: 0,
            gap_at: None,
            pending_since: None,
        }
    }

    fn clear(&mut self) {
        self.by_hash.clear();
        self.held.clear();
    }

    fn unhold(&mut self, key: u64) {
        if let Some(n) = self.held.get_mut(&key) {
            *n -= 1;
            if *n == 0 {
                self.held.remove(&key);
            }
        }
    }

    fn stale(&self, now: Instant) -> Option<&'static str> {
        let sub = self.sub.as_ref()?;
        let within = |t: Instant| now.saturating_duration_since(t) < sub.stale_after;
        if self.peers == 0 {
            return Some("no publisher connected");
        }
        if self.last_message.is_none() {
            return Some("no message yet");
        }
        if self.gap_at.is_some_and(within) {
            return Some("a sequence gap");
        }
        if self.pending_since.is_some_and(|t| !within(t)) {
            return Some("silent publisher");
        }
        None
    }
}

/// One endpoint's index and its state; written by its subscriber, read by placement.
pub struct KvIndex {
    pub pool: String,
    pub endpoint: String,
    inner: Mutex<Inner>,
    pub counters: KvCounters,
}

impl std::fmt::Debug for KvIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KvIndex")
            .field("pool", &self.pool)
            .field("endpoint", &self.endpoint)
            .finish()
    }
}

/// What applying one message did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    InOrder,
    /// The first message seen, after seq 0: the publisher was running before this subscriber.
    Joined {
        at: u64,
    },
    /// Batches `from..to` were missed (`to` is this message's).
    Gap {
        from: u64,
        to: u64,
    },
    /// The sequence went back: a restarted engine; the index was cleared.
    Restarted,
    /// Already seen (a replayed batch we had).
    Duplicate,
}

impl KvIndex {
    pub fn new(pool: &str, endpoint: &str) -> KvIndex {
        KvIndex {
            pool: pool.to_string(),
            endpoint: endpoint.to_string(),
            inner: Mutex::new(Inner::new(None)),
            counters: KvCounters::default(),
        }
    }

    /// Start (or restart, with other settings) following a publisher: the index starts empty and untrusted.
    /// None: no subscription (held tokens are None).
    pub fn configure(&self, sub: Option<KvSubscription>) {
        *self.inner.lock() = Inner::new(sub);
    }

    pub fn subscription(&self) -> Option<KvSubscription> {
        self.inner.lock().sub.clone()
    }

    pub fn is_enabled(&self) -> bool {
        self.inner.lock().sub.is_some()
    }

    /// The block size its keys are made of, if subscribed.
    pub fn block_size(&self) -> Option<usize> {
        self.inner.lock().sub.as_ref().map(|s| s.block_size)
    }

    /// Blocks held.
    pub fn blocks(&self) -> usize {
        self.inner.lock().by_hash.len()
    }

    /// Why the index is not trusted now, or None when it is (or when it is not configured: see `held_tokens`).
    pub fn stale_reason(&self, now: Instant) -> Option<&'static str> {
        self.inner.lock().stale(now)
    }

    /// Subscribed and trusted now.
    pub fn is_fresh(&self, now: Instant) -> bool {
        let i = self.inner.lock();
        i.sub.is_some() && i.stale(now).is_none()
    }

    /// Tokens of a request whose block keys are `keys` (of this index's block size) that the engine holds: its
    /// leading held blocks × the block size. None when not subscribed or not trusted now.
    pub fn held_tokens(&self, keys: &[u64], now: Instant) -> Option<u64> {
        let i = self.inner.lock();
        let bs = i.sub.as_ref()?.block_size as u64;
        if i.stale(now).is_some() {
            return None;
        }
        let n = keys.iter().take_while(|k| i.held.contains_key(k)).count() as u64;
        Some(n * bs)
    }

    /// A request was sent to this endpoint (its engine will publish what it stores): starts the silence clock.
    pub fn note_dispatch(&self, now: Instant) {
        let mut i = self.inner.lock();
        if i.sub.is_some() && i.pending_since.is_none() {
            i.pending_since = Some(now);
        }
    }

    pub(crate) fn peer_connected(&self) {
        self.inner.lock().peers += 1;
    }

    pub(crate) fn peer_gone(&self) {
        let mut i = self.inner.lock();
        i.peers = i.peers.saturating_sub(1);
    }

    /// Mark an unfilled gap now (counted by the caller).
    pub(crate) fn gap(&self, now: Instant) {
        self.inner.lock().gap_at = Some(now);
    }

    /// Take message `seq`'s place in the sequence: in order, a gap, a restart or a duplicate.
    pub(crate) fn sequence(&self, seq: u64, now: Instant) -> Applied {
        let mut i = self.inner.lock();
        i.last_message = Some(now);
        i.pending_since = None;
        let applied = match i.last_seq {
            None if seq == 0 => Applied::InOrder,
            // Subscribed to a publisher already running (the router started or reconnected after the engine):
            // what it stored before is unknown, which can only make the index hold less than the engine does,
            // never claim a block it lacks (a block removed before we joined was never in the index).
            None => Applied::Joined { at: seq },
            Some(last) if seq == last.wrapping_add(1) => Applied::InOrder,
            Some(last) if seq > last => Applied::Gap {
                from: last + 1,
                to: seq,
            },
            Some(last) if seq == last => Applied::Duplicate,
            Some(_) => {
                i.clear();
                i.gap_at = None;
                Applied::Restarted
            }
        };
        if applied != Applied::Duplicate {
            i.last_seq = Some(seq);
        }
        applied
    }

    /// Apply one decoded event.
    pub(crate) fn apply(&self, ev: &decode::Event) {
        let c = &self.counters;
        match ev {
            decode::Event::Stored(s) => {
                c.count(0);
                if s.tracked {
                    self.store(s);
                }
            }
            decode::Event::Removed { hashes, tracked } => {
                c.count(1);
                if *tracked {
                    let mut i = self.inner.lock();
                    for h in hashes {
                        if let Some(key) = i.by_hash.pop(h) {
                            i.unhold(key);
                        }
                    }
                }
            }
            decode::Event::Cleared => {
                c.count(2);
                self.inner.lock().clear();
            }
            decode::Event::Other => c.count(3),
        }
    }

    fn store(&self, s: &decode::Stored) {
        let mut i = self.inner.lock();
        let Some((bs, max)) = i.sub.as_ref().map(|s| (s.block_size, s.max_blocks.max(1))) else {
            return;
        };
        if s.block_size != bs {
            drop(i);
            self.counters.count(4);
            return;
        }
        let mut parent = match s.parent {
            None => ROOT,
            Some(h) => match i.by_hash.peek(&h) {
                Some(&k) => k,
                None => {
                    drop(i);
                    self.counters
                        .orphans
                        .fetch_add(s.hashes.len() as u64, Ordering::Relaxed);
                    return;
                }
            },
        };
        for ((h, tokens), salt) in s
            .hashes
            .iter()
            .zip(s.token_ids.chunks_exact(bs))
            .zip(s.salts.iter().chain(std::iter::repeat(&0)))
        {
            let key = chain(parent, tokens, *salt);
            parent = key;
            if let Some(old) = i.by_hash.peek(h).copied() {
                // Stored again (vLLM re-stores a block it had freed and reused): refresh, not count twice.
                i.unhold(old);
            }
            i.by_hash.push(*h, key);
            *i.held.entry(key).or_insert(0) += 1;
            while i.by_hash.len() > max {
                if let Some((_, evicted)) = i.by_hash.pop_lru() {
                    i.unhold(evicted);
                    self.counters.evicted.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }

    /// Count an invalid message or event.
    pub(crate) fn invalid(&self) {
        self.counters.count(4);
    }
}

#[cfg(test)]
mod tests;
