//! Deterministic pseudo-English text with an exact token count.
//!
//! Every piece the generator emits is one token under the common tokenizer rule "a run of up to 8 letters is one
//! token, a punctuation mark is one token, spaces are free" (the simulated engine's rule, and close to a BPE
//! tokenizer on short English words). Words average about 4.5 letters, so text runs at ~5 bytes per token, a bit
//! above the bytes/4 estimate routers use — as real English prose does.
//!
//! The generator is seeded: the same seed gives the same text, and two sessions with different seeds share no
//! prefix beyond a few tokens, so prefix caches hit only within a session (plus any shared system prompt).

const ONSETS: [&str; 24] = [
    "b", "c", "d", "f", "g", "h", "l", "m", "n", "p", "r", "s", "t", "v", "w", "st", "th", "ch",
    "br", "tr", "pl", "gr", "sh", "k",
];
const VOWELS: [&str; 10] = ["a", "e", "i", "o", "u", "a", "e", "ea", "ou", "ai"];
const CODAS: [&str; 12] = ["", "", "", "n", "r", "s", "t", "l", "nd", "st", "m", "ck"];
const COMMON: [&str; 24] = [
    "the", "of", "and", "to", "in", "a", "is", "that", "for", "it", "as", "with", "was", "on",
    "be", "at", "by", "this", "from", "or", "an", "are", "which", "not",
];

/// Longest word the generator emits: at most this many letters is exactly one token.
pub const MAX_WORD: usize = 8;

/// A seeded pseudo-English text source.
pub struct TextGen {
    rng: fastrand::Rng,
    /// Words left in the current sentence.
    sentence_left: usize,
    at_sentence_start: bool,
}

impl TextGen {
    pub fn new(seed: u64) -> Self {
        TextGen {
            rng: fastrand::Rng::with_seed(seed),
            sentence_left: 0,
            at_sentence_start: true,
        }
    }

    fn word(&mut self, out: &mut String) {
        let start = out.len();
        if self.rng.u32(0..100) < 35 {
            out.push_str(COMMON[self.rng.usize(..COMMON.len())]);
        } else {
            let syllables = match self.rng.u32(0..10) {
                0..=3 => 1,
                4..=8 => 2,
                _ => 3,
            };
            for _ in 0..syllables {
                out.push_str(ONSETS[self.rng.usize(..ONSETS.len())]);
                out.push_str(VOWELS[self.rng.usize(..VOWELS.len())]);
            }
            out.push_str(CODAS[self.rng.usize(..CODAS.len())]);
            out.truncate(start + (out.len() - start).min(MAX_WORD));
        }
        if self.at_sentence_start {
            // ASCII only, so the first byte is the first character.
            let first = out.as_bytes()[start].to_ascii_uppercase() as char;
            out.replace_range(start..start + 1, first.encode_utf8(&mut [0u8; 4]));
            self.at_sentence_start = false;
        }
    }

    /// Appends exactly `tokens` tokens of text to `out` (words separated by spaces, sentences ended by ".",
    /// the odd ","). The text starts with a space unless `out` is empty.
    pub fn push_tokens(&mut self, out: &mut String, tokens: usize) {
        out.reserve(tokens * 6);
        let mut left = tokens;
        while left > 0 {
            if self.sentence_left == 0 {
                self.sentence_left = self.rng.usize(6..=18);
                self.at_sentence_start = true;
            }
            if !out.is_empty() {
                out.push(' ');
            }
            self.word(out);
            left -= 1;
            self.sentence_left -= 1;
            if left > 0 && self.sentence_left == 0 {
                out.push('.');
                left -= 1;
            } else if left > 0 && self.sentence_left > 2 && self.rng.u32(0..100) < 6 {
                out.push(',');
                left -= 1;
            }
        }
    }

    /// `tokens` tokens of fresh text.
    pub fn text(&mut self, tokens: usize) -> String {
        let mut s = String::new();
        self.push_tokens(&mut s, tokens);
        s
    }
}

/// Token count of `text` under the rule the generator targets (runs of up to 8 letters/digits/`_` are one
/// token, every other printable ASCII character is one, spaces are free; a run of newlines is one token).
pub fn count_tokens(text: &str) -> usize {
    let b = text.as_bytes();
    let (mut i, mut n) = (0, 0);
    while i < b.len() {
        let c = b[i];
        if c.is_ascii_alphanumeric() || c == b'_' {
            let start = i;
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                i += 1;
            }
            n += (i - start).div_ceil(MAX_WORD);
        } else if c == b'\n' {
            while i < b.len() && b[i] == b'\n' {
                i += 1;
            }
            n += 1;
        } else if c == b' ' || c == b'\t' || c == b'\r' {
            i += 1;
        } else {
            // Other ASCII or a UTF-8 character (continuation bytes skipped).
            i += 1;
            while i < b.len() && (b[i] & 0xC0) == 0x80 {
                i += 1;
            }
            n += 1;
        }
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_token_counts() {
        let mut g = TextGen::new(7);
        for n in [0, 1, 2, 3, 17, 100, 1000, 5003] {
            let t = g.text(n);
            assert_eq!(count_tokens(&t), n, "n={n}: {t:.80}");
            assert!(t.is_ascii());
        }
    }

    #[test]
    fn deterministic_and_distinct_per_seed() {
        assert_eq!(TextGen::new(1).text(500), TextGen::new(1).text(500));
        let a = TextGen::new(1).text(64);
        let b = TextGen::new(2).text(64);
        let common = a.bytes().zip(b.bytes()).take_while(|(x, y)| x == y).count();
        assert!(common < 16, "{a} / {b}");
    }

    #[test]
    fn looks_like_prose() {
        let t = TextGen::new(3).text(20_000);
        let bytes_per_token = t.len() as f64 / 20_000.0;
        assert!((4.0..6.5).contains(&bytes_per_token), "{bytes_per_token}");
        assert!(t.contains(". ") && t.starts_with(|c: char| c.is_ascii_uppercase()));
        assert!(t
            .split(' ')
            .all(|w| w.trim_end_matches([',', '.']).len() <= MAX_WORD));
    }

    #[test]
    fn matches_the_simulator_tokenizer() {
        let t = TextGen::new(11).text(3000);
        assert_eq!(infergate_sim::count_tokens(&t), 3000);
    }
}
