//! The prefix cache: chained block hashes in an LRU bounded by the KV capacity (whole blocks only).

use lru::LruCache;

/// What one [`PrefixCache::touch`] changed.
#[derive(Debug, Default, PartialEq)]
pub struct Touched {
    pub stored: Vec<usize>,
    pub evicted: Vec<u64>,
}

pub struct PrefixCache {
    blocks: LruCache<u64, ()>,
    capacity_blocks: usize,
}

impl PrefixCache {
    pub fn new(capacity_blocks: usize) -> Self {
        PrefixCache {
            blocks: LruCache::unbounded(),
            capacity_blocks: capacity_blocks.max(1),
        }
    }

    /// Number of leading blocks of `hashes` present in the cache. Does not change recency.
    pub fn match_len(&self, hashes: &[u64]) -> usize {
        hashes
            .iter()
            .take_while(|h| self.blocks.contains(*h))
            .count()
    }

    /// Inserts (or refreshes) `hashes`, so that the earliest blocks of a prompt end up most recently used: like
    /// vLLM, eviction then takes a prompt's tail blocks first and keeps its shareable head.
    /// Returns what changed: the positions in `hashes` newly stored, and the hashes evicted (what a KV-event
    /// publisher reports as `BlockStored` / `BlockRemoved`).
    pub fn touch(&mut self, hashes: &[u64]) -> Touched {
        let mut t = Touched::default();
        for (i, h) in hashes.iter().enumerate().rev() {
            if !self.blocks.promote(h) {
                self.blocks.put(*h, ());
                t.stored.push(i);
            }
        }
        t.stored.reverse();
        while self.blocks.len() > self.capacity_blocks {
            if let Some((h, ())) = self.blocks.pop_lru() {
                t.evicted.push(h);
            }
        }
        // A block stored and evicted in one touch was never really held.
        t.stored.retain(|&i| self.blocks.contains(&hashes[i]));
        t
    }

    pub fn len(&self) -> usize {
        self.blocks.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lru_evicts_tail_blocks_first() {
        let mut c = PrefixCache::new(4);
        c.touch(&[1, 2, 3]);
        assert_eq!(c.match_len(&[1, 2, 3, 9]), 3);
        c.touch(&[7, 8]);
        // Capacity 4: the least recent of the first prompt is its tail block 3.
        assert_eq!(c.len(), 4);
        assert_eq!(c.match_len(&[1, 2, 3]), 2);
        assert_eq!(c.match_len(&[7, 8]), 2);
    }
}
