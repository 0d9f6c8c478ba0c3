//! A pool's `outlier_detection`: when consecutive failures or a failure rate take an endpoint out of placement,
//! for how long, how long a failure weighs on it, when a stream without headers is a failure, and how long a
//! refusal (429/503) keeps it aside.

use std::time::Duration;

use super::walk::read_keys;
use super::walk::Node;
use super::ConfigError;

/// Outlier-detection settings (per pool).
#[derive(Debug, Clone, PartialEq)]
pub struct OutlierConfig {
    /// Consecutive failures that eject an endpoint (0 = never eject).
    pub consecutive_failures: u32,
    /// First ejection; each further ejection without a success in between doubles it...
    pub base_ejection: Duration,
    /// ...up to this.
    pub max_ejection: Duration,
    /// At most this share of a pool's endpoints is ejected at once (at least one, when the pool has two or more).
    pub max_ejected_percent: u32,
    /// How long a 429 or 503 keeps an endpoint out of placement while others can take the work.
    pub saturation_cooldown: Duration,
    /// Eject an endpoint when this share (percent) of its requests in `failure_window` failed (0 = off)...
    pub failure_percent: u32,
    /// ...once it had at least this many requests there.
    pub failure_min_requests: u32,
    pub failure_window: Duration,
    /// A failed request (or one whose client left before any answer) keeps weighing on its endpoint in placement
    /// until the endpoint serves a request to its end, or for this long (0 = off).
    pub failure_penalty: Duration,
    /// A streamed request whose engine sent no response headers within this counts as a failure (0 = off): vLLM
    /// answers a stream's headers within milliseconds, before prefill and even while the request is queued. Two
    /// requests in a row (any kind) whose clients left after waiting this long with no answer count as one too.
    pub stream_headers_within: Duration,
}

impl Default for OutlierConfig {
    fn default() -> Self {
        OutlierConfig {
            consecutive_failures: 3,
            base_ejection: Duration::from_secs(2),
            max_ejection: Duration::from_secs(60),
            max_ejected_percent: 50,
            saturation_cooldown: Duration::from_secs(1),
            failure_percent: 50,
            failure_min_requests: 10,
            failure_window: Duration::from_secs(30),
            failure_penalty: Duration::from_secs(30),
            stream_headers_within: Duration::from_secs(3),
        }
    }
}

impl OutlierConfig {
    /// How many of `endpoints` may be ejected at once.
    pub fn max_ejected(&self, endpoints: usize) -> usize {
        if endpoints < 2 || self.consecutive_failures == 0 {
            return 0;
        }
        (endpoints * self.max_ejected_percent as usize / 100).max(1)
    }

    pub(super) fn read(n: Node<'_>) -> Result<OutlierConfig, ConfigError> {
        read_keys!(
            n;
            consecutive_failures,
            base_ejection,
            max_ejection,
            max_ejected_percent,
            saturation_cooldown,
            failure_percent,
            failure_min_requests,
            failure_window,
            failure_penalty,
            stream_headers_within,
        );
        let d = OutlierConfig::default();
        let base = base_ejection.duration_or(d.base_ejection)?;
        let max = max_ejection.duration_or(d.max_ejection)?;
        if max < base {
            return Err(max_ejection.err(format!(
                "must be at least base_ejection ({})",
                humantime::format_duration(base)
            )));
        }
        let percent = max_ejected_percent.uint_or(u64::from(d.max_ejected_percent))?;
        if percent > 100 {
            return Err(max_ejected_percent.err("must be a percentage from 0 to 100"));
        }
        let failures = consecutive_failures.uint_or(u64::from(d.consecutive_failures))?;
        let rate = failure_percent.uint_or(u64::from(d.failure_percent))?;
        if rate > 100 {
            return Err(failure_percent.err("must be a percentage from 0 to 100"));
        }
        let min_requests = failure_min_requests.uint_or(u64::from(d.failure_min_requests))?;
        if min_requests == 0 {
            return Err(failure_min_requests.err("must be at least 1"));
        }
        let window = failure_window.duration_or(d.failure_window)?;
        Ok(OutlierConfig {
            consecutive_failures: u32::try_from(failures).unwrap_or(u32::MAX),
            base_ejection: base,
            max_ejection: max,
            max_ejected_percent: percent as u32,
            saturation_cooldown: saturation_cooldown.duration_or(d.saturation_cooldown)?,
            failure_percent: rate as u32,
            failure_min_requests: u32::try_from(min_requests).unwrap_or(u32::MAX),
            failure_window: window,
            failure_penalty: failure_penalty.duration_or_off(d.failure_penalty)?,
            stream_headers_within: stream_headers_within
                .duration_or_off(d.stream_headers_within)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::testing::*;

    #[test]
    fn defaults_and_checks() {
        let c = parse(&pool_with("    outlier_detection: {}\n")).unwrap();
        assert_eq!(c.pools[0].outlier, OutlierConfig::default());
        let c = parse(&pool_with(
            "    outlier_detection: { consecutive_failures: 5, base_ejection: 1s, max_ejection: 10s, max_ejected_percent: 25, saturation_cooldown: 500ms }\n",
        ))
        .unwrap();
        assert_eq!(c.pools[0].outlier.consecutive_failures, 5);
        assert_eq!(
            c.pools[0].outlier.saturation_cooldown,
            Duration::from_millis(500)
        );
        assert_err(
            &pool_with("    outlier_detection: { base_ejection: 10s, max_ejection: 1s }\n"),
            "pools[0].outlier_detection.max_ejection",
            &["must be at least base_ejection (10s)"],
        );
        assert_err(
            &pool_with("    outlier_detection: { max_ejected_percent: 150 }\n"),
            "pools[0].outlier_detection.max_ejected_percent",
            &["percentage"],
        );
        let c = parse(&pool_with(
            "    outlier_detection: { failure_percent: 0, failure_window: 1m, failure_penalty: 0s, stream_headers_within: 0s }\n",
        ))
        .unwrap();
        let o = &c.pools[0].outlier;
        assert_eq!(o.failure_percent, 0);
        assert_eq!(o.failure_window, Duration::from_secs(60));
        assert!(o.failure_penalty.is_zero() && o.stream_headers_within.is_zero());
        assert_err(
            &pool_with("    outlier_detection: { failure_percent: 101 }\n"),
            "pools[0].outlier_detection.failure_percent",
            &["percentage"],
        );
        assert_err(
            &pool_with("    outlier_detection: { failure_min_requests: 0 }\n"),
            "pools[0].outlier_detection.failure_min_requests",
            &["at least 1"],
        );
        assert_err(
            &pool_with("    outlier_detection: { failure_window: 0s }\n"),
            "pools[0].outlier_detection.failure_window",
            &["greater than zero"],
        );
    }

    #[test]
    fn ejection_cap_keeps_one_endpoint() {
        let c = OutlierConfig::default();
        assert_eq!(c.max_ejected(1), 0);
        assert_eq!(c.max_ejected(2), 1);
        assert_eq!(c.max_ejected(3), 1);
        assert_eq!(c.max_ejected(4), 2);
    }
}
