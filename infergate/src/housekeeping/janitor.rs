//! The prefill janitor: non-streaming holds released at their estimated prefill end, streams whose headers are
//! overdue reported, overdue holds expired, and the pools' idle sessions expired.

use std::time::{Duration, Instant};

use async_trait::async_trait;
use pingora_core::server::ShutdownWatch;
use pingora_core::services::background::BackgroundService;

use crate::pool::JANITOR_PERIOD;
use crate::state::RouterState;

/// How often non-streaming holds are checked against their estimated prefill end.
const RELEASE_PERIOD: Duration = Duration::from_millis(50);

pub(super) struct Janitor {
    pub(super) state: RouterState,
}

#[async_trait]
impl BackgroundService for Janitor {
    async fn start(&self, mut stop: ShutdownWatch) {
        let state = &self.state;
        let mut tick = tokio::time::interval(RELEASE_PERIOD);
        let mut last_janitor = Instant::now();
        let mut bound = JanitorBound::new(&state.current().timeouts, last_janitor);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stop.changed() => return,
            }
            let now = Instant::now();
            state.ledger.release_due(now);
            state.ledger.report_late_headers(now);
            if now.duration_since(last_janitor) < JANITOR_PERIOD {
                continue;
            }
            last_janitor = now;
            crate::logging::flush_repeats();
            let max_age = bound.at(&state.current().timeouts, now);
            state.ledger.expire(max_age, now);
            for pool in &state.pools.pools {
                let evictions = pool.policy.expire(now);
                state.pools.count_session_evictions(&pool.name, evictions);
            }
        }
    }
}

/// The janitor's age bound for holds, response_header + stream_idle as reloads change them. A lower bound takes
/// effect only once the wider one has run out since it was last in force: requests dispatched under it may take
/// that long, and their holds are not overdue before.
struct JanitorBound {
    widest: Duration,
    /// When `widest` was last the configured bound.
    seen: Instant,
}

impl JanitorBound {
    fn new(t: &crate::config::Timeouts, now: Instant) -> JanitorBound {
        JanitorBound {
            widest: t.response_header + t.stream_idle,
            seen: now,
        }
    }

    fn at(&mut self, t: &crate::config::Timeouts, now: Instant) -> Duration {
        let configured = t.response_header + t.stream_idle;
        if configured >= self.widest || now.saturating_duration_since(self.seen) > self.widest {
            self.widest = configured;
            self.seen = now;
        }
        self.widest
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Timeouts;

    #[test]
    fn a_lower_janitor_bound_waits_for_the_requests_of_the_wider_one() {
        let t0 = Instant::now();
        let wide = Timeouts::default();
        let narrow = Timeouts {
            response_header: Duration::from_secs(1),
            stream_idle: Duration::from_secs(1),
            ..wide
        };
        let w = wide.response_header + wide.stream_idle;
        let mut b = JanitorBound::new(&wide, t0);
        assert_eq!(b.at(&narrow, t0 + Duration::from_secs(1)), w);
        assert_eq!(b.at(&narrow, t0 + w), w);
        assert_eq!(
            b.at(&narrow, t0 + w + Duration::from_secs(1)),
            Duration::from_secs(2)
        );
        // A wider one applies at once.
        assert_eq!(b.at(&wide, t0 + w + Duration::from_secs(2)), w);
    }
}
