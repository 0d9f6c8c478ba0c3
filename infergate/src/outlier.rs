//! Passive outlier detection in Envoy's shape: consecutive gateway failures and a failure-rate window eject an
//! endpoint for a backoff that grows while it keeps failing; each failure's cost stays on the endpoint in
//! placement until it serves again; a refusal (429 or 503) marks it saturated for a moment.
//!
//! An engine whose `/health` still answers 200 while it fails every request always has the fewest requests in
//! flight, so a load-based policy would keep choosing it (a blackhole). Ejection takes it out of placement; after
//! the backoff it returns only once a health check has passed again. The pool caps how many endpoints are
//! ejected at once, so a fleet-wide fault degrades to "try them all" instead of "serve nobody". Between a failure
//! and the next success the failed request still weighs on the endpoint (its "debt"), so a failure that came fast
//! never makes the endpoint look idle.

use std::collections::VecDeque;
use std::sync::LazyLock;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

pub use crate::config::OutlierConfig;

/// Slots of the failure-rate window.
const WINDOW_SLOTS: usize = 10;
/// Failed requests whose cost an endpoint carries at most.
const MAX_DEBT: usize = 8;
/// Requests in a row whose clients gave up after waiting `stream_headers_within` with no answer at all, after which
/// the endpoint is taken for hung as a late stream makes it: one such request may be an answer that is merely long
/// (a non-streamed one sends nothing until it ends), two with nothing served between are an engine not answering.
pub const UNANSWERED_IN_A_ROW: u32 = 2;

static EPOCH: LazyLock<Instant> = LazyLock::new(Instant::now);

/// Why an endpoint was ejected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EjectCause {
    /// `consecutive_failures` in a row.
    Consecutive,
    /// `failure_percent` of at least `failure_min_requests` in the window failed.
    FailureRate,
}

impl EjectCause {
    pub fn describe(self, cfg: &OutlierConfig) -> String {
        match self {
            EjectCause::Consecutive => format!("{} consecutive failures", cfg.consecutive_failures),
            EjectCause::FailureRate => format!(
                "{}% or more of its requests failing in {}",
                cfg.failure_percent,
                humantime::format_duration(cfg.failure_window)
            ),
        }
    }
}

/// An ejection: for how long, and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ejection {
    pub duration: Duration,
    pub cause: EjectCause,
}

#[derive(Debug, Default, Clone, Copy)]
struct Slot {
    /// Which slot-wide interval since `EPOCH` this slot counts.
    stamp: u64,
    ok: u32,
    failed: u32,
}

#[derive(Debug, Default)]
struct State {
    consecutive_failures: u32,
    /// Ejections since the last success: the backoff exponent.
    ejections_in_a_row: u32,
    /// Set while ejected: until the backoff has passed AND a health check has passed after it.
    ejected_until: Option<Instant>,
    saturated_until: Option<Instant>,
    window: [Slot; WINDOW_SLOTS],
    /// The failed requests' prefill tokens, each until its expiry or the next success.
    debt: VecDeque<(Instant, u64)>,
    /// A stream got no headers in time: the engine may be wedged. Until the next success, or this instant.
    hung_until: Option<Instant>,
    /// Requests left unanswered in a row (`record_unanswered`) since the last success.
    unanswered: u32,
}

impl State {
    fn slot(&mut self, cfg: &OutlierConfig, now: Instant) -> &mut Slot {
        let width = (cfg.failure_window / WINDOW_SLOTS as u32).max(Duration::from_millis(1));
        let stamp = (now.saturating_duration_since(*EPOCH).as_nanos() / width.as_nanos()) as u64;
        let s = &mut self.window[stamp as usize % WINDOW_SLOTS];
        if s.stamp != stamp {
            *s = Slot {
                stamp,
                ok: 0,
                failed: 0,
            };
        }
        s
    }

    /// (requests, failed) in the window ending at the slot just counted.
    fn window_counts(&self, current: u64) -> (u32, u32) {
        self.window
            .iter()
            .filter(|s| s.stamp + WINDOW_SLOTS as u64 > current && s.stamp <= current)
            .fold((0, 0), |(n, f), s| (n + s.ok + s.failed, f + s.failed))
    }

    fn forget_debt(&mut self, now: Instant) {
        while self.debt.front().is_some_and(|(until, _)| *until <= now) {
            self.debt.pop_front();
        }
    }
}

/// What placement reads of one endpoint's outlier state, taken under one lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct View {
    pub ejected: bool,
    pub saturated: bool,
    pub hung: bool,
    /// Failed requests still weighing on it, and their prefill tokens.
    pub debt: (u64, u64),
}

/// One endpoint's outlier state.
#[derive(Debug, Default)]
pub struct Outlier {
    state: Mutex<State>,
}

impl Outlier {
    /// The endpoint served a request to its end (an answer that shows it works, a 4xx included): the streak and
    /// the debt are cleared.
    pub fn record_success(&self, cfg: &OutlierConfig, now: Instant) {
        let mut st = self.state.lock();
        st.consecutive_failures = 0;
        if st.ejected_until.is_none() {
            st.ejections_in_a_row = 0;
        }
        st.debt.clear();
        st.hung_until = None;
        st.unanswered = 0;
        st.slot(cfg, now).ok += 1;
    }

    /// A failure the engine owns (5xx, failed connect, a stream cut or timed out, no headers in time): it adds
    /// `tokens` of debt. Returns the ejection when this failure ejected the endpoint; `may_eject` says whether
    /// the pool's cap leaves room for one more ejection.
    pub fn record_failure(
        &self,
        cfg: &OutlierConfig,
        now: Instant,
        may_eject: bool,
        tokens: u64,
    ) -> Option<Ejection> {
        let mut st = self.state.lock();
        st.consecutive_failures = st.consecutive_failures.saturating_add(1);
        if !cfg.failure_penalty.is_zero() {
            st.forget_debt(now);
            if st.debt.len() == MAX_DEBT {
                st.debt.pop_front();
            }
            st.debt.push_back((now + cfg.failure_penalty, tokens));
        }
        let slot = st.slot(cfg, now);
        slot.failed += 1;
        let current = slot.stamp;
        if st.ejected_until.is_some() || !may_eject {
            return None;
        }
        let cause = if cfg.consecutive_failures > 0
            && st.consecutive_failures >= cfg.consecutive_failures
        {
            EjectCause::Consecutive
        } else {
            let (n, failed) = st.window_counts(current);
            let by_rate = cfg.failure_percent > 0
                && n >= cfg.failure_min_requests.max(1)
                && u64::from(failed) * 100 >= u64::from(cfg.failure_percent) * u64::from(n);
            if !by_rate {
                return None;
            }
            EjectCause::FailureRate
        };
        let factor = 1u32 << st.ejections_in_a_row.min(16);
        let duration = cfg
            .base_ejection
            .saturating_mul(factor)
            .min(cfg.max_ejection);
        st.ejections_in_a_row = st.ejections_in_a_row.saturating_add(1);
        st.consecutive_failures = 0;
        // Back from an ejection, it is judged on what it does then.
        st.window = Default::default();
        st.ejected_until = Some(now + duration);
        Some(Ejection { duration, cause })
    }

    /// A client left before the engine sent response headers: not proof of a fault, but until the endpoint
    /// serves again the request still weighs on it (a wedged engine that never answers must not look idle).
    pub fn record_abandoned(&self, cfg: &OutlierConfig, now: Instant, tokens: u64) {
        if cfg.failure_penalty.is_zero() {
            return;
        }
        let mut st = self.state.lock();
        st.forget_debt(now);
        if st.debt.len() == MAX_DEBT {
            st.debt.pop_front();
        }
        st.debt.push_back((now + cfg.failure_penalty, tokens));
    }

    /// A stream sent to it got no response headers in time: besides the failure, keep it aside while others can
    /// take the work (and entirely in a health panic), until it serves a request or `failure_penalty` passes.
    pub fn record_hung(&self, cfg: &OutlierConfig, now: Instant) {
        let until = now + cfg.failure_penalty.max(cfg.base_ejection);
        let mut st = self.state.lock();
        st.hung_until = Some(st.hung_until.map_or(until, |t| t.max(until)));
    }

    /// A client gave up after waiting at least `stream_headers_within` for any answer (streamed or not): the
    /// [`UNANSWERED_IN_A_ROW`]th in a row since the last success sets the endpoint aside as [`Self::record_hung`]
    /// does, and returns true.
    pub fn record_unanswered(&self, cfg: &OutlierConfig, now: Instant) -> bool {
        let until = now + cfg.failure_penalty.max(cfg.base_ejection);
        let mut st = self.state.lock();
        st.unanswered = st.unanswered.saturating_add(1);
        if st.unanswered < UNANSWERED_IN_A_ROW {
            return false;
        }
        st.unanswered = 0;
        st.hung_until = Some(st.hung_until.map_or(until, |t| t.max(until)));
        true
    }

    pub fn is_hung(&self, now: Instant) -> bool {
        self.state.lock().hung_until.is_some_and(|t| t > now)
    }

    /// What failed requests still weigh on the endpoint in placement: (requests, prefill tokens).
    pub fn debt(&self, now: Instant) -> (u64, u64) {
        self.view(now).debt
    }

    /// Everything placement reads, at once (one lock per endpoint per placement).
    pub fn view(&self, now: Instant) -> View {
        let mut st = self.state.lock();
        st.forget_debt(now);
        View {
            ejected: st.ejected_until.is_some(),
            saturated: st.saturated_until.is_some_and(|t| t > now),
            hung: st.hung_until.is_some_and(|t| t > now),
            debt: (st.debt.len() as u64, st.debt.iter().map(|(_, t)| *t).sum()),
        }
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
        assert_eq!(
            o.record_failure(&cfg(), t0, true, 0).map(|e| e.duration),
            None
        );
        assert_eq!(
            o.record_failure(&cfg(), t0, true, 0).map(|e| e.duration),
            None
        );
        assert_eq!(
            o.record_failure(&cfg(), t0, true, 0).map(|e| e.duration),
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
            assert_eq!(
                o.record_failure(&cfg(), t1, true, 0).map(|e| e.duration),
                None
            );
        }
        assert_eq!(
            o.record_failure(&cfg(), t1, true, 0).map(|e| e.duration),
            Some(Duration::from_secs(4))
        );
        // A success after the return resets the backoff.
        let t2 = t1 + Duration::from_secs(5);
        o.health_check_passed(t2);
        o.record_success(&cfg(), t2);
        for _ in 0..2 {
            o.record_failure(&cfg(), t2, true, 0);
        }
        assert_eq!(
            o.record_failure(&cfg(), t2, true, 0).map(|e| e.duration),
            Some(Duration::from_secs(2))
        );
    }

    #[test]
    fn a_health_check_before_the_backoff_ends_does_not_bring_it_back() {
        let o = Outlier::default();
        let t0 = Instant::now();
        for _ in 0..3 {
            o.record_failure(&cfg(), t0, true, 0);
        }
        o.health_check_passed(t0 + Duration::from_secs(1));
        assert!(o.is_ejected());
    }

    #[test]
    fn successes_in_between_prevent_a_streak_and_the_cap_is_respected() {
        let streak_only = OutlierConfig {
            failure_percent: 0,
            ..cfg()
        };
        let o = Outlier::default();
        let t0 = Instant::now();
        for _ in 0..10 {
            o.record_failure(&streak_only, t0, true, 0);
            o.record_failure(&streak_only, t0, true, 0);
            o.record_success(&streak_only, t0);
        }
        assert!(!o.is_ejected());
        for _ in 0..10 {
            assert_eq!(o.record_failure(&cfg(), t0, false, 0), None);
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
                if let Some(d) = o.record_failure(&c, t, true, 0).map(|e| e.duration) {
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
    #[test]
    fn a_failure_rate_ejects_what_no_streak_would() {
        let c = OutlierConfig {
            failure_percent: 50,
            failure_min_requests: 10,
            ..cfg()
        };
        let o = Outlier::default();
        let t0 = Instant::now();
        // Fail, fail, succeed: never three in a row, but two thirds of its requests fail.
        let mut ejected = None;
        for i in 0..12 {
            let t = t0 + Duration::from_millis(100 * i);
            if i % 3 == 2 {
                o.record_success(&c, t);
            } else if let Some(e) = o.record_failure(&c, t, true, 0) {
                ejected = Some((i, e));
                break;
            }
        }
        let (i, e) = ejected.expect("ejected by the failure rate");
        assert_eq!(e.cause, EjectCause::FailureRate);
        assert!(i >= 9, "not before failure_min_requests: {i}");
        // Outside the window the old failures no longer count.
        let o = Outlier::default();
        for i in 0..6 {
            o.record_failure(&c, t0 + Duration::from_millis(i), true, 0);
            o.record_success(&c, t0 + Duration::from_millis(i));
        }
        let later = t0 + c.failure_window * 2;
        for i in 0..4 {
            assert_eq!(o.record_failure(&c, later, true, 0), None, "{i}");
            o.record_success(&c, later);
        }
    }

    #[test]
    fn a_failure_weighs_on_the_endpoint_until_it_serves_or_the_penalty_ends() {
        let c = cfg();
        let o = Outlier::default();
        let t0 = Instant::now();
        assert_eq!(o.debt(t0), (0, 0));
        o.record_failure(&c, t0, true, 500);
        o.record_abandoned(&c, t0, 700);
        assert_eq!(o.debt(t0), (2, 1200));
        assert_eq!(o.debt(t0 + c.failure_penalty), (0, 0));
        o.record_failure(&c, t0, true, 500);
        o.record_success(&c, t0);
        assert_eq!(o.debt(t0), (0, 0));
        // Bounded, however long the streak.
        let never = OutlierConfig {
            consecutive_failures: 0,
            ..c.clone()
        };
        for _ in 0..100 {
            o.record_failure(&never, t0, true, 10);
        }
        assert_eq!(o.debt(t0), (MAX_DEBT as u64, 10 * MAX_DEBT as u64));
        let off = OutlierConfig {
            failure_penalty: Duration::ZERO,
            ..c
        };
        let o = Outlier::default();
        o.record_failure(&off, t0, true, 10);
        assert_eq!(o.debt(t0), (0, 0));
    }

    #[test]
    fn a_hung_stream_sets_the_endpoint_aside_until_it_serves_or_the_penalty_ends() {
        let c = cfg();
        let o = Outlier::default();
        let t0 = Instant::now();
        o.record_hung(&c, t0);
        assert!(o.is_hung(t0));
        assert!(!o.is_hung(t0 + c.failure_penalty));
        o.record_hung(&c, t0);
        o.record_success(&c, t0);
        assert!(!o.is_hung(t0));
    }

    #[test]
    fn requests_left_unanswered_twice_in_a_row_set_the_endpoint_aside() {
        let c = cfg();
        let o = Outlier::default();
        let t0 = Instant::now();
        assert!(!o.record_unanswered(&c, t0));
        assert!(!o.is_hung(t0));
        // A success between them: no longer in a row.
        o.record_success(&c, t0);
        assert!(!o.record_unanswered(&c, t0));
        assert!(o.record_unanswered(&c, t0));
        assert!(o.is_hung(t0));
        assert!(!o.is_hung(t0 + c.failure_penalty));
        // Counted afresh after it was set aside.
        o.record_success(&c, t0);
        assert!(!o.record_unanswered(&c, t0));
    }
}
