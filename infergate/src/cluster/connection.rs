//! The store's connection and its state: connecting, the connection in use while up, and what the log says about
//! it (the first failure with its reason, a reminder while the store stays down, each change).

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use redis::aio::{ConnectionManager, ConnectionManagerConfig};

use super::{Cluster, BACKGROUND_TIMEOUT};

/// While the store stays down, say so again this often (with how long and why).
pub(super) const DOWN_REMINDER: Duration = Duration::from_secs(60);

/// What the log says about the store's state. Pure: the caller passes the time in.
#[derive(Debug, Default)]
pub(super) struct Outage {
    /// The first failure of the current outage (None while up, and before the first attempt).
    since: Option<Instant>,
    /// The last line logged about the current outage.
    said: Option<Instant>,
    /// Failed attempts in the current outage.
    failures: u64,
    /// The store answered at least once since start.
    ever_up: bool,
}

/// A line to log about the store, if any.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Say {
    /// The first failure since start: the store was never reached.
    NeverReached,
    /// The store was up and is not any more.
    Lost,
    /// Still down after `down_for`, `failures` attempts.
    Still {
        down_for: Duration,
        failures: u64,
    },
    /// Reached for the first time.
    Reached,
    /// Back after an outage of `down_for`.
    Back {
        down_for: Duration,
    },
    Nothing,
}

impl Outage {
    /// An attempt (connect or publish) failed at `now`.
    pub(super) fn failed(&mut self, now: Instant) -> Say {
        self.failures += 1;
        let Some(since) = self.since else {
            self.since = Some(now);
            self.said = Some(now);
            return if self.ever_up {
                Say::Lost
            } else {
                Say::NeverReached
            };
        };
        if self
            .said
            .is_some_and(|t| now.saturating_duration_since(t) < DOWN_REMINDER)
        {
            return Say::Nothing;
        }
        self.said = Some(now);
        Say::Still {
            down_for: now.saturating_duration_since(since),
            failures: self.failures,
        }
    }

    /// The store answered at `now`.
    pub(super) fn answered(&mut self, now: Instant) -> Say {
        let first = !self.ever_up;
        self.ever_up = true;
        self.failures = 0;
        self.said = None;
        match self.since.take() {
            _ if first => Say::Reached,
            Some(since) => Say::Back {
                down_for: now.saturating_duration_since(since),
            },
            None => Say::Nothing,
        }
    }
}

/// A store error in words an operator acts on: a refused password says which keys set it.
pub(super) fn explain(e: &redis::RedisError) -> String {
    if is_refusal(e) {
        format!("{e} (the store refused this replica's credentials: check the password in `cluster.redis` or `cluster.password_file`)")
    } else {
        e.to_string()
    }
}

/// The store answered, and refused us: a wrong or missing password, or a user without the rights.
pub(super) fn is_refusal(e: &redis::RedisError) -> bool {
    e.kind() == redis::ErrorKind::AuthenticationFailed
        || matches!(e.code(), Some("NOAUTH" | "WRONGPASS" | "NOPERM"))
}

fn secs(d: Duration) -> humantime::FormattedDuration {
    humantime::format_duration(Duration::from_secs(d.as_secs()))
}

impl Cluster {
    /// The store answered the last background operation.
    pub fn connected(&self) -> bool {
        self.connected.load(Ordering::Relaxed)
    }

    /// The store answered: logs reaching it and every way back. Returns true when the state changed to connected.
    pub(super) fn store_up(&self) -> bool {
        let say = self.outage.lock().answered(Instant::now());
        let (url, me) = (&self.cfg.shown_url, &self.cfg.replica);
        match say {
            Say::Reached => log::info!(
                "cluster: connected to Redis at {url} as replica {me}; sharing load and session bindings"
            ),
            Say::Back { down_for } => log::info!(
                "cluster: connected to Redis at {url} as replica {me} again, after {} without it; sharing load and \
                 session bindings",
                secs(down_for)
            ),
            _ => {}
        }
        let changed = !self.connected.swap(true, Ordering::Relaxed);
        if changed {
            self.metrics.set_state(true);
        }
        changed
    }

    /// A connect or publish failed for `why`: logs the first failure (with the reason), the loss of a working
    /// store, and a reminder every [`DOWN_REMINDER`] while it stays down.
    pub(super) fn store_down(&self, why: &str) {
        let say = self.outage.lock().failed(Instant::now());
        let url = &self.cfg.shown_url;
        match say {
            Say::NeverReached => log::warn!(
                "cluster: cannot use Redis at {url} as replica {}: {why}; placing on this replica's own load and \
                 sessions, retrying every {:?}",
                self.cfg.replica,
                super::load::RECONNECT_EVERY
            ),
            Say::Lost => log::warn!(
                "cluster: Redis at {url} is unavailable ({why}); placing on this replica's own load and sessions \
                 until it is back"
            ),
            Say::Still { down_for, failures } => log::warn!(
                "cluster: Redis at {url} still unavailable after {} ({failures} failed attempts; last: {why})",
                secs(down_for)
            ),
            _ => {}
        }
        if self.connected.swap(false, Ordering::Relaxed) {
            self.metrics.set_state(false);
        }
    }

    /// A connection to use now, when the store is up.
    pub(super) fn conn(&self) -> Option<ConnectionManager> {
        if !self.connected() {
            return None;
        }
        self.conn.load().as_deref().cloned()
    }

    pub(super) async fn connect(&self) -> redis::RedisResult<ConnectionManager> {
        // `rediss://` builds its rustls client with the process's provider.
        crate::tls::provider();
        let client = redis::Client::open(self.cfg.connection.clone())?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(BACKGROUND_TIMEOUT)
            .set_response_timeout(BACKGROUND_TIMEOUT)
            .set_number_of_retries(1)
            .set_max_delay(100);
        ConnectionManager::new_with_config(client, config).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_failure_is_said_then_a_reminder_a_minute_then_the_way_back() {
        let t0 = Instant::now();
        let mut o = Outage::default();
        assert_eq!(o.failed(t0), Say::NeverReached);
        assert_eq!(o.failed(t0 + Duration::from_secs(1)), Say::Nothing);
        assert_eq!(o.failed(t0 + Duration::from_secs(59)), Say::Nothing);
        assert_eq!(
            o.failed(t0 + Duration::from_secs(61)),
            Say::Still {
                down_for: Duration::from_secs(61),
                failures: 4
            }
        );
        assert_eq!(o.failed(t0 + Duration::from_secs(90)), Say::Nothing);
        assert_eq!(o.answered(t0 + Duration::from_secs(100)), Say::Reached);
        assert_eq!(o.answered(t0 + Duration::from_secs(101)), Say::Nothing);
        // Lost after having worked: said at once, then the outage's own reminders, then how long it lasted.
        let t1 = t0 + Duration::from_secs(200);
        assert_eq!(o.failed(t1), Say::Lost);
        assert_eq!(o.failed(t1 + Duration::from_secs(30)), Say::Nothing);
        assert!(matches!(
            o.failed(t1 + Duration::from_secs(60)),
            Say::Still { failures: 3, .. }
        ));
        assert_eq!(
            o.answered(t1 + Duration::from_secs(75)),
            Say::Back {
                down_for: Duration::from_secs(75)
            }
        );
    }
}
