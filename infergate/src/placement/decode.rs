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

/// The running sums of one endpoint's decode samples.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct DecodeFit(EwLine);

impl DecodeFit {
    /// One stream: `running` sequences ran beside it on average (itself included), and it took
    /// `seconds_per_token` between chunks. Samples that are not finite and positive are ignored.
    pub fn observe(&mut self, running: f64, seconds_per_token: f64) {
        if running > 0.0 {
            self.0.observe(running, seconds_per_token);
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
    fn bad_samples_are_ignored() {
        let mut f = DecodeFit::default();
        f.observe(0.0, 0.02);
        f.observe(2.0, f64::INFINITY);
        f.observe(2.0, -1.0);
        assert_eq!(f.line(), None);
    }
}
