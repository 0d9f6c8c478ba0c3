//! `ThroughputFit`: an endpoint's time to first byte learned as a line, `overhead + tokens / throughput`, from
//! (prefill tokens ahead plus the request's own, time to first byte) samples.
//!
//! A single ratio (tokens over seconds) mixes the two: a 2k-token sample is mostly fixed overhead (scheduler
//! steps, the network) and reads as a slow engine, a 100k-token one as a fast engine, so the endpoint that last
//! served a long prompt looked twice as fast as its twin and drew every long prompt after it. The fit is an
//! exponentially weighted least-squares line; with too little spread in the samples it falls back to the line
//! through the origin. Pure: the caller feeds samples and reads the fit.

/// Weight of a new sample in the running sums (about the last 1/WEIGHT samples count).
const WEIGHT: f64 = 0.05;

/// Samples must spread at least this much (coefficient of variation of their token counts) before an
/// intercept is fitted; below it the line goes through the origin.
const MIN_SPREAD: f64 = 0.25;

/// Running exponentially weighted sums of one endpoint's samples.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ThroughputFit {
    w: f64,
    x: f64,
    y: f64,
    xx: f64,
    xy: f64,
}

/// What the fit says: seconds before any prefill progresses, and tokens per second after that.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Fitted {
    pub overhead_seconds: f64,
    pub tokens_per_second: f64,
}

impl Fitted {
    /// A line through the origin at `tokens_per_second` (tests, and callers that know the speed).
    pub fn ratio(tokens_per_second: f64) -> Fitted {
        Fitted {
            overhead_seconds: 0.0,
            tokens_per_second,
        }
    }
}

impl ThroughputFit {
    /// One sample: `tokens` (estimated prefill tokens that had to be computed before this request's first
    /// byte) took `seconds`. Samples that are not finite and positive are ignored.
    pub fn observe(&mut self, tokens: f64, seconds: f64) {
        if !(tokens.is_finite() && seconds.is_finite() && tokens > 0.0 && seconds > 0.0) {
            return;
        }
        let keep = 1.0 - WEIGHT;
        self.w = self.w * keep + WEIGHT;
        self.x = self.x * keep + WEIGHT * tokens;
        self.y = self.y * keep + WEIGHT * seconds;
        self.xx = self.xx * keep + WEIGHT * tokens * tokens;
        self.xy = self.xy * keep + WEIGHT * tokens * seconds;
    }

    /// The fitted line; None before any sample.
    pub fn fitted(&self) -> Option<Fitted> {
        if self.w <= 0.0 || self.x <= 0.0 || self.xx <= 0.0 {
            return None;
        }
        let (mx, my) = (self.x / self.w, self.y / self.w);
        let var = (self.xx / self.w - mx * mx).max(0.0);
        let through_origin = || {
            let slope = self.xy / self.xx;
            (slope > 0.0).then_some(Fitted {
                overhead_seconds: 0.0,
                tokens_per_second: 1.0 / slope,
            })
        };
        if var.sqrt() < MIN_SPREAD * mx {
            return through_origin();
        }
        let slope = (self.xy / self.w - mx * my) / var;
        let overhead = my - slope * mx;
        if slope > 0.0 && overhead >= 0.0 {
            Some(Fitted {
                overhead_seconds: overhead,
                tokens_per_second: 1.0 / slope,
            })
        } else {
            through_origin()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64, rel: f64) -> bool {
        (a - b).abs() <= rel * b.abs()
    }

    #[test]
    fn small_and_large_samples_give_one_line() {
        // 20 ms of overhead, 200k tokens/s: a 2k sample reads as 67k tokens/s on its own, a 100k one as 192k.
        let line = |t: f64| 0.02 + t / 200_000.0;
        let mut f = ThroughputFit::default();
        for i in 0..200 {
            let t = if i % 5 == 0 {
                100_000.0
            } else {
                2_000.0 + i as f64
            };
            f.observe(t, line(t));
        }
        let k = f.fitted().unwrap();
        assert!(close(k.tokens_per_second, 200_000.0, 0.01), "{k:?}");
        assert!(close(k.overhead_seconds, 0.02, 0.01), "{k:?}");
    }

    #[test]
    fn the_order_of_samples_does_not_swing_the_speed() {
        // The old ratio average jumped with the last sample's size; the fit does not.
        let line = |t: f64| 0.02 + t / 200_000.0;
        let mut a = ThroughputFit::default();
        for i in 0..100 {
            a.observe(2_000.0 + 100.0 * i as f64, line(2_000.0 + 100.0 * i as f64));
            a.observe(80_000.0, line(80_000.0));
        }
        let before = a.fitted().unwrap().tokens_per_second;
        a.observe(140_000.0, line(140_000.0));
        let after = a.fitted().unwrap().tokens_per_second;
        assert!(close(before, after, 0.01), "{before} {after}");
    }

    #[test]
    fn little_spread_falls_back_to_the_ratio_and_bad_samples_are_ignored() {
        let mut f = ThroughputFit::default();
        assert_eq!(f.fitted(), None);
        f.observe(f64::NAN, 1.0);
        f.observe(1_000.0, 0.0);
        f.observe(-5.0, 1.0);
        assert_eq!(f.fitted(), None);
        for _ in 0..10 {
            f.observe(10_000.0, 0.1);
        }
        let k = f.fitted().unwrap();
        assert_eq!(k.overhead_seconds, 0.0);
        assert!(close(k.tokens_per_second, 100_000.0, 1e-9), "{k:?}");
    }

    #[test]
    fn a_negative_intercept_is_not_fitted() {
        // Large samples slower per token than small ones (a queue that grew): no negative overhead.
        let mut f = ThroughputFit::default();
        for _ in 0..50 {
            f.observe(2_000.0, 0.001);
            f.observe(100_000.0, 1.0);
        }
        let k = f.fitted().unwrap();
        assert_eq!(k.overhead_seconds, 0.0);
        assert!(k.tokens_per_second > 0.0);
    }
}
