//! An endpoint's learned prefill speed.

use std::time::Duration;

use parking_lot::Mutex;

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

    /// Estimated time to first byte of `tokens` (overhead included), once a speed was observed.
    pub fn estimate(&self, tokens: u64) -> Option<Duration> {
        let f = self.own.lock().fitted()?;
        let secs = f.overhead_seconds + tokens as f64 / f.tokens_per_second;
        Duration::try_from_secs_f64(secs).ok()
    }
}
