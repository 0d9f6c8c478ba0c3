//! A pool's `outlier_detection`: when consecutive failures take an endpoint out of placement, for how long, and
//! how long a refusal (429/503) keeps it aside.

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
}

impl Default for OutlierConfig {
    fn default() -> Self {
        OutlierConfig {
            consecutive_failures: 3,
            base_ejection: Duration::from_secs(2),
            max_ejection: Duration::from_secs(60),
            max_ejected_percent: 50,
            saturation_cooldown: Duration::from_secs(1),
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
        Ok(OutlierConfig {
            consecutive_failures: u32::try_from(failures).unwrap_or(u32::MAX),
            base_ejection: base,
            max_ejection: max,
            max_ejected_percent: percent as u32,
            saturation_cooldown: saturation_cooldown.duration_or(d.saturation_cooldown)?,
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
