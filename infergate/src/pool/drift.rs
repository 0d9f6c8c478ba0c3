//! Speed drift and speed outliers: how an endpoint's recent prefill and decode times compare with what its learned
//! lines predict, the correction placement applies while the lines catch up, and whether it is far below its own
//! recent history or the pool's (a speed outlier: less new work, a log line on entering and leaving, a metric,
//! the status page). Weights, never an on/off switch; time is passed in.
//!
//! The learned lines (`placement::throughput`, `placement::decode`) weigh about the last twenty samples, so a GPU
//! that throttles to a third keeps drawing work at its old speed for twenty requests. Each sample is also compared
//! with the line's prediction before the line learns from it; a fast average of the log of observed over
//! predicted (about the last four samples) is the drift. Placement multiplies the endpoint's predicted times by
//! the drift beyond a dead band (noise stays out), so the slowdown is priced within a few requests; as the lines
//! learn the new speed, the drift returns to 1 and the lines carry it. Without samples the drift fades (an
//! endpoint that draws no work is tried again), and a faster-than-predicted endpoint is corrected upwards the same
//! way, so nothing latches.

use std::time::Instant;

use parking_lot::Mutex;

/// Weight of a new sample in the drift (about the last four samples count).
const FAST: f64 = 0.3;

/// Drift within this factor of 1 is noise: placement applies only what lies beyond it.
const DEAD_BAND: f64 = 1.25;

/// `DEAD_BAND.ln()` (a test checks it), for the per-placement check without a logarithm.
const DEAD_BAND_LN: f64 = 0.223_143_551_314_209_76;

/// Without samples, the drift fades toward 1 with this time constant (seconds).
const FADE_SECONDS: f64 = 30.0;

/// An endpoint whose speed is below this share of its own recent speed or of the pool's median is a speed
/// outlier...
pub const SLOW_ENTER: f64 = 0.4;

/// ...until it is back above this share of both.
pub const SLOW_LEAVE: f64 = 0.5;

/// Judgements in a row on the other side of a threshold before the state changes: a speed from a handful of short
/// streams is noisy (scheduling jitter is a large share of a 5 ms prefill), and an endpoint entering and leaving
/// many times a second weighs nothing reliably and floods the log.
pub const TURN_AFTER: u32 = 3;

/// Weight of a new judgement in the judged speed (an average of its log over about the last three): one stream
/// stalled beside a long prefill is not a slow engine.
const JUDGE_SMOOTHING: f64 = 0.3;

/// A single sample moves the drift by at most this factor (a stream stalled by a long prefill beside it).
const MAX_STEP: f64 = 10.0;

#[derive(Debug, Default)]
struct State {
    /// Fast averages of ln(observed / predicted): prefill, decode.
    prefill: f64,
    decode: f64,
    /// When the last sample came.
    last: Option<Instant>,
    /// A speed outlier now, and its speed relative to its own history or the pool's (the lower).
    slow: bool,
    relative: Option<f64>,
    /// Judgements in a row past the threshold that would change `slow`.
    streak: u32,
}

/// One endpoint's drift and outlier state.
#[derive(Debug, Default)]
pub struct Drift(Mutex<State>);

/// What placement applies to one endpoint's learned lines: its predicted prefill and decode times are multiplied
/// by these (1: as learned).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Correction {
    pub prefill: f64,
    pub decode: f64,
}

impl Default for Correction {
    fn default() -> Self {
        Correction {
            prefill: 1.0,
            decode: 1.0,
        }
    }
}

/// A change of an endpoint's outlier state, to log.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Turn {
    Entered(f64),
    Left(f64),
}

fn fold(avg: &mut f64, observed: f64, predicted: f64) {
    if !(observed > 0.0 && predicted > 0.0 && observed.is_finite() && predicted.is_finite()) {
        return;
    }
    let x = (observed / predicted)
        .ln()
        .clamp(-MAX_STEP.ln(), MAX_STEP.ln());
    *avg += FAST * (x - *avg);
}

/// The drift's log faded by the time since the last sample.
fn faded(log: f64, last: Option<Instant>, now: Instant) -> f64 {
    let age = last.map_or(0.0, |t| now.saturating_duration_since(t).as_secs_f64());
    log * (-age / FADE_SECONDS).exp()
}

/// `log` with the dead band taken off, as a factor.
fn beyond_band(log: f64) -> f64 {
    let band = DEAD_BAND.ln();
    (log.signum() * (log.abs() - band).max(0.0)).exp()
}

impl Drift {
    /// A stream's time to first output against what the endpoint's prefill line predicted for it.
    pub fn observe_prefill(&self, observed: f64, predicted: f64, now: Instant) {
        let mut s = self.0.lock();
        s.prefill = faded(s.prefill, s.last, now);
        s.decode = faded(s.decode, s.last, now);
        fold(&mut s.prefill, observed, predicted);
        s.last = Some(now);
    }

    /// A stream's time per output token against what the endpoint's decode line predicted for it.
    pub fn observe_decode(&self, observed: f64, predicted: f64, now: Instant) {
        let mut s = self.0.lock();
        s.prefill = faded(s.prefill, s.last, now);
        s.decode = faded(s.decode, s.last, now);
        fold(&mut s.decode, observed, predicted);
        s.last = Some(now);
    }

    /// The correction placement applies now.
    pub fn correction(&self, now: Instant) -> Correction {
        let s = self.0.lock();
        // Fading only shrinks a drift: one within the dead band stays there (every placement asks, so no
        // exponentials for the usual case).
        if s.prefill.abs() <= DEAD_BAND_LN && s.decode.abs() <= DEAD_BAND_LN {
            return Correction::default();
        }
        Correction {
            prefill: beyond_band(faded(s.prefill, s.last, now)),
            decode: beyond_band(faded(s.decode, s.last, now)),
        }
    }

    /// Its drift now, in full: the learned lines' times multiplied by this are its current speed, what it is
    /// judged by against the pool. The dead band is for placement only: judged through it, an engine at a third
    /// of its speed read 0.4 while its lines caught up.
    pub fn current(&self, now: Instant) -> Correction {
        let s = self.0.lock();
        Correction {
            prefill: faded(s.prefill, s.last, now).exp(),
            decode: faded(s.decode, s.last, now).exp(),
        }
    }

    /// Its speed lately against its learned lines (1: as usual; 0.33: three times slower), the lower of prefill
    /// and decode.
    pub fn lately(&self, now: Instant) -> f64 {
        let s = self.0.lock();
        let worst = faded(s.prefill, s.last, now).max(faded(s.decode, s.last, now));
        (-worst).exp()
    }

    /// Whether it is a speed outlier, and its relative speed (None until judged).
    pub fn state(&self) -> (bool, Option<f64>) {
        let s = self.0.lock();
        (s.slow, s.relative)
    }

    /// Judge it at `relative` speed (the lower of its speed against its own recent history and against the
    /// pool's median): it enters after [`TURN_AFTER`] judgements in a row below [`SLOW_ENTER`] and leaves after as
    /// many above [`SLOW_LEAVE`]. Returns the change.
    pub fn judge(&self, relative: f64) -> Option<Turn> {
        let mut s = self.0.lock();
        if !relative.is_finite() {
            return None;
        }
        // Averaged in log space, each judgement clamped to a factor of MAX_STEP.
        let x = relative.clamp(1.0 / MAX_STEP, MAX_STEP).ln();
        let relative = match s.relative {
            Some(prev) => (prev.ln() + JUDGE_SMOOTHING * (x - prev.ln())).exp(),
            None => x.exp(),
        };
        s.relative = Some(relative);
        let past = if s.slow {
            relative > SLOW_LEAVE
        } else {
            relative < SLOW_ENTER
        };
        s.streak = if past { s.streak + 1 } else { 0 };
        if s.streak < TURN_AFTER {
            return None;
        }
        s.streak = 0;
        s.slow = !s.slow;
        Some(if s.slow {
            Turn::Entered(relative)
        } else {
            Turn::Left(relative)
        })
    }

    /// The weight `load_aware` gives its load: Some(relative speed) while it is a speed outlier, fading toward 1
    /// as its last stream ages (as the drift does). Only its own streams judge it, and an outlier may draw none at
    /// low concurrency: without the fade it would never show that it recovered.
    pub fn weight(&self, now: Instant) -> Option<f64> {
        let s = self.0.lock();
        if !s.slow {
            return None;
        }
        let w = s.relative.unwrap_or(1.0).clamp(0.05, 1.0);
        Some(faded(w.ln(), s.last, now).exp())
    }
}

/// Timing noise of one endpoint's time to first output at the pool's reference prompt (seconds): twin engine-sim
/// engines at a twentieth of real time prefilled the same 16k-token prompt in 4 and 15 ms through the router on a
/// busy 2-core host. A real engine's 8k-token prefill takes hundreds of milliseconds, beside which it is nothing.
pub const PREFILL_NOISE: f64 = 0.010;

/// Timing noise of one endpoint's time per output token (seconds): the same twins' streams read 18 µs to 1.2 ms
/// per token. A real engine's decode step is 10 to 50 ms.
pub const DECODE_NOISE: f64 = 0.001;

/// Each endpoint's speed relative to the pool: the median of `times` over its own (`times[i]`: what the same work
/// takes on endpoint i as its lines predict, corrected; None: not learned), each with `noise` added (times that
/// differ by less than the timing noise are not speeds that differ). 1 for an endpoint without a time.
pub fn against_pool(times: &[Option<f64>], noise: f64) -> Vec<f64> {
    let mut known: Vec<f64> = times
        .iter()
        .flatten()
        .copied()
        .filter(|t| t.is_finite() && *t > 0.0)
        .collect();
    known.sort_by(f64::total_cmp);
    // The faster of the two middle ones: with two engines, the slow one is judged against the other.
    let median = known.get((known.len().saturating_sub(1)) / 2).copied();
    times
        .iter()
        .map(|t| match (t, median) {
            (Some(t), Some(m)) if t.is_finite() && *t > 0.0 => ((m + noise) / (t + noise)).min(1.0),
            _ => 1.0,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_dead_bands_logarithm_is_its_own() {
        assert!((DEAD_BAND_LN - DEAD_BAND.ln()).abs() < 1e-15);
        // At the band's edge the correction is still 1, as the shortcut says.
        assert_eq!(beyond_band(DEAD_BAND_LN), 1.0);
        assert_eq!(beyond_band(-DEAD_BAND_LN), 1.0);
    }

    #[test]
    fn a_slowdown_is_corrected_within_a_few_samples_and_fades_without_them() {
        let d = Drift::default();
        let t0 = Instant::now();
        // As predicted, with noise inside the band: no correction.
        for i in 0..20 {
            let jitter = if i % 2 == 0 { 1.15 } else { 0.87 };
            d.observe_decode(0.02 * jitter, 0.02, t0);
        }
        assert_eq!(d.correction(t0), Correction::default());
        // Three times slower than the line says: after four samples, most of it is priced.
        for _ in 0..4 {
            d.observe_decode(0.06, 0.02, t0);
        }
        let c = d.correction(t0);
        assert!(
            c.decode > 1.5 && c.decode < 3.0 && c.prefill == 1.0,
            "{c:?}"
        );
        assert!(d.lately(t0) < 0.45, "{}", d.lately(t0));
        // The line has learned the new speed: the samples match it again and the drift returns to 1.
        for _ in 0..12 {
            d.observe_decode(0.06, 0.06, t0);
        }
        assert_eq!(d.correction(t0), Correction::default());
        // Faster than predicted is corrected the same way, and a minute without samples fades it.
        for _ in 0..6 {
            d.observe_prefill(0.1, 0.5, t0);
        }
        assert!(d.correction(t0).prefill < 0.4);
        assert!(d.correction(t0 + Duration::from_secs(60)).prefill > 0.8);
    }

    /// `relative` judged `n` times; the last judgement's change.
    fn judged(d: &Drift, relative: f64, n: u32) -> Option<Turn> {
        (0..n).map(|_| d.judge(relative)).last().flatten()
    }

    #[test]
    fn entering_and_leaving_with_a_gap_between() {
        let d = Drift::default();
        assert_eq!(d.state(), (false, None));
        // Entering takes TURN_AFTER judgements in a row below the threshold.
        assert_eq!(judged(&d, 0.33, TURN_AFTER - 1), None);
        let t0 = Instant::now();
        assert_eq!(d.weight(t0), None, "not yet: one short");
        assert_eq!(d.judge(0.33), Some(Turn::Entered(0.33)));
        assert_eq!(
            d.weight(t0),
            Some(0.33),
            "no sample yet: nothing to fade from"
        );
        d.observe_decode(0.06, 0.06, t0);
        assert_eq!(d.weight(t0), Some(0.33));
        let later = d.weight(t0 + Duration::from_secs(60)).unwrap();
        assert!(later > 0.8 && later < 1.0, "{later}");
        assert_eq!(
            judged(&d, 0.45, 10),
            None,
            "between the thresholds: still an outlier"
        );
        assert!((0..2 * TURN_AFTER).any(|_| matches!(d.judge(0.9), Some(Turn::Left(r)) if r > 0.5)));
        assert_eq!(d.weight(t0), None);
        assert_eq!(d.judge(f64::NAN), None);
    }

    #[test]
    fn noise_around_the_thresholds_changes_nothing() {
        // An engine at speed whose single judgements dip now and then (a stream stalled beside a long prefill,
        // jitter on a busy host): before the average and the streak each dip entered and the next value left.
        let d = Drift::default();
        for r in [1.0, 0.03, 1.1, 0.9, 0.3, 1.2, 0.8, 0.35, 1.0, 0.95].repeat(20) {
            assert_eq!(d.judge(r), None, "{r}");
        }
        assert!(!d.state().0);
        // A slow one stays an outlier through judgements that cross the leaving threshold now and then.
        assert!((0..2 * TURN_AFTER).any(|_| matches!(d.judge(0.2), Some(Turn::Entered(_)))));
        for r in [0.3, 0.9, 0.2, 0.6, 0.35, 1.0, 0.1].repeat(20) {
            assert_eq!(d.judge(r), None, "{r}");
        }
        assert!(d.state().0);
    }

    #[test]
    fn the_pool_median_is_the_reference() {
        // Twins and one three times slower; an unlearned one is not judged.
        let r = against_pool(&[Some(1.0), Some(1.0), Some(3.0), None], 0.0);
        assert_eq!(r[..2], [1.0, 1.0]);
        assert!((r[2] - 1.0 / 3.0).abs() < 1e-12);
        assert_eq!(r[3], 1.0);
        // Two engines: the slow one against the fast one.
        assert_eq!(against_pool(&[Some(2.0), Some(1.0)], 0.0), vec![0.5, 1.0]);
        // Half the fleet at half speed: judged against the faster half.
        assert_eq!(
            against_pool(&[Some(1.0), Some(2.0), Some(1.0), Some(2.0)], 0.0),
            vec![1.0, 0.5, 1.0, 0.5]
        );
        // Within the timing noise twins are twins: 20 µs against 1.2 ms per token is no slow engine, 13.3 against
        // 4.6 ms (a third of the speed) still is.
        let r = against_pool(&[Some(0.000_02), Some(0.001_2)], DECODE_NOISE);
        assert!(r[1] > 0.45, "{r:?}");
        let r = against_pool(&[Some(0.004_6), Some(0.013_3)], DECODE_NOISE);
        assert!(r[1] < 0.4, "{r:?}");
    }
}
