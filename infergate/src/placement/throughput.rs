//! `ThroughputFit`: an endpoint's time to first byte learned as a line, `overhead + tokens / throughput`, from
//! (prefill tokens ahead plus the request's own, time to first byte) samples.
//!
//! A single ratio (tokens over seconds) mixes the two: a 2k-token sample is mostly fixed overhead (scheduler
//! steps, the network) and reads as a slow engine, a 100k-token one as a fast engine, so the endpoint that last
//! served a long prompt looked twice as fast as its twin and drew every long prompt after it. The fit is an
//! exponentially weighted least-squares line; with too little spread in the samples, or a slope the samples do
//! not pin down (small prompts whose time is mostly scheduling noise), it falls back to the line through the
//! origin, or, when another endpoint of the pool has a line of its own, to that line's shape scaled to this
//! endpoint's samples (`fleet_lines`). Pure: the caller feeds samples and reads the fit.

use super::line::{median_by, EwLine, Line};

/// Samples must spread at least this much (coefficient of variation of their token counts) before an
/// intercept is fitted; below it the line goes through the origin.
const MIN_SPREAD: f64 = 0.25;

/// The fitted slope's standard error must stay under this share of the slope before the line is used; above
/// it the line goes through the origin. Small prompts (a few thousand tokens) against an engine whose steps
/// jitter by milliseconds fit slopes anywhere from 1M to 10M tokens/s on twin engines, and the line
/// extrapolated to a 100k-token prompt then sends it to the twin that happened to fit the flatter slope.
const MAX_SLOPE_ERROR: f64 = 0.25;

/// Running exponentially weighted sums of one endpoint's (tokens, seconds) samples.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ThroughputFit(EwLine);

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

    /// Seconds for `tokens` tokens.
    pub fn seconds(&self, tokens: f64) -> f64 {
        self.overhead_seconds + tokens / self.tokens_per_second
    }

    fn of(l: Line) -> Fitted {
        Fitted {
            overhead_seconds: l.intercept,
            tokens_per_second: 1.0 / l.slope,
        }
    }

    fn line(self) -> Line {
        Line {
            intercept: self.overhead_seconds,
            slope: 1.0 / self.tokens_per_second,
        }
    }
}

impl ThroughputFit {
    /// One sample: `tokens` (estimated prefill tokens that had to be computed before this request's first
    /// byte) took `seconds`. Samples that are not finite and positive are ignored.
    pub fn observe(&mut self, tokens: f64, seconds: f64) {
        if tokens > 0.0 {
            self.0.observe(tokens, seconds);
        }
    }

    /// The (weighted) mean token count of the samples; None before any sample.
    pub fn mean_tokens(&self) -> Option<f64> {
        self.0.means().map(|(tokens, _)| tokens)
    }

    /// The fitted line; None before any sample.
    pub fn fitted(&self) -> Option<Fitted> {
        self.own_line().or_else(|| self.through_origin())
    }

    /// The line with an intercept, when the samples spread enough and pin its slope down; None otherwise.
    pub fn own_line(&self) -> Option<Fitted> {
        self.0
            .with_intercept(MIN_SPREAD, MAX_SLOPE_ERROR)
            .map(Fitted::of)
    }

    /// The least-squares line through the origin; None before any sample.
    fn through_origin(&self) -> Option<Fitted> {
        self.0.through_origin().map(Fitted::of)
    }

    /// `shape` scaled to this endpoint's samples; None before any sample.
    fn scaled(&self, shape: Fitted) -> Option<Fitted> {
        self.0.scaled(shape.line()).map(Fitted::of)
    }
}

/// Every endpoint's line in one pool: its own where its samples determine one; otherwise the shape of the
/// pool's other learned lines (the median by throughput) scaled to its own samples; otherwise the line through
/// the origin.
///
/// An endpoint that has only served short prompts cannot tell its overhead from its per-token time; through the
/// origin it reads several times slower on a long prompt than a twin that has served one, so every long prompt
/// went to the twin until its queue outweighed that (the mixed state the slope gate could leave). Twins share
/// the shape; an engine that is slower on short prompts is still read slower, in proportion.
pub fn fleet_lines(fits: &[ThroughputFit]) -> Vec<Option<Fitted>> {
    let own: Vec<Option<Fitted>> = fits.iter().map(ThroughputFit::own_line).collect();
    // Every endpoint with its own line (the steady state): no fleet shape needed.
    if own.iter().all(Option::is_some) {
        return own;
    }
    let learned: Vec<Line> = own.iter().flatten().map(|f| f.line()).collect();
    let shape = median_by(learned, |l| -l.slope).map(Fitted::of);
    own.into_iter()
        .zip(fits)
        .map(|(line, f)| {
            line.or_else(|| shape.and_then(|s| f.scaled(s)))
                .or_else(|| f.through_origin())
        })
        .collect()
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

    #[test]
    fn an_endpoint_that_served_only_short_prompts_borrows_its_twins_shape() {
        // Twins, 30 ms + tokens / 100k s. One has served 2k and 100k prompts, the other only 1.5-2.5k ones: through the
        // origin the second read a 100k prompt as 2.5 s against its twin's 1.03 s, and drew none of them.
        let line = |t: f64| 0.03 + t / 100_000.0;
        let (mut wide, mut short) = (ThroughputFit::default(), ThroughputFit::default());
        for i in 0..100 {
            let t = if i % 5 == 0 { 100_000.0 } else { 2_000.0 };
            wide.observe(t, line(t));
            let t = 1_500.0 + 10.0 * i as f64;
            short.observe(t, line(t));
        }
        let at = |f: Fitted, t: f64| f.overhead_seconds + t / f.tokens_per_second;
        let alone = short.fitted().unwrap();
        assert!(at(alone, 100_000.0) > 2.0, "{alone:?}");
        let lines = fleet_lines(&[wide, short]);
        let (a, b) = (lines[0].unwrap(), lines[1].unwrap());
        assert_eq!(Some(a), wide.fitted(), "a line of its own is kept");
        assert!(close(at(b, 100_000.0), 1.03, 0.02), "{b:?}");
        // An engine twice as slow on its short prompts is read twice as slow on long ones, not as the twin.
        let mut slow = ThroughputFit::default();
        for i in 0..100 {
            let t = 1_500.0 + 10.0 * i as f64;
            slow.observe(t, 2.0 * line(t));
        }
        let c = fleet_lines(&[wide, slow])[1].unwrap();
        assert!(close(at(c, 100_000.0), 2.06, 0.02), "{c:?}");
        // Nobody with a line of its own: through the origin, as before; no samples, no line.
        let lines = fleet_lines(&[short, ThroughputFit::default()]);
        assert_eq!(lines, vec![short.fitted(), None]);
    }

    #[test]
    fn a_slope_the_samples_do_not_pin_down_is_not_extrapolated() {
        // Twin engines (20 ms + tokens / 200k s) timed on 500-4,000-token prompts with +-20 ms of jitter (a step):
        // the slopes fitted with an intercept differ by the noise alone (248k against 108k tokens/s on these
        // samples); a slope that uncertain is not used, and through the origin the twins read close speeds.
        let twin = |seed: u64| {
            let mut rng = fastrand::Rng::with_seed(seed);
            let mut f = ThroughputFit::default();
            for _ in 0..200 {
                let t = rng.f64() * 3_500.0 + 500.0;
                f.observe(t, 0.02 + t / 200_000.0 + (rng.f64() - 0.5) * 0.04);
            }
            f.fitted().unwrap()
        };
        let (a, b) = (twin(1), twin(2));
        let ratio = a.tokens_per_second / b.tokens_per_second;
        assert!((0.67..1.5).contains(&ratio), "{a:?} {b:?}");
        // The same jitter on samples that spread to 100k tokens pins the slope: the line is fitted.
        let mut rng = fastrand::Rng::with_seed(3);
        let mut f = ThroughputFit::default();
        for i in 0..200 {
            let t = if i % 5 == 0 { 100_000.0 } else { 2_000.0 };
            f.observe(t, 0.02 + t / 200_000.0 + (rng.f64() - 0.5) * 0.04);
        }
        let k = f.fitted().unwrap();
        assert!(close(k.tokens_per_second, 200_000.0, 0.05), "{k:?}");
        assert!(k.overhead_seconds > 0.0, "{k:?}");
    }
}
