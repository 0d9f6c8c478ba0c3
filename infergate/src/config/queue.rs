//! A pool's `queue`: the router-side wait queue used while every eligible endpoint is at
//! `max_in_flight_per_endpoint`.

use std::time::Duration;

use super::values::to_usize;
use super::walk::read_keys;
use super::walk::Node;
use super::ConfigError;

/// The wait queue of one pool (absent = no queue: requests are placed even on endpoints at their limit).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueConfig {
    /// Most requests waiting at once; one more is answered 503 at once.
    pub max_length: usize,
    /// Longest wait of one request; then it is answered 503.
    pub max_wait: Duration,
}

impl Default for QueueConfig {
    fn default() -> Self {
        QueueConfig {
            max_length: 256,
            max_wait: Duration::from_secs(10),
        }
    }
}

impl QueueConfig {
    /// `max_in_flight` is the pool's `max_in_flight_per_endpoint`: the queue waits for room under it, so a pool
    /// without it cannot have a queue.
    pub(super) fn read(
        n: Node<'_>,
        max_in_flight: Option<u64>,
    ) -> Result<QueueConfig, ConfigError> {
        read_keys!(n; max_length, max_wait);
        let d = QueueConfig::default();
        let q = QueueConfig {
            max_length: to_usize(max_length.positive_or(d.max_length as u64)?),
            max_wait: max_wait.duration_or(d.max_wait)?,
        };
        if max_in_flight.is_none() {
            return Err(n.err(
                "needs max_in_flight_per_endpoint in the same pool: requests wait while every endpoint is at that limit",
            ));
        }
        Ok(q)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::testing::*;

    #[test]
    fn defaults_checks_and_the_in_flight_limit() {
        let c = parse(&pool_with(
            "    max_in_flight_per_endpoint: 4\n    queue: {}\n",
        ))
        .unwrap();
        assert_eq!(c.pools[0].queue, Some(QueueConfig::default()));
        assert_eq!(parse(POOL).unwrap().pools[0].queue, None);
        let c = parse(&pool_with(
            "    max_in_flight_per_endpoint: 4\n    queue: { max_length: 3, max_wait: 250ms }\n",
        ))
        .unwrap();
        assert_eq!(
            c.pools[0].queue,
            Some(QueueConfig {
                max_length: 3,
                max_wait: Duration::from_millis(250)
            })
        );
        assert_err(
            &pool_with("    queue: {}\n"),
            "pools[0].queue",
            &["needs max_in_flight_per_endpoint"],
        );
        assert_err(
            &pool_with("    max_in_flight_per_endpoint: 4\n    queue: { max_length: 0 }\n"),
            "pools[0].queue.max_length",
            &["at least 1"],
        );
        assert_err(
            &pool_with("    max_in_flight_per_endpoint: 4\n    queue: { max_wiat: 1s }\n"),
            "pools[0].queue.max_wiat",
            &["did you mean `max_wait`?"],
        );
    }
}
