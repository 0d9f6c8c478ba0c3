//! Per-key limits: token buckets for requests and estimated prompt tokens per minute, and a concurrency count.
//! Pure: the caller passes the time in.

use std::time::{Duration, Instant};

use crate::config::KeyLimits;

/// A bucket of `per_minute` units refilled continuously (`per_minute / 60` a second), holding at most one minute's
/// worth; it starts full. A request larger than the whole bucket is admitted when the bucket is full and leaves it
/// in debt, so it delays the key's next requests instead of being refused forever.
#[derive(Debug, Clone)]
pub struct TokenBucket {
    per_minute: u64,
    level: f64,
    at: Instant,
}

impl TokenBucket {
    pub fn new(per_minute: u64, now: Instant) -> TokenBucket {
        TokenBucket {
            per_minute,
            level: per_minute as f64,
            at: now,
        }
    }

    fn capacity(&self) -> f64 {
        self.per_minute as f64
    }

    fn per_sec(&self) -> f64 {
        self.per_minute as f64 / 60.0
    }

    fn refill(&mut self, now: Instant) {
        let dt = now.saturating_duration_since(self.at).as_secs_f64();
        self.level = (self.level + dt * self.per_sec()).min(self.capacity());
        self.at = self.at.max(now);
    }

    /// How long until `n` units may be taken (zero: now).
    pub fn wait(&mut self, n: u64, now: Instant) -> Duration {
        self.refill(now);
        let need = (n as f64).min(self.capacity());
        if self.level >= need {
            return Duration::ZERO;
        }
        Duration::from_secs_f64((need - self.level) / self.per_sec())
    }

    /// Take `n` units (after `wait` said zero).
    pub fn take(&mut self, n: u64, now: Instant) {
        self.refill(now);
        self.level -= n as f64;
    }

    /// A reload changed the limit: keep what was spent, within the new capacity.
    pub fn set_per_minute(&mut self, per_minute: u64, now: Instant) {
        self.refill(now);
        self.per_minute = per_minute;
        self.level = self.level.min(self.capacity());
    }
}

/// Which limit refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    Requests,
    Tokens,
    Concurrency,
}

impl Limit {
    /// The config key, also the `limit` metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Limit::Requests => "requests_per_minute",
            Limit::Tokens => "prompt_tokens_per_minute",
            Limit::Concurrency => "concurrent_requests",
        }
    }
}

/// A refusal: which limit, and how long until it would allow the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Denied {
    pub limit: Limit,
    pub retry_after: Duration,
}

impl Denied {
    /// Whole seconds for `Retry-After`, at least 1.
    pub fn retry_after_secs(&self) -> u32 {
        let s = self.retry_after.as_secs_f64().ceil();
        (s as u32).max(1)
    }
}

/// How long a request refused for concurrency is told to wait: a slot frees when some request ends, which the
/// router cannot predict.
pub const CONCURRENCY_RETRY: Duration = Duration::from_secs(1);

/// One key's limit state.
#[derive(Debug, Clone)]
pub struct KeyLimiter {
    limits: KeyLimits,
    requests: Option<TokenBucket>,
    tokens: Option<TokenBucket>,
    in_flight: u64,
}

impl KeyLimiter {
    pub fn new(limits: KeyLimits, now: Instant) -> KeyLimiter {
        KeyLimiter {
            limits,
            requests: limits.requests_per_minute.map(|n| TokenBucket::new(n, now)),
            tokens: limits
                .prompt_tokens_per_minute
                .map(|n| TokenBucket::new(n, now)),
            in_flight: 0,
        }
    }

    pub fn limits(&self) -> KeyLimits {
        self.limits
    }

    pub fn in_flight(&self) -> u64 {
        self.in_flight
    }

    /// Before the body is read: a concurrency slot, and a look (nothing taken) at the requests bucket, so a key
    /// out of requests is refused without reading its body. On Ok the request holds a slot until [`Self::end`].
    pub fn begin(&mut self, now: Instant) -> Result<(), Denied> {
        if let Some(max) = self.limits.concurrent_requests {
            if self.in_flight >= max {
                return Err(Denied {
                    limit: Limit::Concurrency,
                    retry_after: CONCURRENCY_RETRY,
                });
            }
        }
        if let Some(b) = &mut self.requests {
            let wait = b.wait(1, now);
            if !wait.is_zero() {
                return Err(Denied {
                    limit: Limit::Requests,
                    retry_after: wait,
                });
            }
        }
        self.in_flight += 1;
        Ok(())
    }

    /// Once the body is known: take one request and `tokens` estimated prompt tokens, both or neither.
    pub fn charge(&mut self, tokens: u64, now: Instant) -> Result<(), Denied> {
        let req_wait = self
            .requests
            .as_mut()
            .map_or(Duration::ZERO, |b| b.wait(1, now));
        let tok_wait = self
            .tokens
            .as_mut()
            .map_or(Duration::ZERO, |b| b.wait(tokens, now));
        if !req_wait.is_zero() || !tok_wait.is_zero() {
            let (limit, retry_after) = if tok_wait > req_wait {
                (Limit::Tokens, tok_wait)
            } else {
                (Limit::Requests, req_wait)
            };
            return Err(Denied { limit, retry_after });
        }
        if let Some(b) = &mut self.requests {
            b.take(1, now);
        }
        if let Some(b) = &mut self.tokens {
            b.take(tokens, now);
        }
        Ok(())
    }

    /// The request that `begin` admitted ended.
    pub fn end(&mut self) {
        self.in_flight = self.in_flight.saturating_sub(1);
    }

    /// New limits from a reload: buckets keep what was spent (within the new size), in-flight requests stay counted.
    pub fn set_limits(&mut self, limits: KeyLimits, now: Instant) {
        fn update(b: &mut Option<TokenBucket>, per_minute: Option<u64>, now: Instant) {
            match (b.as_mut(), per_minute) {
                (Some(bucket), Some(n)) => bucket.set_per_minute(n, now),
                (None, Some(n)) => *b = Some(TokenBucket::new(n, now)),
                (_, None) => *b = None,
            }
        }
        update(&mut self.requests, limits.requests_per_minute, now);
        update(&mut self.tokens, limits.prompt_tokens_per_minute, now);
        self.limits = limits;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: f64) -> Duration {
        Duration::from_secs_f64(s)
    }

    #[test]
    fn bucket_starts_full_and_refills_per_second() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(60, t0); // one a second
        for _ in 0..60 {
            assert_eq!(b.wait(1, t0), Duration::ZERO);
            b.take(1, t0);
        }
        assert_eq!(b.wait(1, t0), secs(1.0));
        assert_eq!(b.wait(3, t0 + secs(1.0)), secs(2.0));
        assert_eq!(b.wait(1, t0 + secs(1.0)), Duration::ZERO);
        // Never more than a minute's worth.
        assert_eq!(b.wait(60, t0 + secs(3600.0)), Duration::ZERO);
        b.take(60, t0 + secs(3600.0));
        assert_eq!(b.wait(1, t0 + secs(3600.0)), secs(1.0));
    }

    #[test]
    fn a_request_larger_than_the_bucket_waits_for_a_full_bucket_and_leaves_debt() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new(600, t0); // 10 a second
        assert_eq!(b.wait(1000, t0), Duration::ZERO, "full: admitted");
        b.take(1000, t0);
        // 400 in debt: the next unit needs 401 more, 40.1 s.
        let w = b.wait(1, t0);
        assert!((w.as_secs_f64() - 40.1).abs() < 1e-6, "{w:?}");
        // And another oversized request waits for a full bucket: 1000 units, 100 s.
        assert!((b.wait(5000, t0).as_secs_f64() - 100.0).abs() < 1e-6);
    }

    #[test]
    fn a_time_going_backwards_changes_nothing() {
        let t0 = Instant::now() + secs(10.0);
        let mut b = TokenBucket::new(60, t0);
        b.take(60, t0);
        assert_eq!(b.wait(1, t0 - secs(5.0)), secs(1.0));
    }

    #[test]
    fn limiter_checks_requests_before_the_body_and_charges_both_or_neither() {
        let t0 = Instant::now();
        let limits = KeyLimits {
            requests_per_minute: Some(2),
            prompt_tokens_per_minute: Some(600),
            concurrent_requests: None,
            ttft_budget: None,
        };
        let mut l = KeyLimiter::new(limits, t0);
        l.begin(t0).unwrap();
        l.charge(500, t0).unwrap();
        l.end();
        l.begin(t0).unwrap();
        // 100 tokens left, 200 wanted: 10 tokens a second → 10 s; the request is not taken either.
        let d = l.charge(200, t0).unwrap_err();
        assert_eq!((d.limit, d.retry_after), (Limit::Tokens, secs(10.0)));
        l.charge(100, t0).unwrap();
        l.end();
        // Both requests spent: refused before the body, for 30 s (2 a minute).
        let d = l.begin(t0).unwrap_err();
        assert_eq!((d.limit, d.retry_after), (Limit::Requests, secs(30.0)));
        assert_eq!(d.retry_after_secs(), 30);
        assert_eq!(l.in_flight(), 0);
    }

    #[test]
    fn a_700_token_request_on_a_600_bucket_is_admitted_when_full() {
        let t0 = Instant::now();
        let limits = KeyLimits {
            prompt_tokens_per_minute: Some(600),
            ..KeyLimits::default()
        };
        let mut l = KeyLimiter::new(limits, t0);
        l.begin(t0).unwrap();
        l.charge(700, t0).unwrap();
        let d = l.charge(1, t0).unwrap_err();
        assert_eq!(d.limit, Limit::Tokens);
        assert_eq!(d.retry_after_secs(), 11);
    }

    #[test]
    fn concurrency_slots_are_held_until_end() {
        let t0 = Instant::now();
        let limits = KeyLimits {
            concurrent_requests: Some(2),
            ..KeyLimits::default()
        };
        let mut l = KeyLimiter::new(limits, t0);
        l.begin(t0).unwrap();
        l.begin(t0).unwrap();
        let d = l.begin(t0).unwrap_err();
        assert_eq!(d.limit, Limit::Concurrency);
        assert_eq!(d.retry_after_secs(), 1);
        l.end();
        l.begin(t0).unwrap();
        assert_eq!(l.in_flight(), 2);
        l.end();
        l.end();
        l.end();
        assert_eq!(l.in_flight(), 0, "never below zero");
    }

    #[test]
    fn unlimited_keys_are_never_refused() {
        let t0 = Instant::now();
        let mut l = KeyLimiter::new(KeyLimits::default(), t0);
        for _ in 0..10_000 {
            l.begin(t0).unwrap();
            l.charge(1 << 20, t0).unwrap();
        }
    }

    #[test]
    fn a_reload_keeps_what_was_spent() {
        let t0 = Instant::now();
        let mut l = KeyLimiter::new(
            KeyLimits {
                requests_per_minute: Some(10),
                ..KeyLimits::default()
            },
            t0,
        );
        for _ in 0..10 {
            l.begin(t0).unwrap();
            l.charge(0, t0).unwrap();
        }
        assert!(l.begin(t0).is_err());
        // Raised: still empty now, refills at the new rate.
        l.set_limits(
            KeyLimits {
                requests_per_minute: Some(60),
                concurrent_requests: Some(11),
                ..KeyLimits::default()
            },
            t0,
        );
        assert_eq!(l.begin(t0).unwrap_err().retry_after, secs(1.0));
        assert_eq!(l.in_flight(), 10);
        l.begin(t0 + secs(1.0)).unwrap();
        assert_eq!(
            l.begin(t0 + secs(60.0)).unwrap_err().limit,
            Limit::Concurrency
        );
        // Lifted.
        l.set_limits(KeyLimits::default(), t0);
        l.begin(t0).unwrap();
        l.charge(0, t0).unwrap();
    }
}
