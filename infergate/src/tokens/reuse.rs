//! What a conversation's turn shares with one counted before is not tokenised again.
//!
//! A tokenizer splits its input at its added tokens (`</s>`, `<|im_end|>`, ...) before anything else and encodes
//! the pieces between them independently; so the ids of a rendered prompt up to the end of such a token are the
//! same whatever follows. The ids of the longest such prefix of each counted chat prompt are kept (bounded), and a
//! later prompt that starts with one encodes only the rest — behind a copy of the token it starts after, so that
//! the rest is the piece after a split there, not the start of a text — and drops that token's id again. Exact
//! only where the split is plain: a tokenizer with a single-word or normalised added token, or with truncation,
//! never reuses; a token that strips whitespace around it is not a boundary. One count in `VERIFY_EVERY` is also
//! encoded whole and compared; a difference turns reuse off for the model.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;

use aho_corasick::{AhoCorasick, MatchKind};

use crate::fnv;

/// Bytes of text and ids the kept prefixes may take per model.
pub const MAX_BYTES: usize = 64 << 20;
/// A prefix shorter than this is not worth keeping.
const MIN_PREFIX: usize = 1 << 10;
/// One reuse in this many is checked against a whole encode.
const VERIFY_EVERY: u64 = 64;

/// The splitting added tokens of a tokenizer and the prefixes kept.
pub struct Reuse {
    /// Every added token, as the tokenizer extracts them (leftmost-longest).
    tokens: AhoCorasick,
    /// Per pattern: its id and whether a split after it is plain (no whitespace stripped).
    patterns: Vec<(u32, bool)>,
    contents: Vec<String>,
    kept: Mutex<Kept>,
    counts: AtomicU64,
    off: AtomicBool,
}

#[derive(Default)]
struct Kept {
    by_hash: HashMap<u64, (String, Vec<u32>)>,
    order: VecDeque<u64>,
    bytes: usize,
}

impl Reuse {
    /// None when reuse would not be exact for this tokenizer.
    pub fn new(tok: &tokenizers::Tokenizer) -> Option<Reuse> {
        if tok.get_truncation().is_some() {
            return None;
        }
        let mut added: Vec<(u32, tokenizers::AddedToken)> =
            tok.get_added_tokens_decoder().into_iter().collect();
        added.sort_by_key(|(id, _)| *id);
        if added.is_empty() || added.iter().any(|(_, t)| t.single_word || t.normalized) {
            return None;
        }
        let contents: Vec<String> = added.iter().map(|(_, t)| t.content.clone()).collect();
        let tokens = AhoCorasick::builder()
            .match_kind(MatchKind::LeftmostLongest)
            .build(&contents)
            .ok()?;
        let patterns = added
            .iter()
            .map(|(id, t)| (*id, !t.lstrip && !t.rstrip))
            .collect();
        Some(Reuse {
            tokens,
            patterns,
            contents,
            kept: Mutex::new(Kept::default()),
            counts: AtomicU64::new(0),
            off: AtomicBool::new(false),
        })
    }

    /// The ids of `text` (no special tokens added), encoding only what no kept prefix covers, and how many of
    /// them were reused. `whole` encodes a text.
    pub fn encode(
        &self,
        text: &str,
        whole: impl Fn(&str) -> Option<Vec<u32>>,
    ) -> Option<(Vec<u32>, u64)> {
        if self.off.load(Ordering::Relaxed) {
            return Some((whole(text)?, 0));
        }
        // Every added token in the text, and the hash of the text up to the end of each plain one.
        let mut boundaries = Vec::new();
        let (mut h, mut at) = (fnv::OFFSET, 0);
        for (k, m) in self.tokens.find_iter(text).enumerate() {
            let (_, plain) = self.patterns[m.pattern().as_usize()];
            h = fnv::fnv1a(h, &text.as_bytes()[at..m.end()]);
            at = m.end();
            if plain {
                boundaries.push((m.end(), h, k, m.pattern().as_usize()));
            }
        }
        let hit = {
            let kept = self.kept.lock().ok()?;
            boundaries.iter().rev().find_map(|&(end, h, _, p)| {
                let (prefix, ids) = kept.by_hash.get(&h)?;
                (prefix.as_bytes() == &text.as_bytes()[..end]).then(|| (end, p, ids.clone()))
            })
        };
        let (ids, reused) = match hit {
            Some((end, p, mut ids)) => {
                let rest = format!("{}{}", self.contents[p], &text[end..]);
                let more = whole(&rest)?;
                if more.first() != Some(&self.patterns[p].0) {
                    return Some((whole(text)?, 0));
                }
                let reused = ids.len() as u64;
                ids.extend_from_slice(&more[1..]);
                if self.counts.fetch_add(1, Ordering::Relaxed) % VERIFY_EVERY == VERIFY_EVERY - 1 {
                    let check = whole(text)?;
                    if check != ids {
                        log::warn!("tokenizer: a reused prefix gave other ids than a whole encode; reuse is off");
                        self.off.store(true, Ordering::Relaxed);
                        return Some((check, 0));
                    }
                }
                (ids, reused)
            }
            None => (whole(text)?, 0),
        };
        if let Some(&(end, h, k, _)) = boundaries.last() {
            self.keep(text, end, h, k, &ids);
        }
        Some((ids, reused))
    }

    /// Keep the ids of `text[..end]`: those up to the `k`-th added token's id.
    fn keep(&self, text: &str, end: usize, h: u64, k: usize, ids: &[u32]) {
        if end < MIN_PREFIX {
            return;
        }
        let is_added = |id: &u32| self.patterns.iter().any(|(p, _)| p == id);
        let Some(n) = ids
            .iter()
            .enumerate()
            .filter(|(_, id)| is_added(id))
            .nth(k)
            .map(|(i, _)| i + 1)
        else {
            return;
        };
        let size = end + 4 * n;
        if size > MAX_BYTES / 4 {
            return;
        }
        let Ok(mut kept) = self.kept.lock() else {
            return;
        };
        if kept.by_hash.contains_key(&h) {
            return;
        }
        while kept.bytes + size > MAX_BYTES {
            let Some(old) = kept.order.pop_front() else {
                break;
            };
            if let Some((t, i)) = kept.by_hash.remove(&old) {
                kept.bytes -= t.len() + 4 * i.len();
            }
        }
        kept.by_hash
            .insert(h, (text[..end].to_string(), ids[..n].to_vec()));
        kept.order.push_back(h);
        kept.bytes += size;
    }
}
