//! Passive outlier detection: consecutive failures (5xx answers, refused connects) eject an endpoint for a backoff
//! that grows while it keeps failing; a refusal (429 or 503) marks it saturated for a moment.
//!
//! An engine whose `/health` still answers 200 while it fails every request always has the fewest requests in
//! flight, so a load-based policy would keep choosing it (a blackhole). Ejection takes it out of placement; after
//! the backoff it returns only once a health check has passed again. The pool caps how many endpoints are
//! ejected at once, so a fleet-wide fault degrades to "try them all" instead of "serve nobody".

use std::time::{Duration, Instant};

use parking_lot::Mutex;

pub use crate::config::OutlierConfig;

#[derive(Debug, Default)]
struct State {
    consecutive_failures: u32,
    /// Ejections since the last success: the backoff exponent.
    ejections_in_a_row: u32,
    /// Set while ejected: until the backoff has passed AND a health check has passed after it.
    ejected_until: Option<Instant>,
    saturated_until: Option<Instant>,
}

/// One endpoint's outlier state.
#[derive(Debug, Default)]
pub struct Outlier {
    state: Mutex<State>,
}

impl Outlier {
    /// The endpoint served a request (any answer that shows it works).
    pub fn record_success(&self) {
        let mut st = self.state.lock();
        st.consecutive_failures = 0;
        if st.ejected_until.is_none() {
            st.ejections_in_a_row = 0;
        }
    }

    /// A 5xx answer or a failed connect. Returns the ejection time when this failure ejected the endpoint;
    /// `may_eject` says whether the pool's cap leaves room for one more ejection.
    pub fn record_failure(
        &self,
        cfg: &OutlierConfig,
        now: Instant,
        may_eject: bool,
    ) -> Option<Duration> {
        let mut st = self.state.lock();
        st.consecutive_failures = st.consecutive_failures.saturating_add(1);
        if st.ejected_until.is_some()
            || !may_eject
            || cfg.consecutive_failures == 0
            || st.consecutive_failures < cfg.consecutive_failures
        {
            return None;
        }
        let factor = 1u32 << st.ejections_in_a_row.min(16);
        let d = cfg
            .base_ejection
            .saturating_mul(factor)
            .min(cfg.max_ejection);
        st.ejections_in_a_row = st.ejections_in_a_row.saturating_add(1);
        st.consecutive_failures = 0;
        st.ejected_until = Some(now + d);
        Some(d)
    }

    /// A 429 or 503: the endpoint refused the work; keep it out of placement for `cooldown` while others can take it.
    pub fn record_refusal(&self, now: Instant, cooldown: Duration) {
        let mut st = self.state.lock();
        let until = now + cooldown;
        st.saturated_until = Some(st.saturated_until.map_or(until, |t| t.max(until)));
    }

    /// A health check passed: an endpoint whose backoff has run out returns to placement.
    pub fn health_check_passed(&self, now: Instant) {
        let mut st = self.state.lock();
        if st.ejected_until.is_some_and(|t| t <= now) {
            st.ejected_until = None;
        }
    }

    /// Out of placement: inside its backoff, or past it but not yet probed by a passing health check.
    pub fn is_ejected(&self) -> bool {
        self.state.lock().ejected_until.is_some()
    }

    pub fn is_saturated(&self, now: Instant) -> bool {
        self.state.lock().saturated_until.is_some_and(|t| t > now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> OutlierConfig {
        OutlierConfig::default()
    }

    #[test]
    fn consecutive_failures_eject_with_growing_backoff_until_probed_back() {
        let o = Outlier::default();
        let t0 = Instant::now();
        assert_eq!(o.record_failure(&cfg(), t0, true), None);
        assert_eq!(o.record_failure(&cfg(), t0, true), None);
        assert_eq!(
            o.record_failure(&cfg(), t0, true),
            Some(Duration::from_secs(2))
        );
        assert!(o.is_ejected());
        // Past the backoff it stays out until a health check passes.
        let t1 = t0 + Duration::from_secs(3);
        assert!(o.is_ejected());
        o.health_check_passed(t1);
        assert!(!o.is_ejected());
        // Failing again right away: the next ejection is twice as long.
        for _ in 0..2 {
            assert_eq!(o.record_failure(&cfg(), t1, true), None);
        }
        assert_eq!(
            o.record_failure(&cfg(), t1, true),
            Some(Duration::from_secs(4))
        );
        // A success after the return resets the backoff.
        let t2 = t1 + Duration::from_secs(5);
        o.health_check_passed(t2);
        o.record_success();
        for _ in 0..2 {
            o.record_failure(&cfg(), t2, true);
        }
        assert_eq!(
            o.record_failure(&cfg(), t2, true),
            Some(Duration::from_secs(2))
        );
    }

    #[test]
    fn a_health_check_before_the_backoff_ends_does_not_bring_it_back() {
        let o = Outlier::default();
        let t0 = Instant::now();
        for _ in 0..3 {
            o.record_failure(&cfg(), t0, true);
        }
        o.health_check_passed(t0 + Duration::from_secs(1));
        assert!(o.is_ejected());
    }

    #[test]
    fn successes_in_between_prevent_ejection_and_the_cap_is_respected() {
        let o = Outlier::default();
        let t0 = Instant::now();
        for _ in 0..10 {
            o.record_failure(&cfg(), t0, true);
            o.record_failure(&cfg(), t0, true);
            o.record_success();
        }
        assert!(!o.is_ejected());
        for _ in 0..10 {
            assert_eq!(o.record_failure(&cfg(), t0, false), None);
        }
        assert!(!o.is_ejected());
    }

    #[test]
    fn backoff_is_capped() {
        let c = cfg();
        let o = Outlier::default();
        let mut t = Instant::now();
        let mut last = Duration::ZERO;
        for _ in 0..12 {
            for _ in 0..3 {
                if let Some(d) = o.record_failure(&c, t, true) {
                    last = d;
                }
            }
            t += last + Duration::from_millis(1);
            o.health_check_passed(t);
        }
        assert_eq!(last, c.max_ejection);
    }

    #[test]
    fn refusal_saturates_for_the_cooldown() {
        let o = Outlier::default();
        let t0 = Instant::now();
        o.record_refusal(t0, Duration::from_secs(1));
        assert!(o.is_saturated(t0));
        assert!(!o.is_saturated(t0 + Duration::from_secs(2)));
        assert!(!o.is_ejected());
    }
}
