//! Engine stats of each endpoint (running / waiting / KV usage) and their state: fresh, stale, missing or down.
//!
//! Unknown is never reported as idle. The Prometheus text parser is in `parse`, the HTTP scrape loop in `scrape`,
//! the client of the router's own requests to an engine (plain or TLS) in `client`; their public items are
//! re-exported here.

mod client;
#[cfg(test)]
mod fixtures;
mod parse;
mod scrape;

pub use client::{plain_client, SideClient, SideError};
pub use parse::{parse, required_names, ParseError};
pub use scrape::{scrape_loop, scrape_once, OutcomeSink, ScrapeTarget, MAX_METRICS_BYTES};

use parking_lot::Mutex;
use std::time::{Duration, Instant};

use crate::placement::EngineLoad;

/// The state of one endpoint's engine stats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatsState {
    /// Scraping is not configured for this pool.
    Off,
    /// A good sample younger than 3 intervals.
    Fresh,
    /// The last good sample is older than 3 intervals.
    Stale,
    /// The scrape works but the required metric names are absent (e.g. a mis-prefixed engine).
    Missing,
    /// The scrape fails (connect, HTTP status, timeout) and no fresh sample exists.
    Down,
}

impl StatsState {
    pub fn as_str(self) -> &'static str {
        match self {
            StatsState::Off => "off",
            StatsState::Fresh => "fresh",
            StatsState::Stale => "stale",
            StatsState::Missing => "missing",
            StatsState::Down => "down",
        }
    }
}

#[derive(Debug, Default)]
struct CellInner {
    enabled: bool,
    interval: Duration,
    last_good: Option<(Instant, EngineLoad)>,
    /// Outcome of the newest scrape attempt that was not good.
    last_bad: Option<(Instant, StatsState)>,
}

/// The latest stats of one endpoint, written by its scraper and read by placement.
#[derive(Debug, Default)]
pub struct StatsCell {
    inner: Mutex<CellInner>,
}

impl StatsCell {
    fn lock(&self) -> parking_lot::MutexGuard<'_, CellInner> {
        self.inner.lock()
    }

    /// Turn scraping on for this endpoint (state becomes Down until the first good sample).
    pub fn enable(&self, interval: Duration) {
        let mut c = self.lock();
        c.enabled = true;
        c.interval = interval;
    }

    pub fn record_good(&self, at: Instant, load: EngineLoad) {
        let mut c = self.lock();
        c.last_good = Some((at, load));
        c.last_bad = None;
    }

    pub fn record_bad(&self, at: Instant, state: StatsState) {
        self.lock().last_bad = Some((at, state));
    }

    /// Stats usable for placement: only when fresh.
    pub fn fresh(&self, now: Instant) -> Option<EngineLoad> {
        let c = self.lock();
        Self::state_of(&c, now)
            .eq(&StatsState::Fresh)
            .then(|| c.last_good.map(|(_, l)| l))
            .flatten()
    }

    pub fn state(&self, now: Instant) -> StatsState {
        Self::state_of(&self.lock(), now)
    }

    /// The state and the last good sample with its time, if any (the status page shows both).
    pub fn sample(&self, now: Instant) -> (StatsState, Option<(Instant, EngineLoad)>) {
        let c = self.lock();
        (Self::state_of(&c, now), c.last_good)
    }

    fn state_of(c: &CellInner, now: Instant) -> StatsState {
        if !c.enabled {
            return StatsState::Off;
        }
        // The newest bad outcome wins over an older good sample: a missing metric must not read as the old value.
        if let Some((bad_at, st)) = c.last_bad {
            if c.last_good.is_none_or(|(good_at, _)| bad_at >= good_at) && st == StatsState::Missing
            {
                return StatsState::Missing;
            }
        }
        match c.last_good {
            Some((at, _)) if now.saturating_duration_since(at) <= c.interval * 3 => {
                StatsState::Fresh
            }
            Some(_) => match c.last_bad {
                Some((_, st)) => st,
                None => StatsState::Stale,
            },
            None => c.last_bad.map(|(_, st)| st).unwrap_or(StatsState::Down),
        }
    }
}

impl StatsCell {
    /// Record one scrape outcome: a good sample, or Missing / Down.
    pub fn record_outcome(&self, at: Instant, outcome: &ScrapeOutcome) {
        match outcome {
            ScrapeOutcome::Good(load) => self.record_good(at, *load),
            other => self.record_bad(at, other.state()),
        }
    }
}

/// The result of one scrape.
#[derive(Debug, Clone, PartialEq)]
pub enum ScrapeOutcome {
    Good(EngineLoad),
    /// The endpoint answered with metrics, but not the required ones.
    Missing {
        close: Vec<String>,
    },
    /// Connect error, timeout, HTTP error status, oversized or unparsable body. The reason never holds a key.
    Down(String),
}

impl ScrapeOutcome {
    /// The state this outcome puts a `StatsCell` in (`Fresh` for a good sample).
    pub fn state(&self) -> StatsState {
        match self {
            ScrapeOutcome::Good(_) => StatsState::Fresh,
            ScrapeOutcome::Missing { .. } => StatsState::Missing,
            ScrapeOutcome::Down(_) => StatsState::Down,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cell_state_transitions() {
        let t0 = Instant::now();
        let s = Duration::from_secs(1);
        let load = EngineLoad {
            running: 2,
            waiting: 1,
            kv_usage: 0.5,
            own_at_sample: 0,
        };
        let cell = StatsCell::default();
        assert_eq!(cell.state(t0), StatsState::Off);
        cell.record_good(t0, load);
        assert_eq!(
            cell.state(t0),
            StatsState::Off,
            "not enabled: off regardless"
        );
        assert_eq!(cell.fresh(t0), None);

        let cell = StatsCell::default();
        cell.enable(s);
        assert_eq!(cell.state(t0), StatsState::Down, "enabled, no sample yet");
        cell.record_outcome(t0, &ScrapeOutcome::Good(load));
        assert_eq!(cell.state(t0 + 3 * s), StatsState::Fresh);
        assert_eq!(cell.fresh(t0 + 3 * s), Some(load));
        assert_eq!(
            cell.state(t0 + 3 * s + Duration::from_millis(1)),
            StatsState::Stale
        );
        assert_eq!(cell.fresh(t0 + 4 * s), None, "stale stats are not used");

        // A failed scrape right after a good one: the sample stays fresh until it ages out, then Down.
        cell.record_good(t0 + 10 * s, load);
        cell.record_outcome(t0 + 11 * s, &ScrapeOutcome::Down("timed out".into()));
        assert_eq!(cell.state(t0 + 12 * s), StatsState::Fresh);
        assert_eq!(cell.state(t0 + 14 * s), StatsState::Down);
        assert_eq!(cell.fresh(t0 + 14 * s), None);

        // Missing wins immediately over an older good sample: never the old value, never zeros.
        cell.record_good(t0 + 20 * s, load);
        cell.record_outcome(
            t0 + 21 * s,
            &ScrapeOutcome::Missing {
                close: vec!["vllm_num_requests_running".into()],
            },
        );
        assert_eq!(cell.state(t0 + 21 * s), StatsState::Missing);
        assert_eq!(cell.fresh(t0 + 21 * s), None);
        cell.record_outcome(t0 + 22 * s, &ScrapeOutcome::Good(load));
        assert_eq!(cell.state(t0 + 22 * s), StatsState::Fresh);
    }
}
