//! An endpoint's learned prefill and decode speeds, and a pool's typical answer length.

use std::time::Duration;

use parking_lot::Mutex;

use crate::placement::decode::DecodeFit;
use crate::placement::throughput::{Fitted, ThroughputFit};

/// An endpoint's prefill speed, learned from streaming requests as two lines of time to first byte over
/// estimated tokens (`placement::throughput`): one over the request's own tokens (which includes queueing, so it
/// errs slow and releases non-streaming holds late rather than early), one over the tokens ahead plus its own (what
/// `predicted_ttft` predicts with).
#[derive(Debug, Default)]
pub struct PrefillSpeed {
    /// Over the request's own estimate (`observe`).
    own: Mutex<ThroughputFit>,
    /// The queue-inclusive line `predicted_ttft` predicts with (`observe_throughput`).
    fit: Mutex<ThroughputFit>,
}

impl PrefillSpeed {
    /// Own-token samples smaller than this are ignored: a line learned from small prompts only is mostly overhead
    /// noise, and extrapolated to a long prompt it can say "prefilled in 10 ms" and release a non-streaming hold
    /// at once.
    const MIN_OWN_TOKENS: u64 = 1024;

    /// A sample of the endpoint's prefill speed: `tokens` is the request's own estimate, `elapsed` its time to
    /// first byte.
    pub fn observe(&self, tokens: u64, elapsed: Duration) {
        if tokens < Self::MIN_OWN_TOKENS {
            return;
        }
        self.own
            .lock()
            .observe(tokens as f64, elapsed.as_secs_f64());
    }

    /// A sample of the endpoint's prefill throughput: `tokens` is the prefill that was ahead of a request at
    /// dispatch plus its own estimate, `elapsed` its time to first byte (what `predicted_ttft` predicts with).
    pub fn observe_throughput(&self, tokens: u64, elapsed: Duration) {
        self.fit
            .lock()
            .observe(tokens as f64, elapsed.as_secs_f64());
    }

    /// The learned queue-inclusive line (overhead, then tokens per second) from this endpoint's samples alone;
    /// None until observed. Placement reads `ttft_lines`, which lends a pool's shape to an endpoint without one.
    pub fn throughput(&self) -> Option<Fitted> {
        self.fit.lock().fitted()
    }

    /// The running sums behind `throughput`.
    pub fn throughput_fit(&self) -> ThroughputFit {
        *self.fit.lock()
    }

    /// The learned speed in estimated tokens per second; None until observed.
    pub fn tokens_per_sec(&self) -> Option<f64> {
        self.own.lock().fitted().map(|f| f.tokens_per_second)
    }

    /// The mean token count of the samples behind `estimate` (None before any).
    pub fn own_mean_tokens(&self) -> Option<f64> {
        self.own.lock().mean_tokens()
    }

    /// Estimated time to first byte of `tokens` (overhead included), once a speed was observed.
    pub fn estimate(&self, tokens: u64) -> Option<Duration> {
        let f = self.own.lock().fitted()?;
        let secs = f.overhead_seconds + tokens as f64 / f.tokens_per_second;
        Duration::try_from_secs_f64(secs).ok()
    }
}

/// An endpoint's decode speed, learned from streams that ended well (`placement::decode`).
#[derive(Debug, Default)]
pub struct DecodeSpeed(Mutex<DecodeFit>);

impl DecodeSpeed {
    /// One stream: `running` sequences on average beside it (itself included), `seconds_per_token` between its
    /// chunks.
    pub fn observe(&self, running: f64, seconds_per_token: f64) {
        self.0.lock().observe(running, seconds_per_token);
    }

    /// The running sums.
    pub fn fit(&self) -> DecodeFit {
        *self.0.lock()
    }
}

/// A pool's typical answer length in output chunks (about tokens), from streams that ended well: the answer a
/// request is expected to give when its `max_tokens` allows more (agents ask for 32k and answer a few hundred).
#[derive(Debug, Default)]
pub struct AnswerLength(Mutex<Option<f64>>);

impl AnswerLength {
    /// Weight of a new answer in the running mean.
    const WEIGHT: f64 = 0.05;

    pub fn observe(&self, tokens: u64) {
        let mut m = self.0.lock();
        let t = tokens as f64;
        *m = Some(m.map_or(t, |v| v + Self::WEIGHT * (t - v)));
    }

    /// The typical answer, capped by `max_tokens`; `max_tokens` alone before any answer; None without either.
    pub fn expected(&self, max_tokens: Option<u64>) -> Option<f64> {
        let typical = *self.0.lock();
        match (typical, max_tokens) {
            (Some(t), Some(m)) => Some(t.min(m as f64)),
            (Some(t), None) => Some(t),
            (None, m) => m.map(|m| m as f64),
        }
    }
}
