//! Repeated warn and error lines, rate-limited with a count: the first [`BURST`] lines alike in a [`WINDOW`] are
//! written, the rest are counted, and the count is written once the window has passed.
//!
//! An outage makes every request log the same line (Pingora's error for each `no_healthy_endpoint` 503, an
//! endpoint's failures): thousands a second that bury the one line that says why. Lines are alike when they have
//! the same target and level and the same text once digits are left out (counts, ports, durations differ). The
//! table is bounded; when it is full of live windows, a new kind of line is written, never dropped.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::time::{Duration, Instant};

use log::Level;
use parking_lot::Mutex;

/// Lines alike written per window.
pub const BURST: u32 = 5;
/// How long a window lasts.
pub const WINDOW: Duration = Duration::from_secs(10);
/// Kinds of line tracked at once.
const MAX_KINDS: usize = 1024;

/// What to do with one line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Write,
    /// Counted, not written.
    Drop,
}

/// A window that ended with lines counted and not written: what to write about them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Summary {
    pub level: Level,
    pub target: String,
    pub line: String,
}

#[derive(Debug)]
struct Kind {
    started: Instant,
    written: u32,
    dropped: u32,
    level: Level,
    target: String,
    /// The first line of the window, to say which lines were dropped.
    sample: String,
}

impl Kind {
    /// A window that starts now with `line` written.
    fn new(now: Instant, level: Level, target: &str, line: &str) -> Kind {
        Kind {
            started: now,
            written: 1,
            dropped: 0,
            level,
            target: target.to_string(),
            sample: line.to_string(),
        }
    }

    fn summary(&self, now: Instant) -> Option<Summary> {
        (self.dropped > 0).then(|| Summary {
            level: self.level,
            target: self.target.clone(),
            line: format!(
                "{} more line(s) like this in the last {}s: {}",
                self.dropped,
                now.saturating_duration_since(self.started).as_secs().max(1),
                self.sample
            ),
        })
    }
}

/// The table of recent kinds of line.
#[derive(Debug, Default)]
pub struct Repeats {
    kinds: Mutex<HashMap<u64, Kind>>,
}

fn kind_of(level: Level, target: &str, line: &str) -> u64 {
    let mut h = std::hash::DefaultHasher::new();
    level.hash(&mut h);
    target.hash(&mut h);
    for b in line.bytes().filter(|b| !b.is_ascii_digit()) {
        h.write_u8(b);
    }
    h.finish()
}

impl Repeats {
    /// Whether to write `line`, and the summary of its kind's previous window if that one dropped lines.
    pub fn admit(
        &self,
        level: Level,
        target: &str,
        line: &str,
        now: Instant,
    ) -> (Verdict, Option<Summary>) {
        let key = kind_of(level, target, line);
        let mut kinds = self.kinds.lock();
        if let Some(k) = kinds.get_mut(&key) {
            if now.saturating_duration_since(k.started) < WINDOW {
                if k.written < BURST {
                    k.written += 1;
                    return (Verdict::Write, None);
                }
                k.dropped += 1;
                return (Verdict::Drop, None);
            }
            let summary = k.summary(now);
            *k = Kind::new(now, level, target, line);
            return (Verdict::Write, summary);
        }
        let mut summaries = None;
        if kinds.len() >= MAX_KINDS {
            summaries = Some(Self::take_expired(&mut kinds, now));
            if kinds.len() >= MAX_KINDS {
                // Full of live windows: write, untracked.
                return (Verdict::Write, summaries.and_then(|s| s.into_iter().next()));
            }
        }
        kinds.insert(key, Kind::new(now, level, target, line));
        (Verdict::Write, summaries.and_then(|s| s.into_iter().next()))
    }

    /// The summaries of every window that has ended with lines dropped; ended windows are forgotten.
    pub fn flush(&self, now: Instant) -> Vec<Summary> {
        Self::take_expired(&mut self.kinds.lock(), now)
    }

    fn take_expired(kinds: &mut HashMap<u64, Kind>, now: Instant) -> Vec<Summary> {
        let mut out = Vec::new();
        kinds.retain(|_, k| {
            if now.saturating_duration_since(k.started) < WINDOW {
                return true;
            }
            out.extend(k.summary(now));
            false
        });
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_is_written_the_rest_counted_and_summed_up_after_the_window() {
        let r = Repeats::default();
        let t0 = Instant::now();
        let line = |n: u32| format!("Fail to proxy: no endpoint available, request {n}");
        let mut written = 0;
        for n in 0..100 {
            let (v, s) = r.admit(Level::Error, "pingora_proxy", &line(n), t0);
            assert_eq!(s, None);
            written += u32::from(v == Verdict::Write);
        }
        assert_eq!(written, BURST, "digits do not make lines different");
        // Another kind of line is not held back by the first.
        let other = r.admit(Level::Error, "pingora_proxy", "something else", t0);
        assert_eq!(other, (Verdict::Write, None));
        // Nothing is summed up before the window ends.
        assert!(r.flush(t0 + WINDOW / 2).is_empty());
        // The next line after the window: written, with the count of the last window.
        let (v, s) = r.admit(Level::Error, "pingora_proxy", &line(7), t0 + WINDOW);
        assert_eq!(v, Verdict::Write);
        let s = s.expect("a summary");
        assert_eq!(
            (s.level, s.target.as_str()),
            (Level::Error, "pingora_proxy")
        );
        assert!(
            s.line
                .starts_with("95 more line(s) like this in the last 10s: "),
            "{}",
            s.line
        );
        assert!(s.line.ends_with(&line(0)), "{}", s.line);
    }

    #[test]
    fn a_quiet_window_is_summed_up_by_flush_and_levels_count_apart() {
        let r = Repeats::default();
        let t0 = Instant::now();
        for _ in 0..BURST + 3 {
            r.admit(
                Level::Warn,
                "infergate::pool",
                "pool p endpoint e: ejected",
                t0,
            );
            r.admit(
                Level::Error,
                "infergate::pool",
                "pool p endpoint e: ejected",
                t0,
            );
        }
        let mut s = r.flush(t0 + WINDOW);
        s.sort_by_key(|s| s.level);
        assert_eq!(s.len(), 2);
        assert!(
            s.iter().all(|s| s.line.starts_with("3 more line(s)")),
            "{s:?}"
        );
        assert!(r.flush(t0 + WINDOW * 3).is_empty(), "summed up once");
    }

    #[test]
    fn a_full_table_writes_new_kinds_of_line() {
        let r = Repeats::default();
        let t0 = Instant::now();
        for n in 0..MAX_KINDS {
            // Distinct beyond digits: letters from the number.
            let line: String = n
                .to_string()
                .bytes()
                .map(|b| (b - b'0' + b'a') as char)
                .collect();
            r.admit(Level::Warn, "t", &line, t0);
        }
        assert_eq!(
            r.admit(Level::Warn, "t", "a new kind", t0).0,
            Verdict::Write
        );
        assert_eq!(
            r.admit(Level::Warn, "t", "a new kind", t0).0,
            Verdict::Write
        );
    }
}
