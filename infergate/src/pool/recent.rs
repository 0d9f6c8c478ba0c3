//! A pool's recent placements for the status page: the latest ones and the counts by reason over the last minute.

use std::collections::VecDeque;
use std::sync::LazyLock;
use std::time::Instant;

use parking_lot::Mutex;

use crate::placement::Reason;

/// How many placements each pool keeps for the page.
pub const RECENT_PLACEMENTS: usize = 50;
/// The window of the per-reason counts, in seconds.
pub const WINDOW_SECS: u64 = 60;

/// Seconds are counted from here for the per-second buckets.
static EPOCH: LazyLock<Instant> = LazyLock::new(Instant::now);

/// A pool's latest placements (at most `RECENT_PLACEMENTS`) and its placements by reason over the last
/// `WINDOW_SECS` seconds (one bucket per second). Recorded once per generate placement, under a short lock.
#[derive(Default)]
pub struct RecentPlacements {
    inner: Mutex<RecentInner>,
}

#[derive(Default)]
struct RecentInner {
    /// (when, endpoint id, reason), newest last.
    latest: VecDeque<(Instant, u64, Reason)>,
    /// (second since EPOCH, count per reason index); a slot is reused when its second is out of the window.
    buckets: Vec<(u64, [u32; Reason::ALL.len()])>,
}

impl RecentPlacements {
    pub fn record(&self, endpoint: u64, reason: Reason, now: Instant) {
        let sec = now.saturating_duration_since(*EPOCH).as_secs();
        let mut r = self.inner.lock();
        if r.latest.len() == RECENT_PLACEMENTS {
            r.latest.pop_front();
        }
        r.latest.push_back((now, endpoint, reason));
        if r.buckets.is_empty() {
            r.buckets = vec![(u64::MAX, [0; Reason::ALL.len()]); WINDOW_SECS as usize];
        }
        let slot = &mut r.buckets[(sec % WINDOW_SECS) as usize];
        if slot.0 != sec {
            *slot = (sec, [0; Reason::ALL.len()]);
        }
        slot.1[reason.index()] += 1;
    }

    /// Placements per reason over the last `WINDOW_SECS` seconds (the current second included).
    pub fn last_minute(&self, now: Instant) -> [u64; Reason::ALL.len()] {
        let sec = now.saturating_duration_since(*EPOCH).as_secs();
        let r = self.inner.lock();
        let mut out = [0u64; Reason::ALL.len()];
        for (s, counts) in &r.buckets {
            if *s != u64::MAX && *s <= sec && sec - s < WINDOW_SECS {
                for (o, c) in out.iter_mut().zip(counts) {
                    *o += u64::from(*c);
                }
            }
        }
        out
    }

    /// The latest placements, newest first: (when, endpoint id, reason).
    pub fn latest(&self) -> Vec<(Instant, u64, Reason)> {
        self.inner.lock().latest.iter().rev().copied().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn recent_placements_are_bounded_and_newest_first() {
        let r = RecentPlacements::default();
        let t0 = *EPOCH + Duration::from_secs(1000);
        for i in 0..(RECENT_PLACEMENTS as u64 + 10) {
            r.record(i, Reason::Sticky, t0);
        }
        let latest = r.latest();
        assert_eq!(latest.len(), RECENT_PLACEMENTS);
        assert_eq!(latest[0].1, RECENT_PLACEMENTS as u64 + 9);
        assert_eq!(latest[RECENT_PLACEMENTS - 1].1, 10);
    }

    #[test]
    fn reason_counts_cover_the_last_minute_only() {
        let r = RecentPlacements::default();
        let t0 = *EPOCH + Duration::from_secs(1000);
        r.record(1, Reason::Sticky, t0);
        r.record(1, Reason::Sticky, t0 + Duration::from_millis(300));
        r.record(2, Reason::Migrate, t0 + Duration::from_secs(30));
        let at = |s| r.last_minute(t0 + Duration::from_secs(s));
        assert_eq!(at(30)[Reason::Sticky.index()], 2);
        assert_eq!(at(30)[Reason::Migrate.index()], 1);
        assert_eq!(at(59)[Reason::Sticky.index()], 2);
        assert_eq!(at(60)[Reason::Sticky.index()], 0, "out of the window");
        assert_eq!(at(60)[Reason::Migrate.index()], 1);
        assert_eq!(at(90)[Reason::Migrate.index()], 0);
        // A slot reused a minute later starts from zero.
        r.record(3, Reason::Spill, t0 + Duration::from_secs(60));
        assert_eq!(at(60)[Reason::Spill.index()], 1);
        assert_eq!(at(60)[Reason::Sticky.index()], 0);
    }
}
