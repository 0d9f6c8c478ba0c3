//! `Arrivals`: how often session turns reach each endpoint, as a count that decays with time; the cost model
//! reads it as the rate at which turns of the sessions bound there will arrive while a prefill runs (they queue
//! behind it). Pure: time is passed in.

use std::time::Instant;

/// The decay time constant: a turn counts e^(-age / TAU); a rate is the count over TAU. 30 s covers several turns
/// of an agent session (think times of seconds) and forgets an endpoint's sessions a minute after they left.
pub const TAU_SECONDS: f64 = 30.0;

/// Decayed turn counts per endpoint id (a handful of endpoints per pool: a plain list).
#[derive(Debug, Default)]
pub struct Arrivals {
    counts: Vec<(u64, f64, Instant)>,
}

fn decayed(count: f64, since: Instant, now: Instant) -> f64 {
    let age = now.saturating_duration_since(since).as_secs_f64();
    count * (-age / TAU_SECONDS).exp()
}

impl Arrivals {
    /// A turn of a session bound to `endpoint` was served at `now`.
    pub fn tick(&mut self, endpoint: u64, now: Instant) {
        match self.counts.iter_mut().find(|(id, _, _)| *id == endpoint) {
            Some((_, count, at)) => {
                *count = decayed(*count, *at, now) + 1.0;
                *at = (*at).max(now);
            }
            None => self.counts.push((endpoint, 1.0, now)),
        }
    }

    /// Turns per second reaching `endpoint` lately.
    pub fn rate(&self, endpoint: u64, now: Instant) -> f64 {
        self.counts
            .iter()
            .find(|(id, _, _)| *id == endpoint)
            .map_or(0.0, |(_, count, at)| {
                decayed(*count, *at, now) / TAU_SECONDS
            })
    }

    /// Forget an endpoint that left the pool.
    pub fn remove(&mut self, endpoint: u64) {
        self.counts.retain(|(id, _, _)| *id != endpoint);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_steady_rate_is_read_back_and_fades_when_turns_stop() {
        let t0 = Instant::now();
        let mut a = Arrivals::default();
        // Two turns a second for five minutes.
        let mut now = t0;
        for _ in 0..600 {
            now += Duration::from_millis(500);
            a.tick(7, now);
        }
        let r = a.rate(7, now);
        assert!((r - 2.0).abs() < 0.05, "{r}");
        assert_eq!(a.rate(8, now), 0.0);
        // A minute without turns: below a seventh of it; nothing latches.
        assert!(a.rate(7, now + Duration::from_secs(60)) < r / 7.0);
        a.remove(7);
        assert_eq!(a.rate(7, now), 0.0);
    }
}
