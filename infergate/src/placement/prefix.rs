//! The approximate prefix index: chain-hashed prompt blocks per endpoint with bounded LRU memory, and the
//! `prefix_aware` placement rule built on it.
//!
//! Pure: no I/O and no clock (time and randomness are passed in).
//!
//! How a request is placed (see [`PrefixIndex::place`]):
//! 1. The prompt is cut into `block_bytes` blocks; each full block gets a chain hash (so a block hash stands for
//!    the whole prefix up to and including it), seeded by the model name.
//! 2. For each eligible endpoint, the index counts how many leading blocks it holds (stopping at the first gap).
//! 3. If the longest match is at least `min_match_bytes` (and at least one block), the candidate is the endpoint
//!    with the longest match (ties: lower `request_load()`, then random). A per-request gate compares that
//!    candidate's load with the pool mean; a hot candidate is skipped in favour of the fallback (`PrefixGated`),
//!    and the proxy then inserts the prompt on the new endpoint too, so hot prefixes replicate.
//! 4. Otherwise the fallback places it (`PrefixMiss`): least in flight within +1 of the minimum, at random
//!    (default), or production-stack's legacy QPS rule (for comparison only).
//!
//! The index is only a hint and never latches a session: every request, every turn, goes through the gate on
//! live load. This is the lesson of production-stack #1073, where a sub-threshold decision made on a stale QPS
//! number was written into the trie and pinned each session to the busiest backend for its whole life.

use std::time::Instant;

use lru::LruCache;

use super::{least_inflight, pick_min, Candidate, Decision, Reason};
use crate::config::{PrefixConfig, PrefixFallback};

/// Gate, relative part: the prefix candidate is "hot" when its load exceeds the eligible pool's mean load times
/// this factor...
pub const GATE_REL: f64 = 1.5;
/// ...and also exceeds the mean plus this many requests. Both must hold (SGLang's cache_aware gate shape,
/// `load > mean·rel AND load > mean+abs`; its CLI default rel is 1.5). The absolute term keeps tiny pools at low
/// load from flapping (1 vs 0 requests is not an imbalance worth a cache miss); the relative term keeps large
/// loads from spilling on noise. With 2 endpoints at loads a > b, the gate trips when a - b > 4 and a > 3b.
pub const GATE_ABS: f64 = 2.0;

/// At most this many leading blocks of a prompt are hashed, matched and inserted: it bounds the work done under
/// the index lock per request (256 KiB of prompt at the default 64-byte blocks). Beyond it the match length
/// saturates, which only matters for two different prompts sharing more than this much prefix.
pub const MAX_BLOCKS_PER_REQUEST: usize = 4096;

use crate::fnv::{fnv1a, OFFSET as FNV_OFFSET};

/// MurmurHash3's 64-bit finaliser: spreads FNV's weak high bits so the hashes are well mixed.
fn fmix64(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^= h >> 33;
    h
}

/// The approximate prefix index of one pool.
pub struct PrefixIndex {
    cfg: PrefixConfig,
    /// Blocks each endpoint may hold (capacity_tokens_per_endpoint × bytes_per_token / block_bytes, ≥ 1).
    capacity_blocks: usize,
    /// Prompt bytes per token, to read a candidate's exact held tokens as blocks of this index.
    bytes_per_token: f64,
    /// Endpoint id → the block hashes it is believed to cache, least recently used first out.
    /// Unbounded LRUs trimmed by hand: `LruCache::new` would preallocate the full capacity per endpoint.
    endpoints: std::collections::HashMap<u64, LruCache<u64, ()>>,
}

impl std::fmt::Debug for PrefixIndex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PrefixIndex")
            .field("cfg", &self.cfg)
            .field("capacity_blocks", &self.capacity_blocks)
            .field("endpoints", &self.endpoints.len())
            .finish()
    }
}

impl PrefixIndex {
    pub fn new(cfg: &PrefixConfig, bytes_per_token: f64) -> Self {
        let bpt = if bytes_per_token.is_finite() && bytes_per_token > 0.0 {
            bytes_per_token
        } else {
            4.0
        };
        let block = cfg.block_bytes.max(1) as f64;
        let blocks = (cfg.capacity_tokens_per_endpoint as f64 * bpt / block).floor();
        // `as` saturates for huge values; at least one block.
        let capacity_blocks = (blocks as usize).max(1);
        PrefixIndex {
            cfg: cfg.clone(),
            capacity_blocks,
            bytes_per_token: bpt,
            endpoints: std::collections::HashMap::new(),
        }
    }

    pub fn config(&self) -> &PrefixConfig {
        &self.cfg
    }

    /// How many blocks one endpoint may hold.
    pub fn capacity_blocks(&self) -> usize {
        self.capacity_blocks
    }

    /// `tokens` as whole blocks of this index (at most `of`, the prompt's).
    fn blocks_of_tokens(&self, tokens: u64, of: usize) -> usize {
        let blocks = (tokens as f64 * self.bytes_per_token / self.block_bytes() as f64).floor();
        (blocks as usize).min(of)
    }

    fn block_bytes(&self) -> usize {
        self.cfg.block_bytes.max(1)
    }

    /// Chain hashes of the prompt's full blocks (`block_bytes` each, at most [`MAX_BLOCKS_PER_REQUEST`]), seeded by
    /// the model name: `h_0 = H(model, block_bytes)`, `h_i = H(h_{i-1}, block_i)`. Deterministic across processes.
    pub fn block_hashes(&self, model: &str, prompt: &[u8]) -> Vec<u64> {
        Self::hash_blocks(&self.cfg, model, prompt)
    }

    /// [`Self::block_hashes`] without the index, so callers can hash outside the index's lock.
    pub fn hash_blocks(cfg: &PrefixConfig, model: &str, prompt: &[u8]) -> Vec<u64> {
        let bb = cfg.block_bytes.max(1);
        let mut h = fnv1a(FNV_OFFSET, b"infergate-prefix\0");
        h = fnv1a(h, &(bb as u64).to_le_bytes());
        h = fmix64(fnv1a(h, model.as_bytes()));
        prompt
            .chunks_exact(bb)
            .take(MAX_BLOCKS_PER_REQUEST)
            .map(|block| {
                h = fmix64(fnv1a(fnv1a(FNV_OFFSET, &h.to_le_bytes()), block));
                h
            })
            .collect()
    }

    /// Longest cached match per endpoint: for each id in `ids`, how many leading blocks of `hashes` it holds
    /// (walking in order, stopping at the first block it lacks). Does not touch LRU recency.
    pub fn matched_blocks(&self, hashes: &[u64], ids: &[u64]) -> Vec<usize> {
        ids.iter().map(|id| self.matched_one(hashes, *id)).collect()
    }

    fn matched_one(&self, hashes: &[u64], id: u64) -> usize {
        match self.endpoints.get(&id) {
            Some(lru) => hashes.iter().take_while(|h| lru.contains(*h)).count(),
            None => 0,
        }
    }

    /// Place a request. `cands[i]` is the endpoint with id `ids[i]`; `arrivals[i]` its arrival count in the last
    /// 60 s (read by the `qps` fallback only). Returns None when no candidate is eligible.
    ///
    /// Reasons: `PrefixHit` (longest match, gate passed), `PrefixGated` (a match above the threshold whose
    /// endpoint is hot: placed by the fallback; the caller should insert the prompt there so the prefix
    /// replicates), `PrefixMiss` (no match of `min_match_bytes`: placed by the fallback).
    pub fn place(
        &mut self,
        hashes: &[u64],
        cands: &[Candidate],
        ids: &[u64],
        arrivals: &[u64],
        rng: &mut fastrand::Rng,
    ) -> Option<Decision> {
        debug_assert_eq!(cands.len(), ids.len(), "one id per candidate");
        let eligible = cands.iter().filter(|c| c.eligible).count();
        if eligible == 0 {
            return None;
        }
        let matched: Vec<usize> = cands
            .iter()
            .enumerate()
            .map(|(i, c)| match (ids.get(i), c.kv_held_tokens) {
                // What the engine holds by its own events, in this index's blocks, before the guess.
                (Some(_), Some(held)) if c.eligible => self.blocks_of_tokens(held, hashes.len()),
                (Some(&id), None) if c.eligible => self.matched_one(hashes, id),
                _ => 0,
            })
            .collect();
        let best = matched.iter().copied().max().unwrap_or(0);
        let best_bytes = best.saturating_mul(self.block_bytes());
        if best == 0 || best_bytes < self.cfg.min_match_bytes {
            let index = self.fallback(cands, arrivals, rng)?;
            return Some(Decision {
                index,
                reason: Reason::PrefixMiss,
            });
        }

        // Longest match; among those the lower load; exact ties at random.
        let chosen = pick_min(cands, rng, 0, |i, c| {
            (matched.get(i) == Some(&best)).then(|| c.request_load())
        })?;

        if gate_trips(cands, &cands[chosen]) {
            let index = self.fallback(cands, arrivals, rng)?;
            // A QPS fallback may land on the hot candidate anyway: then it is still a hit.
            let reason = if index == chosen {
                Reason::PrefixHit
            } else {
                Reason::PrefixGated
            };
            return Some(Decision { index, reason });
        }
        Some(Decision {
            index: chosen,
            reason: Reason::PrefixHit,
        })
    }

    fn fallback(
        &self,
        cands: &[Candidate],
        arrivals: &[u64],
        rng: &mut fastrand::Rng,
    ) -> Option<usize> {
        match self.cfg.fallback {
            PrefixFallback::LeastInflight => least_inflight(cands, rng),
            PrefixFallback::Qps => qps_pick(cands, arrivals),
        }
    }

    /// After dispatch: endpoint `id` now caches these blocks. The first blocks become the most recently used, so
    /// under pressure an endpoint loses the tails of its prompts before their shared heads (as the engine's own
    /// prefix cache does). Only the first `capacity` blocks are kept.
    pub fn insert(&mut self, id: u64, hashes: &[u64], _now: Instant) {
        if hashes.is_empty() {
            return;
        }
        let cap = self.capacity_blocks;
        let lru = self.endpoints.entry(id).or_insert_with(LruCache::unbounded);
        let keep = &hashes[..hashes.len().min(cap)];
        for h in keep.iter().rev() {
            lru.push(*h, ());
        }
        while lru.len() > cap {
            lru.pop_lru();
        }
    }

    /// New settings from a reload. A new `block_bytes` changes every block hash, so the index starts empty; a
    /// smaller capacity drops each endpoint's least recently used blocks; the other settings only change the next
    /// decisions. Returns the blocks dropped.
    pub fn reconfigure(&mut self, cfg: &PrefixConfig, bytes_per_token: f64) -> usize {
        let rehash = cfg.block_bytes != self.cfg.block_bytes;
        let endpoints = std::mem::take(&mut self.endpoints);
        *self = PrefixIndex::new(cfg, bytes_per_token);
        let cap = self.capacity_blocks;
        let mut dropped = 0;
        for (id, mut lru) in endpoints {
            if rehash {
                dropped += lru.len();
                continue;
            }
            while lru.len() > cap {
                lru.pop_lru();
                dropped += 1;
            }
            self.endpoints.insert(id, lru);
        }
        dropped
    }

    /// Forget an endpoint that left the pool.
    pub fn remove_endpoint(&mut self, id: u64) {
        self.endpoints.remove(&id);
    }

    pub fn blocks_held(&self, id: u64) -> usize {
        self.endpoints.get(&id).map_or(0, |l| l.len())
    }
}

/// The per-request gate: is the prefix candidate hot relative to the eligible pool's mean load?
fn gate_trips(cands: &[Candidate], chosen: &Candidate) -> bool {
    let (sum, n) = cands
        .iter()
        .filter(|c| c.eligible)
        .fold((0u64, 0u64), |(s, n), c| {
            (s.saturating_add(c.request_load()), n + 1)
        });
    if n == 0 {
        return false;
    }
    let mean = sum as f64 / n as f64;
    let load = chosen.request_load() as f64;
    load > mean * GATE_REL && load > mean + GATE_ABS
}

/// production-stack's legacy `_qps_routing`, reproduced for comparison: the first eligible endpoint with no
/// arrivals recorded, else the lowest arrival count (first in list on ties). Not the default, on purpose: under
/// session traffic a backend holding long-running requests receives and completes few requests, so the lowest
/// rate selects the busiest backend; and a windowed rate does not move within a burst, so the whole burst lands
/// on it.
fn qps_pick(cands: &[Candidate], arrivals: &[u64]) -> Option<usize> {
    let rate = |i: usize| arrivals.get(i).copied().unwrap_or(0);
    let eligible = || {
        cands
            .iter()
            .enumerate()
            .filter(|(_, c)| c.eligible)
            .map(|(i, _)| i)
    };
    if let Some(i) = eligible().find(|&i| rate(i) == 0) {
        return Some(i);
    }
    // min_by_key returns the first of equal minima.
    eligible().min_by_key(|&i| rate(i))
}

#[cfg(test)]
mod tests;
