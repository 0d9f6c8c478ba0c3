//! `DecodeFit`: an endpoint's decode speed, learned as seconds per output token over the sequences running beside
//! the stream, `base + per_sequence × running`, from one sample per stream that ended well (the proxy times its
//! chunks). Pure: the caller feeds samples and reads the lines.
//!
//! A decode step costs a fixed part plus a part per sequence in the batch (vLLM: the weights are read once per
//! step, the KV cache once per sequence), and every step that carries a prefill chunk is longer for everyone in
//! it. A stream's mean time between chunks therefore rises with the sequences running there and with the
//! prefills that shared its steps; the line keeps the first, and the second is in its level as an average. An
//! endpoint on a slower GPU reads slower at every batch size.

use super::line::{median_by, EwLine, Line};

/// Samples must spread at least this much (standard deviation of the running count over its mean) before a
/// per-sequence slope is fitted; below it the line is the endpoint's mean, or the pool's shape at its level.
const MIN_SPREAD: f64 = 0.25;

/// The fitted slope's standard error must stay under this share of the slope before it is used.
const MAX_SLOPE_ERROR: f64 = 0.5;

/// Once the line stands on this many effective samples, a sample more than `OUTLIER_FACTOR` times its prediction
/// counts as that factor, at a weight of that factor over its own.
const TRUSTED_SAMPLES: f64 = 8.0;

/// A short answer that decoded wholly beside another request's long prefill reads 5 to 10 times the step, and a
/// least-squares line takes it at full weight: a couple near the end of a run tilted a line's slope eightfold. In
/// that run 98% of the samples were within 1.25× of the engine's speed and the rest 4.6× to 10×. Held to 2× the
/// prediction, and weighed less the further out it was, such a sample still counts as slow, and a real slowdown
/// to a third still raises the line nearly as fast as before (each capped sample raises the next cap); the drift
/// judge sees every sample as measured.
const OUTLIER_FACTOR: f64 = 2.0;

/// The running sums of one endpoint's decode samples.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct DecodeFit(EwLine);

impl DecodeFit {
    /// One stream: `running` sequences ran beside it on average (itself included), and it took
    /// `seconds_per_token` between tokens. Samples that are not finite and positive are ignored; once the line is
    /// trusted, one far above it counts as `OUTLIER_FACTOR` above, and less.
    pub fn observe(&mut self, running: f64, seconds_per_token: f64) {
        if !(running > 0.0 && seconds_per_token.is_finite() && seconds_per_token > 0.0) {
            return;
        }
        let predicted = self
            .line()
            .filter(|_| self.0.samples() >= TRUSTED_SAMPLES)
            .map(|l| l.at(running))
            .filter(|p| *p > 0.0);
        match predicted {
            Some(p) if seconds_per_token > p * OUTLIER_FACTOR => self.0.observe_weighted(
                running,
                p * OUTLIER_FACTOR,
                p * OUTLIER_FACTOR / seconds_per_token,
            ),
            _ => self.0.observe(running, seconds_per_token),
        }
    }

    /// The line from this endpoint's samples alone (its own slope, else its mean); None before any sample.
    pub fn line(&self) -> Option<Line> {
        self.own_line().or_else(|| self.0.level())
    }

    /// The line with an intercept, when the samples pin its slope down; None otherwise.
    pub fn own_line(&self) -> Option<Line> {
        self.0.with_intercept(MIN_SPREAD, MAX_SLOPE_ERROR)
    }

    /// Mean running count and mean seconds per token of the samples.
    pub fn means(&self) -> Option<(f64, f64)> {
        self.0.means()
    }
}

/// Every endpoint's decode line in one pool: its own where its samples pin a slope down; otherwise the shape of
/// the pool's learned lines (the median by slope) scaled to its own samples, otherwise its mean; None without
/// samples.
pub fn fleet_decode_lines(fits: &[DecodeFit]) -> Vec<Option<Line>> {
    let own: Vec<Option<Line>> = fits.iter().map(DecodeFit::own_line).collect();
    // Every endpoint with its own line (the steady state): no fleet shape needed.
    if own.iter().all(Option::is_some) {
        return own;
    }
    let shape = median_by(own.iter().flatten().copied().collect(), |l| l.slope);
    own.into_iter()
        .zip(fits)
        .map(|(line, f)| {
            line.or_else(|| shape.and_then(|s| f.0.scaled(s)))
                .or_else(|| f.0.level())
        })
        .collect()
}

/// Seconds per output token of one more stream on an endpoint with `running` sequences already there.
pub fn seconds_per_token(line: &Line, running: u64) -> f64 {
    line.at(running as f64 + 1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 20 ms per step plus 0.25 ms per sequence (engine-sim's defaults).
    fn sim(running: f64) -> f64 {
        0.018 + 0.00025 * running
    }

    #[test]
    fn the_line_over_running_sequences_is_learned() {
        let mut f = DecodeFit::default();
        assert_eq!(f.line(), None);
        for i in 0..300 {
            let n = (i % 30 + 1) as f64;
            f.observe(n, sim(n));
        }
        let l = f.line().unwrap();
        assert!((l.intercept - 0.018).abs() < 1e-6, "{l:?}");
        assert!((l.slope - 0.00025).abs() < 1e-7, "{l:?}");
        assert!((seconds_per_token(&l, 9) - sim(10.0)).abs() < 1e-6);
    }

    #[test]
    fn one_batch_size_gives_the_mean_and_twins_share_a_shape() {
        // Sequential traffic: one sequence at a time, no slope to fit.
        let mut alone = DecodeFit::default();
        for _ in 0..50 {
            alone.observe(1.0, 0.03);
        }
        let l = alone.line().unwrap();
        assert_eq!((l.intercept, l.slope), (0.03, 0.0));
        // Beside a twin that has seen many batch sizes, it borrows the twin's slope at its own level: read at
        // 20 sequences as the twin would be, scaled by how much slower it was at 1.
        let mut wide = DecodeFit::default();
        for i in 0..300 {
            let n = (i % 30 + 1) as f64;
            wide.observe(n, sim(n));
        }
        let mut slow_alone = DecodeFit::default();
        for _ in 0..50 {
            slow_alone.observe(1.0, 2.0 * sim(1.0));
        }
        let lines = fleet_decode_lines(&[wide, slow_alone, DecodeFit::default()]);
        assert_eq!(lines[0], wide.line());
        let b = lines[1].unwrap();
        assert!((b.at(20.0) - 2.0 * sim(20.0)).abs() < 1e-6, "{b:?}");
        assert_eq!(lines[2], None, "no samples, no line");
    }

    #[test]
    fn a_few_stalled_streams_do_not_tilt_the_line() {
        // engine-sim at time scale 0.2: 3.6 ms a step plus 0.05 ms a sequence.
        let truth = |n: f64| 0.0036 + 0.00005 * n;
        let mut f = DecodeFit::default();
        for i in 0..200 {
            let n = (i % 12 + 1) as f64;
            f.observe(n, truth(n));
        }
        // Two short answers that decoded beside long prefills near the end of a run read 30 and 38 ms a token,
        // with ordinary streams between them.
        for (n, y) in [(11.0, 0.038), (12.0, 0.03)] {
            f.observe(n, y);
            for m in [3.0, 8.0, 5.0] {
                f.observe(m, truth(m));
            }
        }
        let l = f.line().unwrap();
        // Taken at full weight they left no slope pinned down and the line at their mean, 1.5× the truth.
        assert!(l.slope < 0.00012, "{l:?}");
        assert!(l.at(8.0) < 1.1 * truth(8.0), "{l:?}");
    }

    #[test]
    fn a_real_slowdown_still_moves_the_line() {
        let mut f = DecodeFit::default();
        for i in 0..200 {
            let n = (i % 12 + 1) as f64;
            f.observe(n, 0.004 + 0.00005 * n);
        }
        // The engine slows to a third: every sample is 3× its old line.
        for i in 0..60 {
            let n = (i % 12 + 1) as f64;
            f.observe(n, 3.0 * (0.004 + 0.00005 * n));
        }
        let l = f.line().unwrap();
        assert!(l.at(6.0) > 2.5 * (0.004 + 0.00005 * 6.0), "{l:?}");
        // And a faster one comes back down as well.
        for i in 0..60 {
            let n = (i % 12 + 1) as f64;
            f.observe(n, 0.004 + 0.00005 * n);
        }
        let l = f.line().unwrap();
        assert!(l.at(6.0) < 1.2 * (0.004 + 0.00005 * 6.0), "{l:?}");
    }

    #[test]
    fn bad_samples_are_ignored() {
        let mut f = DecodeFit::default();
        f.observe(0.0, 0.02);
        f.observe(2.0, f64::INFINITY);
        f.observe(2.0, -1.0);
        assert_eq!(f.line(), None);
    }
}
